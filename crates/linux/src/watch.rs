//! Being told when a file is modified (`inotify(7)`), for a poll loop: the
//! monitor learns of an OOM kill from the container's `memory.events` when
//! it happens, not only after the exit (when a systemd scope's cgroup, and
//! the file with it, may already be gone).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// A watch for modifications of one file; its descriptor is readable when
/// there are any.
#[derive(Debug)]
pub struct ModifiedWatch {
    inotify: Inotify,
}

impl ModifiedWatch {
    /// Watches `path` (non-blocking, close-on-exec).
    pub fn new(path: &Path) -> io::Result<ModifiedWatch> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(path, AddWatchFlags::IN_MODIFY)?;
        Ok(ModifiedWatch { inotify })
    }

    /// Reads what is pending, so the descriptor is quiet until the next
    /// modification; whether there was any.
    pub fn drain(&self) -> bool {
        let mut any = false;
        while let Ok(events) = self.inotify.read_events() {
            if events.is_empty() {
                break;
            }
            any = true;
        }
        any
    }
}

impl AsFd for ModifiedWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_write_makes_it_readable_and_drain_quiets_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "0").unwrap();
        let w = ModifiedWatch::new(&file).unwrap();
        let ready = || crate::poll::wait_readable(w.as_fd(), Duration::from_millis(20)).unwrap();
        assert!(!ready());
        assert!(!w.drain());
        std::fs::write(&file, "1").unwrap();
        assert!(ready());
        assert!(w.drain());
        assert!(!ready());
        assert!(ModifiedWatch::new(&dir.path().join("missing")).is_err());
    }
}
