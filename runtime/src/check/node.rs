//! What `crust check` sees of the node and does to it, behind one seam
//! ([`NodeView`]) so the check itself runs against a fake in unit tests;
//! [`RealNode`] is the node.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crust_cgroups::CgroupPath;

use crate::cgroups::{ContainerCgroup, NodeCgroups, PodSlice};

/// The node as the check sees and repairs it. Blocking.
pub trait NodeView: Send + Sync {
    /// The names in `dir`; none when it is missing.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn exists(&self, path: &Path) -> bool;
    /// Every mount point of this mount namespace.
    fn mount_points(&self) -> io::Result<Vec<PathBuf>>;
    /// Every process whose command line is a monitor's (`crust-shim
    /// container|exec <state dir>`): pid and state dir.
    fn monitors(&self) -> Vec<(i32, PathBuf)>;
    /// The cgroups right below `cgroup`; none when it is missing.
    fn cgroup_children(&self, cgroup: &str) -> Vec<String>;
    fn cgroup_exists(&self, cgroup: &str) -> bool;
    /// Processes in the cgroup (0 when unknown).
    fn cgroup_processes(&self, cgroup: &str) -> usize;
    /// The cgroupsPath of the OCI bundle at `bundle`, if it has one.
    fn bundle_cgroups_path(&self, bundle: &Path) -> Option<String>;
    /// Allocated bytes under `path` (not crossing into other mounts).
    fn disk_bytes(&self, path: &Path) -> u64;

    /// Unmounts `path` (lazily); not mounted is no error.
    fn unmount(&self, path: &Path) -> Result<(), String>;
    /// Removes `path` and what it holds; refused while anything is mounted
    /// below it (removing would reach into the mounted filesystem).
    fn remove_tree(&self, path: &Path) -> Result<(), String>;
    /// SIGKILLs `pid` if it still is the monitor of `state_dir`.
    fn kill_monitor(&self, pid: i32, state_dir: &Path) -> Result<(), String>;
    /// Kills what runs in the cgroup and removes it (stopping `unit`
    /// first, a scope or slice of the systemd driver).
    fn delete_cgroup(&self, cgroup: &str, unit: Option<&str>) -> Result<(), String>;
}

/// The node itself.
pub struct RealNode {
    cgroups: Arc<NodeCgroups>,
}

impl RealNode {
    pub fn new(cgroups: Arc<NodeCgroups>) -> RealNode {
        RealNode { cgroups }
    }
}

fn cgroup_path(cgroup: &str) -> Result<CgroupPath, String> {
    CgroupPath::parse(cgroup).map_err(|e| e.to_string())
}

impl NodeView for RealNode {
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other?,
        };
        let mut names = Vec::new();
        for entry in entries {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok()
    }

    fn mount_points(&self) -> io::Result<Vec<PathBuf>> {
        Ok(crust_linux::mountinfo::read_self()?
            .into_iter()
            .map(|m| m.mount_point)
            .collect())
    }

    fn monitors(&self) -> Vec<(i32, PathBuf)> {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in procs.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // Gone meanwhile, or a kernel thread (empty): not a monitor.
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if let Some(state_dir) = monitor_state_dir(&cmdline) {
                out.push((pid, state_dir));
            }
        }
        out.sort();
        out
    }

    fn cgroup_children(&self, cgroup: &str) -> Vec<String> {
        let Ok(path) = CgroupPath::parse(cgroup) else {
            return Vec::new();
        };
        self.cgroups
            .fs()
            .cgroup(path)
            .children()
            .unwrap_or_default()
    }

    fn cgroup_exists(&self, cgroup: &str) -> bool {
        CgroupPath::parse(cgroup).is_ok_and(|p| self.cgroups.exists(&p))
    }

    fn cgroup_processes(&self, cgroup: &str) -> usize {
        CgroupPath::parse(cgroup)
            .ok()
            .and_then(|p| self.cgroups.fs().cgroup(p).pids().ok())
            .map_or(0, |p| p.len())
    }

    fn bundle_cgroups_path(&self, bundle: &Path) -> Option<String> {
        // The bundle's spec is the runtime's input: small, written by the
        // daemon.
        let data = std::fs::read(bundle.join("config.json")).ok()?;
        let spec: serde_json::Value = serde_json::from_slice(&data).ok()?;
        spec["linux"]["cgroupsPath"].as_str().map(str::to_string)
    }

    fn disk_bytes(&self, path: &Path) -> u64 {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => m.blocks() * 512 + crust_linux::mounts::disk_usage(path).0,
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        }
    }

    fn unmount(&self, path: &Path) -> Result<(), String> {
        crust_linux::mounts::unmount(path).map_err(|e| e.to_string())
    }

    fn remove_tree(&self, path: &Path) -> Result<(), String> {
        // Refused (EBUSY) at a mount left inside, its contents kept.
        crust_linux::remove_tree::remove_tree(path)
            .map_err(|e| format!("removing {}: {e}", path.display()))
    }

    fn kill_monitor(&self, pid: i32, state_dir: &Path) -> Result<(), String> {
        // Guards against pid reuse: only the process that still is the
        // monitor of this state dir.
        if !crust_shim_protocol::is_shim_of(pid, state_dir) {
            return Ok(());
        }
        match crust_linux::process::send_signal(pid, libc::SIGKILL) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(format!("killing monitor {pid}: {e}")),
        }
    }

    fn delete_cgroup(&self, cgroup: &str, unit: Option<&str>) -> Result<(), String> {
        let path = cgroup_path(cgroup)?;
        let res = match unit {
            // crust's own pod slice (`crust-pod<id>.slice`); one systemd no
            // longer knows still has a cgroup to remove.
            Some(u) if u.ends_with(".slice") => self
                .cgroups
                .delete_pod(
                    &path,
                    Some(&PodSlice {
                        name: u.to_string(),
                        owned: true,
                    }),
                )
                .or_else(|_| self.cgroups.delete_pod(&path, None)),
            // A scope systemd no longer knows still has a cgroup to remove.
            Some(u) => self
                .cgroups
                .kill_container(&ContainerCgroup::Scope {
                    unit: u.to_string(),
                    path: path.clone(),
                })
                .or_else(|_| self.cgroups.kill_container(&ContainerCgroup::Path(path)))
                .map(drop),
            None => self
                .cgroups
                .kill_container(&ContainerCgroup::Path(path))
                .map(drop),
        };
        res.map_err(|e| e.to_string())
    }
}

/// The state dir of a monitor's command line (`<argv0> container|exec
/// <state dir>`, NUL-separated), as the monitor client finds monitors.
pub fn monitor_state_dir(cmdline: &[u8]) -> Option<PathBuf> {
    let mut args = cmdline.split(|&b| b == 0);
    let _argv0 = args.next()?;
    let mode = args.next()?;
    let dir = args.next()?;
    if (mode == b"container" || mode == b"exec") && dir.first() == Some(&b'/') {
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(dir)))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitors_are_known_by_their_command_line() {
        assert_eq!(
            monitor_state_dir(b"/usr/bin/crust-shim\0container\0/run/crust/containers/a\0"),
            Some(PathBuf::from("/run/crust/containers/a"))
        );
        assert_eq!(
            monitor_state_dir(b"crust-shim\0exec\0/run/crust/containers/a/exec/1\0"),
            Some(PathBuf::from("/run/crust/containers/a/exec/1"))
        );
        for other in [
            &b""[..],
            b"sleep\x00100\x00",
            b"crust-shim\0container\0relative\0",
            b"crust-shim\0--version\0",
        ] {
            assert_eq!(monitor_state_dir(other), None);
        }
    }
}
