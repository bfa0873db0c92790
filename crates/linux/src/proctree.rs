//! Killing a process and everything it started, as /proc shows it.
//!
//! Killing the top process first would reparent its children (to the
//! nearest child subreaper in their PID namespace, else that namespace's
//! init) before anyone could find them, so [`kill_tree`] first stops the
//! whole tree top-down with SIGSTOP (a stopped process neither forks nor
//! reaps), walks again until a walk finds nothing new, then SIGKILLs what
//! it stopped. The tree is rebuilt from every process's parent in
//! /proc/<pid>/stat: /proc/<pid>/task/<tid>/children needs
//! CONFIG_PROC_CHILDREN, which kernels may lack.
//!
//! Members are the descendants of the root and, while the root leads its
//! own session, every process of that session: a double fork that did
//! not call setsid(2) leaves the tree (its parent is gone) but not the
//! session. A process that left both (setsid after a double fork) is only
//! kept in the tree when the root is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER` before its execve), which is why the embedded
//! runtime makes exec-sync processes one.
//!
//! Every process but the root is signalled through a pidfd opened before
//! checking that the pid is still a member, so a pid reused meanwhile is
//! never signalled.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Walks of /proc before giving up on a tree that keeps growing (a fork
/// bomb outruns no walk for long: stopped processes fork no more).
const MAX_ROUNDS: usize = 64;

/// What /proc/<pid>/stat says of a process's place among processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatLinks {
    pub pid: i32,
    pub ppid: i32,
    pub session: i32,
}

/// Parses /proc/<pid>/stat: pid, parent and session. The command name (in
/// parentheses) may contain anything, `)` and spaces included, so the
/// fields are taken after its last `)`.
pub fn parse_stat(stat: &str) -> Option<StatLinks> {
    let open = stat.find(" (")?;
    let pid = stat[..open].trim().parse().ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // state ppid pgrp session ...
    let mut f = rest.split_ascii_whitespace();
    let _state = f.next()?;
    let ppid = f.next()?.parse().ok()?;
    let _pgrp = f.next()?;
    let session = f.next()?.parse().ok()?;
    Some(StatLinks { pid, ppid, session })
}

/// The members of `root`'s tree in `procs` (root excluded), parents before
/// children: its descendants and, when `root` leads its session, every
/// process of that session.
pub fn tree_members(procs: &[StatLinks], root: i32) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let leads_session = procs.iter().any(|p| p.pid == root && p.session == root);
    let mut seen = BTreeSet::from([root]);
    let mut out = Vec::new();
    let mut queue = std::collections::VecDeque::from([root]);
    if leads_session {
        queue.extend(
            procs
                .iter()
                .filter(|p| p.session == root && p.pid != root)
                .map(|p| p.pid),
        );
    }
    while let Some(pid) = queue.pop_front() {
        if pid != root {
            if !seen.insert(pid) {
                continue;
            }
            out.push(pid);
        }
        if let Some(kids) = children.get(&pid) {
            queue.extend(kids.iter().copied().filter(|k| !seen.contains(k)));
        }
    }
    out
}

/// Every process /proc lists now (those that vanish while read are left
/// out).
fn snapshot() -> io::Result<Vec<StatLinks>> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(links) = read_links(pid) {
            out.push(links);
        }
    }
    Ok(out)
}

fn read_links(pid: i32) -> Option<StatLinks> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// What [`kill_tree`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TreeKill {
    /// Processes killed besides the root.
    pub members: usize,
    /// Walks of /proc.
    pub rounds: usize,
    /// The tree still grew at the last walk allowed.
    pub unfinished: bool,
}

/// Stops, then SIGKILLs, `root` and every member of its tree (see the
/// module). `root` must be a child of the caller not yet reaped, so that
/// its pid cannot be reused meanwhile. A root already gone is no error.
pub fn kill_tree(root: i32) -> io::Result<TreeKill> {
    crate::process::send_signal(root, libc::SIGSTOP).or_else(ignore_gone)?;
    let mut stopped: BTreeMap<i32, OwnedFd> = BTreeMap::new();
    let mut report = TreeKill::default();
    loop {
        if report.rounds == MAX_ROUNDS {
            report.unfinished = true;
            break;
        }
        report.rounds += 1;
        let procs = snapshot()?;
        let leads_session = procs.iter().any(|p| p.pid == root && p.session == root);
        let members = tree_members(&procs, root);
        let known: BTreeSet<i32> = members.iter().copied().collect();
        let mut grew = false;
        for pid in members {
            if stopped.contains_key(&pid) {
                continue;
            }
            let Ok(fd) = pidfd_open(pid) else { continue };
            // The pidfd names the process checked now, whatever happens to
            // the pid later: a pid reused since the walk fails this check.
            let Some(now) = read_links(pid) else { continue };
            let still_member = now.ppid == root
                || known.contains(&now.ppid)
                || (leads_session && now.session == root);
            if !still_member {
                continue;
            }
            let _ = pidfd_send_signal(&fd, libc::SIGSTOP);
            stopped.insert(pid, fd);
            grew = true;
        }
        if !grew {
            break;
        }
    }
    for fd in stopped.values() {
        let _ = pidfd_send_signal(fd, libc::SIGKILL);
    }
    crate::process::send_signal(root, libc::SIGKILL).or_else(ignore_gone)?;
    report.members = stopped.len();
    Ok(report)
}

fn ignore_gone(e: io::Error) -> io::Result<()> {
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(e)
    }
}

/// `pidfd_open(2)` (Linux 5.3+).
fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; on success the kernel
    // returns a new descriptor that only we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor (see above).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `pidfd_send_signal(2)` (Linux 5.1+).
fn pidfd_send_signal(fd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: plain syscall; a null siginfo means "as kill(2) would".
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, session: i32) -> StatLinks {
        StatLinks { pid, ppid, session }
    }

    #[test]
    fn stat_fields_come_after_the_last_parenthesis() {
        let s = "4242 (a) b (c)) S 17 4242 4200 0 -1 4194560 100 0 0 0";
        assert_eq!(parse_stat(s), Some(p(4242, 17, 4200)));
        let s = "1 (systemd) S 0 1 1 0 -1 4194560";
        assert_eq!(parse_stat(s), Some(p(1, 0, 1)));
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("12 (x) S"), None);
        assert_eq!(parse_stat("x (y) S 1 2 3"), None);
    }

    #[test]
    fn descendants_come_parents_first() {
        // 10 -> 11 -> 12, 10 -> 13; 20 is unrelated; 1 is init.
        let procs = [
            p(1, 0, 1),
            p(10, 5, 5),
            p(11, 10, 5),
            p(12, 11, 5),
            p(13, 10, 5),
            p(20, 1, 20),
        ];
        assert_eq!(tree_members(&procs, 10), vec![11, 13, 12]);
        assert_eq!(tree_members(&procs, 20), Vec::<i32>::new());
        assert_eq!(tree_members(&procs, 99), Vec::<i32>::new());
    }

    #[test]
    fn a_session_leader_keeps_its_double_forked_daemons() {
        // 10 leads session 10; 30 was double-forked (now a child of init)
        // but stayed in the session, and has a child of its own; 40 left
        // the session as well (setsid) and is not found.
        let procs = [
            p(1, 0, 1),
            p(10, 2, 10),
            p(11, 10, 10),
            p(30, 1, 10),
            p(31, 30, 10),
            p(40, 1, 40),
        ];
        assert_eq!(tree_members(&procs, 10), vec![11, 30, 31]);
        // Not a session leader: the session is not the root's to take.
        let procs = [p(10, 2, 5), p(11, 10, 5), p(30, 1, 5)];
        assert_eq!(tree_members(&procs, 10), vec![11]);
    }

    #[test]
    fn cycles_and_self_parents_end() {
        let procs = [p(10, 10, 7), p(11, 12, 7), p(12, 11, 7), p(13, 10, 7)];
        assert_eq!(tree_members(&procs, 10), vec![13]);
        assert_eq!(tree_members(&procs, 11), vec![12]);
    }

    /// A real tree: a session-leading shell with a background child and
    /// a double-forked grandchild (reparented away, kept by the session).
    #[test]
    fn kills_a_real_tree() {
        use std::os::unix::process::CommandExt;
        use std::time::{Duration, Instant};
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "sleep 1000 & (sleep 1000 &) ; sleep 1000"]);
        // SAFETY: setsid(2) is async-signal-safe.
        unsafe {
            cmd.pre_exec(crate::process::new_session);
        }
        let mut child = cmd.spawn().unwrap();
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while tree_members(&snapshot().unwrap(), root).len() < 3 {
            assert!(
                Instant::now() < deadline,
                "the shell's sleeps did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let members = tree_members(&snapshot().unwrap(), root);
        let r = kill_tree(root).unwrap();
        assert!(r.members >= 3 && !r.unfinished, "{r:?}");
        child.wait().unwrap();
        let alive = |pid: i32| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while members.iter().any(|p| alive(*p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<i32> = members.into_iter().filter(|p| alive(*p)).collect();
        assert!(left.is_empty(), "survivors: {left:?}");
    }
}
