//! Removing one of crust's directories (a container's or a pod's) with
//! everything in it, without ever leaving the directory's own mount: a
//! mount left inside (a rootfs overlay, a bind mount a failed unmount left
//! behind) stops the removal with `EBUSY` instead of having its contents
//! deleted, as `std::fs::remove_dir_all` would do (it descends into mount
//! points and fails only at their rmdir). Symlinks are removed, never
//! followed.
//!
//! Iterative (an explicit stack of open directories, each listed once), so
//! a deep tree a container made in its writable layer cannot overflow the
//! caller's stack; each level holds one descriptor. Errors name the
//! removed directory and the entry (deep paths are not spelled out).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::fs::{Dir, Errno, FileKind};

/// Removes `path` and everything below it; a missing `path` is no error.
/// `EBUSY` (naming the mount point in the message) if `path` is a mount
/// point or anything below it is, with what came before it removed.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a directory crust may remove", path.display()),
        ));
    };
    let parent_dir = match Dir::open_following(parent) {
        Ok(d) => d,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(with_path(e, parent)),
    };
    match parent_dir.kind(name) {
        Ok(FileKind::Directory) => {}
        Ok(_) => return not_found_ok(parent_dir.remove_file(name), path),
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(with_path(e, path)),
    }
    let device = std::fs::symlink_metadata(path)?.dev();
    let shown = |n: &OsStr| path.join(n);
    let top = open_same_mount(&parent_dir, name, device, &|| path.to_path_buf())?;
    let mut stack = vec![Level::enter(top, name.to_os_string(), path)?];
    while let Some(level) = stack.last_mut() {
        match level.subdirs.pop() {
            Some(entry) => {
                let child = open_same_mount(&level.dir, &entry, device, &|| shown(&entry))?;
                stack.push(Level::enter(child, entry, path)?);
            }
            None => {
                // Empty now: remove it from the directory above it.
                let Some(done) = stack.pop() else { break };
                let above = stack.last().map_or(&parent_dir, |l| &l.dir);
                not_found_ok(above.remove_dir(&done.name), path)?;
            }
        }
    }
    Ok(())
}

/// A directory being emptied: its files are gone once it is entered; its
/// subdirectories wait their turn.
struct Level {
    dir: Dir,
    /// Its name in the directory above it.
    name: OsString,
    subdirs: Vec<OsString>,
}

impl Level {
    fn enter(dir: Dir, name: OsString, top: &Path) -> io::Result<Level> {
        let mut subdirs = Vec::new();
        for (entry, kind) in dir.entries().map_err(|e| with_path(e, top))? {
            if kind == FileKind::Directory {
                subdirs.push(entry);
            } else {
                // A file something is mounted on (a pinned namespace)
                // answers EBUSY here.
                not_found_ok(dir.remove_file(&entry), &top.join(&entry))?;
            }
        }
        Ok(Level { dir, name, subdirs })
    }
}

/// Opens the directory `name` in `dir` if it lies on the same mount:
/// openat2's `RESOLVE_NO_XDEV` answers EXDEV at a mount point (bind mounts
/// of the same file system too); where openat2 is missing, a different
/// device number still tells most mounts apart.
/// (`shown` names it in an error: the top's path and the entry.)
fn open_same_mount(
    dir: &Dir,
    name: &OsStr,
    device: u64,
    shown: &dyn Fn() -> PathBuf,
) -> io::Result<Dir> {
    let child = match dir.open_beneath(Path::new(name)) {
        Ok(c) => c,
        Err(Errno::EXDEV) => return Err(mounted(&shown())),
        Err(e) => return Err(with_path(e, &shown())),
    };
    let st =
        nix::sys::stat::fstat(child.as_fd().as_raw_fd()).map_err(|e| with_path(e, &shown()))?;
    if st.st_dev != device {
        return Err(mounted(&shown()));
    }
    Ok(child)
}

fn mounted(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("{} is a mount point: not removed", path.display()),
    )
}

fn with_path(e: Errno, path: &Path) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn not_found_ok(r: crate::fs::Result<()>, path: &Path) -> io::Result<()> {
    match r {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(with_path(e, path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) {
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/file"), b"x").unwrap();
        std::fs::write(root.join("a/b/c/deep"), b"y").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("a/link")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("a/b/dirlink")).unwrap();
    }

    #[test]
    fn a_tree_with_symlinks_is_removed_and_their_targets_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("victim");
        tree(&root);
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert!(Path::new("/etc/passwd").exists());
    }

    #[test]
    fn a_missing_dir_is_no_error() {
        let tmp = tempfile::tempdir().unwrap();
        remove_tree(&tmp.path().join("never")).unwrap();
        remove_tree(&tmp.path().join("never/deeper")).unwrap();
    }

    #[test]
    fn a_file_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        remove_tree(&f).unwrap();
        assert!(!f.exists());
    }

    #[test]
    fn a_deep_tree_does_not_exhaust_the_stack() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("deep");
        // Deeper than PATH_MAX allows in one path: made one level at a
        // time, relative to the previous level.
        let mut dir = Dir::open(tmp.path()).unwrap();
        dir.create_dir(OsStr::new("deep"), 0o755).unwrap();
        dir = dir.open_dir(OsStr::new("deep")).unwrap();
        for _ in 0..3000 {
            dir.create_dir(OsStr::new("dddddddddd"), 0o755).unwrap();
            dir = dir.open_dir(OsStr::new("dddddddddd")).unwrap();
        }
        drop(dir);
        let big_stack = std::thread::Builder::new().stack_size(256 * 1024);
        let root2 = root.clone();
        big_stack
            .spawn(move || remove_tree(&root2).unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert!(!root.exists());
    }
}
