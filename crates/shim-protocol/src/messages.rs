//! Everything the daemon and the monitor agree on: the files in a state
//! directory, the start-up handshake, the control protocol and the attach
//! framing (encoded by [`crate::frame`]).
//!
//! # State directory (one per container, one per exec session)
//!
//! | file              | written by | what                                                     |
//! |-------------------|------------|----------------------------------------------------------|
//! | `shim.json`       | client     | [`ShimConfig`] (container) — read by the monitor at start |
//! | `exec.json`       | monitor    | [`ExecConfig`] (exec session)                            |
//! | `process.json`    | monitor    | the OCI `process` of an exec session                     |
//! | `shim.pid`        | monitor    | pid of the monitor, written atomically before it reports |
//! | `container.pid`   | runtime    | pid of the container's init (or of the exec process)     |
//! | `ctl.sock`        | monitor    | control socket (0600), see [`Request`] / [`Response`]    |
//! | `attach.sock`     | monitor    | attach socket (0600), see [the framing](#attach-framing) |
//! | `console.sock`    | monitor    | transient: receives the pty master from the runtime      |
//! | `exit.json`       | monitor    | [`ExitInfo`], written temp + fsync + rename: the durable record |
//! | `runtime.log`     | runtime    | the OCI CLI's `--log` (JSON lines), errors are read back |
//! | `shim.log`        | monitor    | the monitor's own diagnostics (its stderr)               |
//! | `exec/<id>/`      | monitor    | state directory of exec session `<id>`                   |
//!
//! # Start-up handshake
//!
//! The client writes `shim.json`, runs `crust-shim container <state_dir>` with
//! a clean environment ([`DEFAULT_PATH`] and [`NOFILE_ENV`] only) and a
//! pipe as its stdout. The monitor answers with one
//! line of JSON on that pipe, a [`StartupResult`], once the container is
//! created (or creation failed), then closes the pipe.
//!
//! # Control protocol (`ctl.sock`)
//!
//! Messages are a big-endian `u32` length followed by that many bytes of JSON.
//! The client sends a [`Request`], the monitor answers with a [`Response`].
//! Several requests may follow each other on one connection. Two requests
//! answer late: [`Request::Wait`] (when the container has exited) and
//! [`Request::ExecSync`], which after its `Response` streams attach frames
//! ([`STREAM_STDOUT`], [`STREAM_STDERR`]) and ends with one [`STREAM_EXIT`]
//! frame whose payload is an [`ExecSyncResult`] in JSON.
//!
//! # Attach framing
//!
//! Both directions carry frames: 1 byte stream id, big-endian `u32` payload
//! length, payload. From the client: [`STREAM_STDIN`] (data; an empty payload
//! closes the client's stdin, as does the end of the client's connection),
//! [`STREAM_STDIN_OPEN`] (declares a stdin client up front) and
//! [`STREAM_RESIZE`] (`u16` width, `u16` height, big-endian). From the monitor: [`STREAM_STDOUT`], [`STREAM_STDERR`]
//! and, last, [`STREAM_EXIT`] with an [`ExitInfo`] in JSON. A tty's output is
//! all [`STREAM_STDOUT`]. Several clients may attach at once; each gets all
//! output produced while it is attached. With `stdin_once` (always for an
//! exec session) the process's stdin is closed when the first client that
//! had stdin (sent stdin data or declared it) closes its stdin or detaches.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// File names inside a state directory.
pub const CONFIG_FILE: &str = "shim.json";
pub const EXEC_CONFIG_FILE: &str = "exec.json";
pub const PROCESS_FILE: &str = "process.json";
pub const SHIM_PID_FILE: &str = "shim.pid";
pub const CONTAINER_PID_FILE: &str = "container.pid";
pub const CONTROL_SOCKET: &str = "ctl.sock";
pub const ATTACH_SOCKET: &str = "attach.sock";
pub const CONSOLE_SOCKET: &str = "console.sock";
pub const EXIT_FILE: &str = "exit.json";
pub const RUNTIME_LOG: &str = "runtime.log";
pub const SHIM_LOG: &str = "shim.log";
pub const EXEC_DIR: &str = "exec";

/// The PATH a monitor runs with, and gives the OCI runtime (hooks may need
/// one).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The variable that gives a monitor the soft RLIMIT_NOFILE to run with
/// (and to pass on to the container).
pub const NOFILE_ENV: &str = "CRUST_SHIM_NOFILE";

/// Attach stream ids (see the module docs).
pub const STREAM_STDIN: u8 = 0;
pub const STREAM_STDOUT: u8 = 1;
pub const STREAM_STDERR: u8 = 2;
pub const STREAM_EXIT: u8 = 3;
pub const STREAM_RESIZE: u8 = 4;
/// From the client, empty: "I have stdin" (for `stdin_once`, before any
/// stdin data was sent).
pub const STREAM_STDIN_OPEN: u8 = 5;

/// Largest control message either side accepts.
pub const MAX_MESSAGE: usize = 4 << 20;
/// Largest attach frame payload either side accepts.
pub const MAX_FRAME: usize = 1 << 20;
/// ExecSync output cap per stream (CRI: 16 MiB).
pub const EXEC_SYNC_OUTPUT_CAP: usize = 16 << 20;

/// How the monitor runs the OCI runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RuntimeConfig {
    /// youki's libcontainer, run in a short-lived child of the monitor.
    Embedded {
        /// libcontainer's state root (like `runc --root`).
        root: PathBuf,
        /// Use the systemd cgroup driver.
        #[serde(default)]
        systemd_cgroup: bool,
    },
    /// An OCI runtime binary with runc's command line (runc, crun, youki).
    Cli {
        /// Absolute path of the binary.
        path: PathBuf,
        /// `--root` for this runtime handler.
        root: PathBuf,
        /// Pass `--systemd-cgroup`.
        #[serde(default)]
        systemd_cgroup: bool,
    },
}

/// What the client hands the container monitor in `shim.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShimConfig {
    /// The container's id as the OCI runtime knows it.
    pub id: String,
    /// Absolute path of the OCI bundle (holds `config.json`).
    pub bundle: PathBuf,
    pub runtime: RuntimeConfig,
    /// CRI log file (absolute); `None` writes no log.
    #[serde(default)]
    pub log_path: Option<PathBuf>,
    /// The pod's log directory, which `log_path` lies below: from it down
    /// no symlink is followed when the log is opened or reopened. `None`:
    /// `log_path`'s own directory.
    #[serde(default)]
    pub log_directory: Option<PathBuf>,
    /// Bytes the log file may grow to before the monitor drops output
    /// (until it is reopened, i.e. rotated); 0: no limit.
    #[serde(default)]
    pub log_size_max: u64,
    /// The container has a tty (`process.terminal` in the spec).
    #[serde(default)]
    pub tty: bool,
    /// Keep the container's stdin open for attach.
    #[serde(default)]
    pub stdin: bool,
    /// Close the container's stdin when the first attached client with stdin
    /// detaches.
    #[serde(default)]
    pub stdin_once: bool,
    /// Restore the container from CRIU images instead of creating it: the
    /// monitor creates nothing at start-up (it reports pid 0) and `Start`
    /// runs the runtime's `restore --detach` with the stdio it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreConfig>,
}

/// Where a restored container's CRIU images are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreConfig {
    /// The CRIU images (the archive's `checkpoint/`).
    pub image_path: PathBuf,
    /// criu's logs and scratch files.
    pub work_path: PathBuf,
}

/// What the container monitor hands an exec session (`exec.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecConfig {
    /// The container's id as the OCI runtime knows it.
    pub container_id: String,
    pub runtime: RuntimeConfig,
    pub tty: bool,
    pub stdin: bool,
    /// How long the session waits for its first attach client before it
    /// kills the process and exits.
    pub attach_timeout_ms: u64,
}

/// The one line a monitor writes on its start-up pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartupResult {
    /// Created: the monitor runs as `shim_pid`, the container's init (or the
    /// exec process) as `pid`.
    Ok { shim_pid: i32, pid: i32 },
    /// Creation failed; the monitor cleaned up and exited.
    Err { message: String },
}

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Run the created container's process (`runtime start`).
    Start,
    /// Send a signal to the container's init, or with `all` to every process
    /// in it. For an exec session: to the exec process.
    Kill {
        signal: i32,
        #[serde(default)]
        all: bool,
    },
    /// Update the container's resources (OCI `LinuxResources` JSON).
    Update { resources: serde_json::Value },
    /// Reopen the log file (after kubelet renamed it).
    ReopenLog,
    /// Run a command in the container, collect its output (each stream capped
    /// at [`EXEC_SYNC_OUTPUT_CAP`]), kill it after `timeout_ms` (0: none).
    ExecSync(ExecRequest),
    /// Start an exec session: a separate monitor in exec mode with its own
    /// state directory `exec/<exec_id>/` and attach socket.
    Exec(ExecRequest),
    /// The container's state.
    State,
    /// Set the tty's window size.
    Resize { width: u16, height: u16 },
    /// Answer when the container has exited (with its [`ExitInfo`]).
    Wait,
    /// Dump the running container with CRIU into `image_path` (criu's
    /// logs and scratch files in `work_path`); the container keeps running.
    Checkpoint {
        image_path: std::path::PathBuf,
        work_path: std::path::PathBuf,
    },
}

/// The command of an exec or exec-sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Exec session id (`[A-Za-z0-9_.-]{1,64}`); unused by exec-sync.
    #[serde(default)]
    pub exec_id: String,
    /// argv; required unless `process` is given.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment (`KEY=value`) appended to the container's.
    #[serde(default)]
    pub env: Vec<String>,
    /// Working directory; default the container's.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default)]
    pub stdin: bool,
    /// Initial tty size (width, height).
    #[serde(default)]
    pub console_size: Option<(u16, u16)>,
    /// A complete OCI `process` object; overrides the fields above (the
    /// container's own process is the base otherwise).
    #[serde(default)]
    pub process: Option<serde_json::Value>,
    /// ExecSync: kill the process after this many ms (0: no timeout).
    /// Exec: how long the session waits for its first attach client (0: 60 s).
    #[serde(default)]
    pub timeout_ms: u64,
}

/// The answer on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Err(ErrorReply),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub kind: ErrorKind,
    pub message: String,
}

/// Lets the daemon pick a gRPC status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Malformed or unsupported request.
    InvalidArgument,
    /// Not possible in the container's state (e.g. start after exit).
    FailedPrecondition,
    /// The OCI runtime failed.
    Runtime,
    /// Something else went wrong in the monitor.
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Done,
    State(State),
    Exited(ExitInfo),
    /// ExecSync started (the output frames follow).
    ExecSyncStarted {
        pid: i32,
    },
    /// Exec session started.
    ExecStarted(ExecStarted),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStarted {
    pub exec_id: String,
    /// Pid of the exec process.
    pub pid: i32,
    /// Pid of the session's monitor.
    pub shim_pid: i32,
    /// The session's state directory (attach and control sockets, exit file).
    pub state_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Created,
    Running,
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub shim_pid: i32,
    /// The container's init (or the exec process).
    pub pid: i32,
    pub status: Status,
    #[serde(default)]
    pub exit: Option<ExitInfo>,
    /// Container output the monitor did not write to the log: beyond
    /// `log_size_max`, or while no log file could be reopened.
    #[serde(default)]
    pub log_dropped_bytes: u64,
    /// When `Start` started the process (Unix ns); 0 before that (and from
    /// older monitors). The daemon's record of a start it did not see end
    /// (a crash) takes the time from here.
    #[serde(default)]
    pub started_at_unix_nanos: i64,
}

/// How the process ended: the durable record in `exit.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub pid: i32,
    /// Exit code, or 128 + signal number when killed by a signal.
    pub exit_code: i32,
    /// The signal that killed it, if any.
    #[serde(default)]
    pub signal: Option<i32>,
    /// The cgroup's OOM-kill count went up while the container ran.
    #[serde(default)]
    pub oom_killed: bool,
    /// RFC 3339 with nanoseconds, UTC.
    pub exited_at: String,
    /// The same instant in nanoseconds since the Unix epoch.
    pub exited_at_unix_nanos: i64,
}

/// The end of an exec-sync (payload of its [`STREAM_EXIT`] frame).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSyncResult {
    /// Exit code, or 128 + signal.
    pub exit_code: i32,
    /// The timeout fired and the process was killed.
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The exec could not run at all (the runtime's error).
    #[serde(default)]
    pub error: Option<String>,
}

/// `[A-Za-z0-9_.-]{1,64}`, not `.`/`..`: a safe single path component.
pub fn valid_exec_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shape() {
        let r = Request::Kill {
            signal: 15,
            all: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"op":"kill","signal":15,"all":false}"#
        );
        let back: Request = serde_json::from_str(r#"{"op":"kill","signal":9}"#).unwrap();
        assert_eq!(
            back,
            Request::Kill {
                signal: 9,
                all: false
            }
        );
        let e: Request =
            serde_json::from_str(r#"{"op":"exec_sync","args":["echo","hi"],"timeout_ms":5}"#)
                .unwrap();
        match e {
            Request::ExecSync(x) => {
                assert_eq!(x.args, ["echo", "hi"]);
                assert_eq!(x.timeout_ms, 5);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exec_ids() {
        assert!(valid_exec_id("abc-1_2.x"));
        assert!(!valid_exec_id(""));
        assert!(!valid_exec_id(".."));
        assert!(!valid_exec_id("a/b"));
        assert!(!valid_exec_id(&"a".repeat(65)));
    }
}
