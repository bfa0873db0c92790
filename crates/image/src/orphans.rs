//! Content nothing references: the blobs no image keeps, the unpacked
//! layers no image or container lease keeps, and (with no daemon running)
//! the temp files of interrupted writes. GC removes them
//! ([`crate::ImageService::gc`]); `crust check` reports them with the bytes
//! they take ([`crate::ImageService::orphans`] while the daemon runs,
//! [`scan_offline`] while it does not).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crust_store::Store;

use crate::digest::Digest;
use crate::error::{IoContext, Result};
use crate::index::{Image, Lease, Leases};
use crate::usage::usage;

/// What an orphan of the image store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContentKind {
    /// `content/blobs/sha256/<hex>` no image lists.
    Blob,
    /// `layers/<chain-hex>` no image or lease lists.
    Layer,
    /// `content/ingest/*`, `layers/.tmp-*`, `layers/.trash-*`: writes and
    /// deletions a crash cut short (in flight while a daemon runs).
    Temp,
}

/// One orphan of the image store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanContent {
    pub kind: ContentKind,
    /// The digest (blobs), chain ID (layers) or file name (temp files).
    pub name: String,
    pub path: PathBuf,
    /// Allocated bytes (as `du`).
    pub bytes: u64,
}

/// The blobs no image keeps and the layers no image or lease keeps, from
/// the records and what is on disk. Pure.
pub fn unreferenced<'a>(
    images: &[Image],
    leases: impl IntoIterator<Item = &'a Lease>,
    blobs: Vec<Digest>,
    layers: Vec<Digest>,
) -> (Vec<Digest>, Vec<Digest>) {
    let keep_blobs: HashSet<&Digest> = images.iter().flat_map(|i| &i.blobs).collect();
    let keep_layers: HashSet<&Digest> = images
        .iter()
        .flat_map(|i| &i.chain_ids)
        .chain(leases.into_iter().flat_map(|l| &l.chain_ids))
        .collect();
    let blobs = blobs
        .into_iter()
        .filter(|d| !keep_blobs.contains(d))
        .collect();
    let layers = layers
        .into_iter()
        .filter(|d| !keep_layers.contains(d))
        .collect();
    (blobs, layers)
}

/// The image store's dirs under the daemon's root.
pub(crate) struct Dirs {
    pub blobs: PathBuf,
    pub ingest: PathBuf,
    pub layers: PathBuf,
}

impl Dirs {
    pub fn under(root: &Path) -> Dirs {
        Dirs {
            blobs: root.join("content").join("blobs").join("sha256"),
            ingest: root.join("content").join("ingest"),
            layers: root.join("layers"),
        }
    }
}

/// The orphans of the image store under `root` while no daemon runs:
/// reads the records in `store` and the dirs, changes nothing (opening an
/// [`crate::ImageService`] would collect them). A missing dir holds none.
pub fn scan_offline(root: &Path, store: &Store) -> Result<Vec<OrphanContent>> {
    let dirs = Dirs::under(root);
    let images = store.list::<Image>()?;
    let leases = Leases::load(store)?;
    let blobs = digests_in(&dirs.blobs)?;
    let layers = digests_in(&dirs.layers)?;
    let (blobs, layers) = unreferenced(&images, leases.by_container.values(), blobs, layers);
    let mut out = Vec::new();
    for d in blobs {
        out.push(measured(
            ContentKind::Blob,
            d.to_string(),
            dirs.blobs.join(d.hex()),
        )?);
    }
    for d in layers {
        out.push(measured(
            ContentKind::Layer,
            d.to_string(),
            dirs.layers.join(d.hex()),
        )?);
    }
    for name in names_in(&dirs.ingest)? {
        let path = dirs.ingest.join(&name);
        out.push(measured(ContentKind::Temp, name, path)?);
    }
    for name in names_in(&dirs.layers)? {
        if crate::layers::is_leftover(&name) {
            let path = dirs.layers.join(&name);
            out.push(measured(ContentKind::Temp, name, path)?);
        }
    }
    Ok(out)
}

/// Every image lease in `store` by its holder (a container ID, or
/// `<container ID>/...` for an image volume), read without an
/// [`crate::ImageService`] (while no daemon runs).
pub fn leases_in(store: &Store) -> Result<Vec<(String, Lease)>> {
    Ok(Leases::load(store)?.by_container.into_iter().collect())
}

/// An orphan with the bytes under `path`.
pub(crate) fn measured(kind: ContentKind, name: String, path: PathBuf) -> Result<OrphanContent> {
    let bytes = usage(&[&path])?.bytes;
    Ok(OrphanContent {
        kind,
        name,
        path,
        bytes,
    })
}

/// The entries of `dir` named by a digest's hex; none when it is missing.
fn digests_in(dir: &Path) -> Result<Vec<Digest>> {
    Ok(names_in(dir)?
        .iter()
        .filter_map(|n| Digest::from_hex(n))
        .collect())
}

fn names_in(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.ctx(|| format!("listing {}", dir.display()))?,
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{ImageConfig, Platform};

    fn d(s: &str) -> Digest {
        Digest::of(s.as_bytes())
    }

    fn image(blobs: &[&str], layers: &[&str]) -> Image {
        Image {
            id: d(blobs[0]).to_string(),
            repo_tags: vec![],
            repo_digests: vec![],
            size: 0,
            config: ImageConfig::default(),
            platform: Platform {
                architecture: "amd64".into(),
                os: "linux".into(),
                variant: None,
            },
            created: None,
            manifest_digest: d(blobs[0]),
            diff_ids: vec![],
            chain_ids: layers.iter().map(|l| d(l)).collect(),
            blobs: blobs.iter().map(|b| d(b)).collect(),
            pinned: false,
        }
    }

    #[test]
    fn images_keep_blobs_and_layers_leases_keep_layers() {
        let images = [image(&["m", "c", "l1"], &["L1"])];
        let lease = Lease {
            image_id: "gone".into(),
            chain_ids: vec![d("L2")],
            volume: false,
        };
        let (blobs, layers) = unreferenced(
            &images,
            [&lease],
            vec![d("m"), d("c"), d("l1"), d("stray")],
            vec![d("L1"), d("L2"), d("L3")],
        );
        assert_eq!(blobs, vec![d("stray")]);
        assert_eq!(layers, vec![d("L3")]);
        // Nothing on disk: nothing unreferenced, whatever the records say.
        let (blobs, layers) = unreferenced(&images, [], vec![], vec![]);
        assert!(blobs.is_empty() && layers.is_empty());
    }

    #[test]
    fn offline_scan_finds_strays_and_leftovers_and_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let store = Store::open(&root.join("meta.db")).unwrap();
        let dirs = Dirs::under(root);
        for dir in [&dirs.blobs, &dirs.ingest, &dirs.layers] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let kept = Digest::of(b"kept");
        let stray = Digest::of(b"stray");
        std::fs::write(dirs.blobs.join(kept.hex()), b"kept").unwrap();
        std::fs::write(dirs.blobs.join(stray.hex()), vec![7u8; 10_000]).unwrap();
        std::fs::write(dirs.blobs.join("not-a-digest"), b"x").unwrap();
        std::fs::create_dir_all(dirs.layers.join(stray.hex()).join("diff")).unwrap();
        std::fs::create_dir_all(dirs.layers.join(".tmp-1")).unwrap();
        std::fs::write(dirs.ingest.join(".tmpXYZ"), b"half").unwrap();
        let mut img = image(&["x"], &[]);
        img.blobs = vec![kept.clone()];
        store.put(&img).unwrap();

        let found = scan_offline(root, &store).unwrap();
        let names: Vec<(ContentKind, &str)> =
            found.iter().map(|o| (o.kind, o.name.as_str())).collect();
        let stray_name = stray.to_string();
        assert_eq!(
            names,
            vec![
                (ContentKind::Blob, stray_name.as_str()),
                (ContentKind::Layer, stray_name.as_str()),
                (ContentKind::Temp, ".tmpXYZ"),
                (ContentKind::Temp, ".tmp-1"),
            ]
        );
        assert!(found[0].bytes >= 10_000, "{:?}", found[0]);
        assert!(dirs.blobs.join(stray.hex()).exists());
        // A root without an image store: nothing.
        let empty = tempfile::tempdir().unwrap();
        assert!(scan_offline(empty.path(), &store).unwrap().is_empty());
    }
}
