//! `poll(2)` for a single-threaded event loop (the monitor) and for one
//! blocking read with a deadline.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::PollTimeout;
pub use nix::poll::{PollFd, PollFlags};

/// Waits until one of `fds` is ready or `timeout` passes (`None`: no
/// timeout); returns the number of ready entries, 0 on timeout or when a
/// signal interrupted the wait (the caller simply polls again).
pub fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> io::Result<usize> {
    let timeout = match timeout {
        None => PollTimeout::NONE,
        Some(t) => {
            let ms = i32::try_from(t.as_millis()).unwrap_or(i32::MAX);
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    };
    match nix::poll::poll(fds, timeout) {
        Ok(n) => Ok(n as usize),
        Err(nix::errno::Errno::EINTR) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Waits until `fd` is readable (data, end of file or an error to read) or
/// `timeout` passes; false on timeout.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut p = [PollFd::new(fd, PollFlags::POLLIN)];
    Ok(poll(&mut p, Some(timeout))? > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn readable_after_a_write_not_before() {
        let (r, mut w) = std::io::pipe().unwrap();
        assert!(!wait_readable(r.as_fd(), Duration::from_millis(10)).unwrap());
        w.write_all(b"x").unwrap();
        assert!(wait_readable(r.as_fd(), Duration::from_millis(10)).unwrap());
        drop(w);
        let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, None).unwrap(), 1);
        assert!(fds[0].revents().unwrap().contains(PollFlags::POLLIN));
    }
}
