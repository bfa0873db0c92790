//! CNI networking for pod sandboxes.
//!
//! - [`config`]: finding and validating the network configuration (decides
//!   NetworkReady).
//! - [`Cni`]: ADD / CHECK / DEL of a pod's pinned network namespace through
//!   a config list's plugins; [`CniResult::pod_ips`] for PodSandboxStatus.
//! - [`install_default_conflist`]: the bridge network `make run` installs.

mod attachment;
mod cni;
pub mod config;
mod default_network;
mod error;
mod exec;
mod result;
mod tagged_rules;

pub use attachment::{
    Attachment, Bandwidth, DEFAULT_IFNAME, DnsConfig, PortMapping, Protocol, RuntimeCapabilities,
    cni_args, runtime_config,
};
pub use cni::{
    AddResult, CachedAttachment, Cni, DEFAULT_BIN_DIRS, DEFAULT_PLUGIN_TIMEOUT, DelAttempt,
};
pub use default_network::{
    DEFAULT_CONFLIST_FILE, DefaultNetwork, default_conflist, install_default_conflist,
};
pub use error::Error;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
