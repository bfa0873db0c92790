//! Stats RPCs: ContainerStats, ListContainerStats, PodSandboxStats,
//! ListPodSandboxStats. Translation of `crate::stats` readings.

use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::container::{labels_match, metadata};
use super::{Cri, container_error, internal, map, pod_error};
use crate::clock::now_ns;
use crate::containers::{ContainerRecord, ContainerState as CState};
use crate::pods::{ListFilter, PodRecord, PodState};
use crate::stats::{self, Usage};

impl Cri {
    /// Blocking: reads the cgroup and walks the writable layer.
    fn stats_of(&self, rec: &ContainerRecord) -> ContainerStats {
        let d = &self.daemon;
        let now = now_ns();
        let attributes = Some(ContainerAttributes {
            id: rec.id.clone(),
            metadata: Some(metadata(rec)),
            labels: map(&rec.labels),
            annotations: map(&rec.annotations),
        });
        let (bytes, inodes) = stats::disk_usage(&rec.layer_dir.join("upper"));
        let writable_layer = Some(FilesystemUsage {
            timestamp: now,
            fs_id: Some(FilesystemIdentifier {
                mountpoint: d.images.layers_dir().display().to_string(),
            }),
            used_bytes: Some(UInt64Value { value: bytes }),
            inodes_used: Some(UInt64Value { value: inodes }),
        });
        let mut stats = ContainerStats {
            attributes,
            cpu: None,
            memory: None,
            writable_layer,
            swap: None,
            io: None,
        };
        if rec.state != CState::Running {
            return stats;
        }
        // Where the runtime put it: `<pod cgroup>/crust-<id>`, or the
        // `crust-<id>.scope` of the pod's slice.
        let Some(cg) = d.containers.cgroup_of(rec) else {
            return stats;
        };
        let (cpu, memory) = usage_messages(d.stats.usage(cg.path(), &rec.id, now));
        stats.cpu = cpu;
        stats.memory = memory;
        stats
    }

    pub(super) async fn container_stats_impl(
        &self,
        req: Request<ContainerStatsRequest>,
    ) -> Result<Response<ContainerStatsResponse>, Status> {
        let rec = self
            .daemon
            .containers
            .get(&req.into_inner().container_id)
            .map_err(container_error)?;
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || this.stats_of(&rec))
            .await
            .map_err(internal)?;
        Ok(Response::new(ContainerStatsResponse { stats: Some(stats) }))
    }

    pub(super) async fn list_container_stats_impl(
        &self,
        req: Request<ListContainerStatsRequest>,
    ) -> Result<Response<ListContainerStatsResponse>, Status> {
        let f = req.into_inner().filter.unwrap_or_default();
        let recs: Vec<std::sync::Arc<ContainerRecord>> = self
            .daemon
            .containers
            .list()
            .into_iter()
            .filter(|r| f.id.is_empty() || r.id.starts_with(&f.id))
            .filter(|r| f.pod_sandbox_id.is_empty() || r.pod_id.starts_with(&f.pod_sandbox_id))
            .filter(|r| labels_match(r, &f.label_selector))
            .filter(|r| r.state == CState::Running)
            .collect();
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || {
            recs.iter().map(|r| this.stats_of(r)).collect::<Vec<_>>()
        })
        .await
        .map_err(internal)?;
        Ok(Response::new(ListContainerStatsResponse { stats }))
    }

    /// Blocking, as [`Cri::stats_of`].
    fn pod_stats_of(&self, pod: &PodRecord) -> PodSandboxStats {
        let now = now_ns();
        let containers: Vec<ContainerStats> = self
            .daemon
            .containers
            .list()
            .iter()
            .filter(|r| r.pod_id == pod.id && r.state == CState::Running)
            .map(|r| self.stats_of(r))
            .collect();
        let (cpu, memory) =
            usage_messages(self.daemon.stats.usage_at(&pod.cgroup_path, &pod.id, now));
        PodSandboxStats {
            attributes: Some(PodSandboxAttributes {
                id: pod.id.clone(),
                metadata: Some(PodSandboxMetadata {
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                    namespace: pod.metadata.namespace.clone(),
                    attempt: pod.metadata.attempt,
                }),
                labels: map(&pod.labels),
                annotations: map(&pod.annotations),
            }),
            linux: Some(LinuxPodSandboxStats {
                cpu,
                memory,
                network: None,
                process: None,
                containers,
                io: None,
            }),
            windows: None,
        }
    }

    pub(super) async fn pod_sandbox_stats_impl(
        &self,
        req: Request<PodSandboxStatsRequest>,
    ) -> Result<Response<PodSandboxStatsResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        let pod = self.daemon.pods.get(&id).map_err(pod_error)?;
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || this.pod_stats_of(&pod))
            .await
            .map_err(internal)?;
        Ok(Response::new(PodSandboxStatsResponse {
            stats: Some(stats),
        }))
    }

    pub(super) async fn list_pod_sandbox_stats_impl(
        &self,
        req: Request<ListPodSandboxStatsRequest>,
    ) -> Result<Response<ListPodSandboxStatsResponse>, Status> {
        let f = req.into_inner().filter.unwrap_or_default();
        let pods: Vec<_> = self
            .daemon
            .pods
            .list(&ListFilter {
                id: String::new(),
                state: Some(PodState::Ready),
                labels: f.label_selector.into_iter().collect(),
            })
            .into_iter()
            .filter(|p| f.id.is_empty() || p.id.starts_with(&f.id))
            .collect();
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || {
            pods.iter()
                .map(|p| this.pod_stats_of(p))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(internal)?;
        Ok(Response::new(ListPodSandboxStatsResponse { stats }))
    }
}

/// CRI's CPU and memory messages of a cgroup reading (none without one).
fn usage_messages(usage: Option<Usage>) -> (Option<CpuUsage>, Option<MemoryUsage>) {
    let Some(u) = usage else {
        return (None, None);
    };
    let v = |value: u64| Some(UInt64Value { value });
    let cpu = CpuUsage {
        timestamp: u.timestamp,
        usage_core_nano_seconds: v(u.cpu_usage_ns),
        usage_nano_cores: u.cpu_nano_cores.and_then(v),
        psi: None,
    };
    let memory = MemoryUsage {
        timestamp: u.timestamp,
        working_set_bytes: v(u.memory_working_set_bytes),
        available_bytes: u.memory_available_bytes.and_then(v),
        usage_bytes: v(u.memory_usage_bytes),
        rss_bytes: u.memory_rss_bytes.and_then(v),
        page_faults: u.page_faults.and_then(v),
        major_page_faults: u.major_page_faults.and_then(v),
        psi: None,
    };
    (Some(cpu), Some(memory))
}
