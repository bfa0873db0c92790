//! The node's cgroups as pods and containers use them: crust-cgroups'
//! view of the hierarchies and, with the systemd driver, its D-Bus client.
//!
//! Where things live:
//! - cgroupfs driver: a pod is the cgroup `<cgroup_parent>/crust-<pod id>`
//!   (delegating its controllers on v2), its containers and pause process
//!   `<pod cgroup>/crust-<id>`;
//! - systemd driver: a pod is a slice, kubelet's `cgroup_parent`
//!   (`kubepods-burstable-pod<uid>.slice`) or, when it gives none, crust's
//!   own `crust-pod<pod id>.slice`; containers and the pause process are
//!   the transient scopes `crust-<id>.scope` in it, which the OCI runtime
//!   creates from the cgroupsPath `<slice>:crust:<id>`.
//!
//! The daemon reaches a container's cgroup through the cgroupsPath its
//! spec gave the runtime ([`ContainerCgroup::parse`]), so stats and the
//! orphan cleanup look where the runtime put it.

use std::collections::HashMap;
use std::future::Future;

use crust_cgroups::systemd::Systemd;
use crust_cgroups::{
    CgroupFs, CgroupParent, CgroupPath, Controllers, Driver, Hierarchy, expand_slice,
    pod_cgroup_path, validate_unified,
};
use oci_spec::runtime::LinuxResources;
use serde::{Deserialize, Serialize};

pub use crust_cgroups::Error;

/// A pod's slice (systemd driver).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSlice {
    /// The unit name, e.g. `kubepods-burstable-pod<uid>.slice`.
    pub name: String,
    /// crust started it (its own per-pod slice, or kubelet's when it did
    /// not exist yet) and stops it when the pod goes.
    pub owned: bool,
}

/// Where a pod's cgroup goes: its path in every hierarchy and, with the
/// systemd driver, its slice. Pure: `exists` says whether a cgroup is
/// there already.
pub fn plan_pod(
    driver: Driver,
    cgroup_parent: &str,
    pod_id: &str,
    exists: impl Fn(&CgroupPath) -> bool,
) -> Result<(CgroupPath, Option<PodSlice>), Error> {
    match driver {
        Driver::Cgroupfs => {
            let parent = CgroupParent::parse(cgroup_parent, Driver::Cgroupfs)?;
            Ok((pod_cgroup_path(&parent, pod_id)?, None))
        }
        Driver::Systemd if cgroup_parent.is_empty() => {
            let name = format!("crust-pod{pod_id}.slice");
            let path = expand_slice(&name)?;
            Ok((path, Some(PodSlice { name, owned: true })))
        }
        Driver::Systemd => {
            let parent = CgroupParent::parse(cgroup_parent, Driver::Systemd)?;
            let name = parent.slice.unwrap_or_default();
            let owned = !exists(&parent.path);
            Ok((parent.path, Some(PodSlice { name, owned })))
        }
    }
}

/// A container's (or pause process's) cgroup, from its OCI cgroupsPath.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerCgroup {
    /// cgroupfs driver: a path in every hierarchy.
    Path(CgroupPath),
    /// systemd driver: the scope `unit` whose cgroup is `path`.
    Scope { unit: String, path: CgroupPath },
}

impl ContainerCgroup {
    /// `/kubepods/pod1/crust-<id>` or `<slice>:<prefix>:<name>` (the scope
    /// `<prefix>-<name>.scope` in the slice, as runc and libcontainer
    /// name it).
    pub fn parse(cgroups_path: &str) -> Result<ContainerCgroup, Error> {
        if cgroups_path.starts_with('/') {
            return CgroupPath::parse(cgroups_path).map(ContainerCgroup::Path);
        }
        let mut parts = cgroups_path.splitn(3, ':');
        let (Some(slice), Some(prefix), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(Error::Invalid {
                what: format!("cgroupsPath {}", crust_cgroups::quote(cgroups_path)),
                why: "neither an absolute path nor slice:prefix:name".into(),
            });
        };
        let slice = if slice.is_empty() {
            "system.slice"
        } else {
            slice
        };
        let unit = format!("{prefix}-{name}.scope");
        let path = expand_slice(slice)?.join(&unit)?;
        Ok(ContainerCgroup::Scope { unit, path })
    }

    pub fn path(&self) -> &CgroupPath {
        match self {
            ContainerCgroup::Path(p) | ContainerCgroup::Scope { path: p, .. } => p,
        }
    }
}

/// The cgroup of a pod as its containers' `cgroup_parent` names it (the
/// pod cgroup's path, or its slice).
pub fn pod_cgroup_of_parent(parent: &str) -> Result<CgroupPath, Error> {
    if !parent.contains('/') && parent.ends_with(".slice") {
        expand_slice(parent)
    } else {
        CgroupPath::parse(parent)
    }
}

/// Checks `unified` keys against the controllers a cgroup has (`None`: a
/// cgroup v1 node, where there are no unified keys). The error names the
/// key; `field` is the request field.
pub fn check_unified(
    field: &str,
    unified: &HashMap<String, String>,
    controllers: Option<Controllers>,
) -> Result<(), String> {
    if unified.is_empty() {
        return Ok(());
    }
    let Some(controllers) = controllers else {
        // A malformed or escaping key is named as such on v1 too; only a
        // well-formed one is refused for the node's cgroup version.
        let every: Controllers = crust_cgroups::Controller::ALL.into_iter().collect();
        validate_unified(unified, every).map_err(|e| format!("{field}: {e}"))?;
        return Err(format!("{field}: needs cgroup v2, this node uses v1"));
    };
    validate_unified(unified, controllers).map_err(|e| format!("{field}: {e}"))
}

/// Whether this process shares systemd's PID namespace: PID 1 here is
/// systemd, and it is in the namespace this process is in. Unknown (an
/// unreadable /proc) counts as yes.
fn in_systemds_pid_namespace() -> bool {
    let comm = std::fs::read_to_string("/proc/1/comm");
    if comm.as_deref().is_ok_and(|c| c.trim() != "systemd") {
        return false;
    }
    match (
        std::fs::read_link("/proc/self/ns/pid"),
        std::fs::read_link("/proc/1/ns/pid"),
    ) {
        (Ok(mine), Ok(init)) => mine == init,
        _ => true,
    }
}

/// The node's hierarchies and the driver.
pub struct NodeCgroups {
    fs: CgroupFs,
    /// The systemd driver's client (connects on first use).
    systemd: Option<Systemd>,
    /// For the D-Bus calls of blocking callers.
    rt: tokio::runtime::Handle,
}

impl NodeCgroups {
    /// Detects the hierarchies (and, for the systemd driver, checks that
    /// systemd is the init system). Call on the daemon's runtime.
    pub fn detect(systemd: bool) -> Result<NodeCgroups, Error> {
        let fs = CgroupFs::detect()?;
        if systemd && !crust_cgroups::systemd_booted() {
            return Err(Error::Unsupported {
                what: "cgroup_driver = \"systemd\"".into(),
                why: "systemd is not the init system on this host".into(),
            });
        }
        if systemd && !in_systemds_pid_namespace() {
            // The runtime hands systemd the PIDs to put into scopes as this
            // namespace numbers them; systemd answers "Process with ID N
            // does not exist" for every pod. Said once, at start.
            return Err(Error::Unsupported {
                what: "cgroup_driver = \"systemd\"".into(),
                why: "the daemon runs in a PID namespace of its own, where systemd cannot \
                      find the processes it is to put into scopes: run it in the host's \
                      PID namespace"
                    .into(),
            });
        }
        Ok(Self::with_fs(fs, systemd))
    }

    pub fn with_fs(fs: CgroupFs, systemd: bool) -> NodeCgroups {
        let hierarchy = fs.hierarchy();
        NodeCgroups {
            fs,
            systemd: systemd.then(|| Systemd::new(hierarchy)),
            rt: tokio::runtime::Handle::current(),
        }
    }

    pub fn fs(&self) -> &CgroupFs {
        &self.fs
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.fs.hierarchy()
    }

    /// Runs a D-Bus call from blocking code (the blocking pool, or a
    /// runtime thread that may block).
    fn block_on<F: Future>(&self, f: F) -> F::Output {
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.rt.block_on(f))
            }
            _ => self.rt.block_on(f),
        }
    }

    fn systemd(&self) -> Result<&Systemd, Error> {
        self.systemd.as_ref().ok_or_else(|| Error::Unsupported {
            what: "a systemd slice or scope".into(),
            why: "the daemon runs with cgroup_driver = \"cgroupfs\"".into(),
        })
    }

    /// Whether a cgroup exists (in the unified hierarchy on v2, else in
    /// the first controller hierarchy).
    pub fn exists(&self, path: &CgroupPath) -> bool {
        self.fs.cgroup(path.clone()).exists()
    }

    /// Makes a pod's cgroup: its slice (systemd; one that exists is left
    /// as it is), or a cgroup that delegates its controllers (cgroupfs).
    /// Blocking.
    pub fn create_pod(&self, path: &CgroupPath, slice: Option<&PodSlice>) -> Result<(), Error> {
        match slice {
            Some(s) => self.block_on(
                self.systemd()?
                    .start_slice(&s.name, &LinuxResources::default()),
            ),
            None => self.fs.cgroup(path.clone()).create_for_children(),
        }
    }

    /// Removes a pod's cgroup with everything below it: its slice if crust
    /// started it (systemd stops every unit in it), then whatever cgroups
    /// are left (killing what runs there). A slice kubelet made stays
    /// (kubelet removes it). Blocking; idempotent.
    pub fn delete_pod(&self, path: &CgroupPath, slice: Option<&PodSlice>) -> Result<(), Error> {
        match slice {
            Some(s) if s.owned => {
                self.block_on(self.systemd()?.stop_unit(&s.name))?;
                self.fs.cgroup(path.clone()).delete()
            }
            Some(_) => Ok(()),
            None => self.fs.cgroup(path.clone()).delete(),
        }
    }

    /// Sets a pod's cgroup limits (UpdatePodSandboxResources): through
    /// its slice's unit properties and files (systemd), or its files
    /// (cgroupfs). Everything is checked before anything is written.
    /// Blocking.
    pub fn update_pod(
        &self,
        path: &CgroupPath,
        slice: Option<&PodSlice>,
        resources: &LinuxResources,
    ) -> Result<(), Error> {
        match slice {
            Some(s) => self.block_on(self.systemd()?.apply(&self.fs, &s.name, path, resources)),
            None => self.fs.cgroup(path.clone()).apply(resources),
        }
    }

    /// Kills what is left in a container's cgroup and removes it: stops
    /// its scope (systemd), then deletes the cgroup. Returns whether there
    /// was anything. Blocking; idempotent.
    pub fn kill_container(&self, cg: &ContainerCgroup) -> Result<bool, Error> {
        let existed = self.exists(cg.path());
        if let ContainerCgroup::Scope { unit, .. } = cg
            && let Some(systemd) = &self.systemd
        {
            self.block_on(systemd.stop_unit(unit))?;
        }
        self.fs.cgroup(cg.path().clone()).delete()?;
        Ok(existed)
    }

    /// Writes `unified` keys into a container's cgroup files (v2), as runc
    /// does after its systemd or cgroupfs manager has set the rest: with
    /// the systemd driver, systemd has properties for a few keys only and
    /// libcontainer's systemd manager drops the others (`memory.oom.group`,
    /// `memory.swap.max`, `io.*` ...); and an update's unit properties or
    /// memory settings rewrite files (memory.swap.max) a key had set.
    /// Nothing on v1 nodes, which have no unified keys. Blocking.
    pub fn write_unified(
        &self,
        cg: &ContainerCgroup,
        unified: &HashMap<String, String>,
    ) -> Result<(), Error> {
        if unified.is_empty() || self.hierarchy() != Hierarchy::V2 {
            return Ok(());
        }
        let mut resources = LinuxResources::default();
        resources.set_unified(Some(unified.clone()));
        self.fs.cgroup(cg.path().clone()).apply(&resources)
    }

    /// The controllers a cgroup has (what `unified` keys may name): None
    /// on cgroup v1 and hybrid nodes. The nearest existing ancestor
    /// answers for a cgroup not made yet.
    pub fn unified_controllers(&self, path: &CgroupPath) -> Result<Option<Controllers>, Error> {
        if self.hierarchy() != Hierarchy::V2 {
            return Ok(None);
        }
        let mut at = path.clone();
        while !at.is_root() && !self.exists(&at) {
            at = at.parent().unwrap_or_else(CgroupPath::root);
        }
        self.fs.controllers(&at).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_get_a_cgroup_or_a_slice() {
        let none = |_: &CgroupPath| false;
        let (p, s) = plan_pod(Driver::Cgroupfs, "/kubepods/pod1", "abc", none).unwrap();
        assert_eq!((p.as_str(), s), ("/kubepods/pod1/crust-abc", None));
        let (p, _) = plan_pod(Driver::Cgroupfs, "", "abc", none).unwrap();
        assert_eq!(p.as_str(), "/crust/crust-abc");

        // kubelet's slice: the pod is the slice; crust owns it only if it
        // makes it.
        let parent = "kubepods-burstable-pod1.slice";
        let want = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice";
        let (p, s) = plan_pod(Driver::Systemd, parent, "abc", |_| true).unwrap();
        assert_eq!(p.as_str(), want);
        assert_eq!(
            s,
            Some(PodSlice {
                name: parent.into(),
                owned: false
            })
        );
        let (_, s) = plan_pod(Driver::Systemd, parent, "abc", none).unwrap();
        assert!(s.unwrap().owned);
        // No parent: a slice of crust's own per pod.
        let (p, s) = plan_pod(Driver::Systemd, "", "abc", |_| true).unwrap();
        assert_eq!(p.as_str(), "/crust.slice/crust-podabc.slice");
        assert_eq!(
            s,
            Some(PodSlice {
                name: "crust-podabc.slice".into(),
                owned: true
            })
        );
        // The wrong spelling for the driver is refused, naming the parent.
        let e = plan_pod(Driver::Systemd, "/kubepods/pod1", "abc", none).unwrap_err();
        assert!(e.is_invalid_argument(), "{e}");
        let e = plan_pod(Driver::Cgroupfs, "kubepods.slice", "abc", none).unwrap_err();
        assert!(e.to_string().contains("kubepods.slice"), "{e}");
    }

    #[test]
    fn container_cgroups_come_from_the_cgroups_path() {
        assert_eq!(
            ContainerCgroup::parse("/crust/crust-p/crust-c").unwrap(),
            ContainerCgroup::Path(CgroupPath::parse("/crust/crust-p/crust-c").unwrap())
        );
        let cg = ContainerCgroup::parse("kubepods-pod1.slice:crust:c1").unwrap();
        assert_eq!(
            cg,
            ContainerCgroup::Scope {
                unit: "crust-c1.scope".into(),
                path: CgroupPath::parse("/kubepods.slice/kubepods-pod1.slice/crust-c1.scope")
                    .unwrap()
            }
        );
        for bad in ["relative/path", "a.slice:crust", "/a/../b", "x:crust:c"] {
            assert!(ContainerCgroup::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            pod_cgroup_of_parent("kubepods-pod1.slice")
                .unwrap()
                .as_str(),
            "/kubepods.slice/kubepods-pod1.slice"
        );
        assert_eq!(
            pod_cgroup_of_parent("/crust/crust-p").unwrap().as_str(),
            "/crust/crust-p"
        );
    }

    #[test]
    fn unified_keys_are_checked_against_the_controllers() {
        let memory = Controllers::parse("cpu memory pids");
        let ok: HashMap<String, String> = [("memory.high".into(), "1M".into())].into();
        check_unified("f", &ok, Some(memory)).unwrap();
        check_unified("f", &HashMap::new(), None).unwrap();
        let e = check_unified("linux.unified", &ok, None).unwrap_err();
        assert!(e.starts_with("linux.unified: needs cgroup v2"), "{e}");
        for key in ["io.max", "cgroup.procs", "../memory.max", "memory/x"] {
            let bad: HashMap<String, String> = [(key.into(), "1".into())].into();
            let e = check_unified("linux.unified", &bad, Some(memory)).unwrap_err();
            assert!(e.starts_with("linux.unified: "), "{e}");
            assert!(e.contains(key), "{key}: {e}");
        }
        let long = "memory.".to_string() + &"x".repeat(5000);
        let bad: HashMap<String, String> = [(long, "1".into())].into();
        let e = check_unified("f", &bad, Some(memory)).unwrap_err();
        assert!(e.len() < 600, "{}", e.len());
    }
}
