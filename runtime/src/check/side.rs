//! What differs between the daemon checking itself ([`Online`]) and the
//! CLI checking a root no daemon runs on ([`Offline`]).

use std::sync::Arc;

use crust_image::{ImageService, OrphanContent};
use crust_store::Store;

use super::CheckError;
use crate::config::Config;
use crate::daemon::Daemon;

/// What differs between the daemon checking itself and the CLI checking a
/// root no daemon runs on: the image store and the repairs that need the
/// daemon's parts.
#[async_trait::async_trait]
pub(super) trait Side: Send + Sync {
    /// The image store's orphans (removed if `remove`).
    async fn content(&self, remove: bool) -> Result<Vec<OrphanContent>, CheckError>;
    async fn remove_container(&self, id: &str) -> Result<(), String>;
    async fn remove_pod(&self, id: &str) -> Result<(), String>;
    async fn release_lease(&self, holder: &str) -> Result<(), String>;
    /// Whether a life-cycle step is at work on container (or, with `pod`,
    /// pod sandbox) `id` now.
    fn in_step(&self, id: &str, pod: bool) -> bool;
}

/// The running daemon's side.
pub(super) struct Online<'a>(pub(super) &'a Daemon);

#[async_trait::async_trait]
impl Side for Online<'_> {
    async fn content(&self, remove: bool) -> Result<Vec<OrphanContent>, CheckError> {
        Ok(self.0.images.orphans(remove).await?)
    }

    async fn remove_container(&self, id: &str) -> Result<(), String> {
        self.0
            .lifecycle
            .remove_container(id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn remove_pod(&self, id: &str) -> Result<(), String> {
        self.0
            .lifecycle
            .remove_pod(id)
            .await
            .map_err(|e| e.to_string())
    }

    async fn release_lease(&self, holder: &str) -> Result<(), String> {
        // Its container may have come since (a lease is taken after the
        // container's record is written).
        let container = holder.split('/').next().unwrap_or(holder);
        if self.0.containers.get(container).is_ok() {
            return Err("its container has a record now: left alone".to_string());
        }
        self.0
            .images
            .release(holder)
            .await
            .map_err(|e| e.to_string())
    }

    fn in_step(&self, id: &str, pod: bool) -> bool {
        if pod {
            self.0.pods.in_step(id)
        } else {
            self.0.containers.in_step(id)
        }
    }
}

/// The CLI's side, with no daemon running: the image store is opened only
/// to repair (opening it collects what nothing references, as the
/// daemon's start does).
pub(super) struct Offline {
    pub(super) config: Config,
    pub(super) store: Arc<Store>,
    pub(super) images: tokio::sync::OnceCell<ImageService>,
}

impl Offline {
    async fn images(&self) -> Result<&ImageService, CheckError> {
        self.images
            .get_or_try_init(|| async {
                let mut c = crust_image::Config::new(&self.config.root);
                c.registry_config_dir = Some(self.config.registry.config_dir.clone());
                Ok::<_, CheckError>(ImageService::open(c, self.store.clone()).await?)
            })
            .await
    }
}

const RECORDS_NEED_THE_DAEMON: &str = "records are repaired by the daemon (RemoveContainer and RemovePodSandbox \
     undo what they describe): start it and run `crust check --repair`";

#[async_trait::async_trait]
impl Side for Offline {
    async fn content(&self, remove: bool) -> Result<Vec<OrphanContent>, CheckError> {
        if remove {
            return Ok(self.images().await?.orphans(true).await?);
        }
        let (root, store) = (self.config.root.clone(), self.store.clone());
        Ok(crate::tasks::blocking(move || {
            crust_image::orphans::scan_offline(&root, &store).map_err(CheckError::from)
        })
        .await?)
    }

    async fn remove_container(&self, _id: &str) -> Result<(), String> {
        Err(RECORDS_NEED_THE_DAEMON.to_string())
    }

    async fn remove_pod(&self, _id: &str) -> Result<(), String> {
        Err(RECORDS_NEED_THE_DAEMON.to_string())
    }

    async fn release_lease(&self, holder: &str) -> Result<(), String> {
        let images = self.images().await.map_err(|e| e.to_string())?;
        images.release(holder).await.map_err(|e| e.to_string())
    }

    /// No daemon, no steps.
    fn in_step(&self, _id: &str, _pod: bool) -> bool {
        false
    }
}
