//! cgroups: hierarchy detection, kubelet's `cgroup_parent` formats and pod
//! cgroups. Resource control, removal and stats go through youki's
//! `libcgroups`, the project's one cgroup implementation.

mod parent;
mod pod;

use std::path::Path;

pub use parent::{DEFAULT_CGROUP_PARENT, parse_cgroup_parent, validate_cgroup_name};
pub use pod::{POD_CGROUP_PREFIX, PodCgroup, pod_cgroup_path};

use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, TMPFS_MAGIC, statfs};
use serde::Serialize;

/// How the host mounts cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hierarchy {
    /// Only cgroup v1 controllers.
    V1,
    /// v1 controllers plus a controller-less cgroup2 at `/sys/fs/cgroup/unified`
    /// (systemd's "hybrid" layout). Resources are managed through v1.
    Hybrid,
    /// The unified hierarchy (most current clusters).
    V2,
}

impl Hierarchy {
    /// Whether resource controllers are driven through the v2 interface.
    pub fn is_unified(self) -> bool {
        self == Hierarchy::V2
    }
}

/// Detects the hierarchy mounted under `root` (normally `/sys/fs/cgroup`).
pub fn detect(root: &Path) -> std::io::Result<Hierarchy> {
    let fs = statfs(root)?;
    if fs.filesystem_type() == CGROUP2_SUPER_MAGIC {
        return Ok(Hierarchy::V2);
    }
    if fs.filesystem_type() != TMPFS_MAGIC {
        return Err(std::io::Error::other(format!(
            "{} is neither a cgroup2 mount nor a tmpfs of cgroup v1 controllers",
            root.display()
        )));
    }
    let unified = root.join("unified");
    match statfs(&unified) {
        Ok(fs) if fs.filesystem_type() == CGROUP2_SUPER_MAGIC => Ok(Hierarchy::Hybrid),
        _ => Ok(Hierarchy::V1),
    }
}

/// Whether systemd is the init system, a precondition for the systemd cgroup
/// driver (same test as sd_booted(3)).
pub fn systemd_booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_this_hosts_hierarchy() {
        // Whatever the host runs, detection must succeed on /sys/fs/cgroup and
        // agree with the mount table.
        let h = detect(Path::new("/sys/fs/cgroup")).unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let cgroup2_at_root = mounts.lines().any(|l| {
            l.split_whitespace().nth(1) == Some("/sys/fs/cgroup") && l.contains(" cgroup2 ")
        });
        assert_eq!(h == Hierarchy::V2, cgroup2_at_root, "{h:?}");
    }

    #[test]
    fn a_plain_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        // tmp dirs are usually on ext4/overlay; on a tmpfs /tmp this is V1 by
        // construction, which is also a valid answer for "a tmpfs".
        match detect(dir.path()) {
            Err(e) => assert!(e.to_string().contains("neither")),
            Ok(h) => assert_eq!(h, Hierarchy::V1),
        }
    }
}
