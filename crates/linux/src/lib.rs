//! The kernel-facing parts of crust. Every raw syscall and every `unsafe`
//! block of the project lives in this crate, behind safe functions.
//!
//! For a pod sandbox:
//! - [`ns::pin_namespaces`] creates its network, IPC and UTS namespaces (with
//!   hostname and sysctls) and bind-mounts them into a directory of the run
//!   dir; [`ns::unpin_namespaces`] undoes it. [`ns::run_in_namespaces`] runs a
//!   closure inside pinned namespaces (port-forward dials, checks);
//!   [`ns::apply_sysctls`] writes sysctls into them later (after CNI ADD).
//! - [`cgroups::PodCgroup`] is the pod's cgroup under kubelet's `cgroup_parent`.
//! - [`sysctl`] decides which sysctls a pod may set.
//! - [`mounts`] holds the pod's shared `/dev/shm`.
//!
//! For a container's monitor: [`process`] (fork, descriptor passing, ptys).
//!
//! For the daemon's short-lived helpers (CNI plugins): [`spawn`] (children
//! that die with the daemon).

pub mod cgroups;
mod error;
pub mod mounts;
pub mod ns;
pub mod process;
pub mod spawn;
pub mod sysctl;

pub use error::Error;
