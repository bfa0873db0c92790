//! An image store with the images a test adds.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use super::{Effect, Failures, Journal, Op};
use crate::images::{ContainerImages, ImageFacts};

/// An image store with the images a test adds.
pub struct FakeImages {
    journal: Journal,
    images: Mutex<HashMap<String, ImageFacts>>,
    /// Container ID -> image ID.
    leases: Mutex<BTreeMap<String, String>>,
    fail: Failures,
}

impl FakeImages {
    pub fn new(journal: Journal) -> FakeImages {
        FakeImages {
            journal,
            images: Mutex::new(HashMap::new()),
            leases: Mutex::new(BTreeMap::new()),
            fail: Failures::default(),
        }
    }

    pub fn add(&self, name: &str, id: &str) {
        self.images.lock().unwrap().insert(
            name.into(),
            ImageFacts {
                id: id.into(),
                config: crust_oci::ImageConfig {
                    cmd: vec!["sleep".into(), "3600".into()],
                    ..Default::default()
                },
                repo_tags: vec![],
                repo_digests: vec![],
                by_id: false,
            },
        );
    }

    /// Container ID -> image ID of every lease.
    pub fn leases(&self) -> BTreeMap<String, String> {
        self.leases.lock().unwrap().clone()
    }

    /// A lease left by a container the daemon no longer knows.
    pub fn add_lease(&self, container_id: &str, image_id: &str) {
        self.leases
            .lock()
            .unwrap()
            .insert(container_id.into(), image_id.into());
    }

    pub fn fail(&self, op: Op) {
        self.fail.set(op, true);
    }
}

#[async_trait::async_trait]
impl ContainerImages for FakeImages {
    fn resolve(&self, reference: &str) -> Result<Option<ImageFacts>, crust_image::Error> {
        Ok(self.images.lock().unwrap().get(reference).cloned())
    }

    async fn lease(
        &self,
        container_id: &str,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error> {
        self.journal.push(Effect::Lease(container_id.into()));
        if self.fail.check(Op::Lease) {
            return Err(crust_image::Error::NotFound(format!(
                "layers of {image_id}"
            )));
        }
        self.add_lease(container_id, image_id);
        Ok(vec![PathBuf::from("/fake/layers").join(image_id)])
    }

    async fn lease_volume(
        &self,
        container_id: &str,
        index: usize,
        image_id: &str,
    ) -> Result<Vec<PathBuf>, crust_image::Error> {
        self.leases
            .lock()
            .unwrap()
            .insert(format!("{container_id}/volume/{index}"), image_id.into());
        Ok(vec![PathBuf::from("/fake/layers").join(image_id)])
    }

    async fn release(&self, container_id: &str) -> Result<(), crust_image::Error> {
        self.journal.push(Effect::Release(container_id.into()));
        let mut leases = self.leases.lock().unwrap();
        leases.retain(|k, _| k != container_id && !k.starts_with(&format!("{container_id}/")));
        Ok(())
    }

    fn leaseholders(&self) -> Result<Vec<String>, crust_image::Error> {
        Ok(self.leases.lock().unwrap().keys().cloned().collect())
    }
}
