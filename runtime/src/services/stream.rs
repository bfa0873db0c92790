//! Exec, Attach and PortForward RPCs: check the container or pod, then hand
//! out a single-use URL of the streaming server (`crate::streaming_backend`
//! does the work when the client connects).

use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, bounds, container_error, pod_error};
use crate::containers::ContainerState;
use crate::pods::PodState;

impl Cri {
    fn streaming(&self) -> Result<&crust_streaming::StreamingServer, Status> {
        self.daemon
            .streaming
            .get()
            .ok_or_else(|| Status::unavailable("the streaming server is not running"))
    }

    /// The full ID of a running container.
    fn running_container_id(&self, id: &str) -> Result<String, Status> {
        let rec = self.daemon.containers.get(id).map_err(container_error)?;
        if rec.state != ContainerState::Running {
            return Err(Status::failed_precondition(format!(
                "container {} is not running (state {})",
                rec.id,
                rec.state.as_str()
            )));
        }
        Ok(rec.id)
    }

    pub(super) async fn exec_impl(
        &self,
        req: Request<ExecRequest>,
    ) -> Result<Response<ExecResponse>, Status> {
        let r = req.into_inner();
        check_streams(r.stdin, r.stdout, r.stderr, r.tty)?;
        bounds::id("container_id", &r.container_id)?;
        bounds::exec_cmd("cmd", &r.cmd)?;
        if r.cmd.is_empty() || r.cmd[0].is_empty() {
            return Err(Status::invalid_argument("cmd: required"));
        }
        if r.cmd.iter().any(|a| a.contains('\0')) {
            return Err(Status::invalid_argument("cmd: contains NUL"));
        }
        let container_id = self.running_container_id(&r.container_id)?;
        let url = self
            .streaming()?
            .get_exec_url(crust_streaming::ExecRequest {
                container_id,
                cmd: r.cmd,
                tty: r.tty,
                stdin: r.stdin,
                stdout: r.stdout,
                stderr: r.stderr,
            })
            .map_err(streaming_status)?;
        Ok(Response::new(ExecResponse { url }))
    }

    pub(super) async fn attach_impl(
        &self,
        req: Request<AttachRequest>,
    ) -> Result<Response<AttachResponse>, Status> {
        let r = req.into_inner();
        bounds::id("container_id", &r.container_id)?;
        check_streams(r.stdin, r.stdout, r.stderr, r.tty)?;
        let container_id = self.running_container_id(&r.container_id)?;
        let url = self
            .streaming()?
            .get_attach_url(crust_streaming::AttachRequest {
                container_id,
                tty: r.tty,
                stdin: r.stdin,
                stdout: r.stdout,
                stderr: r.stderr,
            })
            .map_err(streaming_status)?;
        Ok(Response::new(AttachResponse { url }))
    }

    pub(super) async fn port_forward_impl(
        &self,
        req: Request<PortForwardRequest>,
    ) -> Result<Response<PortForwardResponse>, Status> {
        let r = req.into_inner();
        bounds::id("pod_sandbox_id", &r.pod_sandbox_id)?;
        bounds::count("port", r.port.len(), bounds::MAX_FORWARD_PORTS)?;
        let mut ports = Vec::with_capacity(r.port.len());
        for p in &r.port {
            match u16::try_from(*p) {
                Ok(p) if p > 0 => ports.push(p),
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "port: {p} is not between 1 and 65535"
                    )));
                }
            }
        }
        let pod = self.daemon.pods.get(&r.pod_sandbox_id).map_err(pod_error)?;
        if pod.state != PodState::Ready {
            return Err(Status::failed_precondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        let url = self
            .streaming()?
            .get_port_forward_url(crust_streaming::PortForwardRequest {
                pod_sandbox_id: pod.id,
                ports,
            })
            .map_err(streaming_status)?;
        Ok(Response::new(PortForwardResponse { url }))
    }
}

fn check_streams(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Result<(), Status> {
    if !stdin && !stdout && !stderr {
        return Err(Status::invalid_argument(
            "stdin, stdout, stderr: one of them must be set",
        ));
    }
    if tty && stderr {
        return Err(Status::invalid_argument(
            "tty, stderr: cannot both be set (a tty has no separate stderr)",
        ));
    }
    Ok(())
}

fn streaming_status(e: crust_streaming::Error) -> Status {
    match e {
        crust_streaming::Error::InvalidArgument { .. } => Status::invalid_argument(e.to_string()),
        crust_streaming::Error::ResourceExhausted(_) => Status::resource_exhausted(e.to_string()),
        e => Status::internal(e.to_string()),
    }
}
