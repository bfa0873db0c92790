//! Pod sandbox RPCs: RunPodSandbox, StopPodSandbox, RemovePodSandbox,
//! PodSandboxStatus, ListPodSandbox.

use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, not_yet};

impl Cri {
    pub(super) async fn run_pod_sandbox_impl(
        &self,
        _req: Request<RunPodSandboxRequest>,
    ) -> Result<Response<RunPodSandboxResponse>, Status> {
        not_yet!("RunPodSandbox")
    }

    pub(super) async fn stop_pod_sandbox_impl(
        &self,
        _req: Request<StopPodSandboxRequest>,
    ) -> Result<Response<StopPodSandboxResponse>, Status> {
        not_yet!("StopPodSandbox")
    }

    pub(super) async fn remove_pod_sandbox_impl(
        &self,
        _req: Request<RemovePodSandboxRequest>,
    ) -> Result<Response<RemovePodSandboxResponse>, Status> {
        not_yet!("RemovePodSandbox")
    }

    pub(super) async fn pod_sandbox_status_impl(
        &self,
        _req: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        not_yet!("PodSandboxStatus")
    }

    pub(super) async fn list_pod_sandbox_impl(
        &self,
        _req: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        not_yet!("ListPodSandbox")
    }
}
