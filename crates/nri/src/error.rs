use std::path::PathBuf;

use crate::merge::MergeError;

/// What can go wrong in NRI, as the runtime sees it.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    /// A plugin answered a lifecycle request with an error: the CRI call
    /// fails (the runtime undoes what it did for it).
    #[error("NRI plugin {plugin} failed {event}: {message}")]
    PluginFailed {
        plugin: String,
        event: &'static str,
        message: String,
    },
    /// Plugins' answers conflict (two plugins set the same field).
    #[error("NRI: {0}")]
    Merge(#[from] MergeError),
    /// A validator plugin refused the merged adjustment.
    #[error(
        "NRI validator plugin {plugin} rejected the adjustment of container {container}: {reason}"
    )]
    Rejected {
        plugin: String,
        container: String,
        reason: String,
    },
    #[error("NRI socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another server already listens on the configured socket.
    #[error("NRI socket {path} is in use by another running server")]
    SocketInUse { path: PathBuf },
    #[error("NRI configuration: {0}")]
    Config(String),
}
