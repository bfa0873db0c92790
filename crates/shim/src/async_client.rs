//! The client for tokio (feature `client-async`): the same protocol as
//! [`crate::client`] over `tokio::net::UnixStream`, so the daemon can wait
//! for hundreds of containers (`wait`) or stream exec-sync output without a
//! blocking thread each. Spawning stays the blocking, audited
//! [`Shim::spawn`](crate::client::Shim::spawn), run on the blocking pool.

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::client::{AttachEvent, Error, ExecSyncOutput, Result, Shim, SpawnOptions};
use crate::protocol::*;

/// A monitor, driven from async code.
#[derive(Debug, Clone)]
pub struct AsyncShim {
    state_dir: PathBuf,
    shim_pid: i32,
    pid: i32,
}

impl From<Shim> for AsyncShim {
    fn from(s: Shim) -> Self {
        AsyncShim {
            state_dir: s.state_dir().to_path_buf(),
            shim_pid: s.shim_pid(),
            pid: s.pid(),
        }
    }
}

impl From<&AsyncShim> for Shim {
    fn from(s: &AsyncShim) -> Self {
        Shim::from_parts(s.state_dir.clone(), s.shim_pid, s.pid)
    }
}

fn gone_or(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Error::Gone,
        _ => Error::Io(e),
    }
}

async fn connect_in(dir: &Path, name: &str) -> io::Result<UnixStream> {
    let full = dir.join(name);
    if full.as_os_str().len() < 100 {
        return UnixStream::connect(full).await;
    }
    // The directory stays open until the connect is done.
    let d = std::fs::File::open(dir)?;
    use std::os::fd::AsRawFd;
    UnixStream::connect(format!("/proc/self/fd/{}/{name}", d.as_raw_fd())).await
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

impl AsyncShim {
    /// [`Shim::spawn`] on tokio's blocking pool.
    pub async fn spawn(opts: SpawnOptions) -> Result<AsyncShim> {
        tokio::task::spawn_blocking(move || Shim::spawn(&opts))
            .await
            .map_err(|e| Error::Io(io::Error::other(e)))?
            .map(Into::into)
    }

    /// [`Shim::connect`]: recovery after a daemon restart.
    pub fn connect(state_dir: &Path) -> Result<AsyncShim> {
        Shim::connect(state_dir).map(Into::into)
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn shim_pid(&self) -> i32 {
        self.shim_pid
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    async fn request(sock: &mut UnixStream, req: &Request) -> Result<Reply> {
        let body = serde_json::to_vec(req).map_err(|e| Error::Protocol(e.to_string()))?;
        write_message(sock, &body).await.map_err(gone_or)?;
        let resp = read_message(sock).await.map_err(gone_or)?;
        match serde_json::from_slice::<Response>(&resp) {
            Ok(Response::Ok(r)) => Ok(r),
            Ok(Response::Err(ErrorReply { kind, message })) => Err(Error::Shim { kind, message }),
            Err(e) => Err(Error::Protocol(format!("bad response: {e}"))),
        }
    }

    /// One request, one answer.
    pub async fn call(&self, req: &Request) -> Result<Reply> {
        let mut sock = connect_in(&self.state_dir, CONTROL_SOCKET)
            .await
            .map_err(gone_or)?;
        Self::request(&mut sock, req).await
    }

    async fn expect_done(&self, req: &Request) -> Result<()> {
        match self.call(req).await? {
            Reply::Done => Ok(()),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    pub async fn start(&self) -> Result<()> {
        self.expect_done(&Request::Start).await
    }

    /// Succeeds if the process has already exited.
    pub async fn kill(&self, signal: i32, all: bool) -> Result<()> {
        match self.expect_done(&Request::Kill { signal, all }).await {
            Err(Error::Gone) => Ok(()),
            r => r,
        }
    }

    pub async fn update(&self, resources: &serde_json::Value) -> Result<()> {
        self.expect_done(&Request::Update {
            resources: resources.clone(),
        })
        .await
    }

    pub async fn reopen_log(&self) -> Result<()> {
        self.expect_done(&Request::ReopenLog).await
    }

    pub async fn resize(&self, width: u16, height: u16) -> Result<()> {
        self.expect_done(&Request::Resize { width, height }).await
    }

    pub async fn state(&self) -> Result<State> {
        match self.call(&Request::State).await? {
            Reply::State(s) => Ok(s),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Resolves when the process has exited (from the exit file if the
    /// monitor is already gone).
    pub async fn wait(&self) -> Result<ExitInfo> {
        let from_file = || match crate::client::read_exit_file(&self.state_dir)? {
            Some(e) => Ok(e),
            None => Err(Error::Gone),
        };
        match self.call(&Request::Wait).await {
            Ok(Reply::Exited(e)) => Ok(e),
            Ok(other) => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
            Err(Error::Gone) => from_file(),
            Err(e) => Err(e),
        }
    }

    /// See [`Shim::exec_sync`]; the timeout is enforced by the monitor.
    pub async fn exec_sync(&self, req: &ExecRequest) -> Result<ExecSyncOutput> {
        let mut sock = connect_in(&self.state_dir, CONTROL_SOCKET)
            .await
            .map_err(gone_or)?;
        match Self::request(&mut sock, &Request::ExecSync(req.clone())).await? {
            Reply::ExecSyncStarted { .. } => {}
            other => return Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
        let mut out = ExecSyncOutput {
            exit_code: -1,
            timed_out: false,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
        };
        loop {
            let Some((stream, payload)) = read_frame(&mut sock).await.map_err(gone_or)? else {
                return Err(Error::Gone);
            };
            let (buf, trunc) = match stream {
                STREAM_STDOUT => (&mut out.stdout, &mut out.stdout_truncated),
                STREAM_STDERR => (&mut out.stderr, &mut out.stderr_truncated),
                STREAM_EXIT => {
                    let r: ExecSyncResult = serde_json::from_slice(&payload)
                        .map_err(|e| Error::Protocol(format!("bad exec result: {e}")))?;
                    out.exit_code = r.exit_code;
                    out.timed_out = r.timed_out;
                    out.stdout_truncated |= r.stdout_truncated;
                    out.stderr_truncated |= r.stderr_truncated;
                    return Ok(out);
                }
                _ => continue,
            };
            let room = EXEC_SYNC_OUTPUT_CAP.saturating_sub(buf.len());
            *trunc |= payload.len() > room;
            buf.extend_from_slice(&payload[..payload.len().min(room)]);
        }
    }

    /// Starts an exec session; attach to the returned monitor.
    pub async fn exec(&self, req: &ExecRequest) -> Result<(ExecStarted, AsyncShim)> {
        match self.call(&Request::Exec(req.clone())).await? {
            Reply::ExecStarted(s) => {
                let shim = AsyncShim {
                    state_dir: s.state_dir.clone(),
                    shim_pid: s.shim_pid,
                    pid: s.pid,
                };
                Ok((s, shim))
            }
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Attaches: a reader for output and the exit, a writer for stdin and
    /// resizes (usable from two tasks).
    pub async fn attach(&self) -> Result<(AttachReader, AttachWriter)> {
        let sock = connect_in(&self.state_dir, ATTACH_SOCKET)
            .await
            .map_err(gone_or)?;
        let (r, w) = sock.into_split();
        Ok((AttachReader { r }, AttachWriter { w }))
    }
}

/// Output side of an async attach.
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
}

/// Input side of an async attach.
#[derive(Debug)]
pub struct AttachWriter {
    w: OwnedWriteHalf,
}

impl AttachWriter {
    pub async fn write_stdin(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(64 * 1024) {
            write_frame(&mut self.w, STREAM_STDIN, chunk).await?;
        }
        Ok(())
    }

    /// Declares this client a stdin client before it sends any data.
    pub async fn declare_stdin(&mut self) -> io::Result<()> {
        write_frame(&mut self.w, STREAM_STDIN_OPEN, &[]).await
    }

    /// Closes this client's stdin.
    pub async fn close_stdin(&mut self) -> io::Result<()> {
        write_frame(&mut self.w, STREAM_STDIN, &[]).await
    }

    pub async fn resize(&mut self, width: u16, height: u16) -> io::Result<()> {
        let mut p = [0u8; 4];
        p[..2].copy_from_slice(&width.to_be_bytes());
        p[2..].copy_from_slice(&height.to_be_bytes());
        write_frame(&mut self.w, STREAM_RESIZE, &p).await
    }
}
