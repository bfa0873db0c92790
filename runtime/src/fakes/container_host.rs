//! A [`ContainerHost`] that records and models instead of touching the
//! node, and spec generation's look-ups on a node with nothing on it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crust_cgroups::{CgroupPath, Controllers};
use crust_oci::{Host, HostDevice, HostPropagation};
use crust_shim_protocol::{ExecRequest, ExecSyncOutput, ExitInfo, Status};
use serde_json::Value;
use tokio::sync::Notify;

use super::{Effect, Failures, Journal, Op, id_of, injected};
use crate::cgroups::ContainerCgroup;
use crate::containers::{ContainerError, ContainerHost, ContainerRecord};
use crate::launch::Launch;

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
    /// When each monitor started its process (Unix ns).
    pub started_at: BTreeMap<String, i64>,
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
    /// Every resource update: (container ID, OCI resources).
    updates: Mutex<Vec<(String, Value)>>,
    next_pid: Mutex<i32>,
    /// What `unified_controllers` answers (None: a cgroup v1 node), and
    /// the cgroups it was asked about.
    controllers: Mutex<Option<Controllers>>,
    controllers_asked: Mutex<Vec<CgroupPath>>,
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
            updates: Mutex::new(Vec::new()),
            next_pid: Mutex::new(1000),
            controllers: Mutex::default(),
            controllers_asked: Mutex::default(),
        }
    }

    /// The node is cgroup v2 with these controllers (None: v1).
    pub fn set_controllers(&self, c: Option<Controllers>) {
        *self.controllers.lock().unwrap() = c;
    }

    /// The cgroups whose controllers the daemon asked for.
    pub fn controllers_asked(&self) -> Vec<CgroupPath> {
        self.controllers_asked.lock().unwrap().clone()
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

    pub fn updates(&self) -> Vec<(String, Value)> {
        self.updates.lock().unwrap().clone()
    }

    /// The container's process exits by itself with `code`.
    pub fn exit(&self, id: &str, code: i32) {
        self.state()
            .processes
            .insert(id.into(), Process::Exited(code));
        self.exited.notify_waiters();
    }

    /// The container's process runs: a start reached the monitor (the
    /// daemon may not have recorded it).
    pub fn run(&self, id: &str) {
        self.run_since(id, crate::clock::now_ns());
    }

    /// [`Self::run`], the monitor having started it at `unix_nanos`.
    pub fn run_since(&self, id: &str, unix_nanos: i64) {
        let mut node = self.state();
        node.processes.insert(id.into(), Process::Running);
        node.started_at.insert(id.into(), unix_nanos);
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

    fn prepare_mount_points(&self, _rootfs: &Path, _files: &[&str]) -> Result<(), ContainerError> {
        Ok(())
    }

    fn resolve_in_rootfs(
        &self,
        _rootfs: &Path,
        path: &str,
        _field: &str,
    ) -> Result<String, ContainerError> {
        Ok(path.to_string())
    }

    fn make_working_dir(
        &self,
        _rootfs: &Path,
        _real: &str,
        _field: &str,
    ) -> Result<(), ContainerError> {
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
                self.run(&id);
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

    async fn update(&self, state_dir: &Path, resources: &Value) -> Result<(), ContainerError> {
        self.journal.push(Effect::Update(id_of(state_dir)));
        self.updates
            .lock()
            .unwrap()
            .push((id_of(state_dir), resources.clone()));
        Ok(())
    }

    async fn checkpoint(
        &self,
        _state_dir: &Path,
        _image_path: &Path,
        _work_path: &Path,
        _timeout: std::time::Duration,
    ) -> Result<(), ContainerError> {
        Err(ContainerError::FailedPrecondition(
            "the fake host cannot checkpoint".into(),
        ))
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

    async fn monitor_status(&self, state_dir: &Path) -> Option<Status> {
        match self.process(state_dir)? {
            Process::Created => Some(Status::Created),
            Process::Running => Some(Status::Running),
            // The monitor has left (with or without an exit file).
            Process::Exited(_) | Process::Lost => None,
        }
    }

    async fn monitor_started_at(&self, state_dir: &Path) -> Option<i64> {
        let node = self.state();
        let id = id_of(state_dir);
        match node.processes.get(&id)? {
            Process::Running => node.started_at.get(&id).copied(),
            _ => None,
        }
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

    fn set_oom_score_adj(&self, rec: &ContainerRecord, value: i32) -> Result<(), ContainerError> {
        self.journal.push(Effect::OomScoreAdj {
            id: rec.id.clone(),
            value,
        });
        Ok(())
    }

    fn container_cgroup(&self, rec: &ContainerRecord) -> Option<ContainerCgroup> {
        ContainerCgroup::parse(rec.cgroups_path.as_deref()?).ok()
    }

    fn unified_controllers(
        &self,
        path: &CgroupPath,
    ) -> Result<Option<Controllers>, ContainerError> {
        self.controllers_asked.lock().unwrap().push(path.clone());
        Ok(*self.controllers.lock().unwrap())
    }

    fn write_unified(
        &self,
        rec: &ContainerRecord,
        unified: &std::collections::HashMap<String, String>,
    ) -> Result<(), ContainerError> {
        let mut keys: Vec<_> = unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        keys.sort();
        self.journal
            .push(Effect::WriteUnified(rec.id.clone(), keys));
        Ok(())
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

    fn mount_image_volume(
        &self,
        rec: &ContainerRecord,
        index: usize,
        _lowers: &[PathBuf],
        sub_path: &str,
        _userns: Option<&crust_oci::UserNs>,
    ) -> Result<PathBuf, ContainerError> {
        Ok(rec
            .state_dir
            .join("image-volumes")
            .join(index.to_string())
            .join(sub_path))
    }

    fn idmap_layers(
        &self,
        _rec: &ContainerRecord,
        lowers: &[PathBuf],
        _userns: &crust_oci::UserNs,
    ) -> Result<Vec<PathBuf>, ContainerError> {
        Ok(lowers.to_vec())
    }

    fn idmap_mount(
        &self,
        _rec: &ContainerRecord,
        _index: usize,
        source: &Path,
        _userns: &crust_oci::UserNs,
    ) -> Result<PathBuf, ContainerError> {
        Ok(source.to_path_buf())
    }

    fn unmount_private_mounts(&self, _rec: &ContainerRecord) -> Result<(), ContainerError> {
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

    /// The spec the container was launched with (what the real host
    /// keeps as `spec.json`).
    fn read_spec(&self, bundle: &Path) -> Value {
        self.launches
            .lock()
            .unwrap()
            .iter()
            .rfind(|l| l.bundle == bundle)
            .and_then(|l| serde_json::to_value(&l.spec).ok())
            .unwrap_or(Value::Null)
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

    fn apparmor_profile_loaded(&self, _name: &str) -> io::Result<bool> {
        // RuntimeFacts of the fake node say "no AppArmor": never asked.
        Err(io::Error::other("no AppArmor on the fake node"))
    }

    fn read_seccomp_profile(&self, path: &Path) -> io::Result<String> {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no profiles on the fake node", path.display()),
        ))
    }
}
