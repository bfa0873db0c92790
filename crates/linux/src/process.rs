//! Process-level calls for crust's monitor (crust-shim) and the children it
//! forks: fork, `_exit`, signal reset, descriptor passing, terminals, and
//! trimming an idle monitor's working set. Everything else goes through
//! nix's safe API.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::unistd::Pid;

/// `fork(2)`. `Ok(None)` in the child, `Ok(Some(pid))` in the parent.
///
/// Only call this while the process has a single thread (the monitor never
/// starts one): the child then owns a consistent copy of everything.
pub fn fork() -> io::Result<Option<Pid>> {
    fork_single_threaded(&SingleThreaded::check()?)
}

/// Proof that this process had a single thread when it was checked (for a
/// fork where /proc/self no longer resolves, e.g. after joining a
/// container's mount namespace). The monitor and its children never start
/// threads, so the proof stays true.
pub struct SingleThreaded(());

impl SingleThreaded {
    pub fn check() -> io::Result<SingleThreaded> {
        // Refuse, rather than risk a child that inherits a lock some other
        // thread held (e.g. if this library is ever called from the daemon).
        let threads = thread_count()?;
        if threads != 1 {
            return Err(io::Error::other(format!(
                "refusing to fork a process with {threads} threads"
            )));
        }
        Ok(SingleThreaded(()))
    }
}

/// `fork(2)` of a process known to be single-threaded.
pub fn fork_single_threaded(_: &SingleThreaded) -> io::Result<Option<Pid>> {
    // SAFETY: the process is single-threaded (no tokio, no threads spawned),
    // so no lock can be held by another thread at the time of the fork and
    // the child may run arbitrary code, as after any fork of a
    // single-threaded program.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(None),
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
    }
}

/// Number of threads of this process (from /proc/self/status).
pub fn thread_count() -> io::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no Threads: line in /proc/self/status"))
}

/// `_exit(2)`: ends the process without running destructors or atexit
/// handlers (for a forked child, or a parent that forked).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it never returns.
    unsafe { libc::_exit(code) }
}

/// Receives one file descriptor sent with `SCM_RIGHTS` on a Unix stream
/// socket (the pty master a runtime sends to its console socket).
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut buf = [0u8; 256];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut got: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel just installed `fd` in our table for this
                // message; nothing else refers to it, so we take ownership.
                got.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    // Keep the first, close any extra.
    got.into_iter()
        .next()
        .ok_or_else(|| io::Error::other("no file descriptor in the console socket message"))
}

/// `TIOCSWINSZ`: sets a terminal's window size.
pub fn set_winsize(fd: BorrowedFd<'_>, width: u16, height: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `fd` is an open descriptor for the duration of the call and
    // `ws` is a valid winsize that the kernel only reads.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `TIOCSCTTY`: makes the terminal `fd` the controlling terminal of this
/// process (a session leader without one).
pub fn set_controlling_terminal(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is open for the duration of the call; TIOCSCTTY takes an
    // integer argument (0: do not steal it from another session).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts a child (about to run an OCI runtime) back into a default signal
/// state: nothing blocked, SIGPIPE not ignored (ignored dispositions survive
/// exec and would leak into the container).
pub fn reset_signals() {
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // SAFETY: installing SIG_DFL is async-signal-safe and replaces no handler
    // that any code of ours relies on.
    let _ = unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

/// Raises this process's soft limit on open files to its hard limit (a
/// daemon holds a socket per live container); returns the soft limit it
/// had, for children that should keep it.
pub fn raise_open_files_limit() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(soft)
}

/// Sets the soft limit on open files (not above the hard limit).
pub fn set_open_files_soft_limit(soft: u64) -> io::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, soft.min(hard), hard)?;
    Ok(())
}

/// Marks `fd` non-blocking.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Gives back what start-up and request handling left mapped but no longer
/// use: the heap's free top (`malloc_trim`), and the page-table entries of
/// read-only file mappings (the binary's and the libraries' code and
/// constants) that hold no private copy of any page. Those pages stay in
/// the page cache, shared with every other monitor; only the ones the loop
/// touches again are mapped again (fault-around is switched off for them
/// with `MADV_RANDOM`, so a touch maps one page, not sixteen).
///
/// This is what keeps an idle monitor's RSS and PSS at what it actually
/// uses instead of everything start-up and the dynamic loader touched.
pub fn trim_working_set() {
    // The monitor is single-threaded: nothing maps or unmaps anything while
    // this runs, so every clean read-only file mapping qualifies.
    trim(|_| true);
}

/// [`trim_working_set`] for a multi-threaded process (the daemon, when
/// idle): only the mappings of its own executable and of the shared
/// libraries under /lib and /usr/lib are trimmed. Those are mapped once by
/// the loader and never unmapped while the process runs (nothing here calls
/// `dlclose`), so no other thread can replace one with memory of its own
/// between reading /proc/self/smaps and the `madvise`.
pub fn trim_working_set_of_program() {
    let exe = std::fs::read_link("/proc/self/exe").ok();
    trim(|path| {
        exe.as_deref()
            .is_some_and(|e| e == std::path::Path::new(path))
            || path.starts_with("/lib/")
            || path.starts_with("/usr/lib/")
    });
}

fn trim(path_ok: impl Fn(&str) -> bool) {
    // SAFETY: malloc_trim only releases free memory at the top of the heap
    // and in free chunks; it has no preconditions and takes the arenas'
    // locks itself.
    unsafe {
        libc::malloc_trim(0);
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    for (start, end) in trimmable_mappings(&smaps, &path_ok) {
        let (Some(addr), Some(len)) = (
            std::ptr::NonNull::new(start as *mut libc::c_void),
            std::num::NonZeroUsize::new(end - start),
        ) else {
            continue;
        };
        use nix::sys::mman::{MmapAdvise, madvise};
        // SAFETY: [start, end) is a whole read-only, file-backed private
        // mapping with no anonymous (copy-on-write) page, as the kernel just
        // reported, and it stays that mapping (the callers' invariants: a
        // single thread, or mappings that are never unmapped); being
        // read-only, no page of it can become a private copy in between.
        // Dropping its page-table entries loses nothing: every page is read
        // back from the file (the page cache) on the next access. Code
        // currently running is in such a mapping; the kernel simply faults
        // it back in.
        unsafe {
            let _ = madvise(addr, len.get(), MmapAdvise::MADV_RANDOM);
            let _ = madvise(addr, len.get(), MmapAdvise::MADV_DONTNEED);
        }
    }
}

/// The `[start, end)` ranges in `/proc/self/smaps` text that are read-only
/// (`r--p` / `r-xp`), backed by a file whose path passes `path_ok`, and
/// have no anonymous page.
pub fn trimmable_mappings(smaps: &str, path_ok: impl Fn(&str) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, usize)> = None;
    let mut ok = false;
    let finish = |cur: &mut Option<(usize, usize)>, ok: bool, out: &mut Vec<(usize, usize)>| {
        if let Some(r) = cur.take()
            && ok
        {
            out.push(r);
        }
    };
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        {
            finish(&mut cur, ok, &mut out);
            let mut f = line.split_whitespace();
            let perms = f.nth(1).unwrap_or("");
            let path = f.nth(3).unwrap_or("");
            ok = (perms == "r--p" || perms == "r-xp") && path.starts_with('/') && path_ok(path);
            cur = Some((a, b));
            continue;
        }
        let mut f = line.split_whitespace();
        let (key, val) = (f.next().unwrap_or(""), f.next().unwrap_or("0"));
        // A private file mapping's page is either the file's (page cache,
        // possibly dirty there: still the file's) or an anonymous
        // copy-on-write copy; only the latter must not be dropped.
        if matches!(key, "Anonymous:" | "Swap:") && val != "0" {
            ok = false;
        }
    }
    finish(&mut cur, ok, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_is_refused_with_threads() {
        // The test harness runs tests on threads: more than one here.
        let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        assert!(thread_count().unwrap() > 1);
        assert!(fork().is_err());
        t.join().unwrap();
    }

    #[test]
    fn picks_only_clean_read_only_file_mappings() {
        let smaps = "\
00200000-00336000 r--p 00000000 fe:00 5508323    /usr/bin/crust-shim
Rss:                 320 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
00336000-00762000 r-xp 00135000 fe:00 5508323    /usr/bin/crust-shim
Rss:                1024 kB
Anonymous:             0 kB
00762000-007bd000 r--p 00560000 fe:00 5508323    /usr/bin/crust-shim
Private_Dirty:        12 kB
Anonymous:            12 kB
007bd000-007c1000 rw-p 005ba000 fe:00 5508323    /usr/bin/crust-shim
Anonymous:             4 kB
2fd83000-2fda4000 rw-p 00000000 00:00 0          [heap]
Anonymous:            72 kB
7fca66b17000-7fca66b19000 r-xp 00000000 00:00 0  [vdso]
Anonymous:             0 kB
";
        assert_eq!(
            trimmable_mappings(smaps, |_| true),
            vec![(0x0020_0000, 0x0033_6000), (0x0033_6000, 0x0076_2000)]
        );
        assert!(trimmable_mappings(smaps, |p| p.starts_with("/usr/lib/")).is_empty());
    }
}
