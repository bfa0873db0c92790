//! The daemon's cgroups, for cgroup v1, hybrid and v2 hosts and for the
//! cgroupfs and systemd drivers (see README.md for the API at a glance
//! and how it replaces `crust_linux::cgroups`).
//!
//! - [`CgroupFs`]: the hierarchies the host mounts (from the mount table),
//!   with the controllers each cgroup has.
//! - [`CgroupPath`], [`CgroupParent`]: checked cgroup paths and kubelet's
//!   `cgroup_parent` in either driver's spelling; [`scope_name`] for
//!   systemd scopes.
//! - [`Cgroup`]: create, apply `LinuxResources`, stats (with PSI), kill
//!   everything, recursive delete, `memory.oom.group`, OOM kills.
//! - [`validate_unified`]: the check of `unified` keys and values that
//!   every request path runs.
//! - [`systemd`]: the systemd driver over D-Bus (slices, scopes, unit
//!   properties), connected only when used.
//!
//! Every write is fd-relative and confined below the cgroup's directory
//! (openat2 with RESOLVE_BENEATH and no symlinks; see `dir.rs`). This crate
//! has no `unsafe` and makes no syscall itself: crust-linux does them.

#![forbid(unsafe_code)]

mod cgroup;
pub mod convert;
mod dir;
mod error;
mod hierarchy;
mod path;
pub mod resources;
pub mod stats;
pub mod systemd;
mod unified;

pub use cgroup::{Cgroup, DEFAULT_KILL_WAIT};
pub use error::{Error, MAX_QUOTE, Result, quote};
pub use hierarchy::{CgroupFs, Controller, Controllers, Hierarchy, V1Mount, systemd_booted};
pub use path::{
    CgroupParent, CgroupPath, DEFAULT_CGROUPFS_PARENT, DEFAULT_SYSTEMD_PARENT, Driver, NAME_PREFIX,
    expand_slice, pod_cgroup_path, scope_name, scope_path, validate_name,
};
pub use stats::{Stats, StatsRequest};
pub use unified::{
    MAX_UNIFIED_ENTRIES, MAX_UNIFIED_VALUE, validate_unified, validate_unified_entry,
    validate_unified_value,
};
