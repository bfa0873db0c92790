//! Children and the end: every child is reaped (the monitor is their
//! subreaper); when the monitored process is, its exit is recorded in
//! `exit.json`, told to everyone waiting, and the container deleted from
//! the runtime.

use std::fs;
use std::time::{Instant, SystemTime};

use crust_linux::children::{self, ChildExit};
use crust_shim_protocol::exit_file::write_atomic;
use crust_shim_protocol::{
    ATTACH_SOCKET, CONSOLE_SOCKET, CONTROL_SOCKET, EXIT_FILE, ExitInfo, Reply, Response,
    SHIM_PID_FILE, Status,
};

use super::{LINGER, Mode, Monitor};
use crate::logfmt;

/// Exit code and signal: a signal `s` is `128 + s`, as containerd reports
/// it.
pub(super) fn exit_code(exit: ChildExit) -> (i32, Option<i32>) {
    match exit {
        ChildExit::Exited(code) => (code, None),
        ChildExit::Signaled(sig) => (128 + sig, Some(sig)),
    }
}

/// The record of `pid` ending with `exit` at `at`.
pub(super) fn exit_info(pid: i32, exit: ChildExit, at: SystemTime, oom_killed: bool) -> ExitInfo {
    let (exit_code, signal) = exit_code(exit);
    ExitInfo {
        pid,
        exit_code,
        signal,
        oom_killed,
        exited_at: logfmt::format_timestamp(at),
        exited_at_unix_nanos: logfmt::unix_nanos(at),
    }
}

impl Monitor {
    /// SIGCHLD: reaps every child that exited.
    pub(super) fn on_child_signal(&mut self) {
        self.children.drain();
        while let Some((pid, exit)) = children::try_reap() {
            if pid == self.pid && self.reaped.is_none() && self.exit.is_none() {
                self.reaped = Some((exit, SystemTime::now()));
                // At once, before the output is drained: the cgroup may go
                // with its last process (systemd scopes).
                if let Some(w) = &mut self.oom {
                    w.check();
                }
            } else {
                self.jobs.on_reaped(pid, exit);
            }
        }
    }

    /// The process has exited: drain, record, tell everyone, clean up.
    pub(super) fn finalize(&mut self) {
        let Some((exit, at)) = self.reaped.take() else {
            return;
        };
        for i in 0..self.io.output_count() {
            self.read_output(i, true);
        }
        self.io.close();
        let killed = matches!(exit, ChildExit::Signaled(s) if s == libc::SIGKILL);
        let oom = self.oom.as_mut().is_some_and(|w| w.oom_killed(killed));
        let info = exit_info(self.pid, exit, at, oom);
        match serde_json::to_vec(&info) {
            Ok(data) => {
                if let Err(e) = write_atomic(&self.dir, EXIT_FILE, &data) {
                    eprintln!("crust-shim: writing {EXIT_FILE}: {e}");
                }
            }
            Err(e) => eprintln!("crust-shim: encoding the exit: {e}"),
        }
        self.status = Status::Stopped;
        self.exit = Some(info.clone());
        self.ctl
            .answer_waiters(&Response::Ok(Reply::Exited(info.clone())));
        self.attach
            .send_exit(&serde_json::to_vec(&info).unwrap_or_default());
        self.jobs.kill_all();
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

    /// On the way out: the sockets and the pid file.
    pub(super) fn cleanup_files(&self) {
        for s in [CONTROL_SOCKET, ATTACH_SOCKET, CONSOLE_SOCKET, SHIM_PID_FILE] {
            let _ = fs::remove_file(self.dir.join(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_like_containerd() {
        assert_eq!(exit_code(ChildExit::Exited(42)), (42, None));
        assert_eq!(exit_code(ChildExit::Signaled(9)), (137, Some(9)));
        assert_eq!(exit_code(ChildExit::Signaled(15)), (143, Some(15)));
        let info = exit_info(
            7,
            ChildExit::Exited(42),
            std::time::UNIX_EPOCH + std::time::Duration::new(1, 5),
            false,
        );
        assert_eq!(info.exited_at, "1970-01-01T00:00:01.000000005Z");
        assert_eq!(info.exited_at_unix_nanos, 1_000_000_005);
        assert_eq!((info.pid, info.exit_code), (7, 42));
    }
}
