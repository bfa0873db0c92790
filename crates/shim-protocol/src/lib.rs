//! What crust's daemon and its per-container monitor (`crust-shim`) share:
//! the state directory layout, the start-up handshake, the control
//! requests and attach framing ([`messages`], encoded by [`frame`]), the
//! exit record ([`exit_file`]), and the daemon's client ([`Shim`], feature
//! `client`, on tokio).
//!
//! No OCI runtime in here: the monitor's crate (`crust-shim`) has those, so
//! the daemon builds neither libcontainer nor libseccomp.

pub mod exit_file;
pub mod frame;
pub mod messages;
pub mod startup;

#[cfg(feature = "client")]
mod error;
#[cfg(feature = "client")]
mod monitor_process;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod shim_binary;

pub use messages::*;

#[cfg(feature = "client")]
pub use error::{Error, Result};
#[cfg(feature = "client")]
pub use monitor_process::{
    AttachEvent, ExecSyncOutput, SpawnOptions, is_shim_of, read_exit_file,
    set_monitor_open_files_limit,
};

#[cfg(feature = "client")]
pub use client::{AttachReader, AttachWriter, Shim};
#[cfg(feature = "client")]
pub use shim_binary::ShimBinary;
