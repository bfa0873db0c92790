//! The monitor process: `crust-shim container <state_dir>` for a container,
//! `crust-shim exec <state_dir>` for an exec session.
//!
//! # Processes
//!
//! ```text
//! daemon ──spawn──> crust-shim container DIR   (setsid, fork, exits at once)
//!                      └─fork─> monitor         (child subreaper, reparented to init)
//!                                 ├─ runc create / libcontainer child (short-lived)
//!                                 ├─ container init  (reparented here: subreaper)
//!                                 ├─ exec-sync processes (reparented here)
//!                                 └─ crust-shim exec DIR/exec/ID  (one per exec session)
//!                                        └─ exec process (reparented there)
//! ```
//!
//! One thread, one `poll(2)` loop, no async runtime. Sources: a signalfd for
//! SIGCHLD (every child is reaped with `waitpid(-1, WNOHANG)`), the control
//! and attach listeners and their connections, the container's stdout and
//! stderr pipes (or the pty master), its stdin, and the pipes of running
//! exec-syncs. Calls into the OCI runtime are synchronous: they take as long
//! as the runtime takes (tens of ms), never as long as a container process.
//!
//! # Exec-sync in the monitor, exec sessions in their own monitor
//!
//! ExecSync (probes) runs inside the container's monitor: a runtime `exec
//! --detach` with two pipes, whose output is streamed straight to the
//! control connection (at most 16 MiB per stream are forwarded, the rest is
//! read and dropped), so the monitor holds no more than a pipe's worth of
//! it and its memory stays flat; no process start-up per probe either.
//! Streaming exec (kubectl exec) gets a separate monitor in exec mode with
//! its own state directory, attach socket, control socket and exit file:
//! the same code as a container's, minus the log, plus "wait for the first
//! attach client" (its output is not read before one is attached, so none is
//! lost) and "kill the process when the last client detaches" (as
//! containerd does when the exec stream ends). The design's "one small
//! monitor per container and per exec session"; measured, an exec session
//! costs about what an idle container monitor costs.
//!
//! # Exit
//!
//! When the container's init is reaped the monitor reads what is left in the
//! pipes, flushes the log, checks the cgroup's OOM-kill count, writes
//! `exit.json` atomically, answers `Wait` requests, sends the exit frame to
//! attach clients, deletes the container from the runtime (`delete
//! --force`), removes its sockets and exits: `exit.json` is the durable
//! record the daemon reads, even after a daemon crash or restart.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::exit::{self, OomWatch};
use crate::frame;
use crate::logfmt::{self, LineSplitter, Stream};
use crate::protocol::*;
use crate::runtime::cli::DEFAULT_PATH;
use crate::runtime::{self, CreateOptions, ExecOptions, OciRuntime, Stdio};
use crust_linux::process as sys;

/// Bytes read from a container pipe at a time.
const READ_CHUNK: usize = 32 * 1024;
/// Stdin bytes buffered before attach clients are no longer read.
const STDIN_HIGH_WATER: usize = 64 * 1024;
/// Output queued for one attach client of a container before it is dropped
/// as too slow (the container and its log do not wait for it).
const ATTACH_SLOW_LIMIT: usize = 4 << 20;
/// Output queued for an exec session's clients (or an exec-sync's control
/// connection) before the process's pipes are no longer read.
const BACKPRESSURE: usize = 256 * 1024;
/// How long the monitor tries to flush its clients after the exit.
const LINGER: Duration = Duration::from_secs(2);
/// Quiet time after a request before the monitor trims its working set.
const TRIM_AFTER: Duration = Duration::from_secs(2);
/// Default wait of an exec session for its first client.
const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the container monitor waits for an exec session to start.
const EXEC_START_TIMEOUT: Duration = Duration::from_secs(120);

/// Entry point of the `crust-shim` binary; returns the exit code.
pub fn main() -> i32 {
    if let Some(n) = std::env::var(crate::client::NOFILE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let _ = sys::set_open_files_soft_limit(n);
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    let mode = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let dir = args.get(2).map(PathBuf::from);
    match (mode, dir) {
        ("container", Some(dir)) => run(Mode::Container, &dir),
        ("exec", Some(dir)) => run(Mode::Exec, &dir),
        ("--version", _) => {
            println!("crust-shim {}", env!("CARGO_PKG_VERSION"));
            0
        }
        _ => {
            eprintln!("usage: crust-shim container|exec <state-dir>");
            2
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Container,
    Exec,
}

/// Writes the start-up result on fd 1 and points fd 1 at /dev/null.
fn report(result: &StartupResult) {
    let mut line = serde_json::to_vec(result).unwrap_or_default();
    line.push(b'\n');
    let mut out = io::stdout().lock();
    let _ = out.write_all(&line);
    let _ = out.flush();
    drop(out);
    if let Ok(null) = OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
}

fn fail(msg: String) -> i32 {
    eprintln!("crust-shim: {msg}");
    report(&StartupResult::Err { message: msg });
    1
}

/// Closes every descriptor above stderr that we inherited (a daemon's
/// jobserver pipe, anything without CLOEXEC): nothing of the caller's may
/// reach the monitor's children or stay open for the container's lifetime.
fn close_inherited_fds() {
    let fds: Vec<i32> = match fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is closed by now; closing it again
    // only yields EBADF.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

fn run(mode: Mode, dir: &Path) -> i32 {
    close_inherited_fds();
    if !dir.is_absolute() {
        return fail(format!("state dir {} is not absolute", dir.display()));
    }
    if let Err(e) = std::env::set_current_dir(dir) {
        return fail(format!("state dir {}: {e}", dir.display()));
    }
    // Our own diagnostics go to shim.log; stdin is /dev/null; stdout stays
    // the start-up pipe until `report`.
    match OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.join(SHIM_LOG))
    {
        Ok(f) => {
            let _ = nix::unistd::dup2(f.as_raw_fd(), 2);
        }
        Err(e) => return fail(format!("opening {SHIM_LOG}: {e}")),
    }
    if let Ok(null) = File::open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
    }
    // A new session: no terminal, no signals meant for the daemon's group.
    let _ = nix::unistd::setsid();
    if mode == Mode::Container {
        // The second fork: the process the daemon started exits now (the
        // daemon reaps it), the monitor is reparented to init, outliving the
        // daemon; it is not a session leader, so it can never get a
        // controlling terminal.
        match sys::fork() {
            Ok(Some(_)) => sys::exit_now(0),
            Ok(None) => {}
            Err(e) => return fail(format!("fork: {e}")),
        }
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        return fail(format!("PR_SET_CHILD_SUBREAPER: {e}"));
    }
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None) {
        return fail(format!("blocking SIGCHLD: {e}"));
    }
    let sigfd = match SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
        Ok(s) => s,
        Err(e) => return fail(format!("signalfd: {e}")),
    };
    let shim_pid = std::process::id() as i32;
    if let Err(e) = exit::write_atomic(dir, SHIM_PID_FILE, shim_pid.to_string().as_bytes()) {
        return fail(format!("writing {SHIM_PID_FILE}: {e}"));
    }
    let mut m = match Monitor::setup(mode, dir, shim_pid, sigfd) {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_file(dir.join(SHIM_PID_FILE));
            return fail(e);
        }
    };
    report(&StartupResult::Ok {
        shim_pid,
        pid: m.pid,
    });
    m.run();
    m.cleanup_files();
    0
}

/// Which fd a poll entry is for.
#[derive(Debug, Clone, Copy)]
enum Tok {
    Signal,
    CtlListen,
    AttachListen,
    Output(usize),
    Stdin,
    Ctl(u64),
    Attach(u64),
    JobOut(u64, usize),
}

/// A buffered non-blocking connection.
struct Conn {
    sock: UnixStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    eof: bool,
    dead: bool,
}

impl Conn {
    fn new(sock: UnixStream) -> io::Result<Conn> {
        sock.set_nonblocking(true)?;
        Ok(Conn {
            sock,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            wpos: 0,
            eof: false,
            dead: false,
        })
    }

    fn pending(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    fn queue_frame(&mut self, stream: u8, payload: &[u8]) {
        frame::encode_frame(&mut self.wbuf, stream, payload);
    }

    fn queue_message(&mut self, body: &[u8]) {
        frame::encode_message(&mut self.wbuf, body);
    }

    fn flush(&mut self) {
        while self.wpos < self.wbuf.len() && !self.dead {
            match self.sock.write(&self.wbuf[self.wpos..]) {
                Ok(0) => self.dead = true,
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
            if self.wbuf.capacity() > 64 * 1024 {
                self.wbuf = Vec::new();
            }
        } else if self.wpos > 64 * 1024 && self.wpos * 2 > self.wbuf.len() {
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
    }

    /// Reads what is available (up to `limit` buffered bytes).
    fn fill(&mut self, limit: usize) {
        let mut buf = [0u8; 16 * 1024];
        while self.rbuf.len() < limit && !self.eof && !self.dead {
            match self.sock.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.rbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
    }
}

struct AttachClient {
    conn: Conn,
    had_stdin: bool,
    stdin_done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    No,
    Exit,
    Job(u64),
}

struct CtlClient {
    conn: Conn,
    waiting: Waiting,
}

/// A container output: a pipe or the pty master.
struct Output {
    file: Option<File>,
    stream: Stream,
    splitter: LineSplitter,
}

struct Stdin {
    file: Option<File>,
    buf: Vec<u8>,
    close_when_flushed: bool,
}

impl Stdin {
    fn flush(&mut self) {
        if let Some(f) = self.file.as_mut() {
            let mut pos = 0;
            while pos < self.buf.len() {
                match f.write(&self.buf[pos..]) {
                    Ok(0) => break,
                    Ok(n) => pos += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // The reader is gone (EPIPE) or the tty hung up.
                        self.file = None;
                        self.buf = Vec::new();
                        return;
                    }
                }
            }
            self.buf.drain(..pos);
        } else {
            self.buf = Vec::new();
        }
        if self.buf.is_empty() && self.close_when_flushed {
            // A tty's master is also the output: only stop writing to it.
            self.file = None;
        }
    }
}

/// A running exec-sync.
struct Job {
    client: u64,
    pid: i32,
    outs: [Option<File>; 2],
    sent: [usize; 2],
    truncated: [bool; 2],
    deadline: Option<Instant>,
    status: Option<WaitStatus>,
    timed_out: bool,
}

struct LogFile {
    path: PathBuf,
    file: Option<File>,
    warned: bool,
}

impl LogFile {
    fn open(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
    }

    fn write(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if let Some(f) = self.file.as_mut()
            && let Err(e) = f.write_all(data)
            && !self.warned
        {
            eprintln!("crust-shim: writing log {}: {e}", self.path.display());
            self.warned = true;
        }
    }

    fn reopen(&mut self) -> io::Result<()> {
        self.file = None;
        self.file = Some(Self::open(&self.path)?);
        self.warned = false;
        Ok(())
    }
}

struct Monitor {
    mode: Mode,
    dir: PathBuf,
    id: String,
    bundle: PathBuf,
    runtime_cfg: RuntimeConfig,
    runtime: Box<dyn OciRuntime>,
    shim_pid: i32,
    pid: i32,
    status: Status,
    close_stdin_on_eof: bool,
    sigfd: SignalFd,
    ctl_listener: UnixListener,
    attach_listener: UnixListener,
    outputs: Vec<Output>,
    stdin: Option<Stdin>,
    pty: Option<OwnedFd>,
    log: Option<LogFile>,
    attach: BTreeMap<u64, AttachClient>,
    ctl: BTreeMap<u64, CtlClient>,
    jobs: BTreeMap<u64, Job>,
    next_id: u64,
    oom: Option<OomWatch>,
    reaped: Option<(WaitStatus, SystemTime)>,
    exit: Option<ExitInfo>,
    attach_deadline: Option<Instant>,
    had_attacher: bool,
    linger_until: Option<Instant>,
    exec_seq: u64,
    /// When to give back memory touched by the last burst of work.
    trim_at: Option<Instant>,
}

type ReqError = (ErrorKind, String);

fn bind_socket(dir: &Path, name: &str) -> Result<UnixListener, String> {
    let _ = fs::remove_file(dir.join(name));
    // The cwd is the state dir: a relative name keeps clear of sun_path's
    // 108-byte limit however deep the state dir is.
    let l = UnixListener::bind(name).map_err(|e| format!("binding {name}: {e}"))?;
    fs::set_permissions(dir.join(name), fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {name}: {e}"))?;
    l.set_nonblocking(true)
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(l)
}

fn pipe() -> Result<(File, OwnedFd), String> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    sys::set_nonblocking(r.as_fd()).map_err(|e| format!("pipe: {e}"))?;
    Ok((File::from(r), w))
}

/// A symlink removed when dropped.
struct ShortLink(PathBuf);

impl Drop for ShortLink {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The path a runtime gets for our console socket. When the socket's path
/// is too long for a socket address, a CLI runtime gets a short symlink to
/// it in the temp dir (a relative path would not do: runc chdirs into the
/// bundle). The symlink's target is in our 0700 state dir, so only root
/// can connect through it; a name that exists already is never reused.
fn console_arg(dir: &Path, cfg: &RuntimeConfig) -> Result<(PathBuf, Option<ShortLink>), String> {
    let abs = dir.join(CONSOLE_SOCKET);
    match cfg {
        // libcontainer connects through a short symlink of its own.
        RuntimeConfig::Embedded { .. } => Ok((abs, None)),
        RuntimeConfig::Cli { .. } if abs.as_os_str().len() < 100 => Ok((abs, None)),
        RuntimeConfig::Cli { .. } => {
            let nanos = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let link = std::env::temp_dir()
                .join(format!("crust-console-{}-{nanos:08x}", std::process::id()));
            std::os::unix::fs::symlink(&abs, &link)
                .map_err(|e| format!("console socket link {}: {e}", link.display()))?;
            Ok((link.clone(), Some(ShortLink(link))))
        }
    }
}

/// The stdio plumbing of a new process, monitor side.
struct Plumbing {
    outputs: Vec<Output>,
    stdin: Option<Stdin>,
    pty: Option<OwnedFd>,
    console: Option<UnixListener>,
}

fn plumbing(tty: bool, stdin: bool, dir: &Path) -> Result<(Plumbing, Stdio), String> {
    if tty {
        let l = bind_socket(dir, CONSOLE_SOCKET)?;
        return Ok((
            Plumbing {
                outputs: Vec::new(),
                stdin: None,
                pty: None,
                console: Some(l),
            },
            Stdio::default(),
        ));
    }
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let mut child = Stdio {
        stdin: None,
        stdout: Some(out_w),
        stderr: Some(err_w),
    };
    let mut st = None;
    if stdin {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        sys::set_nonblocking(w.as_fd()).map_err(|e| format!("pipe: {e}"))?;
        child.stdin = Some(r);
        st = Some(Stdin {
            file: Some(File::from(w)),
            buf: Vec::new(),
            close_when_flushed: false,
        });
    }
    Ok((
        Plumbing {
            outputs: vec![
                Output {
                    file: Some(out_r),
                    stream: Stream::Stdout,
                    splitter: LineSplitter::new(Stream::Stdout, logfmt::DEFAULT_LINE_CAP),
                },
                Output {
                    file: Some(err_r),
                    stream: Stream::Stderr,
                    splitter: LineSplitter::new(Stream::Stderr, logfmt::DEFAULT_LINE_CAP),
                },
            ],
            stdin: st,
            pty: None,
            console: None,
        },
        child,
    ))
}

impl Plumbing {
    /// After create/exec: take the pty master the runtime sent.
    fn receive_console(&mut self, dir: &Path, stdin: bool) -> Result<(), String> {
        let Some(l) = self.console.take() else {
            return Ok(());
        };
        let _ = fs::remove_file(dir.join(CONSOLE_SOCKET));
        let (sock, _) = l
            .accept()
            .map_err(|e| format!("the runtime sent no pty to the console socket: {e}"))?;
        sock.set_nonblocking(false).map_err(|e| e.to_string())?;
        let master = sys::recv_fd(sock.as_fd()).map_err(|e| format!("receiving the pty: {e}"))?;
        sys::set_nonblocking(master.as_fd()).map_err(|e| e.to_string())?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("dup: {e}"));
        self.pty = Some(dup(&master)?);
        if stdin {
            self.stdin = Some(Stdin {
                file: Some(File::from(dup(&master)?)),
                buf: Vec::new(),
                close_when_flushed: false,
            });
        }
        self.outputs = vec![Output {
            file: Some(File::from(master)),
            stream: Stream::Stdout,
            splitter: LineSplitter::new(Stream::Stdout, logfmt::DEFAULT_LINE_CAP),
        }];
        Ok(())
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let data = fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&data).map_err(|e| format!("parsing {}: {e}", path.display()))
}

fn valid_container_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'))
}

/// `consoleSize` (width, height) of an OCI process.
fn console_size(process: &serde_json::Value) -> Option<(u16, u16)> {
    let cs = process.get("consoleSize")?;
    let w = u16::try_from(cs.get("width")?.as_u64()?).ok()?;
    let h = u16::try_from(cs.get("height")?.as_u64()?).ok()?;
    Some((w, h))
}

/// The OCI `process` for an exec: the container's own (user, capabilities,
/// env, cwd, rlimits, apparmor, no_new_privs...) with the request's argv,
/// extra env, cwd and tty; or the request's complete `process`.
pub fn build_process(
    bundle: &Path,
    req: &ExecRequest,
    tty: bool,
) -> Result<serde_json::Value, String> {
    use serde_json::{Value, json};
    let mut p = match &req.process {
        Some(p) => p.clone(),
        None => {
            if req.args.is_empty() {
                return Err("exec needs args".into());
            }
            let spec: Value = read_json(&bundle.join("config.json"))?;
            let mut p = spec
                .get("process")
                .cloned()
                .ok_or("the container's config.json has no process")?;
            p["args"] = json!(req.args);
            if !req.env.is_empty() {
                let mut env: Vec<Value> = p
                    .get("env")
                    .and_then(|e| e.as_array())
                    .cloned()
                    .unwrap_or_default();
                env.extend(req.env.iter().map(|e| json!(e)));
                p["env"] = Value::Array(env);
            }
            if let Some(cwd) = &req.cwd {
                p["cwd"] = json!(cwd);
            }
            p
        }
    };
    let obj = p.as_object_mut().ok_or("process is not an object")?;
    obj.insert("terminal".into(), json!(tty));
    match req.console_size {
        Some((w, h)) if tty => {
            obj.insert("consoleSize".into(), json!({"width": w, "height": h}));
        }
        _ => {
            obj.remove("consoleSize");
        }
    }
    Ok(p)
}

impl Monitor {
    fn setup(mode: Mode, dir: &Path, shim_pid: i32, sigfd: SignalFd) -> Result<Monitor, String> {
        let (id, bundle, runtime_cfg, tty, stdin, stdin_once, log_path, attach_timeout);
        match mode {
            Mode::Container => {
                let cfg: ShimConfig = read_json(&dir.join(CONFIG_FILE))?;
                if !cfg.bundle.is_absolute() {
                    return Err(format!("bundle {} is not absolute", cfg.bundle.display()));
                }
                if let Some(l) = &cfg.log_path
                    && !l.is_absolute()
                {
                    return Err(format!("log path {} is not absolute", l.display()));
                }
                id = cfg.id;
                bundle = cfg.bundle;
                runtime_cfg = cfg.runtime;
                tty = cfg.tty;
                stdin = cfg.stdin;
                stdin_once = cfg.stdin_once;
                log_path = cfg.log_path;
                attach_timeout = None;
            }
            Mode::Exec => {
                let cfg: ExecConfig = read_json(&dir.join(EXEC_CONFIG_FILE))?;
                id = cfg.container_id;
                bundle = PathBuf::new();
                runtime_cfg = cfg.runtime;
                tty = cfg.tty;
                stdin = cfg.stdin;
                // An exec's stdin ends when its client's does.
                stdin_once = true;
                log_path = None;
                attach_timeout = Some(match cfg.attach_timeout_ms {
                    0 => DEFAULT_ATTACH_TIMEOUT,
                    ms => Duration::from_millis(ms),
                });
            }
        }
        if !valid_container_id(&id) {
            return Err(format!("invalid container id {id:?}"));
        }
        let runtime = runtime::from_config(&runtime_cfg, dir.join(RUNTIME_LOG));
        let log = match log_path {
            Some(p) => Some(LogFile {
                file: Some(
                    LogFile::open(&p).map_err(|e| format!("opening log {}: {e}", p.display()))?,
                ),
                path: p,
                warned: false,
            }),
            None => None,
        };
        let ctl_listener = bind_socket(dir, CONTROL_SOCKET)?;
        let attach_listener = bind_socket(dir, ATTACH_SOCKET)?;
        let (mut plumbing, child_stdio) = plumbing(tty, stdin, dir)?;
        let console = plumbing
            .console
            .as_ref()
            .map(|_| console_arg(dir, &runtime_cfg))
            .transpose()?;
        let (console, _console_link) = match console {
            Some((p, l)) => (Some(p), l),
            None => (None, None),
        };
        let pid_file = dir.join(CONTAINER_PID_FILE);
        let _ = fs::remove_file(&pid_file);
        let created = match mode {
            Mode::Container => runtime.create(
                &id,
                CreateOptions {
                    bundle: &bundle,
                    pid_file: &pid_file,
                    console_socket: console.as_deref(),
                    stdio: child_stdio,
                },
            ),
            Mode::Exec => runtime.exec(
                &id,
                ExecOptions {
                    process: &dir.join(PROCESS_FILE),
                    pid_file: &pid_file,
                    console_socket: console.as_deref(),
                    stdio: child_stdio,
                },
            ),
        };
        let cleanup = |rt: &dyn OciRuntime| {
            for s in [CONTROL_SOCKET, ATTACH_SOCKET, CONSOLE_SOCKET] {
                let _ = fs::remove_file(dir.join(s));
            }
            if mode == Mode::Container {
                let _ = rt.delete(&id, true);
            }
        };
        let pid = match created {
            Ok(pid) => pid,
            Err(e) => {
                cleanup(&*runtime);
                return Err(e.to_string());
            }
        };
        if let Err(e) = plumbing.receive_console(dir, stdin) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            cleanup(&*runtime);
            return Err(e);
        }
        // runc and the embedded exec (runtime::join) size the pty from
        // `consoleSize` before the program runs; libcontainer's create does
        // not, so set it here too (before `start`, so before the container's
        // program runs). For an exec process this repeats what is set.
        if let Some(pty) = &plumbing.pty {
            let process_json = match mode {
                Mode::Container => read_json::<serde_json::Value>(&bundle.join("config.json"))
                    .ok()
                    .and_then(|s| s.get("process").cloned()),
                Mode::Exec => read_json::<serde_json::Value>(&dir.join(PROCESS_FILE)).ok(),
            };
            if let Some((w, h)) = process_json.as_ref().and_then(console_size) {
                let _ = sys::set_winsize(pty.as_fd(), w, h);
            }
        }
        let oom = match mode {
            Mode::Container => OomWatch::for_pid(pid),
            Mode::Exec => None,
        };
        Ok(Monitor {
            mode,
            dir: dir.to_path_buf(),
            id,
            bundle,
            runtime_cfg,
            runtime,
            shim_pid,
            pid,
            status: match mode {
                Mode::Container => Status::Created,
                Mode::Exec => Status::Running,
            },
            close_stdin_on_eof: stdin_once,
            sigfd,
            ctl_listener,
            attach_listener,
            outputs: plumbing.outputs,
            stdin: plumbing.stdin,
            pty: plumbing.pty,
            log,
            attach: BTreeMap::new(),
            ctl: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_id: 1,
            oom,
            reaped: None,
            exit: None,
            attach_deadline: attach_timeout.map(|t| Instant::now() + t),
            had_attacher: false,
            linger_until: None,
            exec_seq: 0,
            trim_at: None,
        })
    }

    fn run(&mut self) {
        sys::trim_working_set();
        loop {
            self.progress();
            if self.trim_at.is_some_and(|t| Instant::now() >= t) {
                self.trim_at = None;
                sys::trim_working_set();
            }
            if self.done() {
                break;
            }
            let timeout = self.poll_timeout();
            let ready = match self.poll_once(timeout) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("crust-shim: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            for (tok, flags) in ready {
                self.dispatch(tok, flags);
            }
        }
    }

    fn done(&self) -> bool {
        if self.exit.is_none() || !self.jobs.is_empty() {
            return false;
        }
        let flushed = self
            .attach
            .values()
            .all(|c| c.conn.pending() == 0 || c.conn.dead)
            && self
                .ctl
                .values()
                .all(|c| c.conn.pending() == 0 || c.conn.dead);
        flushed || self.linger_until.is_some_and(|t| Instant::now() >= t)
    }

    fn poll_timeout(&self) -> PollTimeout {
        let mut next: Option<Instant> = match (self.linger_until, self.trim_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for j in self.jobs.values() {
            if j.status.is_none() && !j.timed_out {
                consider(j.deadline);
            }
        }
        if self.mode == Mode::Exec && !self.had_attacher && self.exit.is_none() {
            consider(self.attach_deadline);
        }
        match next {
            None => PollTimeout::NONE,
            Some(t) => {
                let ms = t.saturating_duration_since(Instant::now()).as_millis() + 1;
                PollTimeout::try_from(ms.min(60_000) as i32).unwrap_or(PollTimeout::MAX)
            }
        }
    }

    /// One poll(2); returns the ready entries.
    fn poll_once(&self, timeout: PollTimeout) -> io::Result<Vec<(Tok, PollFlags)>> {
        let mut entries: Vec<(BorrowedFd<'_>, PollFlags, Tok)> = Vec::new();
        let pin = PollFlags::POLLIN;
        let pout = PollFlags::POLLOUT;
        entries.push((self.sigfd.as_fd(), pin, Tok::Signal));
        if self.exit.is_none() {
            entries.push((self.ctl_listener.as_fd(), pin, Tok::CtlListen));
            entries.push((self.attach_listener.as_fd(), pin, Tok::AttachListen));
        }
        let max_attach_pending = self
            .attach
            .values()
            .map(|c| c.conn.pending())
            .max()
            .unwrap_or(0);
        let read_outputs = match self.mode {
            Mode::Container => true,
            // Nothing is read before a client is there to get it.
            Mode::Exec => !self.attach.is_empty() && max_attach_pending < BACKPRESSURE,
        };
        if read_outputs && self.exit.is_none() {
            for (i, o) in self.outputs.iter().enumerate() {
                if let Some(f) = &o.file {
                    entries.push((f.as_fd(), pin, Tok::Output(i)));
                }
            }
        }
        let stdin_room = match &self.stdin {
            Some(s) => {
                if let (Some(f), false) = (&s.file, s.buf.is_empty()) {
                    entries.push((f.as_fd(), pout, Tok::Stdin));
                }
                s.buf.len() < STDIN_HIGH_WATER
            }
            None => true,
        };
        for (id, c) in &self.attach {
            let mut ev = PollFlags::empty();
            if !c.conn.eof && stdin_room {
                ev |= pin;
            }
            if c.conn.pending() > 0 {
                ev |= pout;
            }
            entries.push((c.conn.sock.as_fd(), ev, Tok::Attach(*id)));
        }
        for (id, c) in &self.ctl {
            let mut ev = PollFlags::empty();
            if !c.conn.eof && c.waiting == Waiting::No {
                ev |= pin;
            }
            if c.conn.pending() > 0 {
                ev |= pout;
            }
            entries.push((c.conn.sock.as_fd(), ev, Tok::Ctl(*id)));
        }
        for (id, j) in &self.jobs {
            let pending = self.ctl.get(&j.client).map_or(0, |c| c.conn.pending());
            if pending >= BACKPRESSURE {
                continue;
            }
            for (i, o) in j.outs.iter().enumerate() {
                if let Some(f) = o {
                    entries.push((f.as_fd(), pin, Tok::JobOut(*id, i)));
                }
            }
        }
        let mut fds: Vec<PollFd<'_>> = entries
            .iter()
            .map(|(fd, ev, _)| PollFd::new(*fd, *ev))
            .collect();
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
        Ok(fds
            .iter()
            .zip(entries.iter())
            .filter_map(|(p, (_, _, tok))| p.revents().filter(|r| !r.is_empty()).map(|r| (*tok, r)))
            .collect())
    }

    fn dispatch(&mut self, tok: Tok, flags: PollFlags) {
        match tok {
            Tok::Signal => self.on_signal(),
            Tok::CtlListen => self.accept_ctl(),
            Tok::AttachListen => self.accept_attach(),
            Tok::Output(i) => self.read_output(i, false),
            Tok::Stdin => {
                if let Some(s) = self.stdin.as_mut() {
                    s.flush();
                }
            }
            Tok::Ctl(id) => self.on_ctl(id, flags),
            Tok::Attach(id) => self.on_attach(id, flags),
            Tok::JobOut(id, i) => self.read_job(id, i, false),
        }
    }

    // ---- children -------------------------------------------------------

    fn on_signal(&mut self) {
        while let Ok(Some(_)) = self.sigfd.read_signal() {}
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(st) => {
                    let Some(pid) = st.pid() else { continue };
                    if !matches!(st, WaitStatus::Exited(..) | WaitStatus::Signaled(..)) {
                        continue;
                    }
                    self.on_reaped(pid.as_raw(), st);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
    }

    fn on_reaped(&mut self, pid: i32, st: WaitStatus) {
        if pid == self.pid && self.reaped.is_none() && self.exit.is_none() {
            self.reaped = Some((st, SystemTime::now()));
            return;
        }
        if let Some(j) = self.jobs.values_mut().find(|j| j.pid == pid) {
            j.status = Some(st);
        }
    }

    /// Timers and state changes after each round of events.
    fn progress(&mut self) {
        let now = Instant::now();
        // Exec-sync timeouts and completions.
        let ids: Vec<u64> = self.jobs.keys().copied().collect();
        for id in ids {
            let Some(j) = self.jobs.get_mut(&id) else {
                continue;
            };
            if j.status.is_none() && !j.timed_out && j.deadline.is_some_and(|d| now >= d) {
                j.timed_out = true;
                let _ = kill(Pid::from_raw(j.pid), Signal::SIGKILL);
            }
            if j.status.is_some() {
                self.finish_job(id);
            }
        }
        if self.mode == Mode::Exec && self.exit.is_none() {
            let expired = self.attach_deadline.is_some_and(|d| now >= d);
            if !self.had_attacher && expired && self.reaped.is_none() {
                eprintln!("crust-shim: no client attached in time, killing the exec process");
                let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
                self.attach_deadline = None;
            }
            if self.reaped.is_some()
                && (!self.attach.is_empty()
                    || self.had_attacher
                    || expired
                    || self.attach_deadline.is_none())
            {
                self.finalize();
            }
        } else if self.reaped.is_some() && self.exit.is_none() {
            self.finalize();
        }
        // Drop dead or finished connections.
        let dead: Vec<u64> = self
            .attach
            .iter()
            .filter(|(_, c)| c.conn.dead)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.drop_attach(id);
        }
        let dead: Vec<u64> = self
            .ctl
            .iter()
            .filter(|(_, c)| {
                c.conn.dead || (c.conn.eof && c.waiting == Waiting::No && c.conn.pending() == 0)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            if let Some(c) = self.ctl.remove(&id)
                && let Waiting::Job(j) = c.waiting
                && let Some(job) = self.jobs.get(&j)
                && job.status.is_none()
            {
                // Nobody wants the result any more.
                let _ = kill(Pid::from_raw(job.pid), Signal::SIGKILL);
            }
        }
    }

    /// The process has exited: drain, record, tell everyone, clean up.
    fn finalize(&mut self) {
        let Some((st, at)) = self.reaped.take() else {
            return;
        };
        for i in 0..self.outputs.len() {
            self.read_output(i, true);
        }
        let ts = logfmt::format_timestamp(SystemTime::now());
        let mut out = Vec::new();
        for o in &mut self.outputs {
            o.splitter.finish(&ts, &mut out);
            o.file = None;
        }
        if let Some(log) = self.log.as_mut() {
            log.write(&out);
        }
        self.stdin = None;
        let oom = self.oom.as_ref().is_some_and(|w| w.oom_killed());
        let info = exit::exit_info(self.pid, &st, at, oom);
        match serde_json::to_vec(&info) {
            Ok(data) => {
                if let Err(e) = exit::write_atomic(&self.dir, EXIT_FILE, &data) {
                    eprintln!("crust-shim: writing {EXIT_FILE}: {e}");
                }
            }
            Err(e) => eprintln!("crust-shim: encoding the exit: {e}"),
        }
        self.status = Status::Stopped;
        self.exit = Some(info.clone());
        // Wait requests.
        let body =
            serde_json::to_vec(&Response::Ok(Reply::Exited(info.clone()))).unwrap_or_default();
        for c in self.ctl.values_mut() {
            if c.waiting == Waiting::Exit {
                c.conn.queue_message(&body);
                c.waiting = Waiting::No;
                c.conn.flush();
            }
        }
        let payload = serde_json::to_vec(&info).unwrap_or_default();
        for c in self.attach.values_mut() {
            c.conn.queue_frame(STREAM_EXIT, &payload);
            c.conn.flush();
        }
        for j in self.jobs.values() {
            if j.status.is_none() {
                let _ = kill(Pid::from_raw(j.pid), Signal::SIGKILL);
            }
        }
        if self.mode == Mode::Container
            && let Err(e) = self.runtime.delete(&self.id, true)
        {
            eprintln!("crust-shim: {e}");
        }
        // No new clients: the sockets go, exit.json stays.
        for s in [CONTROL_SOCKET, ATTACH_SOCKET] {
            let _ = fs::remove_file(self.dir.join(s));
        }
        self.linger_until = Some(Instant::now() + LINGER);
    }

    fn cleanup_files(&self) {
        for s in [CONTROL_SOCKET, ATTACH_SOCKET, CONSOLE_SOCKET, SHIM_PID_FILE] {
            let _ = fs::remove_file(self.dir.join(s));
        }
    }

    // ---- container output ----------------------------------------------

    /// Reads output `i`. `drain`: until nothing is left (after the exit).
    fn read_output(&mut self, i: usize, drain: bool) {
        let mut buf = vec![0u8; READ_CHUNK];
        // A few chunks per wake-up keeps the loop fair; a drain is bounded
        // too, in case a process outside the container keeps writing.
        let mut rounds = if drain { 256 } else { 4 };
        while rounds > 0 {
            rounds -= 1;
            let Some(f) = self.outputs[i].file.as_mut() else {
                return;
            };
            match f.read(&mut buf) {
                Ok(0) => return self.output_eof(i),
                Ok(n) => self.on_output(i, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EIO: the pty's other side is closed.
                Err(_) => return self.output_eof(i),
            }
        }
    }

    fn on_output(&mut self, i: usize, data: &[u8]) {
        let o = &mut self.outputs[i];
        if let Some(log) = self.log.as_mut() {
            let ts = logfmt::format_timestamp(SystemTime::now());
            let mut out = Vec::with_capacity(data.len() + 64);
            o.splitter.push(data, &ts, &mut out);
            log.write(&out);
        }
        let stream = match o.stream {
            Stream::Stdout => STREAM_STDOUT,
            Stream::Stderr => STREAM_STDERR,
        };
        for c in self.attach.values_mut() {
            c.conn.queue_frame(stream, data);
            c.conn.flush();
            if self.mode == Mode::Container && c.conn.pending() > ATTACH_SLOW_LIMIT {
                eprintln!("crust-shim: dropping an attach client that does not keep up");
                c.conn.dead = true;
            }
        }
    }

    fn output_eof(&mut self, i: usize) {
        let o = &mut self.outputs[i];
        o.file = None;
        if let Some(log) = self.log.as_mut() {
            let mut out = Vec::new();
            o.splitter
                .finish(&logfmt::format_timestamp(SystemTime::now()), &mut out);
            log.write(&out);
        }
    }

    // ---- attach -----------------------------------------------------------

    fn accept_attach(&mut self) {
        while let Ok((sock, _)) = self.attach_listener.accept() {
            let Ok(conn) = Conn::new(sock) else { continue };
            let id = self.next_id;
            self.next_id += 1;
            self.attach.insert(
                id,
                AttachClient {
                    conn,
                    had_stdin: false,
                    stdin_done: false,
                },
            );
            self.had_attacher = true;
        }
    }

    fn on_attach(&mut self, id: u64, flags: PollFlags) {
        let Some(c) = self.attach.get_mut(&id) else {
            return;
        };
        if flags.contains(PollFlags::POLLOUT) {
            c.conn.flush();
        }
        if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            c.conn.fill(MAX_FRAME + 5 + 16 * 1024);
        }
        let mut stdin_data: Vec<u8> = Vec::new();
        let mut closed_stdin = false;
        let mut resize = None;
        loop {
            match frame::take_frame(&mut c.conn.rbuf) {
                Ok(Some((STREAM_STDIN, payload))) => {
                    if c.stdin_done {
                        continue;
                    }
                    c.had_stdin = true;
                    if payload.is_empty() {
                        c.stdin_done = true;
                        closed_stdin = true;
                    } else {
                        stdin_data.extend_from_slice(&payload);
                    }
                }
                Ok(Some((STREAM_STDIN_OPEN, _))) => {
                    c.had_stdin = true;
                }
                Ok(Some((STREAM_RESIZE, p))) if p.len() == 4 => {
                    resize = Some((
                        u16::from_be_bytes([p[0], p[1]]),
                        u16::from_be_bytes([p[2], p[3]]),
                    ));
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    c.conn.dead = true;
                    break;
                }
            }
        }
        // The client's input ended (it closed or half-closed): no more
        // stdin from it. It is gone only on a hang-up; a half-closed client
        // still gets output.
        if c.conn.eof && c.had_stdin && !c.stdin_done {
            c.stdin_done = true;
            closed_stdin = true;
        }
        if c.conn.eof && flags.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
            c.conn.dead = true;
        }
        if !stdin_data.is_empty()
            && let Some(s) = self.stdin.as_mut()
            && s.file.is_some()
            && !s.close_when_flushed
        {
            s.buf.extend_from_slice(&stdin_data);
            s.flush();
        }
        if closed_stdin {
            self.client_stdin_closed();
        }
        if let Some((w, h)) = resize {
            let _ = self.resize(w, h);
        }
    }

    fn drop_attach(&mut self, id: u64) {
        let Some(c) = self.attach.remove(&id) else {
            return;
        };
        self.trim_at = Some(Instant::now() + TRIM_AFTER);
        if c.had_stdin && !c.stdin_done {
            self.client_stdin_closed();
        }
        if self.mode == Mode::Exec
            && self.attach.is_empty()
            && self.exit.is_none()
            && self.reaped.is_none()
        {
            // As containerd: the exec stream is gone, so is the process.
            eprintln!("crust-shim: last client detached, killing the exec process");
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }

    fn client_stdin_closed(&mut self) {
        if !self.close_stdin_on_eof {
            return;
        }
        if let Some(s) = self.stdin.as_mut() {
            s.close_when_flushed = true;
            s.flush();
        }
    }

    fn resize(&self, width: u16, height: u16) -> Result<(), ReqError> {
        let pty = self
            .pty
            .as_ref()
            .ok_or((ErrorKind::FailedPrecondition, "no tty".to_string()))?;
        sys::set_winsize(pty.as_fd(), width, height)
            .map_err(|e| (ErrorKind::Internal, format!("resize: {e}")))
    }

    // ---- control ----------------------------------------------------------

    fn accept_ctl(&mut self) {
        while let Ok((sock, _)) = self.ctl_listener.accept() {
            let Ok(conn) = Conn::new(sock) else { continue };
            let id = self.next_id;
            self.next_id += 1;
            self.ctl.insert(
                id,
                CtlClient {
                    conn,
                    waiting: Waiting::No,
                },
            );
        }
    }

    fn on_ctl(&mut self, id: u64, flags: PollFlags) {
        let Some(c) = self.ctl.get_mut(&id) else {
            return;
        };
        if flags.contains(PollFlags::POLLOUT) {
            c.conn.flush();
        }
        if c.waiting != Waiting::No {
            // Not reading now; a hang-up (always reported) means nobody is
            // left for the answer.
            if flags.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                c.conn.dead = true;
            }
            return;
        }
        if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            c.conn.fill(MAX_MESSAGE + 4);
        }
        loop {
            let Some(c) = self.ctl.get_mut(&id) else {
                return;
            };
            if c.waiting != Waiting::No {
                return;
            }
            let body = match frame::take_message(&mut c.conn.rbuf) {
                Ok(Some(b)) => b,
                Ok(None) => return,
                Err(_) => {
                    c.conn.dead = true;
                    return;
                }
            };
            self.trim_at = Some(Instant::now() + TRIM_AFTER);
            let resp = match serde_json::from_slice::<Request>(&body) {
                Ok(req) => self.handle(id, req),
                Err(e) => Some(Err((
                    ErrorKind::InvalidArgument,
                    format!("bad request: {e}"),
                ))),
            };
            if let Some(resp) = resp {
                let resp = match resp {
                    Ok(r) => Response::Ok(r),
                    Err((kind, message)) => Response::Err(ErrorReply { kind, message }),
                };
                self.send(id, &resp);
            }
        }
    }

    fn send(&mut self, id: u64, resp: &Response) {
        if let Some(c) = self.ctl.get_mut(&id) {
            let body = serde_json::to_vec(resp).unwrap_or_default();
            c.conn.queue_message(&body);
            c.conn.flush();
        }
    }

    /// `None`: answered later.
    fn handle(&mut self, client: u64, req: Request) -> Option<Result<Reply, ReqError>> {
        let stopped = || {
            (
                ErrorKind::FailedPrecondition,
                "the process has exited".to_string(),
            )
        };
        let container_only = |m: &Monitor| {
            if m.mode == Mode::Container {
                Ok(())
            } else {
                Err((
                    ErrorKind::InvalidArgument,
                    "not for an exec session".to_string(),
                ))
            }
        };
        Some(match req {
            Request::State => Ok(Reply::State(State {
                shim_pid: self.shim_pid,
                pid: self.pid,
                status: self.status,
                exit: self.exit.clone(),
            })),
            Request::Wait => match &self.exit {
                Some(e) => Ok(Reply::Exited(e.clone())),
                None => {
                    self.ctl.get_mut(&client)?.waiting = Waiting::Exit;
                    return None;
                }
            },
            Request::Start => container_only(self).and_then(|_| match self.status {
                Status::Created if self.reaped.is_none() => self
                    .runtime
                    .start(&self.id)
                    .map(|_| {
                        self.status = Status::Running;
                        Reply::Done
                    })
                    .map_err(|e| (ErrorKind::Runtime, e.to_string())),
                Status::Running => Err((ErrorKind::FailedPrecondition, "already started".into())),
                _ => Err(stopped()),
            }),
            Request::Kill { signal, all } => {
                if self.exit.is_some() || self.reaped.is_some() {
                    // Idempotent: it is already gone.
                    return Some(Ok(Reply::Done));
                }
                let sig = match Signal::try_from(signal) {
                    Ok(s) => s,
                    Err(_) => {
                        return Some(Err((
                            ErrorKind::InvalidArgument,
                            format!("bad signal {signal}"),
                        )));
                    }
                };
                if all && self.mode == Mode::Container {
                    self.runtime
                        .kill(&self.id, signal, true)
                        .map(|_| Reply::Done)
                        .map_err(|e| (ErrorKind::Runtime, e.to_string()))
                } else {
                    // The process is our child (we are its subreaper) and not
                    // yet reaped, so its pid cannot have been reused.
                    kill(Pid::from_raw(self.pid), sig)
                        .map(|_| Reply::Done)
                        .map_err(|e| (ErrorKind::Internal, format!("kill: {e}")))
                }
            }
            Request::Update { resources } => container_only(self).and_then(|_| {
                if self.exit.is_some() {
                    return Err(stopped());
                }
                let name = "update-resources.json";
                let path = self.dir.join(name);
                let data = serde_json::to_vec(&resources)
                    .map_err(|e| (ErrorKind::InvalidArgument, e.to_string()))?;
                fs::write(&path, data).map_err(|e| (ErrorKind::Internal, e.to_string()))?;
                let r = self.runtime.update(&self.id, &path);
                let _ = fs::remove_file(&path);
                r.map(|_| Reply::Done)
                    .map_err(|e| (ErrorKind::Runtime, e.to_string()))
            }),
            Request::ReopenLog => match self.log.as_mut() {
                Some(l) => l
                    .reopen()
                    .map(|_| Reply::Done)
                    .map_err(|e| (ErrorKind::Internal, format!("reopening the log: {e}"))),
                None => Ok(Reply::Done),
            },
            Request::Resize { width, height } => self.resize(width, height).map(|_| Reply::Done),
            Request::ExecSync(req) => {
                match container_only(self).and_then(|_| self.start_job(client, req)) {
                    Ok(pid) => {
                        self.send(client, &Response::Ok(Reply::ExecSyncStarted { pid }));
                        return None;
                    }
                    Err(e) => Err(e),
                }
            }
            Request::Exec(req) => container_only(self).and_then(|_| self.start_exec_session(req)),
        })
    }

    // ---- exec-sync --------------------------------------------------------

    fn start_job(&mut self, client: u64, req: ExecRequest) -> Result<i32, ReqError> {
        if self.status != Status::Running || self.reaped.is_some() {
            return Err((
                ErrorKind::FailedPrecondition,
                "the container is not running".into(),
            ));
        }
        if req.tty || req.stdin {
            return Err((
                ErrorKind::InvalidArgument,
                "exec-sync has neither tty nor stdin".into(),
            ));
        }
        let process = build_process(&self.bundle, &req, false)
            .map_err(|e| (ErrorKind::InvalidArgument, e))?;
        self.exec_seq += 1;
        let pfile = self.dir.join(format!("exec-sync-{}.json", self.exec_seq));
        let pidfile = self.dir.join(format!("exec-sync-{}.pid", self.exec_seq));
        fs::write(&pfile, serde_json::to_vec(&process).unwrap_or_default())
            .map_err(|e| (ErrorKind::Internal, e.to_string()))?;
        let (out_r, out_w) = pipe().map_err(|e| (ErrorKind::Internal, e))?;
        let (err_r, err_w) = pipe().map_err(|e| (ErrorKind::Internal, e))?;
        let r = self.runtime.exec(
            &self.id,
            ExecOptions {
                process: &pfile,
                pid_file: &pidfile,
                console_socket: None,
                stdio: Stdio {
                    stdin: None,
                    stdout: Some(out_w),
                    stderr: Some(err_w),
                },
            },
        );
        let _ = fs::remove_file(&pfile);
        let _ = fs::remove_file(&pidfile);
        let pid = r.map_err(|e| (ErrorKind::Runtime, e.to_string()))?;
        let jid = self.next_id;
        self.next_id += 1;
        self.jobs.insert(
            jid,
            Job {
                client,
                pid,
                outs: [Some(out_r), Some(err_r)],
                sent: [0, 0],
                truncated: [false, false],
                deadline: (req.timeout_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(req.timeout_ms)),
                status: None,
                timed_out: false,
            },
        );
        if let Some(c) = self.ctl.get_mut(&client) {
            c.waiting = Waiting::Job(jid);
        }
        Ok(pid)
    }

    fn read_job(&mut self, jid: u64, i: usize, drain: bool) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut rounds = if drain { 256 } else { 4 };
        while rounds > 0 {
            rounds -= 1;
            let Some(j) = self.jobs.get_mut(&jid) else {
                return;
            };
            let Some(f) = j.outs[i].as_mut() else { return };
            let n = match f.read(&mut buf) {
                Ok(0) => {
                    j.outs[i] = None;
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    j.outs[i] = None;
                    return;
                }
            };
            let room = EXEC_SYNC_OUTPUT_CAP - j.sent[i];
            let take = n.min(room);
            if take < n {
                j.truncated[i] = true;
            }
            if take == 0 {
                continue;
            }
            j.sent[i] += take;
            let client = j.client;
            if let Some(c) = self.ctl.get_mut(&client) {
                c.conn.queue_frame(
                    if i == 0 { STREAM_STDOUT } else { STREAM_STDERR },
                    &buf[..take],
                );
                c.conn.flush();
                if !drain && c.conn.pending() >= BACKPRESSURE {
                    return;
                }
            }
        }
    }

    fn finish_job(&mut self, jid: u64) {
        // The process is gone: what it wrote is in the pipes.
        self.read_job(jid, 0, true);
        self.read_job(jid, 1, true);
        let Some(j) = self.jobs.remove(&jid) else {
            return;
        };
        let (exit_code, _) = exit::exit_code(j.status.as_ref().unwrap_or(&WaitStatus::StillAlive));
        let result = ExecSyncResult {
            exit_code,
            timed_out: j.timed_out,
            stdout_truncated: j.truncated[0],
            stderr_truncated: j.truncated[1],
            error: None,
        };
        self.trim_at = Some(Instant::now() + TRIM_AFTER);
        if let Some(c) = self.ctl.get_mut(&j.client) {
            c.conn.queue_frame(
                STREAM_EXIT,
                &serde_json::to_vec(&result).unwrap_or_default(),
            );
            c.conn.flush();
            c.waiting = Waiting::No;
        }
    }

    // ---- exec sessions ----------------------------------------------------

    fn start_exec_session(&mut self, req: ExecRequest) -> Result<Reply, ReqError> {
        if self.status != Status::Running || self.reaped.is_some() {
            return Err((
                ErrorKind::FailedPrecondition,
                "the container is not running".into(),
            ));
        }
        if !valid_exec_id(&req.exec_id) {
            return Err((
                ErrorKind::InvalidArgument,
                format!("invalid exec id {:?}", req.exec_id),
            ));
        }
        let internal = |e: io::Error| (ErrorKind::Internal, e.to_string());
        let parent = self.dir.join(EXEC_DIR);
        fs::create_dir_all(&parent).map_err(internal)?;
        let sdir = parent.join(&req.exec_id);
        match fs::DirBuilder::new().mode(0o700).create(&sdir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err((
                    ErrorKind::InvalidArgument,
                    format!("exec id {} is in use", req.exec_id),
                ));
            }
            Err(e) => return Err(internal(e)),
        }
        let r = self.spawn_exec_session(&sdir, &req);
        if r.is_err() {
            let _ = fs::remove_dir_all(&sdir);
        }
        r
    }

    fn spawn_exec_session(&mut self, sdir: &Path, req: &ExecRequest) -> Result<Reply, ReqError> {
        let internal = |e: String| (ErrorKind::Internal, e);
        let process = build_process(&self.bundle, req, req.tty)
            .map_err(|e| (ErrorKind::InvalidArgument, e))?;
        fs::write(
            sdir.join(PROCESS_FILE),
            serde_json::to_vec(&process).unwrap_or_default(),
        )
        .map_err(|e| internal(e.to_string()))?;
        let cfg = ExecConfig {
            container_id: self.id.clone(),
            runtime: self.runtime_cfg.clone(),
            tty: req.tty,
            stdin: req.stdin,
            attach_timeout_ms: req.timeout_ms,
        };
        fs::write(
            sdir.join(EXEC_CONFIG_FILE),
            serde_json::to_vec(&cfg).unwrap_or_default(),
        )
        .map_err(|e| internal(e.to_string()))?;
        // The same binary as ours, even if the file was replaced since.
        let mut child = Command::new("/proc/self/exe")
            .arg("exec")
            .arg(sdir)
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| internal(format!("starting the exec monitor: {e}")))?;
        // It stays our child; the SIGCHLD handler reaps it when it ends.
        let out = child
            .stdout
            .take()
            .ok_or_else(|| internal("no pipe".into()))?;
        let line =
            crate::client::read_line_timeout(out.into(), EXEC_START_TIMEOUT).map_err(|e| {
                let _ = child.kill();
                internal(format!("exec monitor: {e}"))
            })?;
        match serde_json::from_slice::<StartupResult>(&line) {
            Ok(StartupResult::Ok { shim_pid, pid }) => Ok(Reply::ExecStarted(ExecStarted {
                exec_id: req.exec_id.clone(),
                pid,
                shim_pid,
                state_dir: sdir.to_path_buf(),
            })),
            Ok(StartupResult::Err { message }) => Err((ErrorKind::Runtime, message)),
            Err(e) => Err(internal(format!(
                "exec monitor answered {:?}: {e}",
                String::from_utf8_lossy(&line)
            ))),
        }
    }
}
