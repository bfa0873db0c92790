//! Everything a pod sandbox does to the node, behind one trait: the pod's
//! dirs and files, pinned namespaces, cgroup, /dev/shm, CNI and the pause
//! process. [`RealPodHost`] does it through the crates; the unit tests of
//! the pod life cycle use a recording fake (`crate::fakes`), so the rules
//! (what is undone when, in which order) are tested without root.
//!
//! Blocking methods are called from the blocking pool; `async` ones are
//! I/O with child processes (CNI plugins, the pause process's monitor).

use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crust_api::v1::LinuxContainerResources;
use crust_cgroups::{CgroupPath, Controllers};
use crust_linux::mounts;
use crust_linux::ns::{self, PinOptions, PinnedNamespaces};
use crust_network::config::{self as cni_config, ConfigError, NetworkConfigList};
use crust_network::{Attachment, Cni, DelAttempt};
use crust_oci::RuntimeFacts;
use serde_json::Value;

use super::error::PodError;
use super::record::PodRecord;
use super::{files, pause};
use crate::cgroups::{NodeCgroups, PodSlice};
use crate::handlers::Handlers;
use crate::launch::Launcher;

/// What a CNI ADD gave the pod.
#[derive(Debug, Clone)]
pub struct CniAdded {
    /// The result as the last plugin printed it (prevResult for DEL).
    pub raw: Value,
    /// The pod's IPs on its interface, IPv4 first.
    pub ips: Vec<IpAddr>,
}

/// A failed CNI ADD.
#[derive(Debug, Clone)]
pub struct CniAddFailed {
    pub error: PodError,
    /// The ADD could not undo its own partial work: a DEL is still owed.
    pub del_owed: bool,
}

#[async_trait::async_trait]
pub trait PodHost: Send + Sync + 'static {
    /// The node's hostname, for a pod that names none.
    fn node_hostname(&self) -> Result<String, PodError>;
    /// The CNI network config a new pod joins (Unavailable if none).
    fn load_network(&self) -> Result<NetworkConfigList, PodError>;
    /// A node file to copy into a pod (bounded; a missing one is empty).
    fn read_node_file(&self, path: &Path) -> Result<String, PodError>;
    /// Whether a namespace is still pinned at `path`.
    fn is_pinned(&self, path: &Path) -> bool;
    /// The names in a dir (an unreadable dir has none).
    fn list_dir(&self, dir: &Path) -> Vec<String>;

    /// Creates a new dir (0711); an existing one is an error.
    fn create_dir(&self, dir: &Path) -> Result<(), PodError>;
    fn pin_namespaces(&self, ns_dir: &Path, opts: &PinOptions) -> Result<(), PodError>;
    /// Whether a cgroup exists at `path` (e.g. kubelet's pod slice).
    fn cgroup_exists(&self, path: &Path) -> bool;
    /// The controllers `unified` keys of a cgroup at `path` may name (its
    /// nearest existing ancestor's); None on a cgroup v1 node.
    fn unified_controllers(&self, path: &Path) -> Result<Option<Controllers>, PodError>;
    /// Makes the pod's cgroup: its slice (systemd driver), or a cgroup
    /// delegating its controllers to its children.
    fn create_cgroup(&self, path: &Path, slice: Option<&PodSlice>) -> Result<(), PodError>;
    /// What the node offers OCI specs and cgroup limits (v2, swap, huge
    /// pages...).
    fn runtime_facts(&self) -> &RuntimeFacts;
    /// Sets the pod cgroup's limits to `resources` (converted as a
    /// container's are). Blocking.
    fn update_cgroup(
        &self,
        path: &Path,
        slice: Option<&PodSlice>,
        resources: &LinuxContainerResources,
    ) -> Result<(), PodError>;
    fn mount_shm(&self, path: &Path) -> Result<(), PodError>;
    /// Writes a pod file (never through a symlink; an existing file keeps
    /// its inode, which containers bind-mount).
    fn write_file(&self, path: &Path, content: &str) -> Result<(), PodError>;
    /// Sysctls inside the pod's pinned namespaces.
    fn apply_sysctls(&self, rec: &PodRecord, sysctls: &[(String, String)]) -> Result<(), PodError>;

    async fn cni_add(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
    ) -> Result<CniAdded, CniAddFailed>;
    /// CNI DEL (the namespace must still be pinned: the bridge plugin
    /// finds its masquerade rules through it). `attempt`: whether an
    /// earlier DEL may have been cut short, so that the plugins cannot
    /// find all they made (see [`DelAttempt`]).
    async fn cni_del(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        prev_result: Option<&Value>,
        attempt: DelAttempt,
    ) -> Result<(), PodError>;

    /// Runs the pod's pause process (PID 1 of its shared PID namespace).
    async fn start_pause(
        &self,
        rec: &PodRecord,
        facts: &crust_oci::PodFacts,
    ) -> Result<(), PodError>;
    /// Stops the pause process (SIGKILL) and removes its state.
    /// Idempotent.
    async fn stop_pause(&self, rec: &PodRecord) -> Result<(), PodError>;
    /// Pid of the pod's pause process, if it runs.
    fn pause_pid(&self, rec: &PodRecord) -> Option<i32>;

    fn unpin_namespaces(&self, ns_dir: &Path) -> Result<(), PodError>;
    /// Unmounts the pod's /dev/shm and removes its dir.
    fn unmount_shm(&self, path: &Path) -> Result<(), PodError>;
    /// Removes the pod's cgroup with everything below it, killing what
    /// runs there (a slice crust did not make stays). Idempotent.
    fn delete_cgroup(&self, path: &Path, slice: Option<&PodSlice>) -> Result<(), PodError>;
    /// Removes a dir and everything in it (never through a mount); a
    /// missing one is no error.
    fn remove_tree(&self, dir: &Path) -> Result<(), PodError>;
    /// Removes an empty dir; a missing one is no error.
    fn remove_empty_dir(&self, dir: &Path) -> Result<(), PodError>;
}

/// Told of every CNI ADD (`true`) and DEL, whether it succeeded and how
/// long it took (the daemon's metrics).
pub type CniObserver = Arc<dyn Fn(bool, bool, std::time::Duration) + Send + Sync>;

/// The node itself.
pub struct RealPodHost {
    cni: Cni,
    cni_observer: Option<CniObserver>,
    cni_conf_dir: PathBuf,
    cgroups: Arc<NodeCgroups>,
    launcher: Launcher,
    handlers: Arc<Handlers>,
    runtime_facts: RuntimeFacts,
    /// `<root>`: the pause rootfs goes to `<root>/pause/rootfs`.
    root: PathBuf,
}

impl RealPodHost {
    pub fn new(
        cni: Cni,
        cni_conf_dir: PathBuf,
        cgroups: Arc<NodeCgroups>,
        launcher: Launcher,
        handlers: Arc<Handlers>,
        runtime_facts: RuntimeFacts,
        root: PathBuf,
    ) -> RealPodHost {
        RealPodHost {
            cni,
            cni_observer: None,
            cni_conf_dir,
            cgroups,
            launcher,
            handlers,
            runtime_facts,
            root,
        }
    }

    pub fn with_cni_observer(mut self, observer: CniObserver) -> RealPodHost {
        self.cni_observer = Some(observer);
        self
    }

    fn observe_cni(&self, add: bool, ok: bool, started: std::time::Instant) {
        if let Some(f) = &self.cni_observer {
            f(add, ok, started.elapsed());
        }
    }
}

fn cgroup_path(path: &Path) -> Result<CgroupPath, PodError> {
    CgroupPath::from_path(path).map_err(|e| PodError::cgroup("the pod cgroup", e))
}

/// Where a pod's namespaces are pinned before they move to `ns_dir`.
fn staging_dir(ns_dir: &Path) -> PathBuf {
    ns_dir.with_file_name("ns.pinning")
}

fn not_found_is_ok(r: std::io::Result<()>, dir: &Path) -> Result<(), PodError> {
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PodError::Internal(format!(
            "removing {}: {e}",
            dir.display()
        ))),
    }
}

#[async_trait::async_trait]
impl PodHost for RealPodHost {
    fn node_hostname(&self) -> Result<String, PodError> {
        files::node_hostname()
    }

    fn load_network(&self) -> Result<NetworkConfigList, PodError> {
        cni_config::load_default(&self.cni_conf_dir).map_err(|e| match e {
            ConfigError::NotFound(_) => PodError::Unavailable(format!(
                "the pod network is not ready: {e} (a pod with host network needs none)"
            )),
            e => PodError::Unavailable(format!("the pod network is not ready: {e}")),
        })
    }

    fn read_node_file(&self, path: &Path) -> Result<String, PodError> {
        files::read_node_file(path)
    }

    fn is_pinned(&self, path: &Path) -> bool {
        ns::is_pinned(path)
    }

    fn list_dir(&self, dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn create_dir(&self, dir: &Path) -> Result<(), PodError> {
        std::fs::DirBuilder::new()
            .mode(0o711)
            .create(dir)
            .map_err(|e| PodError::internal(&format!("creating {}", dir.display()), e))
    }

    /// Pins into a staging dir, then renames it to `ns_dir`: the pins'
    /// paths appear only once each is a mount of its namespace. (Pinning
    /// creates the files first and mounts onto them; a daemon killed in
    /// between left empty `ns/net` files that CNI DEL then refused, for
    /// good.) A mount moves with the dir it is in.
    fn pin_namespaces(&self, ns_dir: &Path, opts: &PinOptions) -> Result<(), PodError> {
        let staging = staging_dir(ns_dir);
        // What a crash in an earlier attempt may have left.
        ns::unpin_namespaces(&staging)
            .map_err(|e| PodError::linux("unpinning a staging dir", e))?;
        ns::pin_namespaces(&staging, opts)
            .map_err(|e| PodError::linux("pinning the pod's namespaces", e))?;
        if let Err(e) = std::fs::rename(&staging, ns_dir) {
            let _ = ns::unpin_namespaces(&staging);
            return Err(PodError::internal(
                &format!("moving the pinned namespaces to {}", ns_dir.display()),
                e,
            ));
        }
        Ok(())
    }

    fn cgroup_exists(&self, path: &Path) -> bool {
        cgroup_path(path).is_ok_and(|p| self.cgroups.exists(&p))
    }

    fn unified_controllers(&self, path: &Path) -> Result<Option<Controllers>, PodError> {
        self.cgroups
            .unified_controllers(&cgroup_path(path)?)
            .map_err(|e| PodError::cgroup("reading the pod cgroup's controllers", e))
    }

    fn create_cgroup(&self, path: &Path, slice: Option<&PodSlice>) -> Result<(), PodError> {
        self.cgroups
            .create_pod(&cgroup_path(path)?, slice)
            .map_err(|e| PodError::cgroup("creating the pod cgroup", e))
    }

    fn runtime_facts(&self) -> &RuntimeFacts {
        &self.runtime_facts
    }

    fn update_cgroup(
        &self,
        path: &Path,
        slice: Option<&PodSlice>,
        resources: &LinuxContainerResources,
    ) -> Result<(), PodError> {
        let oci = crust_oci::linux_resources("resources", resources, &self.runtime_facts)
            .map_err(|e| PodError::InvalidArgument(e.to_string()))?;
        self.cgroups
            .update_pod(&cgroup_path(path)?, slice, &oci)
            .map_err(|e| PodError::cgroup("updating the pod cgroup", e))
    }

    fn mount_shm(&self, path: &Path) -> Result<(), PodError> {
        mounts::mount_shm(path, mounts::DEFAULT_SHM_SIZE)
            .map_err(|e| PodError::linux("mounting the pod's /dev/shm", e))
    }

    fn write_file(&self, path: &Path, content: &str) -> Result<(), PodError> {
        files::write(path, content)
    }

    fn apply_sysctls(&self, rec: &PodRecord, sysctls: &[(String, String)]) -> Result<(), PodError> {
        let namespaces = &rec.namespaces;
        let pinned = PinnedNamespaces {
            net: namespaces.net.clone(),
            ipc: namespaces.ipc.clone(),
            uts: namespaces.uts.clone(),
        };
        ns::apply_sysctls(&pinned, sysctls).map_err(|e| PodError::linux("config.linux.sysctls", e))
    }

    async fn cni_add(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
    ) -> Result<CniAdded, CniAddFailed> {
        let started = std::time::Instant::now();
        let result = self.cni.add(net, att).await;
        self.observe_cni(true, result.is_ok(), started);
        match result {
            Ok(added) => Ok(CniAdded {
                ips: added.pod_ips(&att.ifname),
                raw: added.raw,
            }),
            Err(e) => Err(CniAddFailed {
                // ADD undoes its own partial work; only if that failed too
                // is a DEL still owed.
                del_owed: matches!(e, crust_network::Error::AddAndCleanup { .. }),
                error: PodError::network(&format!("CNI ADD to network {:?}", net.name), e),
            }),
        }
    }

    async fn cni_del(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        prev_result: Option<&Value>,
        attempt: DelAttempt,
    ) -> Result<(), PodError> {
        let started = std::time::Instant::now();
        let result = self.cni.del(net, att, prev_result, attempt).await;
        self.observe_cni(false, result.is_ok(), started);
        result.map_err(|e| PodError::internal("tearing down the pod network (CNI DEL)", e))
    }

    async fn start_pause(
        &self,
        rec: &PodRecord,
        facts: &crust_oci::PodFacts,
    ) -> Result<(), PodError> {
        let runtime = self.handlers.get(&rec.runtime_handler).ok_or_else(|| {
            PodError::invalid(
                "runtime_handler",
                format!("unknown runtime handler {:?}", rec.runtime_handler),
            )
        })?;
        let rootfs = {
            let root = self.root.clone();
            crate::tasks::blocking(move || pause::ensure_rootfs(&root)).await?
        };
        let launch = pause::launch(rec, facts, runtime, &rootfs, &self.runtime_facts)?;
        let monitor = self
            .launcher
            .create(launch)
            .await
            .map_err(|e| PodError::Internal(format!("creating the pause process: {e}")))?;
        monitor
            .start()
            .await
            .map_err(|e| PodError::Internal(format!("starting the pause process: {e}")))
    }

    async fn stop_pause(&self, rec: &PodRecord) -> Result<(), PodError> {
        pause::stop(rec).await
    }

    fn pause_pid(&self, rec: &PodRecord) -> Option<i32> {
        pause::pid(rec)
    }

    /// Also the staging dir of [`RealPodHost::pin_namespaces`], which a
    /// crash can leave with pins (mounted or not yet) in it.
    fn unpin_namespaces(&self, ns_dir: &Path) -> Result<(), PodError> {
        ns::unpin_namespaces(&staging_dir(ns_dir))
            .and_then(|()| ns::unpin_namespaces(ns_dir))
            .map_err(|e| PodError::Internal(format!("unpinning the namespaces: {e}")))
    }

    fn unmount_shm(&self, path: &Path) -> Result<(), PodError> {
        mounts::unmount_and_remove_dir(path)
            .map_err(|e| PodError::Internal(format!("unmounting /dev/shm: {e}")))
    }

    fn delete_cgroup(&self, path: &Path, slice: Option<&PodSlice>) -> Result<(), PodError> {
        self.cgroups
            .delete_pod(&cgroup_path(path)?, slice)
            .map_err(|e| PodError::cgroup("deleting the pod cgroup", e))
    }

    fn remove_tree(&self, dir: &Path) -> Result<(), PodError> {
        not_found_is_ok(std::fs::remove_dir_all(dir), dir)
    }

    fn remove_empty_dir(&self, dir: &Path) -> Result<(), PodError> {
        not_found_is_ok(std::fs::remove_dir(dir), dir)
    }
}
