//! Offline import of `docker save` archives and OCI image-layout tars
//! (plain, gzip or zstd). Archives are hostile too: their paths are only
//! keys in a map, never used to create files; every file is streamed into
//! the content store under its own sha256, and OCI `blobs/sha256/<hex>`
//! names must match. Images are then installed like pulled ones (layers
//! unpacked safely, diff IDs verified).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crust_quote::quote;
use serde::Deserialize;

use crate::content::ContentStore;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::index::Image;
use crate::keyed::{PinSet, Pins};
use crate::manifest::{
    self, DOCKER_CONFIG, Descriptor, Index, MAX_MANIFEST_BYTES, OCI_LAYER_GZIP, OCI_LAYER_TAR,
    OCI_LAYER_ZSTD, OCI_MANIFEST,
};
use crate::reference::Reference;
use crate::service::ImageService;
use crate::tar_limit::{self, Counted};
use crate::unpack::decompress;

/// Metadata files kept in memory rather than stored as blobs.
const METADATA: &[&str] = &["index.json", "manifest.json", "oci-layout", "repositories"];
const MAX_ENTRIES: usize = 1_000_000;
const MAX_LINK_HOPS: usize = 16;
const CONTAINERD_NAME: &str = "io.containerd.image.name";
const OCI_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// What the archive held: files by normalised path, symlinks, metadata.
#[derive(Default)]
struct Staged {
    files: HashMap<String, (Digest, u64)>,
    links: HashMap<String, String>,
    metadata: HashMap<String, Vec<u8>>,
}

impl Staged {
    /// A file by archive path, following the archive's own symlinks
    /// (docker save links repeated layers).
    fn file(&self, path: &str) -> Result<&(Digest, u64)> {
        let mut path = normalize(path);
        for _ in 0..MAX_LINK_HOPS {
            if let Some(f) = self.files.get(&path) {
                return Ok(f);
            }
            match self.links.get(&path) {
                Some(target) => path = target.clone(),
                None => break,
            }
        }
        Err(Error::Archive(format!(
            "{} is not in the archive",
            quote(&path)
        )))
    }
}

/// One image to install: its top document and the tags to give it.
struct Plan {
    top: Digest,
    tags: Vec<String>,
}

impl ImageService {
    /// Imports every image in a `docker save` or OCI image-layout archive
    /// (`crust images import`). Returns the installed images. Whatever the
    /// outcome, content the archive held that no image uses is removed.
    pub async fn import(&self, archive: &Path) -> Result<Vec<Image>> {
        let result = self.import_archive(archive).await;
        self.gc().await?;
        result
    }

    async fn import_archive(&self, archive: &Path) -> Result<Vec<Image>> {
        let content = self.content().clone();
        let pins = self.pins().clone();
        let path = archive.to_path_buf();
        let (staged, mut pinset) =
            tokio::task::spawn_blocking(move || stage_archive(&content, &path, &pins))
                .await
                .map_err(|e| Error::Internal(format!("import task: {e}")))??;
        let plans = self.plan(&staged, &mut pinset)?;
        let mut images = Vec::new();
        for plan in plans {
            images.push(
                self.install_local(&plan.top, plan.tags, &mut pinset)
                    .await?,
            );
        }
        Ok(images)
    }

    fn plan(&self, staged: &Staged, pins: &mut PinSet) -> Result<Vec<Plan>> {
        if let Some(index) = staged.metadata.get("index.json") {
            return plan_oci(index);
        }
        if let Some(manifest) = staged.metadata.get("manifest.json") {
            return plan_docker(self.content(), staged, manifest, pins);
        }
        Err(Error::Archive(
            "neither index.json (OCI layout) nor manifest.json (docker save) found".to_string(),
        ))
    }
}

fn stage_archive(
    content: &ContentStore,
    path: &PathBuf,
    pins: &Arc<Pins>,
) -> Result<(Staged, PinSet)> {
    let file = File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let mut pinset = pins.pin([]);
    let mut staged = Staged::default();
    let label = path.display().to_string();
    let reader = decompress(file, &label).map_err(|e| Error::Archive(e.to_string()))?;
    let (counted, meter) = Counted::new(reader);
    let mut archive = tar::Archive::new(counted);
    let entries = tar_limit::Entries::new(&mut archive, meter)
        .map_err(|e| Error::Archive(format!("not a tar archive: {e}")))?;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ENTRIES {
            return Err(Error::Archive(format!("more than {MAX_ENTRIES} entries")));
        }
        let mut entry = entry.map_err(|e| Error::Archive(format!("broken tar archive: {e}")))?;
        let name = normalize(&String::from_utf8_lossy(&entry.path_bytes()));
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                stage_file(content, &mut staged, &mut pinset, name, &mut entry)?;
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry.link_name_bytes().unwrap_or_default();
                let target = String::from_utf8_lossy(&target).into_owned();
                let resolved = if entry.header().entry_type() == tar::EntryType::Symlink {
                    resolve_relative(&name, &target)
                } else {
                    normalize(&target)
                };
                staged.links.insert(name, resolved);
            }
            _ => {}
        }
    }
    Ok((staged, pinset))
}

fn stage_file(
    content: &ContentStore,
    staged: &mut Staged,
    pins: &mut PinSet,
    name: String,
    data: &mut impl Read,
) -> Result<()> {
    if METADATA.contains(&name.as_str()) {
        let mut buf = Vec::new();
        data.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| Error::Archive(format!("reading {name}: {e}")))?;
        if buf.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::Archive(format!("{name} is too large")));
        }
        staged.metadata.insert(name, buf);
        return Ok(());
    }
    let mut writer = content.writer(None)?;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = data
            .read(&mut buf)
            .map_err(|e| Error::Archive(format!("reading {name}: {e}")))?;
        if n == 0 {
            break;
        }
        writer.write(&buf[..n])?;
    }
    let size = writer.written();
    let digest = writer.commit_with(|d| pins.add([format!("blob:{d}")]))?;
    if let Some(hex) = name.strip_prefix("blobs/sha256/")
        && hex != digest.hex()
    {
        return Err(Error::Archive(format!("{name} has digest {digest}")));
    }
    staged.files.insert(name, (digest, size));
    Ok(())
}

/// Archive paths as map keys: no leading `/` or `./`, no `.` parts, `..`
/// resolved lexically (it can only name another key, never a host path).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}

fn resolve_relative(link: &str, target: &str) -> String {
    if target.starts_with('/') {
        return normalize(target);
    }
    let dir = link.rsplit_once('/').map_or("", |(d, _)| d);
    normalize(&format!("{dir}/{target}"))
}

/// OCI layout: each index.json entry is an image, named by containerd's
/// annotation or by a full reference in `org.opencontainers.image.ref.name`
/// (a bare tag there names nothing).
fn plan_oci(index_json: &[u8]) -> Result<Vec<Plan>> {
    let index: Index = serde_json::from_slice(index_json)
        .map_err(|e| Error::Archive(format!("index.json: {e}")))?;
    let mut plans = Vec::new();
    for desc in &index.manifests {
        let tags = match oci_name(desc)? {
            Some(r) => r.repo_tag().into_iter().collect(),
            None => vec![],
        };
        plans.push(Plan {
            top: desc.digest.clone(),
            tags,
        });
    }
    if plans.is_empty() {
        return Err(Error::Archive("index.json lists no images".to_string()));
    }
    Ok(plans)
}

fn oci_name(desc: &Descriptor) -> Result<Option<Reference>> {
    let Some(ann) = &desc.annotations else {
        return Ok(None);
    };
    let name = match (ann.get(CONTAINERD_NAME), ann.get(OCI_REF_NAME)) {
        (Some(n), _) => n,
        (None, Some(n)) if n.contains(['/', ':', '@']) => n,
        _ => return Ok(None),
    };
    Reference::parse(name)
        .map(Some)
        .map_err(|e| Error::Archive(format!("image name in index.json: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    #[serde(default)]
    layers: Vec<String>,
}

/// docker save: manifest.json lists config and layer files; crust writes
/// the OCI manifest those files make and installs that.
fn plan_docker(
    content: &ContentStore,
    staged: &Staged,
    manifest_json: &[u8],
    pins: &mut PinSet,
) -> Result<Vec<Plan>> {
    let entries: Vec<DockerEntry> = serde_json::from_slice(manifest_json)
        .map_err(|e| Error::Archive(format!("manifest.json: {e}")))?;
    if entries.is_empty() {
        return Err(Error::Archive("manifest.json lists no images".to_string()));
    }
    let mut plans = Vec::new();
    for entry in entries {
        let (config, config_size) = staged.file(&entry.config)?;
        let mut layers = Vec::new();
        for path in &entry.layers {
            let (digest, size) = staged.file(path)?;
            layers.push(serde_json::json!({
                "mediaType": layer_media_type(content, digest)?,
                "digest": digest,
                "size": size,
            }));
        }
        let doc = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": DOCKER_CONFIG, "digest": config, "size": config_size},
            "layers": layers,
        });
        let bytes = serde_json::to_vec(&doc).map_err(|e| Error::Internal(e.to_string()))?;
        // Make sure what crust wrote parses as what it means.
        manifest::parse_document(&bytes)?;
        pins.add([format!("blob:{}", Digest::of(&bytes))]);
        let top = content.put_bytes(&bytes)?;
        let mut tags = Vec::new();
        for t in entry.repo_tags.unwrap_or_default() {
            let r = Reference::parse(&t)
                .map_err(|e| Error::Archive(format!("RepoTags in manifest.json: {e}")))?;
            tags.extend(r.repo_tag());
        }
        plans.push(Plan { top, tags });
    }
    Ok(plans)
}

/// docker save stores layers uncompressed, newer docker may compress them:
/// tell by magic number.
fn layer_media_type(content: &ContentStore, digest: &Digest) -> Result<&'static str> {
    let mut head = [0u8; 4];
    let mut f = content.open_blob(digest)?;
    let n = f
        .read(&mut head)
        .map_err(|e| Error::io(format!("reading blob {digest}"), e))?;
    Ok(match &head[..n] {
        [0x1f, 0x8b, ..] => OCI_LAYER_GZIP,
        [0x28, 0xb5, 0x2f, 0xfd] => OCI_LAYER_ZSTD,
        _ => OCI_LAYER_TAR,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_paths_are_map_keys() {
        assert_eq!(normalize("./blobs/sha256/ab"), "blobs/sha256/ab");
        assert_eq!(normalize("/../../etc/passwd"), "etc/passwd");
        assert_eq!(
            resolve_relative("a/layer.tar", "../b/layer.tar"),
            "b/layer.tar"
        );
        assert_eq!(resolve_relative("a/layer.tar", "/x"), "x");
    }

    /// A long name claiming more than the metadata bound is refused while
    /// it is read, not after it was buffered.
    #[test]
    fn oversized_long_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_size(8 << 20);
        h.set_cksum();
        let mut tar = h.as_bytes().to_vec();
        tar.resize(tar.len() + (8 << 20), b'a');
        tar.extend_from_slice(&[0u8; 1024]);
        let path = dir.path().join("archive.tar.zst");
        std::fs::write(&path, zstd::encode_all(tar.as_slice(), 1).unwrap()).unwrap();
        let content = ContentStore::open(&dir.path().join("content")).unwrap();
        let err = stage_archive(&content, &path, &Arc::new(Pins::default()))
            .err()
            .expect("an 8 MiB long name was accepted")
            .to_string();
        assert!(err.contains("over 4 MiB"), "{err}");
    }

    #[test]
    fn symlink_loops_end() {
        let mut s = Staged::default();
        s.links.insert("a".into(), "b".into());
        s.links.insert("b".into(), "a".into());
        assert!(s.file("a").is_err());
    }

    #[test]
    fn oci_names() {
        let desc = |k: &str, v: &str| Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: Digest::of(b"x"),
            size: 1,
            platform: None,
            annotations: Some([(k.to_string(), v.to_string())].into()),
        };
        let name = |d: Descriptor| oci_name(&d).unwrap().map(|r| r.to_string());
        assert_eq!(
            name(desc(CONTAINERD_NAME, "busybox:1")),
            Some("docker.io/library/busybox:1".into())
        );
        assert_eq!(
            name(desc(OCI_REF_NAME, "example.com/a:b")),
            Some("example.com/a:b".into())
        );
        assert_eq!(name(desc(OCI_REF_NAME, "latest")), None);
        assert!(oci_name(&desc(CONTAINERD_NAME, "Bad Name")).is_err());
    }
}
