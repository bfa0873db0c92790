//! The CRI gRPC API as generated Rust code, and crust's private admin API
//! (`crust.admin.v1`, for the `crust images`, `status`, `log-level` and
//! `check` commands).
//!
//! `v1` is what crust implements. `v1alpha2` is wire-compatible with `v1` for
//! every field the two share, so the daemon serves it by re-routing its
//! requests onto the `v1` services (see `runtime::api_version`); the generated
//! `v1alpha2` types exist for clients and tests.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1alpha2 {
    tonic::include_proto!("runtime.v1alpha2");
}

/// crust's own admin services, served on the CRI socket for the operator CLI.
pub mod admin {
    #[allow(clippy::all, clippy::pedantic, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("crust.admin.v1");
    }
}

/// Every gRPC method of the protos above as its path
/// (`/runtime.v1.RuntimeService/Version`), e.g. to label metrics with a
/// bounded set of names.
pub const GRPC_METHODS: &[&str] = include!(concat!(env!("OUT_DIR"), "/grpc_methods.rs"));
