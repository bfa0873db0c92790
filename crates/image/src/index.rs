//! The image index: one record per image (keyed by ID = config digest) in
//! the metadata store's `images` table, plus the leases containers hold on
//! layers (its `leases` table). The
//! lookup and tag-moving rules here are pure functions over records.

use std::collections::BTreeMap;

use crust_store::{Kind, Record};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::manifest::{ImageConfig, Platform};
use crate::reference::Reference;

/// A local image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Image {
    /// `sha256:<hex>` of the config blob, as containerd and docker report it.
    pub id: String,
    /// `name:tag` references.
    #[serde(default)]
    pub repo_tags: Vec<String>,
    /// `name@sha256:<manifest or index digest>` references.
    #[serde(default)]
    pub repo_digests: Vec<String>,
    /// Bytes as containerd reports it: the manifest (and index), config and
    /// compressed layers.
    pub size: u64,
    #[serde(default)]
    pub config: ImageConfig,
    pub platform: Platform,
    #[serde(default)]
    pub created: Option<String>,
    /// The platform manifest the image was installed from.
    pub manifest_digest: Digest,
    pub diff_ids: Vec<Digest>,
    /// Layer chain IDs, bottom first; see [`crate::ImageService::layer_dirs`].
    pub chain_ids: Vec<Digest>,
    /// Every blob the image keeps alive: indexes, manifest, config, layers.
    pub blobs: Vec<Digest>,
    /// Pinned images are never pruned (the sandbox image).
    #[serde(default)]
    pub pinned: bool,
}

impl Record for Image {
    const KIND: Kind = Kind::Image;
    fn key(&self) -> &str {
        &self.id
    }
}

impl Image {
    fn has_refs(&self) -> bool {
        !self.repo_tags.is_empty() || !self.repo_digests.is_empty()
    }
}

/// A container's hold on an image's layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub image_id: String,
    pub chain_ids: Vec<Digest>,
    /// The image is mounted as an image volume (KEP-4639): it may not be
    /// removed while the lease lasts, not only its layers kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub volume: bool,
}

/// The stored form of a lease: one record per container, keyed by its ID,
/// in the store's `leases` table (so taking or dropping a lease is one
/// small atomic write).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LeaseRecord {
    pub container_id: String,
    #[serde(flatten)]
    pub lease: Lease,
}

impl Record for LeaseRecord {
    const KIND: Kind = Kind::Lease;
    fn key(&self) -> &str {
        &self.container_id
    }
}

/// All leases by container ID.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Leases {
    pub by_container: BTreeMap<String, Lease>,
}

impl Leases {
    pub fn load(store: &crust_store::Store) -> Result<Self> {
        let by_container = store
            .list::<LeaseRecord>()?
            .into_iter()
            .map(|r| (r.container_id, r.lease))
            .collect();
        Ok(Leases { by_container })
    }
}

/// How a query named an image; decides what removing it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    Id,
    Tag(String),
    Digest(String),
}

/// Resolves a user's image query as containerd does: a full ID, a
/// reference (tag or digest, normalised), then a unique ID prefix.
pub fn find<'a>(images: &'a [Image], query: &str) -> Result<Option<(&'a Image, Match)>> {
    let query = query.trim();
    if query.is_empty() {
        return Err(Error::InvalidArgument(
            "image reference is empty".to_string(),
        ));
    }
    let hex = query.strip_prefix("sha256:").unwrap_or(query);
    if let Some(d) = Digest::from_hex(hex) {
        let id = d.to_string();
        return Ok(images.iter().find(|i| i.id == id).map(|i| (i, Match::Id)));
    }
    if let Ok(r) = Reference::parse(query) {
        let found = match (r.digest(), r.repo_tag()) {
            (Some(d), _) => {
                let want = r.repo_digest(d);
                images
                    .iter()
                    .find(|i| i.repo_digests.contains(&want))
                    .map(|i| (i, Match::Digest(want)))
            }
            (None, Some(tag)) => images
                .iter()
                .find(|i| i.repo_tags.contains(&tag))
                .map(|i| (i, Match::Tag(tag))),
            (None, None) => None,
        };
        if found.is_some() {
            return Ok(found);
        }
    }
    find_by_prefix(images, hex)
}

fn find_by_prefix<'a>(images: &'a [Image], hex: &str) -> Result<Option<(&'a Image, Match)>> {
    let is_hex = !hex.is_empty() && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !is_hex {
        return Ok(None);
    }
    let mut hits = images.iter().filter(|i| {
        i.id.strip_prefix("sha256:")
            .is_some_and(|h| h.starts_with(hex))
    });
    match (hits.next(), hits.next()) {
        (Some(i), None) => Ok(Some((i, Match::Id))),
        (Some(_), Some(_)) => Err(Error::Ambiguous(hex.to_string())),
        _ => Ok(None),
    }
}

/// What to write after a change: records to put and IDs to delete.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    pub put: Vec<Image>,
    pub delete: Vec<String>,
}

/// Records `new` (merged with its existing record) holding `tags` and
/// `digests`, taking them from any other image that held them; an image
/// left with no reference at all goes, as in containerd.
pub fn add_image(images: &[Image], mut new: Image, tags: &[String], digests: &[String]) -> Changes {
    let mut changes = Changes::default();
    if let Some(old) = images.iter().find(|i| i.id == new.id) {
        new.pinned |= old.pinned;
        new.repo_tags = union(&old.repo_tags, &new.repo_tags);
        new.repo_digests = union(&old.repo_digests, &new.repo_digests);
        new.blobs = union(&old.blobs, &new.blobs);
    }
    new.repo_tags = union(&new.repo_tags, tags);
    new.repo_digests = union(&new.repo_digests, digests);
    for other in images.iter().filter(|i| i.id != new.id) {
        let holds = |r: &String| tags.contains(r) || digests.contains(r);
        if !other.repo_tags.iter().chain(&other.repo_digests).any(holds) {
            continue;
        }
        let mut o = other.clone();
        o.repo_tags.retain(|t| !holds(t));
        o.repo_digests.retain(|d| !holds(d));
        if o.has_refs() {
            changes.put.push(o);
        } else {
            changes.delete.push(o.id);
        }
    }
    changes.put.push(new);
    changes
}

fn union<T: Clone + PartialEq>(a: &[T], b: &[T]) -> Vec<T> {
    let mut out = a.to_vec();
    for x in b {
        if !out.contains(x) {
            out.push(x.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(n: u8) -> String {
        hex::encode([n; 32])
    }

    fn image(n: u8, tags: &[&str], digests: &[&str]) -> Image {
        Image {
            id: format!("sha256:{}", hex(n)),
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: digests.iter().map(|s| s.to_string()).collect(),
            size: 1,
            config: ImageConfig::default(),
            platform: crate::manifest::host_platform(),
            created: None,
            manifest_digest: Digest::of(&[n]),
            diff_ids: vec![],
            chain_ids: vec![],
            blobs: vec![Digest::of(&[n])],
            pinned: false,
        }
    }

    fn digest_ref(name: &str, n: u8) -> String {
        format!("{name}@sha256:{}", hex(n))
    }

    #[test]
    fn finds_by_id_reference_and_prefix() {
        let busybox_digest = digest_ref("docker.io/library/busybox", 9);
        let images = vec![
            image(
                0x11,
                &["docker.io/library/busybox:latest"],
                &[&busybox_digest],
            ),
            image(0x12, &["registry.k8s.io/pause:3.9"], &[]),
            image(0x22, &[], &[]),
        ];
        let id = |q: &str| find(&images, q).unwrap().map(|(i, m)| (i.id.clone(), m));
        let i1 = images[0].id.clone();
        assert_eq!(id(&i1), Some((i1.clone(), Match::Id)));
        assert_eq!(id(&hex(0x11)), Some((i1.clone(), Match::Id)));
        assert_eq!(
            id("busybox"),
            Some((
                i1.clone(),
                Match::Tag("docker.io/library/busybox:latest".into())
            ))
        );
        assert_eq!(
            id(&format!("busybox@sha256:{}", hex(9))),
            Some((i1.clone(), Match::Digest(busybox_digest.clone())))
        );
        assert_eq!(
            id("registry.k8s.io/pause:3.9").map(|x| x.0),
            Some(images[1].id.clone())
        );
        assert_eq!(id("22").map(|x| x.0), Some(images[2].id.clone()));
        assert_eq!(id("sha256:22").map(|x| x.0), Some(images[2].id.clone()));
        assert!(matches!(find(&images, "1"), Err(Error::Ambiguous(_))));
        assert_eq!(id("busybox:1.36"), None);
        assert_eq!(id("nothing"), None);
        assert_eq!(id(&hex(0x33)), None);
        assert!(find(&images, "").is_err());
        assert_eq!(id("Not A Ref!"), None);
    }

    #[test]
    fn a_tag_moves_to_the_new_image() {
        let old_digest = digest_ref("docker.io/library/busybox", 1);
        let images = vec![
            image(1, &["docker.io/library/busybox:latest"], &[&old_digest]),
            image(2, &["docker.io/library/busybox:1.36"], &[]),
            image(3, &["docker.io/library/other:latest"], &[]),
        ];
        let new = image(4, &[], &[]);
        let new_digest = digest_ref("docker.io/library/busybox", 4);
        let tags = vec![
            "docker.io/library/busybox:latest".to_string(),
            "docker.io/library/busybox:1.36".to_string(),
        ];
        let c = add_image(&images, new, &tags, std::slice::from_ref(&new_digest));
        // Image 1 keeps its digest reference (dangling, as containerd);
        // image 2 lost its only reference and goes.
        assert_eq!(c.delete, vec![images[1].id.clone()]);
        assert_eq!(c.put.len(), 2);
        assert_eq!(c.put[0].id, images[0].id);
        assert!(c.put[0].repo_tags.is_empty());
        assert_eq!(c.put[0].repo_digests, vec![old_digest]);
        assert_eq!(c.put[1].repo_tags, tags);
        assert_eq!(c.put[1].repo_digests, vec![new_digest]);
    }

    #[test]
    fn re_adding_merges_refs_and_keeps_pinned() {
        let mut old = image(1, &["a/b:1"], &[]);
        old.pinned = true;
        let c = add_image(
            &[old.clone()],
            image(1, &[], &[]),
            &["a/b:2".to_string()],
            &[],
        );
        assert!(c.delete.is_empty());
        assert_eq!(c.put.len(), 1);
        assert_eq!(c.put[0].repo_tags, ["a/b:1", "a/b:2"]);
        assert!(c.put[0].pinned);
    }
}
