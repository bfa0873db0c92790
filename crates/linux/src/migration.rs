//! Paying, ahead of time and in parallel with other work, the wait of the
//! next cgroup migration.
//!
//! Moving a process into a cgroup (a write to `cgroup.procs`: runc and
//! libcontainer do it for every new container, runc for every exec) takes
//! the kernel's global thread-group lock for writing. Unless the hierarchy
//! is mounted with `favordynmods`, taking it first waits for an RCU grace
//! period (`rcu_sync_enter`: 5–16 ms measured on the 2-core test VM, most
//! of a container's creation); the lock then stays ready for writers until
//! one more grace period after the last one left, so a second migration in
//! that window costs ~50 µs.
//!
//! [`prime`] moves the calling process into the cgroup it is already in:
//! nothing changes for anyone, but it starts that grace period. Called on
//! another thread (or while the runtime process starts up), it overlaps
//! the wait with work the migration does not depend on (the record's
//! fsync, the rootfs, runc's start-up), and the runtime's own migration
//! finds the lock ready. It never makes a migration slower: at worst the
//! runtime waits for a grace period as it would have anyway.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Moves this process into its own cgroup (a no-op move) to start the
/// grace period of the next migration; see the module docs. Blocks for that
/// grace period. Errors (no cgroupfs mounted where expected, no permission)
/// only mean no head start.
pub fn prime() -> io::Result<()> {
    let procfile = std::fs::read_to_string("/proc/self/cgroup")?;
    let path = own_procs_file(&procfile, |p| p.exists()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no cgroup.procs of this process's cgroup under /sys/fs/cgroup",
        )
    })?;
    let f = std::fs::OpenOptions::new().write(true).open(&path)?;
    // "0": the writing process itself.
    (&f).write_all(b"0")
}

/// The `cgroup.procs` of the cgroup a process is in, from its
/// `/proc/PID/cgroup` (the first candidate `exists` accepts): the unified
/// hierarchy's (at /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid
/// hosts), else a v1 controller's. The lock is global: any hierarchy will
/// do. Paths that climb (`..`: outside our cgroup namespace) are skipped.
fn own_procs_file(procfile: &str, exists: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut candidates = Vec::new();
    for line in procfile.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
            continue;
        }
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            candidates.insert(0, root.join("unified").join(rel));
            candidates.insert(0, root.join(rel));
        } else if !controllers.starts_with("name=") {
            candidates.push(root.join(controllers).join(rel));
            candidates.extend(controllers.split(',').map(|c| root.join(c).join(rel)));
        }
    }
    candidates
        .into_iter()
        .map(|d| d.join("cgroup.procs"))
        .find(|p| exists(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(procfile: &str, present: &[&str]) -> Option<String> {
        own_procs_file(procfile, |p| present.iter().any(|x| Path::new(x) == p))
            .map(|p| p.display().to_string())
    }

    #[test]
    fn the_unified_hierarchy_first_then_a_v1_controller() {
        let v2 = "0::/system.slice/crust.service\n";
        assert_eq!(
            pick(
                v2,
                &["/sys/fs/cgroup/system.slice/crust.service/cgroup.procs"]
            )
            .as_deref(),
            Some("/sys/fs/cgroup/system.slice/crust.service/cgroup.procs")
        );
        let hybrid = "9:name=systemd:/x\n8:pids:/p\n1:cpu,cpuacct:/c\n0::/u\n";
        let all = [
            "/sys/fs/cgroup/name=systemd/x/cgroup.procs",
            "/sys/fs/cgroup/pids/p/cgroup.procs",
            "/sys/fs/cgroup/cpu,cpuacct/c/cgroup.procs",
            "/sys/fs/cgroup/unified/u/cgroup.procs",
        ];
        assert_eq!(
            pick(hybrid, &all).as_deref(),
            Some("/sys/fs/cgroup/unified/u/cgroup.procs")
        );
        // No unified mount: a controller's, never a named hierarchy's.
        assert_eq!(
            pick(hybrid, &all[..3]).as_deref(),
            Some("/sys/fs/cgroup/pids/p/cgroup.procs")
        );
        assert_eq!(
            pick(hybrid, &["/sys/fs/cgroup/cpu/c/cgroup.procs"]).as_deref(),
            Some("/sys/fs/cgroup/cpu/c/cgroup.procs")
        );
        assert_eq!(pick(hybrid, &all[..1]), None);
    }

    #[test]
    fn paths_outside_our_cgroup_namespace_are_skipped() {
        assert_eq!(
            pick(
                "0::/../../x\n",
                &[
                    "/sys/fs/cgroup/../../x/cgroup.procs",
                    "/sys/fs/x/cgroup.procs"
                ]
            ),
            None
        );
        assert_eq!(pick("", &[]), None);
        assert_eq!(pick("garbage\n", &[]), None);
    }

    /// A no-op move: the process stays in the cgroups it was in.
    #[test]
    fn priming_leaves_the_process_where_it_was() {
        let before = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let r = prime();
        if nix::unistd::geteuid().is_root() {
            r.unwrap();
        }
        assert_eq!(
            std::fs::read_to_string("/proc/self/cgroup").unwrap(),
            before
        );
    }
}
