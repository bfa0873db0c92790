//! Pod sandboxes: pinned namespaces, the pod cgroup, /dev/shm, the
//! hostname/hosts/resolv.conf files and the CNI attachment, with their life
//! cycle (run, stop, remove), status and recovery after a daemon restart.
//! This module knows nothing of containers: `crate::lifecycle` stops and
//! removes a pod's containers before it stops or removes the pod, and hands
//! containers what they need of a pod ([`Pods::container_facts`]).
//!
//! A pod is a record in the store plus effects on the host ([`PodHost`]).
//! The record is written, in state `creating`, before any effect, and names
//! every path and the network config the effects will use; every teardown
//! step is idempotent, so a failed or crashed RunPodSandbox is undone from
//! the record alone (at once, or at the next daemon start), and Stop/Remove
//! can be retried until they succeed.
//!
//! Layout: `<run_dir>/pods/<id>/{ns/{net,ipc,uts},shm,pause}` (volatile:
//! lost on reboot, like the namespaces themselves) and
//! `<root>/pods/<id>/{hostname,hosts,resolv.conf}`. CNI's own cache (for DEL
//! after a crash) is `<root>/cni/cache`.
//!
//! - `lifecycle`: run, stop, remove (and the undo of a failed run);
//! - `recovery`: reconciling the store with the node at start;
//! - `host`: the node effects ([`PodHost`], [`RealPodHost`]);
//! - `pause`: the pause process of a pod with a shared PID namespace;
//! - `root_access`: whether a pod's user namespace can reach `--root`;
//! - `spec`: the RunPodSandbox request, checked; `record`: what is stored;
//!   `files`: the pod's /etc files; `info`: verbose status.

mod error;
mod files;
pub mod host;
mod info;
mod lifecycle;
mod pause;
mod record;
mod recovery;
pub mod root_access;
mod spec;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crust_store::Store;

use crate::index::{Entry, Index, Op};

pub use error::PodError;
pub use host::{PodHost, RealPodHost};
pub use record::{PodMetadata, PodRecord, PodState};
pub use spec::PodSpec;

/// (name, namespace, uid, attempt): unique among pods, as in containerd.
type NameKey = (String, String, String, u32);

fn name_key(md: &PodMetadata) -> NameKey {
    (
        md.name.clone(),
        md.namespace.clone(),
        md.uid.clone(),
        md.attempt,
    )
}

/// The pod sandboxes of this daemon.
pub struct Pods {
    /// `<run_dir>/pods`
    run_root: PathBuf,
    /// `<root>/pods`
    state_root: PathBuf,
    /// The systemd cgroup driver is in use (cgroup parents are slices).
    systemd: bool,
    store: Arc<Store>,
    host: Arc<dyn PodHost>,
    /// Pods clients can see (ready or not ready), and the reserved names,
    /// including those of pods still being created.
    index: Index<PodRecord, NameKey>,
}

/// The exclusive right to stop or remove one pod (see [`Pods::begin`]).
pub type PodOp = Op<PodRecord>;

/// ListPodSandbox's filter.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// A full ID or a unique prefix of one (as crictl sends).
    pub id: String,
    pub state: Option<PodState>,
    /// Every one must match.
    pub labels: BTreeMap<String, String>,
}

impl Pods {
    /// Pods with dirs under `run_root` and `state_root` (both exist) and
    /// their effects through `host`. Call [`Pods::recover`] before use.
    pub fn new(
        run_root: PathBuf,
        state_root: PathBuf,
        systemd: bool,
        store: Arc<Store>,
        host: Arc<dyn PodHost>,
    ) -> Pods {
        Pods {
            run_root,
            state_root,
            systemd,
            store,
            host,
            index: Index::default(),
        }
    }

    /// The pod with this ID or unique ID prefix; None if there is none.
    pub fn resolve(&self, id: &str) -> Result<Option<Arc<Entry<PodRecord>>>, PodError> {
        if id.is_empty() {
            return Err(PodError::invalid("pod_sandbox_id", "required"));
        }
        self.index.resolve(id).map_err(|_| {
            PodError::invalid(
                "pod_sandbox_id",
                format!("{id:?} is a prefix of more than one pod sandbox ID"),
            )
        })
    }

    /// A pod's record, by ID or unique ID prefix (NotFound if none).
    pub fn get(&self, id: &str) -> Result<PodRecord, PodError> {
        self.resolve(id)?
            .map(|e| e.snapshot())
            .ok_or_else(|| PodError::NotFound(format!("pod sandbox {id:?} not found")))
    }

    pub fn list(&self, filter: &ListFilter) -> Vec<PodRecord> {
        let entries: Vec<Arc<Entry<PodRecord>>> = if filter.id.is_empty() {
            self.index.entries()
        } else {
            // As containerd: a unique prefix selects its pod, an ambiguous
            // or unknown one selects nothing.
            self.resolve(&filter.id)
                .ok()
                .flatten()
                .into_iter()
                .collect()
        };
        let mut pods: Vec<PodRecord> = entries
            .iter()
            .map(|e| e.snapshot())
            .filter(|r| filter.state.is_none_or(|s| r.state == s))
            .filter(|r| {
                filter
                    .labels
                    .iter()
                    .all(|(k, v)| r.labels.get(k) == Some(v))
            })
            .collect();
        pods.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        pods
    }

    /// Waits for the exclusive right to stop or remove the pod `id`. None
    /// if there is no such pod (any more): Stop and Remove of an unknown
    /// pod succeed.
    pub async fn begin(&self, id: &str) -> Result<Option<PodOp>, PodError> {
        let Some(entry) = self.resolve(id)? else {
            return Ok(None);
        };
        let op = entry.lock().await;
        Ok((!op.is_removed()).then_some(op))
    }

    /// Whether a step (stop, remove) is at work on the pod `id` now.
    pub fn in_step(&self, id: &str) -> bool {
        matches!(self.index.resolve(id), Ok(Some(e)) if e.is_busy())
    }

    /// What the pod's own processes (the pause process) and its
    /// containers share: its namespaces and its cgroup parent.
    pub fn oci_facts(&self, rec: &PodRecord) -> crust_oci::PodFacts {
        crust_oci::PodFacts {
            sandbox_id: rec.id.clone(),
            net_ns: rec.namespaces.net.clone(),
            ipc_ns: rec.namespaces.ipc.clone(),
            uts_ns: rec.namespaces.uts.clone(),
            user_ns: rec
                .namespaces
                .user
                .clone()
                .zip(rec.namespaces.user_mappings)
                .map(|(path, [u, g])| crust_oci::UserNs {
                    path,
                    uid: crust_oci::IdMapping {
                        container_id: u.0,
                        host_id: u.1,
                        size: u.2,
                    },
                    gid: crust_oci::IdMapping {
                        container_id: g.0,
                        host_id: g.1,
                        size: g.2,
                    },
                }),
            // cgroupfs: below the pod cgroup, so that cgroup v2's
            // no-internal-processes rule holds; systemd: the pod's slice.
            cgroup_parent: match &rec.slice {
                Some(slice) => slice.name.clone(),
                // A systemd pod of an older daemon: kubelet's parent.
                None if self.systemd => rec.cgroup_parent.clone(),
                None => rec.cgroup_path.display().to_string(),
            },
            ..Default::default()
        }
    }

    /// What a container joining the pod gets of it: [`Pods::oci_facts`],
    /// the pause process's PID namespace, the pod's files and /dev/shm.
    pub fn container_facts(&self, rec: &PodRecord) -> crust_oci::PodFacts {
        let existing = |p: &PathBuf| p.exists().then(|| p.clone());
        crust_oci::PodFacts {
            pid_ns: self
                .host
                .pause_pid(rec)
                .map(|p| PathBuf::from(format!("/proc/{p}/ns/pid"))),
            resolv_conf: existing(&rec.resolv_conf_path),
            hosts: existing(&rec.hosts_path),
            hostname_file: existing(&rec.hostname_path),
            shm: rec.shm.clone(),
            ..self.oci_facts(rec)
        }
    }

    /// `<run_dir>/pods` and `<root>/pods`.
    fn roots(&self) -> [&Path; 2] {
        [&self.run_root, &self.state_root]
    }
}
