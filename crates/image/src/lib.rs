//! crust's image handling: registry client, content store, safe layer
//! unpack, image index and garbage collection. No gRPC types here; the
//! daemon's ImageService translates.
//!
//! Entry point: [`ImageService`]. Layout under the root dir:
//! `content/blobs/sha256/<hex>` (blobs), `content/ingest/` (temp files),
//! `layers/<chain-id-hex>/diff` (unpacked layers); image records and
//! container leases live in the daemon's metadata store.

pub mod content;
pub mod digest;
pub mod error;
pub mod hosts;
mod import;
pub mod index;
mod keyed;
pub mod layers;
pub mod manifest;
pub mod orphans;
pub mod reference;
pub mod registry;
mod service;
pub mod signature;
mod tar_limit;
pub mod unpack;
pub mod usage;
pub mod user;

/// The `tracing` target of the pull's spans (image pull, manifest, one per
/// layer with its fetch and unpack): the daemon turns it on, and exports
/// those spans over OpenTelemetry, only when tracing is configured.
pub const TRACE_TARGET: &str = "crust_trace";

pub use digest::Digest;
pub use error::{Error, ErrorKind, Result};
pub use index::{Image, Lease};
pub use manifest::{ImageConfig, Platform};
pub use orphans::{ContentKind, OrphanContent};
pub use reference::Reference;
pub use registry::{Credentials, Progress, ProgressFn};
pub use service::{
    Config, DEFAULT_MAX_CONCURRENT_DOWNLOADS, DEFAULT_PULL_PROGRESS_TIMEOUT, ImageService,
    PullSettings,
};
pub use usage::FsUsage;
pub use user::{ImageUser, image_user};
