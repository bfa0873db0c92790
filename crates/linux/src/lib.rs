//! The kernel-facing parts of crust. Every raw syscall and every `unsafe`
//! block of the project lives in this crate, behind safe functions.
//!
//! For a pod sandbox:
//! - [`ns::pin_namespaces`] creates its network, IPC and UTS namespaces (with
//!   hostname and sysctls) and bind-mounts them into a directory of the run
//!   dir; [`ns::unpin_namespaces`] undoes it. [`ns::run_in_namespaces`] runs a
//!   closure inside pinned namespaces (port-forward dials, checks);
//!   [`ns::apply_sysctls`] writes sysctls into them later (after CNI ADD).
//! - (cgroups are crates/cgroups' business.)
//! - [`sysctl`] decides which sysctls a pod may set.
//! - [`netstats`] reads the interface counters inside pods' network
//!   namespaces; [`procstats`] counts a cgroup's processes, threads and
//!   open files (stats and metrics).
//! - [`mounts`] holds the pod's shared `/dev/shm` and containers' overlays;
//!   [`mountinfo`] reads the mount table.
//!
//! For a container's monitor: [`process`] (fork, sessions, signals, exec),
//! [`proctree`] (killing a process with all it started),
//! [`children`] (SIGCHLD and reaping), [`poll`], [`console`] (ptys and
//! descriptor passing), [`ns::ProcessNamespaces`] (joining a container),
//! [`cgroup_fork`] (a child started in a cgroup v2 group at clone time),
//! [`migration`] (the wait of a cgroup migration started ahead of it),
//! [`watch`] (file modifications: OOM kills as they happen).
//!
//! For a container's rootfs before the runtime mounts over it: [`rootfs`].
//!
//! For image layers and crust's own files: [`fs`] (fd-relative, never
//! following a symlink); for containers' CRI logs below a pod's log
//! directory: [`log_file`]; for removing a container's or pod's dirs
//! without reaching into a mount left inside: [`remove_tree`].
//!
//! For the daemon's short-lived helpers (CNI plugins): [`spawn`] (children
//! that die with the daemon).
//!
//! For every syscall a busy node may answer with a transient error (openat2
//! `RESOLVE_*` and EAGAIN, cgroupfs writes and EINTR, a cgroup's rmdir and
//! EBUSY, mount/umount): [`retry`] (`retry::transient(|| call())`, or a
//! [`retry::Retry`] policy with EBUSY or other bounds), bounded, returning
//! the last error for the caller to classify.
//!
//! For the monitor binary itself: [`sealed`] (the sealed in-memory copy
//! every monitor runs from, so that no container can reach the host file).

pub mod cgroup_fork;
pub mod children;
pub mod console;
mod error;
pub mod fs;
pub mod log_file;
pub mod migration;
pub mod mountinfo;
pub mod mounts;
pub mod netstats;
pub mod ns;
pub mod poll;
pub mod process;
pub mod procstats;
pub mod proctree;
pub mod remove_tree;
pub mod retry;
pub mod rootfs;
pub mod sealed;
pub mod spawn;
pub mod sysctl;
pub mod watch;

pub use error::Error;
