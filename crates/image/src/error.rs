//! The crate's error type, with a coarse [`ErrorKind`] the daemon maps to a
//! gRPC status code.

use std::sync::Arc;

use crust_quote::{clip, quote};

/// What a caller can do about an error; the daemon maps it to a gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is wrong (bad reference, bad auth encoding).
    InvalidArgument,
    /// The image, manifest or blob does not exist (locally or in the registry).
    NotFound,
    /// The registry refused the credentials (or wants some).
    Unauthenticated,
    /// The registry or network could not be reached or failed.
    Unavailable,
    /// The content is valid but not something crust can run.
    Unsupported,
    /// The content is corrupt or hostile (digest/size mismatch, escaping
    /// layer entries, broken archive).
    InvalidContent,
    /// A local failure (disk, metadata store).
    Internal,
    /// The image is in use in a way that forbids the request (an image
    /// volume of a container, for RemoveImage).
    InUse,
    /// The image signature policy refused the image (or cannot be used):
    /// nothing of the image was fetched beyond its manifest.
    PolicyRefused,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid image reference {}: {reason}", quote(reference))]
    InvalidReference { reference: String, reason: String },

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("{0} not found")]
    NotFound(String),

    #[error("image ID prefix {0:?} matches more than one image")]
    Ambiguous(String),

    #[error("registry {host}: authentication failed: {}", clip(message))]
    Unauthorized { host: String, message: String },

    #[error("registry {host}: {}", clip(message))]
    Registry { host: String, message: String },

    /// A registry request received nothing for `after`
    /// (`pull_progress_timeout`): given up.
    #[error(
        "registry {host}: {what}: no data received for {} (pull_progress_timeout); gave up",
        crate::registry::fmt_duration(*after)
    )]
    Stalled {
        host: String,
        what: String,
        after: std::time::Duration,
    },

    #[error("{0}")]
    Unsupported(String),

    #[error("content {digest}: {reason}")]
    Verification { digest: String, reason: String },

    #[error("layer {layer}: {reason}")]
    Layer { layer: String, reason: String },

    #[error("registry host config {path}: {reason}")]
    HostsConfig { path: String, reason: String },

    #[error("image archive: {0}")]
    Archive(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Store(#[from] crust_store::Error),

    #[error("{0}")]
    Internal(String),

    #[error("{0}")]
    InUse(String),

    /// The signature policy refused the image. The message starts as
    /// CRI-O's (kubelet's `SignatureValidationFailed` reason).
    #[error(
        "SignatureValidationFailed: image {} refused by the signature policy {policy}, {rule}: {}",
        quote(image),
        clip(reason)
    )]
    SignatureRefused {
        image: String,
        policy: String,
        rule: String,
        reason: String,
    },

    /// A signature policy file that cannot be used: every pull it governs
    /// is refused (never let through).
    #[error("SignatureValidationFailed: signature policy {path}: {}", clip(reason))]
    Policy { path: String, reason: String },

    /// The error of a pull another caller ran for us (single-flight).
    #[error("{0}")]
    Shared(Arc<Error>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidReference { .. } | Error::InvalidArgument(_) | Error::Ambiguous(_) => {
                ErrorKind::InvalidArgument
            }
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Unauthorized { .. } => ErrorKind::Unauthenticated,
            // A stalled registry is as unavailable as an unreachable one:
            // a retry (kubelet's back-off) may find it well again.
            Error::Registry { .. } | Error::Stalled { .. } => ErrorKind::Unavailable,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Verification { .. } | Error::Layer { .. } | Error::Archive(_) => {
                ErrorKind::InvalidContent
            }
            Error::HostsConfig { .. } | Error::Io { .. } | Error::Store(_) | Error::Internal(_) => {
                ErrorKind::Internal
            }
            Error::InUse(_) => ErrorKind::InUse,
            Error::SignatureRefused { .. } | Error::Policy { .. } => ErrorKind::PolicyRefused,
            Error::Shared(inner) => inner.kind(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn layer(layer: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Layer {
            layer: layer.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn verification(digest: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Verification {
            digest: digest.into(),
            reason: reason.into(),
        }
    }
}

/// Adds a context string to io::Result, the one conversion used everywhere.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::io(context(), source))
    }
}

impl<T> IoContext<T> for crust_linux::fs::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|errno| Error::io(context(), errno.into()))
    }
}
