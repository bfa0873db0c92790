//! Bounded retries of syscalls that a busy node answers with a transient
//! error:
//! - `EAGAIN` from `openat2` with `RESOLVE_IN_ROOT`/`RESOLVE_BENEATH`: a
//!   mount or a rename anywhere on the system during a lookup that went
//!   through `..` (the kernel's mount_lock/rename_lock sequence checks);
//! - `EINTR` from a call a signal interrupted (writes to cgroupfs files,
//!   mount, ...);
//! - `EBUSY` where the caller knows it passes (rmdir of a cgroup while the
//!   kernel still tears down its last tasks), never by default: EBUSY is
//!   usually permanent (a mount in use, a cgroup with children).
//!
//! Use:
//! ```
//! use crust_linux::retry::{self, Retry};
//! # let call = || Ok::<(), nix::errno::Errno>(());
//! // EAGAIN and EINTR, the default bound (16 calls, ~50 ms at worst):
//! retry::transient(|| call())?;
//! // EBUSY too, waiting up to ~2 s in 10 ms steps:
//! Retry::BUSY.delays(std::time::Duration::from_millis(10), std::time::Duration::from_millis(10))
//!     .attempts(200)
//!     .run(|| call())?;
//! # Ok::<(), nix::errno::Errno>(())
//! ```
//! The closure is run again as a whole, so it must be safe to repeat (an
//! open, a write of a whole value, an rmdir). After the last attempt the
//! last error is returned unchanged: callers classify it as they would
//! without retries. Works with any error that carries an errno
//! ([`HasErrno`]: [`Errno`], [`std::io::Error`], [`crate::Error`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::errno::Errno;

/// An error that may carry the kernel's errno.
pub trait HasErrno {
    fn errno(&self) -> Option<Errno>;
}

impl HasErrno for Errno {
    fn errno(&self) -> Option<Errno> {
        Some(*self)
    }
}

impl HasErrno for std::io::Error {
    fn errno(&self) -> Option<Errno> {
        self.raw_os_error().map(Errno::from_raw)
    }
}

impl HasErrno for crate::Error {
    fn errno(&self) -> Option<Errno> {
        use std::error::Error as _;
        match self {
            crate::Error::Sys { source, .. } => Some(*source),
            crate::Error::Io { source, .. } | crate::Error::Sysctl { source, .. } => source.errno(),
            other => other
                .source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(HasErrno::errno),
        }
    }
}

/// Which errors are retried, how often and how long apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    busy: bool,
    attempts: u32,
    first_delay: Duration,
    max_delay: Duration,
}

/// How many times any [`Retry`] retried in this process (a test under
/// load can see that the path was taken).
static RETRIED: AtomicU64 = AtomicU64::new(0);

impl Retry {
    /// EAGAIN and EINTR, 16 attempts: the first retry after 50 µs, then
    /// doubling up to 5 ms (about 50 ms in all at worst). Long enough to
    /// outlast a burst of mounts (a lazy unmount's release, a node starting
    /// many pods), short for a CRI call.
    pub const TRANSIENT: Retry = Retry {
        busy: false,
        attempts: 16,
        first_delay: Duration::from_micros(50),
        max_delay: Duration::from_millis(5),
    };

    /// [`Retry::TRANSIENT`] and EBUSY.
    pub const BUSY: Retry = Retry {
        busy: true,
        ..Retry::TRANSIENT
    };

    /// At most `n` calls in all (at least one).
    pub const fn attempts(self, n: u32) -> Retry {
        Retry {
            attempts: if n == 0 { 1 } else { n },
            ..self
        }
    }

    /// The pause before the first retry, doubling up to `max` before later
    /// ones (none after EINTR: the signal has been handled).
    pub const fn delays(self, first: Duration, max: Duration) -> Retry {
        Retry {
            first_delay: first,
            max_delay: max,
            ..self
        }
    }

    /// Whether `errno` is one this policy retries.
    pub fn retries(&self, errno: Errno) -> bool {
        matches!(errno, Errno::EAGAIN | Errno::EINTR) || (self.busy && errno == Errno::EBUSY)
    }

    /// Calls `f` until it succeeds, fails with an error this policy does
    /// not retry, or the attempts are used up; returns its last result.
    pub fn run<T, E: HasErrno>(&self, mut f: impl FnMut() -> Result<T, E>) -> Result<T, E> {
        let mut delay = self.first_delay;
        let mut left = self.attempts.max(1);
        loop {
            let err = match f() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            left -= 1;
            if left == 0 || !err.errno().is_some_and(|n| self.retries(n)) {
                return Err(err);
            }
            RETRIED.fetch_add(1, Ordering::Relaxed);
            // EINTR: the signal has been handled, go again at once.
            if err.errno() != Some(Errno::EINTR) && !delay.is_zero() {
                std::thread::sleep(delay);
                delay = (delay * 2).min(self.max_delay);
            }
        }
    }
}

/// [`Retry::TRANSIENT`]`.run(f)`: EAGAIN and EINTR, bounded.
pub fn transient<T, E: HasErrno>(f: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    Retry::TRANSIENT.run(f)
}

/// How many retries [`Retry::run`] made in this process so far.
pub fn retried() -> u64 {
    RETRIED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Calls = std::rc::Rc<std::cell::Cell<usize>>;

    /// A call that fails with `errs` in turn, then succeeds with the
    /// number of calls before it; and that number.
    fn failing(errs: &[Errno]) -> (impl FnMut() -> Result<usize, Errno> + use<>, Calls) {
        let calls = std::rc::Rc::new(std::cell::Cell::new(0));
        let c = calls.clone();
        let errs = errs.to_vec();
        let f = move || {
            let n = c.get();
            c.set(n + 1);
            match errs.get(n) {
                Some(e) => Err(*e),
                None => Ok(n),
            }
        };
        (f, calls)
    }

    #[test]
    fn transient_errors_are_retried_until_success() {
        let (f, calls) = failing(&[Errno::EAGAIN, Errno::EINTR, Errno::EAGAIN]);
        assert_eq!(transient(f), Ok(3));
        assert_eq!(calls.get(), 4);
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        for e in [
            Errno::ENOENT,
            Errno::ELOOP,
            Errno::EXDEV,
            Errno::EPERM,
            Errno::EBUSY,
        ] {
            let (f, calls) = failing(&[e, Errno::EAGAIN]);
            assert_eq!(transient(f), Err(e));
            assert_eq!(calls.get(), 1, "{e}");
        }
    }

    #[test]
    fn a_transient_error_then_a_permanent_one_keeps_the_permanent_one() {
        let (f, calls) = failing(&[Errno::EAGAIN, Errno::ENOENT]);
        assert_eq!(transient(f), Err(Errno::ENOENT));
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn attempts_are_bounded_and_the_last_error_returned() {
        let (f, calls) = failing(&[Errno::EAGAIN; 100]);
        let t = std::time::Instant::now();
        assert_eq!(transient(f), Err(Errno::EAGAIN));
        assert_eq!(calls.get(), 16);
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(40), "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
        let (f, calls) = failing(&[Errno::EINTR; 100]);
        assert_eq!(Retry::TRANSIENT.attempts(3).run(f), Err(Errno::EINTR));
        assert_eq!(calls.get(), 3);
        let (f, calls) = failing(&[Errno::EAGAIN; 100]);
        assert_eq!(Retry::TRANSIENT.attempts(0).run(f), Err(Errno::EAGAIN));
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn busy_only_where_asked() {
        let (f, calls) = failing(&[Errno::EBUSY, Errno::EBUSY]);
        let quick = Retry::BUSY.delays(Duration::ZERO, Duration::ZERO);
        assert_eq!(quick.run(f), Ok(2));
        assert_eq!(calls.get(), 3);
        assert!(!Retry::TRANSIENT.retries(Errno::EBUSY));
        assert!(Retry::BUSY.retries(Errno::EBUSY));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let (f, _) = failing(&[Errno::EAGAIN; 5]);
        let t = std::time::Instant::now();
        let r = Retry::TRANSIENT
            .delays(Duration::from_millis(2), Duration::from_millis(4))
            .attempts(6)
            .run(f);
        assert_eq!(r, Ok(5));
        // 2 + 4 + 4 + 4 + 4 ms.
        assert!(
            t.elapsed() >= Duration::from_millis(18),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn io_and_crate_errors_carry_their_errno() {
        let io = std::io::Error::from_raw_os_error(libc::EAGAIN);
        assert_eq!(io.errno(), Some(Errno::EAGAIN));
        assert_eq!(std::io::Error::other("x").errno(), None);
        let e = crate::Error::io("open", "/x")(std::io::Error::from_raw_os_error(libc::EINTR));
        assert_eq!(e.errno(), Some(Errno::EINTR));
        assert_eq!(
            crate::Error::sys("mount")(Errno::EBUSY).errno(),
            Some(Errno::EBUSY)
        );
        assert_eq!(crate::Error::invalid("x", "y").errno(), None);
        let mut n = 0;
        let r: Result<(), std::io::Error> = transient(|| {
            n += 1;
            Err(std::io::Error::from_raw_os_error(libc::EINTR))
        });
        assert!(r.is_err());
        assert_eq!(n, 16);
    }

    #[test]
    fn retries_are_counted() {
        let before = retried();
        let (f, _) = failing(&[Errno::EINTR, Errno::EINTR]);
        transient(f).unwrap();
        assert!(retried() >= before + 2);
    }
}
