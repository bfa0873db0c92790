//! Pod sandboxes: pinned namespaces, the pod cgroup, /dev/shm, the
//! hostname/hosts/resolv.conf files and the CNI attachment, with their life
//! cycle (run, stop, remove), status and recovery after a daemon restart.
//!
//! A pod is a record in the store plus effects on the host. The record is
//! written, in state `creating`, before any effect, and names every path
//! and the network config the effects will use; every teardown step is
//! idempotent, so a failed or crashed RunPodSandbox is undone from the
//! record alone (at once, or at the next daemon start), and Stop/Remove can
//! be retried until they succeed.
//!
//! Layout: `<run_dir>/pods/<id>/{ns/{net,ipc,uts},shm}` (volatile: lost on
//! reboot, like the namespaces themselves) and
//! `<root>/pods/<id>/{hostname,hosts,resolv.conf}`. CNI's own cache (for DEL
//! after a crash) is `<root>/cni/cache`.
//!
//! For the containers that join a pod: [`Pods::get`] gives its record with
//! the namespace paths, the shm dir, the files, the cgroup and the config.

mod error;
mod files;
pub mod pause;
mod record;
mod spec;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use crust_linux::cgroups::{self, Hierarchy, PodCgroup};
use crust_linux::mounts;
use crust_linux::ns::{self, NamespaceKind, PinOptions, PinnedNamespaces};
use crust_network::config::{self as cni_config, ConfigError, NetworkConfigList};
use crust_network::{Attachment, Cni, DEFAULT_IFNAME, DefaultNetwork, RuntimeCapabilities};
use crust_store::Store;
use serde_json::{Value, json};
use tracing::{debug, error, info, warn};

use crate::clock::now_ns;
use crate::config::Config;
use crate::daemon::Daemon;
use crate::ids::{is_id as is_pod_id, new_id};

pub use error::PodError;
pub use record::{NamespacePaths, NetworkRecord, PodMetadata, PodRecord, PodState};
pub use spec::PodSpec;

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The pod sandboxes of this daemon.
pub struct Pods {
    /// `<run_dir>/pods`
    run_root: PathBuf,
    /// `<root>/pods`
    state_root: PathBuf,
    cni_conf_dir: PathBuf,
    cni: Cni,
    hierarchy: Hierarchy,
    index: Mutex<Index>,
}

/// (name, namespace, uid, attempt): unique among pods, as in containerd.
type NameKey = (String, String, String, u32);

#[derive(Default)]
struct Index {
    /// Pods clients can see (ready or not ready).
    pods: HashMap<String, Arc<PodEntry>>,
    /// Reserved names, including pods still being created.
    names: HashMap<NameKey, String>,
}

struct PodEntry {
    record: Mutex<PodRecord>,
    /// Serializes Stop and Remove of this pod; true once it is removed.
    op: tokio::sync::Mutex<bool>,
}

impl PodEntry {
    fn new(record: PodRecord) -> Arc<PodEntry> {
        Arc::new(PodEntry {
            record: Mutex::new(record),
            op: tokio::sync::Mutex::new(false),
        })
    }

    fn snapshot(&self) -> PodRecord {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set(&self, record: PodRecord) {
        *self.record.lock().unwrap_or_else(|e| e.into_inner()) = record;
    }
}

fn name_key(md: &PodMetadata) -> NameKey {
    (
        md.name.clone(),
        md.namespace.clone(),
        md.uid.clone(),
        md.attempt,
    )
}

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
    /// Sets up the pods' dirs, installs the default network if asked and
    /// recovers the pods of a previous run: half-created ones are undone,
    /// ready ones whose namespaces did not survive (a reboot) become not
    /// ready.
    pub fn open(
        config: &Config,
        store: &Store,
        hierarchy: Hierarchy,
        pod_cidrs: &[String],
    ) -> anyhow::Result<Pods> {
        let run_root = config.run_dir.join("pods");
        let state_root = config.root.join("pods");
        for dir in [&run_root, &state_root] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        let cni = Cni::new(config.network.cni_bin_dirs.clone())
            .context("network.cni_bin_dirs")?
            .with_cache_dir(config.root.join("cni").join("cache"));
        let conf_dir = &config.network.cni_conf_dir;
        if config.network.install_default_conflist {
            let net = if pod_cidrs.is_empty() {
                DefaultNetwork::default()
            } else {
                DefaultNetwork::with_pod_cidr(&pod_cidrs.join(","))
            };
            match crust_network::install_default_conflist(conf_dir, &net) {
                Ok(Some(path)) => info!(
                    path = %path.display(),
                    subnets = ?net.subnets,
                    "installed the default pod network (network.install_default_conflist)"
                ),
                Ok(None) => {}
                // A read-only conf dir must not keep the daemon down: the
                // node reports NetworkReady=false instead.
                Err(e) => warn!("cannot install the default pod network: {e}"),
            }
        }
        let pods = Pods {
            run_root,
            state_root,
            cni_conf_dir: conf_dir.clone(),
            cni,
            hierarchy,
            index: Mutex::new(Index::default()),
        };
        pods.recover(store)?;
        Ok(pods)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod with this ID or unique ID prefix; None if there is none.
    fn resolve(&self, id: &str) -> Result<Option<Arc<PodEntry>>, PodError> {
        if id.is_empty() {
            return Err(PodError::invalid("pod_sandbox_id", "required"));
        }
        let index = self.index();
        if let Some(entry) = index.pods.get(id) {
            return Ok(Some(entry.clone()));
        }
        let mut matches = index.pods.iter().filter(|(k, _)| k.starts_with(id));
        let first = matches.next().map(|(_, e)| e.clone());
        if first.is_some() && matches.next().is_some() {
            return Err(PodError::invalid(
                "pod_sandbox_id",
                format!("{id:?} is a prefix of more than one pod sandbox ID"),
            ));
        }
        Ok(first)
    }

    /// A pod's record, by ID or unique ID prefix (NotFound if none).
    pub fn get(&self, id: &str) -> Result<PodRecord, PodError> {
        self.resolve(id)?
            .map(|e| e.snapshot())
            .ok_or_else(|| PodError::NotFound(format!("pod sandbox {id:?} not found")))
    }

    pub fn list(&self, filter: &ListFilter) -> Vec<PodRecord> {
        let entries: Vec<Arc<PodEntry>> = if filter.id.is_empty() {
            self.index().pods.values().cloned().collect()
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

    /// Reserves the pod's name and picks its ID.
    fn reserve(&self, md: &PodMetadata) -> Result<String, PodError> {
        let mut index = self.index();
        let key = name_key(md);
        if let Some(owner) = index.names.get(&key) {
            return Err(PodError::AlreadyExists(format!(
                "pod sandbox name {:?} (namespace {:?}, uid {:?}, attempt {}) is already \
                 used by pod sandbox {owner}",
                md.name, md.namespace, md.uid, md.attempt
            )));
        }
        let id = loop {
            let id = new_id().map_err(|e| PodError::internal("generating a pod sandbox ID", e))?;
            if !index.pods.contains_key(&id) && !index.names.values().any(|v| *v == id) {
                break id;
            }
        };
        index.names.insert(key, id.clone());
        Ok(id)
    }

    fn release(&self, md: &PodMetadata) {
        self.index().names.remove(&name_key(md));
    }

    fn publish(&self, record: PodRecord) {
        let mut index = self.index();
        index
            .names
            .insert(name_key(&record.metadata), record.id.clone());
        index.pods.insert(record.id.clone(), PodEntry::new(record));
    }

    /// The record of a new pod: every path and setting its effects will
    /// have.
    fn plan(
        &self,
        id: &str,
        spec: &PodSpec,
        network: Option<NetworkConfigList>,
    ) -> Result<PodRecord, PodError> {
        let run_dir = self.run_root.join(id);
        let state_dir = self.state_root.join(id);
        let ns_dir = run_dir.join("ns");
        let pin = |own: bool, kind| own.then(|| ns::pin_path(&ns_dir, kind));
        let namespaces = NamespacePaths {
            net: pin(!spec.host_network, NamespaceKind::Net),
            ipc: pin(!spec.host_ipc, NamespaceKind::Ipc),
            // The pod's own UTS namespace goes with its own network, as in
            // containerd: a host-network pod has the node's hostname.
            uts: pin(!spec.host_network, NamespaceKind::Uts),
        };
        let cgroup_path = cgroups::pod_cgroup_path(&spec.cgroup_parent, id)
            .map_err(|e| PodError::linux("config.linux.cgroup_parent", e))?;
        let hostname = if spec.hostname.is_empty() {
            files::node_hostname()?
        } else {
            spec.hostname.clone()
        };
        let network = match (network, &namespaces.net) {
            (Some(config), Some(netns)) => {
                let attachment = Attachment {
                    container_id: id.to_string(),
                    netns: netns.clone(),
                    ifname: DEFAULT_IFNAME.to_string(),
                    pod_namespace: spec.metadata.namespace.clone(),
                    pod_name: spec.metadata.name.clone(),
                    pod_uid: spec.metadata.uid.clone(),
                    capabilities: RuntimeCapabilities {
                        port_mappings: spec.port_mappings.clone(),
                        bandwidth: spec.bandwidth.clone(),
                        dns: spec.dns.as_ref().map(|d| crust_network::DnsConfig {
                            servers: d.servers.clone(),
                            searches: d.searches.clone(),
                            options: d.options.clone(),
                        }),
                        ip_ranges: Vec::new(),
                        // As containerd: the parent kubelet gave (its pod
                        // cgroup), for plugins that declare cgroupPath.
                        cgroup_path: (!spec.cgroup_parent.is_empty())
                            .then(|| spec.cgroup_parent.clone()),
                    },
                };
                crust_network::cni_args(&attachment)
                    .map_err(|e| PodError::network("config.metadata", e))?;
                Some(NetworkRecord {
                    config,
                    attachment,
                    result: None,
                    ips: Vec::new(),
                    // A DEL is owed from the moment ADD may have started.
                    attached: true,
                })
            }
            _ => None,
        };
        Ok(PodRecord {
            id: id.to_string(),
            state: PodState::Creating,
            created_at: now_ns(),
            metadata: spec.metadata.clone(),
            runtime_handler: spec.runtime_handler.clone(),
            hostname,
            labels: spec.labels.clone(),
            annotations: spec.annotations.clone(),
            log_directory: spec.log_directory.clone(),
            host_network: spec.host_network,
            host_ipc: spec.host_ipc,
            host_pid: spec.host_pid,
            cgroup_parent: spec.cgroup_parent.clone(),
            cgroup_path,
            shm: (!spec.host_ipc).then(|| run_dir.join("shm")),
            hostname_path: state_dir.join("hostname"),
            hosts_path: state_dir.join("hosts"),
            resolv_conf_path: state_dir.join("resolv.conf"),
            run_dir,
            state_dir,
            ns_dir,
            namespaces,
            network,
            config: record::encode_config(&spec.config),
        })
    }

    fn cgroup(&self, rec: &PodRecord) -> Result<PodCgroup, PodError> {
        PodCgroup::new(self.hierarchy, Path::new(CGROUP_ROOT), &rec.cgroup_path)
            .map_err(|e| PodError::linux("pod cgroup", e))
    }

    /// The host-side effects before CNI: dirs, namespaces (with the
    /// hostname), cgroup, /dev/shm, hostname and resolv.conf (and hosts for
    /// a host-network pod). Blocking.
    fn create_local(&self, rec: &PodRecord, spec: &PodSpec) -> Result<(), PodError> {
        for dir in [&rec.run_dir, &rec.state_dir] {
            // Not recursive: the ID is new, so an existing dir is an error.
            std::fs::DirBuilder::new()
                .mode(0o711)
                .create(dir)
                .map_err(|e| PodError::internal(&format!("creating {}", dir.display()), e))?;
        }
        let own_uts = rec.namespaces.uts.is_some();
        let opts = PinOptions {
            net: rec.namespaces.net.is_some(),
            ipc: rec.namespaces.ipc.is_some(),
            uts: own_uts,
            hostname: (own_uts && !spec.hostname.is_empty()).then(|| spec.hostname.clone()),
            // Applied after CNI ADD, so eth0's sysctls exist too.
            sysctls: Vec::new(),
            loopback_up: true,
        };
        if opts.net || opts.ipc || opts.uts {
            ns::pin_namespaces(&rec.ns_dir, &opts)
                .map_err(|e| PodError::linux("pinning the pod's namespaces", e))?;
        }
        self.cgroup(rec)?
            .create()
            .map_err(|e| PodError::linux("creating the pod cgroup", e))?;
        if let Some(shm) = &rec.shm {
            mounts::mount_shm(shm, mounts::DEFAULT_SHM_SIZE)
                .map_err(|e| PodError::linux("mounting the pod's /dev/shm", e))?;
        }
        files::write(&rec.hostname_path, &files::hostname(&rec.hostname))?;
        let resolv = match &spec.dns {
            Some(dns) => files::resolv_conf(dns),
            None => files::read_node_file(Path::new("/etc/resolv.conf"))?,
        };
        files::write(&rec.resolv_conf_path, &resolv)?;
        let hosts = if rec.host_network {
            let node = files::read_node_file(Path::new("/etc/hosts"))?;
            if node.is_empty() {
                files::hosts(&rec.hostname, &[])
            } else {
                node
            }
        } else {
            files::hosts(&rec.hostname, &[])
        };
        files::write(&rec.hosts_path, &hosts)
    }

    /// After CNI ADD: sysctls inside the pod's namespaces, and the pod IPs
    /// in /etc/hosts. Blocking.
    fn finish_local(&self, rec: &PodRecord, spec: &PodSpec) -> Result<(), PodError> {
        if !spec.sysctls.is_empty() {
            let pinned = PinnedNamespaces {
                net: rec.namespaces.net.clone(),
                ipc: rec.namespaces.ipc.clone(),
                uts: rec.namespaces.uts.clone(),
            };
            ns::apply_sysctls(&pinned, &spec.sysctls)
                .map_err(|e| PodError::linux("config.linux.sysctls", e))?;
        }
        if let Some(net) = &rec.network {
            let ips: Vec<IpAddr> = net.ips.iter().filter_map(|ip| ip.parse().ok()).collect();
            files::write(&rec.hosts_path, &files::hosts(&rec.hostname, &ips))?;
        }
        Ok(())
    }

    /// CNI DEL, if one is owed. The namespace must still be pinned (the
    /// bridge plugin finds its masquerade rules through it).
    async fn del_network(&self, rec: &PodRecord) -> Result<(), PodError> {
        let Some(net) = rec.network.as_ref().filter(|n| n.attached) else {
            return Ok(());
        };
        // Without a result (ADD not finished) the CNI cache has it, if ADD
        // got that far.
        self.cni
            .del(&net.config, &net.attachment, net.result.as_ref())
            .await
            .map_err(|e| PodError::internal("tearing down the pod network (CNI DEL)", e))
    }

    /// Undoes everything but the network, in reverse order of creation.
    /// Idempotent; blocking. Every step runs; the errors are collected.
    fn teardown_local(&self, rec: &PodRecord) -> Result<(), PodError> {
        let mut errors: Vec<String> = Vec::new();
        if let Err(e) = pause::stop(rec) {
            errors.push(format!("stopping the pause process: {e}"));
        }
        if let Err(e) = ns::unpin_namespaces(&rec.ns_dir) {
            errors.push(format!("unpinning the namespaces: {e}"));
        }
        if let Some(shm) = &rec.shm
            && let Err(e) = mounts::unmount_and_remove_dir(shm)
        {
            errors.push(format!("unmounting /dev/shm: {e}"));
        }
        match self.cgroup(rec).and_then(|cg| {
            cg.delete()
                .map_err(|e| PodError::linux("deleting the pod cgroup", e))
        }) {
            Ok(()) => {}
            Err(e) => errors.push(e.to_string()),
        }
        match std::fs::remove_dir_all(&rec.state_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("removing {}: {e}", rec.state_dir.display())),
        }
        // Only once nothing can be mounted below it any more.
        if errors.is_empty() {
            match std::fs::remove_dir(&rec.run_dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => errors.push(format!("removing {}: {e}", rec.run_dir.display())),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PodError::Internal(errors.join("; ")))
        }
    }

    /// Startup: rebuild the index from the store and reconcile the host.
    fn recover(&self, store: &Store) -> anyhow::Result<()> {
        let records: Vec<PodRecord> = store.list().context("loading pod records")?;
        let (mut ready, mut not_ready, mut undone) = (0, 0, 0);
        for mut rec in records {
            match rec.state {
                PodState::Creating => {
                    // RunPodSandbox did not finish: undo it.
                    let res = block_on_own_runtime(self.del_network(&rec))
                        .and_then(|r| r)
                        .and_then(|()| self.teardown_local(&rec));
                    match res {
                        Ok(()) => {
                            store.delete::<PodRecord>(&rec.id)?;
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
                            store.put(&rec)?;
                        }
                    }
                }
                PodState::Ready if !pins_intact(&rec) => {
                    // The namespaces are gone: the node rebooted (or someone
                    // unmounted them). Stop/Remove still run CNI DEL, which
                    // releases the pod's IP.
                    warn!(id = %rec.id, "pod sandbox namespaces are gone, marking it NOTREADY");
                    rec.state = PodState::NotReady;
                    store.put(&rec)?;
                }
                _ => {}
            }
            match rec.state {
                PodState::Ready => ready += 1,
                _ => not_ready += 1,
            }
            self.publish(rec);
        }
        self.sweep_orphans();
        info!(ready, not_ready, undone, "pod sandboxes recovered");
        Ok(())
    }

    /// Removes pod dirs no record owns (left by a crash between removing
    /// the host effects and the record, or by hand).
    fn sweep_orphans(&self) {
        let known: std::collections::HashSet<String> = self.index().pods.keys().cloned().collect();
        for root in [&self.run_root, &self.state_root] {
            let Ok(entries) = std::fs::read_dir(root) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if known.contains(&name) || !is_pod_id(&name) {
                    continue;
                }
                let dir = entry.path();
                let res = if root == &self.run_root {
                    ns::unpin_namespaces(&dir.join("ns"))
                        .and_then(|()| mounts::unmount_and_remove_dir(&dir.join("shm")))
                        .map_err(|e| e.to_string())
                        .and_then(|()| std::fs::remove_dir(&dir).map_err(|e| e.to_string()))
                } else {
                    std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())
                };
                match res {
                    Ok(()) => info!(dir = %dir.display(), "removed an orphaned pod dir"),
                    Err(e) => warn!(dir = %dir.display(), "cannot remove an orphaned pod dir: {e}"),
                }
            }
        }
    }

    /// The network config a new pod joins.
    fn load_network(&self) -> Result<NetworkConfigList, PodError> {
        cni_config::load_default(&self.cni_conf_dir).map_err(|e| match e {
            ConfigError::NotFound(_) => PodError::Unavailable(format!(
                "the pod network is not ready: {e} (a pod with host network needs none)"
            )),
            e => PodError::Unavailable(format!("the pod network is not ready: {e}")),
        })
    }
}

/// RunPodSandbox: sets the pod up and returns its ID. On any failure
/// everything created is undone and the cause returned.
pub async fn run(daemon: Arc<Daemon>, spec: PodSpec) -> Result<String, PodError> {
    let pods = &daemon.pods;
    let network = if spec.host_network {
        None
    } else {
        Some(pods.load_network()?)
    };
    let id = pods.reserve(&spec.metadata)?;
    let rec = match pods.plan(&id, &spec, network) {
        Ok(rec) => rec,
        Err(e) => {
            pods.release(&spec.metadata);
            return Err(e);
        }
    };
    let spec = Arc::new(spec);

    // 1. The record, then the local effects.
    let res = blocking(&daemon, {
        let (rec, spec) = (rec.clone(), spec.clone());
        move |d| {
            d.store
                .put(&rec)
                .map_err(|e| PodError::from(e).context("writing the pod record"))?;
            d.pods.create_local(&rec, &spec)?;
            if pause::shares_pid(&rec) {
                pause::start(d, &rec)?;
            }
            Ok(())
        }
    })
    .await;
    let mut rec = rec;
    if let Err(e) = res {
        // ADD has not started: no DEL is owed.
        if let Some(net) = rec.network.as_mut() {
            net.attached = false;
        }
        return Err(rollback(&daemon, rec, e).await);
    }

    // 2. CNI ADD.
    if let Some(net) = rec.network.as_mut() {
        match pods.cni.add(&net.config, &net.attachment).await {
            Ok(added) => {
                let ips = added.pod_ips(&net.attachment.ifname);
                net.result = Some(added.raw);
                net.ips = ips.iter().map(ToString::to_string).collect();
                if ips.is_empty() {
                    let e = PodError::Internal(format!(
                        "CNI network {:?} gave the pod no IP address on {}",
                        net.config.name, net.attachment.ifname
                    ));
                    return Err(rollback(&daemon, rec, e).await);
                }
            }
            Err(e) => {
                // ADD undoes its own partial work; only if that failed too
                // is a DEL still owed.
                if !matches!(e, crust_network::Error::AddAndCleanup { .. }) {
                    net.attached = false;
                }
                let e = PodError::network(&format!("CNI ADD to network {:?}", net.config.name), e);
                return Err(rollback(&daemon, rec, e).await);
            }
        }
    }

    // 3. Sysctls and /etc/hosts, then the record says ready.
    rec.state = PodState::Ready;
    let res = blocking(&daemon, {
        let (rec, spec) = (rec.clone(), spec.clone());
        move |d| {
            d.pods.finish_local(&rec, &spec)?;
            d.store
                .put(&rec)
                .map_err(|e| PodError::from(e).context("writing the pod record"))
        }
    })
    .await;
    if let Err(e) = res {
        rec.state = PodState::Creating;
        return Err(rollback(&daemon, rec, e).await);
    }
    info!(
        id = %rec.id,
        name = %rec.metadata.name,
        namespace = %rec.metadata.namespace,
        ips = ?rec.ips(),
        "pod sandbox ready"
    );
    pods.publish(rec);
    Ok(id)
}

/// Undoes a failed RunPodSandbox and returns its cause. When the undoing
/// fails too, the pod is kept (NOTREADY, visible) so that RemovePodSandbox
/// retries it, and the error says so.
async fn rollback(daemon: &Arc<Daemon>, rec: PodRecord, cause: PodError) -> PodError {
    warn!(id = %rec.id, "pod sandbox creation failed, undoing it: {cause}");
    match teardown(daemon, &rec).await {
        Ok(()) => {
            let id = rec.id.clone();
            let deleted = blocking(daemon, move |d| Ok(d.store.delete::<PodRecord>(&id)?)).await;
            if let Err(e) = deleted {
                // Undone on the host; the next start removes the record.
                warn!(id = %rec.id, "cannot delete the record of an undone pod: {e}");
            }
            daemon.pods.release(&rec.metadata);
            cause
        }
        Err(cleanup) => {
            error!(id = %rec.id, "undoing the failed pod sandbox failed: {cleanup}");
            let mut rec = rec;
            rec.state = PodState::NotReady;
            let stored = store_put(daemon, &rec).await;
            if let Err(e) = stored {
                warn!(id = %rec.id, "cannot store the pod left behind: {e}");
            }
            let id = rec.id.clone();
            daemon.pods.publish(rec);
            cause.context(format!(
                "(cleaning up also failed, pod sandbox {id} is left NOTREADY for \
                 RemovePodSandbox to retry: {cleanup})"
            ))
        }
    }
}

/// Network first (while the namespace is pinned), then the rest.
async fn teardown(daemon: &Arc<Daemon>, rec: &PodRecord) -> Result<(), PodError> {
    daemon.pods.del_network(rec).await?;
    let rec = rec.clone();
    blocking(daemon, move |d| d.pods.teardown_local(&rec)).await
}

/// StopPodSandbox: the pod becomes NOTREADY and leaves its network. A
/// failed DEL is returned and retried by the next Stop or Remove.
/// Idempotent, also for unknown IDs.
pub async fn stop(daemon: Arc<Daemon>, id: String) -> Result<(), PodError> {
    let Some(entry) = daemon.pods.resolve(&id)? else {
        debug!(
            id,
            "StopPodSandbox of an unknown pod sandbox: nothing to do"
        );
        return Ok(());
    };
    let removed = entry.op.lock().await;
    if *removed {
        return Ok(());
    }
    stop_locked(&daemon, &entry).await
}

async fn stop_locked(daemon: &Arc<Daemon>, entry: &PodEntry) -> Result<(), PodError> {
    // The pod's containers are stopped first, before the network goes
    // (kubelet expects StopPodSandbox to stop them all, forcibly).
    let mut rec = entry.snapshot();
    crate::containers::stop_all_of_pod(daemon, &rec.id, false)
        .await
        .map_err(|e| {
            PodError::Internal(format!("stopping the pod's containers: {}", e.message()))
        })?;
    {
        let rec = rec.clone();
        blocking(daemon, move |_| pause::stop(&rec)).await?;
    }
    if rec.state == PodState::Ready {
        rec.state = PodState::NotReady;
        store_put(daemon, &rec).await?;
        entry.set(rec.clone());
        info!(id = %rec.id, name = %rec.metadata.name, "pod sandbox stopped");
    }
    if rec.network_attached() {
        daemon.pods.del_network(&rec).await?;
        if let Some(net) = rec.network.as_mut() {
            net.attached = false;
        }
        store_put(daemon, &rec).await?;
        entry.set(rec);
    }
    Ok(())
}

/// RemovePodSandbox: Stop's work if still needed, then the namespaces,
/// /dev/shm, the cgroup, the files and the record. Idempotent.
pub async fn remove(daemon: Arc<Daemon>, id: String) -> Result<(), PodError> {
    let Some(entry) = daemon.pods.resolve(&id)? else {
        debug!(
            id,
            "RemovePodSandbox of an unknown pod sandbox: nothing to do"
        );
        return Ok(());
    };
    let mut removed = entry.op.lock().await;
    if *removed {
        return Ok(());
    }
    // The pod's containers go first (forcibly).
    crate::containers::stop_all_of_pod(&daemon, &entry.snapshot().id, true)
        .await
        .map_err(|e| {
            PodError::Internal(format!("removing the pod's containers: {}", e.message()))
        })?;
    stop_locked(&daemon, &entry).await?;
    let rec = entry.snapshot();
    blocking(&daemon, {
        let rec = rec.clone();
        move |d| {
            d.pods.teardown_local(&rec)?;
            // Last: a crash before this leaves a record whose teardown
            // the next Remove repeats.
            d.store
                .delete::<PodRecord>(&rec.id)
                .map_err(|e| PodError::from(e).context("deleting the pod record"))?;
            Ok(())
        }
    })
    .await?;
    {
        let mut index = daemon.pods.index();
        index.pods.remove(&rec.id);
        index.names.remove(&name_key(&rec.metadata));
    }
    *removed = true;
    info!(id = %rec.id, name = %rec.metadata.name, "pod sandbox removed");
    Ok(())
}

/// The verbose part of PodSandboxStatus (`info["info"]`), shaped like
/// containerd's so tools that read it find the same keys.
pub fn verbose_info(rec: &PodRecord) -> Value {
    let path = |p: &Option<PathBuf>| {
        p.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    let net_closed = rec
        .namespaces
        .net
        .as_deref()
        .is_none_or(|p| !ns::is_pinned(p));
    let config = rec.sandbox_config();
    json!({
        // The pause process of a pid = POD pod; else nothing runs until
        // containers do.
        "pid": pause::pid(rec).unwrap_or(0),
        "state": match rec.state {
            PodState::Ready => "ready",
            PodState::NotReady => "notready",
            PodState::Creating => "creating",
        },
        "runtimeHandler": rec.runtime_handler,
        "netNamespacePath": path(&rec.namespaces.net),
        "netNamespaceClosed": net_closed,
        "namespaces": {
            "network": path(&rec.namespaces.net),
            "ipc": path(&rec.namespaces.ipc),
            "uts": path(&rec.namespaces.uts),
        },
        "cgroupParent": rec.cgroup_parent,
        "cgroupPath": rec.cgroup_path,
        "shmPath": path(&rec.shm),
        "hostname": rec.hostname,
        "hostnamePath": rec.hostname_path,
        "hostsPath": rec.hosts_path,
        "resolvConfPath": rec.resolv_conf_path,
        "cniNetwork": rec.network.as_ref().map(|n| n.config.name.clone()),
        "cniResult": rec.network.as_ref().and_then(|n| n.result.clone()),
        "config": config_json(&config),
    })
}

/// PodSandboxConfig as JSON with the CRI's field names (as containerd's
/// verbose info shows it).
fn config_json(c: &crust_api::v1::PodSandboxConfig) -> Value {
    let md = c.metadata.clone().unwrap_or_default();
    let linux = c.linux.clone().unwrap_or_default();
    let sc = linux.security_context.clone().unwrap_or_default();
    let ns = sc.namespace_options.clone().unwrap_or_default();
    let mode = |m: i32| {
        crust_api::v1::NamespaceMode::try_from(m)
            .map(|m| m.as_str_name().to_string())
            .unwrap_or_else(|_| m.to_string())
    };
    let dns = c.dns_config.clone().unwrap_or_default();
    json!({
        "metadata": {
            "name": md.name,
            "uid": md.uid,
            "namespace": md.namespace,
            "attempt": md.attempt,
        },
        "hostname": c.hostname,
        "log_directory": c.log_directory,
        "dns_config": {
            "servers": dns.servers,
            "searches": dns.searches,
            "options": dns.options,
        },
        "port_mappings": c.port_mappings.iter().map(|p| json!({
            "protocol": crust_api::v1::Protocol::try_from(p.protocol)
                .map(|p| p.as_str_name().to_string())
                .unwrap_or_else(|_| p.protocol.to_string()),
            "container_port": p.container_port,
            "host_port": p.host_port,
            "host_ip": p.host_ip,
        })).collect::<Vec<_>>(),
        "labels": sorted(&c.labels),
        "annotations": sorted(&c.annotations),
        "linux": {
            "cgroup_parent": linux.cgroup_parent,
            "sysctls": sorted(&linux.sysctls),
            "security_context": {
                "namespace_options": {
                    "network": mode(ns.network),
                    "pid": mode(ns.pid),
                    "ipc": mode(ns.ipc),
                    "target_id": ns.target_id,
                },
                "privileged": sc.privileged,
                "readonly_rootfs": sc.readonly_rootfs,
                "run_as_user": sc.run_as_user.map(|u| u.value),
                "run_as_group": sc.run_as_group.map(|g| g.value),
                "supplemental_groups": sc.supplemental_groups,
            },
        },
    })
}

fn sorted(m: &HashMap<String, String>) -> BTreeMap<&String, &String> {
    m.iter().collect()
}

/// Whether every namespace the pod owns is still pinned.
fn pins_intact(rec: &PodRecord) -> bool {
    [
        &rec.namespaces.net,
        &rec.namespaces.ipc,
        &rec.namespaces.uts,
    ]
    .into_iter()
    .flatten()
    .all(|p| ns::is_pinned(p))
}

async fn store_put(daemon: &Arc<Daemon>, rec: &PodRecord) -> Result<(), PodError> {
    let rec = rec.clone();
    blocking(daemon, move |d| {
        d.store
            .put(&rec)
            .map_err(|e| PodError::from(e).context("writing the pod record"))
    })
    .await
}

/// Runs blocking work (syscalls, mounts, store commits with fsync) off the
/// async workers.
async fn blocking<T: Send + 'static>(
    daemon: &Arc<Daemon>,
    f: impl FnOnce(&Daemon) -> Result<T, PodError> + Send + 'static,
) -> Result<T, PodError> {
    let d = daemon.clone();
    tokio::task::spawn_blocking(move || f(&d))
        .await
        .unwrap_or_else(|e| Err(PodError::internal("pod task", e)))
}

/// Runs a future to completion on a runtime of its own, on a thread of its
/// own: for startup recovery, which runs before the daemon serves.
fn block_on_own_runtime<F>(f: F) -> Result<F::Output, PodError>
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(f))
                .map_err(|e| PodError::internal("starting a recovery runtime", e))
        })
        .join()
        .unwrap_or_else(|_| Err(PodError::Internal("recovery thread panicked".into())))
    })
}
