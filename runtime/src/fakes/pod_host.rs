//! A [`PodHost`] that records and models instead of touching the node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crust_linux::ns::{self, NamespaceKind, PinOptions};
use crust_network::config::NetworkConfigList;
use crust_network::{Attachment, DelAttempt};
use serde_json::Value;

use super::{Effect, Failures, Journal, Op, id_of, injected};
use crate::cgroups::PodSlice;
use crate::pods::host::{CniAddFailed, CniAdded};
use crate::pods::{PodError, PodHost, PodRecord};
use crust_cgroups::Controllers;

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
    /// cgroups of the node that crust did not make (kubelet's pod slices).
    kubelet_cgroups: Mutex<BTreeSet<PathBuf>>,
    /// What `unified_controllers` answers (None: a cgroup v1 node).
    controllers: Mutex<Option<Controllers>>,
    /// Every CNI DEL: pod ID and whether it may follow one cut short.
    del_attempts: Mutex<Vec<(String, DelAttempt)>>,
    /// `create_cgroup` waits for a CNI ADD to have begun (and fails if
    /// none does): RunPodSandbox must not wait for one before the other.
    cgroup_awaits_add: std::sync::atomic::AtomicBool,
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
            kubelet_cgroups: Mutex::default(),
            controllers: Mutex::default(),
            del_attempts: Mutex::default(),
            cgroup_awaits_add: Default::default(),
        }
    }

    /// Every CNI DEL so far: pod ID and attempt.
    pub fn del_attempts(&self) -> Vec<(String, DelAttempt)> {
        self.del_attempts.lock().unwrap().clone()
    }

    /// From now on `create_cgroup` returns only once a CNI ADD has begun,
    /// or fails after 10 s without one.
    pub fn cgroup_awaits_add(&self) {
        self.cgroup_awaits_add
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// kubelet made a cgroup (a pod slice) before the pod runs.
    pub fn add_kubelet_cgroup(&self, path: &Path) {
        self.kubelet_cgroups.lock().unwrap().insert(path.into());
    }

    pub fn kubelet_cgroups(&self) -> BTreeSet<PathBuf> {
        self.kubelet_cgroups.lock().unwrap().clone()
    }

    /// The node is cgroup v2 with these controllers (None: v1).
    pub fn set_controllers(&self, c: Option<Controllers>) {
        *self.controllers.lock().unwrap() = c;
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

    fn cgroup_exists(&self, path: &Path) -> bool {
        self.kubelet_cgroups.lock().unwrap().contains(path) || self.state().cgroups.contains(path)
    }

    fn unified_controllers(&self, _path: &Path) -> Result<Option<Controllers>, PodError> {
        Ok(*self.controllers.lock().unwrap())
    }

    /// Models what crust makes: a slice kubelet made is not crust's.
    fn create_cgroup(&self, path: &Path, slice: Option<&PodSlice>) -> Result<(), PodError> {
        self.journal.push(Effect::CreateCgroup(path.into()));
        if self
            .cgroup_awaits_add
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // A bound against a deadlock, not a timing: a run that adds
            // only after this returns never gets here with an ADD begun.
            let begun = || self.journal.count(|e| matches!(e, Effect::CniAdd(_))) > 0;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !begun() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if !begun() {
                return Err(PodError::Internal(
                    "no CNI ADD began while the pod cgroup was made".into(),
                ));
            }
        }
        self.check(Op::CreateCgroup)?;
        if slice.is_none_or(|s| s.owned) {
            self.state().cgroups.insert(path.into());
        }
        Ok(())
    }

    fn runtime_facts(&self) -> &crust_oci::RuntimeFacts {
        static FACTS: std::sync::OnceLock<crust_oci::RuntimeFacts> = std::sync::OnceLock::new();
        FACTS.get_or_init(|| crust_oci::RuntimeFacts {
            cgroup_v2: false,
            hugetlb_available: false,
            ..Default::default()
        })
    }

    fn update_cgroup(
        &self,
        path: &Path,
        _slice: Option<&PodSlice>,
        resources: &crust_api::v1::LinuxContainerResources,
    ) -> Result<(), PodError> {
        self.journal.push(Effect::UpdateCgroup(
            path.into(),
            resources.memory_limit_in_bytes,
            resources.cpu_quota,
        ));
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
        attempt: DelAttempt,
    ) -> Result<(), PodError> {
        self.journal.push(Effect::CniDel(att.container_id.clone()));
        self.del_attempts
            .lock()
            .unwrap()
            .push((att.container_id.clone(), attempt));
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

    fn delete_cgroup(&self, path: &Path, slice: Option<&PodSlice>) -> Result<(), PodError> {
        self.journal.push(Effect::DeleteCgroup(path.into()));
        self.check(Op::DeleteCgroup)?;
        if slice.is_none_or(|s| s.owned) {
            self.state().cgroups.remove(path);
        }
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
