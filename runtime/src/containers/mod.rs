//! Containers: create (overlay rootfs over the image's leased layers, OCI
//! bundle, monitor), start, stop, remove, status, exec-sync, logs, resource
//! updates and recovery after a daemon restart. This module knows nothing
//! of pods: what a container needs of its pod comes as a [`PodView`] value
//! (from `crate::lifecycle`).
//!
//! Every container has a record in the store, written (state `creating`)
//! before CreateContainer touches the host and holding every path its
//! effects have, so tearing it down (also after a crash at any step) needs
//! nothing but the record. The monitor (`crust-shim`) owns the running
//! container; its exit file is the durable record of how it ended, read
//! lazily (status, stop) and by a watcher task that emits the STOPPED
//! event.
//!
//! - `lifecycle`: create, start, stop, remove, update, exec-sync, logs;
//! - `recovery`: rebuilding the index at start, exit watchers, reading
//!   exits;
//! - `validate`: checks of the request; `spec`: the OCI spec of a new
//!   container and the resources of an update;
//! - `host`: the node effects ([`ContainerHost`], [`RealContainerHost`]);
//! - `record`: what is stored; `image_names`: what a container reports of
//!   its image.

mod cdi;
mod checkpoint;
mod error;
pub mod host;
mod image_names;
mod lifecycle;
mod record;
mod recovery;
pub mod restore;
mod spec;
mod validate;

use std::path::PathBuf;
use std::sync::Arc;

use crust_api::v1::{LinuxContainerResources, PodSandboxConfig};
use crust_oci::RuntimeFacts;
use crust_store::Store;

use crate::events::{EventKind, Events};
use crate::handlers::Handlers;
use crate::images::ContainerImages;
use crate::index::{Entry, Index};

pub use error::ContainerError;
pub use host::{ContainerHost, RealContainerHost};
pub use record::{ContainerRecord, ContainerState, ImageRequest};
pub use validate::checked_config;

/// (pod ID, name, attempt): unique among containers.
type NameKey = (String, String, u32);

/// What a container needs of its pod sandbox, handed over as a value.
#[derive(Debug, Clone)]
pub struct PodView {
    pub id: String,
    /// Only a ready pod takes new containers.
    pub ready: bool,
    pub runtime_handler: String,
    /// Where the containers' CRI logs go (`config.log_path` is relative to
    /// it); empty: no logs.
    pub log_directory: String,
    pub sandbox_config: PodSandboxConfig,
    /// Namespaces, cgroup parent, files and /dev/shm to join.
    pub facts: crust_oci::PodFacts,
}

/// What sees, and may change, a new container's OCI spec after it is
/// generated and before the container is created (NRI plugins, handed
/// down from `crate::lifecycle`). The container is not visible yet.
#[async_trait::async_trait]
pub trait SpecHook: Send + Sync {
    /// Adjusts `spec`; returns the container's resources as they now are
    /// when it changed them (what ContainerStatus reports). An error fails
    /// the creation, which is then undone.
    async fn adjust(
        &self,
        rec: &ContainerRecord,
        spec: &mut crust_oci::Spec,
    ) -> Result<Option<LinuxContainerResources>, ContainerError>;
}

/// Where a container's state lives on the node.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// `<run_dir>/containers`: the monitors' state dirs and bundles.
    pub run_dir: PathBuf,
    /// `<root>/containers`: the writable layers.
    pub layers_dir: PathBuf,
    /// CDI spec dirs, lowest priority first (`cdi_spec_dirs`), at start
    /// ([`Containers::set_cdi_spec_dirs`] replaces them).
    pub cdi_spec_dirs: Vec<PathBuf>,
}

pub struct Containers {
    index: Index<ContainerRecord, NameKey>,
    store: Arc<Store>,
    host: Arc<dyn ContainerHost>,
    images: Arc<dyn ContainerImages>,
    handlers: Arc<Handlers>,
    facts: RuntimeFacts,
    dirs: Dirs,
    /// The CDI spec dirs in force (a config reload replaces them).
    cdi_spec_dirs: std::sync::RwLock<Vec<PathBuf>>,
    events: Events<ContainerRecord>,
}

impl Containers {
    /// Containers with their effects through `host`; call
    /// [`Containers::recover`] before use.
    pub fn new(
        store: Arc<Store>,
        host: Arc<dyn ContainerHost>,
        images: Arc<dyn ContainerImages>,
        handlers: Arc<Handlers>,
        facts: RuntimeFacts,
        dirs: Dirs,
    ) -> Containers {
        Containers {
            index: Index::default(),
            store,
            host,
            images,
            handlers,
            facts,
            cdi_spec_dirs: std::sync::RwLock::new(dirs.cdi_spec_dirs.clone()),
            dirs,
            events: Events::default(),
        }
    }

    /// Containers created from now on resolve CDI devices in `dirs`.
    pub fn set_cdi_spec_dirs(&self, dirs: Vec<PathBuf>) {
        *self
            .cdi_spec_dirs
            .write()
            .unwrap_or_else(|e| e.into_inner()) = dirs;
    }

    fn cdi_spec_dirs(&self) -> Vec<PathBuf> {
        self.cdi_spec_dirs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Container events (GetContainerEvents).
    pub fn events(&self) -> &Events<ContainerRecord> {
        &self.events
    }

    fn emit(&self, kind: EventKind, rec: &ContainerRecord) {
        self.events.emit(kind, &rec.id, &rec.pod_id, rec);
    }

    /// The entry of a full ID or unique ID prefix; None if there is none.
    fn resolve(&self, id: &str) -> Result<Option<Arc<Entry<ContainerRecord>>>, ContainerError> {
        if id.is_empty() {
            return Err(ContainerError::InvalidArgument(
                "container_id: required".into(),
            ));
        }
        self.index.resolve(id).map_err(|_| {
            ContainerError::InvalidArgument(format!(
                "container_id: {id:?} matches more than one container"
            ))
        })
    }

    fn get_entry(&self, id: &str) -> Result<Arc<Entry<ContainerRecord>>, ContainerError> {
        self.resolve(id)?
            .ok_or_else(|| ContainerError::NotFound(format!("container {id:?} not found")))
    }

    /// The record of a full ID or unique ID prefix, with its exit read
    /// from the monitor's exit file.
    pub fn get(&self, id: &str) -> Result<ContainerRecord, ContainerError> {
        let e = self.get_entry(id)?;
        Ok(self.refresh_passive(&e))
    }

    /// The container's cgroup (where its stats are), if it has one.
    pub fn cgroup_of(&self, rec: &ContainerRecord) -> Option<crate::cgroups::ContainerCgroup> {
        self.host.container_cgroup(rec)
    }

    /// Every container but those being created: an in-memory read. The
    /// record of a created or running container is kept current by its
    /// watcher, which waits on the monitor (see `recovery`).
    pub fn list(&self) -> Vec<Arc<ContainerRecord>> {
        self.index
            .entries()
            .iter()
            .map(|e| e.view())
            .filter(|r| r.state != ContainerState::Creating)
            .collect()
    }

    /// IDs of a pod's containers.
    pub fn ids_of_pod(&self, pod_id: &str) -> Vec<String> {
        self.index
            .entries()
            .iter()
            .map(|e| e.view())
            .filter(|r| r.pod_id == pod_id)
            .map(|r| r.id.clone())
            .collect()
    }

    /// Whether a life-cycle step (start, stop, remove, update...) is at
    /// work on the container `id` now.
    pub fn in_step(&self, id: &str) -> bool {
        matches!(self.index.resolve(id), Ok(Some(e)) if e.is_busy())
    }

    /// The runc-style spec of a container, for verbose status.
    pub fn runtime_spec(&self, rec: &ContainerRecord) -> serde_json::Value {
        self.host.read_spec(&rec.bundle)
    }
}

#[cfg(test)]
mod tests;
