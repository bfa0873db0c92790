//! OOM-kill detection: the `oom_kill` count of the container's memory
//! cgroup (`memory.events` on v2, `memory.oom_control` on v1) at create
//! time, compared with the count when the kernel says the file changed
//! (v2, inotify) and after the container exited.
//!
//! Why not only after the exit: a systemd scope's cgroup is removed by
//! systemd as soon as its last process is gone, often before the monitor
//! has reaped the init and read the file; and the kernel's notice of the
//! kill can come up to 20 ms late (memory.events notifications are rate
//! limited, and the limit being hit notifies first), after the removal.
//! So on v2 the parent's memory.events (hierarchical: it counts the
//! container's kills too, and keeps them when the container's cgroup goes)
//! is watched as well: while the container's own file is there, what the
//! parent counts beyond it is remembered (kills in sibling containers);
//! once it is gone, a parent count beyond that is the container's kill.
//! containerd's shim and conmon watch memory.events the same way.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crust_linux::mountinfo::{self, Mount};
use crust_linux::watch::ModifiedWatch;

#[derive(Debug)]
pub(super) struct OomWatch {
    file: PathBuf,
    baseline: u64,
    /// A count above the baseline was seen in the container's own file.
    seen: bool,
    /// The container's cgroup was gone and the parent counted a kill
    /// beyond the siblings': ours, unless a sibling's came in that window.
    seen_in_parent: bool,
    /// Modifications of memory.events (v2; v1's oom_control sends none).
    changes: Option<ModifiedWatch>,
    /// v2: the parent cgroup's memory.events.
    parent: Option<ParentCount>,
}

#[derive(Debug)]
struct ParentCount {
    file: PathBuf,
    changes: Option<ModifiedWatch>,
    /// The parent's count minus the container's, at the last read of both.
    others: u64,
}

impl OomWatch {
    /// Finds `pid`'s memory cgroup (the container's, right after create).
    pub fn for_pid(pid: i32) -> Option<OomWatch> {
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mounts = mountinfo::read_self().ok()?;
        let file = memory_events_file(&cgroup, &mounts)?;
        let v2 = file.file_name() == Some("memory.events".as_ref());
        // The watches before the baseline reads: no kill falls between.
        let changes = v2.then(|| ModifiedWatch::new(&file).ok()).flatten();
        let parent_file = file
            .parent()
            .and_then(|d| d.parent())
            .map(|d| d.join("memory.events"))
            .filter(|_| v2);
        let parent_changes = parent_file
            .as_deref()
            .and_then(|f| ModifiedWatch::new(f).ok());
        let baseline = read_count(&file)?;
        let parent = parent_file.and_then(|f| {
            let others = read_count(&f)?.saturating_sub(baseline);
            Some(ParentCount {
                file: f,
                changes: parent_changes,
                others,
            })
        });
        Some(OomWatch {
            file,
            baseline,
            seen: false,
            seen_in_parent: false,
            changes,
            parent,
        })
    }

    /// What to poll for changes, until the exit.
    pub fn changes_fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        let parent = self.parent.as_ref().and_then(|p| p.changes.as_ref());
        self.changes.iter().chain(parent).map(|w| w.as_fd())
    }

    /// A file changed (or may have): read the counts now.
    pub fn on_change(&mut self) {
        let parent = self.parent.as_ref().and_then(|p| p.changes.as_ref());
        for w in self.changes.iter().chain(parent) {
            w.drain();
        }
        self.check();
    }

    /// Reads the counts; remembers a rise above the baseline.
    pub fn check(&mut self) {
        // The parent first: a kill between the two reads then shows in the
        // container's count, never in the parent's alone.
        let parent = self.parent.as_ref().and_then(|p| read_count(&p.file));
        let own = read_count(&self.file);
        self.observe(own, parent);
    }

    fn observe(&mut self, own: Option<u64>, parent_total: Option<u64>) {
        match (own, parent_total, self.parent.as_mut()) {
            (Some(n), total, p) => {
                if n > self.baseline {
                    self.seen = true;
                }
                if let (Some(total), Some(p)) = (total, p) {
                    p.others = total.saturating_sub(n);
                }
            }
            // The container's cgroup is gone: what the parent counts
            // beyond the others (and our count so far) is ours.
            (None, Some(total), Some(p)) if total > p.others.saturating_add(self.baseline) => {
                self.seen_in_parent = true;
            }
            _ => {}
        }
    }

    /// Whether the count went up since create, now or at any check before
    /// (the file may be gone by now); stops watching. A kill known only
    /// from the parent's count is taken as ours only when the init died of
    /// SIGKILL (`killed`): a sibling's kill in the moment after our cgroup
    /// went must not turn an ordinary exit into OOMKilled.
    pub fn oom_killed(&mut self, killed: bool) -> bool {
        self.check();
        self.changes = None;
        if let Some(p) = &mut self.parent {
            p.changes = None;
        }
        self.seen || (self.seen_in_parent && killed)
    }
}

fn read_count(file: &Path) -> Option<u64> {
    Some(read_oom_kill(&fs::read_to_string(file).ok()?).unwrap_or(0))
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

    fn watch(baseline: u64, parent_others: Option<u64>) -> OomWatch {
        OomWatch {
            file: PathBuf::new(),
            baseline,
            seen: false,
            seen_in_parent: false,
            changes: None,
            parent: parent_others.map(|others| ParentCount {
                file: PathBuf::new(),
                changes: None,
                others,
            }),
        }
    }

    #[test]
    fn a_kill_counts_in_the_containers_file() {
        let mut w = watch(0, Some(2));
        w.observe(Some(0), Some(2));
        assert!(!w.seen);
        w.observe(Some(1), Some(3));
        assert!(w.seen);
    }

    #[test]
    fn a_kill_seen_only_by_the_parent_after_the_cgroup_went_is_ours() {
        let mut w = watch(0, Some(2));
        w.observe(Some(0), Some(2));
        w.observe(None, Some(3));
        assert!(w.seen_in_parent);
        assert!(w.oom_killed(true));
        // The same count with an ordinary exit: a sibling's kill in that
        // moment, not ours.
        let mut w = watch(0, Some(2));
        w.observe(Some(0), Some(2));
        w.observe(None, Some(3));
        assert!(!w.oom_killed(false));
    }

    #[test]
    fn kills_in_siblings_are_not_ours() {
        let mut w = watch(0, Some(2));
        // A sibling's kill while our cgroup is there: remembered as theirs.
        w.observe(Some(0), Some(4));
        assert!(!w.seen);
        // Our cgroup gone, nothing new in the parent.
        w.observe(None, Some(4));
        assert!(!w.seen && !w.seen_in_parent);
        // Without a parent file nothing can be said once ours is gone.
        let mut w = watch(0, None);
        w.observe(None, None);
        assert!(!w.seen);
    }

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
