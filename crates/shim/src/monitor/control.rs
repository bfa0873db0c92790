//! The control socket: length-prefixed JSON requests, one answer each (see
//! `crust_shim_protocol::messages`). `Wait` and `ExecSync` answer late: the
//! connection waits (is not read) until the process exits or the exec-sync
//! ends.

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::Path;

use crust_linux::poll::PollFlags;
use crust_shim_protocol::{
    ErrorReply, MAX_MESSAGE, Reply, Request, Response, State, Status, frame,
};

use super::conn::Conn;
use super::{Error, Ids, Mode, Monitor, PollSet, Tok};

/// What a control connection waits for (it is not read meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    No,
    /// The process's exit (a `Wait`).
    Exit,
    /// The end of exec-sync job `id`.
    Job(u64),
}

struct CtlClient {
    conn: Conn,
    waiting: Waiting,
}

/// The control listener and its connections.
pub(super) struct Controls {
    listener: UnixListener,
    clients: BTreeMap<u64, CtlClient>,
}

impl Controls {
    pub fn new(listener: UnixListener) -> Controls {
        Controls {
            listener,
            clients: BTreeMap::new(),
        }
    }

    pub fn register_listener<'a>(&'a self, set: &mut PollSet<'a>) {
        set.add(self.listener.as_fd(), PollFlags::POLLIN, Tok::CtlListen);
    }

    /// Connections: readable unless waiting, writable while output waits.
    pub fn register<'a>(&'a self, set: &mut PollSet<'a>) {
        for (id, c) in &self.clients {
            let mut ev = PollFlags::empty();
            if !c.conn.eof && c.waiting == Waiting::No {
                ev |= PollFlags::POLLIN;
            }
            if c.conn.pending() > 0 {
                ev |= PollFlags::POLLOUT;
            }
            set.add(c.conn.sock.as_fd(), ev, Tok::Ctl(*id));
        }
    }

    pub fn accept(&mut self, ids: &mut Ids) {
        while let Ok((sock, _)) = self.listener.accept() {
            let Ok(conn) = Conn::new(sock) else { continue };
            self.clients.insert(
                ids.next(),
                CtlClient {
                    conn,
                    waiting: Waiting::No,
                },
            );
        }
    }

    /// Everything sent, or nobody left to send it to.
    pub fn flushed(&self) -> bool {
        self.clients.values().all(|c| c.conn.settled())
    }

    /// Output queued for connection `id` (0 if it is gone).
    pub fn pending(&self, id: u64) -> usize {
        self.clients.get(&id).map_or(0, |c| c.conn.pending())
    }

    pub fn set_waiting(&mut self, id: u64, waiting: Waiting) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.waiting = waiting;
        }
    }

    /// Queues `resp` for connection `id` and writes what the socket takes.
    pub fn send(&mut self, id: u64, resp: &Response) {
        if let Some(c) = self.clients.get_mut(&id) {
            let body = serde_json::to_vec(resp).unwrap_or_default();
            c.conn.queue_message(&body);
            c.conn.flush();
        }
    }

    /// Queues an attach frame for connection `id` (exec-sync output);
    /// returns what is still queued, `None` if the connection is gone.
    pub fn send_frame(&mut self, id: u64, stream: u8, payload: &[u8]) -> Option<usize> {
        let c = self.clients.get_mut(&id)?;
        c.conn.queue_frame(stream, payload);
        c.conn.flush();
        Some(c.conn.pending())
    }

    /// Answers every connection waiting for the exit with `resp`.
    pub fn answer_waiters(&mut self, resp: &Response) {
        let body = serde_json::to_vec(resp).unwrap_or_default();
        for c in self.clients.values_mut() {
            if c.waiting == Waiting::Exit {
                c.conn.queue_message(&body);
                c.waiting = Waiting::No;
                c.conn.flush();
            }
        }
    }

    /// Flushes and reads connection `id`; false if it is not to be read now
    /// (gone, or waiting for a late answer).
    fn on_ready(&mut self, id: u64, flags: PollFlags) -> bool {
        let Some(c) = self.clients.get_mut(&id) else {
            return false;
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
            return false;
        }
        if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            c.conn.fill(MAX_MESSAGE + 4);
        }
        true
    }

    /// The next complete request of connection `id`, unless it waits for a
    /// late answer. A malformed frame kills the connection.
    fn next_message(&mut self, id: u64) -> Option<Vec<u8>> {
        let c = self.clients.get_mut(&id)?;
        if c.waiting != Waiting::No {
            return None;
        }
        match frame::take_message(&mut c.conn.rbuf) {
            Ok(body) => body,
            Err(_) => {
                c.conn.dead = true;
                None
            }
        }
    }

    /// Removes connections that are broken, or closed with nothing left to
    /// send or wait for; returns what each was waiting for.
    fn take_finished(&mut self) -> Vec<Waiting> {
        let done: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| {
                c.conn.dead || (c.conn.eof && c.waiting == Waiting::No && c.conn.pending() == 0)
            })
            .map(|(id, _)| *id)
            .collect();
        done.into_iter()
            .filter_map(|id| self.clients.remove(&id))
            .map(|c| c.waiting)
            .collect()
    }
}

impl Monitor {
    pub(super) fn on_ctl(&mut self, id: u64, flags: PollFlags) {
        if !self.ctl.on_ready(id, flags) {
            return;
        }
        while let Some(body) = self.ctl.next_message(id) {
            self.trim_soon();
            let answer = match serde_json::from_slice::<Request>(&body) {
                Ok(req) => self.handle(id, req),
                Err(e) => Some(Err(Error::InvalidArgument(format!("bad request: {e}")))),
            };
            if let Some(answer) = answer {
                let resp = match answer {
                    Ok(r) => Response::Ok(r),
                    Err(e) => Response::Err(ErrorReply {
                        kind: e.kind(),
                        message: e.to_string(),
                    }),
                };
                self.ctl.send(id, &resp);
            }
        }
    }

    pub(super) fn drop_finished_ctl_clients(&mut self) {
        for waiting in self.ctl.take_finished() {
            if let Waiting::Job(j) = waiting {
                // Nobody wants the result any more.
                self.jobs.abandon(j);
            }
        }
    }

    /// Handles one request; `None` when it is answered later.
    fn handle(&mut self, client: u64, req: Request) -> Option<Result<Reply, Error>> {
        Some(match req {
            Request::State => Ok(Reply::State(State {
                shim_pid: self.shim_pid,
                pid: self.pid,
                status: self.status,
                exit: self.exit.clone(),
                log_dropped_bytes: self.io.log_dropped_bytes(),
                started_at_unix_nanos: self.started_at,
            })),
            Request::Wait => match &self.exit {
                Some(e) => Ok(Reply::Exited(e.clone())),
                None => {
                    self.ctl.set_waiting(client, Waiting::Exit);
                    return None;
                }
            },
            Request::Start => self.container_only().and_then(|_| self.start()),
            Request::Kill { signal, all } => self.kill(signal, all),
            Request::Update { resources } => {
                self.container_only().and_then(|_| self.update(&resources))
            }
            Request::Checkpoint {
                image_path,
                work_path,
            } => self
                .container_only()
                .and_then(|_| self.checkpoint(&image_path, &work_path)),
            Request::ReopenLog => self.io.reopen_log().map(|_| Reply::Done),
            Request::Resize { width, height } => self.io.resize(width, height).map(|_| Reply::Done),
            Request::ExecSync(req) => {
                match self
                    .container_only()
                    .and_then(|_| self.start_job(client, req))
                {
                    Ok(pid) => {
                        self.ctl
                            .send(client, &Response::Ok(Reply::ExecSyncStarted { pid }));
                        return None;
                    }
                    Err(e) => Err(e),
                }
            }
            Request::Exec(req) => self
                .container_only()
                .and_then(|_| self.start_exec_session(req)),
        })
    }

    fn container_only(&self) -> Result<(), Error> {
        match self.mode {
            Mode::Container => Ok(()),
            Mode::Exec => Err(Error::InvalidArgument(
                "not for an exec session".to_string(),
            )),
        }
    }

    fn start(&mut self) -> Result<Reply, Error> {
        if self.status == Status::Created
            && self.reaped.is_none()
            && let Some((restore, stdio)) = self.pending_restore.take()
        {
            return self.restore(&restore, stdio);
        }
        match self.status {
            Status::Created if self.reaped.is_none() => {
                self.runtime.start(&self.id)?;
                self.status = Status::Running;
                self.started_at = unix_nanos_now();
                Ok(Reply::Done)
            }
            Status::Running => Err(Error::FailedPrecondition("already started")),
            _ => Err(Error::FailedPrecondition("the process has exited")),
        }
    }

    /// Blocks the loop while criu restores (the output pipes fill at most
    /// until then); a failure leaves no process, so the monitor ends as if
    /// it had exited (128, as a failed start is reported).
    fn restore(
        &mut self,
        restore: &crust_shim_protocol::RestoreConfig,
        stdio: crate::runtime::Stdio,
    ) -> Result<Reply, Error> {
        let pid_file = self.dir.join(crust_shim_protocol::CONTAINER_PID_FILE);
        let r = self.runtime.restore(
            &self.id,
            crate::runtime::RestoreOptions {
                bundle: &self.bundle,
                pid_file: &pid_file,
                image_path: &restore.image_path,
                work_path: &restore.work_path,
                stdio,
            },
        );
        match r {
            Ok(pid) => {
                self.pid = pid;
                self.oom = super::oom::OomWatch::for_pid(pid);
                self.status = Status::Running;
                self.started_at = unix_nanos_now();
                Ok(Reply::Done)
            }
            Err(e) => {
                self.never_ran(crust_linux::children::ChildExit::Exited(128));
                Err(e.into())
            }
        }
    }

    /// A restore that never ran (failed, or killed before `Start`): the
    /// monitor records the end and exits; there is no process to reap.
    fn never_ran(&mut self, exit: crust_linux::children::ChildExit) {
        self.pending_restore = None;
        self.reaped = Some((exit, std::time::SystemTime::now()));
    }

    fn kill(&mut self, signal: i32, all: bool) -> Result<Reply, Error> {
        if self.exit.is_some() || self.reaped.is_some() {
            // Idempotent: it is already gone.
            return Ok(Reply::Done);
        }
        if self.pid == 0 && self.mode == Mode::Container {
            // A restore not started: nothing runs; never signal pid 0
            // (our own process group).
            self.never_ran(crust_linux::children::ChildExit::Signaled(signal));
            return Ok(Reply::Done);
        }
        if !crust_linux::process::is_valid_signal(signal) {
            return Err(Error::InvalidArgument(format!("bad signal {signal}")));
        }
        if all && self.mode == Mode::Container {
            self.runtime.kill(&self.id, signal, true)?;
        } else {
            // The process is our child (we are its subreaper) and not yet
            // reaped, so its pid cannot have been reused.
            crust_linux::process::send_signal(self.pid, signal).map_err(Error::io("kill"))?;
        }
        Ok(Reply::Done)
    }

    /// Blocks the monitor's loop while criu dumps: the container is frozen
    /// meanwhile anyway, and its output waits in the pipes.
    fn checkpoint(&mut self, image_path: &Path, work_path: &Path) -> Result<Reply, Error> {
        if self.exit.is_some() || self.status != Status::Running {
            return Err(Error::FailedPrecondition("the container is not running"));
        }
        self.runtime.checkpoint(&self.id, image_path, work_path)?;
        Ok(Reply::Done)
    }

    fn update(&mut self, resources: &serde_json::Value) -> Result<Reply, Error> {
        if self.exit.is_some() {
            return Err(Error::FailedPrecondition("the process has exited"));
        }
        let name = "update-resources.json";
        let path = self.dir.join(name);
        let data =
            serde_json::to_vec(resources).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        fs::write(&path, data).map_err(Error::io(format!("writing {name}")))?;
        let r = self.runtime.update(&self.id, &path);
        let _ = fs::remove_file(&path);
        r?;
        Ok(Reply::Done)
    }
}

/// Now, in nanoseconds since the Unix epoch.
fn unix_nanos_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}
