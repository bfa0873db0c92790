//! The one place that orders pod and container life-cycle steps. Pods
//! know nothing of containers and containers nothing of pods; here:
//!
//! - StopPodSandbox stops the pod's containers (timeout 0) before the pod
//!   leaves its network; RemovePodSandbox removes them before the pod's
//!   namespaces and files go. Both hold the pod's lock throughout, so a
//!   concurrent Stop and Remove of one pod run one after the other.
//! - CreateContainer hands the container what it needs of its pod, as a
//!   value ([`PodView`]).
//! - Removing a container drops its stats sample.
//!
//! Every CRI life-cycle call (RunPodSandbox, Stop/RemovePodSandbox,
//! Create/Start/Stop/Remove/UpdateContainer) passes through here: hooks
//! around them (NRI plugins, metrics) belong here too.

use std::sync::Arc;

use crust_api::v1::{ContainerConfig, LinuxContainerResources};
use tracing::debug;

use crate::containers::{ContainerError, Containers, PodView, checked_config};
use crate::pods::{PodError, PodRecord, PodSpec, PodState, Pods};
use crate::stats::CgroupStats;

pub struct Lifecycle {
    pods: Arc<Pods>,
    containers: Arc<Containers>,
    stats: Arc<CgroupStats>,
}

impl Lifecycle {
    pub fn new(pods: Arc<Pods>, containers: Arc<Containers>, stats: Arc<CgroupStats>) -> Self {
        Lifecycle {
            pods,
            containers,
            stats,
        }
    }

    /// RunPodSandbox.
    pub async fn run_pod(&self, spec: PodSpec) -> Result<String, PodError> {
        self.pods.run(spec).await
    }

    /// StopPodSandbox: the pod's containers (forcibly, as kubelet expects),
    /// then the pod. Idempotent, also for unknown IDs.
    pub async fn stop_pod(&self, id: &str) -> Result<(), PodError> {
        let Some(op) = self.pods.begin(id).await? else {
            debug!(
                id,
                "StopPodSandbox of an unknown pod sandbox: nothing to do"
            );
            return Ok(());
        };
        let pod_id = op.entry().view().id.clone();
        self.containers
            .stop_all_of_pod(&pod_id)
            .await
            .map_err(|e| PodError::Internal(format!("stopping the pod's containers: {e}")))?;
        self.pods.stop(&op).await
    }

    /// RemovePodSandbox: the pod's containers, then what StopPodSandbox
    /// does if still needed, then the rest of the pod. Idempotent.
    pub async fn remove_pod(&self, id: &str) -> Result<(), PodError> {
        let Some(op) = self.pods.begin(id).await? else {
            debug!(
                id,
                "RemovePodSandbox of an unknown pod sandbox: nothing to do"
            );
            return Ok(());
        };
        let pod_id = op.entry().view().id.clone();
        let removed = self
            .containers
            .remove_all_of_pod(&pod_id)
            .await
            .map_err(|e| PodError::Internal(format!("removing the pod's containers: {e}")))?;
        for id in removed {
            self.stats.forget(&id);
        }
        self.pods.stop(&op).await?;
        self.pods.remove(op).await?;
        self.stats.forget(&pod_id);
        Ok(())
    }

    /// CreateContainer in the pod `pod_id`.
    pub async fn create_container(
        &self,
        pod_id: &str,
        config: Option<ContainerConfig>,
    ) -> Result<String, ContainerError> {
        let config = checked_config(config)?;
        let pod = self.pods.get(pod_id).map_err(|e| match e {
            PodError::NotFound(m) => ContainerError::NotFound(m),
            PodError::InvalidArgument(m) => ContainerError::InvalidArgument(m),
            e => ContainerError::Internal(e.to_string()),
        })?;
        let view = self.pod_view(&pod);
        self.containers.create(view, config).await
    }

    pub async fn start_container(&self, id: &str) -> Result<(), ContainerError> {
        self.containers.start(id).await
    }

    pub async fn stop_container(&self, id: &str, timeout: i64) -> Result<(), ContainerError> {
        self.containers.stop(id, timeout).await
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), ContainerError> {
        if let Some(id) = self.containers.remove(id).await? {
            self.stats.forget(&id);
        }
        Ok(())
    }

    pub async fn update_container(
        &self,
        id: &str,
        resources: Option<LinuxContainerResources>,
    ) -> Result<(), ContainerError> {
        self.containers.update(id, resources).await
    }

    /// What a container gets of its pod.
    fn pod_view(&self, pod: &PodRecord) -> PodView {
        PodView {
            id: pod.id.clone(),
            ready: pod.state == PodState::Ready,
            runtime_handler: pod.runtime_handler.clone(),
            log_directory: pod.log_directory.clone(),
            sandbox_config: pod.sandbox_config(),
            facts: self.pods.container_facts(pod),
        }
    }
}

#[cfg(test)]
mod tests;
