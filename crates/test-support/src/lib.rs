//! Test support shared by crust's integration tests (tests/), the crates'
//! own integration tests and the bench: the real `crust daemon` as a test
//! runs it ([`daemon`]), counted skips ([`skip`]), what the run says
//! through its environment ([`run_env`]), CRI calls many suites make
//! ([`cri`]), CNI networks of a test's own ([`network`]), host probes
//! ([`host`]), a noisy neighbour that mounts and renames while the suites
//! run ([`noisy`]), the streaming tests' peers (node client, raw HTTP, an echo
//! server in a netns: [`peers`]), a real registry with image builders
//! ([`registry`]), an OTLP trace receiver ([`otlp`]), and
//! the start most suites share: a daemon that pulled a test image from a
//! registry ([`setup`]).
//! Everything but [`registry`], [`peers`] and [`otlp`] is re-exported at the crate
//! root.

pub mod cri;
pub mod daemon;
pub mod host;
pub mod network;
pub mod noisy;
pub mod otlp;
pub mod peers;
pub mod registry;
pub mod run_env;
pub mod setup;
pub mod skip;

pub use cri::*;
pub use daemon::{Daemon, DaemonBuilder, connect, run_crust};
pub use host::*;
pub use network::*;
pub use noisy::{NOISY_ENV, Noisy};
pub use run_env::{CGROUP_DRIVER_ENV, SLOWDOWN_ENV, cgroup_driver, crust_bin, patience};
pub use setup::{WithImage, daemon_with_image};
pub use skip::{Need, SkipReason, report_skip, require, skipped};

pub use crust_api;
pub use tonic;
