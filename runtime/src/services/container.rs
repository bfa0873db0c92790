//! Container RPCs: translation only; life-cycle steps go through
//! `crate::lifecycle`, reads to `crate::containers`.

use std::collections::HashMap;
use std::sync::Arc;

use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, bounds, container_error, detached, map};
use crate::api_version::ApiVersion;
use crate::containers::{ContainerRecord, ContainerState as CState, ImageRequest};

fn state_of(s: CState) -> ContainerState {
    match s {
        CState::Creating | CState::Created => ContainerState::ContainerCreated,
        CState::Running => ContainerState::ContainerRunning,
        CState::Exited => ContainerState::ContainerExited,
    }
}

pub(super) fn metadata(rec: &ContainerRecord) -> ContainerMetadata {
    ContainerMetadata {
        name: rec.name.clone(),
        attempt: rec.attempt,
    }
}

/// The container's image as kubelet and users expect it: the name the
/// user gave (kubelet shows `image.image` as the pod's
/// `containerStatuses[].image`), its repo digest as `image_ref` (see
/// `containers::image_names`).
fn image_spec(rec: &ContainerRecord) -> ImageSpec {
    let annotations = match &rec.image_request {
        Some(r) => r.annotations.clone(),
        None => ImageRequest::from(rec.config().image).annotations,
    };
    let reported = rec.reported_image();
    ImageSpec {
        image: reported.name.clone(),
        annotations: annotations.into_iter().collect(),
        user_specified_image: reported.name,
        runtime_handler: rec.handler.clone(),
        image_ref: reported.image_ref,
    }
}

pub fn container_status(rec: &ContainerRecord) -> ContainerStatus {
    let config = rec.config();
    let image = image_spec(rec);
    ContainerStatus {
        id: rec.id.clone(),
        metadata: Some(metadata(rec)),
        state: state_of(rec.state) as i32,
        created_at: rec.created_at,
        started_at: rec.started_at,
        finished_at: rec.finished_at,
        exit_code: rec.exit_code,
        image_ref: image.image_ref.clone(),
        image: Some(image),
        reason: rec.reason.clone(),
        message: rec.message.clone(),
        labels: map(&rec.labels),
        annotations: map(&rec.annotations),
        mounts: mounts(rec, config.mounts),
        log_path: rec
            .log_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        resources: rec.resources().map(|r| ContainerResources {
            linux: Some(r),
            windows: None,
        }),
        image_id: rec.image_id.clone(),
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

/// The request's mounts, image volumes with the ID (digest) of the image
/// they mount, which kubelet reports in the pod's volume status, and as
/// read-only as they are.
fn mounts(rec: &ContainerRecord, mut mounts: Vec<Mount>) -> Vec<Mount> {
    for (index, id) in &rec.image_volumes {
        if let Some(m) = mounts.get_mut(*index) {
            let asked = m.image.take().unwrap_or_default();
            m.image = Some(ImageSpec {
                image: id.clone(),
                image_ref: id.clone(),
                user_specified_image: if asked.user_specified_image.is_empty() {
                    asked.image
                } else {
                    asked.user_specified_image
                },
                annotations: asked.annotations,
                runtime_handler: asked.runtime_handler,
            });
            m.readonly = true;
        }
    }
    mounts
}

pub(super) fn list_item(rec: &ContainerRecord, api: ApiVersion) -> Container {
    let image = image_spec(rec);
    Container {
        id: rec.id.clone(),
        pod_sandbox_id: rec.pod_id.clone(),
        metadata: Some(metadata(rec)),
        // A v1alpha2 kubelet has no image_id and takes image_ref for the ID
        // its image GC matches against ListImages: the ID, so that it does
        // not see the image as unused.
        image_ref: match api {
            ApiVersion::V1 => image.image_ref.clone(),
            ApiVersion::V1Alpha2 => rec.image_id.clone(),
        },
        image: Some(image),
        state: state_of(rec.state) as i32,
        created_at: rec.created_at,
        labels: map(&rec.labels),
        annotations: map(&rec.annotations),
        image_id: rec.image_id.clone(),
    }
}

/// Container records as the index holds them.
type Records = Vec<Arc<ContainerRecord>>;

pub(super) fn labels_match(rec: &ContainerRecord, sel: &HashMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| rec.labels.get(k) == Some(v))
}

impl Cri {
    pub(super) async fn create_container_impl(
        &self,
        req: Request<CreateContainerRequest>,
    ) -> Result<Response<CreateContainerResponse>, Status> {
        let req = req.into_inner();
        bounds::create_container(&req)?;
        let d = self.daemon.clone();
        let image = req
            .config
            .as_ref()
            .and_then(|c| c.image.as_ref())
            .map_or("", |i| i.image.as_str());
        if crate::containers::restore::is_archive_path(image) {
            let archive = std::path::PathBuf::from(image);
            // Detached: a client that goes away must not cut an undo short.
            let id = tokio::spawn(super::checkpoint::restore_container(
                d,
                req.pod_sandbox_id,
                req.config,
                archive,
            ))
            .await
            .map_err(|e| super::status(tonic::Code::Internal, e.to_string()))??;
            return Ok(Response::new(CreateContainerResponse { container_id: id }));
        }
        let id = detached(
            async move {
                d.lifecycle
                    .create_container(&req.pod_sandbox_id, req.config)
                    .await
            },
            container_error,
        )
        .await?;
        Ok(Response::new(CreateContainerResponse { container_id: id }))
    }

    pub(super) async fn start_container_impl(
        &self,
        req: Request<StartContainerRequest>,
    ) -> Result<Response<StartContainerResponse>, Status> {
        let id = req.into_inner().container_id;
        bounds::id("container_id", &id)?;
        let d = self.daemon.clone();
        detached(
            async move { d.lifecycle.start_container(&id).await },
            container_error,
        )
        .await?;
        Ok(Response::new(StartContainerResponse {}))
    }

    pub(super) async fn stop_container_impl(
        &self,
        req: Request<StopContainerRequest>,
    ) -> Result<Response<StopContainerResponse>, Status> {
        let req = req.into_inner();
        bounds::id("container_id", &req.container_id)?;
        let d = self.daemon.clone();
        detached(
            async move {
                d.lifecycle
                    .stop_container(&req.container_id, req.timeout)
                    .await
            },
            container_error,
        )
        .await?;
        Ok(Response::new(StopContainerResponse {}))
    }

    pub(super) async fn remove_container_impl(
        &self,
        req: Request<RemoveContainerRequest>,
    ) -> Result<Response<RemoveContainerResponse>, Status> {
        let id = req.into_inner().container_id;
        bounds::id("container_id", &id)?;
        let d = self.daemon.clone();
        detached(
            async move { d.lifecycle.remove_container(&id).await },
            container_error,
        )
        .await?;
        Ok(Response::new(RemoveContainerResponse {}))
    }

    pub(super) async fn container_status_impl(
        &self,
        req: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        let req = req.into_inner();
        bounds::id("container_id", &req.container_id)?;
        let containers = &self.daemon.containers;
        let rec = containers.get(&req.container_id).map_err(container_error)?;
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
                "config": rec.config().metadata.map(|m| {
                    serde_json::json!({"name": m.name, "attempt": m.attempt})
                }),
                "runtimeSpec": containers.runtime_spec(&rec),
            });
            info.insert("info".to_string(), v.to_string());
        }
        Ok(Response::new(ContainerStatusResponse {
            status: Some(container_status(&rec)),
            info,
        }))
    }

    /// The containers a ListContainers filter selects (checked first), and
    /// every container.
    pub(super) fn listed(
        &self,
        filter: Option<ContainerFilter>,
    ) -> Result<(Records, Records), Status> {
        let f = filter.unwrap_or_default();
        bounds::id("filter.id", &f.id)?;
        bounds::id("filter.pod_sandbox_id", &f.pod_sandbox_id)?;
        bounds::selector("filter.label_selector", &f.label_selector)?;
        let state = f.state.map(|s| s.state);
        let all = self.daemon.containers.list();
        let matching = all
            .iter()
            .filter(|r| f.id.is_empty() || r.id.starts_with(&f.id))
            .filter(|r| f.pod_sandbox_id.is_empty() || r.pod_id.starts_with(&f.pod_sandbox_id))
            .filter(|r| state.is_none_or(|s| state_of(r.state) as i32 == s))
            .filter(|r| labels_match(r, &f.label_selector))
            .cloned()
            .collect();
        Ok((matching, all))
    }

    /// The same list as messages (StreamContainers).
    pub(super) async fn list_containers_impl(
        &self,
        req: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        let api = ApiVersion::of(&req);
        let (matching, _) = self.listed(req.into_inner().filter)?;
        let containers = matching.iter().map(|r| list_item(r, api)).collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }

    pub(super) async fn update_container_resources_impl(
        &self,
        req: Request<UpdateContainerResourcesRequest>,
    ) -> Result<Response<UpdateContainerResourcesResponse>, Status> {
        let req = req.into_inner();
        bounds::id("container_id", &req.container_id)?;
        if let Some(r) = &req.linux {
            bounds::resources("linux", r)?;
        }
        bounds::annotations("annotations", &req.annotations)?;
        // Values and `unified` keys (never a path, `..` or a `cgroup.*`
        // core file; only files of the cgroup's controllers) are checked by
        // `Containers::update` before anything is written: the one place
        // NRI plugins' updates also go through.
        let d = self.daemon.clone();
        detached(
            async move {
                d.lifecycle
                    .update_container(&req.container_id, req.linux)
                    .await
            },
            container_error,
        )
        .await?;
        Ok(Response::new(UpdateContainerResourcesResponse {}))
    }

    pub(super) async fn reopen_container_log_impl(
        &self,
        req: Request<ReopenContainerLogRequest>,
    ) -> Result<Response<ReopenContainerLogResponse>, Status> {
        let id = req.into_inner().container_id;
        bounds::id("container_id", &id)?;
        self.daemon
            .containers
            .reopen_log(&id)
            .await
            .map_err(container_error)?;
        Ok(Response::new(ReopenContainerLogResponse {}))
    }

    pub(super) async fn exec_sync_impl(
        &self,
        req: Request<ExecSyncRequest>,
    ) -> Result<Response<ExecSyncResponse>, Status> {
        let req = req.into_inner();
        bounds::id("container_id", &req.container_id)?;
        bounds::exec_cmd("cmd", &req.cmd)?;
        let out = self
            .daemon
            .containers
            .exec_sync(&req.container_id, req.cmd, req.timeout)
            .await
            .map_err(container_error)?;
        Ok(Response::new(ExecSyncResponse {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.exit_code,
        }))
    }
}
