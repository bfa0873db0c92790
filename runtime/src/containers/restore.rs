//! Restore through CreateContainer: a checkpoint archive (as
//! CheckpointContainer writes it, see `checkpoint.rs`) given as a new
//! container's image. The container is created as the checkpointed one
//! was (its CRI config from the archive, adapted to the new request as
//! CRI-O adapts it), its writable layer gets the archive's
//! `rootfs-diff.tar` and loses its `deleted.files`, and StartContainer
//! restores the process tree from the CRIU images (the monitor runs
//! `runc restore`).

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use crust_api::v1::{ContainerConfig, ImageSpec};
use crust_quote::quote;
use prost::Message;

use super::ContainerError;

/// Under the container's layer dir: the unpacked CRIU images (and
/// criu's work dir), removed once the container is restored.
pub const RESTORE_DIR: &str = "restore";
/// The most bytes a metadata file of the archive may have.
const MAX_METADATA: u64 = 16 << 20;
/// How much of an archive error a message quotes.
const MAX_REASON: usize = 256;

/// What CreateContainer needs of a checkpoint archive (read, not yet
/// unpacked).
#[derive(Debug, Clone)]
pub struct CheckpointArchive {
    pub path: PathBuf,
    /// The checkpointed container's image, as the user named it.
    pub image: String,
    /// Its image ID: the rootfs's base, which must be in the store.
    pub image_id: String,
    /// The checkpointed container's CRI config.
    pub config: ContainerConfig,
}

impl CheckpointArchive {
    /// The paths a restore writes into the container's layer dir.
    /// Named `checkpoint`, as in the archive (see [`unpack`]).
    pub fn images_dir(layer_dir: &Path) -> PathBuf {
        layer_dir.join(RESTORE_DIR).join("checkpoint")
    }

    pub fn work_dir(layer_dir: &Path) -> PathBuf {
        layer_dir.join(RESTORE_DIR).join("work")
    }
}

/// Whether CreateContainer's image names a checkpoint archive: an
/// absolute path (no image reference starts with `/`) of a regular file,
/// as CRI-O accepts one.
pub fn is_archive_path(image: &str) -> bool {
    image.starts_with('/') && Path::new(image).is_file()
}

fn bad(path: &Path, why: impl std::fmt::Display) -> ContainerError {
    ContainerError::InvalidArgument(format!(
        "config.image.image: {} is not a checkpoint archive crust can restore: {}",
        quote(&path.display().to_string()),
        crust_quote::truncate(&why.to_string(), MAX_REASON)
    ))
}

/// The entry's path without `./`, or None if it is not a plain relative
/// path (no `..`, not absolute).
fn entry_name(p: &Path) -> Option<String> {
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(s) => parts.push(s.to_str()?.to_string()),
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

/// Reads the archive's metadata and checks that it has what a restore
/// needs; a damaged or foreign archive is InvalidArgument. Blocking.
pub fn read_archive(path: &Path) -> Result<CheckpointArchive, ContainerError> {
    let file = fs::File::open(path).map_err(|e| bad(path, e))?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    let mut restore_json = None;
    let mut seen = BTreeSet::new();
    for entry in tar.entries().map_err(|e| bad(path, e))? {
        let mut entry = entry.map_err(|e| bad(path, e))?;
        let name = entry
            .path()
            .ok()
            .and_then(|p| entry_name(&p))
            .ok_or_else(|| bad(path, "an entry's path leaves the archive"))?;
        match name.as_str() {
            "restore.json" | "spec.dump" | "config.dump" => {
                let mut data = Vec::new();
                (&mut entry)
                    .take(MAX_METADATA + 1)
                    .read_to_end(&mut data)
                    .map_err(|e| bad(path, e))?;
                if data.len() as u64 > MAX_METADATA {
                    return Err(bad(path, format!("{name} is larger than 16 MiB")));
                }
                let v: serde_json::Value =
                    serde_json::from_slice(&data).map_err(|e| bad(path, format!("{name}: {e}")))?;
                if name == "restore.json" {
                    restore_json = Some(v);
                }
            }
            _ => {
                // Read through: a truncated archive fails here, not at
                // StartContainer.
                io::copy(&mut entry, &mut io::sink()).map_err(|e| bad(path, e))?;
            }
        }
        seen.insert(name);
    }
    for want in [
        "spec.dump",
        "config.dump",
        "rootfs-diff.tar",
        "checkpoint/inventory.img",
    ] {
        if !seen.contains(want) {
            return Err(bad(path, format!("it has no {want}")));
        }
    }
    let r = restore_json.ok_or_else(|| {
        bad(
            path,
            "it has no restore.json (archives of other runtimes are not supported)",
        )
    })?;
    if r["version"] != 1 {
        return Err(bad(path, "restore.json: unknown version"));
    }
    let text = |key: &str| -> Result<String, ContainerError> {
        r[key]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| bad(path, format!("restore.json: no {key}")))
    };
    let config = hex::decode(text("containerConfig")?)
        .ok()
        .and_then(|b| ContainerConfig::decode(b.as_slice()).ok())
        .ok_or_else(|| bad(path, "restore.json: containerConfig does not decode"))?;
    Ok(CheckpointArchive {
        path: path.to_path_buf(),
        image: text("image")?,
        image_id: text("imageId")?,
        config,
    })
}

/// The new container's CRI config: the checkpointed one, with the
/// request's metadata, log path, labels and annotations (where given),
/// and its mounts where they match one of the checkpoint's by container
/// path (what CRI-O does): the restored processes expect the same mount
/// points, the new pod brings their sources. The image is the
/// checkpoint's, by ID.
pub fn restored_config(archive: &CheckpointArchive, request: &ContainerConfig) -> ContainerConfig {
    let mut c = archive.config.clone();
    c.metadata = request.metadata.clone();
    c.log_path = request.log_path.clone();
    if !request.labels.is_empty() {
        c.labels = request.labels.clone();
    }
    if !request.annotations.is_empty() {
        c.annotations = request.annotations.clone();
    }
    for m in &mut c.mounts {
        if let Some(new) = request
            .mounts
            .iter()
            .find(|r| r.container_path == m.container_path)
        {
            *m = new.clone();
        }
    }
    c.image = Some(ImageSpec {
        image: archive.image_id.clone(),
        user_specified_image: archive.image.clone(),
        ..Default::default()
    });
    c
}

/// Unpacks the CRIU images into `images` and the writable layer's
/// changes into `rootfs` (the container's mounted overlay: files land in
/// its upper dir, deletions become whiteouts), never writing outside
/// either. Blocking.
pub fn unpack(archive: &Path, rootfs: &Path, images: &Path) -> Result<(), ContainerError> {
    // `checkpoint/...` entries land in `images` (named so); criu's work
    // dir next to it.
    let restore_dir = images.parent().unwrap_or(images);
    for d in [images.to_path_buf(), restore_dir.join("work")] {
        fs::create_dir_all(&d).map_err(|e| internal("creating", &d, e))?;
    }
    let file = fs::File::open(archive).map_err(|e| bad(archive, e))?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    let mut deleted: Vec<String> = Vec::new();
    let mut had_diff = false;
    for entry in tar.entries().map_err(|e| bad(archive, e))? {
        let mut entry = entry.map_err(|e| bad(archive, e))?;
        let name = entry
            .path()
            .ok()
            .and_then(|p| entry_name(&p))
            .ok_or_else(|| bad(archive, "an entry's path leaves the archive"))?;
        if let Some(rel) = name.strip_prefix("checkpoint/") {
            if rel.is_empty() {
                continue;
            }
            entry.set_preserve_mtime(true);
            entry
                .unpack_in(restore_dir)
                .map_err(|e| bad(archive, format!("{name}: {e}")))?;
        } else if name == "rootfs-diff.tar" {
            had_diff = true;
            let mut diff = tar::Archive::new(&mut entry);
            diff.set_preserve_ownerships(true);
            diff.set_preserve_permissions(true);
            diff.set_overwrite(true);
            for f in diff.entries().map_err(|e| bad(archive, e))? {
                let mut f = f.map_err(|e| bad(archive, format!("rootfs-diff.tar: {e}")))?;
                f.set_preserve_permissions(true);
                f.set_preserve_mtime(true);
                // unpack_in refuses `..` and parents that resolve outside
                // the rootfs (an image's symlink to /).
                f.unpack_in(rootfs)
                    .map_err(|e| bad(archive, format!("rootfs-diff.tar: {e}")))?;
            }
        } else if name == "deleted.files" {
            let mut data = Vec::new();
            (&mut entry)
                .take(MAX_METADATA + 1)
                .read_to_end(&mut data)
                .map_err(|e| bad(archive, e))?;
            deleted = serde_json::from_slice(&data)
                .map_err(|e| bad(archive, format!("deleted.files: {e}")))?;
        }
    }
    if !had_diff {
        return Err(bad(archive, "it has no rootfs-diff.tar"));
    }
    for d in &deleted {
        remove_in(rootfs, d).map_err(|e| bad(archive, format!("deleted.files: {e}")))?;
    }
    Ok(())
}

impl super::Containers {
    /// The archive's base image is in the store (a restore never pulls):
    /// NotFound naming it otherwise.
    pub fn check_restore_image(&self, archive: &CheckpointArchive) -> Result<(), ContainerError> {
        let found = self
            .images
            .resolve(&archive.image_id)
            .map_err(ContainerError::internal)?;
        if found.is_none() {
            return Err(ContainerError::NotFound(format!(
                "config.image.image: the checkpoint's image {} ({}) is not in the image store: \
                 pull it before restoring",
                quote(&crust_quote::truncate(&archive.image, MAX_REASON)),
                crust_quote::truncate(&archive.image_id, MAX_REASON)
            )));
        }
        Ok(())
    }
}

fn internal(what: &str, p: &Path, e: io::Error) -> ContainerError {
    ContainerError::Internal(format!("restore: {what} {}: {e}", p.display()))
}

/// Removes `path` (absolute, as the container sees it) from `rootfs`
/// without following a symlink out of it; a path that is not there is
/// no error (the image may have changed under the same ID: it cannot).
fn remove_in(rootfs: &Path, path: &str) -> Result<(), String> {
    let rel = entry_name(Path::new(path.trim_start_matches('/')))
        .filter(|r| !r.is_empty())
        .ok_or_else(|| format!("{} is not a path in the container", quote(path)))?;
    let target = rootfs.join(&rel);
    let parent = target.parent().unwrap_or(rootfs);
    let real_parent = match parent.canonicalize() {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", quote(path))),
    };
    let real_root = rootfs
        .canonicalize()
        .map_err(|e| format!("the rootfs: {e}"))?;
    if !real_parent.starts_with(&real_root) {
        return Err(format!(
            "{} leads out of the container's rootfs",
            quote(path)
        ));
    }
    let target = real_parent.join(target.file_name().unwrap_or_default());
    let r = match fs::symlink_metadata(&target) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(&target),
        Ok(_) => fs::remove_file(&target),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("{}: {e}", quote(path))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_stay_inside() {
        assert_eq!(entry_name(Path::new("./a/b")).as_deref(), Some("a/b"));
        assert_eq!(entry_name(Path::new("../a")), None);
        assert_eq!(entry_name(Path::new("/etc/passwd")), None);
    }

    #[test]
    fn removals_stay_in_the_rootfs() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        fs::create_dir(root.path().join("bin")).unwrap();
        fs::write(root.path().join("bin/true"), "x").unwrap();
        remove_in(root.path(), "/bin/true").unwrap();
        assert!(!root.path().join("bin/true").exists());
        remove_in(root.path(), "/bin/never-there").unwrap();
        assert!(remove_in(root.path(), "/out/keep").is_err());
        assert!(remove_in(root.path(), "/../x").is_err());
        assert!(outside.path().join("keep").exists());
    }

    #[test]
    fn a_damaged_archive_is_invalid_argument() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.tar");
        fs::write(&p, vec![7u8; 3000]).unwrap();
        let e = read_archive(&p).unwrap_err();
        assert!(
            matches!(&e, ContainerError::InvalidArgument(m) if m.contains("config.image.image")),
            "{e:?}"
        );
    }
}
