//! Content-addressed blob store: `<root>/content/blobs/sha256/<hex>`.
//!
//! A blob becomes visible only by rename of a fully written, verified and
//! fsync'ed temp file from `<root>/content/ingest`, so no reader ever sees a
//! half-written blob; temp files of an interrupted write are removed when
//! their writer is dropped, or at the next start.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use tempfile::NamedTempFile;

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};

#[derive(Debug, Clone)]
pub struct ContentStore {
    blobs: PathBuf,
    ingest: PathBuf,
    /// Held shared by every [`ContentStore::commit`] until its blob is in
    /// place, and exclusively by GC while it decides: a commit whose caller
    /// went away mid-way (a cancelled download) still finishes in its
    /// blocking task, and must land before GC looks, not after.
    gate: Arc<tokio::sync::RwLock<()>>,
}

impl ContentStore {
    /// Opens the store under `root`, creating it, and removes temp files an
    /// earlier process left behind.
    pub fn open(root: &Path) -> Result<Self> {
        let blobs = root.join("blobs").join("sha256");
        let ingest = root.join("ingest");
        std::fs::create_dir_all(&blobs).ctx(|| format!("creating {}", blobs.display()))?;
        if ingest.exists() {
            std::fs::remove_dir_all(&ingest).ctx(|| format!("cleaning {}", ingest.display()))?;
        }
        std::fs::create_dir_all(&ingest).ctx(|| format!("creating {}", ingest.display()))?;
        Ok(ContentStore {
            blobs,
            ingest,
            gate: Arc::default(),
        })
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    /// The blob's size if it is present.
    pub fn size(&self, digest: &Digest) -> Option<u64> {
        std::fs::symlink_metadata(self.path(digest))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    pub fn has(&self, digest: &Digest) -> bool {
        self.size(digest).is_some()
    }

    pub fn open_blob(&self, digest: &Digest) -> Result<File> {
        File::open(self.path(digest)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(format!("blob {digest}")),
            _ => Error::io(format!("opening blob {digest}"), e),
        })
    }

    /// Reads a small blob (manifest, config) whole, refusing anything over
    /// `max` bytes.
    pub fn read(&self, digest: &Digest, max: u64) -> Result<Vec<u8>> {
        let file = self.open_blob(digest)?;
        let mut buf = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut buf)
            .ctx(|| format!("reading blob {digest}"))?;
        if buf.len() as u64 > max {
            return Err(Error::verification(
                digest.to_string(),
                format!("larger than the {max} byte limit"),
            ));
        }
        Ok(buf)
    }

    /// Starts writing a blob; `expect` = the digest and size it must have.
    pub fn writer(&self, expect: Option<(Digest, u64)>) -> Result<BlobWriter> {
        let tmp = NamedTempFile::new_in(&self.ingest)
            .ctx(|| format!("creating a temp file in {}", self.ingest.display()))?;
        Ok(BlobWriter {
            tmp,
            hasher: Sha256::new(),
            written: 0,
            expect,
            blobs: self.blobs.clone(),
        })
    }

    /// Commits a written blob off the async threads (fsync), so that GC
    /// never runs while it is landing, even if the caller stops waiting.
    pub async fn commit(&self, writer: BlobWriter) -> Result<Digest> {
        let guard = self.gate.clone().read_owned().await;
        tokio::task::spawn_blocking(move || {
            let _landing = guard;
            writer.commit()
        })
        .await
        .map_err(|e| Error::Internal(format!("blob commit task: {e}")))?
    }

    /// Waits for commits in flight and keeps new ones out while held (GC).
    pub(crate) async fn exclusive(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.gate.clone().write_owned().await
    }

    /// Writes small, fully known bytes (a manifest) under their digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest> {
        let digest = Digest::of(bytes);
        if self.has(&digest) {
            return Ok(digest);
        }
        let mut w = self.writer(Some((digest.clone(), bytes.len() as u64)))?;
        w.write(bytes)?;
        w.commit()
    }

    /// Every blob present (names that are not digests are ignored).
    pub fn list(&self) -> Result<Vec<Digest>> {
        let entries =
            std::fs::read_dir(&self.blobs).ctx(|| format!("listing {}", self.blobs.display()))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.ctx(|| format!("listing {}", self.blobs.display()))?;
            if let Some(d) = entry.file_name().to_str().and_then(Digest::from_hex) {
                out.push(d);
            }
        }
        Ok(out)
    }

    pub fn remove(&self, digest: &Digest) -> Result<()> {
        match std::fs::remove_file(self.path(digest)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("removing blob {digest}"), e))
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    pub(crate) fn ingest_dir(&self) -> &Path {
        &self.ingest
    }
}

/// A blob being written: hashed and counted as it goes, checked against the
/// expected size on every write so a lying server cannot fill the disk.
pub struct BlobWriter {
    tmp: NamedTempFile,
    hasher: Sha256,
    written: u64,
    expect: Option<(Digest, u64)>,
    blobs: PathBuf,
}

impl BlobWriter {
    pub fn write(&mut self, buf: &[u8]) -> Result<()> {
        let total = self.written + buf.len() as u64;
        if let Some((digest, size)) = &self.expect
            && total > *size
        {
            return Err(Error::verification(
                digest.to_string(),
                format!("more data than the {size} bytes its descriptor declares"),
            ));
        }
        self.hasher.update(buf);
        self.tmp
            .as_file_mut()
            .write_all(buf)
            .ctx(|| "writing a blob to the ingest dir".to_string())?;
        self.written = total;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Verifies, fsyncs and renames the blob into place; returns its digest.
    /// On any failure the temp file is removed.
    pub fn commit(self) -> Result<Digest> {
        self.commit_with(|_| {})
    }

    /// [`Self::commit`], calling `before_visible` with the digest just
    /// before the blob appears (to pin it against a concurrent GC).
    pub fn commit_with(self, before_visible: impl FnOnce(&Digest)) -> Result<Digest> {
        let actual = Digest::from_hasher(self.hasher);
        if let Some((digest, size)) = &self.expect {
            if self.written != *size {
                return Err(Error::verification(
                    digest.to_string(),
                    format!("got {} bytes, descriptor declares {size}", self.written),
                ));
            }
            if &actual != digest {
                return Err(Error::verification(
                    digest.to_string(),
                    format!("content has digest {actual}"),
                ));
            }
        }
        self.tmp
            .as_file()
            .sync_all()
            .ctx(|| format!("syncing blob {actual}"))?;
        before_visible(&actual);
        let dest = self.blobs.join(actual.hex());
        self.tmp
            .persist(&dest)
            .map_err(|e| Error::io(format!("storing blob {actual}"), e.error))?;
        sync_dir(&self.blobs)?;
        Ok(actual)
    }
}

/// Makes a rename in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("syncing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, ContentStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        (dir, store)
    }

    fn ingest_is_empty(s: &ContentStore) -> bool {
        std::fs::read_dir(s.ingest_dir()).unwrap().next().is_none()
    }

    #[test]
    fn verified_blob_becomes_visible() {
        let (_d, s) = store();
        let digest = Digest::of(b"hello");
        let mut w = s.writer(Some((digest.clone(), 5))).unwrap();
        w.write(b"hel").unwrap();
        assert!(!s.has(&digest));
        w.write(b"lo").unwrap();
        assert_eq!(w.commit().unwrap(), digest);
        assert_eq!(s.read(&digest, 100).unwrap(), b"hello");
        assert_eq!(s.list().unwrap(), vec![digest.clone()]);
        assert!(ingest_is_empty(&s));
        assert!(s.read(&digest, 4).is_err());
        s.remove(&digest).unwrap();
        s.remove(&digest).unwrap();
        assert!(!s.has(&digest));
    }

    #[test]
    fn lying_digest_or_size_leaves_nothing() {
        let (_d, s) = store();
        let claimed = Digest::of(b"hello");
        let mut w = s.writer(Some((claimed.clone(), 5))).unwrap();
        w.write(b"world").unwrap();
        let err = w.commit().unwrap_err().to_string();
        assert!(err.contains("content has digest"), "{err}");

        let mut w = s.writer(Some((claimed.clone(), 5))).unwrap();
        let err = w.write(b"hello!").unwrap_err().to_string();
        assert!(err.contains("more data"), "{err}");
        drop(w);

        let mut w = s.writer(Some((claimed.clone(), 5))).unwrap();
        w.write(b"hell").unwrap();
        assert!(w.commit().unwrap_err().to_string().contains("got 4 bytes"));

        assert!(!s.has(&claimed));
        assert!(s.list().unwrap().is_empty());
        assert!(ingest_is_empty(&s));
    }

    #[test]
    fn open_cleans_leftover_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = ContentStore::open(dir.path()).unwrap();
        let w = s.writer(None).unwrap();
        std::mem::forget(w); // as if the process died mid-write
        assert!(!ingest_is_empty(&s));
        let s = ContentStore::open(dir.path()).unwrap();
        assert!(ingest_is_empty(&s));
    }
}
