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
    /// Its `name:tag` references now.
    pub repo_tags: Vec<String>,
    /// Its `name@sha256:<manifest digest>` references now.
    pub repo_digests: Vec<String>,
    /// The reference named it by ID or ID prefix, not by a name.
    pub by_id: bool,
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

    /// Leases image `image_id` as the image volume `config.mounts[index]`
    /// of `container_id`: the image stays (RemoveImage refuses it) until
    /// [`Self::release`]. Returns its layers, bottom first.
    async fn lease_volume(
        &self,
        container_id: &str,
        index: usize,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error>;

    /// Drops the leases of `container_id`, its image volumes' too (none is
    /// no error).
    async fn release(&self, container_id: &str) -> Result<(), crust_image::Error>;

    /// [`Self::release`], committed with `also`'s changes to `store` (the
    /// daemon's one store) in one transaction where the images live in it
    /// too: RemoveContainer drops the leases and the record with one
    /// durable write.
    async fn release_with(
        &self,
        container_id: &str,
        store: &crust_store::Store,
        also: StoreChange,
    ) -> Result<(), crust_image::Error> {
        self.release(container_id).await?;
        store.write(also)?;
        Ok(())
    }

    /// The container IDs holding a lease.
    fn leaseholders(&self) -> Result<Vec<String>, crust_image::Error>;
}

#[async_trait::async_trait]
impl ContainerImages for ImageService {
    fn resolve(&self, reference: &str) -> Result<Option<ImageFacts>, crust_image::Error> {
        let images = self.list()?;
        Ok(
            crust_image::index::find(&images, reference)?.map(|(image, how)| ImageFacts {
                config: oci_image_config(&image.config),
                id: image.id.clone(),
                repo_tags: image.repo_tags.clone(),
                repo_digests: image.repo_digests.clone(),
                by_id: how == crust_image::index::Match::Id,
            }),
        )
    }

    async fn lease(
        &self,
        container_id: &str,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error> {
        ImageService::lease(self, container_id, image_id).await
    }

    async fn lease_volume(
        &self,
        container_id: &str,
        index: usize,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error> {
        ImageService::lease_volume(self, &volume_holder(container_id, index), image_id).await
    }

    async fn release(&self, container_id: &str) -> Result<(), crust_image::Error> {
        release_with_own_store(self, container_id, Box::new(|_| Ok(()))).await
    }

    async fn release_with(
        &self,
        container_id: &str,
        _store: &crust_store::Store,
        also: StoreChange,
    ) -> Result<(), crust_image::Error> {
        release_with_own_store(self, container_id, also).await
    }

    fn leaseholders(&self) -> Result<Vec<String>, crust_image::Error> {
        let mut ids: Vec<String> = self
            .leases()?
            .into_iter()
            .map(|(holder, _)| container_of(&holder).to_string())
            .collect();
        ids.dedup();
        Ok(ids)
    }
}

/// A change to the store, committed with another's
/// ([`ContainerImages::release_with`]).
pub type StoreChange =
    Box<dyn FnOnce(&mut crust_store::Txn) -> crust_store::Result<()> + Send + 'static>;

/// The image service's release: the container's lease and its volumes'
/// (found by a range read of their keys, not by loading every lease) in
/// one commit with `also`.
async fn release_with_own_store(
    images: &ImageService,
    container_id: &str,
    also: StoreChange,
) -> Result<(), crust_image::Error> {
    let prefix = volume_holder(container_id, 0);
    let prefix = prefix.trim_end_matches('0');
    images
        .release_prefixed_with(&[container_id], &[prefix], also)
        .await
}

/// The lease key of a container's image volume: `<container id>/volume/<n>`
/// (container IDs are hex, so no container ID contains a '/').
fn volume_holder(container_id: &str, index: usize) -> String {
    format!("{container_id}/volume/{index}")
}

/// The container a lease key belongs to.
fn container_of(holder: &str) -> &str {
    holder.split('/').next().unwrap_or(holder)
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
