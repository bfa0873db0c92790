//! Starting a monitor process and finding it again: the `crust-shim`
//! command line, pid files and `/proc`. Used by the client; blocking,
//! std only. Nothing forks: a monitor is started with
//! `std::process::Command` (posix_spawn / vfork + exec) and a clean
//! environment, from the sealed copy of its binary ([`ShimBinary`]).

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::exit_file::write_replace_volatile;
use crate::messages::*;
use crate::shim_binary::ShimBinary;
use crate::startup;

/// Arguments of a monitor spawn.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// The `crust-shim` binary (its sealed copy).
    pub shim_binary: ShimBinary,
    /// The container's state directory (created 0700 if missing).
    pub state_dir: PathBuf,
    pub config: ShimConfig,
    /// How long to wait for the container to be created.
    pub timeout: Duration,
}

static CHILD_NOFILE: OnceLock<u64> = OnceLock::new();

/// The soft limit on open files that monitors (and so containers) get: a
/// daemon that raised its own for its sockets passes the node's on, so
/// containers see the limit they would see anywhere else.
pub fn set_monitor_open_files_limit(soft: u64) {
    let _ = CHILD_NOFILE.set(soft);
}

/// Pids of a started or found monitor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pids {
    pub shim_pid: i32,
    pub pid: i32,
}

/// Starts a monitor for a new container and waits until the container is
/// created: writes `shim.json`, runs `crust-shim container DIR` with an
/// empty environment (PATH only), reads the start-up result from its
/// stdout. The monitor has detached (setsid + fork) by the time this
/// returns.
pub(crate) fn spawn(opts: &SpawnOptions) -> Result<Pids> {
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
    // Read once, by the monitor about to start: no fsync (see
    // `write_replace_volatile`).
    write_replace_volatile(&opts.state_dir, CONFIG_FILE, &cfg)?;
    let _ = fs::remove_file(opts.state_dir.join(EXIT_FILE));
    let mut cmd = opts.shim_binary.command();
    cmd.arg("container")
        .arg(&opts.state_dir)
        .env_clear()
        .env("PATH", DEFAULT_PATH);
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
    let line = match startup::read_line(out.into(), opts.timeout) {
        Ok(l) => l,
        Err(e) => {
            // Do not leave a monitor behind that we gave up on.
            if let Ok(pid) = read_pid(&opts.state_dir.join(SHIM_PID_FILE)) {
                let _ = kill_if_shim_of(pid, &opts.state_dir);
            }
            let log = fs::read_to_string(opts.state_dir.join(SHIM_LOG)).unwrap_or_default();
            return Err(Error::Startup(format!("{e}; shim log: {}", log.trim())));
        }
    };
    match startup::parse(&line).map_err(Error::Protocol)? {
        StartupResult::Ok { shim_pid, pid } => Ok(Pids { shim_pid, pid }),
        StartupResult::Err { message } => Err(Error::Startup(message)),
    }
}

/// Finds the monitor of `state_dir` again (after a daemon restart).
/// [`Error::Gone`] if none runs: then its exit file has the exit.
pub(crate) fn find(state_dir: &Path) -> Result<Pids> {
    let shim_pid = match read_pid(&state_dir.join(SHIM_PID_FILE)) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::Gone),
        // Written without an fsync (`write_replace_volatile`): empty or
        // torn only after the machine went down, which no monitor survives.
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(Error::Gone),
        Err(e) => return Err(e.into()),
    };
    if !is_shim_of(shim_pid, state_dir) {
        return Err(Error::Gone);
    }
    let pid = read_pid(&state_dir.join(CONTAINER_PID_FILE)).unwrap_or(0);
    Ok(Pids { shim_pid, pid })
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

/// SIGKILLs the monitor `pid` of `state_dir`, if it still is one.
pub(crate) fn kill_if_shim_of(pid: i32, state_dir: &Path) -> io::Result<()> {
    if is_shim_of(pid, state_dir) {
        crust_linux::process::send_signal(pid, 9)?;
    }
    Ok(())
}

/// The exit record in a state directory, if the process has exited.
pub fn read_exit_file(state_dir: &Path) -> io::Result<Option<ExitInfo>> {
    crate::exit_file::read_exit_file(&state_dir.join(EXIT_FILE))
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

impl ExecSyncOutput {
    pub(crate) fn new() -> Self {
        ExecSyncOutput {
            exit_code: -1,
            timed_out: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
        }
    }

    /// Takes one exec-sync frame; the result once the exit frame came.
    pub(crate) fn take_frame(&mut self, stream: u8, payload: &[u8]) -> Option<Result<()>> {
        let (buf, truncated) = match stream {
            STREAM_STDOUT => (&mut self.stdout, &mut self.stdout_truncated),
            STREAM_STDERR => (&mut self.stderr, &mut self.stderr_truncated),
            STREAM_EXIT => {
                let r: ExecSyncResult = match serde_json::from_slice(payload) {
                    Ok(r) => r,
                    Err(e) => return Some(Err(Error::Protocol(format!("bad exec result: {e}")))),
                };
                self.exit_code = r.exit_code;
                self.timed_out = r.timed_out;
                self.stdout_truncated |= r.stdout_truncated;
                self.stderr_truncated |= r.stderr_truncated;
                return Some(match r.error {
                    Some(message) => Err(Error::Shim {
                        kind: ErrorKind::Runtime,
                        message,
                    }),
                    None => Ok(()),
                });
            }
            _ => return None,
        };
        let room = EXEC_SYNC_OUTPUT_CAP.saturating_sub(buf.len());
        *truncated |= payload.len() > room;
        buf.extend_from_slice(&payload[..payload.len().min(room)]);
        None
    }
}

/// What an attach client receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExitInfo),
}

impl AttachEvent {
    /// The event an attach frame carries; `None` for a stream id this
    /// client does not know (skipped).
    pub(crate) fn from_frame(stream: u8, payload: Vec<u8>) -> Option<io::Result<AttachEvent>> {
        Some(Ok(match stream {
            STREAM_STDOUT => AttachEvent::Stdout(payload),
            STREAM_STDERR => AttachEvent::Stderr(payload),
            STREAM_EXIT => match serde_json::from_slice(&payload) {
                Ok(e) => AttachEvent::Exit(e),
                Err(e) => return Some(Err(io::Error::new(io::ErrorKind::InvalidData, e))),
            },
            _ => return None,
        }))
    }
}

/// The payload of a resize frame.
pub(crate) fn resize_payload(width: u16, height: u16) -> [u8; 4] {
    let mut p = [0u8; 4];
    p[..2].copy_from_slice(&width.to_be_bytes());
    p[2..].copy_from_slice(&height.to_be_bytes());
    p
}

/// `dir/name` as a path a socket can be connected to: the path itself, or
/// through `/proc/self/fd` (with the directory held open meanwhile) when it
/// is too long for a socket address.
pub(crate) fn socket_path(dir: &Path, name: &str) -> io::Result<(PathBuf, Option<fs::File>)> {
    let full = dir.join(name);
    if full.as_os_str().len() < 100 {
        return Ok((full, None));
    }
    use std::os::fd::AsRawFd;
    let d = fs::File::open(dir)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}/{name}", d.as_raw_fd()));
    Ok((short, Some(d)))
}

/// Parses a `Response` body.
pub(crate) fn decode_response(body: &[u8]) -> Result<Reply> {
    match serde_json::from_slice::<Response>(body) {
        Ok(Response::Ok(r)) => Ok(r),
        Ok(Response::Err(ErrorReply { kind, message })) => Err(Error::Shim { kind, message }),
        Err(e) => Err(Error::Protocol(format!("bad response: {e}"))),
    }
}

/// How long a plain request may take before the client gives up.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// How long to wait for an exec-sync: the monitor enforces the request's
/// timeout, this only guards against a monitor that never answers.
pub(crate) fn exec_sync_limit(timeout_ms: u64) -> Option<Duration> {
    match timeout_ms {
        0 => None,
        ms => Some(Duration::from_millis(ms) + CALL_TIMEOUT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_sync_frames_are_capped() {
        let mut o = ExecSyncOutput::new();
        assert!(o.take_frame(STREAM_STDOUT, b"hi").is_none());
        let big = vec![0u8; EXEC_SYNC_OUTPUT_CAP];
        assert!(o.take_frame(STREAM_STDOUT, &big).is_none());
        assert!(o.take_frame(99, b"ignored").is_none());
        assert!(o.take_frame(STREAM_STDERR, b"e").is_none());
        let end = serde_json::to_vec(&ExecSyncResult {
            exit_code: 3,
            timed_out: false,
            stdout_truncated: false,
            stderr_truncated: false,
            error: None,
        })
        .unwrap();
        o.take_frame(STREAM_EXIT, &end).unwrap().unwrap();
        assert_eq!(o.stdout.len(), EXEC_SYNC_OUTPUT_CAP);
        assert!(o.stdout_truncated && !o.stderr_truncated);
        assert_eq!((o.exit_code, &o.stderr[..]), (3, &b"e"[..]));
    }

    /// shim.pid is written without an fsync: after a power loss it may be
    /// empty, and no monitor survived that.
    #[test]
    fn an_empty_or_torn_pid_file_is_no_monitor() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(find(d.path()), Err(Error::Gone)));
        for torn in [&b""[..], b"12\0\0", b"1a"] {
            std::fs::write(d.path().join(SHIM_PID_FILE), torn).unwrap();
            assert!(
                matches!(find(d.path()), Err(Error::Gone)),
                "{:?}",
                String::from_utf8_lossy(torn)
            );
        }
    }

    #[test]
    fn long_socket_paths_go_through_proc() {
        let d = tempfile::tempdir().unwrap();
        let (p, held) = socket_path(d.path(), "ctl.sock").unwrap();
        assert!(held.is_none() && p.ends_with("ctl.sock"));
        let deep = d.path().join("x".repeat(120));
        std::fs::create_dir(&deep).unwrap();
        let (p, held) = socket_path(&deep, "ctl.sock").unwrap();
        assert!(held.is_some() && p.starts_with("/proc/self/fd/"));
    }

    #[test]
    fn responses_decode_to_replies_or_errors() {
        let ok = serde_json::to_vec(&Response::Ok(Reply::Done)).unwrap();
        assert_eq!(decode_response(&ok).unwrap(), Reply::Done);
        let err = serde_json::to_vec(&Response::Err(ErrorReply {
            kind: ErrorKind::FailedPrecondition,
            message: "no".into(),
        }))
        .unwrap();
        assert!(matches!(
            decode_response(&err),
            Err(Error::Shim {
                kind: ErrorKind::FailedPrecondition,
                ..
            })
        ));
        assert!(matches!(decode_response(b"{"), Err(Error::Protocol(_))));
    }
}
