//! The CRI gRPC services. They stay thin: translate the request, hand it
//! to the domain modules (`crate::lifecycle` for life-cycle steps,
//! `crate::pods` and `crate::containers` for reads, `crust_image` for
//! images), map their errors to status codes. Nothing below this module
//! knows of tonic.

mod admin;
pub(crate) mod bounds;
mod check;
mod checkpoint;
mod container;
mod container_list;
mod events;
mod image;
mod metrics;
mod net_ready;
mod operator;
mod pod;
mod runtime;
mod stats;
mod stream;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::Status;

use crate::containers::ContainerError;
use crate::daemon::Daemon;
use crate::pods::PodError;

pub use admin::{Admin, Operator};
pub use check::response as check_response;
pub use container_list::RuntimeServer;

/// Implements both `RuntimeService` and `ImageService` of CRI v1.
#[derive(Clone)]
pub struct Cri {
    daemon: Arc<Daemon>,
    /// Status's NetworkReady verdict, kept while the CNI config dir is
    /// unchanged.
    net_ready: Arc<net_ready::NetworkReadiness>,
    /// ListContainers' encoded entries.
    list_cache: Arc<container_list::ListCache>,
}

impl Cri {
    pub fn new(daemon: Arc<Daemon>) -> Cri {
        Cri {
            daemon,
            net_ready: Arc::default(),
            list_cache: Arc::default(),
        }
    }
}

/// The response stream type of the server-streaming RPCs.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Items per message of the Stream* list RPCs (each message stays far below
/// gRPC's 4 MiB default limit, which is what those RPCs exist for).
pub const STREAM_BATCH: usize = 100;

/// A Stream* list RPC's answer: `items` in messages of [`STREAM_BATCH`].
pub fn batched<T: Clone, R: Send + 'static>(
    items: Vec<T>,
    message: impl Fn(Vec<T>) -> R,
) -> ResponseStream<R> {
    let batches: Vec<Result<R, Status>> = items
        .chunks(STREAM_BATCH)
        .map(|c| Ok(message(c.to_vec())))
        .collect();
    Box::pin(tokio_stream::iter(batches))
}

/// Runs a lifecycle operation as its own task, so that a client going away
/// mid-call (the RPC future is dropped) cannot cut it off halfway. The
/// task stays in the call's span (its trace, its log lines' trace id).
async fn detached<T: Send + 'static, E: Send + 'static>(
    op: impl Future<Output = Result<T, E>> + Send + 'static,
    status: impl FnOnce(E) -> Status,
) -> Result<T, Status> {
    use tracing::Instrument;
    tokio::spawn(op.in_current_span())
        .await
        .map_err(internal)?
        .map_err(status)
}

/// Labels and annotations as CRI messages carry them.
fn map(
    m: &std::collections::BTreeMap<String, String>,
) -> std::collections::HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The longest error message a client gets. Messages quote at most
/// [`crust_quote::MAX_QUOTED`] bytes of any one input, but a lower layer's
/// text (a plugin's or a runtime's error) is clipped here, so that no
/// answer comes near the 16 KiB `grpc-message` header clients accept.
pub const MAX_MESSAGE: usize = 2048;

/// A status whose message is clipped to [`MAX_MESSAGE`].
fn status(code: tonic::Code, message: impl AsRef<str>) -> Status {
    Status::new(code, crust_quote::truncate(message.as_ref(), MAX_MESSAGE))
}

/// A pod error as the gRPC status a client can act on.
fn pod_error(e: PodError) -> Status {
    use tonic::Code;
    match e {
        PodError::InvalidArgument(m) => status(Code::InvalidArgument, m),
        PodError::NotFound(m) => status(Code::NotFound, m),
        PodError::AlreadyExists(m) => status(Code::AlreadyExists, m),
        PodError::Unimplemented(m) => status(Code::Unimplemented, m),
        PodError::Unavailable(m) => status(Code::Unavailable, m),
        PodError::FailedPrecondition(m) => status(Code::FailedPrecondition, m),
        PodError::Internal(m) => status(Code::Internal, m),
    }
}

/// A container error as the gRPC status a client can act on.
fn container_error(e: ContainerError) -> Status {
    use tonic::Code;
    match e {
        ContainerError::InvalidArgument(m) => status(Code::InvalidArgument, m),
        ContainerError::NotFound(m) => status(Code::NotFound, m),
        ContainerError::AlreadyExists(m) => status(Code::AlreadyExists, m),
        ContainerError::FailedPrecondition(m) => status(Code::FailedPrecondition, m),
        ContainerError::DeadlineExceeded(m) => status(Code::DeadlineExceeded, m),
        ContainerError::Internal(m) => status(Code::Internal, m),
    }
}

/// Store failures are the daemon's problem, not the caller's.
fn internal(e: impl std::fmt::Display) -> Status {
    status(tonic::Code::Internal, e.to_string())
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn stream_answers_come_in_batches() {
        let items: Vec<u32> = (0..250).collect();
        let sizes: Vec<usize> = super::batched(items, |c| c.len())
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(sizes, vec![100, 100, 50]);
        let none: Vec<usize> = super::batched(Vec::<u32>::new(), |c| c.len())
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert!(none.is_empty());
    }
}
