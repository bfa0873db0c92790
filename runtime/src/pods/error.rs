//! What can go wrong with a pod sandbox, sorted by who can act on it. The
//! service layer maps each kind to one gRPC code; messages name the field
//! or the failed step and carry the cause.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// The request is at fault (the message names the field).
    #[error("{0}")]
    InvalidArgument(String),
    /// No pod sandbox with that ID (or ID prefix).
    #[error("{0}")]
    NotFound(String),
    /// The (name, namespace, uid, attempt) is taken.
    #[error("{0}")]
    AlreadyExists(String),
    /// A mode crust does not support yet.
    #[error("{0}")]
    Unimplemented(String),
    /// The node is not ready for it (no CNI network config).
    #[error("{0}")]
    Unavailable(String),
    /// The host failed: namespaces, mounts, cgroups, CNI, the store.
    #[error("{0}")]
    Internal(String),
}

impl PodError {
    pub fn invalid(field: &str, why: impl fmt::Display) -> PodError {
        PodError::InvalidArgument(format!("{field}: {why}"))
    }

    pub fn internal(step: &str, cause: impl fmt::Display) -> PodError {
        PodError::Internal(format!("{step}: {cause}"))
    }

    /// A crust_linux error: InvalidArgument when the request caused it.
    pub fn linux(step: &str, e: crust_linux::Error) -> PodError {
        if e.is_invalid_argument() {
            PodError::InvalidArgument(format!("{step}: {e}"))
        } else {
            PodError::Internal(format!("{step}: {e}"))
        }
    }

    /// A crust_cgroups error: InvalidArgument when the request caused it.
    pub fn cgroup(step: &str, e: crate::cgroups::Error) -> PodError {
        if e.is_invalid_argument() {
            PodError::InvalidArgument(format!("{step}: {e}"))
        } else {
            PodError::Internal(format!("{step}: {e}"))
        }
    }

    /// A crust_network error: InvalidArgument when the request caused it.
    pub fn network(step: &str, e: crust_network::Error) -> PodError {
        if e.is_invalid_argument() {
            PodError::InvalidArgument(format!("{step}: {e}"))
        } else {
            PodError::Internal(format!("{step}: {e}"))
        }
    }

    /// The same kind with `context` in front of the message.
    pub fn context(self, context: impl fmt::Display) -> PodError {
        let wrap = |m: String| format!("{context}: {m}");
        match self {
            PodError::InvalidArgument(m) => PodError::InvalidArgument(wrap(m)),
            PodError::NotFound(m) => PodError::NotFound(wrap(m)),
            PodError::AlreadyExists(m) => PodError::AlreadyExists(wrap(m)),
            PodError::Unimplemented(m) => PodError::Unimplemented(wrap(m)),
            PodError::Unavailable(m) => PodError::Unavailable(wrap(m)),
            PodError::Internal(m) => PodError::Internal(wrap(m)),
        }
    }
}

impl From<crust_store::Error> for PodError {
    fn from(e: crust_store::Error) -> Self {
        PodError::Internal(e.to_string())
    }
}

impl From<tokio::task::JoinError> for PodError {
    fn from(e: tokio::task::JoinError) -> Self {
        PodError::internal("pod task", e)
    }
}
