//! What containers need of the image store (`crust_image::ImageService`):
//! an image's ID and config, and leases on its unpacked layers, which keep
//! them from garbage collection while a container uses them. A trait, so
//! that container life-cycle rules are unit-tested without images on disk.

use std::path::PathBuf;

use crust_image::ImageService;

/// An image as a container is made from it.
#[derive(Debug, Clone)]
pub struct ImageFacts {
    /// `sha256:...`
    pub id: String,
    pub config: crust_oci::ImageConfig,
}

#[async_trait::async_trait]
pub trait ContainerImages: Send + Sync {
    /// The image a reference (ID, ID prefix, tag or digest) names.
    fn resolve(&self, reference: &str) -> Result<Option<ImageFacts>, crust_image::Error>;

    /// Leases `image_id`'s layers for `container_id`: the lower dirs of its
    /// rootfs, top layer first.
    async fn lease(
        &self,
        container_id: &str,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error>;

    /// Drops the lease of `container_id` (none is no error).
    async fn release(&self, container_id: &str) -> Result<(), crust_image::Error>;

    /// The container IDs holding a lease.
    fn leaseholders(&self) -> Result<Vec<String>, crust_image::Error>;
}

#[async_trait::async_trait]
impl ContainerImages for ImageService {
    fn resolve(&self, reference: &str) -> Result<Option<ImageFacts>, crust_image::Error> {
        Ok(self.get(reference)?.map(|image| ImageFacts {
            config: oci_image_config(&image.config),
            id: image.id,
        }))
    }

    async fn lease(
        &self,
        container_id: &str,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error> {
        ImageService::lease(self, container_id, image_id).await
    }

    async fn release(&self, container_id: &str) -> Result<(), crust_image::Error> {
        ImageService::release(self, container_id).await
    }

    fn leaseholders(&self) -> Result<Vec<String>, crust_image::Error> {
        Ok(self.leases()?.into_iter().map(|(id, _)| id).collect())
    }
}

/// The part of an image's config a container spec uses.
fn oci_image_config(c: &crust_image::ImageConfig) -> crust_oci::ImageConfig {
    crust_oci::ImageConfig {
        entrypoint: c.entrypoint.clone(),
        cmd: c.cmd.clone(),
        env: c.env.clone(),
        working_dir: c.working_dir.clone(),
        user: c.user.clone(),
        stop_signal: c.stop_signal.clone(),
        volumes: c.volumes.clone(),
    }
}
