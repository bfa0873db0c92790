//! The `OciRuntime` interface of the design and its two implementations:
//! [`cli::CliRuntime`] (runc, crun, youki or any binary with runc's command
//! line) and [`embedded::EmbeddedRuntime`] (youki's libcontainer, run in a
//! short-lived child of the monitor).
//!
//! Every call is synchronous and returns once the runtime is done (create:
//! the container's init waits for `start`; exec: the process runs). None
//! waits for a container process to end: the monitor is the child subreaper
//! and reaps the container's init and exec processes itself.

pub mod cli;
pub mod embedded;
mod join;

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crust_shim_protocol::RuntimeConfig;

/// An error from the OCI runtime, with its own message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RuntimeError(pub String);

impl RuntimeError {
    pub fn new(msg: impl Into<String>) -> Self {
        RuntimeError(msg.into())
    }
}

impl From<std::io::Error> for RuntimeError {
    fn from(e: std::io::Error) -> Self {
        RuntimeError(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, RuntimeError>;

/// The stdio a new container or exec process gets: `None` is /dev/null.
/// The descriptors are the child's ends; the runtime closes them in the
/// monitor once the process has them.
#[derive(Debug, Default)]
pub struct Stdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// `create` arguments.
#[derive(Debug)]
pub struct CreateOptions<'a> {
    pub bundle: &'a Path,
    /// Where the runtime writes the init's pid (absolute).
    pub pid_file: &'a Path,
    /// Listening socket that receives the pty master (tty containers).
    pub console_socket: Option<&'a Path>,
    pub stdio: Stdio,
}

/// `exec` arguments.
#[derive(Debug)]
pub struct ExecOptions<'a> {
    /// An OCI `process` JSON file.
    pub process: &'a Path,
    /// Where the runtime writes the exec process's pid (absolute).
    pub pid_file: &'a Path,
    pub console_socket: Option<&'a Path>,
    /// The process is made a child subreaper where the runtime allows
    /// (embedded only: runc and crun run no code of ours in between), so
    /// that what it daemonises stays in its tree and an exec-sync timeout
    /// can kill all of it.
    pub own_orphans: bool,
    pub stdio: Stdio,
}

/// `restore` arguments.
#[derive(Debug)]
pub struct RestoreOptions<'a> {
    pub bundle: &'a Path,
    /// Where the runtime writes the restored init's pid (absolute).
    pub pid_file: &'a Path,
    /// The CRIU images.
    pub image_path: &'a Path,
    /// criu's logs and scratch files.
    pub work_path: &'a Path,
    /// The restored process's stdio (its dumped pipes are re-pointed here).
    pub stdio: Stdio,
}

/// `state` as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeState {
    /// `creating`, `created`, `running`, `paused` or `stopped`.
    pub status: String,
    pub pid: i32,
}

/// The operations the monitor needs from an OCI runtime.
pub trait OciRuntime {
    /// Name for messages (`runc`, `crun`, `embedded`).
    fn name(&self) -> &str;
    /// Creates the container; returns its init's pid.
    fn create(&self, id: &str, opts: CreateOptions<'_>) -> Result<i32>;
    /// Runs the created container's process.
    fn start(&self, id: &str) -> Result<()>;
    /// Sends `signal` to the init, or to every process with `all`.
    fn kill(&self, id: &str, signal: i32, all: bool) -> Result<()>;
    /// Removes the runtime's state and the container's cgroup.
    fn delete(&self, id: &str, force: bool) -> Result<()>;
    /// Starts a process in the running container; returns its pid.
    fn exec(&self, id: &str, opts: ExecOptions<'_>) -> Result<i32>;
    /// Applies an OCI `LinuxResources` JSON file.
    fn update(&self, id: &str, resources: &Path) -> Result<()>;
    /// Dumps the running container with CRIU into `image_path`, leaving it
    /// running (`work_path`: criu's log and scratch files).
    fn checkpoint(&self, id: &str, image_path: &Path, work_path: &Path) -> Result<()>;
    /// Creates the container from CRIU images and lets its restored
    /// processes run; returns its init's pid.
    fn restore(&self, id: &str, opts: RestoreOptions<'_>) -> Result<i32>;
    fn state(&self, id: &str) -> Result<RuntimeState>;
}

/// The runtime a config asks for. `log` is the CLI's `--log` file.
pub fn from_config(cfg: &RuntimeConfig, log: PathBuf) -> Box<dyn OciRuntime> {
    match cfg {
        RuntimeConfig::Embedded {
            root,
            systemd_cgroup,
        } => Box::new(embedded::EmbeddedRuntime::new(
            root.clone(),
            *systemd_cgroup,
        )),
        RuntimeConfig::Cli {
            path,
            root,
            systemd_cgroup,
        } => Box::new(cli::CliRuntime::new(
            path.clone(),
            root.clone(),
            *systemd_cgroup,
            log,
        )),
    }
}

/// Reads a pid file a runtime wrote.
pub fn read_pid_file(path: &Path) -> Result<i32> {
    let s = fs::read_to_string(path)
        .map_err(|e| RuntimeError::new(format!("reading pid file {}: {e}", path.display())))?;
    let pid: i32 = s
        .trim()
        .parse()
        .map_err(|_| RuntimeError::new(format!("bad pid file {}: {s:?}", path.display())))?;
    if pid <= 0 {
        return Err(RuntimeError::new(format!(
            "bad pid {pid} in {}",
            path.display()
        )));
    }
    Ok(pid)
}
