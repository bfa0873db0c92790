//! Mounts a pod sandbox owns besides its namespaces.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statfs::{TMPFS_MAGIC, statfs};

use crate::Error;

/// Size of a pod's /dev/shm when the request does not say (Docker's and
/// containerd's default).
pub const DEFAULT_SHM_SIZE: u64 = 64 * 1024 * 1024;

/// Mounts a tmpfs for the pod's shared `/dev/shm` at `path` (created if
/// missing, must not be a symlink). Containers of a pod with its own IPC
/// namespace bind-mount it, so POSIX shared memory is shared like SysV IPC.
pub fn mount_shm(path: &Path, size_bytes: u64) -> Result<(), Error> {
    if size_bytes == 0 {
        return Err(Error::invalid("shm size", "must be positive"));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(Error::io("create shm dir", path))?;
    let meta = std::fs::symlink_metadata(path).map_err(Error::io("stat shm dir", path))?;
    if !meta.file_type().is_dir() {
        return Err(Error::Io {
            op: "use shm dir",
            path: path.to_path_buf(),
            source: std::io::Error::other("not a directory (symlink?)"),
        });
    }
    let data = format!("mode=1777,size={size_bytes}");
    nix::mount::mount(
        Some("shm"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(|e| Error::Io {
        op: "mount shm tmpfs on",
        path: path.to_path_buf(),
        source: e.into(),
    })
}

/// Whether a tmpfs is mounted at `path` (recovery check for [`mount_shm`]).
pub fn is_shm_mounted(path: &Path) -> bool {
    let is_symlink = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    // A mount point's device differs from its parent's.
    !is_symlink
        && statfs(path).is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC)
        && is_mount_point(path)
}

/// Unmounts whatever is mounted at `path` (without following a symlink)
/// and removes the directory. Idempotent.
pub fn unmount_and_remove_dir(path: &Path) -> Result<(), Error> {
    for _ in 0..16 {
        match nix::mount::umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => continue,
            Err(Errno::EINVAL | Errno::ENOENT) => break,
            Err(e) => {
                return Err(Error::Io {
                    op: "unmount",
                    path: path.to_path_buf(),
                    source: e.into(),
                });
            }
        }
    }
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove dir", path)(e)),
    }
}

fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(parent)) = (std::fs::metadata(path), path.parent()) else {
        return false;
    };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != me.dev())
}
