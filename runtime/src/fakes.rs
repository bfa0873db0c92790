//! Recording fakes of the node effects, for unit tests of the pod and
//! container life cycles without root (as youki's `TestHelperSyscall`
//! stands in for its `Syscall`).
//!
//! Each fake keeps a model of what exists on its "node" (dirs, pins,
//! cgroups, mounts, CNI attachments, monitors, leases) so a test can check
//! that an undo left nothing behind, appends every effect to a [`Journal`]
//! shared by all fakes so a test can check their order, and can be told
//! to fail an operation ([`Op`]) until healed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crust_linux::ns::{self, NamespaceKind, PinOptions};
use crust_network::Attachment;
use crust_network::config::NetworkConfigList;
use crust_oci::{Host, HostDevice, HostPropagation};
use crust_shim::{ExecRequest, ExecSyncOutput, ExitInfo};
use serde_json::Value;
use tokio::sync::Notify;

use crate::containers::{ContainerError, ContainerHost, ContainerRecord};
use crate::images::{ContainerImages, ImageFacts};
use crate::launch::Launch;
use crate::pods::host::{CniAddFailed, CniAdded};
use crate::pods::{PodError, PodHost, PodRecord};

/// One effect on the node, as the journal records it. Pods and containers
/// are named by their ID, dirs by their path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    CreateDir(PathBuf),
    PinNamespaces(PathBuf),
    CreateCgroup(PathBuf),
    MountShm(PathBuf),
    WriteFile(PathBuf),
    ApplySysctls(String),
    CniAdd(String),
    CniDel(String),
    StartPause(String),
    StopPause(String),
    UnpinNamespaces(PathBuf),
    UnmountShm(PathBuf),
    DeleteCgroup(PathBuf),
    RemoveTree(PathBuf),
    RemoveEmptyDir(PathBuf),

    Lease(String),
    Release(String),
    PrepareRootfs(String),
    Launch(String),
    Start(String),
    Kill { id: String, signal: i32, all: bool },
    Update(String),
    ReopenLog(String),
    ExecSync(String),
    ReapMonitor(String),
    KillOrphan(String),
    DeleteRuntimeState(String),
    UnmountRootfs(String),
}

/// Every effect of every fake, in order.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<Effect>>>);

impl Journal {
    fn push(&self, e: Effect) {
        self.0.lock().unwrap().push(e);
    }

    pub fn effects(&self) -> Vec<Effect> {
        self.0.lock().unwrap().clone()
    }

    /// Index of the first effect that matches.
    pub fn position(&self, f: impl Fn(&Effect) -> bool) -> Option<usize> {
        self.effects().iter().position(f)
    }

    pub fn count(&self, f: impl Fn(&Effect) -> bool) -> usize {
        self.effects().iter().filter(|e| f(e)).count()
    }

    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// Operations a test can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    LoadNetwork,
    PinNamespaces,
    CreateCgroup,
    WriteFile,
    CniAdd,
    CniAddNoIp,
    CniDel,
    StartPause,
    DeleteCgroup,
    Lease,
    PrepareRootfs,
    Launch,
    Start,
    UnmountRootfs,
}

#[derive(Default)]
struct Failures(Mutex<HashSet<Op>>);

impl Failures {
    fn set(&self, op: Op, on: bool) {
        let mut f = self.0.lock().unwrap();
        if on {
            f.insert(op);
        } else {
            f.remove(&op);
        }
    }

    fn check(&self, op: Op) -> bool {
        self.0.lock().unwrap().contains(&op)
    }
}

fn injected(op: Op) -> String {
    format!("injected failure of {op:?}")
}

/// The last path component: the ID of a pod or container dir.
fn id_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What a fake pod host has made.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodNode {
    pub dirs: BTreeSet<PathBuf>,
    pub files: BTreeMap<PathBuf, String>,
    /// Pinned namespace files.
    pub pins: BTreeSet<PathBuf>,
    pub cgroups: BTreeSet<PathBuf>,
    pub shm: BTreeSet<PathBuf>,
    /// Pods attached to the CNI network.
    pub attached: BTreeSet<String>,
    /// Pods whose pause process runs.
    pub pauses: BTreeSet<String>,
}

impl PodNode {
    pub fn is_empty(&self) -> bool {
        *self == PodNode::default()
    }

    fn anything_below(&self, dir: &Path) -> bool {
        let below = |p: &PathBuf| p.starts_with(dir) && p != dir;
        self.dirs.iter().any(below)
            || self.files.keys().any(below)
            || self.pins.iter().any(below)
            || self.shm.iter().any(below)
    }
}

/// A [`PodHost`] that records and models instead of touching the node.
pub struct FakePodHost {
    journal: Journal,
    node: Mutex<PodNode>,
    fail: Failures,
    network: NetworkConfigList,
    /// Files of the node (/etc/resolv.conf, /etc/hosts).
    node_files: HashMap<PathBuf, String>,
}

impl FakePodHost {
    pub fn new(journal: Journal) -> FakePodHost {
        let network = crust_network::config::parse(
            Path::new("/etc/cni/net.d/10-fake.conflist"),
            br#"{"cniVersion": "1.0.0", "name": "fake", "plugins": [{"type": "bridge"}]}"#,
        )
        .expect("a valid network config");
        FakePodHost {
            journal,
            node: Mutex::new(PodNode::default()),
            fail: Failures::default(),
            network,
            node_files: HashMap::from([(
                PathBuf::from("/etc/resolv.conf"),
                "nameserver 192.0.2.53\n".to_string(),
            )]),
        }
    }

    pub fn node(&self) -> PodNode {
        self.node.lock().unwrap().clone()
    }

    fn state(&self) -> MutexGuard<'_, PodNode> {
        self.node.lock().unwrap()
    }

    pub fn fail(&self, op: Op) {
        self.fail.set(op, true);
    }

    pub fn heal(&self, op: Op) {
        self.fail.set(op, false);
    }

    /// The node "reboots": pinned namespaces and mounts are gone.
    pub fn lose_pins(&self) {
        let mut n = self.state();
        n.pins.clear();
        n.shm.clear();
        n.pauses.clear();
    }

    fn check(&self, op: Op) -> Result<(), PodError> {
        if self.fail.check(op) {
            Err(PodError::Internal(injected(op)))
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl PodHost for FakePodHost {
    fn node_hostname(&self) -> Result<String, PodError> {
        Ok("fake-node".into())
    }

    fn load_network(&self) -> Result<NetworkConfigList, PodError> {
        if self.fail.check(Op::LoadNetwork) {
            return Err(PodError::Unavailable(
                "the pod network is not ready: no config".into(),
            ));
        }
        Ok(self.network.clone())
    }

    fn read_node_file(&self, path: &Path) -> Result<String, PodError> {
        Ok(self.node_files.get(path).cloned().unwrap_or_default())
    }

    fn is_pinned(&self, path: &Path) -> bool {
        self.state().pins.contains(path)
    }

    fn list_dir(&self, dir: &Path) -> Vec<String> {
        let n = self.state();
        n.dirs
            .iter()
            .filter(|d| d.parent() == Some(dir))
            .map(|d| id_of(d))
            .collect()
    }

    fn create_dir(&self, dir: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::CreateDir(dir.into()));
        if !self.state().dirs.insert(dir.into()) {
            return Err(PodError::Internal(format!("{} exists", dir.display())));
        }
        Ok(())
    }

    fn pin_namespaces(&self, ns_dir: &Path, opts: &PinOptions) -> Result<(), PodError> {
        self.journal.push(Effect::PinNamespaces(ns_dir.into()));
        self.check(Op::PinNamespaces)?;
        let mut n = self.state();
        n.dirs.insert(ns_dir.into());
        for (want, kind) in [
            (opts.net, NamespaceKind::Net),
            (opts.ipc, NamespaceKind::Ipc),
            (opts.uts, NamespaceKind::Uts),
        ] {
            if want {
                n.pins.insert(ns::pin_path(ns_dir, kind));
            }
        }
        Ok(())
    }

    fn create_cgroup(&self, path: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::CreateCgroup(path.into()));
        self.check(Op::CreateCgroup)?;
        self.state().cgroups.insert(path.into());
        Ok(())
    }

    fn mount_shm(&self, path: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::MountShm(path.into()));
        self.state().shm.insert(path.into());
        Ok(())
    }

    fn write_file(&self, path: &Path, content: &str) -> Result<(), PodError> {
        self.journal.push(Effect::WriteFile(path.into()));
        self.check(Op::WriteFile)?;
        self.state().files.insert(path.into(), content.into());
        Ok(())
    }

    fn apply_sysctls(
        &self,
        rec: &PodRecord,
        _sysctls: &[(String, String)],
    ) -> Result<(), PodError> {
        self.journal.push(Effect::ApplySysctls(rec.id.clone()));
        Ok(())
    }

    async fn cni_add(
        &self,
        _net: &NetworkConfigList,
        att: &Attachment,
    ) -> Result<CniAdded, CniAddFailed> {
        self.journal.push(Effect::CniAdd(att.container_id.clone()));
        if self.fail.check(Op::CniAdd) {
            return Err(CniAddFailed {
                error: PodError::Internal(injected(Op::CniAdd)),
                del_owed: false,
            });
        }
        self.state().attached.insert(att.container_id.clone());
        let ips: Vec<IpAddr> = if self.fail.check(Op::CniAddNoIp) {
            Vec::new()
        } else {
            vec!["10.88.0.7".parse().unwrap()]
        };
        Ok(CniAdded {
            raw: serde_json::json!({"cniVersion": "1.0.0"}),
            ips,
        })
    }

    async fn cni_del(
        &self,
        _net: &NetworkConfigList,
        att: &Attachment,
        _prev: Option<&Value>,
    ) -> Result<(), PodError> {
        self.journal.push(Effect::CniDel(att.container_id.clone()));
        self.check(Op::CniDel)?;
        self.state().attached.remove(&att.container_id);
        Ok(())
    }

    async fn start_pause(
        &self,
        rec: &PodRecord,
        _facts: &crust_oci::PodFacts,
    ) -> Result<(), PodError> {
        self.journal.push(Effect::StartPause(rec.id.clone()));
        self.check(Op::StartPause)?;
        self.state().pauses.insert(rec.id.clone());
        Ok(())
    }

    async fn stop_pause(&self, rec: &PodRecord) -> Result<(), PodError> {
        self.journal.push(Effect::StopPause(rec.id.clone()));
        self.state().pauses.remove(&rec.id);
        Ok(())
    }

    fn pause_pid(&self, rec: &PodRecord) -> Option<i32> {
        self.state().pauses.contains(&rec.id).then_some(4242)
    }

    fn unpin_namespaces(&self, ns_dir: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::UnpinNamespaces(ns_dir.into()));
        let mut n = self.state();
        n.pins.retain(|p| !p.starts_with(ns_dir));
        n.dirs.remove(ns_dir);
        Ok(())
    }

    fn unmount_shm(&self, path: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::UnmountShm(path.into()));
        self.state().shm.remove(path);
        Ok(())
    }

    fn delete_cgroup(&self, path: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::DeleteCgroup(path.into()));
        self.check(Op::DeleteCgroup)?;
        self.state().cgroups.remove(path);
        Ok(())
    }

    fn remove_tree(&self, dir: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::RemoveTree(dir.into()));
        let mut n = self.state();
        n.dirs.retain(|p| !p.starts_with(dir));
        n.files.retain(|p, _| !p.starts_with(dir));
        Ok(())
    }

    fn remove_empty_dir(&self, dir: &Path) -> Result<(), PodError> {
        self.journal.push(Effect::RemoveEmptyDir(dir.into()));
        let mut n = self.state();
        if n.anything_below(dir) {
            return Err(PodError::Internal(format!(
                "removing {}: directory not empty",
                dir.display()
            )));
        }
        n.dirs.remove(dir);
        Ok(())
    }
}

/// A container as the fake node runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Process {
    Created,
    Running,
    Exited(i32),
    /// The monitor died without writing an exit file.
    Lost,
}

/// What a fake container host has made.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ContainerNode {
    pub dirs: BTreeSet<PathBuf>,
    /// Containers whose rootfs is mounted.
    pub mounted: BTreeSet<String>,
    /// Containers the node has a process (or its exit) for.
    pub processes: BTreeMap<String, Process>,
}

impl ContainerNode {
    /// Nothing mounted, no dir, no monitor.
    pub fn is_clean(&self) -> bool {
        self.dirs.is_empty()
            && self.mounted.is_empty()
            && self
                .processes
                .values()
                .all(|p| matches!(p, Process::Exited(_) | Process::Lost))
    }
}

/// A [`ContainerHost`] that records and models instead of touching the
/// node.
pub struct FakeContainerHost {
    journal: Journal,
    node: Mutex<ContainerNode>,
    fail: Failures,
    /// Woken whenever a process exits.
    exited: Notify,
    /// Containers that ignore their stop signal (only SIGKILL ends them).
    stubborn: Mutex<HashSet<String>>,
    /// What ExecSync answers.
    exec_output: Mutex<Option<ExecSyncOutput>>,
    /// Every launch request.
    launches: Mutex<Vec<Launch>>,
    next_pid: Mutex<i32>,
}

impl FakeContainerHost {
    pub fn new(journal: Journal) -> FakeContainerHost {
        FakeContainerHost {
            journal,
            node: Mutex::new(ContainerNode::default()),
            fail: Failures::default(),
            exited: Notify::new(),
            stubborn: Mutex::new(HashSet::new()),
            exec_output: Mutex::new(None),
            launches: Mutex::new(Vec::new()),
            next_pid: Mutex::new(1000),
        }
    }

    pub fn node(&self) -> ContainerNode {
        self.node.lock().unwrap().clone()
    }

    fn state(&self) -> MutexGuard<'_, ContainerNode> {
        self.node.lock().unwrap()
    }

    pub fn fail(&self, op: Op) {
        self.fail.set(op, true);
    }

    pub fn heal(&self, op: Op) {
        self.fail.set(op, false);
    }

    pub fn launches(&self) -> Vec<Launch> {
        self.launches.lock().unwrap().clone()
    }

    /// The container's process exits by itself with `code`.
    pub fn exit(&self, id: &str, code: i32) {
        self.state()
            .processes
            .insert(id.into(), Process::Exited(code));
        self.exited.notify_waiters();
    }

    /// The container's monitor is SIGKILLed: no exit file, no monitor.
    pub fn lose_monitor(&self, id: &str) {
        self.state().processes.insert(id.into(), Process::Lost);
        self.exited.notify_waiters();
    }

    /// The container ignores its stop signal.
    pub fn ignore_stop_signal(&self, id: &str) {
        self.stubborn.lock().unwrap().insert(id.into());
    }

    pub fn set_exec_output(&self, out: ExecSyncOutput) {
        *self.exec_output.lock().unwrap() = Some(out);
    }

    fn check(&self, op: Op) -> Result<(), ContainerError> {
        if self.fail.check(op) {
            Err(ContainerError::Internal(injected(op)))
        } else {
            Ok(())
        }
    }

    fn process(&self, state_dir: &Path) -> Option<Process> {
        self.state().processes.get(&id_of(state_dir)).cloned()
    }

    fn live(&self, state_dir: &Path) -> bool {
        matches!(
            self.process(state_dir),
            Some(Process::Created | Process::Running)
        )
    }
}

#[async_trait::async_trait]
impl ContainerHost for FakeContainerHost {
    fn prepare_rootfs(
        &self,
        rec: &ContainerRecord,
        _lowers: &[PathBuf],
    ) -> Result<(), ContainerError> {
        self.journal.push(Effect::PrepareRootfs(rec.id.clone()));
        let mut n = self.state();
        n.dirs.insert(rec.layer_dir.clone());
        n.dirs.insert(rec.state_dir.clone());
        drop(n);
        self.check(Op::PrepareRootfs)?;
        self.state().mounted.insert(rec.id.clone());
        Ok(())
    }

    fn read_rootfs_file(
        &self,
        _rootfs: &Path,
        _rel: &str,
    ) -> Result<Option<String>, ContainerError> {
        Ok(None)
    }

    fn spec_host(&self) -> &dyn crust_oci::Host {
        &FakeSpecHost
    }

    async fn launch(&self, launch: Launch) -> Result<i32, ContainerError> {
        self.journal.push(Effect::Launch(launch.id.clone()));
        self.launches.lock().unwrap().push(launch.clone());
        self.check(Op::Launch)?;
        self.state()
            .processes
            .insert(launch.id.clone(), Process::Created);
        let mut pid = self.next_pid.lock().unwrap();
        *pid += 1;
        Ok(*pid)
    }

    async fn start(&self, state_dir: &Path) -> Result<(), ContainerError> {
        let id = id_of(state_dir);
        self.journal.push(Effect::Start(id.clone()));
        self.check(Op::Start)?;
        match self.process(state_dir) {
            Some(Process::Created) => {
                self.state().processes.insert(id, Process::Running);
                Ok(())
            }
            _ => Err(ContainerError::FailedPrecondition(
                "the container is not running".into(),
            )),
        }
    }

    async fn kill(&self, state_dir: &Path, signal: i32, all: bool) -> Result<(), ContainerError> {
        let id = id_of(state_dir);
        self.journal.push(Effect::Kill {
            id: id.clone(),
            signal,
            all,
        });
        let stubborn = self.stubborn.lock().unwrap().contains(&id);
        if self.live(state_dir) && (signal == libc::SIGKILL || !stubborn) {
            self.exit(&id, 128 + signal);
        }
        Ok(())
    }

    async fn wait(&self, state_dir: &Path) -> Result<(), ContainerError> {
        loop {
            let exited = self.exited.notified();
            if !self.live(state_dir) {
                return Ok(());
            }
            exited.await;
        }
    }

    async fn update(&self, state_dir: &Path, _resources: &Value) -> Result<(), ContainerError> {
        self.journal.push(Effect::Update(id_of(state_dir)));
        Ok(())
    }

    async fn reopen_log(&self, state_dir: &Path) -> Result<(), ContainerError> {
        self.journal.push(Effect::ReopenLog(id_of(state_dir)));
        Ok(())
    }

    async fn exec_sync(
        &self,
        state_dir: &Path,
        _req: &ExecRequest,
    ) -> Result<ExecSyncOutput, ContainerError> {
        self.journal.push(Effect::ExecSync(id_of(state_dir)));
        Ok(self
            .exec_output
            .lock()
            .unwrap()
            .clone()
            .unwrap_or(ExecSyncOutput {
                exit_code: 0,
                timed_out: false,
                stdout: Vec::new(),
                stderr: Vec::new(),
                stdout_truncated: false,
                stderr_truncated: false,
            }))
    }

    fn exit_file(&self, state_dir: &Path) -> Option<ExitInfo> {
        match self.process(state_dir)? {
            Process::Exited(code) => Some(ExitInfo {
                pid: 1,
                exit_code: code,
                signal: None,
                oom_killed: false,
                exited_at: String::new(),
                exited_at_unix_nanos: 1,
            }),
            _ => None,
        }
    }

    fn monitor_running(&self, state_dir: &Path) -> bool {
        self.live(state_dir)
    }

    async fn reap_monitor(&self, state_dir: &Path) -> bool {
        let id = id_of(state_dir);
        self.journal.push(Effect::ReapMonitor(id.clone()));
        if !self.live(state_dir) {
            return false;
        }
        self.exit(&id, 128 + libc::SIGKILL);
        true
    }

    fn kill_orphan(&self, rec: &ContainerRecord) {
        self.journal.push(Effect::KillOrphan(rec.id.clone()));
    }

    fn delete_runtime_state(&self, rec: &ContainerRecord) {
        self.journal
            .push(Effect::DeleteRuntimeState(rec.id.clone()));
    }

    fn unmount_rootfs(&self, rootfs: &Path) -> Result<(), ContainerError> {
        // <state_dir>/bundle/rootfs
        let id = rootfs
            .parent()
            .and_then(Path::parent)
            .map(id_of)
            .unwrap_or_default();
        self.journal.push(Effect::UnmountRootfs(id.clone()));
        self.check(Op::UnmountRootfs)?;
        self.state().mounted.remove(&id);
        Ok(())
    }

    fn remove_tree(&self, dir: &Path) -> Result<(), ContainerError> {
        let mut n = self.state();
        if n.mounted.contains(&id_of(dir)) {
            return Err(ContainerError::Internal(format!(
                "removing {}: device or resource busy",
                dir.display()
            )));
        }
        n.dirs.retain(|p| !p.starts_with(dir));
        Ok(())
    }

    fn read_spec(&self, _bundle: &Path) -> Value {
        Value::Null
    }
}

/// Spec generation's look-ups on a node with no devices and no files.
pub struct FakeSpecHost;

impl Host for FakeSpecHost {
    fn resolve(&self, path: &Path) -> io::Result<PathBuf> {
        Ok(path.to_path_buf())
    }

    fn propagation(&self, _path: &Path) -> io::Result<HostPropagation> {
        Ok(HostPropagation::Private)
    }

    fn devices(&self, _path: &Path) -> io::Result<Vec<HostDevice>> {
        Ok(Vec::new())
    }

    fn all_devices(&self) -> io::Result<Vec<HostDevice>> {
        Ok(Vec::new())
    }

    fn read_seccomp_profile(&self, path: &Path) -> io::Result<String> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no profiles on the fake node", path.display()),
        ))
    }
}

/// An image store with the images a test adds.
pub struct FakeImages {
    journal: Journal,
    images: Mutex<HashMap<String, ImageFacts>>,
    /// Container ID -> image ID.
    leases: Mutex<BTreeMap<String, String>>,
    fail: Failures,
}

impl FakeImages {
    pub fn new(journal: Journal) -> FakeImages {
        FakeImages {
            journal,
            images: Mutex::new(HashMap::new()),
            leases: Mutex::new(BTreeMap::new()),
            fail: Failures::default(),
        }
    }

    pub fn add(&self, name: &str, id: &str) {
        self.images.lock().unwrap().insert(
            name.into(),
            ImageFacts {
                id: id.into(),
                config: crust_oci::ImageConfig {
                    cmd: vec!["sleep".into(), "3600".into()],
                    ..Default::default()
                },
            },
        );
    }

    /// Container ID -> image ID of every lease.
    pub fn leases(&self) -> BTreeMap<String, String> {
        self.leases.lock().unwrap().clone()
    }

    /// A lease left by a container the daemon no longer knows.
    pub fn add_lease(&self, container_id: &str, image_id: &str) {
        self.leases
            .lock()
            .unwrap()
            .insert(container_id.into(), image_id.into());
    }

    pub fn fail(&self, op: Op) {
        self.fail.set(op, true);
    }
}

#[async_trait::async_trait]
impl ContainerImages for FakeImages {
    fn resolve(&self, reference: &str) -> Result<Option<ImageFacts>, crust_image::Error> {
        Ok(self.images.lock().unwrap().get(reference).cloned())
    }

    async fn lease(
        &self,
        container_id: &str,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error> {
        self.journal.push(Effect::Lease(container_id.into()));
        if self.fail.check(Op::Lease) {
            return Err(crust_image::Error::NotFound(format!(
                "layers of {image_id}"
            )));
        }
        self.add_lease(container_id, image_id);
        Ok(vec![PathBuf::from("/fake/layers").join(image_id)])
    }

    async fn release(&self, container_id: &str) -> Result<(), crust_image::Error> {
        self.journal.push(Effect::Release(container_id.into()));
        self.leases.lock().unwrap().remove(container_id);
        Ok(())
    }

    fn leaseholders(&self) -> Result<Vec<String>, crust_image::Error> {
        Ok(self.leases.lock().unwrap().keys().cloned().collect())
    }
}

/// The daemon's domain parts over the fakes and a real store in a temp
/// dir: what the life-cycle tests drive.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub journal: Journal,
    pub pod_host: Arc<FakePodHost>,
    pub container_host: Arc<FakeContainerHost>,
    pub images: Arc<FakeImages>,
    pub store: Arc<crust_store::Store>,
    pub pods: Arc<crate::pods::Pods>,
    pub containers: Arc<crate::containers::Containers>,
    pub lifecycle: crate::lifecycle::Lifecycle,
}

/// The image every test container runs.
pub const IMAGE: &str = "busybox";
pub const IMAGE_ID: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000001";

impl Rig {
    /// A fresh daemon on an empty node, with [`IMAGE`] pulled.
    pub async fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::default();
        let pod_host = Arc::new(FakePodHost::new(journal.clone()));
        let container_host = Arc::new(FakeContainerHost::new(journal.clone()));
        let images = Arc::new(FakeImages::new(journal.clone()));
        images.add(IMAGE, IMAGE_ID);
        Rig::open(dir, journal, pod_host, container_host, images).await
    }

    /// The daemon restarts: everything in memory is gone, the store and
    /// the node stay.
    pub async fn restart(self) -> Rig {
        self.restart_with(|_| {}).await
    }

    /// [`Rig::restart`], with `while_down` happening to the node's
    /// containers while no daemon runs.
    pub async fn restart_with(self, while_down: impl FnOnce(&FakeContainerHost)) -> Rig {
        let Rig {
            dir,
            journal,
            pod_host,
            container_host,
            images,
            store,
            pods,
            containers,
            lifecycle,
        } = self;
        drop((lifecycle, containers, pods, store));
        while_down(&container_host);
        Rig::open(dir, journal, pod_host, container_host, images).await
    }

    async fn open(
        dir: tempfile::TempDir,
        journal: Journal,
        pod_host: Arc<FakePodHost>,
        container_host: Arc<FakeContainerHost>,
        images: Arc<FakeImages>,
    ) -> Rig {
        use crust_shim::RuntimeConfig;
        let store = Arc::new(crust_store::Store::open(&dir.path().join("meta.db")).unwrap());
        let root = dir.path();
        let pods = Arc::new(crate::pods::Pods::new(
            root.join("run/pods"),
            root.join("root/pods"),
            false,
            store.clone(),
            pod_host.clone(),
        ));
        pods.recover().await.unwrap();
        let handlers = crate::handlers::Handlers::from_parts(
            BTreeMap::from([
                (
                    String::new(),
                    RuntimeConfig::Embedded {
                        root: root.join("run/runtimes/default"),
                        systemd_cgroup: false,
                    },
                ),
                (
                    "runc".to_string(),
                    RuntimeConfig::Cli {
                        path: "/usr/bin/runc".into(),
                        root: root.join("run/runtimes/runc"),
                        systemd_cgroup: false,
                    },
                ),
            ]),
            BTreeMap::new(),
        );
        let containers = Arc::new(crate::containers::Containers::new(
            store.clone(),
            container_host.clone(),
            images.clone(),
            Arc::new(handlers),
            crust_oci::RuntimeFacts {
                cgroup_v2: false,
                ..Default::default()
            },
            crate::containers::Dirs {
                run_dir: root.join("run/containers"),
                layers_dir: root.join("root/containers"),
            },
        ));
        containers.recover().await.unwrap();
        let stats = Arc::new(crate::stats::CgroupStats::new(
            crust_linux::cgroups::Hierarchy::V1,
        ));
        Rig {
            lifecycle: crate::lifecycle::Lifecycle::new(pods.clone(), containers.clone(), stats),
            dir,
            journal,
            pod_host,
            container_host,
            images,
            store,
            pods,
            containers,
        }
    }

    /// RunPodSandbox of a pod named `name` (pid mode CONTAINER, so no
    /// pause process, on the CNI network).
    pub async fn run_pod(&self, name: &str) -> Result<String, PodError> {
        self.lifecycle.run_pod(pod_spec(name, |_| {})).await
    }

    /// A ready pod and a created container `name` in it.
    pub async fn pod_and_container(&self, name: &str) -> (String, String) {
        let pod = self.run_pod("web").await.unwrap();
        let id = self
            .lifecycle
            .create_container(&pod, Some(container_config(name, |_| {})))
            .await
            .unwrap();
        (pod, id)
    }

    /// The records of a kind in the store.
    pub fn stored<R: crust_store::Record + serde::de::DeserializeOwned>(&self) -> Vec<R> {
        self.store.list::<R>().unwrap()
    }
}

/// A checked RunPodSandbox request for `name` (namespace "ns", uid
/// "uid-<name>", attempt 0, pid mode CONTAINER, a log directory), changed
/// by `f`.
pub fn pod_spec(
    name: &str,
    f: impl FnOnce(&mut crust_api::v1::PodSandboxConfig),
) -> crate::pods::PodSpec {
    use crust_api::v1::*;
    let mut config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            attempt: 0,
        }),
        log_directory: format!("/var/log/pods/{name}"),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    pid: NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    f(&mut config);
    crate::pods::PodSpec::from_request(RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .unwrap()
}

/// A CreateContainer config for `name` (attempt 0, [`IMAGE`], pid mode
/// CONTAINER, a log path), changed by `f`.
pub fn container_config(
    name: &str,
    f: impl FnOnce(&mut crust_api::v1::ContainerConfig),
) -> crust_api::v1::ContainerConfig {
    use crust_api::v1::*;
    let mut config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        log_path: format!("{name}/0.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(NamespaceOption {
                    pid: NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    f(&mut config);
    config
}
