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
//! Create/Start/Stop/Remove/UpdateContainer) passes through here, and so
//! do the hooks around them: NRI plugins (`nri`: where each event is sent
//! and why is said at each call below; `nri_types`: what plugins are
//! shown).

use std::collections::HashMap;
use std::sync::Arc;

use crust_api::v1::{ContainerConfig, LinuxContainerResources};
use crust_nri::Nri;
use tracing::{Instrument, debug, warn};

use crate::containers::{ContainerError, ContainerState, Containers, PodView, checked_config};
use crate::otel::step;
use crate::pods::{PodError, PodRecord, PodSpec, PodState, Pods};
use crate::stats::CgroupStats;

pub use nri::NriBackend;
use nri::{NriCreate, container_of};
use nri_types::pod_sandbox;

mod nri;
mod nri_types;

pub struct Lifecycle {
    pods: Arc<Pods>,
    containers: Arc<Containers>,
    stats: Arc<CgroupStats>,
    /// NRI plugins (disabled: every call returns at once). The NRI calls
    /// of an operation happen under a `SyncBlock`, taken after the
    /// operation's own locks, so that a plugin synchronizing meanwhile
    /// misses nothing.
    nri: Nri,
}

impl Lifecycle {
    /// Also starts telling NRI plugins of containers that exit on their
    /// own (needs a tokio runtime).
    pub fn new(
        pods: Arc<Pods>,
        containers: Arc<Containers>,
        stats: Arc<CgroupStats>,
        nri: Nri,
    ) -> Self {
        nri::watch_exits(nri.clone(), &pods, &containers);
        Lifecycle {
            pods,
            containers,
            stats,
            nri,
        }
    }

    /// Disconnects NRI plugins (daemon shutdown).
    pub async fn shutdown(&self) {
        self.nri.shutdown().await;
    }

    /// NRI (a config reload changes its timeouts).
    pub fn nri(&self) -> &Nri {
        &self.nri
    }

    /// RunPodSandbox. Plugins see the pod once it is set up (namespaces,
    /// network, cgroup) and before it is visible or takes containers; a
    /// plugin's error undoes the pod and fails the call.
    pub async fn run_pod(&self, spec: PodSpec) -> Result<String, PodError> {
        let nri = &self.nri;
        self.pods
            .run(spec, |rec| async move {
                let block = nri.block_plugin_sync().await;
                nri.run_pod_sandbox(|| pod_sandbox(&rec))
                    .await
                    .map_err(nri::pod_error)?;
                Ok(block)
            })
            .await
    }

    /// StopPodSandbox: the pod's containers (forcibly, as kubelet expects),
    /// then the pod. Idempotent, also for unknown IDs. Plugins hear of the
    /// containers' stop, then of the pod's while it is still inspectable,
    /// once.
    pub async fn stop_pod(&self, id: &str) -> Result<(), PodError> {
        let Some(op) = self.pods.begin(id).await? else {
            debug!(
                id,
                "StopPodSandbox of an unknown pod sandbox: nothing to do"
            );
            return Ok(());
        };
        let pod = op.entry().snapshot();
        self.containers
            .stop_all_of_pod(&pod.id)
            .await
            .map_err(|e| PodError::Internal(format!("stopping the pod's containers: {e}")))?;
        let _block = self.nri.block_plugin_sync().await;
        self.tell_pod_stopped(&pod).await;
        self.pods.stop(&op).await
    }

    /// StopContainer (for each of the pod's containers, once) and
    /// StopPodSandbox to plugins; their errors are logged, as containerd
    /// does: the stop itself goes on.
    async fn tell_pod_stopped(&self, pod: &PodRecord) {
        if !self.nri.has_plugins() {
            return;
        }
        let shown = pod_sandbox(pod);
        for id in self.containers.ids_of_pod(&pod.id) {
            let Ok(rec) = self.containers.get(&id) else {
                continue;
            };
            match self
                .nri
                .stop_container(|| (shown.clone(), container_of(&self.containers, &rec)))
                .await
            {
                Ok(updates) => nri::apply_updates(&self.containers, updates, "StopContainer").await,
                Err(e) => warn!(container = %id, "NRI StopContainer: {e}"),
            }
        }
        if let Err(e) = self.nri.stop_pod_sandbox(|| shown).await {
            warn!(pod = %pod.id, "NRI StopPodSandbox: {e}");
        }
    }

    /// RemovePodSandbox: the pod's containers, then what StopPodSandbox
    /// does if still needed, then the rest of the pod. Idempotent. Plugins
    /// hear of it as of a stop (if not yet stopped), the containers'
    /// removal, then the pod's.
    pub async fn remove_pod(&self, id: &str) -> Result<(), PodError> {
        let Some(op) = self.pods.begin(id).await? else {
            debug!(
                id,
                "RemovePodSandbox of an unknown pod sandbox: nothing to do"
            );
            return Ok(());
        };
        let pod = op.entry().snapshot();
        let pod_id = pod.id.clone();
        let _block = self.nri.block_plugin_sync().await;
        // What plugins are shown of the containers, while they exist.
        let shown: Option<HashMap<String, crust_nri::api::Container>> = if self.nri.has_plugins() {
            self.containers
                .stop_all_of_pod(&pod_id)
                .await
                .map_err(|e| PodError::Internal(format!("stopping the pod's containers: {e}")))?;
            self.tell_pod_stopped(&pod).await;
            Some(
                self.containers
                    .ids_of_pod(&pod_id)
                    .iter()
                    .filter_map(|id| self.containers.get(id).ok())
                    .map(|rec| (rec.id.clone(), container_of(&self.containers, &rec)))
                    .collect(),
            )
        } else {
            None
        };
        let removed = self
            .containers
            .remove_all_of_pod(&pod_id)
            .await
            .map_err(|e| PodError::Internal(format!("removing the pod's containers: {e}")))?;
        let shown_pod = shown.as_ref().map(|_| pod_sandbox(&pod));
        for id in removed {
            self.stats.forget(&id);
            if let (Some(p), Some(c)) = (&shown_pod, shown.as_ref().and_then(|s| s.get(&id)))
                && let Err(e) = self.nri.remove_container(|| (p.clone(), c.clone())).await
            {
                warn!(container = %id, "NRI RemoveContainer: {e}");
            }
        }
        self.pods.stop(&op).await?;
        self.pods.remove(op).await?;
        self.stats.forget(&pod_id);
        if let Some(p) = shown_pod
            && let Err(e) = self.nri.remove_pod_sandbox(|| p).await
        {
            warn!(pod = %pod_id, "NRI RemovePodSandbox: {e}");
        }
        Ok(())
    }

    /// CreateContainer in the pod `pod_id`. Plugins see the container
    /// between its spec's generation and its creation (and may adjust the
    /// spec); it is visible only once created. A stopped pod is refused
    /// before plugins hear of anything.
    pub async fn create_container(
        &self,
        pod_id: &str,
        config: Option<ContainerConfig>,
    ) -> Result<String, ContainerError> {
        self.create_container_from(pod_id, config, None).await
    }

    /// CreateContainer; with `restore`, from that checkpoint archive (its
    /// CRI config adapted to the request, see `containers::restore`).
    pub async fn create_container_from(
        &self,
        pod_id: &str,
        config: Option<ContainerConfig>,
        restore: Option<&crate::containers::restore::CheckpointArchive>,
    ) -> Result<String, ContainerError> {
        let mut config = checked_config(config)?;
        if let Some(archive) = restore {
            // The archive's config is checked as a request's would be.
            config = checked_config(Some(crate::containers::restore::restored_config(
                archive, &config,
            )))?;
        }
        let pod = self.pods.get(pod_id).map_err(|e| match e {
            PodError::NotFound(m) => ContainerError::NotFound(m),
            PodError::InvalidArgument(m) => ContainerError::InvalidArgument(m),
            e => ContainerError::Internal(e.to_string()),
        })?;
        let view = self.pod_view(&pod);
        let hook = NriCreate::new(&self.nri, &pod);
        let created = self
            .containers
            .create(view, config, &hook, restore.map(|a| a.path.clone()))
            .instrument(step!("container.create", pod = %pod_id))
            .await;
        hook.release();
        let Some((shown_pod, shown)) = hook.sent() else {
            return created;
        };
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                self.nri.undo_create_container(|| (shown_pod, shown)).await;
                return Err(e);
            }
        };
        if let Ok(rec) = self.containers.get(&id)
            && let Err(e) = self
                .nri
                .post_create_container(|| (shown_pod, container_of(&self.containers, &rec)))
                .await
        {
            warn!(container = %id, "NRI PostCreateContainer: {e}");
        }
        let (updates, evictions) = hook.take_requests();
        nri::apply_updates(&self.containers, updates, "CreateContainer").await;
        nri::evict(&self.containers, evictions).await;
        Ok(id)
    }

    /// StartContainer. Plugins hear of it right before the process
    /// starts; an error fails the call and the container stays CREATED.
    pub async fn start_container(&self, id: &str) -> Result<(), ContainerError> {
        let block = self.nri.block_plugin_sync().await;
        let mut shown_pod = None;
        if self.nri.has_plugins() {
            let rec = self.containers.get(id)?;
            if rec.state == ContainerState::Created
                && let Ok(pod) = self.pods.get(&rec.pod_id)
            {
                let pod = pod_sandbox(&pod);
                self.nri
                    .start_container(|| (pod.clone(), container_of(&self.containers, &rec)))
                    .await
                    .map_err(nri::container_error)?;
                shown_pod = Some(pod);
            }
        }
        self.containers
            .start(id)
            .instrument(step!("container.start", container = %id))
            .await?;
        drop(block);
        if let Some(pod) = shown_pod
            && let Ok(rec) = self.containers.get(id)
            && let Err(e) = self
                .nri
                .post_start_container(|| (pod, container_of(&self.containers, &rec)))
                .await
        {
            warn!(container = %rec.id, "NRI PostStartContainer: {e}");
        }
        Ok(())
    }

    /// StopContainer. Plugins hear of it once the container stopped (once:
    /// the exit watcher may be first).
    pub async fn stop_container(&self, id: &str, timeout: i64) -> Result<(), ContainerError> {
        self.containers.stop(id, timeout).await?;
        let _block = self.nri.block_plugin_sync().await;
        if !self.nri.has_plugins() {
            return Ok(());
        }
        let Ok(rec) = self.containers.get(id) else {
            return Ok(());
        };
        let Ok(pod) = self.pods.get(&rec.pod_id) else {
            return Ok(());
        };
        match self
            .nri
            .stop_container(|| (pod_sandbox(&pod), container_of(&self.containers, &rec)))
            .await
        {
            Ok(updates) => nri::apply_updates(&self.containers, updates, "StopContainer").await,
            Err(e) => warn!(container = %rec.id, "NRI StopContainer: {e}"),
        }
        Ok(())
    }

    /// RemoveContainer. Plugins hear of it once it is gone (of its stop
    /// first, if they have not yet).
    pub async fn remove_container(&self, id: &str) -> Result<(), ContainerError> {
        let _block = self.nri.block_plugin_sync().await;
        let shown = if self.nri.has_plugins() {
            self.containers.get(id).ok().and_then(|rec| {
                let pod = self.pods.get(&rec.pod_id).ok()?;
                Some((pod_sandbox(&pod), container_of(&self.containers, &rec)))
            })
        } else {
            None
        };
        if let Some(id) = self.containers.remove(id).await? {
            self.stats.forget(&id);
            if let Some((p, c)) = shown
                && let Err(e) = self.nri.remove_container(|| (p, c)).await
            {
                warn!(container = %id, "NRI RemoveContainer: {e}");
            }
        }
        Ok(())
    }

    /// UpdatePodSandboxResources: plugins hear of it first (they may
    /// refuse it), then the pod cgroup follows; the pod's containers are
    /// not touched (kubelet resizes them with UpdateContainerResources).
    pub async fn update_pod_resources(
        &self,
        id: &str,
        overhead: Option<LinuxContainerResources>,
        resources: Option<LinuxContainerResources>,
    ) -> Result<(), PodError> {
        let Some(op) = self.pods.begin(id).await? else {
            return Err(PodError::NotFound(format!("pod sandbox {id:?} not found")));
        };
        let pod = op.entry().snapshot();
        let shown = self.nri.has_plugins().then(|| pod_sandbox(&pod));
        if let Some(p) = &shown {
            self.nri
                .update_pod_sandbox(|| {
                    (
                        p.clone(),
                        overhead.as_ref().map(nri_types::resources_from_cri),
                        resources.as_ref().map(nri_types::resources_from_cri),
                    )
                })
                .await
                .map_err(nri::pod_error)?;
        }
        self.pods
            .update_resources(&op, overhead.as_ref(), resources.as_ref())
            .await?;
        if let Some(p) = shown
            && let Err(e) = self.nri.post_update_pod_sandbox(|| p).await
        {
            warn!(pod = %pod.id, "NRI PostUpdatePodSandbox: {e}");
        }
        Ok(())
    }

    /// UpdateContainerResources. Plugins see the resources asked for and
    /// may change them (and ask for updates of other containers); what
    /// they return is applied.
    pub async fn update_container(
        &self,
        id: &str,
        resources: Option<LinuxContainerResources>,
    ) -> Result<(), ContainerError> {
        let Some(mut res) = resources else {
            return self.containers.update(id, None).await;
        };
        let mut shown = None;
        let mut requests = (Vec::new(), Vec::new());
        if self.nri.has_plugins() {
            let rec = self.containers.get(id)?;
            if let Ok(pod) = self.pods.get(&rec.pod_id) {
                let pod = pod_sandbox(&pod);
                let asked = nri_types::resources_from_cri(&res);
                let result = self
                    .nri
                    .update_container(|| (pod.clone(), container_of(&self.containers, &rec), asked))
                    .await
                    .map_err(nri::container_error)?;
                if let Some(r) = result {
                    res = nri_types::cri_with_update(res, &r.resources).map_err(|e| {
                        ContainerError::InvalidArgument(format!("NRI plugins' resources: {e}"))
                    })?;
                    requests = (r.updates, r.evictions);
                }
                shown = Some(pod);
            }
        }
        self.containers.update(id, Some(res)).await?;
        if let Some(pod) = shown
            && let Ok(rec) = self.containers.get(id)
            && let Err(e) = self
                .nri
                .post_update_container(|| (pod, container_of(&self.containers, &rec)))
                .await
        {
            warn!(container = %rec.id, "NRI PostUpdateContainer: {e}");
        }
        nri::apply_updates(&self.containers, requests.0, "UpdateContainer").await;
        nri::evict(&self.containers, requests.1).await;
        Ok(())
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
