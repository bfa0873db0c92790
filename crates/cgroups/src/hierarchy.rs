//! How the host mounts cgroups: the hierarchy kind, each mount, and which
//! controllers a cgroup has.

use std::fmt;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex, OnceLock};

use crate::cgroup::Cgroup;
use crate::dir::CgroupDir;
use crate::error::{Error, Result};
use crate::path::CgroupPath;

/// How the host mounts cgroups (serialized as `v1`, `hybrid`, `v2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hierarchy {
    /// Only cgroup v1 hierarchies.
    V1,
    /// v1 controller hierarchies plus a cgroup2 mount (systemd's "hybrid"
    /// layout, `/sys/fs/cgroup/unified`) that holds no resource controller
    /// crust drives. Resources go through v1; PSI is read from the cgroup2
    /// side where a cgroup exists there.
    Hybrid,
    /// The unified hierarchy (most current clusters).
    V2,
}

impl Hierarchy {
    /// Whether resource controllers are driven through the v2 interface.
    pub fn is_unified(self) -> bool {
        self == Hierarchy::V2
    }

    /// The name RuntimeConfig and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Hierarchy::V1 => "v1",
            Hierarchy::Hybrid => "hybrid",
            Hierarchy::V2 => "v2",
        }
    }
}

/// A cgroup controller, under its v1 or v2 name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Controller {
    Cpu,
    Cpuacct,
    Cpuset,
    Memory,
    /// v1 `blkio`.
    Blkio,
    /// v2 `io`.
    Io,
    Pids,
    Hugetlb,
    Devices,
    Freezer,
    NetCls,
    NetPrio,
    PerfEvent,
    Rdma,
    Misc,
}

impl Controller {
    pub const ALL: [Controller; 15] = [
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Cpuset,
        Controller::Memory,
        Controller::Blkio,
        Controller::Io,
        Controller::Pids,
        Controller::Hugetlb,
        Controller::Devices,
        Controller::Freezer,
        Controller::NetCls,
        Controller::NetPrio,
        Controller::PerfEvent,
        Controller::Rdma,
        Controller::Misc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Cpuset => "cpuset",
            Controller::Memory => "memory",
            Controller::Blkio => "blkio",
            Controller::Io => "io",
            Controller::Pids => "pids",
            Controller::Hugetlb => "hugetlb",
            Controller::Devices => "devices",
            Controller::Freezer => "freezer",
            Controller::NetCls => "net_cls",
            Controller::NetPrio => "net_prio",
            Controller::PerfEvent => "perf_event",
            Controller::Rdma => "rdma",
            Controller::Misc => "misc",
        }
    }

    pub fn from_name(name: &str) -> Option<Controller> {
        Controller::ALL.into_iter().find(|c| c.name() == name)
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of controllers.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Controllers(u32);

impl Controllers {
    pub fn new() -> Self {
        Controllers(0)
    }

    /// Parses a space-separated list as in `cgroup.controllers` (names
    /// this crate does not know are left out).
    pub fn parse(list: &str) -> Self {
        list.split_whitespace()
            .filter_map(Controller::from_name)
            .collect()
    }

    pub fn insert(&mut self, c: Controller) {
        self.0 |= c.bit();
    }

    pub fn contains(self, c: Controller) -> bool {
        self.0 & c.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Controller> {
        Controller::ALL
            .into_iter()
            .filter(move |c| self.contains(*c))
    }
}

impl FromIterator<Controller> for Controllers {
    fn from_iter<I: IntoIterator<Item = Controller>>(iter: I) -> Self {
        let mut set = Controllers::new();
        for c in iter {
            set.insert(c);
        }
        set
    }
}

impl fmt::Debug for Controllers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(Controller::name))
            .finish()
    }
}

impl fmt::Display for Controllers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for c in self.iter() {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            f.write_str(c.name())?;
        }
        Ok(())
    }
}

/// One mounted cgroup v1 hierarchy: its controllers (co-mounted ones share
/// a mount, e.g. `cpu,cpuacct`), or a name for a controller-less one
/// (`name=systemd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Mount {
    pub path: PathBuf,
    pub controllers: Controllers,
    /// `systemd` for `name=systemd`.
    pub name: Option<String>,
}

/// The cgroup hierarchies of this host, as found once at start. Clones
/// share the open mount points.
#[derive(Debug, Clone)]
pub struct CgroupFs {
    hierarchy: Hierarchy,
    /// The cgroup2 mount: the root on V2, `/sys/fs/cgroup/unified` on a
    /// hybrid host.
    unified: Option<PathBuf>,
    /// v1 hierarchies, controller ones first (V1 and Hybrid).
    v1: Vec<V1Mount>,
    /// Each mount point, opened on first use and kept: every cgroup is
    /// opened beneath one, and reopening the mount on each call would
    /// cost two syscalls per cgroup on the stats path.
    roots: Arc<Mutex<Vec<MountRoot>>>,
    /// The host's huge page sizes, read on first use.
    hugepage_sizes: Arc<OnceLock<Vec<String>>>,
}

/// A mount point and its open directory.
type MountRoot = (PathBuf, Arc<crust_linux::fs::Dir>);

impl PartialEq for CgroupFs {
    fn eq(&self, other: &Self) -> bool {
        self.hierarchy == other.hierarchy && self.unified == other.unified && self.v1 == other.v1
    }
}

impl Eq for CgroupFs {}

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;

impl CgroupFs {
    /// Finds the hierarchies in this process's mount table.
    pub fn detect() -> Result<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(Error::io("read", "/proc/self/mountinfo"))?;
        let fs = Self::from_mountinfo(&mountinfo)?;
        // The mount table names the file systems; make sure the mount
        // points are really them (nothing mounted over them since).
        for (path, want) in fs
            .unified
            .iter()
            .map(|p| (p, CGROUP2_SUPER_MAGIC))
            .chain(fs.v1.iter().map(|m| (&m.path, CGROUP_SUPER_MAGIC)))
        {
            let dir = CgroupDir::open(path, &CgroupPath::root())
                .map_err(Error::io("open cgroup mount", path))?;
            let got = dir.fs_type().map_err(Error::io("statfs", path))?;
            if got != want {
                return Err(Error::Parse {
                    path: path.clone(),
                    why: format!("file system magic 0x{got:x}, expected 0x{want:x}"),
                });
            }
        }
        Ok(fs)
    }

    /// The hierarchies a mount table (`/proc/self/mountinfo`) shows. Where
    /// a hierarchy is mounted more than once, the mount of its root is
    /// used, under `/sys/fs/cgroup` by preference.
    pub fn from_mountinfo(mountinfo: &str) -> Result<Self> {
        let mut unified: Option<(PathBuf, bool)> = None;
        let mut v1: Vec<(V1Mount, bool)> = Vec::new();
        for m in crust_linux::mountinfo::parse(mountinfo) {
            if !m.fs_type.starts_with("cgroup") {
                continue;
            }
            let mount_point = m.mount_point;
            let preferred = m.root == Path::new("/") && mount_point.starts_with("/sys/fs/cgroup");
            let better = |current: Option<bool>| match current {
                None => true,
                Some(cur) => preferred && !cur,
            };
            match m.fs_type.as_str() {
                "cgroup2" if better(unified.as_ref().map(|u| u.1)) => {
                    unified = Some((mount_point, preferred));
                }
                "cgroup" => {
                    let controllers: Controllers = m
                        .super_options
                        .iter()
                        .filter_map(|o| Controller::from_name(o))
                        .collect();
                    let name = m
                        .super_options
                        .iter()
                        .find_map(|o| o.strip_prefix("name="))
                        .filter(|n| !n.is_empty())
                        .map(str::to_string);
                    if controllers.is_empty() && name.is_none() {
                        continue;
                    }
                    let mount = V1Mount {
                        path: mount_point,
                        controllers,
                        name,
                    };
                    match v1.iter_mut().find(|(old, _)| {
                        old.controllers == mount.controllers && old.name == mount.name
                    }) {
                        Some(slot) => {
                            if better(Some(slot.1)) {
                                *slot = (mount, preferred);
                            }
                        }
                        None => v1.push((mount, preferred)),
                    }
                }
                _ => {}
            }
        }
        let mut v1: Vec<V1Mount> = v1.into_iter().map(|(m, _)| m).collect();
        // Controller hierarchies first, then named ones.
        v1.sort_by_key(|m| m.controllers.is_empty());
        let unified = unified.map(|u| u.0);
        let has_v1_controllers = v1.iter().any(|m| !m.controllers.is_empty());
        let hierarchy = match (&unified, has_v1_controllers) {
            (Some(_), false) => Hierarchy::V2,
            (Some(_), true) => Hierarchy::Hybrid,
            (None, true) => Hierarchy::V1,
            (None, false) => {
                return Err(Error::unsupported(
                    "cgroups",
                    "no cgroup hierarchy is mounted (neither cgroup2 nor v1 controllers)",
                ));
            }
        };
        if hierarchy == Hierarchy::V2 {
            // A named v1 hierarchy beside a pure v2 host is not used.
            v1.clear();
        }
        Ok(CgroupFs {
            hierarchy,
            unified,
            v1,
            roots: Arc::default(),
            hugepage_sizes: Arc::default(),
        })
    }

    /// A pure cgroup v2 layout at `root` (a real cgroup2 mount, or a fake
    /// tree in tests).
    pub fn v2(root: impl Into<PathBuf>) -> Self {
        CgroupFs {
            hierarchy: Hierarchy::V2,
            unified: Some(root.into()),
            v1: Vec::new(),
            roots: Arc::default(),
            hugepage_sizes: Arc::default(),
        }
    }

    /// A v1 layout (Hybrid when `unified` is given) from explicit mounts.
    pub fn v1(mounts: Vec<V1Mount>, unified: Option<PathBuf>) -> Self {
        CgroupFs {
            hierarchy: if unified.is_some() {
                Hierarchy::Hybrid
            } else {
                Hierarchy::V1
            },
            unified,
            v1: mounts,
            roots: Arc::default(),
            hugepage_sizes: Arc::default(),
        }
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.hierarchy
    }

    /// The cgroup2 mount (V2 root, or the hybrid `unified` mount).
    pub fn unified_mount(&self) -> Option<&Path> {
        self.unified.as_deref()
    }

    /// The v1 hierarchies (empty on V2).
    pub fn v1_mounts(&self) -> &[V1Mount] {
        &self.v1
    }

    /// The v1 mount holding `controller`.
    pub fn v1_mount(&self, controller: Controller) -> Option<&Path> {
        self.v1
            .iter()
            .find(|m| m.controllers.contains(controller))
            .map(|m| m.path.as_path())
    }

    /// Every mount a cgroup can have a directory in: the v2 root; or each
    /// v1 hierarchy (controllers, then named ones) and the hybrid cgroup2.
    pub fn all_mounts(&self) -> Vec<&Path> {
        match self.hierarchy {
            Hierarchy::V2 => self.unified.iter().map(|p| p.as_path()).collect(),
            Hierarchy::V1 | Hierarchy::Hybrid => self
                .v1
                .iter()
                .map(|m| m.path.as_path())
                .chain(self.unified.as_deref())
                .collect(),
        }
    }

    /// The mounts resources and stats go through: the v2 root, or the v1
    /// controller hierarchies.
    pub fn controller_mounts(&self) -> Vec<&Path> {
        match self.hierarchy {
            Hierarchy::V2 => self.unified.iter().map(|p| p.as_path()).collect(),
            Hierarchy::V1 | Hierarchy::Hybrid => self
                .v1
                .iter()
                .filter(|m| !m.controllers.is_empty())
                .map(|m| m.path.as_path())
                .collect(),
        }
    }

    /// The controllers `cgroup` has: on v2 its `cgroup.controllers` (what
    /// its parent delegates to it); on v1 every mounted controller.
    pub fn controllers(&self, cgroup: &CgroupPath) -> Result<Controllers> {
        self.read_controllers(cgroup, "cgroup.controllers")
    }

    /// The controllers `cgroup` delegates to its children: on v2 its
    /// `cgroup.subtree_control`; on v1 every mounted controller. What a
    /// container created below a pod cgroup will have.
    pub fn subtree_controllers(&self, cgroup: &CgroupPath) -> Result<Controllers> {
        self.read_controllers(cgroup, "cgroup.subtree_control")
    }

    fn read_controllers(&self, cgroup: &CgroupPath, file: &str) -> Result<Controllers> {
        match (self.hierarchy, &self.unified) {
            (Hierarchy::V2, Some(root)) => {
                let dir = self
                    .open_dir(root, cgroup)
                    .map_err(Error::io("open cgroup", cgroup.under(root)))?;
                let list = dir
                    .read_string(file)
                    .map_err(Error::io("read", dir.file_path(file)))?
                    .ok_or_else(|| Error::Parse {
                        path: dir.file_path(file),
                        why: "missing: not a cgroup2 directory".into(),
                    })?;
                Ok(Controllers::parse(&list))
            }
            _ => Ok(self.v1.iter().fold(Controllers::new(), |mut all, m| {
                all.0 |= m.controllers.0;
                all
            })),
        }
    }

    /// The host's huge page sizes as hugetlb files name them (`2MB`,
    /// `1GB`), read once.
    pub fn hugepage_sizes(&self) -> &[String] {
        self.hugepage_sizes
            .get_or_init(crate::stats::hugepage_sizes)
    }

    /// Opens `cgroup` in the hierarchy mounted at `mount`.
    pub(crate) fn open_dir(&self, mount: &Path, cgroup: &CgroupPath) -> std::io::Result<CgroupDir> {
        let root = {
            let mut roots = self.roots.lock().unwrap_or_else(|e| e.into_inner());
            match roots.iter().find(|(m, _)| m == mount) {
                Some((_, fd)) => fd.clone(),
                None => {
                    let fd = Arc::new(CgroupDir::open_mount(mount)?);
                    roots.push((mount.to_path_buf(), fd.clone()));
                    fd
                }
            }
        };
        CgroupDir::open_in(&root, mount, cgroup)
    }

    /// Opens `cgroup` in the hierarchy at `mount`, None when it does not
    /// exist there.
    pub(crate) fn open_existing(
        &self,
        mount: &Path,
        cgroup: &CgroupPath,
    ) -> std::io::Result<Option<CgroupDir>> {
        match self.open_dir(mount, cgroup) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether swap is accounted, so that a memory+swap limit can be set:
    /// v1 `memory.memsw.*` files, v2 `memory.swap.max` (which the root
    /// cgroup lacks: a child is looked at).
    pub fn swap_accounting(&self) -> bool {
        match self.hierarchy {
            Hierarchy::V2 => self.unified.as_deref().is_some_and(|root| {
                let Ok(dir) = self.open_dir(root, &CgroupPath::root()) else {
                    return false;
                };
                dir.subdirs()
                    .unwrap_or_default()
                    .iter()
                    .any(|name| dir.child(name).is_ok_and(|c| c.has("memory.swap.max")))
            }),
            _ => self.v1_mount(Controller::Memory).is_some_and(|m| {
                self.open_dir(m, &CgroupPath::root())
                    .is_ok_and(|d| d.has("memory.memsw.limit_in_bytes"))
            }),
        }
    }

    /// Whether resources of `controller` can be set here: v2, enabled in
    /// the root (available to every cgroup whose parents delegate it);
    /// v1, mounted.
    pub fn has_controller(&self, controller: Controller) -> bool {
        self.controllers(&CgroupPath::root())
            .is_ok_and(|c| c.contains(controller))
    }

    /// A handle on the cgroup at `path` in these hierarchies. Touches
    /// nothing.
    pub fn cgroup(&self, path: CgroupPath) -> Cgroup<'_> {
        Cgroup::new(self, path)
    }
}

/// Whether systemd is the init system, a precondition for the systemd
/// cgroup driver (the test of sd_booted(3)).
pub fn systemd_booted() -> bool {
    std::fs::symlink_metadata("/run/systemd/system").is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's layout (Debian 12 without systemd, hybrid).
    const HYBRID: &str = "\
22 1 0:21 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// systemd 252's v1 layout: co-mounted controllers, xattr, a bind
    /// mount of a sub-cgroup elsewhere.
    const V1_SYSTEMD: &str = "\
25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
29 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
31 25 0:28 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,net_cls,net_prio
90 30 0:27 /kubepods /var/lib/x/memory rw,relatime - cgroup cgroup rw,memory
";

    const V2: &str = "\
25 18 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
26 25 0:30 / /sys/fs/cgroup/misc\\040dir rw - ext4 /dev/sda1 rw
";

    #[test]
    fn hybrid_layout() {
        let fs = CgroupFs::from_mountinfo(HYBRID).unwrap();
        assert_eq!(fs.hierarchy(), Hierarchy::Hybrid);
        assert_eq!(
            fs.unified_mount(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            fs.v1_mount(Controller::Memory),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            fs.v1_mount(Controller::Cpuacct),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        assert_eq!(fs.v1_mount(Controller::Hugetlb), None);
        let named: Vec<_> = fs.v1_mounts().iter().filter(|m| m.name.is_some()).collect();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].name.as_deref(), Some("systemd"));
        assert_eq!(fs.controller_mounts().len(), 8);
        // Every hierarchy, the named one and the hybrid cgroup2 included.
        let all = fs.all_mounts();
        assert_eq!(all.len(), 10);
        assert!(all.contains(&Path::new("/sys/fs/cgroup/systemd")));
        assert!(all.contains(&Path::new("/sys/fs/cgroup/unified")));
        let c = fs.controllers(&CgroupPath::root()).unwrap();
        assert!(c.contains(Controller::Memory) && c.contains(Controller::Blkio));
        assert!(!c.contains(Controller::Io));
    }

    #[test]
    fn v1_layout_with_comounts_and_binds() {
        let fs = CgroupFs::from_mountinfo(V1_SYSTEMD).unwrap();
        assert_eq!(fs.hierarchy(), Hierarchy::V1);
        assert_eq!(
            fs.v1_mount(Controller::Cpu),
            Some(Path::new("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            fs.v1_mount(Controller::Cpuacct),
            fs.v1_mount(Controller::Cpu)
        );
        assert_eq!(
            fs.v1_mount(Controller::NetPrio),
            Some(Path::new("/sys/fs/cgroup/net_cls,net_prio"))
        );
        // The bind mount of /kubepods is not the memory hierarchy's root.
        assert_eq!(
            fs.v1_mount(Controller::Memory),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(fs.v1_mounts().len(), 4);
        assert!(fs.v1_mounts().last().unwrap().name.is_some());
    }

    #[test]
    fn v2_layout() {
        let fs = CgroupFs::from_mountinfo(V2).unwrap();
        assert_eq!(fs.hierarchy(), Hierarchy::V2);
        assert_eq!(fs.unified_mount(), Some(Path::new("/sys/fs/cgroup")));
        assert!(fs.v1_mounts().is_empty());
        assert_eq!(fs.all_mounts(), vec![Path::new("/sys/fs/cgroup")]);
    }

    #[test]
    fn nothing_mounted() {
        let e = CgroupFs::from_mountinfo("22 1 0:21 / / rw - ext4 /dev/sda rw\n").unwrap_err();
        assert!(e.is_unsupported());
    }

    #[test]
    fn controller_sets() {
        let c = Controllers::parse("cpuset cpu io memory hugetlb pids rdma misc future");
        assert!(c.contains(Controller::Io) && c.contains(Controller::Misc));
        assert!(!c.contains(Controller::Blkio));
        assert_eq!(c.to_string(), "cpu cpuset memory io pids hugetlb rdma misc");
        assert!(Controllers::parse("").is_empty());
    }

    #[test]
    fn detects_this_host() {
        // Whatever the host runs, detection must agree with the kernel.
        let fs = CgroupFs::detect().unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let cgroup2_at_root = mounts.lines().any(|l| {
            l.split_whitespace().nth(1) == Some("/sys/fs/cgroup") && l.contains(" cgroup2 ")
        });
        assert_eq!(fs.hierarchy() == Hierarchy::V2, cgroup2_at_root, "{fs:?}");
    }
}
