//! crust's per-container monitor (`crust-shim`) and the client library the
//! daemon uses to start it, find it again after a restart, and talk to it.
//!
//! - [`protocol`]: state directory layout, start-up handshake, control
//!   requests, attach framing — the contract between the two sides.
//! - [`client`]: the daemon's side ([`client::Shim`]); with the feature
//!   `client-async`, `async_client::AsyncShim` for tokio.
//! - [`logfmt`]: the CRI log format (pure, unit-tested).
//! - [`monitor`], [`runtime`]: the monitor process and its `OciRuntime`
//!   implementations (used by the `crust-shim` binary).

#[cfg(feature = "client-async")]
pub mod async_client;
pub mod client;
pub mod exit;
pub mod frame;
pub mod logfmt;
pub mod monitor;
pub mod protocol;
pub mod runtime;

pub use client::{Attach, AttachEvent, Error, ExecSession, ExecSyncOutput, Shim, SpawnOptions};
pub use protocol::{ExecRequest, ExitInfo, RuntimeConfig, ShimConfig, State, Status};
