//! The daemon's side: spawn a monitor, find it again after a restart, and
//! talk to it.
//!
//! Everything here is blocking `std` code without threads of its own: call
//! it from `tokio::task::spawn_blocking` in the daemon (or use the
//! `client-async` feature's [`crate::async_client`]). Nothing forks: the
//! one way a monitor is started is [`Shim::spawn`], a `std::process::Command`
//! (posix_spawn / vfork + exec) with a clean environment.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::frame;
use crate::protocol::*;

/// What can go wrong talking to a monitor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The monitor could not create the container (the runtime's message).
    #[error("{0}")]
    Startup(String),
    /// The monitor refused or failed the request.
    #[error("{message}")]
    Shim { kind: ErrorKind, message: String },
    /// No monitor is running for this state directory (read the exit file).
    #[error("the monitor is not running")]
    Gone,
    #[error("protocol error: {0}")]
    Protocol(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The PATH the monitor (and through it the OCI runtime) gets.
pub const SHIM_PATH_ENV: &str = crate::runtime::cli::DEFAULT_PATH;

/// The variable that gives a monitor the soft RLIMIT_NOFILE to run with.
pub const NOFILE_ENV: &str = "CRUST_SHIM_NOFILE";

static CHILD_NOFILE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// The soft limit on open files that monitors (and so containers) get: a
/// daemon that raised its own for its sockets passes the node's on, so
/// containers see the limit they would see anywhere else.
pub fn set_monitor_open_files_limit(soft: u64) {
    let _ = CHILD_NOFILE.set(soft);
}

/// How long a plain request may take before the client gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Arguments of [`Shim::spawn`].
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// The `crust-shim` binary.
    pub shim_binary: PathBuf,
    /// The container's state directory (created 0700 if missing).
    pub state_dir: PathBuf,
    pub config: ShimConfig,
    /// How long to wait for the container to be created.
    pub timeout: Duration,
}

/// A running monitor (of a container or of an exec session).
#[derive(Debug, Clone)]
pub struct Shim {
    state_dir: PathBuf,
    shim_pid: i32,
    pid: i32,
}

/// The result of an exec-sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSyncOutput {
    pub exit_code: i32,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// A started exec session: its own monitor.
#[derive(Debug, Clone)]
pub struct ExecSession {
    pub exec_id: String,
    /// Pid of the exec process.
    pub pid: i32,
    /// The session's monitor: attach, resize, kill, wait, state.
    pub shim: Shim,
}

/// What an attach client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExitInfo),
}

/// An attach connection (see the framing in [`crate::protocol`]).
#[derive(Debug)]
pub struct Attach {
    sock: UnixStream,
}

impl Attach {
    /// Sends stdin bytes (split into frames as needed).
    pub fn write_stdin(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(64 * 1024) {
            frame::write_frame(&mut self.sock, STREAM_STDIN, chunk)?;
        }
        Ok(())
    }

    /// Declares this client a stdin client before it sends any data (so
    /// that its detach closes a `stdin_once` container's stdin).
    pub fn declare_stdin(&mut self) -> io::Result<()> {
        frame::write_frame(&mut self.sock, STREAM_STDIN_OPEN, &[])
    }

    /// Closes this client's stdin (the container's too with `stdin_once`,
    /// an exec's always).
    pub fn close_stdin(&mut self) -> io::Result<()> {
        frame::write_frame(&mut self.sock, STREAM_STDIN, &[])
    }

    pub fn resize(&mut self, width: u16, height: u16) -> io::Result<()> {
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&width.to_be_bytes());
        p[2..].copy_from_slice(&height.to_be_bytes());
        frame::write_frame(&mut self.sock, STREAM_RESIZE, &p)
    }

    /// The next output or the exit; `Ok(None)` when the monitor closed.
    pub fn next_event(&mut self) -> io::Result<Option<AttachEvent>> {
        loop {
            let Some((stream, payload)) = frame::read_frame(&mut self.sock)? else {
                return Ok(None);
            };
            return Ok(Some(match stream {
                STREAM_STDOUT => AttachEvent::Stdout(payload),
                STREAM_STDERR => AttachEvent::Stderr(payload),
                STREAM_EXIT => AttachEvent::Exit(
                    serde_json::from_slice(&payload)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
                ),
                _ => continue,
            }));
        }
    }

    /// A second handle on the same connection (one thread reads, another
    /// writes).
    pub fn try_clone(&self) -> io::Result<Attach> {
        Ok(Attach {
            sock: self.sock.try_clone()?,
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }

    /// The raw socket (e.g. to hand to an async runtime).
    pub fn into_inner(self) -> UnixStream {
        self.sock
    }
}

/// Connects to `dir/name`, through `/proc/self/fd` when the path is too long
/// for a socket address.
pub fn connect_in(dir: &Path, name: &str) -> io::Result<UnixStream> {
    let full = dir.join(name);
    if full.as_os_str().len() < 100 {
        return UnixStream::connect(full);
    }
    let d = File::open(dir)?;
    UnixStream::connect(format!("/proc/self/fd/{}/{name}", d.as_raw_fd()))
}

fn gone_or(e: io::Error) -> Error {
    match e.kind() {
        // Gone, or going: it exited with our connection still unanswered.
        io::ErrorKind::NotFound
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Error::Gone,
        _ => Error::Io(e),
    }
}

/// The exit record in a state directory, if the process has exited.
pub fn read_exit_file(state_dir: &Path) -> io::Result<Option<ExitInfo>> {
    crate::exit::read_exit_file(&state_dir.join(EXIT_FILE))
}

/// Is `pid` a crust-shim monitor of `state_dir`? (Guards against pid reuse.)
pub fn is_shim_of(pid: i32, state_dir: &Path) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    args.len() >= 3
        && (args[1] == b"container" || args[1] == b"exec")
        && args[2] == state_dir.as_os_str().as_encoded_bytes()
}

impl Shim {
    /// Starts a monitor for a new container and waits until the container is
    /// created: writes `shim.json`, runs `crust-shim container DIR` with an
    /// empty environment (PATH only), reads the start-up result from its
    /// stdout. The monitor has detached (setsid + fork) by the time this
    /// returns.
    pub fn spawn(opts: &SpawnOptions) -> Result<Shim> {
        if !opts.state_dir.is_absolute() {
            return Err(Error::Startup(format!(
                "state dir {} is not absolute",
                opts.state_dir.display()
            )));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&opts.state_dir)?;
        let cfg = serde_json::to_vec(&opts.config).map_err(|e| Error::Protocol(e.to_string()))?;
        crate::exit::write_atomic(&opts.state_dir, CONFIG_FILE, &cfg)?;
        let _ = fs::remove_file(opts.state_dir.join(EXIT_FILE));
        let mut cmd = Command::new(&opts.shim_binary);
        cmd.arg("container")
            .arg(&opts.state_dir)
            .env_clear()
            .env("PATH", SHIM_PATH_ENV);
        if let Some(n) = CHILD_NOFILE.get() {
            cmd.env(NOFILE_ENV, n.to_string());
        }
        let mut child = cmd
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| Error::Protocol("no stdout pipe".into()))?;
        // The first process exits right after forking the monitor.
        child.wait()?;
        let line = match read_line_timeout(out.into(), opts.timeout) {
            Ok(l) => l,
            Err(e) => {
                // Do not leave a monitor behind that we gave up on.
                if let Ok(pid) = read_pid(&opts.state_dir.join(SHIM_PID_FILE))
                    && is_shim_of(pid, &opts.state_dir)
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let log = fs::read_to_string(opts.state_dir.join(SHIM_LOG)).unwrap_or_default();
                return Err(Error::Startup(format!("{e}; shim log: {}", log.trim())));
            }
        };
        match serde_json::from_slice::<StartupResult>(&line) {
            Ok(StartupResult::Ok { shim_pid, pid }) => Ok(Shim {
                state_dir: opts.state_dir.clone(),
                shim_pid,
                pid,
            }),
            Ok(StartupResult::Err { message }) => Err(Error::Startup(message)),
            Err(e) => Err(Error::Protocol(format!(
                "bad start-up result {:?}: {e}",
                String::from_utf8_lossy(&line)
            ))),
        }
    }

    /// A handle from parts the daemon kept (no checks; see [`Shim::connect`]).
    pub fn from_parts(state_dir: PathBuf, shim_pid: i32, pid: i32) -> Shim {
        Shim {
            state_dir,
            shim_pid,
            pid,
        }
    }

    /// Finds the monitor of `state_dir` again (after a daemon restart).
    /// [`Error::Gone`] if none runs: then [`read_exit_file`] has the exit.
    pub fn connect(state_dir: &Path) -> Result<Shim> {
        let shim_pid = match read_pid(&state_dir.join(SHIM_PID_FILE)) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::Gone),
            Err(e) => return Err(e.into()),
        };
        if !is_shim_of(shim_pid, state_dir) {
            return Err(Error::Gone);
        }
        let pid = read_pid(&state_dir.join(CONTAINER_PID_FILE)).unwrap_or(0);
        Ok(Shim {
            state_dir: state_dir.to_path_buf(),
            shim_pid,
            pid,
        })
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Pid of the monitor.
    pub fn shim_pid(&self) -> i32 {
        self.shim_pid
    }

    /// Pid of the container's init (or of the exec process).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The monitor process still runs.
    pub fn is_alive(&self) -> bool {
        is_shim_of(self.shim_pid, &self.state_dir)
    }

    fn connect_ctl(&self) -> Result<UnixStream> {
        connect_in(&self.state_dir, CONTROL_SOCKET).map_err(gone_or)
    }

    fn request(sock: &mut UnixStream, req: &Request) -> Result<Reply> {
        let body = serde_json::to_vec(req).map_err(|e| Error::Protocol(e.to_string()))?;
        frame::write_message(sock, &body).map_err(gone_or)?;
        let resp = frame::read_message(sock)
            .map_err(gone_or)?
            .ok_or(Error::Gone)?;
        match serde_json::from_slice::<Response>(&resp) {
            Ok(Response::Ok(r)) => Ok(r),
            Ok(Response::Err(ErrorReply { kind, message })) => Err(Error::Shim { kind, message }),
            Err(e) => Err(Error::Protocol(format!("bad response: {e}"))),
        }
    }

    /// Sends one request and reads its answer.
    pub fn call(&self, req: &Request) -> Result<Reply> {
        let mut sock = self.connect_ctl()?;
        sock.set_read_timeout(Some(CALL_TIMEOUT))?;
        Self::request(&mut sock, req)
    }

    fn expect_done(&self, req: &Request) -> Result<()> {
        match self.call(req)? {
            Reply::Done => Ok(()),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Runs the created container's process.
    pub fn start(&self) -> Result<()> {
        self.expect_done(&Request::Start)
    }

    /// Signals the container's init (all processes with `all`). Succeeds if
    /// it has already exited.
    pub fn kill(&self, signal: i32, all: bool) -> Result<()> {
        match self.expect_done(&Request::Kill { signal, all }) {
            Err(Error::Gone) => Ok(()),
            r => r,
        }
    }

    /// Applies OCI `LinuxResources` (JSON) to the running container.
    pub fn update(&self, resources: &serde_json::Value) -> Result<()> {
        self.expect_done(&Request::Update {
            resources: resources.clone(),
        })
    }

    /// Reopens the CRI log file.
    pub fn reopen_log(&self) -> Result<()> {
        self.expect_done(&Request::ReopenLog)
    }

    /// Sets the tty's window size.
    pub fn resize(&self, width: u16, height: u16) -> Result<()> {
        self.expect_done(&Request::Resize { width, height })
    }

    pub fn state(&self) -> Result<State> {
        match self.call(&Request::State)? {
            Reply::State(s) => Ok(s),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Blocks until the process has exited and returns its exit record
    /// (from the exit file if the monitor is already gone).
    pub fn wait(&self) -> Result<ExitInfo> {
        let from_file = || match read_exit_file(&self.state_dir)? {
            Some(e) => Ok(e),
            None => Err(Error::Gone),
        };
        let mut sock = match self.connect_ctl() {
            Ok(s) => s,
            Err(Error::Gone) => return from_file(),
            Err(e) => return Err(e),
        };
        match Self::request(&mut sock, &Request::Wait) {
            Ok(Reply::Exited(e)) => Ok(e),
            Ok(other) => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
            // The monitor went away between the exit and our answer.
            Err(Error::Gone) => from_file(),
            Err(e) => Err(e),
        }
    }

    /// The exit record, if the process has exited.
    pub fn exit_info(&self) -> Result<Option<ExitInfo>> {
        Ok(read_exit_file(&self.state_dir)?)
    }

    /// Runs a command in the container and collects its output (16 MiB per
    /// stream at most). `req.timeout_ms` kills it (reported as `timed_out`).
    pub fn exec_sync(&self, req: &ExecRequest) -> Result<ExecSyncOutput> {
        let mut sock = self.connect_ctl()?;
        // Generous: the monitor enforces the real timeout.
        let limit = match req.timeout_ms {
            0 => None,
            ms => Some(Duration::from_millis(ms) + CALL_TIMEOUT),
        };
        sock.set_read_timeout(limit.or(Some(CALL_TIMEOUT)))?;
        match Self::request(&mut sock, &Request::ExecSync(req.clone()))? {
            Reply::ExecSyncStarted { .. } => {}
            other => return Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
        sock.set_read_timeout(limit)?;
        let mut out = ExecSyncOutput {
            exit_code: -1,
            timed_out: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
        };
        loop {
            let Some((stream, payload)) = frame::read_frame(&mut sock)? else {
                return Err(Error::Gone);
            };
            match stream {
                STREAM_STDOUT => {
                    append_capped(&mut out.stdout, &payload, &mut out.stdout_truncated)
                }
                STREAM_STDERR => {
                    append_capped(&mut out.stderr, &payload, &mut out.stderr_truncated)
                }
                STREAM_EXIT => {
                    let r: ExecSyncResult = serde_json::from_slice(&payload)
                        .map_err(|e| Error::Protocol(format!("bad exec result: {e}")))?;
                    out.exit_code = r.exit_code;
                    out.timed_out = r.timed_out;
                    out.stdout_truncated |= r.stdout_truncated;
                    out.stderr_truncated |= r.stderr_truncated;
                    if let Some(e) = r.error {
                        return Err(Error::Shim {
                            kind: ErrorKind::Runtime,
                            message: e,
                        });
                    }
                    return Ok(out);
                }
                _ => {}
            }
        }
    }

    /// Starts an exec session (its own monitor; attach to it next).
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecSession> {
        match self.call(&Request::Exec(req.clone()))? {
            Reply::ExecStarted(s) => Ok(ExecSession {
                exec_id: s.exec_id,
                pid: s.pid,
                shim: Shim {
                    state_dir: s.state_dir,
                    shim_pid: s.shim_pid,
                    pid: s.pid,
                },
            }),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Attaches to the process's stdio.
    pub fn attach(&self) -> Result<Attach> {
        let sock = connect_in(&self.state_dir, ATTACH_SOCKET).map_err(gone_or)?;
        Ok(Attach { sock })
    }

    /// SIGKILLs the monitor itself (last-resort cleanup; the container keeps
    /// running, unmonitored).
    pub fn kill_shim(&self) -> Result<()> {
        if self.is_alive() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.shim_pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .map_err(io::Error::from)?;
        }
        Ok(())
    }
}

fn append_capped(buf: &mut Vec<u8>, data: &[u8], truncated: &mut bool) {
    let room = EXEC_SYNC_OUTPUT_CAP.saturating_sub(buf.len());
    if data.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

fn read_pid(path: &Path) -> io::Result<i32> {
    let s = fs::read_to_string(path)?;
    s.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad pid in {}", path.display()),
        )
    })
}

/// Reads one line (a start-up result) from `fd`, giving up after `timeout`.
pub(crate) fn read_line_timeout(fd: OwnedFd, timeout: Duration) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut f = File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(nl) = out.iter().position(|&b| b == b'\n') {
            out.truncate(nl);
            return Ok(out);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no start-up result in time",
            ));
        }
        let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
        let mut p = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut p,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        match f.read(&mut buf) {
            Ok(0) if out.is_empty() => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the monitor exited without a start-up result",
                ));
            }
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > MAX_MESSAGE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "start-up result too long",
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
