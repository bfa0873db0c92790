//! The daemon's side of the streaming server ([`crust_streaming::Backend`]):
//! exec and attach through the containers' monitors, port-forward into the
//! pods' network namespaces.
//!
//! The monitor client (`crust_shim_protocol::blocking`) is blocking, so every exec or
//! attach session bridges it with two threads: one reads the monitor's
//! output frames and hands them to the async session, one writes stdin and
//! resizes the session sends it. Dropping the session (the client went
//! away and the grace period is over) detaches from the monitor, which
//! kills an exec whose last client is gone; the exec is also SIGKILLed
//! explicitly.

use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crust_shim_protocol::blocking::Shim;
use crust_shim_protocol::{AttachEvent, ExitInfo};
use crust_streaming::{
    AttachRequest, Backend, BackendError, BoxDuplex, BoxFuture, ExecRequest, StreamIo, TerminalSize,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::Code;
use tracing::{debug, warn};

use crate::containers::ContainerState;
use crate::daemon::Daemon;
use crate::pods::PodState;

/// How long an exec with a tty waits for the client's first terminal size
/// before starting the process, so that the process sees its size at once.
const FIRST_SIZE_WAIT: Duration = Duration::from_millis(200);
/// Output frames buffered between the monitor reader thread and the client.
const EVENT_BUFFER: usize = 64;
/// Stdin chunks and resizes buffered towards the monitor.
const INPUT_BUFFER: usize = 16;

pub struct DaemonBackend {
    daemon: Weak<Daemon>,
}

impl DaemonBackend {
    pub fn new(daemon: &Arc<Daemon>) -> DaemonBackend {
        DaemonBackend {
            daemon: Arc::downgrade(daemon),
        }
    }

    fn daemon(&self) -> Result<Arc<Daemon>, BackendError> {
        self.daemon
            .upgrade()
            .ok_or_else(|| BackendError::Failed("the daemon is shutting down".into()))
    }

    /// The state dir of a running container's monitor.
    fn running_container(&self, id: &str) -> Result<PathBuf, BackendError> {
        let daemon = self.daemon()?;
        let rec = daemon.containers.get(id).map_err(|s| match s.code() {
            Code::NotFound => BackendError::NotFound(format!("container {id:?}")),
            _ => BackendError::Failed(s.message().to_string()),
        })?;
        if rec.state != ContainerState::Running {
            return Err(BackendError::Failed(format!(
                "container {} is not running",
                rec.id
            )));
        }
        Ok(rec.state_dir)
    }
}

impl Backend for DaemonBackend {
    fn exec(&self, req: ExecRequest, io: StreamIo) -> BoxFuture<'_, Result<i32, BackendError>> {
        Box::pin(async move {
            let state_dir = self.running_container(&req.container_id)?;
            exec(state_dir, req, io).await
        })
    }

    fn attach(&self, req: AttachRequest, io: StreamIo) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let state_dir = self.running_container(&req.container_id)?;
            attach(state_dir, req, io).await
        })
    }

    fn port_forward(
        &self,
        pod_sandbox_id: String,
        port: u16,
        stream: BoxDuplex,
    ) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let daemon = self.daemon()?;
            let pod = daemon.pods.get(&pod_sandbox_id).map_err(|e| match e {
                crate::pods::PodError::NotFound(_) => {
                    BackendError::NotFound(format!("pod sandbox {pod_sandbox_id:?}"))
                }
                e => BackendError::Failed(e.to_string()),
            })?;
            if pod.state != PodState::Ready {
                return Err(BackendError::Failed(format!(
                    "pod sandbox {} is not ready",
                    pod.id
                )));
            }
            drop(daemon);
            let r = match pod.namespaces.net {
                Some(netns) => crust_streaming::forward_in_netns(&netns, port, stream).await,
                // A host-network pod's loopback is the host's.
                None => forward_on_host(port, stream).await,
            };
            match r {
                Ok((up, down)) => {
                    debug!(pod = %pod.id, port, up, down, "port-forward done");
                    Ok(())
                }
                Err(e) => Err(BackendError::Failed(format!(
                    "port-forward to port {port} in pod sandbox {}: {e}",
                    pod.id
                ))),
            }
        })
    }
}

async fn forward_on_host(port: u16, stream: BoxDuplex) -> std::io::Result<(u64, u64)> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let tcp = match tokio::net::TcpStream::connect(v4).await {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            tokio::net::TcpStream::connect(v6).await.map_err(|_| e)?
        }
        r => r?,
    };
    let _ = tcp.set_nodelay(true);
    crust_streaming::pipe(stream, tcp).await
}

fn shim_error(e: crust_shim_protocol::Error) -> BackendError {
    match e {
        crust_shim_protocol::Error::Gone => {
            BackendError::Failed("the container is not running".into())
        }
        e => BackendError::Failed(e.to_string()),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackendError::Failed(e.to_string()))?
}

fn new_exec_id() -> Result<String, BackendError> {
    use std::io::Read;
    let mut b = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| BackendError::Failed(format!("random exec id: {e}")))?;
    Ok(hex::encode(b))
}

async fn exec(state_dir: PathBuf, req: ExecRequest, mut io: StreamIo) -> Result<i32, BackendError> {
    let mut first_size = None;
    if req.tty
        && let Some(rx) = io.resize.as_mut()
    {
        first_size = tokio::time::timeout(FIRST_SIZE_WAIT, rx.recv())
            .await
            .ok()
            .flatten();
    }
    let shim_req = crust_shim_protocol::ExecRequest {
        exec_id: new_exec_id()?,
        args: req.cmd,
        tty: req.tty,
        stdin: req.stdin,
        console_size: first_size
            .filter(|s| s.width > 0 && s.height > 0)
            .map(|s| (s.width, s.height)),
        ..Default::default()
    };
    let container_dir = state_dir.clone();
    let (session, attach) = blocking(move || {
        let shim = Shim::connect(&state_dir).map_err(shim_error)?;
        let session = shim.exec(&shim_req).map_err(shim_error)?;
        match session.shim.attach() {
            Ok(a) => Ok((session, a)),
            Err(e) => {
                let _ = session.shim.kill(libc::SIGKILL, false);
                Err(shim_error(e))
            }
        }
    })
    .await?;
    debug!(pid = session.pid, exec_id = %session.exec_id, "exec started");
    // Kills the process and tidies the session's state dir, also when this
    // future is dropped.
    let guard = ExecGuard {
        shim: Some(session.shim.clone()),
        container_dir,
    };
    let bridge = Bridge::start(attach, req.stdin, req.tty)?;
    let r = bridge.run(io, false).await;
    let code = match r {
        Ok(Some(exit)) => Ok(exit.exit_code),
        // The monitor closed without an exit frame: its exit file says.
        Ok(None) => {
            let shim = session.shim.clone();
            blocking(move || shim.wait().map_err(shim_error))
                .await
                .map(|e| e.exit_code)
        }
        Err(e) => Err(e),
    };
    drop(guard);
    code
}

async fn attach(state_dir: PathBuf, req: AttachRequest, io: StreamIo) -> Result<(), BackendError> {
    let attach = blocking(move || {
        let shim = Shim::connect(&state_dir).map_err(shim_error)?;
        shim.attach().map_err(shim_error)
    })
    .await?;
    let bridge = Bridge::start(attach, req.stdin, req.tty)?;
    // Without output streams the session is over when stdin is.
    let stdin_only = !req.stdout && !req.stderr;
    bridge.run(io, stdin_only).await.map(|_| ())
}

/// SIGKILLs an exec process unless it is known to have exited, and removes
/// its session state dir once its monitor is gone.
struct ExecGuard {
    shim: Option<Shim>,
    container_dir: PathBuf,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        let Some(shim) = self.shim.take() else { return };
        let container_dir = self.container_dir.clone();
        // Blocking calls: off the runtime's threads.
        let spawned = std::thread::Builder::new()
            .name("exec-cleanup".into())
            .spawn(move || {
                if shim.exit_info().ok().flatten().is_none() {
                    let _ = shim.kill(libc::SIGKILL, false);
                }
                for _ in 0..250 {
                    if !shim.is_alive() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                remove_session_dir(&container_dir, shim.state_dir());
            });
        if let Err(e) = spawned {
            warn!("cannot start the exec cleanup thread: {e}");
        }
    }
}

/// Removes `<container state dir>/exec/<id>` (and only such a dir).
fn remove_session_dir(container_dir: &Path, session_dir: &Path) {
    let parent = container_dir.join(crust_shim_protocol::EXEC_DIR);
    if session_dir.parent() != Some(parent.as_path()) {
        warn!(dir = %session_dir.display(), "exec session dir outside the container's; left alone");
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(session_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        debug!(dir = %session_dir.display(), "cannot remove the exec session dir: {e}");
    }
}

enum Input {
    Stdin(Vec<u8>),
    CloseStdin,
    Resize(TerminalSize),
}

/// Bridges a blocking attach connection to async code (two threads).
/// Dropping it detaches.
struct Bridge {
    events: mpsc::Receiver<std::io::Result<Option<AttachEvent>>>,
    input: mpsc::Sender<Input>,
    sock: UnixStream,
    /// The end of a tty's stdin is not passed on: closing the terminal
    /// would hang it up (containerd leaves a tty open on stdin EOF too).
    tty: bool,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Ends the reader thread's read and tells the monitor we are gone.
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

impl Bridge {
    fn start(
        attach: crust_shim_protocol::blocking::Attach,
        stdin: bool,
        tty: bool,
    ) -> Result<Bridge, BackendError> {
        let io_err = |e: std::io::Error| BackendError::Failed(format!("attach: {e}"));
        let mut writer = attach.try_clone().map_err(io_err)?;
        let mut reader = attach;
        let sock = writer.try_clone().map_err(io_err)?.into_inner();
        if stdin {
            writer.declare_stdin().map_err(io_err)?;
        }
        let (ev_tx, events) = mpsc::channel(EVENT_BUFFER);
        let (input, mut in_rx) = mpsc::channel::<Input>(INPUT_BUFFER);
        std::thread::Builder::new()
            .name("attach-out".into())
            .spawn(move || {
                loop {
                    let ev = reader.next_event();
                    let more = matches!(
                        ev,
                        Ok(Some(AttachEvent::Stdout(_) | AttachEvent::Stderr(_)))
                    );
                    if ev_tx.blocking_send(ev).is_err() || !more {
                        break;
                    }
                }
            })
            .map_err(io_err)?;
        std::thread::Builder::new()
            .name("attach-in".into())
            .spawn(move || {
                while let Some(i) = in_rx.blocking_recv() {
                    let r = match i {
                        Input::Stdin(d) => writer.write_stdin(&d),
                        Input::CloseStdin => writer.close_stdin(),
                        Input::Resize(s) => writer.resize(s.width, s.height),
                    };
                    if r.is_err() {
                        break;
                    }
                }
            })
            .map_err(io_err)?;
        Ok(Bridge {
            events,
            input,
            sock,
            tty,
        })
    }

    /// Carries the session until the process exits (its exit info), the
    /// monitor closes (`None`) or, with `stdin_ends`, stdin ends.
    async fn run(
        mut self,
        mut io: StreamIo,
        stdin_ends: bool,
    ) -> Result<Option<ExitInfo>, BackendError> {
        let mut stdin = io.stdin.take();
        let mut resize = io.resize.take();
        let mut buf = vec![0u8; 32 * 1024];
        let gone = |e: std::io::Error| BackendError::Failed(format!("client went away: {e}"));
        loop {
            tokio::select! {
                r = async { stdin.as_mut().expect("guarded").read(&mut buf).await }, if stdin.is_some() => {
                    match r {
                        Ok(n) if n > 0 => {
                            if self.input.send(Input::Stdin(buf[..n].to_vec())).await.is_err() {
                                // The monitor side is gone; its end comes as an event.
                                stdin = None;
                            }
                        }
                        _ => {
                            stdin = None;
                            if !self.tty {
                                let _ = self.input.send(Input::CloseStdin).await;
                            }
                            if stdin_ends {
                                return Ok(None);
                            }
                        }
                    }
                }
                s = async { resize.as_mut().expect("guarded").recv().await }, if resize.is_some() => {
                    match s {
                        Some(s) if s.width > 0 && s.height > 0 => {
                            let _ = self.input.send(Input::Resize(s)).await;
                        }
                        Some(_) => {}
                        None => resize = None,
                    }
                }
                ev = self.events.recv() => {
                    match ev {
                        Some(Ok(Some(AttachEvent::Stdout(d)))) => {
                            if let Some(w) = io.stdout.as_mut() {
                                w.write_all(&d).await.map_err(gone)?;
                                w.flush().await.map_err(gone)?;
                            }
                        }
                        Some(Ok(Some(AttachEvent::Stderr(d)))) => {
                            if let Some(w) = io.stderr.as_mut() {
                                w.write_all(&d).await.map_err(gone)?;
                                w.flush().await.map_err(gone)?;
                            }
                        }
                        Some(Ok(Some(AttachEvent::Exit(e)))) => {
                            flush(&mut io).await;
                            return Ok(Some(e));
                        }
                        Some(Ok(None)) | None => {
                            flush(&mut io).await;
                            return Ok(None);
                        }
                        Some(Err(e)) => {
                            return Err(BackendError::Failed(format!("reading from the monitor: {e}")));
                        }
                    }
                }
            }
        }
    }
}

async fn flush(io: &mut StreamIo) {
    for w in [io.stdout.as_mut(), io.stderr.as_mut()]
        .into_iter()
        .flatten()
    {
        let _ = w.flush().await;
    }
}
