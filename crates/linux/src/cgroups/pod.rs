//! The pod's cgroup: `<cgroup_parent>/crust-<sandbox id>`, holding the
//! cgroups of the pod's containers (and of its pause process, if any).
//!
//! A child of the parent rather than the parent itself: several sandboxes
//! can share one parent (crictl users, a pod's successive attempts), and
//! removing one pod must not remove another's cgroup or one kubelet owns.
//! kubelet's limits on the parent still bound everything below.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use libcgroups::common::{AnyCgroupManager, CgroupManager, ControllerOpt};
use libcgroups::stats::Stats;
use oci_spec::runtime::LinuxResources;

use super::Hierarchy;
use super::parent::{parse_cgroup_parent, validate_cgroup_name};
use crate::Error;

/// Prefix of the pod cgroup's name under its parent.
pub const POD_CGROUP_PREFIX: &str = "crust-";

/// How deep [`PodCgroup::delete`] looks for leftover child cgroups.
const MAX_SUBTREE_DEPTH: usize = 16;

/// The cgroup of one pod sandbox, created with the cgroupfs driver on
/// cgroup v1 (every mounted controller) or v2 (the unified hierarchy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    hierarchy: Hierarchy,
    root: PathBuf,
    path: PathBuf,
}

/// The cgroupfs path of a sandbox's pod cgroup: `<parent>/crust-<id>`,
/// with `cgroup_parent` in either driver's format (see
/// [`parse_cgroup_parent`]).
pub fn pod_cgroup_path(cgroup_parent: &str, sandbox_id: &str) -> Result<PathBuf, Error> {
    let name = format!("{POD_CGROUP_PREFIX}{sandbox_id}");
    validate_cgroup_name(&name)?;
    Ok(parse_cgroup_parent(cgroup_parent)?.join(name))
}

impl PodCgroup {
    /// A handle on the cgroup at `path` (as from [`pod_cgroup_path`], or as
    /// stored for recovery). `root` is the cgroup2 mount for
    /// [`Hierarchy::V2`] (normally `/sys/fs/cgroup`); on V1 and Hybrid the
    /// v1 controllers, found through the mount table, are used (a hybrid
    /// host's controller-less cgroup2 is left alone). Touches nothing.
    pub fn new(hierarchy: Hierarchy, root: &Path, path: &Path) -> Result<Self, Error> {
        let path_str = path
            .to_str()
            .ok_or_else(|| Error::invalid("cgroup path", "not UTF-8"))?;
        if !path.is_absolute() {
            return Err(Error::invalid(
                format!("cgroup path {path_str:?}"),
                "must be absolute",
            ));
        }
        // Re-check a stored path as strictly as a parent.
        let checked = parse_cgroup_parent(path_str)?;
        if checked == Path::new("/") {
            return Err(Error::invalid(
                format!("cgroup path {path_str:?}"),
                "a pod cannot own the root cgroup",
            ));
        }
        Ok(PodCgroup {
            hierarchy,
            root: root.to_path_buf(),
            path: checked,
        })
    }

    /// The cgroupfs path, relative to each hierarchy's root; containers'
    /// `cgroupsPath` goes below it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.hierarchy
    }

    /// Creates the cgroup (and missing ancestors) in every hierarchy.
    /// Idempotent. On error, the directories this call created are removed.
    pub fn create(&self) -> Result<(), Error> {
        let mut created = Vec::new();
        let res = match self.hierarchy {
            Hierarchy::V2 => self.create_v2(&mut created),
            Hierarchy::V1 | Hierarchy::Hybrid => self.create_v1(&mut created),
        };
        if res.is_err() {
            for dir in created.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        }
        res
    }

    /// Whether the cgroup exists in any hierarchy.
    pub fn exists(&self) -> bool {
        self.mounts()
            .map(|mounts| mounts.iter().any(|m| self.dir_in(m).is_dir()))
            .unwrap_or(false)
    }

    /// Removes the cgroup and any child cgroups left in it, killing what
    /// still runs there. Idempotent: a missing cgroup, or one whose
    /// processes are gone, is fine. Ancestors are left alone.
    pub fn delete(&self) -> Result<(), Error> {
        let mut rel_paths = BTreeSet::new();
        for mount in self.mounts()? {
            collect_subtree(&self.dir_in(&mount), &self.path, 0, &mut rel_paths);
        }
        // Deepest first, so parents are empty when their turn comes.
        let mut rel_paths: Vec<PathBuf> = rel_paths.into_iter().collect();
        rel_paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for rel in rel_paths {
            let manager = self.manager_for(&rel)?;
            manager.remove().map_err(|e| Error::Cgroup {
                path: rel.clone(),
                source: Box::new(e),
            })?;
        }
        self.delete_in_controllerless_hierarchies()
    }

    /// On v1 and hybrid hosts an OCI runtime such as runc also creates the
    /// container's cgroup in the controller-less hierarchies (the named
    /// `systemd` one and the hybrid `unified` cgroup2), which libcgroups' v1
    /// manager does not know. Their processes are gone by now (the
    /// controller cgroups above were emptied), so a bottom-up rmdir clears
    /// them.
    fn delete_in_controllerless_hierarchies(&self) -> Result<(), Error> {
        if self.hierarchy == Hierarchy::V2 {
            return Ok(());
        }
        for name in ["unified", "systemd"] {
            let mount = self.root.join(name);
            let mut rel_paths = BTreeSet::new();
            collect_subtree(&self.dir_in(&mount), &self.path, 0, &mut rel_paths);
            let mut rel_paths: Vec<PathBuf> = rel_paths.into_iter().collect();
            rel_paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for rel in rel_paths {
                let dir = self.dir_in_rel(&mount, &rel);
                match std::fs::remove_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(Error::Cgroup {
                            path: dir,
                            source: Box::new(e),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn dir_in_rel(&self, mount: &Path, rel: &Path) -> PathBuf {
        mount.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    /// Applies pod-level resources (e.g. from LinuxPodSandboxConfig).
    pub fn apply(&self, resources: &LinuxResources) -> Result<(), Error> {
        let opt = ControllerOpt {
            resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        };
        self.manager_for(&self.path)?
            .apply(&opt)
            .map_err(|e| self.cgroup_error(e))
    }

    /// Processes in the cgroup and below.
    pub fn pids(&self) -> Result<Vec<i32>, Error> {
        let pids = self
            .manager_for(&self.path)?
            .get_all_pids()
            .map_err(|e| self.cgroup_error(e))?;
        Ok(pids.into_iter().map(|p| p.as_raw()).collect())
    }

    /// Resource usage of the whole pod (PodSandboxStats).
    pub fn stats(&self) -> Result<Stats, Error> {
        self.manager_for(&self.path)?
            .stats()
            .map_err(|e| self.cgroup_error(e))
    }

    fn cgroup_error(&self, e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Cgroup {
            path: self.path.clone(),
            source: Box::new(e),
        }
    }

    fn manager_for(&self, rel: &Path) -> Result<AnyCgroupManager, Error> {
        let wrap = |e: Box<dyn std::error::Error + Send + Sync>| Error::Cgroup {
            path: rel.to_path_buf(),
            source: e,
        };
        match self.hierarchy {
            Hierarchy::V2 => {
                libcgroups::v2::manager::Manager::new(self.root.clone(), rel.to_path_buf())
                    .map(|m| m.any())
                    .map_err(|e| wrap(Box::new(e)))
            }
            Hierarchy::V1 | Hierarchy::Hybrid => libcgroups::v1::manager::Manager::new(rel)
                .map(|m| m.any())
                .map_err(|e| wrap(Box::new(e))),
        }
    }

    /// The mount points this cgroup lives under: the unified root, or each
    /// distinct v1 controller mount (co-mounted controllers share one).
    fn mounts(&self) -> Result<Vec<PathBuf>, Error> {
        match self.hierarchy {
            Hierarchy::V2 => Ok(vec![self.root.clone()]),
            Hierarchy::V1 | Hierarchy::Hybrid => {
                let mounts = libcgroups::v1::util::list_supported_mount_points().map_err(|e| {
                    Error::Cgroup {
                        path: self.path.clone(),
                        source: Box::new(e),
                    }
                })?;
                let unique: BTreeSet<PathBuf> = mounts.into_values().collect();
                Ok(unique.into_iter().collect())
            }
        }
    }

    fn dir_in(&self, mount: &Path) -> PathBuf {
        mount.join(self.path.strip_prefix("/").unwrap_or(&self.path))
    }

    fn create_v1(&self, created: &mut Vec<PathBuf>) -> Result<(), Error> {
        for mount in self.mounts()? {
            // cpuset refuses tasks in a cgroup whose cpus/mems are empty,
            // which new v1 cpuset cgroups are; copy the parent's down.
            let is_cpuset = mount.join("cpuset.cpus").exists();
            self.create_path(&mount, created, |parent, dir| {
                if is_cpuset {
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        copy_if_empty(&parent.join(file), &dir.join(file))?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn create_v2(&self, created: &mut Vec<PathBuf>) -> Result<(), Error> {
        let controllers_file = self.root.join("cgroup.controllers");
        let controllers = std::fs::read_to_string(&controllers_file)
            .map_err(Error::io("read", &controllers_file))?;
        let enable = |dir: &Path| {
            for controller in controllers.split_whitespace() {
                // Best effort, as libcgroups does: a parent with processes
                // of its own cannot delegate (no internal processes rule);
                // a limit needing a missing controller fails when applied.
                let file = dir.join("cgroup.subtree_control");
                if let Err(e) = write_existing(&file, &format!("+{controller}")) {
                    tracing::debug!("enable {controller} in {}: {e}", file.display());
                }
            }
        };
        self.create_path(&self.root, created, |parent, _| {
            enable(parent);
            Ok(())
        })?;
        // Containers go below the pod cgroup, so it delegates too.
        enable(&self.dir_in(&self.root));
        Ok(())
    }

    /// Creates each missing directory from `mount` down to the pod cgroup,
    /// calling `init(parent, new_dir)` after creating one.
    fn create_path(
        &self,
        mount: &Path,
        created: &mut Vec<PathBuf>,
        mut init: impl FnMut(&Path, &Path) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut dir = mount.to_path_buf();
        for component in self.path.components().skip(1) {
            let parent = dir.clone();
            dir.push(component);
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    created.push(dir.clone());
                    init(&parent, &dir)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io("create cgroup", &dir)(e)),
            }
        }
        Ok(())
    }
}

fn copy_if_empty(from: &Path, to: &Path) -> Result<(), Error> {
    let current = std::fs::read_to_string(to).map_err(Error::io("read", to))?;
    if !current.trim().is_empty() {
        return Ok(());
    }
    let value = std::fs::read_to_string(from).map_err(Error::io("read", from))?;
    write_existing(to, value.trim()).map_err(Error::io("write", to))
}

/// Writes a control file, never creating one (cgroupfs files exist or the
/// controller is absent).
fn write_existing(path: &Path, data: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(data.as_bytes())
}

/// Adds `rel` and every cgroup below `dir` (which is `rel` in some
/// hierarchy) to `out`. A missing `dir` adds nothing.
fn collect_subtree(dir: &Path, rel: &Path, depth: usize, out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    out.insert(rel.to_path_buf());
    if depth >= MAX_SUBTREE_DEPTH {
        return;
    }
    for entry in entries.flatten() {
        // cgroupfs holds only control files and cgroup directories.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_subtree(&entry.path(), &rel.join(entry.file_name()), depth + 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroup_paths() {
        assert_eq!(
            pod_cgroup_path("/kubepods/burstable/pod1", "abc").unwrap(),
            PathBuf::from("/kubepods/burstable/pod1/crust-abc")
        );
        assert_eq!(
            pod_cgroup_path("kubepods-besteffort-pod1.slice", "abc").unwrap(),
            PathBuf::from(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/crust-abc"
            )
        );
        assert_eq!(
            pod_cgroup_path("", "abc").unwrap(),
            PathBuf::from("/crust/crust-abc")
        );
        assert!(pod_cgroup_path("/kubepods", "../x").is_err());
        assert!(pod_cgroup_path("/kubepods", "a/b").is_err());
    }

    #[test]
    fn stored_paths_are_rechecked() {
        let root = Path::new("/sys/fs/cgroup");
        assert!(PodCgroup::new(Hierarchy::V2, root, Path::new("/kubepods/crust-a")).is_ok());
        for bad in ["relative/x", "/", "/a/../b", "/a/b c"] {
            assert!(
                PodCgroup::new(Hierarchy::V2, root, Path::new(bad)).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn v2_creation_on_a_plain_directory() {
        // The directory logic is the same on a real cgroup2 mount, where the
        // kernel adds the control files (integration tests cover that).
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        let cg = PodCgroup::new(
            Hierarchy::V2,
            root.path(),
            Path::new("/kubepods/pod1/crust-a"),
        )
        .unwrap();
        assert!(!cg.exists());
        cg.create().unwrap();
        cg.create().unwrap();
        assert!(cg.exists());
        assert!(root.path().join("kubepods/pod1/crust-a").is_dir());
    }

    #[test]
    fn v2_creation_failure_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        // No cgroup.controllers: not a cgroup2 root.
        let cg = PodCgroup::new(Hierarchy::V2, root.path(), Path::new("/a/crust-b")).unwrap();
        assert!(cg.create().is_err());
        assert!(!root.path().join("a").exists());
    }
}
