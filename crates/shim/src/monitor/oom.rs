//! OOM-kill detection: the `oom_kill` count of the container's memory
//! cgroup (`memory.events` on v2, `memory.oom_control` on v1) at create
//! time, compared with the count when the kernel says the file changed
//! (v2, inotify) and after the container exited.
//!
//! Why not only after the exit: a systemd scope's cgroup is removed by
//! systemd as soon as its last process is gone (and with systemd's default
//! OOMPolicy=stop, it stops the whole scope on the kill), often before the
//! monitor has reaped the init and read the file. containerd's shim and
//! conmon watch memory.events the same way.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crust_linux::mountinfo::{self, Mount};
use crust_linux::watch::ModifiedWatch;

#[derive(Debug)]
pub(super) struct OomWatch {
    file: PathBuf,
    baseline: u64,
    /// A count above the baseline was seen.
    seen: bool,
    /// Modifications of memory.events (v2; v1's oom_control sends none).
    changes: Option<ModifiedWatch>,
}

impl OomWatch {
    /// Finds `pid`'s memory cgroup (the container's, right after create).
    pub fn for_pid(pid: i32) -> Option<OomWatch> {
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mounts = mountinfo::read_self().ok()?;
        let file = memory_events_file(&cgroup, &mounts)?;
        // Before the baseline read: no kill falls between the two.
        let changes = (file.file_name() == Some("memory.events".as_ref()))
            .then(|| ModifiedWatch::new(&file).ok())
            .flatten();
        let baseline = read_oom_kill(&fs::read_to_string(&file).ok()?).unwrap_or(0);
        Some(OomWatch {
            file,
            baseline,
            seen: false,
            changes,
        })
    }

    /// What to poll for changes, until the exit.
    pub fn changes_fd(&self) -> Option<BorrowedFd<'_>> {
        self.changes.as_ref().map(|w| w.as_fd())
    }

    /// The file changed (or may have): read the count now.
    pub fn on_change(&mut self) {
        if let Some(w) = &self.changes {
            w.drain();
        }
        self.check();
    }

    /// Reads the count; remembers a rise above the baseline. Nothing when
    /// the file is gone.
    pub fn check(&mut self) {
        let now = fs::read_to_string(&self.file)
            .ok()
            .and_then(|s| read_oom_kill(&s));
        if now.is_some_and(|n| n > self.baseline) {
            self.seen = true;
        }
    }

    /// Whether the count went up since create, now or at any check before
    /// (the file may be gone by now); stops watching.
    pub fn oom_killed(&mut self) -> bool {
        self.check();
        self.changes = None;
        self.seen
    }
}

/// The `oom_kill N` line of memory.events / memory.oom_control.
fn read_oom_kill(s: &str) -> Option<u64> {
    s.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == "oom_kill").then(|| it.next()?.parse().ok())?
    })
}

/// From `/proc/PID/cgroup` and the mount table, the file with the memory
/// controller's OOM-kill count: v1's `memory.oom_control` when a v1
/// memory hierarchy is mounted, else v2's `memory.events`.
fn memory_events_file(proc_cgroup: &str, mounts: &[Mount]) -> Option<PathBuf> {
    let mut v1_path = None;
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        if ctrls.is_empty() {
            v2_path = Some(path);
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1_path = Some(path);
        }
    }
    let v1_mount = mounts
        .iter()
        .rev()
        .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == "memory"));
    let v2_mount = mounts.iter().find(|m| m.fs_type == "cgroup2");
    if let (Some(path), Some(m)) = (v1_path, v1_mount) {
        return Some(join_cgroup(m, path).join("memory.oom_control"));
    }
    if let (Some(path), Some(m)) = (v2_path, v2_mount) {
        return Some(join_cgroup(m, path).join("memory.events"));
    }
    None
}

/// Where cgroup `path` (as /proc/PID/cgroup names it) is under mount `m`.
fn join_cgroup(m: &Mount, path: &str) -> PathBuf {
    let path = Path::new(path);
    let rel = if m.root != Path::new("/") {
        path.strip_prefix(&m.root).unwrap_or(path)
    } else {
        path
    };
    m.mount_point.join(rel.strip_prefix("/").unwrap_or(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kill_counts() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(read_oom_kill(v1), Some(3));
        let v2 = "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(read_oom_kill(v2), Some(1));
        assert_eq!(read_oom_kill("oom 1\n"), None);
    }

    const MOUNTINFO_HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_v1_memory_on_a_hybrid_host() {
        let cg = "12:pids:/crust/x\n5:memory:/crust/x\n0::/crust/x\n";
        assert_eq!(
            memory_events_file(cg, &mountinfo::parse(MOUNTINFO_HYBRID)).unwrap(),
            Path::new("/sys/fs/cgroup/memory/crust/x/memory.oom_control")
        );
    }

    #[test]
    fn finds_v2_memory_events() {
        let mi = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            memory_events_file("0::/kubepods/pod1/c1\n", &mountinfo::parse(mi)).unwrap(),
            Path::new("/sys/fs/cgroup/kubepods/pod1/c1/memory.events")
        );
        assert!(memory_events_file("0::/x\n", &[]).is_none());
    }

    #[test]
    fn a_cgroup_namespace_root_is_stripped() {
        let mi = "30 23 0:27 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            memory_events_file("0::/kubepods/pod1\n", &mountinfo::parse(mi)).unwrap(),
            Path::new("/sys/fs/cgroup/pod1/memory.events")
        );
    }
}
