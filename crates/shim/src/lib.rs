//! crust's per-container monitor (`crust-shim`) and the OCI runtimes it
//! drives. What it shares with the daemon (state directory, handshake,
//! control and attach protocol, exit record, the client) is in
//! `crust-shim-protocol`.
//!
//! - [`monitor`]: the monitor process, one module per concern.
//! - [`runtime`]: the `OciRuntime` interface, with the embedded backend
//!   (youki's libcontainer) and the CLI backend (runc, crun).
//! - [`logfmt`]: the CRI log format (pure, unit-tested).

pub mod logfmt;
pub mod monitor;
pub mod runtime;
