//! Unpacked layers, one dir per chain ID: `<root>/layers/<chain-hex>/diff`,
//! each holding only its own layer's changes, for use as an overlayfs
//! lowerdir.
//!
//! A layer is unpacked into `.tmp-*`, synced, then renamed into place, so a
//! layer dir either is complete or does not exist. Deletion renames it to
//! `.trash-*` first, so a half-deleted layer is never mistaken for a whole
//! one. Leftovers of both are removed at open.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::content::sync_dir;
use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::unpack::unpack_layer;

const TMP_PREFIX: &str = ".tmp-";
const TRASH_PREFIX: &str = ".trash-";

#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

impl LayerStore {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        let store = LayerStore {
            dir: dir.to_path_buf(),
        };
        for entry in std::fs::read_dir(dir).ctx(|| format!("listing {}", dir.display()))? {
            let entry = entry.ctx(|| format!("listing {}", dir.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if is_leftover(&name) {
                remove_dir(&entry.path())?;
            }
        }
        Ok(store)
    }

    /// The dir holding this layer's files (an overlayfs lowerdir).
    pub fn diff_path(&self, chain_id: &Digest) -> PathBuf {
        self.dir.join(chain_id.hex()).join("diff")
    }

    pub fn has(&self, chain_id: &Digest) -> bool {
        std::fs::symlink_metadata(self.diff_path(chain_id)).is_ok_and(|m| m.is_dir())
    }

    /// Every complete layer present.
    pub fn list(&self) -> Result<Vec<Digest>> {
        let mut out = Vec::new();
        for entry in
            std::fs::read_dir(&self.dir).ctx(|| format!("listing {}", self.dir.display()))?
        {
            let entry = entry.ctx(|| format!("listing {}", self.dir.display()))?;
            if let Some(d) = entry.file_name().to_str().and_then(Digest::from_hex) {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Unpacks `blob` as layer `chain_id` (blocking). The uncompressed
    /// digest must equal `diff_id` from the image config, or nothing is kept.
    pub fn unpack(
        &self,
        chain_id: &Digest,
        blob: File,
        diff_id: &Digest,
        label: &str,
        privileged: bool,
        cancel: &AtomicBool,
    ) -> Result<()> {
        let tmp = tempfile::Builder::new()
            .prefix(TMP_PREFIX)
            .tempdir_in(&self.dir)
            .ctx(|| format!("creating a temp dir in {}", self.dir.display()))?;
        let diff = tmp.path().join("diff");
        std::fs::create_dir(&diff).ctx(|| format!("creating {}", diff.display()))?;
        let actual = unpack_layer(blob, &diff, label, privileged, cancel)?;
        if &actual != diff_id {
            return Err(Error::layer(
                label,
                format!(
                    "uncompressed digest {actual} does not match the config's diff ID {diff_id}"
                ),
            ));
        }
        // Durable before visible: a crash after the rename must not leave a
        // layer with missing file data.
        let dir = File::open(tmp.path()).ctx(|| format!("opening {}", tmp.path().display()))?;
        crust_linux::fs::sync_filesystem(dir.as_fd()).ctx(|| "syncing the layer".to_string())?;
        let dest = self.dir.join(chain_id.hex());
        match std::fs::rename(tmp.path(), &dest) {
            Ok(()) => {
                let _kept: PathBuf = tmp.keep();
            }
            // Someone else finished the same layer first; theirs is as good.
            Err(_) if self.has(chain_id) => return Ok(()),
            Err(e) => {
                return Err(Error::io(
                    format!("moving layer into {}", dest.display()),
                    e,
                ));
            }
        }
        sync_dir(&self.dir)
    }

    /// Moves a layer out of sight; returns the trash path to delete later.
    pub fn trash(&self, chain_id: &Digest) -> Result<Option<PathBuf>> {
        let src = self.dir.join(chain_id.hex());
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dest = self.dir.join(format!(
            "{TRASH_PREFIX}{}-{}-{}",
            chain_id.hex(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::rename(&src, &dest) {
            Ok(()) => Ok(Some(dest)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("removing layer {chain_id}"), e)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Whether `name` in the layers dir is an unpack or a deletion a crash
/// cut short (removed at open).
pub(crate) fn is_leftover(name: &str) -> bool {
    name.starts_with(TMP_PREFIX) || name.starts_with(TRASH_PREFIX)
}

/// std's remove_dir_all does not follow symlinks (CVE-2022-21658 fixed).
pub(crate) fn remove_dir(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(name: &str, data: &[u8]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
        b.into_inner().unwrap()
    }

    fn blob_file(dir: &Path, bytes: &[u8]) -> File {
        let p = dir.join("blob");
        std::fs::write(&p, bytes).unwrap();
        File::open(p).unwrap()
    }

    #[test]
    fn unpacks_once_and_trashes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LayerStore::open(&tmp.path().join("layers")).unwrap();
        let tar = tar_with("f", b"x");
        let diff = Digest::of(&tar);
        let chain = diff.clone();
        store
            .unpack(
                &chain,
                blob_file(tmp.path(), &tar),
                &diff,
                "l",
                false,
                &AtomicBool::new(false),
            )
            .unwrap();
        assert!(store.has(&chain));
        assert_eq!(
            std::fs::read(store.diff_path(&chain).join("f")).unwrap(),
            b"x"
        );
        assert_eq!(store.list().unwrap(), vec![chain.clone()]);
        let trash = store.trash(&chain).unwrap().unwrap();
        assert!(!store.has(&chain));
        assert!(store.list().unwrap().is_empty());
        // Reopening cleans the trash.
        LayerStore::open(store.dir()).unwrap();
        assert!(!trash.exists());
        assert!(store.trash(&chain).unwrap().is_none());
    }

    #[test]
    fn diff_id_mismatch_keeps_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = LayerStore::open(&tmp.path().join("layers")).unwrap();
        let tar = tar_with("f", b"x");
        let wrong = Digest::of(b"other");
        let err = store
            .unpack(
                &wrong,
                blob_file(tmp.path(), &tar),
                &wrong,
                "l",
                false,
                &AtomicBool::new(false),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not match the config's diff ID"), "{err}");
        assert_eq!(std::fs::read_dir(store.dir()).unwrap().count(), 0);
    }
}
