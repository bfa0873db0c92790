//! Containers: create (overlay rootfs over the image's leased layers, OCI
//! bundle, monitor), start, stop, remove, status, exec-sync, logs, stats and
//! recovery after a daemon restart.
//!
//! Every container has a record in the store, written (state `creating`)
//! before CreateContainer touches the host and holding every path its
//! effects have, so tearing it down (also after a crash at any step) needs
//! nothing but the record. The monitor (`crust-shim`) owns the running
//! container; its exit file is the durable record of how it ended, read
//! lazily (status, list, stop) and by a watcher task that emits the STOPPED
//! event.

pub mod handlers;
mod host;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crust_api::v1::{ContainerConfig, LinuxContainerResources};
use crust_oci::{ErrorClass, ImageConfig, PodFacts, RuntimeFacts, SpecInput};
use crust_shim_protocol::Shim as AsyncShim;
use crust_shim_protocol::blocking::Shim;
use crust_shim_protocol::{ExecRequest, RuntimeConfig, ShimConfig, SpawnOptions};
use crust_store::Store;
use prost::Message;
use tokio::sync::broadcast;
use tonic::Status;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::daemon::Daemon;
use crate::pods::{PodRecord, PodState};
pub use host::runtime_facts as host_facts;
pub use record::{ContainerRecord, ContainerState};

/// Largest /etc/passwd or /etc/group read from an image.
const MAX_ETC_FILE: u64 = 4 << 20;
/// How long the monitor may take to create a container.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a SIGKILLed container may take to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(15);

/// What happened to a container (GetContainerEvents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    pub container_id: String,
    pub pod_id: String,
    pub at: i64,
}

pub struct Entry {
    /// Shared, so listing clones a pointer, not the record.
    rec: Mutex<Arc<ContainerRecord>>,
    /// Serializes start/stop/remove; true once removed.
    op: tokio::sync::Mutex<bool>,
}

impl Entry {
    pub fn snapshot(&self) -> ContainerRecord {
        ContainerRecord::clone(&self.view())
    }
    /// The current record, without copying it.
    pub fn view(&self) -> Arc<ContainerRecord> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn set(&self, rec: ContainerRecord) {
        *self.rec.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(rec);
    }
}

type NameKey = (String, String, u32);

#[derive(Default)]
struct Index {
    by_id: HashMap<String, Arc<Entry>>,
    names: HashMap<NameKey, String>,
}

/// The previous CPU sample of a container, for usage_nano_cores.
#[derive(Clone, Copy)]
pub struct CpuSample {
    pub at: i64,
    pub usage_ns: u64,
}

pub struct Containers {
    index: Mutex<Index>,
    store: Arc<Store>,
    pub handlers: BTreeMap<String, RuntimeConfig>,
    pub features: BTreeMap<String, handlers::HandlerFeatures>,
    pub facts: RuntimeFacts,
    shim_binary: PathBuf,
    run_dir: PathBuf,
    layers_dir: PathBuf,
    pub events: broadcast::Sender<Event>,
    pub cpu_samples: Mutex<HashMap<String, CpuSample>>,
    cgroup_hierarchy: crust_linux::cgroups::Hierarchy,
}

impl Containers {
    /// `handlers` from [`handlers::resolve`], `features` detected for them.
    pub fn new(
        config: &Config,
        store: &Arc<Store>,
        facts: RuntimeFacts,
        cgroup_hierarchy: crust_linux::cgroups::Hierarchy,
        handlers: BTreeMap<String, RuntimeConfig>,
        features: BTreeMap<String, handlers::HandlerFeatures>,
    ) -> Containers {
        Containers {
            index: Mutex::new(Index::default()),
            store: store.clone(),
            features,
            handlers,
            facts,
            shim_binary: handlers::shim_binary(config),
            run_dir: config.run_dir.join("containers"),
            layers_dir: crate::daemon::containers_dir(config),
            events: broadcast::channel(1024).0,
            cpu_samples: Mutex::new(HashMap::new()),
            cgroup_hierarchy,
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, kind: EventKind, rec: &ContainerRecord) {
        let _ = self.events.send(Event {
            kind,
            container_id: rec.id.clone(),
            pod_id: rec.pod_id.clone(),
            at: now_ns(),
        });
    }

    /// The entry of a full ID or unique ID prefix.
    pub fn resolve(&self, id: &str) -> Result<Option<Arc<Entry>>, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("container_id: required"));
        }
        let index = self.index();
        if let Some(e) = index.by_id.get(id) {
            return Ok(Some(e.clone()));
        }
        let mut found = index.by_id.iter().filter(|(k, _)| k.starts_with(id));
        match (found.next(), found.next()) {
            (Some((_, e)), None) => Ok(Some(e.clone())),
            (Some(_), Some(_)) => Err(Status::invalid_argument(format!(
                "container_id: {id:?} matches more than one container"
            ))),
            _ => Ok(None),
        }
    }

    pub fn get_entry(&self, id: &str) -> Result<Arc<Entry>, Status> {
        self.resolve(id)?
            .ok_or_else(|| Status::not_found(format!("container {id:?} not found")))
    }

    /// The record, with its exit read from the monitor's exit file.
    pub fn get(&self, id: &str) -> Result<ContainerRecord, Status> {
        let e = self.get_entry(id)?;
        Ok(self.refresh(&e))
    }

    /// Every visible container, refreshed.
    /// Every container but those being created: an in-memory read. The
    /// record of a created or running container is kept current by its
    /// watcher, which waits on the monitor (see [`Containers::watch`]).
    pub fn list(&self) -> Vec<Arc<ContainerRecord>> {
        self.index()
            .by_id
            .values()
            .map(|e| e.view())
            .filter(|r| r.state != ContainerState::Creating)
            .collect()
    }

    /// IDs of a pod's containers.
    pub fn of_pod(&self, pod_id: &str) -> Vec<String> {
        self.index()
            .by_id
            .values()
            .map(|e| e.snapshot())
            .filter(|r| r.pod_id == pod_id)
            .map(|r| r.id)
            .collect()
    }

    /// Reads the exit file of a created or running container; persists and
    /// reports the change once.
    pub fn refresh(&self, entry: &Entry) -> ContainerRecord {
        let mut rec = entry.snapshot();
        if !rec.state.is_live() {
            return rec;
        }
        let exit = crust_shim_protocol::read_exit_file(&rec.state_dir)
            .ok()
            .flatten();
        let changed = match exit {
            Some(e) => {
                rec.set_exit(&e);
                true
            }
            None => {
                // No exit file and no monitor: it died (SIGKILLed) without
                // recording the exit. Nothing watches the container now, so
                // end it (as containerd does when a shim dies) rather than
                // report a running container as exited.
                if Shim::connect(&rec.state_dir).is_err() {
                    self.kill_orphan(&rec);
                    rec.state = ContainerState::Exited;
                    rec.finished_at = now_ns();
                    rec.exit_code = 255;
                    rec.reason = "Error".into();
                    rec.message = "the container's monitor is gone; exit status unknown".into();
                    true
                } else {
                    false
                }
            }
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

    fn reserve(&self, key: NameKey) -> Result<(), Status> {
        let mut index = self.index();
        if let Some(id) = index.names.get(&key) {
            return Err(Status::already_exists(format!(
                "container name {:?} attempt {} is already in use in pod sandbox {} by container {id}",
                key.1, key.2, key.0
            )));
        }
        index.names.insert(key, String::new());
        Ok(())
    }

    fn release_name(&self, key: &NameKey) {
        self.index().names.remove(key);
    }

    fn publish(&self, rec: ContainerRecord) -> Arc<Entry> {
        let entry = Arc::new(Entry {
            rec: Mutex::new(Arc::new(rec.clone())),
            op: tokio::sync::Mutex::new(false),
        });
        let mut index = self.index();
        index.names.insert(rec.name_key(), rec.id.clone());
        index.by_id.insert(rec.id.clone(), entry.clone());
        entry
    }

    fn unpublish(&self, rec: &ContainerRecord) {
        let mut index = self.index();
        index.by_id.remove(&rec.id);
        index.names.remove(&rec.name_key());
        drop(index);
        self.cpu_samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&rec.id);
    }

    /// Undoes everything a container's record says it may have on the host
    /// (but the image lease and the record). Idempotent.
    fn teardown_local(&self, rec: &ContainerRecord) -> Result<(), Status> {
        if let Ok(shim) = Shim::connect(&rec.state_dir) {
            // Last resort: the container should have exited already.
            let _ = shim.kill(libc::SIGKILL, true);
            let deadline = Instant::now() + KILL_WAIT;
            while shim.is_alive() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = shim.kill_shim();
        } else {
            self.kill_orphan(rec);
        }
        runtime_delete(&rec.runtime, &rec.id);
        crust_linux::mounts::unmount(&rec.rootfs).map_err(internal)?;
        remove_tree(&rec.state_dir)?;
        remove_tree(&rec.layer_dir)?;
        Ok(())
    }

    /// Kills every process left in the cgroup of a container whose monitor
    /// is gone, and removes the cgroup. The path is the one its bundle gave
    /// the runtime (cgroupfs driver; a systemd scope is stopped by systemd
    /// when its last process ends, which this does not do: warned).
    fn kill_orphan(&self, rec: &ContainerRecord) {
        let config = rec.bundle.join("config.json");
        let Ok(data) = std::fs::read(&config) else {
            return;
        };
        let path = serde_json::from_slice::<serde_json::Value>(&data)
            .ok()
            .and_then(|v| v["linux"]["cgroupsPath"].as_str().map(PathBuf::from));
        let Some(path) = path.filter(|p| p.is_absolute()) else {
            warn!(id = %rec.id, "the container's monitor is gone and its cgroup is not a cgroupfs path: its processes are left running");
            return;
        };
        let cg = crust_linux::cgroups::PodCgroup::new(
            self.cgroup_hierarchy,
            Path::new("/sys/fs/cgroup"),
            &path,
        );
        match cg.and_then(|cg| cg.delete()) {
            Ok(()) => {
                info!(id = %rec.id, "the container's monitor is gone: killed what was left of the container")
            }
            Err(e) => {
                warn!(id = %rec.id, "the container's monitor is gone; cannot kill its processes: {e}")
            }
        }
    }

    /// Recovery at start: rebuilds the index from the store; half-created
    /// containers are torn down. Running containers are not touched.
    /// Returns the IDs whose image lease must be released.
    pub fn recover(&self) -> anyhow::Result<Vec<String>> {
        let mut release = Vec::new();
        for rec in self.store.list::<ContainerRecord>()? {
            if rec.state == ContainerState::Creating {
                info!(id = %rec.id, "removing a container whose creation was interrupted");
                if let Err(e) = self.teardown_local(&rec) {
                    warn!(id = %rec.id, "cannot clean up a half-created container: {e}");
                    continue;
                }
                self.store.delete::<ContainerRecord>(&rec.id)?;
                release.push(rec.id);
                continue;
            }
            let entry = self.publish(rec);
            let rec = self.refresh(&entry);
            debug!(id = %rec.id, state = ?rec.state, "container recovered");
        }
        Ok(release)
    }

    /// Starts a task that notices the exit of a created or running
    /// container (STOPPED event, record) without anyone asking: it waits on
    /// the monitor, which answers the moment it has reaped the container's
    /// init, so an exit is seen within milliseconds, an idle container costs
    /// no wake-ups, and listing needs no look at any monitor. One task and
    /// one socket per container, from create until the exit.
    fn watch(daemon: &Arc<Daemon>, id: String) {
        let weak = Arc::downgrade(daemon);
        tokio::spawn(async move {
            loop {
                let state_dir = {
                    let Some(d) = weak.upgrade() else { return };
                    let Ok(Some(entry)) = d.containers.resolve(&id) else {
                        return;
                    };
                    let rec = entry.view();
                    if rec.id != id {
                        return;
                    }
                    rec.state_dir.clone()
                };
                // No daemon reference is held while waiting.
                let waited = match AsyncShim::connect(&state_dir) {
                    Ok(shim) => shim.wait().await.map(drop),
                    Err(e) => Err(e),
                };
                let Some(d) = weak.upgrade() else { return };
                let Ok(Some(entry)) = d.containers.resolve(&id) else {
                    return;
                };
                if !d.containers.refresh(&entry).state.is_live() {
                    return;
                }
                if let Err(e) = waited {
                    // The monitor is alive but the wait broke (e.g. the
                    // daemon ran out of descriptors): try again shortly.
                    debug!(%id, "waiting for the container's exit: {e}");
                    drop(d);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
    }

    /// At start: a watcher for every created or running container (their
    /// state checked against the monitors first, by `recover`).
    pub fn watch_live(daemon: &Arc<Daemon>) {
        for rec in daemon.containers.list() {
            if rec.state.is_live() {
                Self::watch(daemon, rec.id.clone());
            }
        }
    }
}

/// Removes what a runtime may still hold for `id` (a monitor killed before
/// it could delete the container). Errors are ignored: usually there is
/// nothing.
fn runtime_delete(runtime: &RuntimeConfig, id: &str) {
    match runtime {
        RuntimeConfig::Embedded { root, .. } => {
            let dir = root.join(id);
            if dir.exists() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        RuntimeConfig::Cli { path, root, .. } => {
            if root.join(id).exists() {
                let _ = std::process::Command::new(path)
                    .arg("--root")
                    .arg(root)
                    .args(["delete", "--force", id])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
}

fn remove_tree(p: &Path) -> Result<(), Status> {
    // Never delete through a mount: the rootfs is unmounted first, and a
    // dir still mounted on is refused.
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Status::internal(format!("removing {}: {e}", p.display()))),
    }
}

pub fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn shim_status(e: crust_shim_protocol::Error) -> Status {
    use crust_shim_protocol::ErrorKind;
    match e {
        crust_shim_protocol::Error::Shim {
            kind: ErrorKind::InvalidArgument,
            message,
        } => Status::invalid_argument(message),
        crust_shim_protocol::Error::Shim {
            kind: ErrorKind::FailedPrecondition,
            message,
        } => Status::failed_precondition(message),
        crust_shim_protocol::Error::Gone => {
            Status::failed_precondition("the container is not running")
        }
        e => Status::internal(e.to_string()),
    }
}

fn spec_status(e: crust_oci::SpecError) -> Status {
    match e.class() {
        ErrorClass::InvalidArgument => Status::invalid_argument(e.to_string()),
        ErrorClass::FailedPrecondition => Status::failed_precondition(e.to_string()),
        ErrorClass::Internal => Status::internal(e.to_string()),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(internal)?
}

pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn new_id() -> Result<String, Status> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(internal)?;
    Ok(hex::encode(bytes))
}

/// `config.log_path`: relative, no `..`, no NUL.
fn check_log_path(p: &str) -> Result<(), Status> {
    let bad = |why: &str| {
        Err(Status::invalid_argument(format!(
            "config.log_path: {p:?} {why}"
        )))
    };
    if p.contains('\0') {
        return bad("contains NUL");
    }
    if p.starts_with('/') {
        return bad("must be relative to the pod's log directory");
    }
    if p.split('/').any(|c| c == ".." || c == ".") {
        return bad("must not contain '.' or '..' components");
    }
    if p.len() > 4096 {
        return bad("is too long");
    }
    Ok(())
}

fn check_name(field: &str, name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument(format!("{field}: required")));
    }
    if name.len() > 253 || name.bytes().any(|b| b.is_ascii_control() || b == b'/') {
        return Err(Status::invalid_argument(format!(
            "{field}: {name:?} must be at most 253 printable characters without '/'"
        )));
    }
    Ok(())
}

fn image_config(c: &crust_image::ImageConfig) -> ImageConfig {
    ImageConfig {
        entrypoint: c.entrypoint.clone(),
        cmd: c.cmd.clone(),
        env: c.env.clone(),
        working_dir: c.working_dir.clone(),
        user: c.user.clone(),
        stop_signal: c.stop_signal.clone(),
        volumes: c.volumes.clone(),
    }
}

fn pod_facts(pod: &PodRecord, systemd: bool) -> PodFacts {
    let existing = |p: &PathBuf| p.exists().then(|| p.clone());
    PodFacts {
        sandbox_id: pod.id.clone(),
        net_ns: pod.namespaces.net.clone(),
        ipc_ns: pod.namespaces.ipc.clone(),
        uts_ns: pod.namespaces.uts.clone(),
        pid_ns: crate::pods::pause::pid(pod).map(|p| PathBuf::from(format!("/proc/{p}/ns/pid"))),
        target_pid_ns: None,
        cgroup_parent: if systemd {
            pod.cgroup_parent.clone()
        } else {
            pod.cgroup_path.display().to_string()
        },
        resolv_conf: existing(&pod.resolv_conf_path),
        hosts: existing(&pod.hosts_path),
        hostname_file: existing(&pod.hostname_path),
        shm: pod.shm.clone(),
    }
}

/// CreateContainer.
pub async fn create(
    daemon: Arc<Daemon>,
    pod_id: String,
    config: Option<ContainerConfig>,
) -> Result<String, Status> {
    let config = config.ok_or_else(|| Status::invalid_argument("config: required"))?;
    let md = config
        .metadata
        .clone()
        .ok_or_else(|| Status::invalid_argument("config.metadata: required"))?;
    check_name("config.metadata.name", &md.name)?;
    check_log_path(&config.log_path)?;
    if pod_id.is_empty() {
        return Err(Status::invalid_argument("pod_sandbox_id: required"));
    }
    let pod = daemon.pods.get(&pod_id).map_err(|e| match e {
        crate::pods::PodError::NotFound(m) => Status::not_found(m),
        e => Status::internal(e.to_string()),
    })?;
    if pod.state != PodState::Ready {
        return Err(Status::failed_precondition(format!(
            "pod sandbox {} is not ready",
            pod.id
        )));
    }
    let image_name = config
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .unwrap_or_default();
    if image_name.is_empty() {
        return Err(Status::invalid_argument("config.image.image: required"));
    }
    let image = daemon
        .images
        .get(&image_name)
        .map_err(internal)?
        .ok_or_else(|| Status::not_found(format!("image {image_name:?} not found")))?;
    let runtime = daemon
        .containers
        .handlers
        .get(&pod.runtime_handler)
        .cloned()
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "the pod's runtime handler {:?} is no longer configured",
                pod.runtime_handler
            ))
        })?;
    let cs = &daemon.containers;
    let key: NameKey = (pod.id.clone(), md.name.clone(), md.attempt);
    cs.reserve(key.clone())?;
    let id = match new_id() {
        Ok(id) => id,
        Err(e) => {
            cs.release_name(&key);
            return Err(e);
        }
    };
    let state_dir = cs.run_dir.join(&id);
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
        image: image_name.clone(),
        image_ref: image.id.clone(),
        labels: config.labels.clone().into_iter().collect(),
        annotations: config.annotations.clone().into_iter().collect(),
        log_path: log_path.clone(),
        config: hex::encode(config.encode_to_vec()),
        image_request: Some(config.image.clone().into()),
        handler: pod.runtime_handler.clone(),
        runtime: runtime.clone(),
        rootfs: bundle.join("rootfs"),
        bundle: bundle.clone(),
        state_dir: state_dir.clone(),
        layer_dir: cs.layers_dir.join(&id),
        user: None,
        resources: config
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(|r| hex::encode(r.encode_to_vec())),
        stop_signal: libc::SIGTERM,
        pid: 0,
    };
    {
        let rec = rec.clone();
        let store = daemon.store.clone();
        if let Err(e) = blocking(move || store.put(&rec).map_err(internal)).await {
            cs.release_name(&key);
            return Err(e);
        }
    }
    match create_effects(&daemon, &mut rec, &pod, &config, &image).await {
        Ok(()) => {}
        Err(e) => {
            warn!(id, "container creation failed, undoing it: {}", e.message());
            let cleanup = {
                let (d, rec) = (daemon.clone(), rec.clone());
                blocking(move || d.containers.teardown_local(&rec)).await
            };
            match cleanup {
                Ok(()) => {
                    let _ = daemon.images.release(&id).await;
                    let store = daemon.store.clone();
                    let idc = id.clone();
                    let _ =
                        blocking(move || store.delete::<ContainerRecord>(&idc).map_err(internal))
                            .await;
                }
                Err(c) => warn!(id, "undoing the failed container failed: {}", c.message()),
            }
            cs.release_name(&key);
            return Err(e);
        }
    }
    rec.state = ContainerState::Created;
    {
        let store = daemon.store.clone();
        let r = rec.clone();
        blocking(move || store.put(&r).map_err(internal)).await?;
    }
    info!(id, name = %rec.name, pod = %rec.pod_id, "container created");
    cs.emit(EventKind::Created, &rec);
    cs.publish(rec);
    Containers::watch(&daemon, id.clone());
    Ok(id)
}

async fn create_effects(
    daemon: &Arc<Daemon>,
    rec: &mut ContainerRecord,
    pod: &PodRecord,
    config: &ContainerConfig,
    image: &crust_image::Image,
) -> Result<(), Status> {
    let lowers = daemon
        .images
        .lease(&rec.id, &image.id)
        .await
        .map_err(|e| Status::not_found(format!("image {:?}: {e}", rec.image)))?;
    let d = daemon.clone();
    let (r, pod, config, image) = (rec.clone(), pod.clone(), config.clone(), image.clone());
    let (user, stop_signal, pid) = blocking(move || {
        let cs = &d.containers;
        let systemd = d.config.cgroup_driver == crate::config::CgroupDriver::Systemd;
        mkdir(&r.layer_dir, 0o700)?;
        mkdir(&r.layer_dir.join("upper"), 0o755)?;
        mkdir(&r.layer_dir.join("work"), 0o700)?;
        mkdir(&r.state_dir, 0o700)?;
        mkdir(&r.bundle, 0o700)?;
        mkdir(&r.rootfs, 0o755)?;
        crust_linux::mounts::mount_overlay(
            &lowers,
            &r.layer_dir.join("upper"),
            &r.layer_dir.join("work"),
            &r.rootfs,
        )
        .map_err(internal)?;
        let read = |p: &str| {
            crust_linux::mounts::read_file_in_root(&r.rootfs, p, MAX_ETC_FILE)
                .map(|o| o.map(|b| String::from_utf8_lossy(&b).into_owned()))
                .map_err(internal)
        };
        let passwd = read("etc/passwd")?;
        let group = read("etc/group")?;
        let img = image_config(&image.config);
        let sandbox_config = pod.sandbox_config();
        let mut facts = pod_facts(&pod, systemd);
        // pid mode TARGET: another container of the same pod.
        let target = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .map(|n| n.target_id.clone())
            .unwrap_or_default();
        if !target.is_empty() {
            let t = cs.get(&target).map_err(|_| {
                Status::not_found(format!(
                    "config.linux.security_context.namespace_options.target_id: container {target:?} not found"
                ))
            })?;
            if t.pod_id != pod.id || t.state != ContainerState::Running || t.pid <= 0 {
                return Err(Status::failed_precondition(format!(
                    "target container {target} is not running in pod sandbox {}",
                    pod.id
                )));
            }
            facts.target_pid_ns = Some(PathBuf::from(format!("/proc/{}/ns/pid", t.pid)));
        }
        let runtime_facts = RuntimeFacts {
            rro_supported: cs
                .features
                .get(&pod.runtime_handler)
                .is_some_and(|f| f.recursive_read_only_mounts),
            ..cs.facts.clone()
        };
        let input = SpecInput {
            container_id: &r.id,
            config: &config,
            sandbox_config: &sandbox_config,
            image: &img,
            image_name: &r.image,
            etc_passwd: passwd.as_deref(),
            etc_group: group.as_deref(),
            rootfs: &r.rootfs,
            pod: &facts,
            runtime: &runtime_facts,
            host: &host::RealHost,
        };
        let spec = crust_oci::container_spec(&input).map_err(spec_status)?;
        let user = crust_oci::resolve_user(
            config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref()),
            &img.user,
            passwd.as_deref(),
            group.as_deref(),
        )
        .map_err(spec_status)?;
        let stop_signal = crust_oci::stop_signal(&config, &img).map_err(spec_status)?;
        // The spec as runc reads it, for status; the runtime's copy.
        let json = serde_json::to_vec_pretty(&spec).map_err(internal)?;
        write_file(&r.bundle.join("spec.json"), &json)?;
        let mut for_runtime = spec.clone();
        if matches!(r.runtime, RuntimeConfig::Embedded { .. }) {
            // youki reads SCMP_CMP_MASKED_EQ operands swapped (and not
            // rshared): without this the default seccomp profile's clone
            // rule would allow new namespaces.
            embedded_compat(&mut for_runtime);
        }
        let json = serde_json::to_vec(&for_runtime).map_err(internal)?;
        write_file(&r.bundle.join("config.json"), &json)?;
        if let Some(parent) = r.log_path.as_ref().and_then(|l| l.parent()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| {
                    Status::internal(format!("creating log dir {}: {e}", parent.display()))
                })?;
        }
        let process = spec.process().as_ref();
        let tty = process.and_then(|p| p.terminal()).unwrap_or(false);
        let shim = Shim::spawn(&SpawnOptions {
            shim_binary: cs.shim_binary.clone(),
            state_dir: r.state_dir.clone(),
            config: ShimConfig {
                id: r.id.clone(),
                bundle: r.bundle.clone(),
                runtime: r.runtime.clone(),
                log_path: r.log_path.clone(),
                tty,
                stdin: config.stdin,
                stdin_once: config.stdin_once,
            },
            timeout: CREATE_TIMEOUT,
        })
        .map_err(|e| Status::internal(format!("creating the container: {e}")))?;
        Ok((user, stop_signal, shim.pid()))
    })
    .await?;
    rec.user = Some((user.uid, user.gid, user.additional_gids));
    rec.stop_signal = stop_signal;
    rec.pid = pid;
    Ok(())
}

use std::os::unix::fs::DirBuilderExt;

/// What the embedded runtime (youki's libcontainer 0.7) needs besides
/// [`crust_oci::libcontainer_compat`]: it loads seccomp early (before
/// capabilities are dropped) only when `noNewPrivileges` is absent, and
/// late otherwise, so `Some(false)` makes a filter without no_new_privs
/// fail to load ("failed to load seccomp context"). Absent and false mean
/// the same to the OCI spec. (Belongs in `libcontainer_compat`.) And on
/// cgroup v1, in a pod's shared PID namespace, the `cgroup` mount spelled
/// out ([`crust_oci::emulate_cgroup_v1_mount`]): libcontainer's own looks
/// up the init's namespace pid in the host's /proc and fails the create.
pub fn embedded_compat(spec: &mut crust_oci::Spec) {
    crust_oci::libcontainer_compat(spec);
    crust_oci::emulate_cgroup_v1_mount(spec, &host::cgroup_v1_hierarchies());
    if let Some(p) = spec.process_mut()
        && p.no_new_privileges() == Some(false)
    {
        p.set_no_new_privileges(None);
    }
}

fn mkdir(p: &Path, mode: u32) -> Result<(), Status> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| Status::internal(format!("creating {}: {e}", p.display())))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Status::internal(format!("chmod {}: {e}", p.display())))
}

fn write_file(p: &Path, data: &[u8]) -> Result<(), Status> {
    std::fs::write(p, data).map_err(|e| Status::internal(format!("writing {}: {e}", p.display())))
}

/// StartContainer.
pub async fn start(daemon: Arc<Daemon>, id: String) -> Result<(), Status> {
    let cs = &daemon.containers;
    let entry = cs.get_entry(&id)?;
    let removed = entry.op.lock().await;
    if *removed {
        return Err(Status::not_found(format!("container {id:?} not found")));
    }
    let mut rec = cs.refresh(&entry);
    if rec.state != ContainerState::Created {
        return Err(Status::failed_precondition(format!(
            "container {} is {}, not CREATED",
            rec.id,
            rec.state.as_str()
        )));
    }
    let dir = rec.state_dir.clone();
    let res = blocking(move || {
        let shim = Shim::connect(&dir).map_err(shim_status)?;
        shim.start().map_err(shim_status)
    })
    .await;
    if let Err(e) = res {
        // The container cannot run any more; it shows as exited.
        rec.state = ContainerState::Exited;
        rec.started_at = 0;
        rec.finished_at = now_ns();
        rec.exit_code = 128;
        rec.reason = "StartError".into();
        rec.message = e.message().to_string();
        let _ = daemon.store.put(&rec);
        entry.set(rec);
        return Err(Status::internal(format!(
            "starting container {id}: {}",
            e.message()
        )));
    }
    rec.state = ContainerState::Running;
    rec.started_at = now_ns();
    {
        let store = daemon.store.clone();
        let r = rec.clone();
        blocking(move || store.put(&r).map_err(internal)).await?;
    }
    entry.set(rec.clone());
    cs.emit(EventKind::Started, &rec);
    info!(id = %rec.id, "container started");
    // A container that exited at once is reported so.
    cs.refresh(&entry);
    Ok(())
}

/// Waits (polling the exit file) until the container has exited.
async fn wait_exit(cs: &Containers, entry: &Entry, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let rec = cs.refresh(entry);
        if rec.state == ContainerState::Exited {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// StopContainer: the stop signal, SIGKILL after `timeout` seconds.
/// Idempotent; unknown IDs succeed.
pub async fn stop(daemon: Arc<Daemon>, id: String, timeout: i64) -> Result<(), Status> {
    let cs = &daemon.containers;
    let Some(entry) = cs.resolve(&id)? else {
        return Ok(());
    };
    let removed = entry.op.lock().await;
    if *removed {
        return Ok(());
    }
    stop_locked(cs, &entry, timeout).await
}

async fn stop_locked(cs: &Containers, entry: &Entry, timeout: i64) -> Result<(), Status> {
    let rec = cs.refresh(entry);
    if !rec.state.is_live() {
        return Ok(());
    }
    let dir = rec.state_dir.clone();
    let signal = if timeout <= 0 || rec.state == ContainerState::Created {
        libc::SIGKILL
    } else {
        rec.stop_signal
    };
    let kill = |sig: i32, all: bool| {
        let dir = dir.clone();
        blocking(move || match Shim::connect(&dir) {
            Ok(s) => s.kill(sig, all).map_err(shim_status),
            Err(_) => Ok(()),
        })
    };
    if let Err(e) = kill(signal, false).await {
        debug!(id = %rec.id, "stop signal: {}", e.message());
    }
    if signal != libc::SIGKILL {
        let grace = Duration::from_secs(timeout.clamp(0, 24 * 3600) as u64);
        if wait_exit(cs, entry, grace).await {
            return Ok(());
        }
    }
    if signal != libc::SIGKILL || rec.state == ContainerState::Running {
        let _ = kill(libc::SIGKILL, true).await;
    }
    if wait_exit(cs, entry, KILL_WAIT).await {
        return Ok(());
    }
    Err(Status::internal(format!(
        "container {} did not exit after SIGKILL",
        rec.id
    )))
}

/// RemoveContainer: stops it (SIGKILL) if needed, then removes its rootfs,
/// bundle, monitor state, image lease and record; the log file stays.
/// Idempotent.
pub async fn remove(daemon: Arc<Daemon>, id: String) -> Result<(), Status> {
    let cs = &daemon.containers;
    let Some(entry) = cs.resolve(&id)? else {
        return Ok(());
    };
    let mut removed = entry.op.lock().await;
    if *removed {
        return Ok(());
    }
    stop_locked(cs, &entry, 0).await?;
    let rec = entry.snapshot();
    {
        let (d, r) = (daemon.clone(), rec.clone());
        blocking(move || d.containers.teardown_local(&r)).await?;
    }
    daemon
        .images
        .release(&rec.id)
        .await
        .map_err(|e| Status::internal(format!("releasing the image of {}: {e}", rec.id)))?;
    {
        let store = daemon.store.clone();
        let id = rec.id.clone();
        blocking(move || store.delete::<ContainerRecord>(&id).map_err(internal)).await?;
    }
    cs.unpublish(&rec);
    *removed = true;
    cs.emit(EventKind::Deleted, &rec);
    info!(id = %rec.id, "container removed");
    Ok(())
}

/// Stops (timeout 0) or removes every container of a pod (StopPodSandbox,
/// RemovePodSandbox).
pub async fn stop_all_of_pod(
    daemon: &Arc<Daemon>,
    pod_id: &str,
    remove_too: bool,
) -> Result<(), Status> {
    let ids = daemon.containers.of_pod(pod_id);
    let mut tasks = Vec::new();
    for id in ids {
        let d = daemon.clone();
        tasks.push(tokio::spawn(async move {
            if remove_too {
                remove(d, id).await
            } else {
                stop(d, id, 0).await
            }
        }));
    }
    let mut first_err = None;
    for t in tasks {
        match t.await.map_err(internal) {
            Ok(Ok(())) => {}
            Ok(Err(e)) | Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// ExecSync: runs `cmd` in a running container.
pub async fn exec_sync(
    daemon: Arc<Daemon>,
    id: String,
    cmd: Vec<String>,
    timeout_s: i64,
) -> Result<crust_shim_protocol::ExecSyncOutput, Status> {
    if cmd.is_empty() {
        return Err(Status::invalid_argument("cmd: required"));
    }
    if timeout_s < 0 {
        return Err(Status::invalid_argument("timeout: must not be negative"));
    }
    let rec = daemon.containers.get(&id)?;
    if rec.state != ContainerState::Running {
        return Err(Status::failed_precondition(format!(
            "container {} is not running",
            rec.id
        )));
    }
    let req = ExecRequest {
        args: cmd,
        timeout_ms: (timeout_s as u64).saturating_mul(1000),
        ..Default::default()
    };
    let out = blocking(move || {
        let shim = Shim::connect(&rec.state_dir).map_err(shim_status)?;
        shim.exec_sync(&req).map_err(shim_status)
    })
    .await?;
    if out.timed_out {
        return Err(Status::deadline_exceeded(format!(
            "command timeout {timeout_s}s exceeded"
        )));
    }
    Ok(out)
}

/// ReopenContainerLog.
pub async fn reopen_log(daemon: Arc<Daemon>, id: String) -> Result<(), Status> {
    let rec = daemon.containers.get(&id)?;
    if rec.state != ContainerState::Running {
        return Err(Status::failed_precondition(format!(
            "container {} is not running",
            rec.id
        )));
    }
    blocking(move || {
        let shim = Shim::connect(&rec.state_dir).map_err(shim_status)?;
        shim.reopen_log().map_err(shim_status)
    })
    .await
}

/// UpdateContainerResources: applied live through the monitor, then
/// recorded for ContainerStatus.
pub async fn update(
    daemon: Arc<Daemon>,
    id: String,
    resources: Option<LinuxContainerResources>,
) -> Result<(), Status> {
    let entry = daemon.containers.get_entry(&id)?;
    let _op = entry.op.lock().await;
    let mut rec = daemon.containers.refresh(&entry);
    let Some(res) = resources else {
        return Ok(());
    };
    if !rec.state.is_live() {
        return Err(Status::failed_precondition(format!(
            "container {} is not running",
            rec.id
        )));
    }
    let oci = crust_oci_resources(&res, &daemon.containers.facts)?;
    let dir = rec.state_dir.clone();
    blocking(move || {
        let shim = Shim::connect(&dir).map_err(shim_status)?;
        shim.update(&oci).map_err(shim_status)
    })
    .await?;
    rec.resources = Some(hex::encode(res.encode_to_vec()));
    let store = daemon.store.clone();
    let r = rec.clone();
    blocking(move || store.put(&r).map_err(internal)).await?;
    entry.set(rec);
    Ok(())
}

/// The OCI `LinuxResources` JSON of CRI resources (through the spec crate,
/// so updates get exactly what creation would).
fn crust_oci_resources(
    res: &LinuxContainerResources,
    facts: &RuntimeFacts,
) -> Result<serde_json::Value, Status> {
    let mut v = serde_json::Map::new();
    let mut cpu = serde_json::Map::new();
    if res.cpu_shares > 0 {
        cpu.insert("shares".into(), res.cpu_shares.into());
    }
    if res.cpu_quota != 0 {
        cpu.insert("quota".into(), res.cpu_quota.into());
    }
    if res.cpu_period > 0 {
        cpu.insert("period".into(), res.cpu_period.into());
    }
    if !res.cpuset_cpus.is_empty() {
        cpu.insert("cpus".into(), res.cpuset_cpus.clone().into());
    }
    if !res.cpuset_mems.is_empty() {
        cpu.insert("mems".into(), res.cpuset_mems.clone().into());
    }
    if !cpu.is_empty() {
        v.insert("cpu".into(), cpu.into());
    }
    let mut mem = serde_json::Map::new();
    if res.memory_limit_in_bytes > 0 {
        mem.insert("limit".into(), res.memory_limit_in_bytes.into());
        if facts.swap_available && res.memory_swap_limit_in_bytes == 0 {
            mem.insert("swap".into(), res.memory_limit_in_bytes.into());
        }
    }
    if res.memory_swap_limit_in_bytes > 0 && facts.swap_available {
        mem.insert("swap".into(), res.memory_swap_limit_in_bytes.into());
    }
    if !mem.is_empty() {
        v.insert("memory".into(), mem.into());
    }
    if !res.unified.is_empty() {
        if !facts.cgroup_v2 {
            return Err(Status::invalid_argument(
                "linux.unified: needs cgroup v2, this node uses v1",
            ));
        }
        v.insert(
            "unified".into(),
            serde_json::to_value(&res.unified).map_err(internal)?,
        );
    }
    Ok(v.into())
}

/// The container's ContainerConfig as stored.
pub fn config_of(rec: &ContainerRecord) -> ContainerConfig {
    hex::decode(&rec.config)
        .ok()
        .and_then(|b| ContainerConfig::decode(b.as_slice()).ok())
        .unwrap_or_default()
}

pub fn resources_of(rec: &ContainerRecord) -> Option<LinuxContainerResources> {
    rec.resources
        .as_ref()
        .and_then(|h| hex::decode(h).ok())
        .and_then(|b| LinuxContainerResources::decode(b.as_slice()).ok())
}

/// The runc-style spec of a container, for verbose status.
pub fn spec_json(rec: &ContainerRecord) -> serde_json::Value {
    std::fs::read(rec.bundle.join("spec.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Leases of containers the daemon does not know (a crash between lease
/// and record removal) are released at start.
pub async fn release_orphan_leases(daemon: &Arc<Daemon>, extra: Vec<String>) {
    let known: std::collections::HashSet<String> =
        daemon.containers.index().by_id.keys().cloned().collect();
    let mut ids = extra;
    if let Ok(leases) = daemon.images.leases() {
        ids.extend(
            leases
                .into_iter()
                .map(|(id, _)| id)
                .filter(|id| !known.contains(id)),
        );
    }
    for id in ids {
        if let Err(e) = daemon.images.release(&id).await {
            warn!(
                id,
                "cannot release the image lease of a removed container: {e}"
            );
        }
    }
}
