//! What a check finds and reports: the kinds of orphans, how each is
//! repaired, the report, and the check's errors.

use std::path::PathBuf;

/// What an orphan is; [`OrphanKind::as_str`] is its `kind` in reports and
/// in the `crust_orphaned_bytes{kind}` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OrphanKind {
    ImageBlobs,
    ImageLayers,
    ImageTemp,
    ContainerDirs,
    PodDirs,
    Mounts,
    Monitors,
    Cgroups,
    ContainerRecords,
    PodRecords,
    Leases,
}

impl OrphanKind {
    pub const ALL: [OrphanKind; 11] = [
        OrphanKind::ImageBlobs,
        OrphanKind::ImageLayers,
        OrphanKind::ImageTemp,
        OrphanKind::ContainerDirs,
        OrphanKind::PodDirs,
        OrphanKind::Mounts,
        OrphanKind::Monitors,
        OrphanKind::Cgroups,
        OrphanKind::ContainerRecords,
        OrphanKind::PodRecords,
        OrphanKind::Leases,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrphanKind::ImageBlobs => "image_blobs",
            OrphanKind::ImageLayers => "image_layers",
            OrphanKind::ImageTemp => "image_temp",
            OrphanKind::ContainerDirs => "container_dirs",
            OrphanKind::PodDirs => "pod_dirs",
            OrphanKind::Mounts => "mounts",
            OrphanKind::Monitors => "monitors",
            OrphanKind::Cgroups => "cgroups",
            OrphanKind::ContainerRecords => "container_records",
            OrphanKind::PodRecords => "pod_records",
            OrphanKind::Leases => "leases",
        }
    }
}

/// How an orphan is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Remove `paths` (refused while anything is mounted below).
    RemoveDirs,
    /// Unmount `paths[0]`.
    Unmount,
    /// Kill the monitor `pid` of the state dir `paths[0]`.
    KillMonitor { pid: i32 },
    /// Kill what runs in the cgroup `paths[0]` and remove it (stopping
    /// `unit` first: a scope or slice of the systemd driver).
    DeleteCgroup { unit: Option<String> },
    /// Remove container `id` as RemoveContainer does (the daemon only).
    RemoveContainer,
    /// Remove pod sandbox `id` as RemovePodSandbox does (the daemon only).
    RemovePod,
    /// Release the image lease `id`.
    ReleaseLease,
    /// Through the image store's GC.
    Content,
}

/// Something the node holds that nothing references.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    pub kind: OrphanKind,
    /// What it belongs to or is: a container or pod ID, a digest, a
    /// lease holder, a temp file's name.
    pub id: String,
    /// Where it is: dirs, a mount point, a monitor's state dir, a cgroup.
    pub paths: Vec<PathBuf>,
    /// Bytes it takes on disk (0 for what takes none: mounts, processes,
    /// cgroups, records).
    pub bytes: u64,
    /// Why it is an orphan, and what more there is to know.
    pub detail: String,
    pub repair: Repair,
    /// After a repair: `Ok` removed, `Err` why not; None: not tried.
    pub outcome: Option<Result<(), String>>,
}

impl Orphan {
    pub fn new(
        kind: OrphanKind,
        id: String,
        paths: Vec<PathBuf>,
        detail: String,
        repair: Repair,
    ) -> Orphan {
        Orphan {
            kind,
            id,
            paths,
            bytes: 0,
            detail,
            repair,
            outcome: None,
        }
    }

    /// Still there: not repaired (or the repair failed).
    pub fn left(&self) -> bool {
        !matches!(self.outcome, Some(Ok(())))
    }
}

/// What a check found (and, with repair, did).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub orphans: Vec<Orphan>,
    pub repair: bool,
    pub root: PathBuf,
    pub run_dir: PathBuf,
}

impl Report {
    /// Orphans left by kind: (kind, count, bytes), every kind listed.
    pub fn left_by_kind(&self) -> Vec<(OrphanKind, u64, u64)> {
        OrphanKind::ALL
            .iter()
            .map(|k| {
                let left = self.orphans.iter().filter(|o| o.kind == *k && o.left());
                left.fold((*k, 0, 0), |(k, n, b), o| (k, n + 1, b + o.bytes))
            })
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A daemon runs on the root or run dir (an offline check must not).
    #[error("{0}")]
    DaemonRunning(String),
    #[error("no crust state under {0} (no meta.db): --root or --config names the daemon's root")]
    NoState(String),
    #[error(transparent)]
    Store(#[from] crust_store::Error),
    #[error("image store: {0}")]
    Image(#[from] crust_image::Error),
    #[error("cgroups: {0}")]
    Cgroups(#[from] crust_cgroups::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

impl From<tokio::task::JoinError> for CheckError {
    fn from(e: tokio::task::JoinError) -> Self {
        CheckError::Internal(format!("check task: {e}"))
    }
}

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckError {
    let what = what.into();
    move |source| CheckError::Io { what, source }
}
