//! A container's life cycle: CreateContainer (and the undo of a failed
//! one), StartContainer, StopContainer, RemoveContainer, and the calls on a
//! running container (ExecSync, ReopenContainerLog,
//! UpdateContainerResources).
//!
//! States: CREATING (record written, effects under way; invisible) ->
//! CREATED (monitor up, process not started) -> RUNNING -> EXITED. A
//! container that cannot be started is EXITED with reason StartError.
//! Stop and Remove are idempotent, also for unknown IDs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crust_api::v1::{ContainerConfig, LinuxContainerResources};
use crust_shim_protocol::{ExecRequest, ExecSyncOutput, Status};
use prost::Message;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::host::KILL_WAIT;
use super::record::{ContainerRecord, ContainerState};
use super::spec::{self, Built, Parts};
use super::validate;
use super::{ContainerError, Containers, PodView, SpecHook};
use crate::clock::now_ns;
use crate::crash;
use crate::events::EventKind;
use crate::images::ImageFacts;
use crate::index::{Entry, ReserveError};
use crate::launch::Launch;
use crate::tasks::blocking;
use crust_quote::quote;

/// An image volume of a new container: its mount's index, the image and
/// the leased layers (bottom first).
struct ImageVolume {
    index: usize,
    image_id: String,
    lowers: Vec<PathBuf>,
}

/// How long the monitor may take to create a container.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);

impl Containers {
    /// CreateContainer, with `config` from [`validate::checked_config`]
    /// and its pod as the pod is now; `hook` sees the spec before the
    /// container is created. With `restore` (a checkpoint archive, see
    /// `restore.rs`), the container's writable layer gets the archive's
    /// changes and its monitor restores the processes at StartContainer.
    pub async fn create(
        self: &Arc<Self>,
        pod: PodView,
        config: ContainerConfig,
        hook: &dyn SpecHook,
        restore: Option<PathBuf>,
    ) -> Result<String, ContainerError> {
        let md = config.metadata.clone().unwrap_or_default();
        if !pod.ready {
            return Err(ContainerError::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                pod.id
            )));
        }
        self.check_create_unified(&pod, &config)?;
        let image_name = validate::image_name(&config)?;
        let image = self
            .images
            .resolve(&image_name)
            .map_err(ContainerError::internal)?
            .ok_or_else(|| {
                ContainerError::NotFound(format!("image {} not found", quote(&image_name)))
            })?;
        let runtime = self.handlers.get(&pod.runtime_handler).ok_or_else(|| {
            ContainerError::FailedPrecondition(format!(
                "the pod's runtime handler {:?} is no longer configured",
                pod.runtime_handler
            ))
        })?;
        if restore.is_some() && !matches!(runtime, crust_shim_protocol::RuntimeConfig::Cli { .. }) {
            return Err(ContainerError::FailedPrecondition(format!(
                "the pod's runtime handler {:?} cannot restore a checkpoint (the runc handler can)",
                pod.runtime_handler
            )));
        }
        let key = (pod.id.clone(), md.name.clone(), md.attempt);
        let id = self
            .index
            .reserve(key.clone(), crate::ids::new_id)
            .map_err(|e| match e {
                ReserveError::Taken(owner) => ContainerError::AlreadyExists(format!(
                    "container name {:?} attempt {} is already in use in pod sandbox {} by \
                     container {owner}",
                    md.name, md.attempt, pod.id
                )),
                ReserveError::NewId(e) => ContainerError::internal(e),
            })?;
        // The runtime's cgroup migration waits for a grace period: started
        // now, it passes during the steps below.
        self.host.prime_cgroup_migration();
        let state_dir = self.dirs.run_dir.join(&id);
        let bundle = state_dir.join("bundle");
        let log_path = if pod.log_directory.is_empty() || config.log_path.is_empty() {
            None
        } else {
            Some(Path::new(&pod.log_directory).join(&config.log_path))
        };
        let mut rec = ContainerRecord {
            id: id.clone(),
            pod_id: pod.id.clone(),
            name: md.name.clone(),
            attempt: md.attempt,
            state: ContainerState::Creating,
            created_at: now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            reported_image: Some(super::image_names::reported(
                &image_name,
                config
                    .image
                    .as_ref()
                    .map_or("", |i| i.user_specified_image.as_str()),
                &image,
            )),
            image: image_name,
            image_id: image.id.clone(),
            labels: config.labels.clone().into_iter().collect(),
            annotations: config.annotations.clone().into_iter().collect(),
            log_path,
            config: hex::encode(config.encode_to_vec()),
            image_request: Some(config.image.clone().into()),
            handler: pod.runtime_handler.clone(),
            runtime,
            rootfs: bundle.join("rootfs"),
            bundle,
            state_dir,
            layer_dir: self.dirs.layers_dir.join(&id),
            user: None,
            resources: config
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .map(|r| hex::encode(r.encode_to_vec())),
            stop_signal: libc::SIGTERM,
            pid: 0,
            image_volumes: Default::default(),
            start_requested_at: 0,
            cgroups_path: None,
            restore,
        };
        // Not flushed by itself: the lease, the first effect, is a durable
        // commit that carries it (a crash before leaves nothing to undo).
        if let Err(e) = self.store_put_deferred(&rec).await {
            self.index.release(&key);
            return Err(e);
        }
        crash::point("container.create.record");
        if let Err(e) = self
            .create_effects(&mut rec, &pod, &config, &image, hook)
            .await
        {
            warn!(id, "container creation failed, undoing it: {e}");
            self.undo_create(&rec).await;
            self.index.release(&key);
            return Err(e);
        }
        rec.state = ContainerState::Created;
        self.store_put(&rec).await?;
        crash::point("container.create.created");
        info!(id, name = %rec.name, pod = %rec.pod_id, "container created");
        self.emit(EventKind::Created, &rec);
        self.index.publish(&id, key, rec);
        self.watch(id.clone());
        Ok(id)
    }

    /// Everything CreateContainer does to the node, in order: lease the
    /// image's layers, mount the rootfs, generate the spec, launch the
    /// monitor. Fills in what the record learns on the way.
    async fn create_effects(
        &self,
        rec: &mut ContainerRecord,
        pod: &PodView,
        config: &ContainerConfig,
        image: &ImageFacts,
        hook: &dyn SpecHook,
    ) -> Result<(), ContainerError> {
        let idmapped = super::validate::idmapped_mounts(config, pod.facts.user_ns.as_ref())?;
        let lowers =
            self.images.lease(&rec.id, &image.id).await.map_err(|e| {
                ContainerError::NotFound(format!("image {}: {e}", quote(&rec.image)))
            })?;
        crash::point("container.create.leased");
        let volumes = self.lease_image_volumes(rec, config).await?;
        let volume_ids = volumes
            .iter()
            .map(|v| (v.index, v.image_id.clone()))
            .collect();
        let target_pid_ns = self.target_pid_ns(config, &pod.id)?;
        let runtime_facts = crust_oci::RuntimeFacts {
            rro_supported: self
                .handlers
                .features(&pod.runtime_handler)
                .recursive_read_only_mounts,
            ..self.facts.clone()
        };
        let mut built = {
            let host = self.host.clone();
            let (r, pod, config, image) = (rec.clone(), pod.clone(), config.clone(), image.clone());
            let cdi_dirs = self.cdi_spec_dirs();
            blocking(move || -> Result<Built, ContainerError> {
                let lowers = match &pod.facts.user_ns {
                    Some(userns) => host.idmap_layers(&r, &lowers, userns)?,
                    None => lowers,
                };
                host.prepare_rootfs(&r, &lowers)?;
                crash::point("container.create.rootfs");
                let pod_files: Vec<&str> = [
                    ("etc/hostname", &pod.facts.hostname_file),
                    ("etc/hosts", &pod.facts.hosts),
                    ("etc/resolv.conf", &pod.facts.resolv_conf),
                ]
                .into_iter()
                .filter(|(_, f)| f.is_some())
                .map(|(rel, _)| rel)
                .collect();
                host.prepare_mount_points(&r.rootfs, &pod_files)?;
                if let Some(archive) = &r.restore {
                    host.apply_checkpoint(&r, archive)?;
                    crash::point("container.create.restored_layer");
                }
                // The working dir through the image's symlinks: a link to
                // /proc/self/fd/N is the same escape as naming it (a bad
                // path itself is refused by the spec below).
                if let Ok(cwd) = crust_oci::process_cwd(&config, &image.config) {
                    let field = if config.working_dir.is_empty() {
                        "image.config.WorkingDir"
                    } else {
                        "config.working_dir"
                    };
                    let real = host.resolve_in_rootfs(&r.rootfs, &cwd, field)?;
                    if let Some(dir) = crust_oci::magic_dir(&real) {
                        return Err(ContainerError::InvalidArgument(format!(
                            "{field}: {} leads through the image's symlinks to {}, inside {dir}, \
                             whose entries lead outside the container",
                            quote(&cwd),
                            quote(&real)
                        )));
                    }
                    // As runc and CRI-O: an image may lack its WORKDIR
                    // (libcontainer's chdir would fail opaquely).
                    host.make_working_dir(&r.rootfs, &real, field)?;
                }
                // Image volumes become read-only bind mounts of the image's
                // own read-only mount (at the sub path resolved inside it);
                // `image` stays set: the spec gives them the image volume
                // flags (ro, nosuid, nodev).
                // In a pod with its own user namespace the image's layers
                // are id-mapped under the overlay (as the rootfs's are), so
                // the volume is not id-mapped again below.
                let mut config = config;
                let mut idmapped = idmapped;
                for v in &volumes {
                    let m = &mut config.mounts[v.index];
                    let source = host.mount_image_volume(
                        &r,
                        v.index,
                        &v.lowers,
                        &m.image_sub_path,
                        pod.facts.user_ns.as_ref(),
                    )?;
                    m.host_path = source.display().to_string();
                    m.readonly = true;
                    m.image_sub_path.clear();
                    m.uid_mappings.clear();
                    m.gid_mappings.clear();
                    idmapped.retain(|&i| i != v.index);
                }
                // Volumes of a user namespace pod: id-mapped through it, so
                // the container's root owns what the host's root owns.
                if let Some(userns) = &pod.facts.user_ns {
                    for &i in &idmapped {
                        let m = &mut config.mounts[i];
                        let source = host.idmap_mount(&r, i, Path::new(&m.host_path), userns)?;
                        m.host_path = source.display().to_string();
                        m.uid_mappings.clear();
                        m.gid_mappings.clear();
                    }
                }
                let cdi_names = crust_oci::cdi::requested_devices(&config);
                let cdi = if cdi_names.is_empty() {
                    Vec::new()
                } else {
                    super::cdi::load(&cdi_dirs)
                        .resolve(&cdi_names)
                        .map_err(ContainerError::from_spec)?
                };
                let passwd = host.read_rootfs_file(&r.rootfs, "etc/passwd")?;
                let group = host.read_rootfs_file(&r.rootfs, "etc/group")?;
                let image_name = r.reported_image().name;
                let parts = Parts {
                    id: &r.id,
                    config: &config,
                    pod: &pod,
                    image_name: &image_name,
                    image: &image,
                    rootfs: &r.rootfs,
                    etc_passwd: passwd.as_deref(),
                    etc_group: group.as_deref(),
                    target_pid_ns,
                    runtime: &runtime_facts,
                    cdi: &cdi,
                };
                spec::build(&parts, host.spec_host())
            })
            .await?
        };
        if let Some(res) = hook.adjust(rec, &mut built.spec).await? {
            rec.resources = Some(hex::encode(res.encode_to_vec()));
        }
        // Whatever the hook asked for, the daemon cannot lower a process's
        // oom_score_adj below its own (no CAP_SYS_RESOURCE): raised to it,
        // as the generated spec is.
        let min_oom = self.facts.min_oom_score_adj.clamp(-1000, 1000) as i32;
        if let Some(p) = built.spec.process_mut()
            && let Some(v) = p.oom_score_adj()
            && v < min_oom
        {
            p.set_oom_score_adj(Some(min_oom));
        }
        // ContainerStatus.resources shows what the process got.
        if let Some(mut res) = rec.resources()
            && let Some(v) = built
                .spec
                .process()
                .as_ref()
                .and_then(|p| p.oom_score_adj())
            && res.oom_score_adj != i64::from(v)
        {
            res.oom_score_adj = i64::from(v);
            rec.resources = Some(hex::encode(res.encode_to_vec()));
        }
        rec.cgroups_path = built
            .spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().as_ref())
            .map(|p| p.display().to_string());
        // The spec is final from here on (NRI adjustments included).
        let unified = built
            .spec
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.unified().clone())
            .unwrap_or_default();
        let pid = self
            .host
            .launch(Launch {
                id: rec.id.clone(),
                state_dir: rec.state_dir.clone(),
                bundle: rec.bundle.clone(),
                spec: built.spec,
                runtime: rec.runtime.clone(),
                log_path: rec.log_path.clone(),
                log_directory: rec
                    .log_path
                    .as_ref()
                    .map(|_| PathBuf::from(&pod.log_directory)),
                stdin: config.stdin,
                stdin_once: config.stdin_once,
                keep_spec: true,
                timeout: CREATE_TIMEOUT,
                restore: rec
                    .restore
                    .as_ref()
                    .map(|_| crust_shim_protocol::RestoreConfig {
                        image_path: super::restore::CheckpointArchive::images_dir(&rec.layer_dir),
                        work_path: super::restore::CheckpointArchive::work_dir(&rec.layer_dir),
                    }),
            })
            .await?;
        crash::point("container.create.launched");
        rec.user = Some(built.user);
        rec.stop_signal = built.stop_signal;
        rec.image_volumes = volume_ids;
        rec.pid = pid;
        // The cgroup (scope) exists now; its process has not started yet.
        self.write_unified(rec, unified).await
    }

    /// Writes `unified` keys into the container's cgroup (see
    /// [`crate::containers::ContainerHost::write_unified`]).
    async fn write_unified(
        &self,
        rec: &ContainerRecord,
        unified: HashMap<String, String>,
    ) -> Result<(), ContainerError> {
        if unified.is_empty() {
            return Ok(());
        }
        let (host, rec) = (self.host.clone(), rec.clone());
        blocking(move || host.write_unified(&rec, &unified)).await
    }

    /// Leases the image of every image volume (`config.mounts[i].image`)
    /// for the container, so it is neither removed nor collected while the
    /// container exists; returns their layers. An image that is not there
    /// is NotFound naming the mount (kubelet pulls it first).
    async fn lease_image_volumes(
        &self,
        rec: &ContainerRecord,
        config: &ContainerConfig,
    ) -> Result<Vec<ImageVolume>, ContainerError> {
        let mut out = Vec::new();
        for (index, m) in config.mounts.iter().enumerate() {
            let Some(spec) = m.image.as_ref().filter(|i| !i.image.is_empty()) else {
                continue;
            };
            let field = format!("config.mounts[{index}].image");
            let image = self.image_volume_image(&field, spec)?;
            let lowers = self
                .images
                .lease_volume(&rec.id, index, &image.id)
                .await
                .map_err(|e| ContainerError::NotFound(format!("{field}: {e}")))?;
            out.push(ImageVolume {
                index,
                image_id: image.id,
                lowers,
            });
        }
        Ok(out)
    }

    /// The image an image volume's `spec` (`field`) names. `image_ref`, a
    /// digest (containers::validate), pins it: the image it names is
    /// mounted, or none; `image` must not name another one.
    fn image_volume_image(
        &self,
        field: &str,
        spec: &crust_api::v1::ImageSpec,
    ) -> Result<ImageFacts, ContainerError> {
        let resolve = |field: String, reference: &str| {
            self.images
                .resolve(reference)
                .map_err(|e| ContainerError::InvalidArgument(format!("{field}: {e}")))?
                .ok_or_else(|| {
                    ContainerError::NotFound(format!(
                        "{field}: image {} not found (pull it first)",
                        quote(reference)
                    ))
                })
        };
        if spec.image_ref.is_empty() {
            return resolve(field.to_string(), &spec.image);
        }
        let pinned = resolve(format!("{field}.image_ref"), &spec.image_ref)?;
        // `image` may be gone (a tag moved on, the image re-pulled under
        // another ID) while the pinned content is here: that is mounted.
        if let Ok(named) = resolve(field.to_string(), &spec.image)
            && named.id != pinned.id
        {
            return Err(ContainerError::InvalidArgument(format!(
                "{field}.image_ref: {} is image {}, but {field}.image {} is image {}",
                quote(&spec.image_ref),
                pinned.id,
                quote(&spec.image),
                named.id
            )));
        }
        Ok(pinned)
    }

    /// A new container's `unified` keys name only files of controllers
    /// its pod's cgroup gives it.
    fn check_create_unified(
        &self,
        pod: &PodView,
        config: &ContainerConfig,
    ) -> Result<(), ContainerError> {
        let Some(res) = config
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .filter(|r| !r.unified.is_empty())
        else {
            return Ok(());
        };
        let pod_cgroup = crate::cgroups::pod_cgroup_of_parent(&pod.facts.cgroup_parent)
            .map_err(|e| ContainerError::Internal(format!("the pod's cgroup: {e}")))?;
        let controllers = self.host.unified_controllers(&pod_cgroup)?;
        crate::cgroups::check_unified("config.linux.resources.unified", &res.unified, controllers)
            .map_err(ContainerError::InvalidArgument)
    }

    /// pid mode TARGET: the PID namespace of another running container of
    /// the same pod.
    fn target_pid_ns(
        &self,
        config: &ContainerConfig,
        pod_id: &str,
    ) -> Result<Option<PathBuf>, ContainerError> {
        let target = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .map(|n| n.target_id.clone())
            .unwrap_or_default();
        if target.is_empty() {
            return Ok(None);
        }
        let t = self.get(&target).map_err(|_| {
            ContainerError::NotFound(format!(
                "config.linux.security_context.namespace_options.target_id: container \
                 {target:?} not found"
            ))
        })?;
        if t.pod_id != pod_id || t.state != ContainerState::Running || t.pid <= 0 {
            return Err(ContainerError::FailedPrecondition(format!(
                "target container {target} is not running in pod sandbox {pod_id}"
            )));
        }
        Ok(Some(PathBuf::from(format!("/proc/{}/ns/pid", t.pid))))
    }

    /// Undoes a failed create: the node, the lease, the record (if the
    /// node could be cleaned; else the record stays for the next start).
    async fn undo_create(&self, rec: &ContainerRecord) {
        match self.teardown(rec).await {
            Ok(()) => {
                let _ = self.images.release(&rec.id).await;
                let _ = self.store_delete(&rec.id).await;
            }
            Err(c) => warn!(id = %rec.id, "undoing the failed container failed: {c}"),
        }
    }

    /// StartContainer.
    pub async fn start(&self, id: &str) -> Result<(), ContainerError> {
        let entry = self.get_entry(id)?;
        let op = entry.lock().await;
        if op.is_removed() {
            return Err(ContainerError::NotFound(format!(
                "container {id:?} not found"
            )));
        }
        let mut rec = self.refresh(&entry);
        if rec.state != ContainerState::Created {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {} is {}, not CREATED",
                rec.id,
                rec.state.as_str()
            )));
        }
        // Not recorded first: a start cut short (a daemon crash, a failed
        // write) is looked up at the monitor, which also knows when it
        // started the process (recovery), never guessed.
        crash::point("container.start.begun");
        let started = match self.host.start(&rec.state_dir).await {
            Ok(()) => Ok(()),
            // A start that got to the monitor before (the record did not
            // learn of it): the monitor says whether the process runs.
            Err(e) => match self.host.monitor_status(&rec.state_dir).await {
                Some(Status::Running) => {
                    warn!(id = %rec.id, "the container had been started already: {}", e.message());
                    Ok(())
                }
                _ => Err(e),
            },
        };
        crash::point("container.start.started");
        if let Err(e) = started {
            // The container cannot run any more; it shows as exited.
            rec.state = ContainerState::Exited;
            rec.started_at = 0;
            rec.finished_at = now_ns();
            rec.exit_code = 128;
            rec.reason = "StartError".into();
            rec.message = e.message().to_string();
            let _ = self.store_put(&rec).await;
            self.emit(EventKind::Stopped, &rec);
            entry.set(rec);
            return Err(ContainerError::Internal(format!(
                "starting container {id}: {}",
                e.message()
            )));
        }
        rec.state = ContainerState::Running;
        rec.started_at = now_ns();
        if rec.restore.is_some() {
            // The restored init's pid is known only now; the CRIU images
            // are not needed any more.
            if let Some(pid) = self.host.monitor_pid(&rec.state_dir).await {
                rec.pid = pid;
            }
            let dir = rec.layer_dir.join(super::restore::RESTORE_DIR);
            let _ = blocking(move || {
                match std::fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        warn!("removing the CRIU images {}: {e}", dir.display())
                    }
                    _ => {}
                }
                Ok::<(), ContainerError>(())
            })
            .await;
        }
        self.store_put(&rec).await?;
        crash::point("container.start.running");
        entry.set(rec.clone());
        self.emit(EventKind::Started, &rec);
        info!(id = %rec.id, "container started");
        // A container that exited at once is reported so.
        self.refresh(&entry);
        Ok(())
    }

    /// StopContainer: the stop signal, SIGKILL after `timeout` seconds.
    /// Idempotent; unknown IDs succeed.
    pub async fn stop(&self, id: &str, timeout: i64) -> Result<(), ContainerError> {
        let Some(entry) = self.resolve(id)? else {
            return Ok(());
        };
        let op = entry.lock().await;
        if op.is_removed() {
            return Ok(());
        }
        self.stop_locked(&entry, timeout).await
    }

    async fn stop_locked(
        &self,
        entry: &Entry<ContainerRecord>,
        timeout: i64,
    ) -> Result<(), ContainerError> {
        let rec = self.refresh(entry);
        if !rec.state.is_live() {
            return Ok(());
        }
        let signal = if timeout <= 0 || rec.state == ContainerState::Created {
            libc::SIGKILL
        } else {
            rec.stop_signal
        };
        if let Err(e) = self.host.kill(&rec.state_dir, signal, false).await {
            debug!(id = %rec.id, "stop signal: {e}");
        }
        crash::point("container.stop.signalled");
        if signal != libc::SIGKILL {
            let grace = Duration::from_secs(timeout.clamp(0, 24 * 3600) as u64);
            if self.wait_exit(entry, grace).await {
                return Ok(());
            }
        }
        if signal != libc::SIGKILL || rec.state == ContainerState::Running {
            let _ = self.host.kill(&rec.state_dir, libc::SIGKILL, true).await;
            crash::point("container.stop.killed");
        }
        if self.wait_exit(entry, KILL_WAIT).await {
            return Ok(());
        }
        Err(ContainerError::Internal(format!(
            "container {} did not exit after SIGKILL",
            rec.id
        )))
    }

    /// Waits (reading the exit file) until the container has exited.
    async fn wait_exit(&self, entry: &Entry<ContainerRecord>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let rec = self.refresh(entry);
            if rec.state == ContainerState::Exited {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// RemoveContainer: stops it (SIGKILL) if needed, then removes its
    /// rootfs, bundle, monitor state, image lease and record; the log file
    /// stays. Idempotent; unknown IDs succeed. Returns the ID of the
    /// container it removed.
    pub async fn remove(&self, id: &str) -> Result<Option<String>, ContainerError> {
        let Some(entry) = self.resolve(id)? else {
            return Ok(None);
        };
        let mut op = entry.lock().await;
        if op.is_removed() {
            return Ok(None);
        }
        self.stop_locked(&entry, 0).await?;
        crash::point("container.remove.stopped");
        let rec = entry.snapshot();
        self.teardown(&rec).await?;
        crash::point("container.remove.torn_down");
        // The image leases and the record go in one durable commit (a
        // crash before it leaves both, and recovery finishes the remove).
        let id = rec.id.clone();
        self.images
            .release_with(
                &rec.id,
                &self.store,
                Box::new(move |tx| tx.delete::<ContainerRecord>(&id).map(drop)),
            )
            .await
            .map_err(|e| {
                ContainerError::Internal(format!(
                    "releasing the image of {} and deleting its record: {e}",
                    rec.id
                ))
            })?;
        crash::point("container.remove.deleted");
        self.index.unpublish(&rec.id, &rec.name_key());
        op.mark_removed();
        self.emit(EventKind::Deleted, &rec);
        info!(id = %rec.id, "container removed");
        Ok(Some(rec.id))
    }

    /// Stops (timeout 0) every container of a pod, at once.
    pub async fn stop_all_of_pod(self: &Arc<Self>, pod_id: &str) -> Result<(), ContainerError> {
        self.for_all_of_pod(pod_id, |cs, id| async move { cs.stop(&id, 0).await })
            .await
            .map(drop)
    }

    /// Removes every container of a pod, at once; returns the IDs removed.
    pub async fn remove_all_of_pod(
        self: &Arc<Self>,
        pod_id: &str,
    ) -> Result<Vec<String>, ContainerError> {
        self.for_all_of_pod(pod_id, |cs, id| async move { cs.remove(&id).await })
            .await
            .map(|ids| ids.into_iter().flatten().collect())
    }

    /// Runs `op` on every container of the pod, concurrently; the first
    /// error, once all are done.
    async fn for_all_of_pod<T, F>(
        self: &Arc<Self>,
        pod_id: &str,
        op: impl Fn(Arc<Containers>, String) -> F,
    ) -> Result<Vec<T>, ContainerError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ContainerError>> + Send + 'static,
    {
        let tasks: Vec<_> = self
            .ids_of_pod(pod_id)
            .into_iter()
            .map(|id| tokio::spawn(op(self.clone(), id)))
            .collect();
        let mut done = Vec::new();
        let mut first_err = None;
        for t in tasks {
            match t.await.map_err(ContainerError::from) {
                Ok(Ok(v)) => done.push(v),
                Ok(Err(e)) | Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(done), Err)
    }

    /// ExecSync: runs `cmd` in a running container.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_s: i64,
    ) -> Result<ExecSyncOutput, ContainerError> {
        validate::check_exec_sync(&cmd, timeout_s)?;
        let rec = self.get(id)?;
        if rec.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {} is not running",
                rec.id
            )));
        }
        let req = ExecRequest {
            args: cmd,
            timeout_ms: (timeout_s as u64).saturating_mul(1000),
            ..Default::default()
        };
        crash::point("container.exec_sync.begun");
        let out = self.host.exec_sync(&rec.state_dir, &req).await?;
        crash::point("container.exec_sync.done");
        if out.timed_out {
            return Err(ContainerError::DeadlineExceeded(format!(
                "command timeout {timeout_s}s exceeded"
            )));
        }
        Ok(out)
    }

    /// ReopenContainerLog.
    pub async fn reopen_log(&self, id: &str) -> Result<(), ContainerError> {
        let rec = self.get(id)?;
        if rec.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {} is not running",
                rec.id
            )));
        }
        self.host.reopen_log(&rec.state_dir).await
    }

    /// UpdateContainerResources: validated, merged into the container's
    /// resources, applied live through the monitor (oom_score_adj by the
    /// daemon, to every process of the container), then recorded for
    /// ContainerStatus.
    pub async fn update(
        &self,
        id: &str,
        resources: Option<LinuxContainerResources>,
    ) -> Result<(), ContainerError> {
        let entry = self.get_entry(id)?;
        let _op = entry.lock().await;
        let mut rec = self.refresh(&entry);
        let Some(res) = resources else {
            return Ok(());
        };
        if !rec.state.is_live() {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {} is not running",
                rec.id
            )));
        }
        if !res.unified.is_empty() {
            let cg = self.host.container_cgroup(&rec).ok_or_else(|| {
                ContainerError::FailedPrecondition(format!(
                    "container {}: its cgroup is unknown",
                    rec.id
                ))
            })?;
            let controllers = self.host.unified_controllers(cg.path())?;
            crate::cgroups::check_unified("linux.unified", &res.unified, controllers)
                .map_err(ContainerError::InvalidArgument)?;
        }
        // A huge page limit needs hugetlb in the container's own cgroup,
        // which the systemd driver does not delegate to scopes: refused
        // rather than dropped.
        if self.facts.cgroup_v2
            && let Some(i) = res.hugepage_limits.iter().position(|h| h.limit > 0)
            && let Some(cg) = self.host.container_cgroup(&rec)
            && let Some(controllers) = self.host.unified_controllers(cg.path())?
            && !controllers.contains(crust_cgroups::Controller::Hugetlb)
        {
            return Err(ContainerError::InvalidArgument(format!(
                "linux.hugepage_limits[{i}]: the container's cgroup has no hugetlb controller \
                 (enabled: {controllers})"
            )));
        }
        // The request checked on its own first (errors name what it sent),
        // then merged into what is set: fields it leaves at zero stay.
        crust_oci::linux_resources("linux", &res, &self.facts)
            .map_err(ContainerError::from_spec)?;
        let oom = (res.oom_score_adj != 0)
            .then(|| {
                crust_oci::effective_oom_score_adj("linux", &res, self.facts.min_oom_score_adj)
            })
            .transpose()
            .map_err(ContainerError::from_spec)?;
        let mut merged = crust_oci::merge_resources(&rec.resources().unwrap_or_default(), &res);
        if let Some(v) = oom {
            merged.oom_score_adj = i64::from(v);
        }
        let oci = crust_oci::linux_resources("linux", &merged, &self.facts)
            .map_err(ContainerError::from_spec)?;
        let oci = serde_json::to_value(&oci).map_err(ContainerError::internal)?;
        self.host.update(&rec.state_dir, &oci).await?;
        if let Some(v) = oom {
            let (host, r) = (self.host.clone(), rec.clone());
            blocking(move || host.set_oom_score_adj(&r, v)).await?;
        }
        crash::point("container.update.applied");
        // The keys in force (earlier requests' merged with this one's, as
        // with runc) go into the cgroup again: the update may have
        // rewritten files they set (systemd rewrites what its properties
        // manage).
        let mut keys = merged.unified.clone();
        if self.facts.cgroup_v2 {
            // runc's update leaves huge page limits as they were: on v2
            // they are plain interface files, written like the keys.
            for h in merged.hugepage_limits.iter().filter(|h| h.limit > 0) {
                keys.insert(format!("hugetlb.{}.max", h.page_size), h.limit.to_string());
            }
        }
        self.write_unified(&rec, keys).await?;
        rec.resources = Some(hex::encode(merged.encode_to_vec()));
        self.store_put(&rec).await?;
        entry.set(rec);
        Ok(())
    }

    /// Undoes everything a container's record says it may have on the
    /// node (but the image lease and the record): the monitor (or, without
    /// one, what is left in the cgroup), the runtime's state, the rootfs
    /// mount, the state and layer dirs. Idempotent.
    pub(super) async fn teardown(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        let orphan = !self.host.reap_monitor(&rec.state_dir).await;
        crash::point("container.teardown.monitor");
        let (host, rec) = (self.host.clone(), rec.clone());
        blocking(move || {
            if orphan {
                host.kill_orphan(&rec);
            }
            host.delete_runtime_state(&rec);
            host.unmount_rootfs(&rec.rootfs)?;
            host.unmount_private_mounts(&rec)?;
            crash::point("container.teardown.unmounted");
            host.remove_tree(&rec.state_dir)?;
            host.remove_tree(&rec.layer_dir)
        })
        .await
    }

    pub(super) async fn store_put(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        let (store, rec) = (self.store.clone(), rec.clone());
        blocking(move || Ok(store.put(&rec)?)).await
    }

    /// [`crust_store::Store::put_deferred`].
    async fn store_put_deferred(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        let (store, rec) = (self.store.clone(), rec.clone());
        blocking(move || Ok(store.put_deferred(&rec)?)).await
    }

    pub(super) async fn store_delete(&self, id: &str) -> Result<(), ContainerError> {
        let (store, id) = (self.store.clone(), id.to_string());
        blocking(move || Ok(store.delete::<ContainerRecord>(&id).map(drop)?)).await
    }
}
