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

mod collect;
mod find;
mod node;
mod repair;
mod report;
mod side;

use std::sync::Arc;

use crust_store::Store;
use tracing::{info, warn};

use collect::{cgroups_of_orphans, content_orphan, list_node, read_records, still_there};
pub use node::{NodeView, RealNode};
use repair::repair_all;
use report::io_err;
pub use report::{CheckError, Orphan, OrphanKind, Repair, Report};
use side::{Offline, Online, Side};

use crate::cgroups::NodeCgroups;
use crate::config::{CgroupDriver, Config};
use crate::containers::ContainerRecord;
use crate::daemon::Daemon;
use crate::pods::PodRecord;

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

#[cfg(test)]
mod tests;
