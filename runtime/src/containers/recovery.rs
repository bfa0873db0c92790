//! How the daemon learns that containers exited, now and across its own
//! restarts: the monitors' exit files ([`Containers::refresh`]), one exit
//! watcher per live container, and the recovery of the index at start.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crust_shim_protocol::Status;
use tracing::{debug, info, warn};

use super::record::{ContainerRecord, ContainerState};
use super::{ContainerError, Containers};
use crate::clock::now_ns;
use crate::events::EventKind;
use crate::index::Entry;
use crate::tasks::blocking;

impl Containers {
    /// [`Containers::refresh`] for readers that hold no life-cycle step
    /// (status, the exit watcher): while a step (start, stop, update,
    /// remove) holds the container, that step reads the exit itself, so a
    /// container's changes, and their events, come in the order of its
    /// steps (no STOPPED before the STARTED of a container that exits at
    /// once).
    pub(super) fn refresh_passive(&self, entry: &Arc<Entry<ContainerRecord>>) -> ContainerRecord {
        match entry.try_lock() {
            Some(_op) => self.refresh(entry),
            None => entry.snapshot(),
        }
    }

    /// Reads the exit file of a created or running container; persists and
    /// reports the change once. Callers hold the container's life-cycle
    /// lock (see [`Containers::refresh_passive`]).
    pub(super) fn refresh(&self, entry: &Entry<ContainerRecord>) -> ContainerRecord {
        let mut rec = entry.snapshot();
        if !rec.state.is_live() {
            return rec;
        }
        let changed = match self.host.exit_file(&rec.state_dir) {
            Some(e) => {
                rec.set_exit(&e);
                true
            }
            // No exit file and no monitor: it died (SIGKILLed) without
            // recording the exit. Nothing watches the container now, so
            // end it (as containerd does when a shim dies) rather than
            // report a running container as exited.
            None if !self.host.monitor_running(&rec.state_dir) => {
                self.host.kill_orphan(&rec);
                rec.state = ContainerState::Exited;
                rec.finished_at = now_ns();
                rec.exit_code = 255;
                rec.reason = "Error".into();
                rec.message = "the container's monitor is gone; exit status unknown".into();
                true
            }
            None => false,
        };
        if changed {
            if let Err(e) = self.store.put(&rec) {
                warn!(id = %rec.id, "cannot store the container's exit: {e}");
            }
            entry.set(rec.clone());
            self.emit(EventKind::Stopped, &rec);
        }
        rec
    }

    /// Recovery at start: rebuilds the index from the store; half-created
    /// containers are torn down, the others' exits read. Running
    /// containers are not touched. Then releases the image leases of
    /// containers that are gone (see [`Containers::release_orphan_leases`])
    /// and starts a watcher for every live container.
    pub async fn recover(self: &Arc<Self>) -> Result<(), ContainerError> {
        let store = self.store.clone();
        let records: Vec<ContainerRecord> =
            blocking(move || Ok::<_, ContainerError>(store.list()?)).await?;
        let mut release = Vec::new();
        for rec in records {
            if rec.state == ContainerState::Creating {
                info!(id = %rec.id, "removing a container whose creation was interrupted");
                if let Err(e) = self.teardown(&rec).await {
                    warn!(id = %rec.id, "cannot clean up a half-created container: {e}");
                    continue;
                }
                self.store_delete(&rec.id).await?;
                release.push(rec.id);
                continue;
            }
            let entry = self.index.publish(&rec.id.clone(), rec.name_key(), rec);
            let mut rec = self.refresh_passive(&entry);
            if rec.state == ContainerState::Created
                && self.host.monitor_status(&rec.state_dir).await == Some(Status::Running)
            {
                // StartContainer reached the monitor, the record did not
                // learn of it (the daemon died in between).
                info!(id = %rec.id, "the container was started before the restart: it runs");
                rec.state = ContainerState::Running;
                // The monitor knows when; records of older daemons may
                // have when the start was asked for.
                rec.started_at = match self.host.monitor_started_at(&rec.state_dir).await {
                    Some(t) => t,
                    None if rec.start_requested_at > 0 => rec.start_requested_at,
                    None => now_ns(),
                };
                self.store_put(&rec).await?;
                entry.set(rec.clone());
                self.emit(EventKind::Started, &rec);
            }
            debug!(id = %rec.id, state = ?rec.state, "container recovered");
        }
        self.release_orphan_leases(release).await;
        for rec in self.list() {
            if rec.state.is_live() {
                self.watch(rec.id.clone());
            }
        }
        Ok(())
    }

    /// Releases the image leases of `removed` and of every container the
    /// index does not know (a crash between lease and record removal).
    async fn release_orphan_leases(&self, removed: Vec<String>) {
        let known: HashSet<String> = self.index.ids();
        let mut ids = removed;
        if let Ok(holders) = self.images.leaseholders() {
            ids.extend(holders.into_iter().filter(|id| !known.contains(id)));
        }
        for id in ids {
            if let Err(e) = self.images.release(&id).await {
                warn!(
                    id,
                    "cannot release the image lease of a removed container: {e}"
                );
            }
        }
    }

    /// Starts a task that notices the exit of a created or running
    /// container (STOPPED event, record) without anyone asking: it waits
    /// on the monitor, which answers the moment it has reaped the
    /// container's init, so an exit is seen within milliseconds, an idle
    /// container costs no wake-ups, and listing needs no look at any
    /// monitor. One task and one socket per container, from create until
    /// the exit.
    pub(super) fn watch(self: &Arc<Self>, id: String) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let (state_dir, host) = {
                    let Some(cs) = weak.upgrade() else { return };
                    let Ok(Some(entry)) = cs.resolve(&id) else {
                        return;
                    };
                    let rec = entry.view();
                    if rec.id != id {
                        return;
                    }
                    (rec.state_dir.clone(), cs.host.clone())
                };
                // No reference to the containers is held while waiting.
                let waited = host.wait(&state_dir).await;
                let Some(cs) = weak.upgrade() else { return };
                let Ok(Some(entry)) = cs.resolve(&id) else {
                    return;
                };
                if !cs.refresh_passive(&entry).state.is_live() {
                    return;
                }
                drop(cs);
                match waited {
                    // The monitor is alive but the wait broke (e.g. the
                    // daemon ran out of descriptors): try again shortly.
                    Err(e) => {
                        debug!(%id, "waiting for the container's exit: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    // Exited, but no exit recorded yet: look again soon
                    // rather than spin.
                    Ok(()) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
    }
}
