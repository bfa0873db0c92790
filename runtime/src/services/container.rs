//! Container RPCs: translation only; the work is in `crate::containers`.

use std::collections::HashMap;
use std::path::Path;

use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, ResponseStream, detached, internal};
use crate::clock::now_ns;
use crate::containers::record::ImageRequest;
use crate::containers::{self, ContainerRecord, ContainerState as CState, CpuSample, EventKind};

fn map(m: &std::collections::BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn state_of(s: CState) -> ContainerState {
    match s {
        CState::Creating | CState::Created => ContainerState::ContainerCreated,
        CState::Running => ContainerState::ContainerRunning,
        CState::Exited => ContainerState::ContainerExited,
    }
}

fn metadata(rec: &ContainerRecord) -> ContainerMetadata {
    ContainerMetadata {
        name: rec.name.clone(),
        attempt: rec.attempt,
    }
}

fn image_spec(rec: &ContainerRecord) -> ImageSpec {
    let req = rec
        .image_request
        .clone()
        .unwrap_or_else(|| ImageRequest::from(containers::config_of(rec).image));
    ImageSpec {
        image: rec.image.clone(),
        annotations: req.annotations.into_iter().collect(),
        user_specified_image: if req.user_specified_image.is_empty() {
            rec.image.clone()
        } else {
            req.user_specified_image
        },
        runtime_handler: rec.handler.clone(),
        image_ref: rec.image_ref.clone(),
    }
}

pub fn container_status(rec: &ContainerRecord) -> ContainerStatus {
    let config = containers::config_of(rec);
    ContainerStatus {
        id: rec.id.clone(),
        metadata: Some(metadata(rec)),
        state: state_of(rec.state) as i32,
        created_at: rec.created_at,
        started_at: rec.started_at,
        finished_at: rec.finished_at,
        exit_code: rec.exit_code,
        image: Some(image_spec(rec)),
        image_ref: rec.image_ref.clone(),
        reason: rec.reason.clone(),
        message: rec.message.clone(),
        labels: map(&rec.labels),
        annotations: map(&rec.annotations),
        mounts: config.mounts.clone(),
        log_path: rec
            .log_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        resources: containers::resources_of(rec).map(|r| ContainerResources {
            linux: Some(r),
            windows: None,
        }),
        image_id: rec.image_ref.clone(),
        user: rec.user.as_ref().map(|(uid, gid, groups)| ContainerUser {
            linux: Some(LinuxContainerUser {
                uid: i64::from(*uid),
                gid: i64::from(*gid),
                supplemental_groups: groups.iter().map(|g| i64::from(*g)).collect(),
            }),
        }),
        stop_signal: 0,
    }
}

fn list_item(rec: &ContainerRecord) -> Container {
    Container {
        id: rec.id.clone(),
        pod_sandbox_id: rec.pod_id.clone(),
        metadata: Some(metadata(rec)),
        image: Some(image_spec(rec)),
        image_ref: rec.image_ref.clone(),
        state: state_of(rec.state) as i32,
        created_at: rec.created_at,
        labels: map(&rec.labels),
        annotations: map(&rec.annotations),
        image_id: rec.image_ref.clone(),
    }
}

fn labels_match(rec: &ContainerRecord, sel: &HashMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| rec.labels.get(k) == Some(v))
}

impl Cri {
    pub(super) async fn create_container_impl(
        &self,
        req: Request<CreateContainerRequest>,
    ) -> Result<Response<CreateContainerResponse>, Status> {
        let req = req.into_inner();
        let id = detached(
            containers::create(self.daemon.clone(), req.pod_sandbox_id, req.config),
            |s| s,
        )
        .await?;
        Ok(Response::new(CreateContainerResponse { container_id: id }))
    }

    pub(super) async fn start_container_impl(
        &self,
        req: Request<StartContainerRequest>,
    ) -> Result<Response<StartContainerResponse>, Status> {
        let id = req.into_inner().container_id;
        detached(containers::start(self.daemon.clone(), id), |s| s).await?;
        Ok(Response::new(StartContainerResponse {}))
    }

    pub(super) async fn stop_container_impl(
        &self,
        req: Request<StopContainerRequest>,
    ) -> Result<Response<StopContainerResponse>, Status> {
        let req = req.into_inner();
        detached(
            containers::stop(self.daemon.clone(), req.container_id, req.timeout),
            |s| s,
        )
        .await?;
        Ok(Response::new(StopContainerResponse {}))
    }

    pub(super) async fn remove_container_impl(
        &self,
        req: Request<RemoveContainerRequest>,
    ) -> Result<Response<RemoveContainerResponse>, Status> {
        let id = req.into_inner().container_id;
        detached(containers::remove(self.daemon.clone(), id), |s| s).await?;
        Ok(Response::new(RemoveContainerResponse {}))
    }

    pub(super) async fn container_status_impl(
        &self,
        req: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        let req = req.into_inner();
        let rec = self.daemon.containers.get(&req.container_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            let v = serde_json::json!({
                "sandboxID": rec.pod_id,
                "pid": if rec.state == CState::Running { rec.pid } else { 0 },
                "runtimeType": rec.handler,
                "runtimeHandler": rec.handler,
                "runtimeOptions": rec.runtime,
                "snapshotter": "overlayfs",
                "snapshotKey": rec.id,
                "rootfs": rec.rootfs,
                "bundle": rec.bundle,
                "config": serde_json::from_str::<serde_json::Value>(
                    &serde_json::to_string(&containers::config_of(&rec).metadata.map(|m| {
                        serde_json::json!({"name": m.name, "attempt": m.attempt})
                    })).unwrap_or_default()
                ).unwrap_or_default(),
                "runtimeSpec": containers::spec_json(&rec),
            });
            info.insert("info".to_string(), v.to_string());
        }
        Ok(Response::new(ContainerStatusResponse {
            status: Some(container_status(&rec)),
            info,
        }))
    }

    pub(super) async fn list_containers_impl(
        &self,
        req: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        let f = req.into_inner().filter.unwrap_or_default();
        let state = f.state.map(|s| s.state);
        let containers = self
            .daemon
            .containers
            .list()
            .iter()
            .filter(|r| f.id.is_empty() || r.id.starts_with(&f.id))
            .filter(|r| f.pod_sandbox_id.is_empty() || r.pod_id.starts_with(&f.pod_sandbox_id))
            .filter(|r| state.is_none_or(|s| state_of(r.state) as i32 == s))
            .filter(|r| labels_match(r, &f.label_selector))
            .map(|r| list_item(r))
            .collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }

    pub(super) async fn update_container_resources_impl(
        &self,
        req: Request<UpdateContainerResourcesRequest>,
    ) -> Result<Response<UpdateContainerResourcesResponse>, Status> {
        let req = req.into_inner();
        detached(
            containers::update(self.daemon.clone(), req.container_id, req.linux),
            |s| s,
        )
        .await?;
        Ok(Response::new(UpdateContainerResourcesResponse {}))
    }

    pub(super) async fn reopen_container_log_impl(
        &self,
        req: Request<ReopenContainerLogRequest>,
    ) -> Result<Response<ReopenContainerLogResponse>, Status> {
        let id = req.into_inner().container_id;
        containers::reopen_log(self.daemon.clone(), id).await?;
        Ok(Response::new(ReopenContainerLogResponse {}))
    }

    pub(super) async fn exec_sync_impl(
        &self,
        req: Request<ExecSyncRequest>,
    ) -> Result<Response<ExecSyncResponse>, Status> {
        let req = req.into_inner();
        let out =
            containers::exec_sync(self.daemon.clone(), req.container_id, req.cmd, req.timeout)
                .await?;
        Ok(Response::new(ExecSyncResponse {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
        }))
    }

    fn stats_of(&self, rec: &ContainerRecord) -> ContainerStats {
        let d = &self.daemon;
        let now = now_ns();
        let attributes = Some(ContainerAttributes {
            id: rec.id.clone(),
            metadata: Some(metadata(rec)),
            labels: map(&rec.labels),
            annotations: map(&rec.annotations),
        });
        let (bytes, inodes) = crust_linux::mounts::disk_usage(&rec.layer_dir.join("upper"));
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
        let Some(pod) = d.pods.get(&rec.pod_id).ok() else {
            return stats;
        };
        let path = pod.cgroup_path.join(format!("crust-{}", rec.id));
        let (cpu, memory) = cgroup_usage(self, &path, &rec.id, now);
        stats.cpu = cpu;
        stats.memory = memory;
        stats
    }

    pub(super) async fn container_stats_impl(
        &self,
        req: Request<ContainerStatsRequest>,
    ) -> Result<Response<ContainerStatsResponse>, Status> {
        let rec = self.daemon.containers.get(&req.into_inner().container_id)?;
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

    fn pod_stats_of(&self, pod: &crate::pods::PodRecord) -> PodSandboxStats {
        let now = now_ns();
        let containers: Vec<ContainerStats> = self
            .daemon
            .containers
            .list()
            .iter()
            .filter(|r| r.pod_id == pod.id && r.state == CState::Running)
            .map(|r| self.stats_of(r))
            .collect();
        let (cpu, memory) = cgroup_usage(self, &pod.cgroup_path, &pod.id, now);
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
        let pod = self.daemon.pods.get(&id).map_err(super::pod::pod_status)?;
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
            .list(&crate::pods::ListFilter {
                id: String::new(),
                state: Some(crate::pods::PodState::Ready),
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

    pub(super) async fn get_container_events_impl(
        &self,
        _req: Request<GetEventsRequest>,
    ) -> Result<Response<ResponseStream<ContainerEventResponse>>, Status> {
        let mut rx = self.daemon.containers.events.subscribe();
        let this = self.clone();
        let (tx, out) = tokio::sync::mpsc::channel::<Result<ContainerEventResponse, Status>>(256);
        tokio::spawn(async move {
            loop {
                let ev = match rx.recv().await {
                    Ok(ev) => ev,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                let kind = match ev.kind {
                    EventKind::Created => ContainerEventType::ContainerCreatedEvent,
                    EventKind::Started => ContainerEventType::ContainerStartedEvent,
                    EventKind::Stopped => ContainerEventType::ContainerStoppedEvent,
                    EventKind::Deleted => ContainerEventType::ContainerDeletedEvent,
                };
                let pod_sandbox_status = this
                    .daemon
                    .pods
                    .get(&ev.pod_id)
                    .ok()
                    .map(|p| super::pod::sandbox_status(&p));
                let containers_statuses = this
                    .daemon
                    .containers
                    .list()
                    .iter()
                    .filter(|r| r.pod_id == ev.pod_id)
                    .map(|r| container_status(r))
                    .collect();
                let resp = ContainerEventResponse {
                    container_id: ev.container_id,
                    container_event_type: kind as i32,
                    created_at: ev.at,
                    pod_sandbox_status,
                    containers_statuses,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    /// Status's runtime handlers with their features.
    pub(super) fn runtime_handlers(&self) -> Vec<RuntimeHandler> {
        self.daemon
            .containers
            .handlers
            .keys()
            .map(|name| RuntimeHandler {
                name: name.clone(),
                features: Some(RuntimeHandlerFeatures {
                    recursive_read_only_mounts: self
                        .daemon
                        .containers
                        .features
                        .get(name)
                        .is_some_and(|f| f.recursive_read_only_mounts),
                    // Pods in user namespaces are not implemented (refused
                    // by CreateContainer / RunPodSandbox).
                    user_namespaces: false,
                }),
            })
            .collect()
    }
}

/// CPU and memory of a cgroup (v1 or v2, through libcgroups); the CPU rate
/// from the previous sample of `key`.
fn cgroup_usage(
    cri: &Cri,
    path: &Path,
    key: &str,
    now: i64,
) -> (Option<CpuUsage>, Option<MemoryUsage>) {
    let Ok(cg) = crust_linux::cgroups::PodCgroup::new(
        cri.daemon.cgroup_hierarchy,
        Path::new("/sys/fs/cgroup"),
        path,
    ) else {
        return (None, None);
    };
    let Ok(st) = cg.stats() else {
        return (None, None);
    };
    let usage = st.cpu.usage.usage_total;
    let nano_cores = {
        let mut samples = cri
            .daemon
            .containers
            .cpu_samples
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let prev = samples.insert(
            key.to_string(),
            CpuSample {
                at: now,
                usage_ns: usage,
            },
        );
        prev.and_then(|p| {
            let dt = now.saturating_sub(p.at);
            (dt > 0 && usage >= p.usage_ns)
                .then(|| ((usage - p.usage_ns) as u128 * 1_000_000_000 / dt as u128) as u64)
        })
    };
    let cpu = CpuUsage {
        timestamp: now,
        usage_core_nano_seconds: Some(UInt64Value { value: usage }),
        usage_nano_cores: nano_cores.map(|value| UInt64Value { value }),
        psi: None,
    };
    let m = &st.memory;
    let stat = |k: &str| m.stats.get(k).copied();
    let usage_bytes = m.memory.usage;
    let inactive = if cri.daemon.cgroup_hierarchy.is_unified() {
        stat("inactive_file")
    } else {
        stat("total_inactive_file")
    }
    .unwrap_or(0);
    let working_set = usage_bytes.saturating_sub(inactive);
    let rss = if cri.daemon.cgroup_hierarchy.is_unified() {
        stat("anon")
    } else {
        stat("total_rss")
    };
    let (pgfault, pgmajfault) = if cri.daemon.cgroup_hierarchy.is_unified() {
        (stat("pgfault"), stat("pgmajfault"))
    } else {
        (stat("total_pgfault"), stat("total_pgmajfault"))
    };
    let limit = m.memory.limit;
    let available = (limit > 0 && limit < (1u64 << 62)).then(|| limit.saturating_sub(working_set));
    let v = |value: u64| Some(UInt64Value { value });
    let memory = MemoryUsage {
        timestamp: now,
        working_set_bytes: v(working_set),
        available_bytes: available.and_then(v),
        usage_bytes: v(usage_bytes),
        rss_bytes: rss.and_then(v),
        page_faults: pgfault.and_then(v),
        major_page_faults: pgmajfault.and_then(v),
        psi: None,
    };
    (Some(cpu), Some(memory))
}
