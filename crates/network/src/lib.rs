//! CNI networking for pod sandboxes.
//!
//! So far: finding and validating the network configuration, which decides
//! whether the runtime reports NetworkReady.

pub mod config;
