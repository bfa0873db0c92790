//! A pod's life cycle: RunPodSandbox (and the undo of a failed one),
//! StopPodSandbox and RemovePodSandbox. The pod's containers are not this
//! module's business: `crate::lifecycle` stops or removes them first.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use crust_api::v1::LinuxContainerResources;
use crust_linux::ns::{self, NamespaceKind, PinOptions};
use crust_network::config::NetworkConfigList;
use crust_network::{Attachment, DEFAULT_IFNAME, DelAttempt, RuntimeCapabilities};
use tracing::{Instrument, error, info, warn};

use super::host::PodHost;
use super::record::{self, NamespacePaths, NetworkRecord, PodRecord, PodState};
use super::spec::PodSpec;
use super::{PodError, PodOp, Pods, files, name_key, pause};
use crate::clock::now_ns;
use crate::crash;
use crate::otel::step;
use crate::tasks::blocking;

impl Pods {
    /// RunPodSandbox: sets the pod up and returns its ID. On any failure
    /// everything created is undone and the cause returned.
    ///
    /// `before_publish` sees the ready pod before it becomes visible (List,
    /// Status) or takes containers (NRI plugins' RunPodSandbox); its error
    /// fails the call like any other step. What it returns is kept until
    /// the pod is visible, then dropped (a guard).
    pub async fn run<G, F, Fut>(&self, spec: PodSpec, before_publish: F) -> Result<String, PodError>
    where
        F: FnOnce(PodRecord) -> Fut,
        Fut: Future<Output = Result<G, PodError>>,
    {
        if let Some(m) = &spec.userns {
            self.check_root_searchable(m).await?;
        }
        let network = if spec.host_network {
            None
        } else {
            Some(self.host.load_network()?)
        };
        let id = self.reserve(&spec.metadata)?;
        let rec = match self.plan(&id, &spec, network) {
            Ok(rec) => rec,
            Err(e) => {
                self.index.release(&name_key(&spec.metadata));
                return Err(e);
            }
        };
        let spec = Arc::new(spec);

        // 1. The record, then the dirs and the namespaces: CNI ADD needs
        // the pinned netns, nothing else of the pod.
        let res = {
            let (store, host, rec, spec) = (
                self.store.clone(),
                self.host.clone(),
                rec.clone(),
                spec.clone(),
            );
            blocking(move || {
                store
                    .put(&rec)
                    .map_err(|e| PodError::from(e).context("writing the pod record"))?;
                crash::point("pod.run.record");
                create_namespaces(&*host, &rec, &spec)
            })
            .instrument(step!("pod.setup"))
            .await
        };
        let mut rec = rec;
        if let Err(e) = res {
            // ADD has not started: no DEL is owed.
            if let Some(net) = rec.network.as_mut() {
                net.attached = false;
            }
            return Err(self.rollback(rec, e).await);
        }

        // 2. CNI ADD alongside the rest of the set-up (cgroup, /dev/shm,
        // the /etc files, the pause process): the plugins take most of a
        // pod's start and need none of it. Both halves always run to
        // their end, so a failure of one is undone with all the other made.
        let local = async {
            let (host, r, spec) = (self.host.clone(), rec.clone(), spec.clone());
            blocking(move || create_local(&*host, &r, &spec))
                .instrument(step!("pod.setup.local"))
                .await?;
            if pause::shares_pid(&rec) {
                let started = self
                    .host
                    .start_pause(&rec, &self.oci_facts(&rec))
                    .instrument(step!("pause.start"))
                    .await;
                crash::point("pod.run.pause");
                started?;
            }
            Ok::<(), PodError>(())
        };
        let add = async {
            let net = rec.network.as_ref()?;
            let added = self
                .host
                .cni_add(&net.config, &net.attachment)
                .instrument(step!("cni.add", network = %net.config.name))
                .await;
            crash::point("pod.run.cni_added");
            Some(added)
        };
        let (local, added) = tokio::join!(local, add);
        let mut failed = local.err();
        if let (Some(added), Some(net)) = (added, rec.network.as_mut()) {
            let add_failed = match added {
                Ok(added) => {
                    net.result = Some(added.raw);
                    net.ips = added.ips.iter().map(ToString::to_string).collect();
                    added.ips.is_empty().then(|| {
                        PodError::Internal(format!(
                            "CNI network {:?} gave the pod no IP address on {}",
                            net.config.name, net.attachment.ifname
                        ))
                    })
                }
                Err(failed) => {
                    net.attached = failed.del_owed;
                    Some(failed.error)
                }
            };
            if let Some(e) = add_failed {
                match &failed {
                    // The set-up's own error is the cause reported; the
                    // ADD's is logged (both are undone alike).
                    Some(_) => warn!(id = %rec.id, "CNI ADD failed too: {e}"),
                    None => failed = Some(e),
                }
            }
        }
        if let Some(e) = failed {
            return Err(self.rollback(rec, e).await);
        }

        // 3. Sysctls and /etc/hosts, then the record says ready.
        rec.state = PodState::Ready;
        let res = {
            let (store, host, rec, spec) = (
                self.store.clone(),
                self.host.clone(),
                rec.clone(),
                spec.clone(),
            );
            blocking(move || {
                finish_local(&*host, &rec, &spec)?;
                crash::point("pod.run.finished");
                store
                    .put(&rec)
                    .map_err(|e| PodError::from(e).context("writing the pod record"))
            })
            .await
        };
        crash::point("pod.run.ready");
        if let Err(e) = res {
            rec.state = PodState::Creating;
            return Err(self.rollback(rec, e).await);
        }
        let guard = match before_publish(rec.clone()).await {
            Ok(g) => g,
            Err(e) => return Err(self.rollback(rec, e).await),
        };
        info!(
            id = %rec.id,
            name = %rec.metadata.name,
            namespace = %rec.metadata.namespace,
            ips = ?rec.ips(),
            "pod sandbox ready"
        );
        self.publish(rec);
        drop(guard);
        Ok(id)
    }

    /// StopPodSandbox's own part, once the pod's containers are stopped:
    /// the pause process goes, the pod becomes NOTREADY and leaves its
    /// network. A failed DEL is returned and retried by the next Stop or
    /// Remove.
    pub async fn stop(&self, op: &PodOp) -> Result<(), PodError> {
        let entry = op.entry();
        let mut rec = entry.snapshot();
        // A ready pod has had no DEL: only the stop that makes it NOTREADY
        // runs the first. A NOTREADY pod still attached had one cut short
        // or failed (or its creation's undo did, or recovery found its
        // namespaces gone).
        let attempt = if rec.state == PodState::Ready {
            DelAttempt::First
        } else {
            DelAttempt::Repeat
        };
        self.host.stop_pause(&rec).await?;
        crash::point("pod.stop.pause");
        if rec.state == PodState::Ready {
            rec.state = PodState::NotReady;
            self.store_put(&rec).await?;
            crash::point("pod.stop.not_ready");
            entry.set(rec.clone());
            info!(id = %rec.id, name = %rec.metadata.name, "pod sandbox stopped");
        }
        if rec.network_attached() {
            self.del_network(&rec, attempt).await?;
            crash::point("pod.stop.cni_deleted");
            if let Some(net) = rec.network.as_mut() {
                net.attached = false;
            }
            self.store_put(&rec).await?;
            crash::point("pod.stop.detached");
            entry.set(rec);
        }
        Ok(())
    }

    /// UpdatePodSandboxResources' own part: the pod cgroup gets the pod's
    /// resources plus its overhead (as kubelet sizes it); its containers'
    /// cgroups are not touched. Only a ready pod's.
    pub async fn update_resources(
        &self,
        op: &PodOp,
        overhead: Option<&LinuxContainerResources>,
        resources: Option<&LinuxContainerResources>,
    ) -> Result<(), PodError> {
        let rec = op.entry().snapshot();
        if rec.state != PodState::Ready {
            return Err(PodError::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                rec.id
            )));
        }
        let combined =
            crust_oci::pod_cgroup_resources(overhead, resources, self.host.runtime_facts())
                .map_err(|e| PodError::InvalidArgument(e.to_string()))?;
        let host = self.host.clone();
        tokio::task::spawn_blocking(move || {
            host.update_cgroup(&rec.cgroup_path, rec.slice.as_ref(), &combined)
        })
        .await
        .map_err(|e| PodError::Internal(e.to_string()))?
    }

    /// RemovePodSandbox's own part, once the pod's containers are removed
    /// and [`Pods::stop`] is done: the namespaces, /dev/shm, the cgroup, the
    /// files and the record.
    pub async fn remove(&self, mut op: PodOp) -> Result<(), PodError> {
        let rec = op.entry().snapshot();
        self.teardown_local(&rec).await?;
        crash::point("pod.remove.torn_down");
        // Last: a crash before this leaves a record whose teardown the next
        // Remove repeats.
        {
            let (store, id) = (self.store.clone(), rec.id.clone());
            blocking(move || {
                store
                    .delete::<PodRecord>(&id)
                    .map_err(|e| PodError::from(e).context("deleting the pod record"))
            })
            .await?;
        }
        crash::point("pod.remove.deleted");
        self.index.unpublish(&rec.id, &name_key(&rec.metadata));
        op.mark_removed();
        info!(id = %rec.id, name = %rec.metadata.name, "pod sandbox removed");
        Ok(())
    }

    /// Reserves the pod's name and picks its ID.
    fn reserve(&self, md: &record::PodMetadata) -> Result<String, PodError> {
        use crate::index::ReserveError;
        self.index
            .reserve(name_key(md), crate::ids::new_id)
            .map_err(|e| match e {
                ReserveError::Taken(owner) => PodError::AlreadyExists(format!(
                    "pod sandbox name {:?} (namespace {:?}, uid {:?}, attempt {}) is already \
                     used by pod sandbox {owner}",
                    md.name, md.namespace, md.uid, md.attempt
                )),
                ReserveError::NewId(e) => PodError::internal("generating a pod sandbox ID", e),
            })
    }

    pub(super) fn publish(&self, rec: PodRecord) {
        self.index
            .publish(&rec.id.clone(), name_key(&rec.metadata), rec);
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
            user: spec.userns.as_ref().map(|_| ns::user_pin_path(&ns_dir)),
            user_mappings: spec.userns.as_ref().map(|m| {
                let t = |m: &ns::IdMap| (m.container_id, m.host_id, m.length);
                [t(&m.uids[0]), t(&m.gids[0])]
            }),
        };
        let driver = if self.systemd {
            crust_cgroups::Driver::Systemd
        } else {
            crust_cgroups::Driver::Cgroupfs
        };
        let (cgroup_path, slice) = crate::cgroups::plan_pod(driver, &spec.cgroup_parent, id, |p| {
            self.host.cgroup_exists(Path::new(p.as_str()))
        })
        .map_err(|e| PodError::cgroup("config.linux.cgroup_parent", e))?;
        let cgroup_path = std::path::PathBuf::from(cgroup_path.as_str());
        self.check_unified(spec, &cgroup_path)?;
        let hostname = if spec.hostname.is_empty() {
            self.host.node_hostname()?
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
            slice,
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

    /// The pod's `unified` resources (kubelet's pod-level resources and
    /// overhead) name only files of controllers the pod cgroup has.
    fn check_unified(&self, spec: &PodSpec, cgroup: &Path) -> Result<(), PodError> {
        let Some(linux) = spec.config.linux.as_ref() else {
            return Ok(());
        };
        for (field, res) in [
            ("config.linux.resources.unified", &linux.resources),
            ("config.linux.overhead.unified", &linux.overhead),
        ] {
            let Some(res) = res.as_ref().filter(|r| !r.unified.is_empty()) else {
                continue;
            };
            let controllers = self.host.unified_controllers(cgroup)?;
            crate::cgroups::check_unified(field, &res.unified, controllers)
                .map_err(PodError::InvalidArgument)?;
        }
        Ok(())
    }

    /// Undoes a failed RunPodSandbox and returns its cause. When the
    /// undoing fails too, the pod is kept (NOTREADY, visible) so that
    /// RemovePodSandbox retries it, and the error says so.
    async fn rollback(&self, rec: PodRecord, cause: PodError) -> PodError {
        warn!(id = %rec.id, "pod sandbox creation failed, undoing it: {cause}");
        // After a finished ADD, this DEL is the first; without a result
        // the ADD's own cleanup failed (a DEL is owed after a failed one).
        let attempt = match rec.network.as_ref().and_then(|n| n.result.as_ref()) {
            Some(_) => DelAttempt::First,
            None => DelAttempt::Repeat,
        };
        match self.teardown(&rec, attempt).await {
            Ok(()) => {
                crash::point("pod.rollback.torn_down");
                let (store, id) = (self.store.clone(), rec.id.clone());
                let deleted =
                    blocking(move || Ok::<_, PodError>(store.delete::<PodRecord>(&id)?)).await;
                if let Err(e) = deleted {
                    // Undone on the host; the next start removes the record.
                    warn!(id = %rec.id, "cannot delete the record of an undone pod: {e}");
                }
                self.index.release(&name_key(&rec.metadata));
                cause
            }
            Err(cleanup) => {
                error!(id = %rec.id, "undoing the failed pod sandbox failed: {cleanup}");
                let mut rec = rec;
                rec.state = PodState::NotReady;
                if let Err(e) = self.store_put(&rec).await {
                    warn!(id = %rec.id, "cannot store the pod left behind: {e}");
                }
                let id = rec.id.clone();
                self.publish(rec);
                cause.context(format!(
                    "(cleaning up also failed, pod sandbox {id} is left NOTREADY for \
                     RemovePodSandbox to retry: {cleanup})"
                ))
            }
        }
    }

    /// Network first (while the namespace is pinned), then the rest.
    pub(super) async fn teardown(
        &self,
        rec: &PodRecord,
        attempt: DelAttempt,
    ) -> Result<(), PodError> {
        self.del_network(rec, attempt).await?;
        self.teardown_local(rec).await
    }

    /// CNI DEL, if one is owed. Without a result (ADD not finished) the CNI
    /// cache has it, if ADD got that far.
    async fn del_network(&self, rec: &PodRecord, attempt: DelAttempt) -> Result<(), PodError> {
        let Some(net) = rec.network.as_ref().filter(|n| n.attached) else {
            return Ok(());
        };
        self.host
            .cni_del(&net.config, &net.attachment, net.result.as_ref(), attempt)
            .instrument(step!("cni.del", network = %net.config.name))
            .await
    }

    /// Undoes everything but the network, in reverse order of creation.
    /// Idempotent. Every step runs; the errors are collected.
    async fn teardown_local(&self, rec: &PodRecord) -> Result<(), PodError> {
        let mut errors: Vec<String> = Vec::new();
        if let Err(e) = self.host.stop_pause(rec).await {
            errors.push(format!("stopping the pause process: {e}"));
        }
        crash::point("pod.teardown.pause");
        let (host, rec) = (self.host.clone(), rec.clone());
        let errors = blocking(move || {
            teardown_files(&*host, &rec, &mut errors);
            Ok::<_, PodError>(errors)
        })
        .await?;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(PodError::Internal(errors.join("; ")))
        }
    }

    pub(super) async fn store_put(&self, rec: &PodRecord) -> Result<(), PodError> {
        let (store, rec) = (self.store.clone(), rec.clone());
        blocking(move || {
            store
                .put(&rec)
                .map_err(|e| PodError::from(e).context("writing the pod record"))
        })
        .await
    }
}

/// The host-side effects before CNI ADD: dirs and namespaces (with the
/// hostname). Blocking.
fn create_namespaces(host: &dyn PodHost, rec: &PodRecord, spec: &PodSpec) -> Result<(), PodError> {
    // Not recursive: the ID is new, so an existing dir is an error.
    host.create_dir(&rec.run_dir)?;
    host.create_dir(&rec.state_dir)?;
    crash::point("pod.run.dirs");
    let own_uts = rec.namespaces.uts.is_some();
    let opts = PinOptions {
        net: rec.namespaces.net.is_some(),
        ipc: rec.namespaces.ipc.is_some(),
        uts: own_uts,
        hostname: (own_uts && !spec.hostname.is_empty()).then(|| spec.hostname.clone()),
        // Applied after CNI ADD, so eth0's sysctls exist too.
        sysctls: Vec::new(),
        loopback_up: true,
        userns: spec.userns.clone(),
    };
    if opts.net || opts.ipc || opts.uts || opts.userns.is_some() {
        host.pin_namespaces(&rec.ns_dir, &opts)?;
        crash::point("pod.run.pinned");
    }
    Ok(())
}

/// The host-side effects CNI ADD does not need, run alongside it: cgroup,
/// /dev/shm, hostname and resolv.conf (and hosts for a host-network pod).
/// Blocking.
fn create_local(host: &dyn PodHost, rec: &PodRecord, spec: &PodSpec) -> Result<(), PodError> {
    host.create_cgroup(&rec.cgroup_path, rec.slice.as_ref())?;
    crash::point("pod.run.cgroup");
    if let Some(shm) = &rec.shm {
        host.mount_shm(shm)?;
        crash::point("pod.run.shm");
    }
    host.write_file(&rec.hostname_path, &files::hostname(&rec.hostname))?;
    let resolv = match &spec.dns {
        Some(dns) => files::resolv_conf(dns),
        None => host.read_node_file(Path::new("/etc/resolv.conf"))?,
    };
    host.write_file(&rec.resolv_conf_path, &resolv)?;
    let hosts = if rec.host_network {
        let node = host.read_node_file(Path::new("/etc/hosts"))?;
        if node.is_empty() {
            files::hosts(&rec.hostname, &[])
        } else {
            node
        }
    } else {
        files::hosts(&rec.hostname, &[])
    };
    host.write_file(&rec.hosts_path, &hosts)
}

/// After CNI ADD: sysctls inside the pod's namespaces, and the pod IPs in
/// /etc/hosts. Blocking.
fn finish_local(host: &dyn PodHost, rec: &PodRecord, spec: &PodSpec) -> Result<(), PodError> {
    if !spec.sysctls.is_empty() {
        host.apply_sysctls(rec, &spec.sysctls)?;
    }
    if let Some(net) = &rec.network {
        let ips: Vec<IpAddr> = net.ips.iter().filter_map(|ip| ip.parse().ok()).collect();
        host.write_file(&rec.hosts_path, &files::hosts(&rec.hostname, &ips))?;
    }
    Ok(())
}

/// [`Pods::teardown_local`] after the pause process: namespaces, /dev/shm,
/// cgroup, dirs. Blocking.
fn teardown_files(host: &dyn PodHost, rec: &PodRecord, errors: &mut Vec<String>) {
    if let Err(e) = host.unpin_namespaces(&rec.ns_dir) {
        errors.push(e.to_string());
    }
    crash::point("pod.teardown.unpinned");
    if let Some(shm) = &rec.shm
        && let Err(e) = host.unmount_shm(shm)
    {
        errors.push(e.to_string());
    }
    crash::point("pod.teardown.shm");
    if let Err(e) = host.delete_cgroup(&rec.cgroup_path, rec.slice.as_ref()) {
        errors.push(e.to_string());
    }
    crash::point("pod.teardown.cgroup");
    if let Err(e) = host.remove_tree(&rec.state_dir) {
        errors.push(e.to_string());
    }
    // Only once nothing can be mounted below it any more.
    if errors.is_empty()
        && let Err(e) = host.remove_empty_dir(&rec.run_dir)
    {
        errors.push(e.to_string());
    }
}
