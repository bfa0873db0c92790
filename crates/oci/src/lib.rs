//! CRI ContainerConfig + PodSandboxConfig + image config -> OCI runtime spec.
//!
//! Pure functions: no I/O but what the caller passes in (the image's
//! /etc/passwd and /etc/group as text, host look-ups through the small
//! [`Host`] trait). Every field a request or an image supplies is treated as
//! hostile and checked; errors are [`SpecError`]s whose `Display` names the
//! CRI field (`config.mounts[2].container_path: must be absolute`) and whose
//! [`SpecError::class`] says which gRPC code to return.
//!
//! Entry points:
//! - [`container_spec`] for CreateContainer,
//! - [`pause_spec`] for the pause process of a pod that shares a PID
//!   namespace,
//! - helpers the daemon needs elsewhere: [`resolve_user`] (also for
//!   ContainerStatus.user), [`stop_signal`], [`cgroups_path`],
//!   [`pod_cgroup_parent`], [`pod_sysctls`] (for the namespace pinning at
//!   RunPodSandbox), [`default_seccomp_profile`], [`parse_seccomp_profile`],
//!   and [`libcontainer_compat`] for the embedded runtime;
//!   [`linux_resources`], [`effective_oom_score_adj`] and
//!   [`merge_resources`] for UpdateContainerResources (the conversion
//!   CreateContainer uses too), [`pod_cgroup_resources`] for
//!   UpdatePodSandboxResources.
//!
//! Behaviour follows containerd's CRI plugin unless noted. Deliberate
//! differences:
//! - A missing host path of a mount is an error (containerd creates it).
//! - Masked/read-only paths: the request's lists replace the defaults when
//!   non-empty; empty lists (proto3 cannot tell "unset" from "empty") mean
//!   the defaults, never "unmasked".
//! - The default seccomp profile is stricter than moby's (see [`seccomp`]).
//! - Ambient capabilities are also added to the other four sets.
//! - Image volume mounts are the caller's to resolve: the daemon mounts the
//!   image read-only and passes a read-only bind mount of it; an unresolved
//!   `mounts[].image` is refused. Likewise id-mapped mounts
//!   (`mounts[].uidMappings`): the daemon id-maps the source through the
//!   pod's user namespace and passes a plain bind of that.
//! - CDI devices are the caller's to resolve (it reads the spec files):
//!   [`cdi`] parses them and applies a device's edits to the spec.
//! - Not implemented, rejected with a clear error: AppArmor Localhost
//!   profiles on a node without AppArmor.
//!   Ignored: SELinux options and relabelling (no SELinux on crust hosts),
//!   AppArmor RuntimeDefault on a node without AppArmor (see [`apparmor`]
//!   for the node with it), image `Volumes` (no anonymous
//!   volumes: the directories already exist in the image, as with CRI-O's
//!   `image_volumes = "ignore"`).

mod apparmor;
mod caps;
pub mod cdi;
mod cgroup;
mod compat;
mod devices;
mod error;
mod input;
mod mounts;
mod namespaces;
mod process;
mod resources;
pub mod seccomp;
mod signal;
mod spec;
mod sysctls;
mod user;
mod validate;

#[cfg(test)]
mod tests;

pub use caps::{ALL_CAPABILITIES, DEFAULT_CAPABILITIES, capabilities};
pub use cgroup::{
    DEFAULT_CGROUPFS_PARENT, DEFAULT_SYSTEMD_PARENT, cgroups_path, pod_cgroup_parent,
};
pub use compat::{emulate_cgroup_v1_mount, libcontainer_compat, swap_masked_eq};
pub use error::{ErrorClass, SpecError};
pub use input::{
    CgroupDriver, Host, HostDevice, HostPropagation, IdMapping, ImageConfig, PauseInput, PodFacts,
    RuntimeFacts, SeccompArch, SpecInput, UnsetSeccomp, UserNs,
};
pub use mounts::{BIND_MOUNT_OPTIONS, IMAGE_VOLUME_OPTIONS, default_mounts};
pub use process::{DEFAULT_PATH_ENV, magic_dir, process_args, process_cwd, process_env};
pub use resources::{
    effective_oom_score_adj, linux_resources, merge_resources, pod_cgroup_resources,
};
pub use seccomp::{
    MAX_SECCOMP_PROFILE_BYTES, default_seccomp_profile, parse_seccomp_profile,
    seccomp_architectures,
};
pub use signal::{parse_signal, stop_signal};
pub use spec::{
    DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS, OCI_VERSION, PAUSE_OOM_SCORE_ADJ, PAUSE_UID,
    annotations, container_spec, pause_spec,
};
pub use sysctls::{SysctlNamespace, pod_sysctls, sysctl_namespace};
pub use user::{ResolvedUser, resolve_user};

pub use oci_spec::runtime::Spec;
