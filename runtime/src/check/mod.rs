//! `crust check`: compares the metadata store with the node and reports
//! what nothing references, with the bytes it takes on disk: image blobs
//! and unpacked layers no image or lease keeps (and, with no daemon
//! running, the temp files of interrupted writes), container and pod dirs
//! without a record, mounts in them, monitors (`crust-shim`) and cgroups
//! without a container, records whose dirs are gone (or whose pod is), and
//! image leases without a container. With `repair` it removes them.
//!
//! [`online`] is the daemon checking itself (`crust.admin.v1.Orphans`);
//! [`offline`] is the CLI checking a root no daemon runs on, holding the
//! run dir's lock and the metadata store while it does.
//!
//! Races: the node is listed before the records are read, and a record is
//! written before any effect it describes and deleted after them, with IDs
//! never reused; so what was listed and has no record when the records are
//! read is an orphan (something created since cannot be: its record came
//! first), if it is still there then (a removal may have taken it
//! meanwhile). A record seen without its dirs is none while a life-cycle
//! step holds it (a removal takes the dirs first). Each repair reads the
//! store again for its ID first. The image store decides its own orphans
//! under its locks and pins, so a pull in flight is none.
//!
//! What the daemon's start repairs by itself (its recovery), so that an
//! offline check reports it and a restart clears it: pod dirs without a
//! record (`pods::recovery`), records of creations a crash cut short
//! (containers and pods: torn down, never reported here), leases of
//! containers without a record (`containers::recovery`), and unreferenced
//! image content and temp files (`ImageService::open`). Container dirs,
//! mounts, monitors and cgroups without a record, and records whose dirs
//! are gone, are left by a restart; this repairs them.

mod find;
mod node;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use crust_image::{ContentKind, ImageService, OrphanContent};
use crust_store::Store;
use tracing::{info, warn};

pub use find::Layout;
use find::{KnownContainer, KnownPod, OnNode, Records};
pub use node::{NodeView, RealNode};

use crate::cgroups::NodeCgroups;
use crate::config::{CgroupDriver, Config};
use crate::containers::{ContainerRecord, ContainerState};
use crate::daemon::Daemon;
use crate::pods::{PodRecord, PodState};

/// What an orphan is; [`OrphanKind::as_str`] is its `kind` in reports and
/// in the `crust_orphaned_bytes{kind}` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OrphanKind {
    ImageBlobs,
    ImageLayers,
    ImageTemp,
    ContainerDirs,
    PodDirs,
    Mounts,
    Monitors,
    Cgroups,
    ContainerRecords,
    PodRecords,
    Leases,
}

impl OrphanKind {
    pub const ALL: [OrphanKind; 11] = [
        OrphanKind::ImageBlobs,
        OrphanKind::ImageLayers,
        OrphanKind::ImageTemp,
        OrphanKind::ContainerDirs,
        OrphanKind::PodDirs,
        OrphanKind::Mounts,
        OrphanKind::Monitors,
        OrphanKind::Cgroups,
        OrphanKind::ContainerRecords,
        OrphanKind::PodRecords,
        OrphanKind::Leases,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrphanKind::ImageBlobs => "image_blobs",
            OrphanKind::ImageLayers => "image_layers",
            OrphanKind::ImageTemp => "image_temp",
            OrphanKind::ContainerDirs => "container_dirs",
            OrphanKind::PodDirs => "pod_dirs",
            OrphanKind::Mounts => "mounts",
            OrphanKind::Monitors => "monitors",
            OrphanKind::Cgroups => "cgroups",
            OrphanKind::ContainerRecords => "container_records",
            OrphanKind::PodRecords => "pod_records",
            OrphanKind::Leases => "leases",
        }
    }
}

/// How an orphan is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Remove `paths` (refused while anything is mounted below).
    RemoveDirs,
    /// Unmount `paths[0]`.
    Unmount,
    /// Kill the monitor `pid` of the state dir `paths[0]`.
    KillMonitor { pid: i32 },
    /// Kill what runs in the cgroup `paths[0]` and remove it (stopping
    /// `unit` first: a scope or slice of the systemd driver).
    DeleteCgroup { unit: Option<String> },
    /// Remove container `id` as RemoveContainer does (the daemon only).
    RemoveContainer,
    /// Remove pod sandbox `id` as RemovePodSandbox does (the daemon only).
    RemovePod,
    /// Release the image lease `id`.
    ReleaseLease,
    /// Through the image store's GC.
    Content,
}

/// Something the node holds that nothing references.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    pub kind: OrphanKind,
    /// What it belongs to or is: a container or pod ID, a digest, a
    /// lease holder, a temp file's name.
    pub id: String,
    /// Where it is: dirs, a mount point, a monitor's state dir, a cgroup.
    pub paths: Vec<PathBuf>,
    /// Bytes it takes on disk (0 for what takes none: mounts, processes,
    /// cgroups, records).
    pub bytes: u64,
    /// Why it is an orphan, and what more there is to know.
    pub detail: String,
    pub repair: Repair,
    /// After a repair: `Ok` removed, `Err` why not; None: not tried.
    pub outcome: Option<Result<(), String>>,
}

impl Orphan {
    pub fn new(
        kind: OrphanKind,
        id: String,
        paths: Vec<PathBuf>,
        detail: String,
        repair: Repair,
    ) -> Orphan {
        Orphan {
            kind,
            id,
            paths,
            bytes: 0,
            detail,
            repair,
            outcome: None,
        }
    }

    /// Still there: not repaired (or the repair failed).
    pub fn left(&self) -> bool {
        !matches!(self.outcome, Some(Ok(())))
    }
}

/// What a check found (and, with repair, did).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub orphans: Vec<Orphan>,
    pub repair: bool,
    pub root: PathBuf,
    pub run_dir: PathBuf,
}

impl Report {
    /// Orphans left by kind: (kind, count, bytes), every kind listed.
    pub fn left_by_kind(&self) -> Vec<(OrphanKind, u64, u64)> {
        OrphanKind::ALL
            .iter()
            .map(|k| {
                let left = self.orphans.iter().filter(|o| o.kind == *k && o.left());
                left.fold((*k, 0, 0), |(k, n, b), o| (k, n + 1, b + o.bytes))
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A daemon runs on the root or run dir (an offline check must not).
    #[error("{0}")]
    DaemonRunning(String),
    #[error("no crust state under {0} (no meta.db): --root or --config names the daemon's root")]
    NoState(String),
    #[error(transparent)]
    Store(#[from] crust_store::Error),
    #[error("image store: {0}")]
    Image(#[from] crust_image::Error),
    #[error("cgroups: {0}")]
    Cgroups(#[from] crust_cgroups::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

impl From<tokio::task::JoinError> for CheckError {
    fn from(e: tokio::task::JoinError) -> Self {
        CheckError::Internal(format!("check task: {e}"))
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckError {
    let what = what.into();
    move |source| CheckError::Io { what, source }
}

/// What differs between the daemon checking itself and the CLI checking a
/// root no daemon runs on: the image store and the repairs that need the
/// daemon's parts.
#[async_trait::async_trait]
trait Side: Send + Sync {
    /// The image store's orphans (removed if `remove`).
    async fn content(&self, remove: bool) -> Result<Vec<OrphanContent>, CheckError>;
    async fn remove_container(&self, id: &str) -> Result<(), String>;
    async fn remove_pod(&self, id: &str) -> Result<(), String>;
    async fn release_lease(&self, holder: &str) -> Result<(), String>;
    /// Whether a life-cycle step is at work on container (or, with `pod`,
    /// pod sandbox) `id` now.
    fn in_step(&self, id: &str, pod: bool) -> bool;
}

/// Only one check at a time in a process (two repairs would race for the
/// same orphans).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The daemon checks itself (`crust check` while it runs); the gauge
/// `crust_orphaned_bytes` follows what is left.
pub async fn online(daemon: &Daemon, repair: bool) -> Result<Report, CheckError> {
    let _one = ONE_AT_A_TIME.lock().await;
    let cgroups = node_cgroups(&daemon.config)?;
    let node: Arc<dyn NodeView> = Arc::new(RealNode::new(cgroups));
    // The config in force: a reload may have added or moved handlers (their
    // state roots); the dirs and the cgroup driver are the start's.
    let report = run(
        &daemon.live_config(),
        daemon.store.clone(),
        node,
        &Online(daemon),
        repair,
    )
    .await?;
    let by_kind: Vec<(&'static str, u64, u64)> = report
        .left_by_kind()
        .into_iter()
        .map(|(k, n, b)| (k.as_str(), n, b))
        .collect();
    daemon.metrics.orphans(&by_kind);
    Ok(report)
}

/// `crust check` with no daemon running on `config`'s root and run dir:
/// refused while one does (its run dir lock or its metadata store is
/// taken); both stay taken until the check is done.
pub async fn offline(config: &Config, repair: bool) -> Result<Report, CheckError> {
    let _one = ONE_AT_A_TIME.lock().await;
    let meta = config.root.join("meta.db");
    if !meta.is_file() {
        return Err(CheckError::NoState(config.root.display().to_string()));
    }
    let _run_dir = match crate::daemon::hold_run_dir(&config.run_dir) {
        Ok(Ok(lock)) => lock,
        Ok(Err(pid)) => {
            return Err(CheckError::DaemonRunning(format!(
                "a crust daemon (pid {pid}) runs on {}: check through it (crust check \
                 --socket <its socket>)",
                config.run_dir.display()
            )));
        }
        Err(e) => return Err(CheckError::Internal(format!("{e:#}"))),
    };
    let store = Arc::new(Store::open(&meta).map_err(|e| {
        if e.is_in_use() {
            CheckError::DaemonRunning(format!(
                "{e}: a crust daemon runs on {}: check through it (crust check --socket \
                 <its socket>)",
                config.root.display()
            ))
        } else {
            CheckError::Store(e)
        }
    })?);
    let cgroups = node_cgroups(config)?;
    let node: Arc<dyn NodeView> = Arc::new(RealNode::new(cgroups));
    let side = Offline {
        config: config.clone(),
        store: store.clone(),
        images: tokio::sync::OnceCell::new(),
    };
    run(config, store, node, &side, repair).await
}

/// How long after start the daemon first checks itself, and how often
/// after that (report only: the `crust_orphaned_bytes` gauge follows
/// without anyone asking). Cheap: a look at a few dirs, the mount table,
/// `/proc` and the pod cgroups; only orphans are measured.
const PERIODIC_FIRST: std::time::Duration = std::time::Duration::from_secs(300);
const PERIODIC_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Starts the daemon's periodic check (ends with the daemon).
pub fn spawn_periodic(daemon: &Arc<Daemon>) {
    let daemon = Arc::downgrade(daemon);
    tokio::spawn(async move {
        tokio::time::sleep(PERIODIC_FIRST).await;
        loop {
            let Some(d) = daemon.upgrade() else { return };
            if let Err(e) = online(&d, false).await {
                warn!("periodic crust check: {e}");
            }
            drop(d);
            tokio::time::sleep(PERIODIC_EVERY).await;
        }
    });
}

fn node_cgroups(config: &Config) -> Result<Arc<NodeCgroups>, CheckError> {
    Ok(Arc::new(NodeCgroups::detect(
        config.cgroup_driver == CgroupDriver::Systemd,
    )?))
}

/// The dirs of `config`'s daemon, and the runtime state roots: in the run
/// dir, configured elsewhere, or named by the records of `containers`
/// (a handler a reload removed or moved still has its containers' state).
fn layout(config: &Config, node: &dyn NodeView, containers: &[ContainerRecord]) -> Layout {
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

/// The check: the node first, then the records, then the comparison,
/// sizes and, if asked, the repairs.
async fn run(
    config: &Config,
    store: Arc<Store>,
    node: Arc<dyn NodeView>,
    side: &dyn Side,
    repair: bool,
) -> Result<Report, CheckError> {
    let (layout, on_node) = {
        let (config, store, node) = (config.clone(), store.clone(), node.clone());
        crate::tasks::blocking(move || list_node(&config, &store, &*node)).await?
    };
    let content = side.content(false).await?;
    let orphans = {
        let (layout, store, node) = (layout.clone(), store.clone(), node.clone());
        crate::tasks::blocking(move || {
            let records = read_records(&store, &*node)?;
            let mut orphans = find::orphans(&layout, &records, &on_node);
            cgroups_of_orphans(&layout, &records, &on_node, &*node, &mut orphans);
            still_there(&mut orphans, &store, &*node)?;
            for o in &mut orphans {
                match o.kind {
                    OrphanKind::ContainerDirs | OrphanKind::PodDirs => {
                        o.bytes = o.paths.iter().map(|p| node.disk_bytes(p)).sum();
                    }
                    OrphanKind::Cgroups => {
                        let n = node.cgroup_processes(&o.paths[0].to_string_lossy());
                        let s = if n == 1 { "" } else { "es" };
                        o.detail = format!("{}; {n} process{s}", o.detail);
                    }
                    _ => {}
                }
            }
            Ok::<_, CheckError>(orphans)
        })
        .await?
    };
    // A record seen without its dirs may be one a removal is at work on
    // (it takes the dirs first, the record last, all in one step): not an
    // orphan while the step runs, nor once the record is gone.
    let mut kept = Vec::with_capacity(orphans.len());
    for o in orphans {
        let pod = match o.kind {
            OrphanKind::ContainerRecords => false,
            OrphanKind::PodRecords => true,
            _ => {
                kept.push(o);
                continue;
            }
        };
        let recorded = if pod {
            store.get::<PodRecord>(&o.id)?.is_some()
        } else {
            store.get::<ContainerRecord>(&o.id)?.is_some()
        };
        if recorded && !side.in_step(&o.id, pod) {
            kept.push(o);
        }
    }
    let mut orphans = kept;
    orphans.extend(content.into_iter().map(content_orphan));
    orphans.sort_by(|a, b| (a.kind, &a.id, &a.paths).cmp(&(b.kind, &b.id, &b.paths)));
    let mut report = Report {
        orphans,
        repair,
        root: config.root.clone(),
        run_dir: config.run_dir.clone(),
    };
    if repair {
        repair_all(&mut report.orphans, &store, &node, side).await;
    }
    let left: u64 = report.orphans.iter().filter(|o| o.left()).count() as u64;
    info!(
        found = report.orphans.len(),
        left, repair, "crust check: orphans of the node"
    );
    Ok(report)
}

/// What the node holds, listed before the records are read (see the
/// module docs); the pod cgroups listed are those of the pod records of a
/// first read.
fn list_node(
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
fn still_there(
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
fn read_records(store: &Store, node: &dyn NodeView) -> Result<Records, CheckError> {
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
fn cgroups_of_orphans(
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

fn content_orphan(c: OrphanContent) -> Orphan {
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

/// The order repairs go in: processes first (a killed container's monitor
/// exits by itself), then mounts (deepest first), dirs, records, leases,
/// and the image store last (leases released may free layers).
fn repair_rank(o: &Orphan) -> (u8, std::cmp::Reverse<usize>) {
    let rank = match o.repair {
        Repair::DeleteCgroup { .. } => 0,
        Repair::KillMonitor { .. } => 1,
        Repair::Unmount => 2,
        Repair::RemoveDirs => 3,
        Repair::RemoveContainer => 4,
        Repair::RemovePod => 5,
        Repair::ReleaseLease => 6,
        Repair::Content => 7,
    };
    let depth = o.paths.first().map_or(0, |p| p.components().count());
    (rank, std::cmp::Reverse(depth))
}

async fn repair_all(
    orphans: &mut [Orphan],
    store: &Arc<Store>,
    node: &Arc<dyn NodeView>,
    side: &dyn Side,
) {
    let mut order: Vec<usize> = (0..orphans.len()).collect();
    order.sort_by_key(|&i| repair_rank(&orphans[i]));
    let mut content_done = false;
    for i in order {
        let o = orphans[i].clone();
        let outcome = match &o.repair {
            Repair::Content => {
                if !content_done {
                    content_done = true;
                    if let Err(e) = side.content(true).await {
                        warn!("crust check: collecting image store orphans: {e}");
                    }
                }
                match o.paths.first() {
                    Some(p) if node.exists(p) => Err("still there".to_string()),
                    _ => Ok(()),
                }
            }
            Repair::RemoveContainer => side.remove_container(&o.id).await,
            Repair::RemovePod => side.remove_pod(&o.id).await,
            Repair::ReleaseLease => side.release_lease(&o.id).await,
            _ => {
                let (store, node) = (store.clone(), node.clone());
                tokio::task::spawn_blocking(move || repair_on_node(&o, &store, &*node))
                    .await
                    .unwrap_or_else(|e| Err(format!("repair task: {e}")))
            }
        };
        if let Err(why) = &outcome {
            warn!(kind = orphans[i].kind.as_str(), id = %orphans[i].id, "crust check: cannot repair: {why}");
        }
        orphans[i].outcome = Some(outcome);
    }
}

/// Repairs one orphan of the node (not the records' or the image
/// store's), after making sure that its ID still has no record.
fn repair_on_node(o: &Orphan, store: &Store, node: &dyn NodeView) -> Result<(), String> {
    let recorded = store
        .get::<ContainerRecord>(&o.id)
        .map_err(|e| e.to_string())?
        .is_some()
        || store
            .get::<PodRecord>(&o.id)
            .map_err(|e| e.to_string())?
            .is_some();
    if recorded {
        return Err("it has a record now: left alone".to_string());
    }
    let first = || o.paths.first().ok_or_else(|| "no path".to_string());
    match &o.repair {
        Repair::RemoveDirs => o.paths.iter().try_for_each(|p| node.remove_tree(p)),
        Repair::Unmount => node.unmount(first()?),
        Repair::KillMonitor { pid } => node.kill_monitor(*pid, first()?),
        Repair::DeleteCgroup { unit } => {
            node.delete_cgroup(&first()?.to_string_lossy(), unit.as_deref())
        }
        other => Err(format!("{other:?} is not a repair of the node")),
    }
}

/// The running daemon's side.
struct Online<'a>(&'a Daemon);

#[async_trait::async_trait]
impl Side for Online<'_> {
    async fn content(&self, remove: bool) -> Result<Vec<OrphanContent>, CheckError> {
        Ok(self.0.images.orphans(remove).await?)
    }

    async fn remove_container(&self, id: &str) -> Result<(), String> {
        self.0
            .lifecycle
            .remove_container(id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn remove_pod(&self, id: &str) -> Result<(), String> {
        self.0
            .lifecycle
            .remove_pod(id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn release_lease(&self, holder: &str) -> Result<(), String> {
        // Its container may have come since (a lease is taken after the
        // container's record is written).
        let container = holder.split('/').next().unwrap_or(holder);
        if self.0.containers.get(container).is_ok() {
            return Err("its container has a record now: left alone".to_string());
        }
        self.0
            .images
            .release(holder)
            .await
            .map_err(|e| e.to_string())
    }

    fn in_step(&self, id: &str, pod: bool) -> bool {
        if pod {
            self.0.pods.in_step(id)
        } else {
            self.0.containers.in_step(id)
        }
    }
}

/// The CLI's side, with no daemon running: the image store is opened only
/// to repair (opening it collects what nothing references, as the
/// daemon's start does).
struct Offline {
    config: Config,
    store: Arc<Store>,
    images: tokio::sync::OnceCell<ImageService>,
}

impl Offline {
    async fn images(&self) -> Result<&ImageService, CheckError> {
        self.images
            .get_or_try_init(|| async {
                let mut c = crust_image::Config::new(&self.config.root);
                c.registry_config_dir = Some(self.config.registry.config_dir.clone());
                Ok::<_, CheckError>(ImageService::open(c, self.store.clone()).await?)
            })
            .await
    }
}

const RECORDS_NEED_THE_DAEMON: &str = "records are repaired by the daemon (RemoveContainer and RemovePodSandbox \
     undo what they describe): start it and run `crust check --repair`";

#[async_trait::async_trait]
impl Side for Offline {
    async fn content(&self, remove: bool) -> Result<Vec<OrphanContent>, CheckError> {
        if remove {
            return Ok(self.images().await?.orphans(true).await?);
        }
        let (root, store) = (self.config.root.clone(), self.store.clone());
        Ok(crate::tasks::blocking(move || {
            crust_image::orphans::scan_offline(&root, &store).map_err(CheckError::from)
        })
        .await?)
    }

    async fn remove_container(&self, _id: &str) -> Result<(), String> {
        Err(RECORDS_NEED_THE_DAEMON.to_string())
    }

    async fn remove_pod(&self, _id: &str) -> Result<(), String> {
        Err(RECORDS_NEED_THE_DAEMON.to_string())
    }

    async fn release_lease(&self, holder: &str) -> Result<(), String> {
        let images = self.images().await.map_err(|e| e.to_string())?;
        images.release(holder).await.map_err(|e| e.to_string())
    }

    /// No daemon, no steps.
    fn in_step(&self, _id: &str, _pod: bool) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
