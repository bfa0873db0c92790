//! What crust's daemon and its per-container monitor (`crust-shim`) share:
//! the state directory layout, the start-up handshake, the control
//! requests and attach framing ([`messages`], encoded by [`frame`]), the
//! exit record ([`exit_file`]), and the daemon's client ([`Shim`], feature
//! `client`, on tokio).
//!
//! No OCI runtime in here: the monitor's crate (`crust-shim`) has those, so
//! the daemon builds neither libcontainer nor libseccomp.
//!
//! The feature `blocking-client` adds [`blocking::Shim`], the same client
//! with `std` sockets. It goes once the daemon no longer uses it.

pub mod exit_file;
pub mod frame;
pub mod messages;
pub mod startup;

#[cfg(any(feature = "client", feature = "blocking-client"))]
mod error;
#[cfg(any(feature = "client", feature = "blocking-client"))]
mod monitor_process;

#[cfg(feature = "client")]
mod client;

#[cfg(feature = "blocking-client")]
pub mod blocking;

pub use messages::*;

#[cfg(any(feature = "client", feature = "blocking-client"))]
pub use error::{Error, Result};
#[cfg(any(feature = "client", feature = "blocking-client"))]
pub use monitor_process::{
    AttachEvent, ExecSyncOutput, SpawnOptions, is_shim_of, read_exit_file,
    set_monitor_open_files_limit,
};

#[cfg(feature = "client")]
pub use client::{AttachReader, AttachWriter, Shim};
