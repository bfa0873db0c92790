//! The daemon's one monitor client: crust-shim's async client
//! ([`AsyncShim`]), with the time limits and last-resort helpers the daemon
//! needs on top of it. Nothing here blocks a runtime thread for long:
//! spawning runs on the blocking pool, everything else is socket I/O or a
//! look at /proc.

use std::io;
use std::path::Path;
use std::time::Duration;

use crust_shim_protocol::ExecStarted;
use crust_shim_protocol::{AttachReader, AttachWriter, Shim as AsyncShim};
use crust_shim_protocol::{Error, ExecRequest, ExecSyncOutput, ExitInfo, SpawnOptions, State};

/// How long a plain request may take before the daemon gives up on the
/// monitor (as long as the blocking client allowed).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A running monitor of a container, a pause process or an exec session.
#[derive(Debug, Clone)]
pub struct Monitor {
    shim: AsyncShim,
}

impl Monitor {
    /// Starts a monitor, which creates the container, and returns once the
    /// container is created (or `opts.timeout` passed).
    pub async fn spawn(opts: SpawnOptions) -> Result<Monitor, Error> {
        AsyncShim::spawn(opts).await.map(|shim| Monitor { shim })
    }

    /// The monitor of `state_dir`, if one runs ([`Error::Gone`] if not:
    /// then [`exit_file`] has the exit).
    pub fn connect(state_dir: &Path) -> Result<Monitor, Error> {
        AsyncShim::connect(state_dir).map(|shim| Monitor { shim })
    }

    /// Pid of the container's init (or of the exec process).
    pub fn pid(&self) -> i32 {
        self.shim.pid()
    }

    pub fn state_dir(&self) -> &Path {
        self.shim.state_dir()
    }

    /// The monitor process still runs (checked against pid reuse).
    pub fn is_alive(&self) -> bool {
        crust_shim_protocol::is_shim_of(self.shim.shim_pid(), self.shim.state_dir())
    }

    /// The exit record, if the process has exited.
    pub fn exit_info(&self) -> io::Result<Option<ExitInfo>> {
        exit_file(self.shim.state_dir())
    }

    /// SIGKILLs the monitor itself (last-resort cleanup: what it ran keeps
    /// running, unmonitored).
    pub fn kill_monitor(&self) {
        if self.is_alive() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.shim.shim_pid()),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// SIGKILLs every process of the container, gives the monitor up to
    /// `grace` (looking every `every`) to record the exit and leave, then
    /// kills the monitor if it is still there.
    pub async fn kill_and_reap(&self, grace: Duration, every: Duration) {
        let _ = self.kill(libc::SIGKILL, true).await;
        let deadline = tokio::time::Instant::now() + grace;
        while self.is_alive() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(every).await;
        }
        self.kill_monitor();
    }

    /// The container's state as the monitor knows it (created, running,
    /// stopped).
    pub async fn state(&self) -> Result<State, Error> {
        timed(CALL_TIMEOUT, self.shim.state()).await
    }

    /// Runs the created container's process.
    pub async fn start(&self) -> Result<(), Error> {
        timed(CALL_TIMEOUT, self.shim.start()).await
    }

    /// Signals the init (every process with `all`); succeeds if it has
    /// exited already.
    pub async fn kill(&self, signal: i32, all: bool) -> Result<(), Error> {
        timed(CALL_TIMEOUT, self.shim.kill(signal, all)).await
    }

    /// Applies OCI `LinuxResources` (JSON) to the running container.
    pub async fn update(&self, resources: &serde_json::Value) -> Result<(), Error> {
        timed(CALL_TIMEOUT, self.shim.update(resources)).await
    }

    /// Checkpoints the running container with CRIU; it keeps running.
    pub async fn checkpoint(
        &self,
        image_path: &Path,
        work_path: &Path,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.shim.checkpoint(image_path, work_path, timeout).await
    }

    pub async fn reopen_log(&self) -> Result<(), Error> {
        timed(CALL_TIMEOUT, self.shim.reopen_log()).await
    }

    /// Resolves when the process has exited (no time limit: it may run for
    /// months).
    pub async fn wait(&self) -> Result<ExitInfo, Error> {
        self.shim.wait().await
    }

    /// Runs a command to completion and collects its output. The monitor
    /// enforces `req.timeout_ms`; the client waits that long and a margin.
    pub async fn exec_sync(&self, req: &ExecRequest) -> Result<ExecSyncOutput, Error> {
        match req.timeout_ms {
            0 => self.shim.exec_sync(req).await,
            ms => {
                timed(
                    Duration::from_millis(ms) + CALL_TIMEOUT,
                    self.shim.exec_sync(req),
                )
                .await
            }
        }
    }

    /// Starts an exec session: its own monitor, to attach to.
    pub async fn exec(&self, req: &ExecRequest) -> Result<(ExecStarted, Monitor), Error> {
        let (started, shim) = timed(CALL_TIMEOUT, self.shim.exec(req)).await?;
        Ok((started, Monitor { shim }))
    }

    /// Attaches to the process's stdio: output and exit on the reader,
    /// stdin and resizes on the writer.
    pub async fn attach(&self) -> Result<(AttachReader, AttachWriter), Error> {
        timed(CALL_TIMEOUT, self.shim.attach()).await
    }
}

/// Whether a monitor runs for `state_dir`.
pub fn is_running(state_dir: &Path) -> bool {
    Monitor::connect(state_dir).is_ok()
}

/// The exit record in a monitor's state dir, if the process has exited.
pub fn exit_file(state_dir: &Path) -> io::Result<Option<ExitInfo>> {
    crust_shim_protocol::read_exit_file(state_dir)
}

async fn timed<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the monitor did not answer within {}s", limit.as_secs()),
        ))),
    }
}
