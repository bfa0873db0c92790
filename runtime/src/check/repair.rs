//! Repairs: in an order that lets each go through (processes, mounts,
//! dirs, records, leases, the image store), each only after its ID is seen
//! to still have no record.

use std::sync::Arc;

use crust_store::Store;
use tracing::warn;

use super::side::Side;
use super::{NodeView, Orphan, Repair};
use crate::containers::ContainerRecord;
use crate::pods::PodRecord;

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

pub(super) async fn repair_all(
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
