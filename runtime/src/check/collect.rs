//! Gathering what the comparison needs: the node's dirs, mounts, monitors
//! and cgroups (listed first) and the records (read after), then what only
//! orphans tell of (their cgroups) and what went meanwhile.

use std::collections::HashSet;
use std::path::PathBuf;

use crust_image::{ContentKind, OrphanContent};
use crust_store::Store;

use super::find::{self, KnownContainer, KnownPod, Layout, OnNode, Records};
use super::{CheckError, NodeView, Orphan, OrphanKind, Repair, io_err};
use crate::config::Config;
use crate::containers::{ContainerRecord, ContainerState};
use crate::pods::{PodRecord, PodState};

/// The dirs of `config`'s daemon, and the runtime state roots: in the run
/// dir, configured elsewhere, or named by the records of `containers`
/// (a handler a reload removed or moved still has its containers' state).
pub(super) fn layout(
    config: &Config,
    node: &dyn NodeView,
    containers: &[ContainerRecord],
) -> Layout {
    let runtimes = config.run_dir.join("runtimes");
    let mut roots: Vec<PathBuf> = node
        .list_dir(&runtimes)
        .unwrap_or_default()
        .into_iter()
        .map(|n| runtimes.join(n))
        .collect();
    roots.extend(config.runtimes.values().filter_map(|h| h.root.clone()));
    roots.extend(containers.iter().map(|c| match &c.runtime {
        crust_shim_protocol::RuntimeConfig::Embedded { root, .. }
        | crust_shim_protocol::RuntimeConfig::Cli { root, .. } => root.clone(),
    }));
    roots.sort();
    roots.dedup();
    Layout {
        root: config.root.clone(),
        run_dir: config.run_dir.clone(),
        runtime_roots: roots,
    }
}

/// What the node holds, listed before the records are read (see the
/// module docs); the pod cgroups listed are those of the pod records of a
/// first read.
pub(super) fn list_node(
    config: &Config,
    store: &Store,
    node: &dyn NodeView,
) -> Result<(Layout, OnNode), CheckError> {
    // The records of a first read name runtime roots and pod cgroups to
    // look in (what is listed is compared with a later read).
    let layout = layout(config, node, &store.list::<ContainerRecord>()?);
    let list = |dir: PathBuf| {
        node.list_dir(&dir)
            .map_err(io_err(format!("listing {}", dir.display())))
    };
    let mut on = OnNode {
        container_runs: list(layout.container_runs())?,
        container_layers: list(layout.container_layers())?,
        pod_runs: list(layout.pod_runs())?,
        pod_states: list(layout.pod_states())?,
        ..OnNode::default()
    };
    for root in &layout.runtime_roots {
        on.runtime_states.push((root.clone(), list(root.clone())?));
    }
    on.mounts = node.mount_points().map_err(io_err("reading mountinfo"))?;
    on.monitors = node.monitors();
    for pod in store.list::<PodRecord>()? {
        let cgroup = pod.cgroup_path.display().to_string();
        let children = node.cgroup_children(&cgroup);
        on.pod_cgroup_children.insert(cgroup, children);
    }
    Ok((layout, on))
}

/// Keeps what is still there now that the records have been read: what a
/// removal took away between the listing and the reading (its record goes
/// last) was never an orphan.
pub(super) fn still_there(
    orphans: &mut Vec<Orphan>,
    store: &Store,
    node: &dyn NodeView,
) -> Result<(), CheckError> {
    let mounts: HashSet<PathBuf> = node
        .mount_points()
        .map_err(io_err("reading mountinfo"))?
        .into_iter()
        .collect();
    let monitors: HashSet<(i32, PathBuf)> = node.monitors().into_iter().collect();
    let holders: HashSet<String> = crust_image::orphans::leases_in(store)?
        .into_iter()
        .map(|(h, _)| h)
        .collect();
    orphans.retain_mut(|o| match &o.repair {
        Repair::RemoveDirs => {
            o.paths.retain(|p| node.exists(p));
            !o.paths.is_empty()
        }
        Repair::Unmount => mounts.contains(&o.paths[0]),
        Repair::KillMonitor { pid } => monitors.contains(&(*pid, o.paths[0].clone())),
        Repair::DeleteCgroup { .. } => node.cgroup_exists(&o.paths[0].to_string_lossy()),
        Repair::ReleaseLease => holders.contains(&o.id),
        Repair::RemoveContainer | Repair::RemovePod | Repair::Content => true,
    });
    Ok(())
}

/// The records as the comparison needs them.
pub(super) fn read_records(store: &Store, node: &dyn NodeView) -> Result<Records, CheckError> {
    let mut records = Records::default();
    for c in store.list::<ContainerRecord>()? {
        let dirs_present = node.exists(&c.state_dir) || node.exists(&c.layer_dir);
        records.containers.insert(
            c.id.clone(),
            KnownContainer {
                pod_id: c.pod_id,
                state_dir: c.state_dir,
                layer_dir: c.layer_dir,
                creating: c.state == ContainerState::Creating,
                dirs_present,
                cgroups_path: c.cgroups_path,
            },
        );
    }
    for p in store.list::<PodRecord>()? {
        let dirs_present = node.exists(&p.run_dir) || node.exists(&p.state_dir);
        records.pods.insert(
            p.id.clone(),
            KnownPod {
                cgroup: p.cgroup_path.display().to_string(),
                run_dir: p.run_dir,
                state_dir: p.state_dir,
                creating: p.state == PodState::Creating,
                dirs_present,
            },
        );
    }
    records.lease_holders = crust_image::orphans::leases_in(store)?
        .into_iter()
        .map(|(holder, _)| holder)
        .collect();
    Ok(records)
}

/// The cgroups only orphans tell of: the one an orphan container's (or an
/// orphan pod's pause process's) bundle names, the pod cgroup above it
/// when that pod has no record either, and an orphan pod's own cgroup
/// where crust would have made it (next to the known pods' cgroups, or
/// under the default parent).
pub(super) fn cgroups_of_orphans(
    layout: &Layout,
    records: &Records,
    on_node: &OnNode,
    node: &dyn NodeView,
    orphans: &mut Vec<Orphan>,
) {
    let mut seen: HashSet<PathBuf> = orphans
        .iter()
        .filter(|o| o.kind == OrphanKind::Cgroups)
        .map(|o| o.paths[0].clone())
        .collect();
    let mut found = Vec::new();
    let mut add = |id: &str, cgroup: String, unit: Option<String>, why: &str| {
        if node.cgroup_exists(&cgroup) && seen.insert(PathBuf::from(&cgroup)) {
            found.push(Orphan::new(
                OrphanKind::Cgroups,
                id.to_string(),
                vec![PathBuf::from(cgroup)],
                why.to_string(),
                Repair::DeleteCgroup { unit },
            ));
        }
    };
    let orphan_dirs: Vec<(String, bool)> = orphans
        .iter()
        .filter_map(|o| match o.kind {
            OrphanKind::ContainerDirs => Some((o.id.clone(), false)),
            OrphanKind::PodDirs => Some((o.id.clone(), true)),
            _ => None,
        })
        .collect();
    // The cgroupsPaths of orphan containers and orphan pods' pause
    // processes (from their bundles), and of known containers.
    let mut paths: Vec<(String, Option<String>)> = Vec::new();
    for (id, pod) in &orphan_dirs {
        let bundle = if *pod {
            layout.pod_runs().join(id).join("pause").join("bundle")
        } else {
            layout.container_runs().join(id).join("bundle")
        };
        if let Some(p) = node.bundle_cgroups_path(&bundle) {
            paths.push((p, Some(id.clone())));
        }
    }
    for c in records.containers.values() {
        if let Some(p) = &c.cgroups_path {
            paths.push((p.clone(), None));
        }
    }
    for (spec_path, orphan) in paths {
        let Ok(cg) = crate::cgroups::ContainerCgroup::parse(&spec_path) else {
            continue;
        };
        if let Some(id) = &orphan {
            let unit = match &cg {
                crate::cgroups::ContainerCgroup::Scope { unit, .. } => Some(unit.clone()),
                crate::cgroups::ContainerCgroup::Path(_) => None,
            };
            add(
                id,
                cg.path().as_str().to_string(),
                unit,
                "named by the bundle of an orphan",
            );
        }
        // Its pod's cgroup, when that pod has no record.
        if let Some(parent) = cg.path().parent()
            && let Some(name) = parent.name()
            && let Some(pod_id) = name
                .strip_prefix("crust-pod")
                .and_then(|n| n.strip_suffix(".slice"))
                .or_else(|| name.strip_prefix("crust-"))
            && crate::ids::is_id(pod_id)
            && !records.pods.contains_key(pod_id)
        {
            let unit = name.ends_with(".slice").then(|| name.to_string());
            add(
                pod_id,
                parent.as_str().to_string(),
                unit,
                "a pod cgroup of a pod sandbox with no record",
            );
        }
    }
    // An orphan pod's own cgroup, where crust would have put it.
    let mut parents: Vec<String> = on_node
        .pod_cgroup_children
        .keys()
        .filter_map(|c| {
            crust_cgroups::CgroupPath::parse(c)
                .ok()?
                .parent()
                .map(|p| p.as_str().to_string())
        })
        .collect();
    parents.extend(["/crust".to_string(), "/crust.slice".to_string()]);
    parents.sort();
    parents.dedup();
    for (id, pod) in &orphan_dirs {
        if !pod {
            continue;
        }
        for parent in &parents {
            for (cgroup, unit) in find::pod_cgroup_candidates(parent, id) {
                add(id, cgroup, unit, "the cgroup of an orphan pod sandbox");
            }
        }
    }
    // A cgroup below another orphan cgroup goes with it.
    let tops: Vec<PathBuf> = orphans
        .iter()
        .chain(&found)
        .filter(|o| o.kind == OrphanKind::Cgroups)
        .map(|o| o.paths[0].clone())
        .collect();
    orphans.extend(found);
    orphans.retain(|o| {
        o.kind != OrphanKind::Cgroups
            || !tops
                .iter()
                .any(|t| t != &o.paths[0] && o.paths[0].starts_with(t))
    });
}

pub(super) fn content_orphan(c: OrphanContent) -> Orphan {
    let (kind, detail) = match c.kind {
        ContentKind::Blob => (OrphanKind::ImageBlobs, "a blob no image lists"),
        ContentKind::Layer => (
            OrphanKind::ImageLayers,
            "an unpacked layer no image or container uses",
        ),
        ContentKind::Temp => (
            OrphanKind::ImageTemp,
            "a write or deletion a crash cut short",
        ),
    };
    let mut o = Orphan::new(
        kind,
        c.name,
        vec![c.path],
        detail.to_string(),
        Repair::Content,
    );
    o.bytes = c.bytes;
    o
}
