//! The comparison itself, pure: what the records reference against what
//! the node holds ([`super::collect`] gathers both), giving every orphan
//! but the image store's (crust-image decides those) and the cgroups that
//! only an orphan's bundle names ([`super::collect`] looks those up).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{Orphan, OrphanKind, Repair};
use crate::ids::is_id;

/// A container as its record says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KnownContainer {
    pub pod_id: String,
    pub state_dir: PathBuf,
    pub layer_dir: PathBuf,
    /// CreateContainer is at work (or was, before a crash): its effects
    /// may not exist yet, and recovery undoes it at the next start.
    pub creating: bool,
    /// Whether its state dir or its layer dir exists.
    pub dirs_present: bool,
    /// The cgroupsPath its spec gave the runtime (records of older
    /// daemons: none).
    pub cgroups_path: Option<String>,
}

/// A pod sandbox as its record says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KnownPod {
    pub run_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Its cgroup (or slice) path.
    pub cgroup: String,
    pub creating: bool,
    /// Whether its run dir or its state dir exists.
    pub dirs_present: bool,
}

/// What the records reference.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Records {
    pub containers: BTreeMap<String, KnownContainer>,
    pub pods: BTreeMap<String, KnownPod>,
    /// Holders of image leases: a container ID, or `<container ID>/...`
    /// for an image volume.
    pub lease_holders: Vec<String>,
}

impl Records {
    /// Whether `id` names a container or a pod (whose pause process has
    /// runtime state and a cgroup named by the pod's ID).
    pub fn knows(&self, id: &str) -> bool {
        self.containers.contains_key(id) || self.pods.contains_key(id)
    }
}

/// The daemon's dirs.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub root: PathBuf,
    pub run_dir: PathBuf,
    /// The OCI runtimes' state roots (`<run_dir>/runtimes/*` and any
    /// configured elsewhere): a dir per container and pause process.
    pub runtime_roots: Vec<PathBuf>,
}

impl Layout {
    /// Monitors' state dirs and bundles: `<run_dir>/containers/<id>`.
    pub fn container_runs(&self) -> PathBuf {
        self.run_dir.join("containers")
    }
    /// Writable layers: `<root>/containers/<id>`.
    pub fn container_layers(&self) -> PathBuf {
        self.root.join("containers")
    }
    /// Pinned namespaces, /dev/shm, pause: `<run_dir>/pods/<id>`.
    pub fn pod_runs(&self) -> PathBuf {
        self.run_dir.join("pods")
    }
    /// hostname, hosts, resolv.conf: `<root>/pods/<id>`.
    pub fn pod_states(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// The ID of the container or pod whose dir holds `path` (at any
    /// depth), and whether it is a pod's.
    pub fn owner_of(&self, path: &Path) -> Option<(String, bool)> {
        for (base, pod) in [
            (self.container_runs(), false),
            (self.container_layers(), false),
            (self.pod_runs(), true),
            (self.pod_states(), true),
        ] {
            if let Ok(rest) = path.strip_prefix(&base)
                && let Some(first) = rest.components().next()
            {
                let name = first.as_os_str().to_string_lossy();
                return is_id(&name).then(|| (name.into_owned(), pod));
            }
        }
        None
    }
}

/// What the node holds, listed before the records were read (so anything
/// listed whose record exists is seen with it: a record is written before
/// any effect it describes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OnNode {
    /// Entries of `<run_dir>/containers`, `<root>/containers`,
    /// `<run_dir>/pods`, `<root>/pods`.
    pub container_runs: Vec<String>,
    pub container_layers: Vec<String>,
    pub pod_runs: Vec<String>,
    pub pod_states: Vec<String>,
    /// Entries of each runtime state root.
    pub runtime_states: Vec<(PathBuf, Vec<String>)>,
    /// Every mount point of the daemon's mount namespace.
    pub mounts: Vec<PathBuf>,
    /// Processes that are monitors by their command line: pid and state
    /// dir.
    pub monitors: Vec<(i32, PathBuf)>,
    /// The cgroups right below each pod cgroup, by the pod cgroup's path.
    pub pod_cgroup_children: BTreeMap<String, Vec<String>>,
}

/// Every orphan [`OnNode`] shows against `records` (without sizes).
pub fn orphans(layout: &Layout, records: &Records, node: &OnNode) -> Vec<Orphan> {
    let mut out = Vec::new();
    let orphan_pods: BTreeSet<&str> = node
        .pod_runs
        .iter()
        .chain(&node.pod_states)
        .map(String::as_str)
        .filter(|n| is_id(n) && !records.pods.contains_key(*n))
        .collect();

    // Dirs: by ID, each container's or pod's together.
    let mut dirs: BTreeMap<(String, bool), Vec<PathBuf>> = BTreeMap::new();
    for (base, names, pod) in [
        (layout.container_runs(), &node.container_runs, false),
        (layout.container_layers(), &node.container_layers, false),
        (layout.pod_runs(), &node.pod_runs, true),
        (layout.pod_states(), &node.pod_states, true),
    ] {
        for name in names {
            let known = if pod {
                records.pods.contains_key(name)
            } else {
                records.containers.contains_key(name)
            };
            if is_id(name) && !known {
                dirs.entry((name.clone(), pod))
                    .or_default()
                    .push(base.join(name));
            }
        }
    }
    for (root, names) in &node.runtime_states {
        for name in names {
            if is_id(name) && !records.knows(name) {
                let pod = orphan_pods.contains(name.as_str());
                dirs.entry((name.clone(), pod))
                    .or_default()
                    .push(root.join(name));
            }
        }
    }
    for ((id, pod), paths) in dirs {
        let runtime_only = paths
            .iter()
            .all(|p| node.runtime_states.iter().any(|(r, _)| p.starts_with(r)));
        let (kind, why) = match (pod, runtime_only) {
            (true, _) => (OrphanKind::PodDirs, "no pod sandbox record"),
            // A container's, or a pause process's whose pod dirs are gone.
            (false, true) => (
                OrphanKind::ContainerDirs,
                "OCI runtime state, no container or pod sandbox record",
            ),
            (false, false) => (OrphanKind::ContainerDirs, "no container record"),
        };
        out.push(Orphan::new(
            kind,
            id,
            paths,
            why.to_string(),
            Repair::RemoveDirs,
        ));
    }

    // Mounts in a container's or pod's dir that no record owns.
    for m in &node.mounts {
        let Some((id, pod)) = layout.owner_of(m) else {
            continue;
        };
        let known = if pod {
            records.pods.contains_key(&id)
        } else {
            records.containers.contains_key(&id)
        };
        if !known {
            let what = if pod { "pod sandbox" } else { "container" };
            out.push(Orphan::new(
                OrphanKind::Mounts,
                id,
                vec![m.clone()],
                format!("in the dir of a {what} with no record"),
                Repair::Unmount,
            ));
        }
    }

    // Monitors of a state dir no record owns.
    for (pid, state_dir) in &node.monitors {
        let Some((id, pod)) = layout.owner_of(state_dir) else {
            continue;
        };
        let known = if pod {
            records.pods.contains_key(&id)
        } else {
            records.containers.contains_key(&id)
        };
        if !known {
            out.push(Orphan::new(
                OrphanKind::Monitors,
                id,
                vec![state_dir.clone()],
                format!("crust-shim pid {pid}"),
                Repair::KillMonitor { pid: *pid },
            ));
        }
    }

    // Container cgroups in a known pod's cgroup that no record owns.
    for (pod_id, pod) in &records.pods {
        let Some(children) = node.pod_cgroup_children.get(&pod.cgroup) else {
            continue;
        };
        for child in children {
            let Some((id, unit)) = container_cgroup_name(child) else {
                continue;
            };
            if id != pod_id && !records.containers.contains_key(id) {
                out.push(Orphan::new(
                    OrphanKind::Cgroups,
                    id.to_string(),
                    vec![PathBuf::from(&pod.cgroup).join(child)],
                    format!("in pod sandbox {pod_id}'s cgroup, no container record"),
                    Repair::DeleteCgroup { unit },
                ));
            }
        }
    }

    // Records whose dirs are gone, or whose pod is.
    for (id, c) in &records.containers {
        if c.creating {
            continue;
        }
        let why = if !records.pods.contains_key(&c.pod_id) {
            format!("its pod sandbox {} has no record", c.pod_id)
        } else if !c.dirs_present {
            "its state and layer dirs are gone".to_string()
        } else {
            continue;
        };
        out.push(Orphan::new(
            OrphanKind::ContainerRecords,
            id.clone(),
            vec![c.state_dir.clone(), c.layer_dir.clone()],
            why,
            Repair::RemoveContainer,
        ));
    }
    for (id, p) in &records.pods {
        if !p.creating && !p.dirs_present {
            out.push(Orphan::new(
                OrphanKind::PodRecords,
                id.clone(),
                vec![p.run_dir.clone(), p.state_dir.clone()],
                "its run and state dirs are gone".to_string(),
                Repair::RemovePod,
            ));
        }
    }

    // Leases no container holds.
    for holder in &records.lease_holders {
        let container = holder.split('/').next().unwrap_or(holder);
        if !records.containers.contains_key(container) {
            out.push(Orphan::new(
                OrphanKind::Leases,
                holder.clone(),
                vec![],
                "an image lease of a container with no record".to_string(),
                Repair::ReleaseLease,
            ));
        }
    }
    out
}

/// The container ID and, for a scope, the unit of a cgroup crust names
/// after a container: `crust-<id>` (cgroupfs) or `crust-<id>.scope`
/// (systemd).
pub fn container_cgroup_name(name: &str) -> Option<(&str, Option<String>)> {
    let rest = name.strip_prefix("crust-")?;
    match rest.strip_suffix(".scope") {
        Some(id) if is_id(id) => Some((id, Some(name.to_string()))),
        None if is_id(rest) => Some((rest, None)),
        _ => None,
    }
}

/// Where a pod's own cgroup would be under `parent` (the parent of some
/// pod cgroup crust knows): `crust-<id>` (cgroupfs) or
/// `crust-pod<id>.slice` (crust's own slice, systemd).
pub fn pod_cgroup_candidates(parent: &str, id: &str) -> [(String, Option<String>); 2] {
    let sep = if parent.ends_with('/') { "" } else { "/" };
    let slice = format!("crust-pod{id}.slice");
    [
        (format!("{parent}{sep}crust-{id}"), None),
        (format!("{parent}{sep}{slice}"), Some(slice)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn layout() -> Layout {
        Layout {
            root: "/var/lib/crust".into(),
            run_dir: "/run/crust".into(),
            runtime_roots: vec!["/run/crust/runtimes/default".into()],
        }
    }

    /// Pod `a` with container `b`, all in place.
    fn records() -> Records {
        let mut r = Records::default();
        r.pods.insert(
            id('a'),
            KnownPod {
                run_dir: format!("/run/crust/pods/{}", id('a')).into(),
                state_dir: format!("/var/lib/crust/pods/{}", id('a')).into(),
                cgroup: format!("/crust/crust-{}", id('a')),
                creating: false,
                dirs_present: true,
            },
        );
        r.containers.insert(
            id('b'),
            KnownContainer {
                pod_id: id('a'),
                state_dir: format!("/run/crust/containers/{}", id('b')).into(),
                layer_dir: format!("/var/lib/crust/containers/{}", id('b')).into(),
                creating: false,
                dirs_present: true,
                cgroups_path: Some(format!("/crust/crust-{}/crust-{}", id('a'), id('b'))),
            },
        );
        r.lease_holders = vec![id('b'), format!("{}/vol0", id('b'))];
        r
    }

    /// What the node holds for `records()`, nothing more.
    fn node() -> OnNode {
        let (a, b) = (id('a'), id('b'));
        OnNode {
            container_runs: vec![b.clone()],
            container_layers: vec![b.clone()],
            pod_runs: vec![a.clone()],
            pod_states: vec![a.clone()],
            runtime_states: vec![(
                "/run/crust/runtimes/default".into(),
                vec![a.clone(), b.clone()],
            )],
            mounts: vec![
                "/".into(),
                format!("/run/crust/containers/{b}/bundle/rootfs").into(),
                format!("/run/crust/pods/{a}/ns/net").into(),
                "/run/crust/containers".into(),
            ],
            monitors: vec![
                (10, format!("/run/crust/containers/{b}").into()),
                (11, format!("/run/crust/containers/{b}/exec/e1").into()),
                (12, format!("/run/crust/pods/{a}/pause").into()),
                // Another daemon's.
                (13, format!("/run/other/containers/{}", id('9')).into()),
            ],
            pod_cgroup_children: [(
                format!("/crust/crust-{a}"),
                vec![format!("crust-{b}"), format!("crust-{a}"), "kubelet".into()],
            )]
            .into(),
        }
    }

    fn summary(found: &[Orphan]) -> Vec<(OrphanKind, String, Vec<String>)> {
        found
            .iter()
            .map(|o| {
                (
                    o.kind,
                    o.id.clone(),
                    o.paths.iter().map(|p| p.display().to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_consistent_node_has_no_orphans() {
        assert_eq!(summary(&orphans(&layout(), &records(), &node())), vec![]);
        // Nothing at all is consistent too.
        assert_eq!(
            summary(&orphans(&layout(), &Records::default(), &OnNode::default())),
            vec![]
        );
    }

    #[test]
    fn a_container_without_its_record_is_found_everywhere() {
        let mut r = records();
        r.containers.remove(&id('b'));
        let b = id('b');
        let found = summary(&orphans(&layout(), &r, &node()));
        assert_eq!(
            found,
            vec![
                (
                    OrphanKind::ContainerDirs,
                    b.clone(),
                    vec![
                        format!("/run/crust/containers/{b}"),
                        format!("/var/lib/crust/containers/{b}"),
                        format!("/run/crust/runtimes/default/{b}"),
                    ]
                ),
                (
                    OrphanKind::Mounts,
                    b.clone(),
                    vec![format!("/run/crust/containers/{b}/bundle/rootfs")]
                ),
                (
                    OrphanKind::Monitors,
                    b.clone(),
                    vec![format!("/run/crust/containers/{b}")]
                ),
                (
                    OrphanKind::Monitors,
                    b.clone(),
                    vec![format!("/run/crust/containers/{b}/exec/e1")]
                ),
                (
                    OrphanKind::Cgroups,
                    b.clone(),
                    vec![format!("/crust/crust-{}/crust-{b}", id('a'))]
                ),
                (OrphanKind::Leases, b.clone(), vec![]),
                (OrphanKind::Leases, format!("{b}/vol0"), vec![]),
            ]
        );
        let o = orphans(&layout(), &r, &node());
        assert_eq!(o[2].repair, Repair::KillMonitor { pid: 10 });
        assert_eq!(o[4].repair, Repair::DeleteCgroup { unit: None });
    }

    #[test]
    fn a_pod_without_its_record_takes_its_containers_records_with_it() {
        let mut r = records();
        r.pods.remove(&id('a'));
        let (a, b) = (id('a'), id('b'));
        let found = summary(&orphans(&layout(), &r, &node()));
        assert_eq!(
            found,
            vec![
                (
                    OrphanKind::PodDirs,
                    a.clone(),
                    vec![
                        format!("/run/crust/pods/{a}"),
                        format!("/var/lib/crust/pods/{a}"),
                        format!("/run/crust/runtimes/default/{a}"),
                    ]
                ),
                (
                    OrphanKind::Mounts,
                    a.clone(),
                    vec![format!("/run/crust/pods/{a}/ns/net")]
                ),
                (
                    OrphanKind::Monitors,
                    a.clone(),
                    vec![format!("/run/crust/pods/{a}/pause")]
                ),
                (
                    OrphanKind::ContainerRecords,
                    b.clone(),
                    vec![
                        format!("/run/crust/containers/{b}"),
                        format!("/var/lib/crust/containers/{b}")
                    ]
                ),
            ]
        );
    }

    #[test]
    fn records_without_dirs_but_not_those_being_created() {
        let mut r = records();
        r.containers.get_mut(&id('b')).unwrap().dirs_present = false;
        r.pods.get_mut(&id('a')).unwrap().dirs_present = false;
        let kinds: Vec<OrphanKind> = orphans(&layout(), &r, &OnNode::default())
            .iter()
            .map(|o| o.kind)
            .collect();
        assert_eq!(
            kinds,
            vec![OrphanKind::ContainerRecords, OrphanKind::PodRecords]
        );
        r.containers.get_mut(&id('b')).unwrap().creating = true;
        r.pods.get_mut(&id('a')).unwrap().creating = true;
        assert!(orphans(&layout(), &r, &OnNode::default()).is_empty());
    }

    #[test]
    fn names_that_are_no_ids_are_never_ours() {
        let mut n = node();
        n.container_runs.push("lost+found".into());
        n.pod_states.push("README".into());
        n.runtime_states[0].1.push("x".into());
        n.mounts
            .push("/run/crust/containers/not-an-id/rootfs".into());
        n.pod_cgroup_children
            .values_mut()
            .for_each(|c| c.push("crust-short".into()));
        assert!(orphans(&layout(), &records(), &n).is_empty());
    }

    #[test]
    fn cgroup_names() {
        let b = id('b');
        assert_eq!(
            container_cgroup_name(&format!("crust-{b}")),
            Some((b.as_str(), None))
        );
        assert_eq!(
            container_cgroup_name(&format!("crust-{b}.scope")),
            Some((b.as_str(), Some(format!("crust-{b}.scope"))))
        );
        for bad in ["crust-", "crust-x.scope", "kubepods", &b] {
            assert_eq!(container_cgroup_name(bad), None, "{bad}");
        }
        assert_eq!(
            pod_cgroup_candidates("/crust", "p"),
            [
                ("/crust/crust-p".to_string(), None),
                (
                    "/crust/crust-podp.slice".to_string(),
                    Some("crust-podp.slice".to_string())
                )
            ]
        );
        assert_eq!(pod_cgroup_candidates("/", "p")[0].0, "/crust-p");
    }
}
