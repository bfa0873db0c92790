//! Learning that children exited and reaping them: a signalfd for SIGCHLD
//! that a poll loop watches, and `waitpid`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    /// `exit(code)`.
    Exited(i32),
    /// Killed by this signal number.
    Signaled(i32),
}

/// SIGCHLD as a readable descriptor: readable whenever a child changed
/// state since the last [`ChildSignals::drain`].
#[derive(Debug)]
pub struct ChildSignals {
    fd: SignalFd,
}

impl ChildSignals {
    /// Blocks SIGCHLD for the calling thread (the whole process, in a
    /// single-threaded monitor) and opens a non-blocking, close-on-exec
    /// signalfd for it. Children this process forks start with it blocked
    /// too: they reset their mask before they exec anything.
    pub fn new() -> io::Result<ChildSignals> {
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
            .map_err(|e| io::Error::other(format!("blocking SIGCHLD: {e}")))?;
        let fd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(|e| io::Error::other(format!("signalfd: {e}")))?;
        Ok(ChildSignals { fd })
    }

    /// Reads every pending notification (then reap with [`try_reap`]).
    pub fn drain(&self) {
        while let Ok(Some(_)) = self.fd.read_signal() {}
    }
}

impl AsFd for ChildSignals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Reaps one child that has exited, without blocking: `None` when no child
/// has exited (or there are no children).
pub fn try_reap() -> Option<(i32, ChildExit)> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => {
                return Some((pid.as_raw(), ChildExit::Exited(code)));
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                return Some((pid.as_raw(), ChildExit::Signaled(sig as i32)));
            }
            Ok(WaitStatus::StillAlive) => return None,
            // Stopped, continued, ptrace events: not an exit.
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
}

/// Waits for the child `pid` to end and reaps it.
pub fn wait_for(pid: i32) -> io::Result<ChildExit> {
    loop {
        match waitpid(Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(ChildExit::Exited(code)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(ChildExit::Signaled(sig as i32)),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    // Reaped by `wait_for`, which is what is tested.
    #[allow(clippy::zombie_processes)]
    fn waits_for_exit_codes_and_signals() {
        let c = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
        assert_eq!(wait_for(c.id() as i32).unwrap(), ChildExit::Exited(7));
        let c = Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .spawn()
            .unwrap();
        assert_eq!(wait_for(c.id() as i32).unwrap(), ChildExit::Signaled(9));
        // Not our child (any more).
        assert!(wait_for(c.id() as i32).is_err());
    }
}
