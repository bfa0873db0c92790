//! Reconciling the store with the node at daemon start: half-created pods
//! are undone, ready pods whose namespaces did not survive (a reboot)
//! become NOTREADY, and pod dirs no record owns are removed.

use std::collections::HashSet;

use tracing::{error, info, warn};

use super::record::{PodRecord, PodState};
use super::{PodError, Pods};
use crate::ids::is_id;
use crate::tasks::blocking;
use crust_network::DelAttempt;

impl Pods {
    /// Rebuilds the index from the store and reconciles the node.
    pub async fn recover(&self) -> Result<(), PodError> {
        let store = self.store.clone();
        let records: Vec<PodRecord> = blocking(move || {
            store
                .list()
                .map_err(|e| PodError::from(e).context("loading pod records"))
        })
        .await?;
        let (mut ready, mut not_ready, mut undone) = (0, 0, 0);
        for mut rec in records {
            match rec.state {
                PodState::Creating => {
                    // RunPodSandbox did not finish: undo it. Whether a DEL
                    // (the ADD's cleanup, the undo's) was cut short
                    // already cannot be told.
                    match self.teardown(&rec, DelAttempt::Repeat).await {
                        Ok(()) => {
                            self.store_delete(&rec.id).await?;
                            undone += 1;
                            info!(id = %rec.id, "undid a pod sandbox whose creation was interrupted");
                            continue;
                        }
                        Err(e) => {
                            error!(
                                id = %rec.id,
                                "cannot undo an interrupted pod sandbox creation, leaving it \
                                 NOTREADY for RemovePodSandbox: {e}"
                            );
                            rec.state = PodState::NotReady;
                            self.store_put(&rec).await?;
                        }
                    }
                }
                PodState::Ready if !self.pins_intact(&rec) => {
                    // The namespaces are gone: the node rebooted (or someone
                    // unmounted them). Stop/Remove still run CNI DEL, which
                    // releases the pod's IP.
                    warn!(id = %rec.id, "pod sandbox namespaces are gone, marking it NOTREADY");
                    rec.state = PodState::NotReady;
                    self.store_put(&rec).await?;
                }
                _ => {}
            }
            match rec.state {
                PodState::Ready => ready += 1,
                _ => not_ready += 1,
            }
            self.publish(rec);
        }
        self.sweep_orphans().await;
        info!(ready, not_ready, undone, "pod sandboxes recovered");
        Ok(())
    }

    /// Whether every namespace the pod owns is still pinned.
    pub(super) fn pins_intact(&self, rec: &PodRecord) -> bool {
        [
            &rec.namespaces.net,
            &rec.namespaces.ipc,
            &rec.namespaces.uts,
        ]
        .into_iter()
        .flatten()
        .all(|p| self.host.is_pinned(p))
    }

    /// Removes pod dirs no record owns (left by a crash between removing
    /// the host effects and the record, or by hand).
    async fn sweep_orphans(&self) {
        let known: HashSet<String> = self.index.ids();
        let host = self.host.clone();
        let [run_root, state_root] = self.roots().map(|p| p.to_path_buf());
        let swept = blocking(move || {
            for name in host.list_dir(&run_root) {
                if known.contains(&name) || !is_id(&name) {
                    continue;
                }
                let dir = run_root.join(&name);
                let res = host
                    .unpin_namespaces(&dir.join("ns"))
                    .and_then(|()| host.unmount_shm(&dir.join("shm")))
                    .and_then(|()| host.remove_empty_dir(&dir));
                log_sweep(&dir, res);
            }
            for name in host.list_dir(&state_root) {
                if known.contains(&name) || !is_id(&name) {
                    continue;
                }
                let dir = state_root.join(&name);
                log_sweep(&dir, host.remove_tree(&dir));
            }
            Ok::<_, PodError>(())
        })
        .await;
        if let Err(e) = swept {
            warn!("cannot sweep orphaned pod dirs: {e}");
        }
    }

    async fn store_delete(&self, id: &str) -> Result<(), PodError> {
        let (store, id) = (self.store.clone(), id.to_string());
        blocking(move || {
            store
                .delete::<PodRecord>(&id)
                .map(drop)
                .map_err(PodError::from)
        })
        .await
    }
}

fn log_sweep(dir: &std::path::Path, res: Result<(), PodError>) {
    match res {
        Ok(()) => info!(dir = %dir.display(), "removed an orphaned pod dir"),
        Err(e) => warn!(dir = %dir.display(), "cannot remove an orphaned pod dir: {e}"),
    }
}
