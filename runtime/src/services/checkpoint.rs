//! CheckpointContainer (kubelet's forensic checkpoint: the container keeps
//! running).

use crust_api::v1::*;
use tonic::{Code, Request, Response, Status};

use super::{Cri, bounds, container_error, status};
use crate::checkpoint::Availability;
use crate::containers::ContainerState as CState;

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
        if rec.state != CState::Running {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "container {} is not running: only a running container can be checkpointed",
                    rec.id
                ),
            ));
        }
        Err(status(
            Code::Unimplemented,
            "CheckpointContainer with criu is not implemented by crust yet",
        ))
    }
}
