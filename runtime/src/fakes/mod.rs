//! Recording fakes of the node effects, for unit tests of the pod and
//! container life cycles without root (as youki's `TestHelperSyscall`
//! stands in for its `Syscall`).
//!
//! Each fake keeps a model of what exists on its "node" (dirs, pins,
//! cgroups, mounts, CNI attachments, monitors, leases) so a test can check
//! that an undo left nothing behind, appends every effect to a [`Journal`]
//! shared by all fakes so a test can check their order, and can be told
//! to fail an operation ([`Op`]) until healed.

mod container_host;
mod images;
mod pod_host;
mod rig;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use container_host::FakeContainerHost;
pub use images::FakeImages;
pub use pod_host::FakePodHost;
pub use rig::{IMAGE_ID, Rig, container_config, pod_spec};

/// One effect on the node, as the journal records it. Pods and containers
/// are named by their ID, dirs by their path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    CreateDir(PathBuf),
    PinNamespaces(PathBuf),
    CreateCgroup(PathBuf),
    /// A pod cgroup's new limits: memory, CPU quota.
    UpdateCgroup(PathBuf, i64, i64),
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
    Kill {
        id: String,
        signal: i32,
        all: bool,
    },
    Update(String),
    OomScoreAdj {
        id: String,
        value: i32,
    },
    WriteUnified(String, Vec<(String, String)>),
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
    pub(super) fn push(&self, e: Effect) {
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
pub(super) struct Failures(Mutex<HashSet<Op>>);

impl Failures {
    pub(super) fn set(&self, op: Op, on: bool) {
        let mut f = self.0.lock().unwrap();
        if on {
            f.insert(op);
        } else {
            f.remove(&op);
        }
    }

    pub(super) fn check(&self, op: Op) -> bool {
        self.0.lock().unwrap().contains(&op)
    }
}

pub(super) fn injected(op: Op) -> String {
    format!("injected failure of {op:?}")
}

/// The last path component: the ID of a pod or container dir.
pub(super) fn id_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
