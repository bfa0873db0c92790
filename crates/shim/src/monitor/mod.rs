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
//! SIGCHLD (every child is reaped), the control and attach listeners and
//! their connections, the container's stdout and stderr pipes (or the pty
//! master), its stdin, and the pipes of running exec-syncs. Calls into the
//! OCI runtime are synchronous: they take as long as the runtime takes
//! (tens of ms), never as long as a container process.
//!
//! # Modules, one concern each
//!
//! - [`startup`]: process and descriptor hygiene, detaching, the start-up
//!   report, creating the container (or exec process) through the runtime.
//! - [`container_io`]: the process's stdio (pipes or a pty) and its
//!   [`container_log`].
//! - [`attach`]: attach clients (output fan-out, stdin, resize).
//! - [`control`]: the control socket's requests.
//! - [`exec_sync`]: exec-syncs, run by this monitor, streamed to their
//!   control connection.
//! - [`exec_session`]: exec sessions, each in a monitor of its own.
//! - [`exit`]: reaping children, the exit record, [`oom`] detection.
//! - [`conn`]: a buffered non-blocking connection.
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

mod attach;
mod conn;
mod container_io;
mod container_log;
mod control;
mod error;
mod exec_session;
mod exec_sync;
mod exit;
mod oom;
mod startup;

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crust_linux::children::{ChildExit, ChildSignals};
use crust_linux::poll::{PollFd, PollFlags};
use crust_linux::process as sys;
use crust_shim_protocol::{ExitInfo, RuntimeConfig, Status};

use crate::runtime::OciRuntime;
use attach::Attachers;
use container_io::ContainerIo;
use control::Controls;
use exec_sync::Jobs;
use oom::OomWatch;

pub use error::Error;
pub use exec_session::build_process;
pub use startup::run;

/// Output queued for an exec session's clients (or an exec-sync's control
/// connection) before the process's pipes are no longer read.
const BACKPRESSURE: usize = 256 * 1024;
/// How long the monitor tries to flush its clients after the exit.
const LINGER: Duration = Duration::from_secs(2);
/// Quiet time after a request before the monitor trims its working set.
const TRIM_AFTER: Duration = Duration::from_secs(2);

/// What this monitor watches over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A container (`crust-shim container DIR`).
    Container,
    /// An exec session (`crust-shim exec DIR`).
    Exec,
}

/// Which source a poll entry is for.
#[derive(Debug, Clone, Copy)]
enum Tok {
    Signal,
    CtlListen,
    AttachListen,
    Output(usize),
    Stdin,
    OomEvents,
    Ctl(u64),
    Attach(u64),
    JobOut(u64, usize),
}

/// The descriptors of one `poll(2)` round, with what each is for.
#[derive(Default)]
struct PollSet<'a> {
    entries: Vec<(BorrowedFd<'a>, PollFlags, Tok)>,
}

impl<'a> PollSet<'a> {
    fn add(&mut self, fd: BorrowedFd<'a>, events: PollFlags, tok: Tok) {
        self.entries.push((fd, events, tok));
    }

    /// One poll(2); the ready entries.
    fn wait(self, timeout: Option<Duration>) -> std::io::Result<Vec<(Tok, PollFlags)>> {
        let mut fds: Vec<PollFd<'_>> = self
            .entries
            .iter()
            .map(|(fd, ev, _)| PollFd::new(*fd, *ev))
            .collect();
        crust_linux::poll::poll(&mut fds, timeout)?;
        Ok(fds
            .iter()
            .zip(self.entries.iter())
            .filter_map(|(p, (_, _, tok))| p.revents().filter(|r| !r.is_empty()).map(|r| (*tok, r)))
            .collect())
    }
}

/// Ids for connections and exec-syncs, unique for the monitor's lifetime.
#[derive(Debug, Default)]
struct Ids(u64);

impl Ids {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

/// The monitored process and everything attached to it.
struct Monitor {
    mode: Mode,
    dir: PathBuf,
    /// The container's id as the runtime knows it.
    id: String,
    bundle: PathBuf,
    runtime_cfg: RuntimeConfig,
    runtime: Box<dyn OciRuntime>,
    shim_pid: i32,
    /// The container's init (or the exec process).
    pid: i32,
    status: Status,
    children: ChildSignals,
    io: ContainerIo,
    attach: Attachers,
    ctl: Controls,
    jobs: Jobs,
    ids: Ids,
    oom: Option<OomWatch>,
    /// The process has been reaped, its exit not yet recorded.
    reaped: Option<(ChildExit, SystemTime)>,
    exit: Option<ExitInfo>,
    linger_until: Option<Instant>,
    /// When to give back memory touched by the last burst of work.
    trim_at: Option<Instant>,
    /// A container to be restored from CRIU images at `Start`, with the
    /// stdio its restored processes get; `pid` is 0 until then.
    pending_restore: Option<(crust_shim_protocol::RestoreConfig, crate::runtime::Stdio)>,
    /// When `Start` started the process (Unix ns), 0 before.
    started_at: i64,
}

impl Monitor {
    fn run(&mut self) {
        // Start-up touched much that the loop never needs again.
        let mut trim_now = true;
        loop {
            self.progress();
            if self.trim_at.is_some_and(|t| Instant::now() >= t) {
                self.trim_at = None;
                trim_now = true;
            }
            if self.done() {
                break;
            }
            let timeout = self.poll_timeout();
            let set = self.poll_set();
            if trim_now {
                // Right before the wait, so that what an idle monitor keeps
                // mapped is the wait itself, not the round that led to it.
                sys::trim_working_set();
                trim_now = false;
            }
            let ready = match set.wait(timeout) {
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

    fn trim_soon(&mut self) {
        self.trim_at = Some(Instant::now() + TRIM_AFTER);
    }

    fn done(&self) -> bool {
        if self.exit.is_none() || !self.jobs.is_empty() {
            return false;
        }
        let flushed = self.attach.flushed() && self.ctl.flushed();
        flushed || self.linger_until.is_some_and(|t| Instant::now() >= t)
    }

    fn poll_timeout(&self) -> Option<Duration> {
        let deadlines = [
            self.linger_until,
            self.trim_at,
            self.jobs.next_deadline(),
            self.attach_deadline(),
        ];
        let next = deadlines.into_iter().flatten().min()?;
        let ms = next.saturating_duration_since(Instant::now()).as_millis() + 1;
        Some(Duration::from_millis(ms.min(60_000) as u64))
    }

    fn poll_set(&self) -> PollSet<'_> {
        let mut set = PollSet::default();
        set.add(self.children.as_fd(), PollFlags::POLLIN, Tok::Signal);
        for fd in self.oom.iter().flat_map(|w| w.changes_fds()) {
            set.add(fd, PollFlags::POLLIN, Tok::OomEvents);
        }
        if self.exit.is_none() {
            self.ctl.register_listener(&mut set);
            self.attach.register_listener(&mut set);
        }
        let read_outputs = match self.mode {
            Mode::Container => true,
            // Nothing is read before a client is there to get it.
            Mode::Exec => !self.attach.is_empty() && self.attach.max_pending() < BACKPRESSURE,
        };
        let stdin_room = self
            .io
            .register(&mut set, read_outputs && self.exit.is_none());
        self.attach.register(&mut set, stdin_room);
        self.ctl.register(&mut set);
        self.jobs.register(&mut set, &self.ctl);
        set
    }

    fn dispatch(&mut self, tok: Tok, flags: PollFlags) {
        match tok {
            Tok::Signal => self.on_child_signal(),
            Tok::CtlListen => self.ctl.accept(&mut self.ids),
            Tok::AttachListen => {
                self.attach.accept(&mut self.ids);
                // An attached client that then sits quiet is an idle
                // monitor too.
                self.trim_soon();
            }
            Tok::Output(i) => self.read_output(i, false),
            Tok::Stdin => self.io.flush_stdin(),
            Tok::OomEvents => {
                if let Some(w) = &mut self.oom {
                    w.on_change();
                }
            }
            Tok::Ctl(id) => self.on_ctl(id, flags),
            Tok::Attach(id) => self.on_attach(id, flags),
            Tok::JobOut(id, i) => self.read_job(id, i, false),
        }
    }

    /// Timers and state changes after each round of events.
    fn progress(&mut self) {
        self.progress_jobs();
        match self.mode {
            Mode::Exec => self.progress_exec_session(),
            Mode::Container => {
                if self.reaped.is_some() && self.exit.is_none() {
                    self.finalize();
                }
            }
        }
        self.drop_dead_attach_clients();
        self.drop_finished_ctl_clients();
    }

    /// Reads container output `i` into the log and to attach clients.
    /// `drain`: until nothing is left (after the exit).
    fn read_output(&mut self, i: usize, drain: bool) {
        let drop_slow = self.mode == Mode::Container;
        let attach = &mut self.attach;
        self.io.read_output(i, drain, |stream, data| {
            attach.broadcast(stream, data, drop_slow)
        });
    }
}
