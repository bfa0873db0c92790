//! Starting a process in a cgroup v2 group at clone time
//! (`clone3(CLONE_INTO_CGROUP)`, Linux 5.7+) instead of moving it there
//! after the fact: a write to `cgroup.procs` migrates a running process,
//! which takes the cgroup subsystem's global thread-group lock for writing
//! (an RCU grace period where nothing else may fork or exit meanwhile); a
//! process cloned into its cgroup never migrates.
//!
//! On cgroup v1 or hybrid hosts there is no such thing ([`unified_cgroup_of`]
//! answers `None`), and a kernel, seccomp filter or cgroup may refuse the
//! flag ([`is_refusal`]): callers then move the process the old way
//! ([`join_cgroup`], then fork).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use crate::process::SingleThreaded;

/// `statfs(2)` magic number of cgroup2.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `clone3(2)` flag: the child starts in the cgroup `clone_args.cgroup`
/// names.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The kernel's `struct clone_args`, up to `cgroup` (CLONE_ARGS_SIZE_VER2:
/// 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Why [`fork_into_cgroup`] made no process.
#[derive(Debug, thiserror::Error)]
pub enum ForkIntoCgroupError {
    /// The kernel, a seccomp filter or the cgroup will not place a new
    /// process this way (see [`is_refusal`]): the caller may move the
    /// process the old way.
    #[error("clone3(CLONE_INTO_CGROUP) refused: {0}")]
    Refused(io::Error),
    /// A failure the old way would meet as well (no memory, the pids
    /// limit).
    #[error("clone3: {0}")]
    Failed(io::Error),
}

/// Whether `errno` from `clone3(CLONE_INTO_CGROUP)` means "not this way"
/// rather than "not at all":
/// - ENOSYS: no clone3 (before 5.3), or a seccomp filter that hides it
///   (Docker's default profile does, so that libc falls back to clone);
/// - E2BIG, EINVAL: a 5.3–5.6 kernel, which knows neither the larger
///   `clone_args` nor the flag;
/// - EPERM, EACCES: a filter or LSM, or no write access to the cgroup in
///   the caller's (joined) namespaces; ENOENT: the cgroup is outside the
///   caller's cgroup namespace; EBADF: the descriptor is no cgroup2
///   directory; EOPNOTSUPP: a cgroup that takes no processes this way.
///
/// The old way (a write to `cgroup.procs`, then fork) may still work after
/// any of them, or fails with its own, familiar error. EAGAIN (the pids
/// limit), ENOMEM, EBUSY and the like would fail it the same way.
pub fn is_refusal(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOSYS
            | libc::E2BIG
            | libc::EINVAL
            | libc::EPERM
            | libc::EACCES
            | libc::ENOENT
            | libc::EBADF
            | libc::EOPNOTSUPP
    )
}

/// `fork(2)`, with the child starting in the cgroup v2 directory `cgroup`
/// (an open descriptor of it): `Ok(None)` in the child, `Ok(Some(pid))` in
/// the parent.
///
/// The child is a copy of this (single-threaded) process as after `fork`,
/// except that libc's atfork handlers did not run (nothing of crust's
/// registers any) and libc's cached thread id in the child is the
/// parent's (glibc looks the real one up where it matters: raise, abort).
pub fn fork_into_cgroup(
    _: &SingleThreaded,
    cgroup: BorrowedFd<'_>,
) -> Result<Option<i32>, ForkIntoCgroupError> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // EAGAIN: the cgroup's pids limit (or RLIMIT_NPROC), which processes
    // still being reaped may free in a moment: a few tries, a few ms.
    // Nothing was created when it fails, so trying again is safe.
    let ret = crate::retry::Retry::TRANSIENT.attempts(4).run(|| {
        // SAFETY: clone3 with no stack, no CLONE_VM and no other flags is
        // fork: the child gets a copy-on-write copy of this address space
        // and continues from here, on a copy of this stack. The process
        // is single-threaded (the SingleThreaded proof), so no lock can be
        // held by another thread in the child's copy. `args` is a valid,
        // fully initialised clone_args of the size passed; the kernel only
        // reads it.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(ret)
        }
    });
    match ret {
        Ok(0) => Ok(None),
        Ok(pid) => Ok(Some(pid as i32)),
        Err(e) => {
            if e.raw_os_error().is_some_and(is_refusal) {
                Err(ForkIntoCgroupError::Refused(e))
            } else {
                Err(ForkIntoCgroupError::Failed(e))
            }
        }
    }
}

/// The cgroup v2 directory process `pid` is in, opened, on a host with the
/// unified hierarchy alone at /sys/fs/cgroup; `None` on cgroup v1 and
/// hybrid hosts (and for a process in no v2 cgroup).
pub fn unified_cgroup_of(pid: i32) -> io::Result<Option<OwnedFd>> {
    let root = Path::new("/sys/fs/cgroup");
    let fs_type = nix::sys::statfs::statfs(root)?.filesystem_type().0 as i64;
    if fs_type != CGROUP2_SUPER_MAGIC {
        return Ok(None);
    }
    let procfile = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let Some(rel) = unified_path(&procfile) else {
        return Ok(None);
    };
    let dir = root.join(rel.trim_start_matches('/'));
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    Ok(Some(dir.into()))
}

/// The path of the `0::` line of a `/proc/PID/cgroup` that has no other
/// (v1) line; `None` otherwise, or for a path that climbs (`..`: the
/// process is outside the reader's cgroup namespace).
fn unified_path(procfile: &str) -> Option<&str> {
    let mut path = None;
    for line in procfile.lines().filter(|l| !l.is_empty()) {
        let p = line.strip_prefix("0::")?;
        if path.replace(p).is_some() {
            return None;
        }
    }
    path.filter(|p| p.starts_with('/') && !p.split('/').any(|c| c == ".."))
}

/// Moves this process into the cgroup v2 directory `cgroup` (writes its pid
/// to `cgroup.procs` there): the old way, for when [`fork_into_cgroup`] is
/// refused. Works in any mount namespace (the path is fd-relative).
pub fn join_cgroup(cgroup: BorrowedFd<'_>) -> io::Result<()> {
    // A migration may answer EAGAIN/EINTR on a busy node; the write of our
    // own pid is idempotent.
    crate::retry::transient(|| {
        let fd = openat(
            Some(cgroup.as_raw_fd()),
            "cgroup.procs",
            OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )?;
        // SAFETY: openat just returned `fd`; nothing else refers to it.
        let file = unsafe { File::from_raw_fd(fd) };
        (&file).write_all(std::process::id().to_string().as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_args_is_the_kernels_version_2() {
        assert_eq!(std::mem::size_of::<CloneArgs>(), 88);
    }

    #[test]
    fn kernels_and_filters_that_refuse_the_flag_mean_fall_back() {
        for errno in [
            libc::ENOSYS,
            libc::E2BIG,
            libc::EINVAL,
            libc::EPERM,
            libc::EOPNOTSUPP,
            libc::EBADF,
        ] {
            assert!(is_refusal(errno), "errno {errno}");
        }
        // The old way would fail the same way: no second try.
        for errno in [libc::EAGAIN, libc::ENOMEM, libc::EBUSY, libc::EINTR] {
            assert!(!is_refusal(errno), "errno {errno}");
        }
    }

    #[test]
    fn unified_path_of_a_pure_v2_process() {
        assert_eq!(
            unified_path("0::/kubepods.slice/crust-1.scope\n"),
            Some("/kubepods.slice/crust-1.scope")
        );
        assert_eq!(unified_path("0::/\n"), Some("/"));
        // Hybrid and v1: the v1 lines say the process is not v2-only.
        assert_eq!(unified_path("5:memory:/crust/x\n0::/crust/x\n"), None);
        assert_eq!(unified_path("5:memory:/crust/x\n"), None);
        // Outside our cgroup namespace.
        assert_eq!(unified_path("0::/../../x\n"), None);
        assert_eq!(unified_path(""), None);
    }
}
