//! The daemon's side of the streaming server ([`crust_streaming::Backend`]):
//! exec and attach through the containers' monitors, port-forward into the
//! pods' network namespaces.
//!
//! An exec or attach session is three tasks on the async runtime (no
//! threads): the session itself, which carries the client's stdin and
//! resizes and the process's output, a reader of the monitor's output
//! frames and a writer of stdin and resizes to it (so a stalled stdin
//! never holds up the output). Dropping the session (the client went away
//! and the grace period is over) detaches from the monitor, which kills an
//! exec whose last client is gone; the exec is also SIGKILLed explicitly.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crust_shim_protocol::{AttachEvent, ExitInfo};
use crust_shim_protocol::{AttachReader, AttachWriter};
use crust_streaming::{
    AttachRequest, Backend, BackendError, BoxDuplex, BoxFuture, ExecRequest, StreamIo, TerminalSize,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::containers::{ContainerError, ContainerState, Containers};
use crate::monitor::Monitor;
use crate::pods::{PodError, PodState, Pods};

/// How long an exec with a tty waits for the client's first terminal size
/// before starting the process, so that the process sees its size at once
/// (`stty size`, full-screen programs). Clients (kubectl) send it right
/// after the streams are up, but on a loaded node that took over the 200 ms
/// this once was, and the process started on a 0x0 terminal (`stty size`
/// failed; containerd and CRI-O always start before the size arrives). A
/// tty client that never sends a size pays this wait once per exec.
const FIRST_SIZE_WAIT: Duration = Duration::from_secs(1);
/// Output frames buffered between the monitor reader and the client.
const EVENT_BUFFER: usize = 64;
/// Stdin chunks and resizes buffered towards the monitor.
const INPUT_BUFFER: usize = 16;
/// How long an abandoned exec's monitor gets to leave after SIGKILL.
const EXEC_REAP_WAIT: Duration = Duration::from_secs(5);

pub struct StreamingBackend {
    pods: Weak<Pods>,
    containers: Weak<Containers>,
    sessions: Arc<Sessions>,
}

/// An open exec, attach or port-forward session (metrics, state dump).
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// `exec`, `attach` or `port-forward`.
    pub kind: &'static str,
    /// The container (exec, attach) or pod sandbox (port-forward).
    pub target: String,
    pub started: std::time::Instant,
}

/// The sessions open now.
#[derive(Debug, Default)]
pub struct Sessions {
    next: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<std::collections::HashMap<u64, SessionInfo>>,
}

impl Sessions {
    /// Every open session, oldest first.
    pub fn list(&self) -> Vec<SessionInfo> {
        let mut v: Vec<SessionInfo> = self.lock().values().cloned().collect();
        v.sort_by_key(|s| s.started);
        v
    }

    fn open(self: &Arc<Self>, kind: &'static str, target: &str) -> SessionGuard {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().insert(
            id,
            SessionInfo {
                kind,
                target: target.to_string(),
                started: std::time::Instant::now(),
            },
        );
        SessionGuard(self.clone(), id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, SessionInfo>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A session's entry in [`Sessions`], for as long as it runs.
struct SessionGuard(Arc<Sessions>, u64);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

fn shutting_down() -> BackendError {
    BackendError::Failed("the daemon is shutting down".into())
}

impl StreamingBackend {
    pub fn new(
        pods: &Arc<Pods>,
        containers: &Arc<Containers>,
        sessions: Arc<Sessions>,
    ) -> StreamingBackend {
        StreamingBackend {
            pods: Arc::downgrade(pods),
            containers: Arc::downgrade(containers),
            sessions,
        }
    }

    /// The monitor of a running container.
    fn running_container(&self, id: &str) -> Result<Monitor, BackendError> {
        let containers = self.containers.upgrade().ok_or_else(shutting_down)?;
        let rec = containers.get(id).map_err(|e| match e {
            ContainerError::NotFound(_) => BackendError::NotFound(format!("container {id:?}")),
            e => BackendError::Failed(e.to_string()),
        })?;
        if rec.state != ContainerState::Running {
            return Err(BackendError::Failed(format!(
                "container {} is not running",
                rec.id
            )));
        }
        Monitor::connect(&rec.state_dir).map_err(shim_error)
    }
}

impl Backend for StreamingBackend {
    fn exec(&self, req: ExecRequest, io: StreamIo) -> BoxFuture<'_, Result<i32, BackendError>> {
        Box::pin(async move {
            let _session = self.sessions.open("exec", &req.container_id);
            let monitor = self.running_container(&req.container_id)?;
            exec(monitor, req, io).await
        })
    }

    fn attach(&self, req: AttachRequest, io: StreamIo) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let _session = self.sessions.open("attach", &req.container_id);
            let monitor = self.running_container(&req.container_id)?;
            attach(monitor, req, io).await
        })
    }

    fn port_forward(
        &self,
        pod_sandbox_id: String,
        port: u16,
        stream: BoxDuplex,
    ) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            let _session = self.sessions.open("port-forward", &pod_sandbox_id);
            let pods = self.pods.upgrade().ok_or_else(shutting_down)?;
            let pod = pods.get(&pod_sandbox_id).map_err(|e| match e {
                PodError::NotFound(_) => {
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
            drop(pods);
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

async fn exec(monitor: Monitor, req: ExecRequest, mut io: StreamIo) -> Result<i32, BackendError> {
    let mut first_size = None;
    if req.tty
        && let Some(rx) = io.resize.as_mut()
    {
        let waiting = std::time::Instant::now();
        match tokio::time::timeout(FIRST_SIZE_WAIT, rx.recv()).await {
            Ok(size) => {
                debug!(waited = ?waiting.elapsed(), ?size, "the client's first terminal size");
                first_size = size;
            }
            Err(_) => debug!(
                "no terminal size from the client within {FIRST_SIZE_WAIT:?}: the exec starts \
                 without one"
            ),
        }
    }
    let shim_req = crust_shim_protocol::ExecRequest {
        exec_id: crate::ids::new_exec_id()
            .map_err(|e| BackendError::Failed(format!("random exec id: {e}")))?,
        args: req.cmd,
        tty: req.tty,
        stdin: req.stdin,
        console_size: first_size
            .filter(|s| s.width > 0 && s.height > 0)
            .map(|s| (s.width, s.height)),
        ..Default::default()
    };
    let (started, session) = monitor.exec(&shim_req).await.map_err(shim_error)?;
    let (reader, writer) = match session.attach().await {
        Ok(a) => a,
        Err(e) => {
            let _ = session.kill(libc::SIGKILL, false).await;
            return Err(shim_error(e));
        }
    };
    debug!(pid = started.pid, exec_id = %started.exec_id, "exec started");
    // Kills the process and tidies the session's state dir, also when this
    // future is dropped.
    let _guard = ExecGuard {
        session: Some(session.clone()),
        container_dir: monitor.state_dir().to_path_buf(),
    };
    let bridge = Bridge::start(reader, writer, req.stdin, req.tty).await?;
    match bridge.run(io, false).await {
        Ok(Some(exit)) => Ok(exit.exit_code),
        // The monitor closed without an exit frame: its exit file says.
        Ok(None) => session
            .wait()
            .await
            .map(|e| e.exit_code)
            .map_err(shim_error),
        Err(e) => Err(e),
    }
}

async fn attach(monitor: Monitor, req: AttachRequest, io: StreamIo) -> Result<(), BackendError> {
    let (reader, writer) = monitor.attach().await.map_err(shim_error)?;
    let bridge = Bridge::start(reader, writer, req.stdin, req.tty).await?;
    // Without output streams the session is over when stdin is.
    let stdin_only = !req.stdout && !req.stderr;
    bridge.run(io, stdin_only).await.map(|_| ())
}

/// SIGKILLs an exec process unless it is known to have exited, and removes
/// its session state dir once its monitor is gone.
struct ExecGuard {
    session: Option<Monitor>,
    container_dir: PathBuf,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let container_dir = self.container_dir.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!("an exec session ended outside the runtime: its state dir is left");
            return;
        };
        runtime.spawn(async move {
            if session.exit_info().ok().flatten().is_none() {
                let _ = session.kill(libc::SIGKILL, false).await;
            }
            let deadline = tokio::time::Instant::now() + EXEC_REAP_WAIT;
            while session.is_alive() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let session_dir = session.state_dir().to_path_buf();
            let _ = tokio::task::spawn_blocking(move || {
                remove_session_dir(&container_dir, &session_dir)
            })
            .await;
        });
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
        && e.kind() != io::ErrorKind::NotFound
    {
        debug!(dir = %session_dir.display(), "cannot remove the exec session dir: {e}");
    }
}

enum Input {
    Stdin(Vec<u8>),
    CloseStdin,
    Resize(TerminalSize),
}

/// An attach connection to a monitor, read and written by tasks of its
/// own. Dropping it detaches.
struct Bridge {
    events: mpsc::Receiver<io::Result<Option<AttachEvent>>>,
    input: mpsc::Sender<Input>,
    tasks: [JoinHandle<()>; 2],
    /// The end of a tty's stdin is not passed on: closing the terminal
    /// would hang it up (containerd leaves a tty open on stdin EOF too).
    tty: bool,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Both halves of the socket go: the monitor sees us gone.
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Bridge {
    async fn start(
        mut reader: AttachReader,
        mut writer: AttachWriter,
        stdin: bool,
        tty: bool,
    ) -> Result<Bridge, BackendError> {
        if stdin {
            match writer.declare_stdin().await {
                Ok(()) => {}
                // The monitor has already closed its end: a process that
                // exited at once (`true`) on a loaded node. What it sent
                // (output, the exit frame) is still ours to read.
                Err(e) if monitor_closed(&e) => {
                    debug!("the monitor closed before stdin was declared: {e}");
                }
                Err(e) => return Err(BackendError::Failed(format!("attach: {e}"))),
            }
        }
        let (ev_tx, events) = mpsc::channel(EVENT_BUFFER);
        let (input, mut in_rx) = mpsc::channel::<Input>(INPUT_BUFFER);
        let read = tokio::spawn(async move {
            loop {
                let ev = reader.next_event().await;
                let more = matches!(
                    ev,
                    Ok(Some(AttachEvent::Stdout(_) | AttachEvent::Stderr(_)))
                );
                if ev_tx.send(ev).await.is_err() || !more {
                    break;
                }
            }
        });
        let write = tokio::spawn(async move {
            while let Some(i) = in_rx.recv().await {
                let r = match i {
                    Input::Stdin(d) => writer.write_stdin(&d).await,
                    Input::CloseStdin => writer.close_stdin().await,
                    Input::Resize(s) => writer.resize(s.width, s.height).await,
                };
                if r.is_err() {
                    break;
                }
            }
        });
        Ok(Bridge {
            events,
            input,
            tasks: [read, write],
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

/// A write to the monitor failed because it closed its end.
fn monitor_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    )
}

async fn flush(io: &mut StreamIo) {
    for w in [io.stdout.as_mut(), io.stderr.as_mut()]
        .into_iter()
        .flatten()
    {
        let _ = w.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    use crust_shim_protocol::{STREAM_EXIT, STREAM_STDOUT, Shim, frame};

    use super::*;

    /// A monitor that answers an attach with output and the exit frame and
    /// closes at once, before the client said anything (an exec of `true`
    /// on a loaded node): the session still ends with the exit code, not
    /// with the broken pipe of the client's first write.
    #[tokio::test]
    async fn an_exec_that_exited_before_the_client_spoke_reports_its_exit() {
        let dir = tempfile::tempdir().unwrap();
        let listener =
            UnixListener::bind(dir.path().join(crust_shim_protocol::ATTACH_SOCKET)).unwrap();
        let monitor = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            frame::write_frame(&mut s, STREAM_STDOUT, b"bye\n").unwrap();
            let exit = br#"{"pid":7,"exit_code":42,"exited_at":"2026-11-28T00:00:00Z","exited_at_unix_nanos":0}"#;
            frame::write_frame(&mut s, STREAM_EXIT, exit).unwrap();
            s.flush().unwrap();
        });
        let shim = Shim::from_parts(dir.path().to_path_buf(), 1, 7);
        let (reader, writer) = shim.attach().await.unwrap();
        monitor.join().unwrap(); // its end is closed now
        let bridge = Bridge::start(reader, writer, true, true).await.unwrap();
        let (out_w, mut out_r) = tokio::io::duplex(1024);
        let io = StreamIo {
            stdin: Some(Box::new(tokio::io::empty())),
            stdout: Some(Box::new(out_w)),
            stderr: None,
            resize: None,
        };
        let exit = bridge
            .run(io, false)
            .await
            .unwrap()
            .expect("the exit frame");
        assert_eq!(exit.exit_code, 42);
        let mut out = Vec::new();
        out_r.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"bye\n");
    }
}
