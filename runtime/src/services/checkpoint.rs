//! CheckpointContainer (kubelet's forensic checkpoint: the container keeps
//! running).

use crust_api::v1::*;
use tonic::{Code, Request, Response, Status};

use super::{Cri, bounds, container_error, detached, status};
use crate::checkpoint::Availability;
use crust_shim_protocol::RuntimeConfig;
use std::path::Path;
use std::time::Duration;

/// kubelet's default runtime request timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// A day: a larger timeout is a client's mistake.
const MAX_TIMEOUT_SECS: i64 = 86_400;

impl Cri {
    pub(super) async fn checkpoint_container_impl(
        &self,
        req: Request<CheckpointContainerRequest>,
    ) -> Result<Response<CheckpointContainerResponse>, Status> {
        let req = req.into_inner();
        bounds::id("container_id", &req.container_id)?;
        bounds::text("location", &req.location, bounds::MAX_PATH)?;
        if req.container_id.is_empty() {
            return Err(status(Code::InvalidArgument, "container_id is empty"));
        }
        if !req.location.starts_with('/') {
            return Err(status(
                Code::InvalidArgument,
                format!(
                    "location must be an absolute path of the archive to write, got {}",
                    crust_quote::quote(&req.location)
                ),
            ));
        }
        let rec = self
            .daemon
            .containers
            .get(&req.container_id)
            .map_err(container_error)?;
        // Never a fake success: where criu cannot work the caller learns
        // why, before anything is written.
        if let Availability::Unavailable(why) = self.daemon.checkpoint.availability().await {
            return Err(status(
                Code::FailedPrecondition,
                format!("checkpointing is not available on this node: {why}"),
            ));
        }
        if matches!(rec.runtime, RuntimeConfig::Embedded { .. }) {
            return Err(status(
                Code::Unimplemented,
                format!(
                    "CheckpointContainer is not implemented by crust yet for the embedded handler \
                     (container {} runs on handler {:?}); the runc handler checkpoints",
                    rec.id, rec.handler
                ),
            ));
        }
        // kubelet's timeout is in seconds; 0 means its default (CRI-O and
        // containerd wait without a bound then; crust takes kubelet's
        // runtime request timeout).
        let timeout = match req.timeout {
            t if t > 0 => Duration::from_secs(t.min(MAX_TIMEOUT_SECS) as u64),
            _ => DEFAULT_TIMEOUT,
        };
        // Detached: a client that goes away must not cut the cleanup of a
        // half-written checkpoint short.
        let containers = self.daemon.containers.clone();
        detached(
            async move {
                containers
                    .checkpoint(&rec.id, Path::new(&req.location), timeout)
                    .await
            },
            container_error,
        )
        .await?;
        Ok(Response::new(CheckpointContainerResponse {}))
    }
}

/// CreateContainer whose image is a checkpoint archive: checked in the
/// order a client can act on (a damaged archive, a missing base image, a
/// handler that cannot restore, a node where criu cannot work), nothing
/// written before all pass; then created as `containers::restore` says.
pub(super) async fn restore_container(
    d: std::sync::Arc<crate::daemon::Daemon>,
    pod_id: String,
    config: Option<ContainerConfig>,
    archive: std::path::PathBuf,
) -> Result<String, Status> {
    use crate::containers::restore;
    let archive = tokio::task::spawn_blocking(move || restore::read_archive(&archive))
        .await
        .map_err(|e| status(Code::Internal, e.to_string()))?
        .map_err(container_error)?;
    d.containers
        .check_restore_image(&archive)
        .map_err(container_error)?;
    if let Ok(pod) = d.pods.get(&pod_id)
        && let Some(RuntimeConfig::Embedded { .. }) = d.handlers.get(&pod.runtime_handler)
    {
        return Err(status(
            Code::Unimplemented,
            format!(
                "restoring a checkpoint is not implemented by crust for the embedded handler \
                 (pod sandbox {} runs on handler {:?}); the runc handler restores",
                pod.id, pod.runtime_handler
            ),
        ));
    }
    if let Availability::Unavailable(why) = d.checkpoint.availability().await {
        return Err(status(
            Code::FailedPrecondition,
            format!("restoring a checkpoint is not possible on this node: {why}"),
        ));
    }
    d.lifecycle
        .create_container_from(&pod_id, config, Some(&archive))
        .await
        .map_err(container_error)
}
