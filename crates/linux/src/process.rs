//! Process-level calls for crust's monitor (crust-shim) and the children it
//! forks: fork, `_exit`, sessions, the child subreaper, signals, standard
//! descriptors, credentials-adjacent bits of an exec (umask,
//! no_new_privs, execve), resource limits, and trimming an idle monitor's
//! working set. Reaping is in [`crate::children`], terminals in
//! [`crate::console`].

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, sigprocmask};
use nix::unistd::Pid;

/// `fork(2)`. `Ok(None)` in the child, `Ok(Some(pid))` in the parent.
///
/// Only call this while the process has a single thread (the monitor never
/// starts one): the child then owns a consistent copy of everything.
pub fn fork() -> io::Result<Option<i32>> {
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
pub fn fork_single_threaded(_: &SingleThreaded) -> io::Result<Option<i32>> {
    // SAFETY: the process is single-threaded (no tokio, no threads spawned),
    // so no lock can be held by another thread at the time of the fork and
    // the child may run arbitrary code, as after any fork of a
    // single-threaded program.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(None),
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child.as_raw())),
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

/// Closes every descriptor above stderr that this process inherited (a
/// caller's jobserver pipe, anything without CLOEXEC): nothing of the
/// caller's may reach our children or stay open for our lifetime. Call it
/// first thing, before this process opens anything of its own.
pub fn close_inherited_fds() {
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is closed by now; closing it again
    // only yields EBADF.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// The three standard descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdFd {
    Stdin = 0,
    Stdout = 1,
    Stderr = 2,
}

/// Makes `target` (stdin, stdout or stderr) a copy of `fd` (`dup2`), e.g.
/// to point stderr at a log file or stdout at /dev/null.
pub fn replace_std_fd(target: StdFd, fd: BorrowedFd<'_>) -> io::Result<()> {
    nix::unistd::dup2(fd.as_raw_fd(), target as i32)?;
    Ok(())
}

/// `setsid(2)`: a new session and process group, without a controlling
/// terminal.
pub fn new_session() -> io::Result<()> {
    nix::unistd::setsid()?;
    Ok(())
}

/// `PR_SET_CHILD_SUBREAPER`: orphaned descendants are reparented to this
/// process instead of init, so it can reap (and learn the exit of) a
/// container's init that its runtime left behind.
pub fn set_child_subreaper() -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)?;
    Ok(())
}

/// `PR_SET_NAME`: the process's name (`/proc/PID/comm`, what `ps`, `top`
/// and `pgrep` show; at most 15 bytes). A program run from a descriptor
/// (`/proc/self/fd/N`) is otherwise named after the descriptor's number.
pub fn set_name(name: &std::ffi::CStr) -> io::Result<()> {
    nix::sys::prctl::set_name(name)?;
    Ok(())
}

/// Whether `signal` is a signal number this system knows (1..=31 and the
/// real-time ones nix names; 0 is not a signal).
pub fn is_valid_signal(signal: i32) -> bool {
    Signal::try_from(signal).is_ok()
}

/// `kill(2)`: sends `signal` to the one process `pid`. An unknown signal
/// number, and a pid kill(2) reads as a group (0, negatives: a bad number
/// read from a file must never hit the caller's own process group), are
/// `InvalidInput`.
pub fn send_signal(pid: i32, signal: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} is not a process"),
        ));
    }
    let sig = Signal::try_from(signal)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("bad signal {signal}")))?;
    nix::sys::signal::kill(Pid::from_raw(pid), sig)?;
    Ok(())
}

/// SIGKILL to the one process `pid` (see [`send_signal`]).
pub fn kill_process(pid: i32) -> io::Result<()> {
    send_signal(pid, libc::SIGKILL)
}

/// `umask(2)`: sets the file mode creation mask (the low 9 bits of `mask`).
pub fn set_umask(mask: u32) {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
}

/// `PR_SET_NO_NEW_PRIVS`: neither this process nor what it execs can gain
/// privileges (setuid bits, file capabilities).
pub fn set_no_new_privs() -> io::Result<()> {
    nix::sys::prctl::set_no_new_privs()?;
    Ok(())
}

/// `access(path, X_OK)`: whether this process may execute `path` (with its
/// current credentials and capabilities).
pub fn is_executable(path: &Path) -> bool {
    nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}

/// `execve(2)`: replaces this process with `program`. Returns only on
/// failure, with the reason.
pub fn exec(program: &CStr, args: &[CString], env: &[CString]) -> io::Error {
    match nix::unistd::execve(program, args, env) {
        Ok(never) => match never {},
        Err(e) => e.into(),
    }
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
    fn signal_numbers() {
        assert!(is_valid_signal(9) && is_valid_signal(15));
        assert!(!is_valid_signal(0) && !is_valid_signal(-1) && !is_valid_signal(1000));
        let e = send_signal(std::process::id() as i32, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn group_pids_are_refused() {
        // 0 and -1 would signal our own group and every process we may.
        for pid in [0, -1, -(std::process::id() as i32)] {
            let e = send_signal(pid, 0x0f).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{pid}");
            assert_eq!(
                kill_process(pid).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
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
