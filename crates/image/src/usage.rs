//! Disk usage of the image store, for CRI ImageFsInfo.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Bytes (allocated blocks, as `du`) and inodes used under some dirs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Walks `dirs` without following symlinks, counting each inode once
/// (hardlinks share one).
pub fn usage(dirs: &[&Path]) -> Result<FsUsage> {
    let mut seen = HashSet::new();
    let mut total = FsUsage::default();
    let mut stack: Vec<std::path::PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    while let Some(path) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            // Removed while walking (GC, an unpack finishing): not ours to count.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(crate::Error::io(format!("stat {}", path.display()), e)),
        };
        if seen.insert((meta.dev(), meta.ino())) {
            total.inodes += 1;
            total.bytes += meta.blocks() * 512;
        }
        if meta.is_dir() {
            let entries = match std::fs::read_dir(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                other => other.ctx(|| format!("listing {}", path.display()))?,
            };
            for entry in entries {
                stack.push(entry.ctx(|| format!("listing {}", path.display()))?.path());
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hardlinks_once_and_ignores_symlink_targets() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        std::fs::create_dir(&d).unwrap();
        let base = usage(&[&d]).unwrap();
        assert_eq!(base.inodes, 1);
        std::fs::write(d.join("f"), vec![1u8; 10_000]).unwrap();
        std::fs::hard_link(d.join("f"), d.join("g")).unwrap();
        std::os::unix::fs::symlink("/usr", d.join("s")).unwrap();
        let u = usage(&[&d]).unwrap();
        assert_eq!(u.inodes, 3);
        assert!(u.bytes >= base.bytes + 10_000, "{u:?}");
        assert!(
            u.bytes < base.bytes + 1_000_000,
            "followed the symlink? {u:?}"
        );
        assert_eq!(
            usage(&[&tmp.path().join("missing")]).unwrap(),
            FsUsage::default()
        );
    }
}
