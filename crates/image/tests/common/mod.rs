//! Test support for crust-image: the shared registry harness and image
//! builders (`crust_test_support::registry`), plus an image store under a temp
//! root.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

pub use crust_test_support::registry::*;

/// A store under a temp root with its own metadata DB.
pub struct Store {
    pub root: tempfile::TempDir,
    pub svc: crust_image::ImageService,
}

pub async fn store_with(hosts_dir: Option<&Path>) -> Store {
    store_configured(|c| c.registry_config_dir = hosts_dir.map(Path::to_path_buf)).await
}

/// A store whose config `set` adjusts.
pub async fn store_configured(set: impl FnOnce(&mut crust_image::Config)) -> Store {
    let root = tempfile::tempdir().unwrap();
    let meta = Arc::new(crust_store::Store::open(&root.path().join("meta.db")).unwrap());
    let mut config = crust_image::Config::new(root.path());
    set(&mut config);
    let svc = crust_image::ImageService::open(config, meta).await.unwrap();
    Store { root, svc }
}

pub async fn store() -> Store {
    store_with(None).await
}

impl Store {
    pub fn blobs(&self) -> Vec<String> {
        list(&self.root.path().join("content/blobs/sha256"))
    }

    pub fn layers(&self) -> Vec<String> {
        list(&self.root.path().join("layers"))
    }

    pub fn ingest(&self) -> Vec<String> {
        list(&self.root.path().join("content/ingest"))
    }
}

pub fn list(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

pub fn anon() -> crust_image::Credentials {
    crust_image::Credentials::default()
}
