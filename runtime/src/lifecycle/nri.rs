//! NRI in the life cycle: what the NRI adaptation (`crust_nri::Nri`) needs
//! of the daemon ([`NriBackend`]: the pods and containers for a new
//! plugin's synchronization, resource updates and evictions plugins ask
//! for), the CreateContainer hook ([`NriCreate`]) and the watcher that
//! tells plugins of containers that exit on their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crust_api::v1::LinuxContainerResources;
use crust_nri::api::{self, ContainerEviction, ContainerUpdate};
use crust_nri::{BoxFuture, Nri, NriError, RuntimeBackend, Snapshot, SnapshotPod, SyncBlock};
use tokio::sync::broadcast::error::RecvError;
use tracing::{debug, warn};

use super::nri_types::{self, cri_with_update};
use crate::containers::{ContainerError, ContainerRecord, Containers, SpecHook};
use crate::events::EventKind;
use crate::pods::{ListFilter, PodError, PodRecord, Pods};
use crate::tasks::blocking;

/// The daemon as NRI sees it. Weak: NRI lives in the life cycle, which
/// must not keep the pods and containers (and their store) alive.
pub struct NriBackend {
    pods: Weak<Pods>,
    containers: Weak<Containers>,
}

impl NriBackend {
    pub fn new(pods: &Arc<Pods>, containers: &Arc<Containers>) -> NriBackend {
        NriBackend {
            pods: Arc::downgrade(pods),
            containers: Arc::downgrade(containers),
        }
    }
}

impl RuntimeBackend for NriBackend {
    fn snapshot(&self) -> BoxFuture<'_, Snapshot> {
        let (pods, containers) = (self.pods.upgrade(), self.containers.upgrade());
        Box::pin(async move {
            let (Some(pods), Some(containers)) = (pods, containers) else {
                return Snapshot::default();
            };
            // Reading every container's spec is file I/O.
            blocking(move || {
                let pods: Vec<SnapshotPod> = pods
                    .list(&ListFilter::default())
                    .iter()
                    .map(|p| SnapshotPod {
                        pod: nri_types::pod_sandbox(p),
                        ready: nri_types::pod_ready(p),
                    })
                    .collect();
                let containers = containers
                    .list()
                    .iter()
                    .map(|c| nri_types::container(c, &containers.runtime_spec(c)))
                    .collect();
                Ok::<_, ContainerError>(Snapshot { pods, containers })
            })
            .await
            .unwrap_or_default()
        })
    }

    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Vec<ContainerUpdate>> {
        let containers = self.containers.upgrade();
        Box::pin(async move {
            let Some(containers) = containers else {
                return updates;
            };
            let mut failed = Vec::new();
            for u in updates {
                if let Err(e) = apply_update(&containers, &u).await {
                    warn!(container = %u.container_id, "NRI container update failed: {e}");
                    if !u.ignore_failure {
                        failed.push(u);
                    }
                }
            }
            failed
        })
    }

    fn evict_containers(
        &self,
        evictions: Vec<ContainerEviction>,
    ) -> BoxFuture<'_, Vec<ContainerEviction>> {
        let containers = self.containers.upgrade();
        Box::pin(async move {
            let Some(containers) = containers else {
                return evictions;
            };
            let mut failed = Vec::new();
            for e in evictions {
                // Plugins hear of the stop from the exit watcher.
                match containers.stop(&e.container_id, 0).await {
                    Ok(()) => {
                        tracing::info!(container = %e.container_id, reason = %e.reason, "container evicted by an NRI plugin")
                    }
                    Err(err) => {
                        warn!(container = %e.container_id, "NRI eviction failed: {err}");
                        failed.push(e);
                    }
                }
            }
            failed
        })
    }
}

/// One plugin-requested resource update, through the daemon's one update
/// path (the one UpdateContainerResources takes).
pub async fn apply_update(containers: &Containers, u: &ContainerUpdate) -> Result<(), String> {
    let rec = containers.get(&u.container_id).map_err(|e| e.to_string())?;
    let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
        return Ok(());
    };
    let merged = cri_with_update(rec.resources().unwrap_or_default(), res)?;
    containers
        .update(&rec.id, Some(merged))
        .await
        .map_err(|e| e.to_string())
}

/// Applies updates plugins asked for while handling an event, logging
/// the ones that failed (the event itself succeeded).
pub async fn apply_updates(containers: &Containers, updates: Vec<ContainerUpdate>, event: &str) {
    for u in updates {
        if let Err(e) = apply_update(containers, &u).await {
            warn!(container = %u.container_id, "update asked for by NRI plugins at {event} failed: {e}");
        }
    }
}

/// Stops the containers plugins asked to evict while handling an event.
pub async fn evict(containers: &Containers, evictions: Vec<ContainerEviction>) {
    for e in evictions {
        if let Err(err) = containers.stop(&e.container_id, 0).await {
            warn!(container = %e.container_id, "NRI eviction failed: {err}");
        }
    }
}

/// A failed NRI hook as the error of the CRI call it fails.
pub fn container_error(e: NriError) -> ContainerError {
    ContainerError::Internal(e.to_string())
}

pub fn pod_error(e: NriError) -> PodError {
    PodError::Internal(e.to_string())
}

/// A container as plugins see it: its record and its kept spec (file I/O;
/// only called when some plugin is registered).
pub fn container_of(containers: &Containers, rec: &ContainerRecord) -> api::Container {
    nri_types::container(rec, &containers.runtime_spec(rec))
}

/// CreateContainer's NRI step, run by the containers module between the
/// spec's generation and the container's creation: takes the [`SyncBlock`]
/// (held until the container is visible, that is until this is dropped),
/// asks the plugins, applies their adjustment to the spec.
pub struct NriCreate<'a> {
    pub nri: &'a Nri,
    pub pod: &'a PodRecord,
    state: Mutex<CreateState>,
}

#[derive(Default)]
struct CreateState {
    block: Option<SyncBlock>,
    /// What plugins were shown (set once they were asked).
    sent: Option<(api::PodSandbox, api::Container)>,
    updates: Vec<ContainerUpdate>,
    evictions: Vec<ContainerEviction>,
}

impl<'a> NriCreate<'a> {
    pub fn new(nri: &'a Nri, pod: &'a PodRecord) -> NriCreate<'a> {
        NriCreate {
            nri,
            pod,
            state: Mutex::new(CreateState::default()),
        }
    }

    /// Lets plugins synchronize again (the container is visible now).
    pub fn release(&self) {
        self.state.lock().unwrap().block = None;
    }

    /// What plugins were shown, if they were asked at all.
    pub fn sent(&self) -> Option<(api::PodSandbox, api::Container)> {
        self.state.lock().unwrap().sent.clone()
    }

    /// Updates of other containers and evictions plugins asked for.
    pub fn take_requests(&self) -> (Vec<ContainerUpdate>, Vec<ContainerEviction>) {
        let mut s = self.state.lock().unwrap();
        (
            std::mem::take(&mut s.updates),
            std::mem::take(&mut s.evictions),
        )
    }
}

#[async_trait::async_trait]
impl SpecHook for NriCreate<'_> {
    async fn adjust(
        &self,
        rec: &ContainerRecord,
        spec: &mut crust_oci::Spec,
    ) -> Result<Option<LinuxContainerResources>, ContainerError> {
        let block = self.nri.block_plugin_sync().await;
        self.state.lock().unwrap().block = Some(block);
        if !self.nri.has_plugins() {
            return Ok(None);
        }
        let json = serde_json::to_value(&*spec).map_err(ContainerError::internal)?;
        let pod = nri_types::pod_sandbox(self.pod);
        let container = nri_types::container(rec, &json);
        self.state.lock().unwrap().sent = Some((pod.clone(), container.clone()));
        let result = self
            .nri
            .create_container(|| (pod, container))
            .await
            .map_err(container_error)?;
        {
            let mut s = self.state.lock().unwrap();
            s.updates = result.updates;
            s.evictions = result.evictions;
        }
        let Some(adjust) = result.adjust else {
            return Ok(None);
        };
        crust_nri::apply_adjustment(spec, &adjust, crust_nri::ApplyOptions::default())
            .map_err(|e| ContainerError::Internal(e.to_string()))?;
        let json = serde_json::to_value(&*spec).map_err(ContainerError::internal)?;
        Ok(Some(nri_types::cri_from_oci(&json)))
    }
}

/// Tells plugins of containers that exit on their own (StopContainer; a
/// stop through the CRI reaches them once, from whichever path is first).
/// Ends when the containers are gone.
pub fn watch_exits(nri: Nri, pods: &Arc<Pods>, containers: &Arc<Containers>) {
    if !nri.is_enabled() {
        return;
    }
    let mut events = containers.events().subscribe();
    let (pods, containers) = (Arc::downgrade(pods), Arc::downgrade(containers));
    tokio::spawn(async move {
        loop {
            let ids = match events.recv().await {
                Ok(e) if e.kind == EventKind::Stopped => vec![e.container_id],
                Ok(_) => continue,
                // Missed some: every exited container (told once anyway).
                Err(RecvError::Lagged(_)) => match containers.upgrade() {
                    Some(cs) => cs
                        .list()
                        .iter()
                        .filter(|c| !c.state.is_live())
                        .map(|c| c.id.clone())
                        .collect(),
                    None => return,
                },
                Err(RecvError::Closed) => return,
            };
            let _block = nri.block_plugin_sync().await;
            if !nri.has_plugins() {
                continue;
            }
            let (Some(ps), Some(cs)) = (pods.upgrade(), containers.upgrade()) else {
                return;
            };
            let shown: HashMap<String, (api::PodSandbox, api::Container)> = {
                let cs = cs.clone();
                blocking(move || {
                    Ok::<_, ContainerError>(
                        ids.iter()
                            .filter_map(|id| {
                                let rec = cs.get(id).ok()?;
                                let pod = ps.get(&rec.pod_id).ok()?;
                                Some((
                                    rec.id.clone(),
                                    (nri_types::pod_sandbox(&pod), container_of(&cs, &rec)),
                                ))
                            })
                            .collect(),
                    )
                })
                .await
                .unwrap_or_default()
            };
            for (id, (pod, c)) in shown {
                debug!(container = %id, "telling NRI plugins the container exited");
                nri.notify_container_exit(|| (pod, c)).await;
            }
        }
    });
}
