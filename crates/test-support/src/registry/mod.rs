//! A real registry for tests (Debian's `docker-registry`, CNCF
//! distribution) on 127.0.0.1, a tiny push client, image builders that make
//! small images from Debian's busybox-static, and offline archives (OCI
//! image layout, `docker save`), a small `cosign sign` (signature manifests
//! pushed as cosign stores them), and a registry of its own that sends
//! layer blobs slowly or stalls mid-blob (`slow`). Shared by the daemon's integration tests,
//! `crust-image`'s own tests and the bench.

mod archive;
mod cosign;
mod image;
mod push;
mod server;
mod slow;

pub use archive::{docker_save, oci_layout};
pub use cosign::{
    CosignKey, SignatureLayer, signature_tag as cosign_signature_tag, simple_signing_payload,
};
pub use image::*;
pub use push::{PushError, Pusher};
pub use server::{Registry, RegistryAuth, free_port};
pub use slow::{BlobPace, SlowRegistry};
