//! What the streaming server needs from the runtime: run an exec, join a
//! container's stdio, reach a port in a pod. The daemon implements
//! [`Backend`] over its containers' monitors; tests use fakes.

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// A boxed future, as [`Backend`]'s methods return (the trait is used as
/// `Arc<dyn Backend>`, so its methods cannot be `async fn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// The client's stdin.
pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
/// The client's stdout or stderr.
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// A byte stream both ways: one forwarded connection.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}
/// A boxed [`Duplex`].
pub type BoxDuplex = Box<dyn Duplex>;

/// An exec, as the CRI `ExecRequest` asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub container_id: String,
    pub cmd: Vec<String>,
    pub tty: bool,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// An attach, as the CRI `AttachRequest` asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    pub container_id: String,
    pub tty: bool,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// A port-forward, as the CRI `PortForwardRequest` asks for it. `ports` may
/// be empty: SPDY clients name the port per stream; WebSocket clients then
/// name them in the URL's `port` query parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForwardRequest {
    pub pod_sandbox_id: String,
    pub ports: Vec<u16>,
}

/// A terminal size, as the client's resize stream sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalSize {
    pub width: u16,
    pub height: u16,
}

/// The client's ends of an exec or attach session. A `None` stream was not
/// asked for. Reads from `stdin` end (EOF or error) when the client closes
/// it or goes away; writes to `stdout`/`stderr` fail once the client is
/// gone.
pub struct StreamIo {
    pub stdin: Option<BoxRead>,
    pub stdout: Option<BoxWrite>,
    pub stderr: Option<BoxWrite>,
    /// Terminal sizes, when `tty`; the first arrives as soon as the client
    /// knows its size. Closed when the client stops sending them.
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

impl std::fmt::Debug for StreamIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamIo")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("resize", &self.resize.is_some())
            .finish()
    }
}

/// Why a backend call failed; the message goes to the client (in the
/// status on the error stream), so it should say what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

/// The runtime side of exec, attach and port-forward.
///
/// Cancellation: when the client goes away, the server first lets the call
/// see it (stdin ends, writes fail) and, if the call has not returned after
/// [`crate::StreamingConfig::disconnect_grace`], drops its future. An
/// implementation must then clean up on drop (kill the exec'd process,
/// detach), as containerd kills an exec whose client is gone.
pub trait Backend: Send + Sync + 'static {
    /// Runs `req.cmd` in the container and returns its exit code (0-255;
    /// 128+N for a signal). Errors are failures to run it at all.
    fn exec(&self, req: ExecRequest, io: StreamIo) -> BoxFuture<'_, Result<i32, BackendError>>;

    /// Joins the running container's stdio until the client or the
    /// container is done.
    fn attach(&self, req: AttachRequest, io: StreamIo) -> BoxFuture<'_, Result<(), BackendError>>;

    /// Connects `stream` to `port` on the pod's loopback, both ways, until
    /// both directions are done. [`crate::forward_in_netns`] does it given
    /// the pod's network namespace path. Shutting down `stream`'s write side
    /// (on the pod side's EOF) tells the client the forward is over.
    fn port_forward(
        &self,
        pod_sandbox_id: String,
        port: u16,
        stream: BoxDuplex,
    ) -> BoxFuture<'_, Result<(), BackendError>>;
}
