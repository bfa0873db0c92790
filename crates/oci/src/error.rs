//! The one error type of the crate.
//!
//! Every variant that stems from a request names the CRI field it is about,
//! in the proto's own spelling and with the path from the request root
//! (`config.` for the ContainerConfig, `sandbox_config.` for the
//! PodSandboxConfig, `image.config.` for the image's config), so the daemon
//! can hand `to_string()` straight to the client.

use std::path::PathBuf;

use crust_quote::{clip, quote_os};

/// How the daemon should report a [`SpecError`] over gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request (or the image it names) is malformed or asks for
    /// something not allowed: `InvalidArgument`.
    InvalidArgument,
    /// The request is well-formed but the node is not in a state to honour
    /// it (e.g. a BIDIRECTIONAL mount of a host path that is not on a shared
    /// mount, or pod state the daemon should have supplied is missing):
    /// `FailedPrecondition`.
    FailedPrecondition,
    /// A host look-up failed for a reason other than "not found": `Internal`.
    Internal,
}

/// Why a spec could not be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A field has a value that is malformed or not allowed.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },

    /// A user name (request or image) does not resolve in the image's
    /// /etc/passwd. Never falls back to root.
    #[error(
        "{field}: user {} not found in the image's /etc/passwd",
        quote_os(user)
    )]
    UserNotFound { field: String, user: String },

    /// A group name (image `User` field `user:group`) does not resolve in the
    /// image's /etc/group.
    #[error(
        "{field}: group {} not found in the image's /etc/group",
        quote_os(group)
    )]
    GroupNotFound { field: String, group: String },

    /// A host path named by the request does not exist.
    #[error("{field}: host path {} does not exist", quote_os(path))]
    HostPathNotFound { field: String, path: PathBuf },

    /// The request asks for a feature crust does not implement.
    #[error("{field}: {feature} is not supported")]
    Unsupported { field: String, feature: String },

    /// The request is fine but the host or pod state does not allow it.
    #[error("{field}: {reason}")]
    Precondition { field: String, reason: String },

    /// A host look-up (path resolution, device stat, profile read) failed.
    #[error("{field}: {}: {}", quote_os(path), clip(message))]
    Host {
        field: String,
        path: PathBuf,
        message: String,
    },
}

impl SpecError {
    /// The gRPC class the daemon should map this error to.
    pub fn class(&self) -> ErrorClass {
        match self {
            SpecError::Invalid { .. }
            | SpecError::UserNotFound { .. }
            | SpecError::GroupNotFound { .. }
            | SpecError::HostPathNotFound { .. }
            | SpecError::Unsupported { .. } => ErrorClass::InvalidArgument,
            SpecError::Precondition { .. } => ErrorClass::FailedPrecondition,
            SpecError::Host { .. } => ErrorClass::Internal,
        }
    }

    /// The request field the error is about.
    pub fn field(&self) -> &str {
        match self {
            SpecError::Invalid { field, .. }
            | SpecError::UserNotFound { field, .. }
            | SpecError::GroupNotFound { field, .. }
            | SpecError::HostPathNotFound { field, .. }
            | SpecError::Unsupported { field, .. }
            | SpecError::Precondition { field, .. }
            | SpecError::Host { field, .. } => field,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(field: impl Into<String>, feature: impl Into<String>) -> Self {
        SpecError::Unsupported {
            field: field.into(),
            feature: feature.into(),
        }
    }

    pub(crate) fn precondition(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError::Precondition {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Maps an `io::Error` from a [`crate::Host`] look-up: NotFound becomes
    /// [`SpecError::HostPathNotFound`], anything else [`SpecError::Host`].
    pub(crate) fn from_host_io(
        field: impl Into<String>,
        path: impl Into<PathBuf>,
        err: &std::io::Error,
    ) -> Self {
        let (field, path) = (field.into(), path.into());
        if err.kind() == std::io::ErrorKind::NotFound {
            SpecError::HostPathNotFound { field, path }
        } else {
            SpecError::Host {
                field,
                path,
                message: err.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_field() {
        let e = SpecError::invalid("config.mounts[2].container_path", "must be absolute");
        assert_eq!(
            e.to_string(),
            "config.mounts[2].container_path: must be absolute"
        );
        assert_eq!(e.field(), "config.mounts[2].container_path");
        assert_eq!(e.class(), ErrorClass::InvalidArgument);
    }

    #[test]
    fn classes() {
        assert_eq!(
            SpecError::precondition("f", "r").class(),
            ErrorClass::FailedPrecondition
        );
        assert_eq!(
            SpecError::unsupported("f", "x").class(),
            ErrorClass::InvalidArgument
        );
        let nf = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = SpecError::from_host_io("config.mounts[0].host_path", "/nope", &nf);
        assert!(matches!(e, SpecError::HostPathNotFound { .. }));
        assert_eq!(e.class(), ErrorClass::InvalidArgument);
        assert_eq!(
            e.to_string(),
            "config.mounts[0].host_path: host path \"/nope\" does not exist"
        );
        let pd = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = SpecError::from_host_io("f", "/x", &pd);
        assert_eq!(e.class(), ErrorClass::Internal);
    }

    #[test]
    fn user_not_found_display() {
        let e = SpecError::UserNotFound {
            field: "config.linux.security_context.run_as_username".into(),
            user: "bob".into(),
        };
        assert_eq!(
            e.to_string(),
            "config.linux.security_context.run_as_username: user \"bob\" not found in the image's /etc/passwd"
        );
    }
}
