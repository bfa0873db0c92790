//! The CRI gRPC services. They stay thin: validate the request, call the
//! crates that do the work, map errors to status codes.

mod admin;
mod container;
mod image;
mod pod;
mod runtime;
mod stream;

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::Status;

use crate::daemon::Daemon;

pub use admin::Admin;

/// Implements both `RuntimeService` and `ImageService` of CRI v1.
#[derive(Clone)]
pub struct Cri {
    daemon: Arc<Daemon>,
}

impl Cri {
    pub fn new(daemon: Arc<Daemon>) -> Cri {
        Cri { daemon }
    }
}

/// The response stream type of the server-streaming RPCs.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The answer of an RPC whose feature has not been built yet: a clear
/// Unimplemented naming it, never a fake success.
macro_rules! not_yet {
    ($rpc:literal) => {
        Err(tonic::Status::unimplemented(concat!(
            $rpc,
            " is not implemented by crust yet"
        )))
    };
}
pub(crate) use not_yet;

/// Store failures are the daemon's problem, not the caller's.
fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}
