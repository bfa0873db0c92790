//! Pod sandbox RPCs: RunPodSandbox, StopPodSandbox, RemovePodSandbox,
//! PodSandboxStatus, ListPodSandbox. Translation only; life-cycle steps go
//! through `crate::lifecycle`, reads to `crate::pods`.

use std::collections::HashMap;

use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, bounds, detached, map, pod_error};
use crate::clock::now_ns;
use crate::pods::{ListFilter, PodRecord, PodSpec, PodState};

impl Cri {
    pub(super) async fn run_pod_sandbox_impl(
        &self,
        req: Request<RunPodSandboxRequest>,
    ) -> Result<Response<RunPodSandboxResponse>, Status> {
        let req = req.into_inner();
        bounds::run_pod_sandbox(&req)?;
        let handlers = self.daemon.handlers.names();
        let spec = PodSpec::from_request_with(req, &handlers).map_err(pod_error)?;
        let d = self.daemon.clone();
        let id = detached(async move { d.lifecycle.run_pod(spec).await }, pod_error).await?;
        Ok(Response::new(RunPodSandboxResponse { pod_sandbox_id: id }))
    }

    pub(super) async fn stop_pod_sandbox_impl(
        &self,
        req: Request<StopPodSandboxRequest>,
    ) -> Result<Response<StopPodSandboxResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        bounds::id("pod_sandbox_id", &id)?;
        let d = self.daemon.clone();
        detached(async move { d.lifecycle.stop_pod(&id).await }, pod_error).await?;
        Ok(Response::new(StopPodSandboxResponse {}))
    }

    pub(super) async fn remove_pod_sandbox_impl(
        &self,
        req: Request<RemovePodSandboxRequest>,
    ) -> Result<Response<RemovePodSandboxResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        bounds::id("pod_sandbox_id", &id)?;
        let d = self.daemon.clone();
        detached(async move { d.lifecycle.remove_pod(&id).await }, pod_error).await?;
        Ok(Response::new(RemovePodSandboxResponse {}))
    }

    pub(super) async fn update_pod_sandbox_resources_impl(
        &self,
        req: Request<UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<UpdatePodSandboxResourcesResponse>, Status> {
        let req = req.into_inner();
        bounds::id("pod_sandbox_id", &req.pod_sandbox_id)?;
        for (field, r) in [("overhead", &req.overhead), ("resources", &req.resources)] {
            if let Some(r) = r {
                bounds::resources(field, r)?;
            }
        }
        let d = self.daemon.clone();
        detached(
            async move {
                d.lifecycle
                    .update_pod_resources(&req.pod_sandbox_id, req.overhead, req.resources)
                    .await
            },
            pod_error,
        )
        .await?;
        Ok(Response::new(UpdatePodSandboxResourcesResponse {}))
    }

    pub(super) async fn pod_sandbox_status_impl(
        &self,
        req: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        let req = req.into_inner();
        bounds::id("pod_sandbox_id", &req.pod_sandbox_id)?;
        let rec = self
            .daemon
            .pods
            .get(&req.pod_sandbox_id)
            .map_err(pod_error)?;
        let mut info = HashMap::new();
        if req.verbose {
            let v = self.daemon.pods.verbose_info(&rec);
            info.insert("info".to_string(), v.to_string());
        }
        Ok(Response::new(PodSandboxStatusResponse {
            status: Some(sandbox_status(&rec)),
            info,
            containers_statuses: Vec::new(),
            timestamp: now_ns(),
        }))
    }

    pub(super) async fn list_pod_sandbox_impl(
        &self,
        req: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let filter = req.into_inner().filter.unwrap_or_default();
        bounds::id("filter.id", &filter.id)?;
        bounds::selector("filter.label_selector", &filter.label_selector)?;
        let state = match filter.state {
            None => None,
            Some(v) => match PodSandboxState::try_from(v.state) {
                Ok(PodSandboxState::SandboxReady) => Some(PodState::Ready),
                Ok(PodSandboxState::SandboxNotready) => Some(PodState::NotReady),
                Err(_) => {
                    return Err(Status::invalid_argument(format!(
                        "filter.state: unknown pod sandbox state {}",
                        v.state
                    )));
                }
            },
        };
        let filter = ListFilter {
            id: filter.id,
            state,
            labels: filter.label_selector.into_iter().collect(),
        };
        let items = self
            .daemon
            .pods
            .list(&filter)
            .iter()
            .map(|rec| PodSandbox {
                id: rec.id.clone(),
                metadata: Some(metadata(rec)),
                state: state_of(rec) as i32,
                created_at: rec.created_at,
                labels: map(&rec.labels),
                annotations: map(&rec.annotations),
                runtime_handler: rec.runtime_handler.clone(),
            })
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }
}

pub(super) fn sandbox_status(rec: &PodRecord) -> PodSandboxStatus {
    let ips = rec.ips();
    let config = rec.sandbox_config();
    let namespace_options = config
        .linux
        .and_then(|l| l.security_context)
        .and_then(|s| s.namespace_options)
        .unwrap_or_default();
    PodSandboxStatus {
        id: rec.id.clone(),
        metadata: Some(metadata(rec)),
        state: state_of(rec) as i32,
        created_at: rec.created_at,
        network: Some(PodSandboxNetworkStatus {
            ip: ips.first().cloned().unwrap_or_default(),
            additional_ips: ips
                .iter()
                .skip(1)
                .map(|ip| PodIp { ip: ip.clone() })
                .collect(),
        }),
        linux: Some(LinuxPodSandboxStatus {
            namespaces: Some(Namespace {
                options: Some(namespace_options),
            }),
        }),
        labels: map(&rec.labels),
        annotations: map(&rec.annotations),
        runtime_handler: rec.runtime_handler.clone(),
    }
}

fn metadata(rec: &PodRecord) -> PodSandboxMetadata {
    PodSandboxMetadata {
        name: rec.metadata.name.clone(),
        uid: rec.metadata.uid.clone(),
        namespace: rec.metadata.namespace.clone(),
        attempt: rec.metadata.attempt,
    }
}

fn state_of(rec: &PodRecord) -> PodSandboxState {
    match rec.state {
        PodState::Ready => PodSandboxState::SandboxReady,
        PodState::NotReady | PodState::Creating => PodSandboxState::SandboxNotready,
    }
}
