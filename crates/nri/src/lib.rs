//! The runtime side of NRI, the Node Resource Interface (containerd/nri):
//! external plugins connect over a Unix socket (or are started by the
//! runtime from `plugin_path`), subscribe to pod and container lifecycle
//! events, and may adjust containers being created and update running ones.
//!
//! The runtime embeds one [`Nri`] (cheap to clone) and calls it at each
//! lifecycle step; see the method docs for where each call belongs and
//! [`Nri::block_plugin_sync`] for how no container is missed while a new
//! plugin synchronizes. With NRI disabled, or no plugin subscribed to an
//! event, every call returns at once without building its request.
//!
//! Modules: [`api`] (protocol messages), [`config`], [`merge`] (combining
//! several plugins' answers, NRI's conflict rules), [`spec`] (applying an
//! adjustment to an OCI spec), [`testing`] (a plugin speaking the wire
//! protocol, for tests), and the private transport (`wire`) and plugin
//! handling.

pub mod api;
pub mod config;
mod error;
mod launch;
pub mod merge;
mod nri;
mod owners;
mod plugin;
pub mod spec;
pub mod testing;
mod wire;

pub use config::Config;
pub use error::NriError;
pub use merge::{CreateResult, MergeError, UpdateResult};
pub use nri::{
    BoxFuture, Nri, PluginInfo, RuntimeBackend, RuntimeInfo, Snapshot, SnapshotPod, SyncBlock,
};
pub use owners::Conflict;
pub use spec::{ApplyError, ApplyOptions, apply_adjustment};

/// Quotes untrusted text for messages: at most 256 bytes of it.
pub(crate) fn quote(s: &str) -> &str {
    if s.len() <= 256 {
        return s;
    }
    let mut end = 256;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
