//! What can go wrong with a container, sorted by who can act on it. The
//! service layer maps each kind to one gRPC code; messages name the field
//! or the failed step and carry the cause.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContainerError {
    /// The request is at fault (the message names the field).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such container, pod sandbox or image.
    #[error("{0}")]
    NotFound(String),
    /// The (pod, name, attempt) is taken.
    #[error("{0}")]
    AlreadyExists(String),
    /// The container (or its pod) is in the wrong state for the request.
    #[error("{0}")]
    FailedPrecondition(String),
    /// ExecSync's command ran out of time.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The node failed: mounts, the monitor, the runtime, the store.
    #[error("{0}")]
    Internal(String),
}

impl ContainerError {
    pub fn internal(cause: impl std::fmt::Display) -> ContainerError {
        ContainerError::Internal(cause.to_string())
    }

    pub fn message(&self) -> &str {
        match self {
            ContainerError::InvalidArgument(m)
            | ContainerError::NotFound(m)
            | ContainerError::AlreadyExists(m)
            | ContainerError::FailedPrecondition(m)
            | ContainerError::DeadlineExceeded(m)
            | ContainerError::Internal(m) => m,
        }
    }

    /// A monitor's answer: its refusals keep their kind; a monitor that is
    /// gone means the container is not running.
    pub fn from_monitor(e: crust_shim_protocol::Error) -> ContainerError {
        use crust_shim_protocol::ErrorKind;
        match e {
            crust_shim_protocol::Error::Shim {
                kind: ErrorKind::InvalidArgument,
                message,
            } => ContainerError::InvalidArgument(message),
            crust_shim_protocol::Error::Shim {
                kind: ErrorKind::FailedPrecondition,
                message,
            } => ContainerError::FailedPrecondition(message),
            crust_shim_protocol::Error::Gone => {
                ContainerError::FailedPrecondition("the container is not running".into())
            }
            e => ContainerError::Internal(e.to_string()),
        }
    }

    /// A spec generation error: InvalidArgument when the request caused it.
    pub fn from_spec(e: crust_oci::SpecError) -> ContainerError {
        use crust_oci::ErrorClass;
        match e.class() {
            ErrorClass::InvalidArgument => ContainerError::InvalidArgument(e.to_string()),
            ErrorClass::FailedPrecondition => ContainerError::FailedPrecondition(e.to_string()),
            ErrorClass::Internal => ContainerError::Internal(e.to_string()),
        }
    }
}

impl From<crust_store::Error> for ContainerError {
    fn from(e: crust_store::Error) -> Self {
        ContainerError::Internal(e.to_string())
    }
}

impl From<tokio::task::JoinError> for ContainerError {
    fn from(e: tokio::task::JoinError) -> Self {
        ContainerError::Internal(e.to_string())
    }
}
