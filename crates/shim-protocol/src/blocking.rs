//! The blocking client (feature `blocking-client`): the same protocol with
//! `std` sockets and no threads of its own; call it from
//! `tokio::task::spawn_blocking` in async code.
//!
//! Goes away once the daemon no longer uses it: the daemon is moving to the
//! tokio client ([`crate::Shim`]), which offers all of this.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result, gone_or, unexpected};
use crate::frame;
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

/// A started exec session: its own monitor.
#[derive(Debug, Clone)]
pub struct ExecSession {
    pub exec_id: String,
    /// Pid of the exec process.
    pub pid: i32,
    /// The session's monitor: attach, resize, kill, wait, state.
    pub shim: Shim,
}

/// An attach connection (see the framing in [`crate::messages`]).
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
        frame::write_frame(
            &mut self.sock,
            STREAM_RESIZE,
            &resize_payload(width, height),
        )
    }

    /// The next output or the exit; `Ok(None)` when the monitor closed.
    pub fn next_event(&mut self) -> io::Result<Option<AttachEvent>> {
        loop {
            let Some((stream, payload)) = frame::read_frame(&mut self.sock)? else {
                return Ok(None);
            };
            if let Some(ev) = AttachEvent::from_frame(stream, payload) {
                return ev.map(Some);
            }
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
    let (path, _dir) = socket_path(dir, name)?;
    UnixStream::connect(path)
}

impl Shim {
    /// Starts a monitor for a new container and waits until the container
    /// is created (see [`SpawnOptions`]).
    pub fn spawn(opts: &SpawnOptions) -> Result<Shim> {
        monitor_process::spawn(opts).map(|p| Shim::with(opts.state_dir.clone(), p))
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

    /// Finds the monitor of `state_dir` again (after a daemon restart).
    /// [`Error::Gone`] if none runs: then [`crate::read_exit_file`] has the
    /// exit.
    pub fn connect(state_dir: &Path) -> Result<Shim> {
        monitor_process::find(state_dir).map(|p| Shim::with(state_dir.to_path_buf(), p))
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

    fn connect_ctl(&self) -> Result<UnixStream> {
        connect_in(&self.state_dir, CONTROL_SOCKET).map_err(gone_or)
    }

    fn request(sock: &mut UnixStream, req: &Request) -> Result<Reply> {
        let body = serde_json::to_vec(req).map_err(|e| Error::Protocol(e.to_string()))?;
        frame::write_message(sock, &body).map_err(gone_or)?;
        let resp = frame::read_message(sock)
            .map_err(gone_or)?
            .ok_or(Error::Gone)?;
        decode_response(&resp)
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
            other => Err(unexpected(other)),
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
            other => Err(unexpected(other)),
        }
    }

    /// Blocks until the process has exited and returns its exit record
    /// (from the exit file if the monitor is already gone).
    pub fn wait(&self) -> Result<ExitInfo> {
        let from_file = || match monitor_process::read_exit_file(&self.state_dir)? {
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
            Ok(other) => Err(unexpected(other)),
            // The monitor went away between the exit and our answer.
            Err(Error::Gone) => from_file(),
            Err(e) => Err(e),
        }
    }

    /// The exit record, if the process has exited.
    pub fn exit_info(&self) -> Result<Option<ExitInfo>> {
        Ok(monitor_process::read_exit_file(&self.state_dir)?)
    }

    /// Runs a command in the container and collects its output (16 MiB per
    /// stream at most). `req.timeout_ms` kills it (reported as `timed_out`).
    pub fn exec_sync(&self, req: &ExecRequest) -> Result<ExecSyncOutput> {
        let mut sock = self.connect_ctl()?;
        let limit = exec_sync_limit(req.timeout_ms);
        sock.set_read_timeout(limit.or(Some(CALL_TIMEOUT)))?;
        match Self::request(&mut sock, &Request::ExecSync(req.clone()))? {
            Reply::ExecSyncStarted { .. } => {}
            other => return Err(unexpected(other)),
        }
        sock.set_read_timeout(limit)?;
        let mut out = ExecSyncOutput::new();
        loop {
            let Some((stream, payload)) = frame::read_frame(&mut sock)? else {
                return Err(Error::Gone);
            };
            if let Some(end) = out.take_frame(stream, &payload) {
                return end.map(|()| out);
            }
        }
    }

    /// Starts an exec session (its own monitor; attach to it next).
    pub fn exec(&self, req: &ExecRequest) -> Result<ExecSession> {
        match self.call(&Request::Exec(req.clone()))? {
            Reply::ExecStarted(s) => Ok(ExecSession {
                exec_id: s.exec_id,
                pid: s.pid,
                shim: Shim::from_parts(s.state_dir, s.shim_pid, s.pid),
            }),
            other => Err(unexpected(other)),
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
        Ok(monitor_process::kill_if_shim_of(
            self.shim_pid,
            &self.state_dir,
        )?)
    }
}
