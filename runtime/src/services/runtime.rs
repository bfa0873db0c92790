//! CRI RuntimeService.

use std::collections::HashMap;
use std::net::IpAddr;

use crust_api::v1::runtime_service_server::RuntimeService;
use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, ResponseStream, internal};
use crate::api_version::ApiVersion;
use crate::config::CgroupDriver as ConfiguredDriver;

/// The kubelet-runtime API version (the same constant containerd and CRI-O
/// report).
const KUBELET_API_VERSION: &str = "0.1.0";

#[tonic::async_trait]
impl RuntimeService for Cri {
    async fn version(
        &self,
        req: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse {
            version: KUBELET_API_VERSION.into(),
            runtime_name: "crust".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: ApiVersion::of(&req).as_str().into(),
        }))
    }

    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let verbose = req.get_ref().verbose;
        let runtime = self.runtime_condition().await;
        let network = self.network_condition();
        let mut info = HashMap::new();
        if verbose {
            // crictl info shows each value parsed as JSON under its key.
            let d = &self.daemon;
            let json = |v: serde_json::Value| v.to_string();
            info.insert("config".into(), json(serde_json::json!(*d.live_config())));
            info.insert(
                "cgroupHierarchy".into(),
                json(serde_json::json!(d.cgroup_hierarchy)),
            );
            info.insert("podCIDRs".into(), json(serde_json::json!(d.pod_cidrs())));
            info.insert("apparmor".into(), json(d.apparmor.status_info()));
            info.insert(
                "checkpoint".into(),
                json(d.checkpoint.availability().await.status_info()),
            );
        }
        Ok(Response::new(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![runtime, network],
            }),
            info,
            runtime_handlers: self.runtime_handlers(),
            features: Some(RuntimeFeatures {
                // crates/oci resolves supplementary groups per
                // supplemental_groups_policy (Merge or Strict) and
                // ContainerStatus.user reports the result.
                supplemental_groups_policy: true,
                // A user namespace pod may use the node's network (its
                // containers bind the node's /sys, crates/oci mounts.rs)
                // wherever user namespaces work at all.
                user_namespaces_host_network: self.user_namespaces_anywhere(),
                // Mount.mount_options (nosuid, nodev, noexec) go onto the
                // bind mount for every handler (crates/oci mounts.rs);
                // anything else is refused, never ignored.
                mount_options: true,
            }),
        }))
    }

    async fn runtime_config(
        &self,
        _req: Request<RuntimeConfigRequest>,
    ) -> Result<Response<RuntimeConfigResponse>, Status> {
        let driver = match self.daemon.config.cgroup_driver {
            ConfiguredDriver::Cgroupfs => CgroupDriver::Cgroupfs,
            ConfiguredDriver::Systemd => CgroupDriver::Systemd,
        };
        Ok(Response::new(RuntimeConfigResponse {
            linux: Some(LinuxRuntimeConfiguration {
                cgroup_driver: driver as i32,
            }),
        }))
    }

    async fn update_runtime_config(
        &self,
        req: Request<UpdateRuntimeConfigRequest>,
    ) -> Result<Response<UpdateRuntimeConfigResponse>, Status> {
        let pod_cidr = req
            .into_inner()
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        // kubelet sends an empty CIDR when it has none; that changes nothing.
        if pod_cidr.is_empty() {
            return Ok(Response::new(UpdateRuntimeConfigResponse {}));
        }
        let cidrs = parse_pod_cidrs(&pod_cidr).map_err(|e| {
            Status::invalid_argument(format!("runtime_config.network_config.pod_cidr: {e}"))
        })?;
        let daemon = self.daemon.clone();
        tokio::task::spawn_blocking(move || daemon.set_pod_cidrs(cidrs))
            .await
            .map_err(internal)?
            .map_err(internal)?;
        Ok(Response::new(UpdateRuntimeConfigResponse {}))
    }

    async fn run_pod_sandbox(
        &self,
        req: Request<RunPodSandboxRequest>,
    ) -> Result<Response<RunPodSandboxResponse>, Status> {
        self.run_pod_sandbox_impl(req).await
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<StopPodSandboxRequest>,
    ) -> Result<Response<StopPodSandboxResponse>, Status> {
        self.stop_pod_sandbox_impl(req).await
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<RemovePodSandboxRequest>,
    ) -> Result<Response<RemovePodSandboxResponse>, Status> {
        self.remove_pod_sandbox_impl(req).await
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        self.pod_sandbox_status_impl(req).await
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        self.list_pod_sandbox_impl(req).await
    }

    type StreamPodSandboxesStream = ResponseStream<StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        req: Request<StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        let (meta, ext, req) = req.into_parts();
        let items = self
            .list_pod_sandbox_impl(Request::from_parts(
                meta,
                ext,
                ListPodSandboxRequest { filter: req.filter },
            ))
            .await?
            .into_inner()
            .items;
        Ok(Response::new(super::batched(items, |pod_sandboxes| {
            StreamPodSandboxesResponse { pod_sandboxes }
        })))
    }

    async fn create_container(
        &self,
        req: Request<CreateContainerRequest>,
    ) -> Result<Response<CreateContainerResponse>, Status> {
        self.create_container_impl(req).await
    }

    async fn start_container(
        &self,
        req: Request<StartContainerRequest>,
    ) -> Result<Response<StartContainerResponse>, Status> {
        self.start_container_impl(req).await
    }

    async fn stop_container(
        &self,
        req: Request<StopContainerRequest>,
    ) -> Result<Response<StopContainerResponse>, Status> {
        self.stop_container_impl(req).await
    }

    async fn remove_container(
        &self,
        req: Request<RemoveContainerRequest>,
    ) -> Result<Response<RemoveContainerResponse>, Status> {
        self.remove_container_impl(req).await
    }

    async fn list_containers(
        &self,
        req: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        self.list_containers_impl(req).await
    }

    type StreamContainersStream = ResponseStream<StreamContainersResponse>;

    async fn stream_containers(
        &self,
        req: Request<StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        let (meta, ext, req) = req.into_parts();
        let containers = self
            .list_containers_impl(Request::from_parts(
                meta,
                ext,
                ListContainersRequest { filter: req.filter },
            ))
            .await?
            .into_inner()
            .containers;
        Ok(Response::new(super::batched(containers, |containers| {
            StreamContainersResponse { containers }
        })))
    }

    async fn container_status(
        &self,
        req: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        self.container_status_impl(req).await
    }

    async fn update_container_resources(
        &self,
        req: Request<UpdateContainerResourcesRequest>,
    ) -> Result<Response<UpdateContainerResourcesResponse>, Status> {
        self.update_container_resources_impl(req).await
    }

    async fn reopen_container_log(
        &self,
        req: Request<ReopenContainerLogRequest>,
    ) -> Result<Response<ReopenContainerLogResponse>, Status> {
        self.reopen_container_log_impl(req).await
    }

    async fn exec_sync(
        &self,
        req: Request<ExecSyncRequest>,
    ) -> Result<Response<ExecSyncResponse>, Status> {
        self.exec_sync_impl(req).await
    }

    async fn exec(&self, req: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        self.exec_impl(req).await
    }

    async fn attach(
        &self,
        req: Request<AttachRequest>,
    ) -> Result<Response<AttachResponse>, Status> {
        self.attach_impl(req).await
    }

    async fn port_forward(
        &self,
        req: Request<PortForwardRequest>,
    ) -> Result<Response<PortForwardResponse>, Status> {
        self.port_forward_impl(req).await
    }

    async fn container_stats(
        &self,
        req: Request<ContainerStatsRequest>,
    ) -> Result<Response<ContainerStatsResponse>, Status> {
        self.container_stats_impl(req).await
    }

    async fn list_container_stats(
        &self,
        req: Request<ListContainerStatsRequest>,
    ) -> Result<Response<ListContainerStatsResponse>, Status> {
        self.list_container_stats_impl(req).await
    }

    type StreamContainerStatsStream = ResponseStream<StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        req: Request<StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        let (meta, ext, req) = req.into_parts();
        let stats = self
            .list_container_stats_impl(Request::from_parts(
                meta,
                ext,
                ListContainerStatsRequest { filter: req.filter },
            ))
            .await?
            .into_inner()
            .stats;
        Ok(Response::new(super::batched(stats, |container_stats| {
            StreamContainerStatsResponse { container_stats }
        })))
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<PodSandboxStatsRequest>,
    ) -> Result<Response<PodSandboxStatsResponse>, Status> {
        self.pod_sandbox_stats_impl(req).await
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: Request<ListPodSandboxStatsRequest>,
    ) -> Result<Response<ListPodSandboxStatsResponse>, Status> {
        self.list_pod_sandbox_stats_impl(req).await
    }

    type StreamPodSandboxStatsStream = ResponseStream<StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        req: Request<StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        let (meta, ext, req) = req.into_parts();
        let stats = self
            .list_pod_sandbox_stats_impl(Request::from_parts(
                meta,
                ext,
                ListPodSandboxStatsRequest { filter: req.filter },
            ))
            .await?
            .into_inner()
            .stats;
        Ok(Response::new(super::batched(stats, |pod_sandbox_stats| {
            StreamPodSandboxStatsResponse { pod_sandbox_stats }
        })))
    }

    async fn checkpoint_container(
        &self,
        req: Request<CheckpointContainerRequest>,
    ) -> Result<Response<CheckpointContainerResponse>, Status> {
        self.checkpoint_container_impl(req).await
    }

    type GetContainerEventsStream = ResponseStream<ContainerEventResponse>;

    async fn get_container_events(
        &self,
        req: Request<GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        self.get_container_events_impl(req).await
    }

    async fn list_metric_descriptors(
        &self,
        req: Request<ListMetricDescriptorsRequest>,
    ) -> Result<Response<ListMetricDescriptorsResponse>, Status> {
        self.list_metric_descriptors_impl(req).await
    }

    async fn list_pod_sandbox_metrics(
        &self,
        req: Request<ListPodSandboxMetricsRequest>,
    ) -> Result<Response<ListPodSandboxMetricsResponse>, Status> {
        self.list_pod_sandbox_metrics_impl(req).await
    }

    type StreamPodSandboxMetricsStream = ResponseStream<StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        req: Request<StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        self.stream_pod_sandbox_metrics_impl(req).await
    }

    async fn update_pod_sandbox_resources(
        &self,
        req: Request<UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<UpdatePodSandboxResourcesResponse>, Status> {
        self.update_pod_sandbox_resources_impl(req).await
    }
}

impl Cri {
    /// Whether any handler runs user namespace pods (the kernel's support,
    /// the same for every handler: see `handlers::HandlerFeatures`).
    fn user_namespaces_anywhere(&self) -> bool {
        let handlers = &self.daemon.handlers;
        handlers
            .names()
            .iter()
            .any(|name| handlers.features(name).user_namespaces)
    }

    /// Status's runtime handlers with their features.
    pub(super) fn runtime_handlers(&self) -> Vec<RuntimeHandler> {
        let handlers = &self.daemon.handlers;
        handlers
            .names()
            .into_iter()
            .map(|name| RuntimeHandler {
                features: Some(handlers.features(&name).to_cri()),
                name,
            })
            .collect()
    }

    /// RuntimeReady is false while the metadata store cannot be written (a
    /// full disk under the root): kubelet then sends no new pods. Each call
    /// while it is so tries a small write, so readiness comes back as soon
    /// as writes work, without a restart.
    async fn runtime_condition(&self) -> RuntimeCondition {
        // The healthy case is an in-memory flag: no trip to the blocking
        // pool unless a probe write is due.
        let mut health = self.daemon.store.health();
        if health.is_err() {
            let store = self.daemon.store.clone();
            health = tokio::task::spawn_blocking(move || {
                let _ = store.probe();
                store.health()
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        }
        let (status, reason, message) = match health {
            Ok(()) => (true, String::new(), String::new()),
            Err(why) => (
                false,
                "MetadataStoreNotWritable".to_string(),
                crust_quote::truncate(
                    &format!("writing the metadata store failed: {why}"),
                    super::MAX_MESSAGE,
                ),
            ),
        };
        RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status,
            reason,
            message,
        }
    }

    /// NetworkReady follows the CNI config dir, looked at on every call
    /// (parsed again when it changed) so a config dropped in later, edited
    /// or removed is seen without a restart.
    fn network_condition(&self) -> RuntimeCondition {
        let (status, reason, message) = match self
            .net_ready
            .check(&self.daemon.config.network.cni_conf_dir)
        {
            Ok(()) => (true, String::new(), String::new()),
            Err(e) => (
                false,
                "NetworkPluginNotReady".to_string(),
                format!("Network plugin returns error: {e}"),
            ),
        };
        RuntimeCondition {
            r#type: "NetworkReady".into(),
            status,
            reason,
            message,
        }
    }
}

/// Parses kubelet's pod CIDR: one CIDR, or an IPv4 and an IPv6 one separated
/// by a comma for dual-stack.
fn parse_pod_cidrs(text: &str) -> Result<Vec<String>, String> {
    let cidrs: Vec<String> = text.split(',').map(|s| s.trim().to_string()).collect();
    if cidrs.len() > 2 {
        return Err(format!("{text:?} has more than two CIDRs"));
    }
    for cidr in &cidrs {
        let (addr, prefix) = cidr
            .split_once('/')
            .ok_or_else(|| format!("{cidr:?} is not a CIDR (no prefix length)"))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{cidr:?} is not a CIDR (bad address)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        match prefix.parse::<u8>() {
            Ok(p) if p <= max => {}
            _ => return Err(format!("{cidr:?} is not a CIDR (bad prefix length)")),
        }
    }
    if cidrs.len() == 2 && cidrs[0].contains(':') == cidrs[1].contains(':') {
        return Err(format!("{text:?}: two CIDRs must be one IPv4 and one IPv6"));
    }
    Ok(cidrs)
}

#[cfg(test)]
mod tests {
    use super::parse_pod_cidrs;

    #[test]
    fn pod_cidrs() {
        assert_eq!(parse_pod_cidrs("10.88.0.0/16").unwrap(), ["10.88.0.0/16"]);
        assert_eq!(
            parse_pod_cidrs("10.1.0.0/24, fd00::/64").unwrap(),
            ["10.1.0.0/24", "fd00::/64"]
        );
        for bad in [
            "10.88.0.0",
            "10.88.0.0/33",
            "10.88.0/16",
            "fd00::/129",
            "10.0.0.0/8,10.1.0.0/16",
            "a,b,c",
        ] {
            assert!(parse_pod_cidrs(bad).is_err(), "{bad:?} accepted");
        }
    }
}
