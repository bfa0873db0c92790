//! The daemon's client (tokio): spawn a monitor, find it again after a
//! restart, and talk to it, without a blocking thread per container or
//! session: waiting for hundreds of containers (`wait`) or streaming an
//! exec costs a task each. Spawning runs the blocking, audited start-up
//! (`std::process::Command`, one short read) on tokio's blocking pool.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::error::{Error, Result, gone_or, unexpected};
use crate::messages::*;
use crate::monitor_process::{
    self, AttachEvent, CALL_TIMEOUT, ExecSyncOutput, Pids, SpawnOptions, decode_response,
    exec_sync_limit, resize_payload, socket_path,
};

/// A running monitor (of a container or of an exec session).
#[derive(Debug, Clone)]
pub struct Shim {
    state_dir: PathBuf,
    shim_pid: i32,
    pid: i32,
}

impl Shim {
    /// Starts a monitor for a new container and waits until the container
    /// is created (see [`SpawnOptions`]). The monitor has detached by the
    /// time this returns.
    pub async fn spawn(opts: SpawnOptions) -> Result<Shim> {
        let state_dir = opts.state_dir.clone();
        let pids = tokio::task::spawn_blocking(move || monitor_process::spawn(&opts))
            .await
            .map_err(|e| Error::Io(io::Error::other(e)))??;
        Ok(Shim::with(state_dir, pids))
    }

    /// Finds the monitor of `state_dir` again (after a daemon restart).
    /// [`Error::Gone`] if none runs: then [`read_exit_file`] has the exit.
    /// Reads two small files and `/proc`; no request is sent.
    ///
    /// [`read_exit_file`]: crate::read_exit_file
    pub fn connect(state_dir: &Path) -> Result<Shim> {
        monitor_process::find(state_dir).map(|p| Shim::with(state_dir.to_path_buf(), p))
    }

    /// A handle from parts the daemon kept (no checks; see [`Shim::connect`]).
    pub fn from_parts(state_dir: PathBuf, shim_pid: i32, pid: i32) -> Shim {
        Shim {
            state_dir,
            shim_pid,
            pid,
        }
    }

    fn with(state_dir: PathBuf, p: Pids) -> Shim {
        Shim::from_parts(state_dir, p.shim_pid, p.pid)
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
        monitor_process::is_shim_of(self.shim_pid, &self.state_dir)
    }

    /// The exit record, if the process has exited.
    pub fn exit_info(&self) -> Result<Option<ExitInfo>> {
        Ok(monitor_process::read_exit_file(&self.state_dir)?)
    }

    /// SIGKILLs the monitor itself (last-resort cleanup; the container keeps
    /// running, unmonitored).
    pub fn kill_shim(&self) -> Result<()> {
        Ok(monitor_process::kill_if_shim_of(
            self.shim_pid,
            &self.state_dir,
        )?)
    }

    async fn connect_to(&self, name: &str) -> Result<UnixStream> {
        // The directory (if any) stays open until the connect is done.
        let (path, _dir) = socket_path(&self.state_dir, name).map_err(gone_or)?;
        UnixStream::connect(path).await.map_err(gone_or)
    }

    async fn request(sock: &mut UnixStream, req: &Request) -> Result<Reply> {
        let body = serde_json::to_vec(req).map_err(|e| Error::Protocol(e.to_string()))?;
        write_message(sock, &body).await.map_err(gone_or)?;
        let resp = read_message(sock).await.map_err(gone_or)?;
        decode_response(&resp)
    }

    /// Sends one request and reads its answer (giving up after two
    /// minutes).
    pub async fn call(&self, req: &Request) -> Result<Reply> {
        let mut sock = self.connect_to(CONTROL_SOCKET).await?;
        within(Some(CALL_TIMEOUT), Self::request(&mut sock, req)).await
    }

    async fn expect_done(&self, req: &Request) -> Result<()> {
        match self.call(req).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Runs the created container's process.
    pub async fn start(&self) -> Result<()> {
        self.expect_done(&Request::Start).await
    }

    /// Signals the container's init (all processes with `all`). Succeeds if
    /// it has already exited.
    pub async fn kill(&self, signal: i32, all: bool) -> Result<()> {
        match self.expect_done(&Request::Kill { signal, all }).await {
            Err(Error::Gone) => Ok(()),
            r => r,
        }
    }

    /// Applies OCI `LinuxResources` (JSON) to the running container.
    pub async fn update(&self, resources: &serde_json::Value) -> Result<()> {
        self.expect_done(&Request::Update {
            resources: resources.clone(),
        })
        .await
    }

    /// Checkpoints the running container with CRIU (it keeps running),
    /// giving up after `timeout`.
    pub async fn checkpoint(
        &self,
        image_path: &std::path::Path,
        work_path: &std::path::Path,
        timeout: Duration,
    ) -> Result<()> {
        let req = Request::Checkpoint {
            image_path: image_path.to_path_buf(),
            work_path: work_path.to_path_buf(),
        };
        let mut sock = self.connect_to(CONTROL_SOCKET).await?;
        match within(Some(timeout), Self::request(&mut sock, &req)).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Reopens the CRI log file.
    pub async fn reopen_log(&self) -> Result<()> {
        self.expect_done(&Request::ReopenLog).await
    }

    /// Sets the tty's window size.
    pub async fn resize(&self, width: u16, height: u16) -> Result<()> {
        self.expect_done(&Request::Resize { width, height }).await
    }

    pub async fn state(&self) -> Result<State> {
        match self.call(&Request::State).await? {
            Reply::State(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Resolves when the process has exited, with its exit record (from the
    /// exit file if the monitor is already gone). No time limit.
    pub async fn wait(&self) -> Result<ExitInfo> {
        let from_file = || match monitor_process::read_exit_file(&self.state_dir)? {
            Some(e) => Ok(e),
            None => Err(Error::Gone),
        };
        let mut sock = match self.connect_to(CONTROL_SOCKET).await {
            Ok(s) => s,
            Err(Error::Gone) => return from_file(),
            Err(e) => return Err(e),
        };
        match Self::request(&mut sock, &Request::Wait).await {
            Ok(Reply::Exited(e)) => Ok(e),
            Ok(other) => Err(unexpected(other)),
            // The monitor went away between the exit and our answer.
            Err(Error::Gone) => from_file(),
            Err(e) => Err(e),
        }
    }

    /// Runs a command in the container and collects its output (16 MiB per
    /// stream at most). `req.timeout_ms` kills it (reported as `timed_out`);
    /// the monitor enforces it.
    pub async fn exec_sync(&self, req: &ExecRequest) -> Result<ExecSyncOutput> {
        let mut sock = self.connect_to(CONTROL_SOCKET).await?;
        let limit = exec_sync_limit(req.timeout_ms);
        let started = within(
            limit.or(Some(CALL_TIMEOUT)),
            Self::request(&mut sock, &Request::ExecSync(req.clone())),
        )
        .await?;
        match started {
            Reply::ExecSyncStarted { .. } => {}
            other => return Err(unexpected(other)),
        }
        within(limit, async {
            let mut out = ExecSyncOutput::new();
            loop {
                let Some((stream, payload)) = read_frame(&mut sock).await.map_err(gone_or)? else {
                    return Err(Error::Gone);
                };
                if let Some(end) = out.take_frame(stream, &payload) {
                    return end.map(|()| out);
                }
            }
        })
        .await
    }

    /// Starts an exec session (its own monitor; attach to it next).
    pub async fn exec(&self, req: &ExecRequest) -> Result<(ExecStarted, Shim)> {
        match self.call(&Request::Exec(req.clone())).await? {
            Reply::ExecStarted(s) => {
                let shim = Shim::from_parts(s.state_dir.clone(), s.shim_pid, s.pid);
                Ok((s, shim))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Attaches to the process's stdio: a reader for output and the exit, a
    /// writer for stdin and resizes (usable from two tasks).
    pub async fn attach(&self) -> Result<(AttachReader, AttachWriter)> {
        let sock = self.connect_to(ATTACH_SOCKET).await?;
        let (r, w) = sock.into_split();
        Ok((AttachReader { r }, AttachWriter { w }))
    }
}

/// `fut`, given up with `TimedOut` after `limit` (none: no limit).
async fn within<T>(
    limit: Option<Duration>,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match limit {
        None => fut.await,
        Some(t) => tokio::time::timeout(t, fut).await.unwrap_or_else(|_| {
            Err(Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "the monitor did not answer in time",
            )))
        }),
    }
}

/// Output side of an attach.
#[derive(Debug)]
pub struct AttachReader {
    r: OwnedReadHalf,
}

impl AttachReader {
    /// The next output or the exit; `None` when the monitor closed.
    pub async fn next_event(&mut self) -> io::Result<Option<AttachEvent>> {
        loop {
            let Some((stream, payload)) = read_frame(&mut self.r).await? else {
                return Ok(None);
            };
            if let Some(ev) = AttachEvent::from_frame(stream, payload) {
                return ev.map(Some);
            }
        }
    }
}

/// Input side of an attach.
#[derive(Debug)]
pub struct AttachWriter {
    w: OwnedWriteHalf,
}

impl AttachWriter {
    /// Sends stdin bytes (split into frames as needed).
    pub async fn write_stdin(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(64 * 1024) {
            write_frame(&mut self.w, STREAM_STDIN, chunk).await?;
        }
        Ok(())
    }

    /// Declares this client a stdin client before it sends any data (so
    /// that its detach closes a `stdin_once` container's stdin).
    pub async fn declare_stdin(&mut self) -> io::Result<()> {
        write_frame(&mut self.w, STREAM_STDIN_OPEN, &[]).await
    }

    /// Closes this client's stdin (the container's too with `stdin_once`,
    /// an exec's always).
    pub async fn close_stdin(&mut self) -> io::Result<()> {
        write_frame(&mut self.w, STREAM_STDIN, &[]).await
    }

    pub async fn resize(&mut self, width: u16, height: u16) -> io::Result<()> {
        write_frame(&mut self.w, STREAM_RESIZE, &resize_payload(width, height)).await
    }
}

async fn write_message(s: &mut (impl AsyncWriteExt + Unpin), body: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(4 + body.len());
    crate::frame::encode_message(&mut out, body);
    s.write_all(&out).await
}

async fn read_message(s: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Vec<u8>> {
    let len = s.read_u32().await? as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message too large",
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    Ok(body)
}

async fn read_frame(s: &mut (impl AsyncReadExt + Unpin)) -> io::Result<Option<(u8, Vec<u8>)>> {
    let stream = match s.read_u8().await {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = s.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await?;
    Ok(Some((stream, payload)))
}

async fn write_frame(
    s: &mut (impl AsyncWriteExt + Unpin),
    stream: u8,
    payload: &[u8],
) -> io::Result<()> {
    let mut out = Vec::with_capacity(5 + payload.len());
    crate::frame::encode_frame(&mut out, stream, payload);
    s.write_all(&out).await
}
