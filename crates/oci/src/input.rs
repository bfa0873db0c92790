//! What spec generation needs besides the CRI messages: the image's config,
//! facts about the pod the daemon keeps, node-wide runtime facts, and a small
//! [`Host`] trait for the few host look-ups (path resolution, device nodes,
//! mount propagation, seccomp profile files, loaded AppArmor profiles) so the crate itself does no I/O.

use std::io;
use std::path::{Path, PathBuf};

use crust_api::v1::{ContainerConfig, PodSandboxConfig};
use oci_spec::runtime::{Capability, LinuxDeviceType, PosixRlimit};
use serde::{Deserialize, Serialize};

/// The parts of an OCI image config (`config` object) a container spec uses.
/// The image crate fills it; fields are as the image says, unchecked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageConfig {
    /// `Entrypoint`. `[""]` means "no entrypoint", as Docker writes it.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`, `KEY=value` entries.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: String,
    /// `User`: `uid`, `name`, `uid:gid`, `name:group`, `uid:group`, `name:gid`.
    pub user: String,
    /// `StopSignal`, e.g. `SIGQUIT`, `QUIT` or `3`. See [`crate::stop_signal`].
    pub stop_signal: String,
    /// `Volumes` (container paths). Not turned into mounts: see the crate docs.
    pub volumes: Vec<String>,
}

/// How cgroups are managed on the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// Paths under the cgroup mount: `<parent>/crust-<id>`.
    #[default]
    Cgroupfs,
    /// systemd units: `<slice>:crust:<id>` (a `crust-<id>.scope` in `<slice>`).
    Systemd,
}

/// What to do when a container request sets neither `seccomp` nor
/// `seccomp_profile_path`. The CRI says "unconfined"; containerd lets the
/// operator choose (`unset_seccomp_profile`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnsetSeccomp {
    #[default]
    Unconfined,
    RuntimeDefault,
}

/// The seccomp architecture family of the node; selects the
/// `architectures` list and the arch-specific syscalls of the default profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeccompArch {
    /// x86_64, x86 and x32 ABIs.
    X86_64,
    /// aarch64 and 32-bit arm ABIs.
    Aarch64,
    /// Anything else: no `architectures` (native only), no arch-specific rules.
    Other,
}

impl SeccompArch {
    /// The family of the machine this code was compiled for.
    pub fn host() -> Self {
        match std::env::consts::ARCH {
            "x86_64" => SeccompArch::X86_64,
            "aarch64" => SeccompArch::Aarch64,
            _ => SeccompArch::Other,
        }
    }
}

impl Default for SeccompArch {
    fn default() -> Self {
        SeccompArch::host()
    }
}

/// Node- and handler-wide facts the daemon detects at start (or reads from
/// its config) and passes to every spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeFacts {
    /// The host uses the unified cgroup v2 hierarchy.
    pub cgroup_v2: bool,
    /// Which cgroup driver the daemon uses.
    pub cgroup_driver: CgroupDriver,
    /// The daemon's own oom_score_adj: requests below it are raised to it
    /// (containerd's restrict_oom_score_adj), since lowering needs
    /// CAP_SYS_RESOURCE.
    pub min_oom_score_adj: i64,
    /// The memory cgroup has swap accounting (`memory.swap.max` on v2,
    /// `memory.memsw.limit_in_bytes` on v1).
    pub swap_available: bool,
    /// The hugetlb controller is present.
    pub hugetlb_available: bool,
    /// The OCI runtime handler supports the `rro` (recursive read-only)
    /// mount option (runc >= 1.1 and crun on kernel >= 5.12, youki).
    pub rro_supported: bool,
    /// The node's hostname: used for `HOSTNAME` when the pod config has none.
    pub node_hostname: String,
    /// The capabilities "ALL" and privileged mean: the daemon's own bounding
    /// set, so the runtime is never asked for a capability the kernel lacks.
    /// `None` = every capability oci-spec knows.
    pub all_capabilities: Option<Vec<Capability>>,
    /// Profile used when the request sets no seccomp profile at all.
    pub unset_seccomp: UnsetSeccomp,
    /// Architecture family for the default seccomp profile.
    pub seccomp_arch: SeccompArch,
    /// rlimits to set on every container process (daemon config). Empty, the
    /// containerd default, means the runtime's own limits are inherited.
    pub rlimits: Vec<PosixRlimit>,
    /// The node enforces AppArmor: the name of the daemon's default profile
    /// (what RuntimeDefault and an unset profile mean). None: no AppArmor
    /// on the node.
    pub apparmor_default_profile: Option<String>,
}

impl Default for RuntimeFacts {
    fn default() -> Self {
        RuntimeFacts {
            cgroup_v2: true,
            cgroup_driver: CgroupDriver::Cgroupfs,
            min_oom_score_adj: -1000,
            swap_available: true,
            hugetlb_available: true,
            rro_supported: true,
            node_hostname: String::new(),
            all_capabilities: None,
            unset_seccomp: UnsetSeccomp::Unconfined,
            seccomp_arch: SeccompArch::host(),
            rlimits: Vec::new(),
            apparmor_default_profile: None,
        }
    }
}

/// What the daemon knows about the pod a container joins.
///
/// Namespace modes (NODE or POD) come from the PodSandboxConfig; this carries
/// the paths of what the daemon created for the pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// The sandbox ID (annotations; the pause container's cgroup name).
    pub sandbox_id: String,
    /// Pinned network namespace (bind mount under the run dir). Required
    /// unless the pod uses the host network.
    pub net_ns: Option<PathBuf>,
    /// Pinned IPC namespace. Required unless the pod uses the host IPC.
    pub ipc_ns: Option<PathBuf>,
    /// Pinned UTS namespace. Required unless the pod uses the host network
    /// (UTS follows the network mode, as in kubelet).
    pub uts_ns: Option<PathBuf>,
    /// PID namespace of the pod's pause process (`/proc/<pid>/ns/pid`),
    /// when the pod shares one (pid mode POD). Required for containers whose
    /// pid mode is POD.
    pub pid_ns: Option<PathBuf>,
    /// PID namespace of the container named by `namespace_options.target_id`
    /// (the daemon looks it up and checks it is in the same pod). Required
    /// for pid mode TARGET.
    pub target_pid_ns: Option<PathBuf>,
    /// The pod's user namespace (userns_options mode POD), which owns its
    /// other namespaces; containers join it.
    pub user_ns: Option<UserNs>,
    /// The pod's cgroup parent as the daemon uses it (normally the sandbox
    /// config's `linux.cgroup_parent`, see [`crate::pod_cgroup_parent`]).
    pub cgroup_parent: String,
    /// The pod's resolv.conf, bind-mounted at /etc/resolv.conf.
    pub resolv_conf: Option<PathBuf>,
    /// The pod's hosts file, bind-mounted at /etc/hosts.
    pub hosts: Option<PathBuf>,
    /// The pod's hostname file, bind-mounted at /etc/hostname.
    pub hostname_file: Option<PathBuf>,
    /// The pod's /dev/shm (a tmpfs the daemon mounted), bind-mounted at
    /// /dev/shm. `None` gives each container a private 64 MiB tmpfs. Ignored
    /// for host-IPC pods, which get the host's /dev/shm.
    pub shm: Option<PathBuf>,
}

/// A pinned user namespace and its (single) uid and gid mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserNs {
    pub path: PathBuf,
    pub uid: IdMapping,
    pub gid: IdMapping,
}

/// One uid_map / gid_map range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

/// Mount propagation of the host mount that holds a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPropagation {
    Private,
    Shared,
    Slave,
}

/// A device node on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDevice {
    /// Path of the node relative to the path that was asked for: empty when
    /// that path is the node itself, `nvidia0` for `/dev` + `nvidia0`. For
    /// [`Host::all_devices`], relative to /dev.
    pub relative: PathBuf,
    /// `C` (char), `B` (block) or `P` (fifo).
    pub kind: LinuxDeviceType,
    pub major: i64,
    pub minor: i64,
    /// Permission bits of the node (st_mode & 0o7777).
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The host look-ups spec generation needs. The daemon implements it on the
/// real filesystem; tests implement it with maps.
pub trait Host {
    /// Resolves `path` as realpath(3) does (symlinks followed). An error of
    /// kind `NotFound` becomes [`crate::SpecError::HostPathNotFound`].
    fn resolve(&self, path: &Path) -> io::Result<PathBuf>;

    /// Propagation of the mount that holds the (resolved) `path`.
    fn propagation(&self, path: &Path) -> io::Result<HostPropagation>;

    /// The device node at `path` (symlinks followed), or every device node
    /// below it when it is a directory. An empty list means "not a device".
    fn devices(&self, path: &Path) -> io::Result<Vec<HostDevice>>;

    /// Every device node under the host's /dev for privileged containers,
    /// minus what a container must not get (pts, shm, mqueue, console...).
    fn all_devices(&self) -> io::Result<Vec<HostDevice>>;

    /// The contents of a seccomp profile file. Implementations bound the read
    /// (the crate rejects anything over [`crate::MAX_SECCOMP_PROFILE_BYTES`]).
    fn read_seccomp_profile(&self, path: &Path) -> io::Result<String>;

    /// Whether an AppArmor profile of this name is loaded in the kernel.
    /// Asked only on a node with AppArmor. For the daemon's default profile
    /// the daemon loads it when missing (an error says why it could not).
    fn apparmor_profile_loaded(&self, name: &str) -> io::Result<bool>;
}

/// Everything [`crate::container_spec`] takes.
pub struct SpecInput<'a> {
    /// The container's ID (the daemon's; used in the cgroup path).
    pub container_id: &'a str,
    /// CreateContainerRequest.config.
    pub config: &'a ContainerConfig,
    /// CreateContainerRequest.sandbox_config.
    pub sandbox_config: &'a PodSandboxConfig,
    /// The image's config.
    pub image: &'a ImageConfig,
    /// Image name for the `io.kubernetes.cri.image-name` annotation (the
    /// name the user asked for, as containerd records it).
    pub image_name: &'a str,
    /// The image's /etc/passwd, if it has one (read by the caller inside the
    /// rootfs, bounded).
    pub etc_passwd: Option<&'a str>,
    /// The image's /etc/group, if it has one.
    pub etc_group: Option<&'a str>,
    /// Absolute path of the container's root filesystem (the overlay mount).
    pub rootfs: &'a Path,
    pub pod: &'a PodFacts,
    pub runtime: &'a RuntimeFacts,
    pub host: &'a dyn Host,
}

/// Everything [`crate::pause_spec`] takes.
pub struct PauseInput<'a> {
    /// RunPodSandboxRequest.config.
    pub sandbox_config: &'a PodSandboxConfig,
    /// The pod's facts; `sandbox_id`, the pinned namespaces and
    /// `cgroup_parent` are used.
    pub pod: &'a PodFacts,
    /// Absolute path of the minimal rootfs holding the pause binary.
    pub rootfs: &'a Path,
    /// Path of the pause binary inside that rootfs, e.g. `/pause`.
    pub command: &'a str,
    pub runtime: &'a RuntimeFacts,
}
