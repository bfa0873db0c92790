//! Confined, fd-relative access to cgroup directories and their files.
//!
//! A cgroup directory is opened once from its hierarchy's mount point with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` (on kernels without openat2: one `openat(O_NOFOLLOW)`
//! per checked component); every control file is then opened relative to
//! that descriptor by a plain name (no separator, never `.` or `..`), with
//! the same resolve flags and `O_NOFOLLOW`, and never created. Whatever a
//! name holds, nothing outside the cgroup directory can be opened, and a
//! symlink planted in a writable cgroup tree is never followed. The
//! opening itself is crust-linux's ([`crust_linux::fs::Dir`]).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crust_linux::fs::{Access, Dir, Errno, FileKind};

use crate::path::CgroupPath;

/// An open cgroup directory in one hierarchy.
#[derive(Debug)]
pub(crate) struct CgroupDir {
    dir: Dir,
    /// For error messages only; never used to open anything.
    path: PathBuf,
}

/// A name that can stand for a file directly below a cgroup directory.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= crate::path::MAX_NAME_LEN
        && !name.bytes().any(|b| b == b'/' || b == 0)
}

fn plain(name: &str) -> std::io::Result<&OsStr> {
    if is_plain_name(name) {
        Ok(OsStr::new(name))
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ))
    }
}

impl CgroupDir {
    /// Opens a hierarchy's mount point (a trusted path from the mount
    /// table or configuration), the anchor every cgroup is opened beneath.
    pub(crate) fn open_mount(mount: &Path) -> std::io::Result<Dir> {
        Ok(Dir::open(mount)?)
    }

    /// Opens `cgroup` below the hierarchy mounted at `mount`.
    pub(crate) fn open(mount: &Path, cgroup: &CgroupPath) -> std::io::Result<CgroupDir> {
        Self::open_in(&Self::open_mount(mount)?, mount, cgroup)
    }

    /// Opens `cgroup` beneath `root`, an open mount point (`mount` names
    /// it in messages).
    pub(crate) fn open_in(
        root: &Dir,
        mount: &Path,
        cgroup: &CgroupPath,
    ) -> std::io::Result<CgroupDir> {
        // The root's own relative form is "": a descriptor of our own.
        let dir = root.open_beneath(Path::new(cgroup.relative()))?;
        Ok(CgroupDir {
            dir,
            path: cgroup.under(mount),
        })
    }

    /// The open directory, for clone3(CLONE_INTO_CGROUP).
    pub(crate) fn into_fd(self) -> OwnedFd {
        self.dir.into_fd()
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of a file in this directory, for messages.
    pub(crate) fn file_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// A child directory.
    pub(crate) fn child(&self, name: &str) -> std::io::Result<CgroupDir> {
        let dir = self.dir.open_beneath(Path::new(plain(name)?))?;
        Ok(CgroupDir {
            dir,
            path: self.path.join(name),
        })
    }

    /// Whether a control file exists (without following anything).
    pub(crate) fn has(&self, name: &str) -> bool {
        // cgroupfs holds control files and directories only: whatever is
        // not a directory or a symlink is a control file.
        is_plain_name(name) && self.dir.kind(OsStr::new(name)) == Ok(FileKind::Other)
    }

    /// Reads a control file into `buf` (cleared first). Ok(false) when it
    /// does not exist.
    pub(crate) fn read_into(&self, name: &str, buf: &mut Vec<u8>) -> std::io::Result<bool> {
        buf.clear();
        // No fstat to check the type (a syscall per file on the stats
        // path): RESOLVE_NO_XDEV keeps the open on the cgroup file system,
        // where nothing but control files and directories exist, and a
        // directory fails the read (EISDIR).
        let mut file = match self.dir.open_existing(plain(name)?, Access::Read) {
            Ok(f) => f,
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        file.read_to_end(buf)?;
        Ok(true)
    }

    /// Reads a control file as text, trimmed.
    pub(crate) fn read_string(&self, name: &str) -> std::io::Result<Option<String>> {
        let mut buf = Vec::new();
        if !self.read_into(name, &mut buf)? {
            return Ok(None);
        }
        Ok(Some(String::from_utf8_lossy(&buf).trim().to_string()))
    }

    /// Writes `value` to an existing control file in one write(2), as
    /// cgroupfs expects (O_TRUNC as runc: cgroupfs ignores it, a plain file
    /// is replaced).
    ///
    /// EAGAIN and EINTR (a migration racing a fork or exit, a signal) are
    /// retried, bounded: a whole value written again is the same write.
    pub(crate) fn write(&self, name: &str, value: &str) -> std::io::Result<()> {
        let name = plain(name)?;
        let n = crust_linux::retry::transient(|| {
            let mut file = self.dir.open_existing(name, Access::Write)?;
            file.write(value.as_bytes())
        })?;
        if n != value.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write to {name:?}: {n} of {} bytes", value.len()),
            ));
        }
        Ok(())
    }

    /// Creates a child directory; Ok(false) when it existed.
    pub(crate) fn mkdir(&self, name: &str) -> std::io::Result<bool> {
        match self.dir.create_dir(plain(name)?, 0o755) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes an empty child directory (a cgroup rmdir); Ok(false) when
    /// it did not exist.
    pub(crate) fn rmdir(&self, name: &str) -> std::io::Result<bool> {
        match self.dir.remove_dir(plain(name)?) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The names of the child directories (child cgroups).
    pub(crate) fn subdirs(&self) -> std::io::Result<Vec<String>> {
        Ok(self
            .dir
            .entries()?
            .into_iter()
            .filter(|(_, kind)| *kind == FileKind::Directory)
            .filter_map(|(name, _)| name.into_string().ok())
            .collect())
    }

    /// The filesystem magic of the directory.
    pub(crate) fn fs_type(&self) -> std::io::Result<i64> {
        Ok(self.dir.fs_type()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/memory.max"), "max\n").unwrap();
        std::fs::write(root.path().join("secret"), "host file").unwrap();
        root
    }

    #[test]
    fn reads_and_writes_below_the_directory() {
        let root = tree();
        let dir = CgroupDir::open(root.path(), &CgroupPath::parse("/a/b").unwrap()).unwrap();
        assert_eq!(
            dir.read_string("memory.max").unwrap().as_deref(),
            Some("max")
        );
        dir.write("memory.max", "1000").unwrap();
        assert_eq!(
            std::fs::read_to_string(root.path().join("a/b/memory.max")).unwrap(),
            "1000"
        );
        assert_eq!(dir.read_string("memory.high").unwrap(), None);
        assert!(dir.has("memory.max"));
        assert!(!dir.has("memory.high"));
    }

    #[test]
    fn never_creates_files() {
        let root = tree();
        let dir = CgroupDir::open(root.path(), &CgroupPath::parse("/a/b").unwrap()).unwrap();
        let e = dir.write("memory.high", "1").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert!(!root.path().join("a/b/memory.high").exists());
    }

    #[test]
    fn names_with_separators_or_dots_are_refused() {
        let root = tree();
        let dir = CgroupDir::open(root.path(), &CgroupPath::parse("/a/b").unwrap()).unwrap();
        for name in [
            "../../secret",
            "/etc/passwd",
            "..",
            ".",
            "",
            "x/../memory.max",
            "a\0b",
        ] {
            assert!(dir.write(name, "pwned").is_err(), "{name:?}");
            assert!(dir.read_string(name).is_err(), "{name:?}");
        }
        assert_eq!(
            std::fs::read_to_string(root.path().join("secret")).unwrap(),
            "host file"
        );
    }

    #[test]
    fn symlinks_are_not_followed() {
        let root = tree();
        let b = root.path().join("a/b");
        symlink(root.path().join("secret"), b.join("memory.high")).unwrap();
        symlink("../../secret", b.join("memory.low")).unwrap();
        symlink(root.path(), b.join("linkdir")).unwrap();
        let dir = CgroupDir::open(root.path(), &CgroupPath::parse("/a/b").unwrap()).unwrap();
        for name in ["memory.high", "memory.low"] {
            assert!(dir.write(name, "pwned").is_err(), "{name}");
            assert!(dir.read_string(name).is_err(), "{name}");
            assert!(!dir.has(name));
        }
        assert!(dir.child("linkdir").is_err());
        // A symlinked directory on the way to the cgroup is refused too.
        symlink(root.path().join("a"), root.path().join("evil")).unwrap();
        assert!(CgroupDir::open(root.path(), &CgroupPath::parse("/evil/b").unwrap()).is_err());
        assert_eq!(
            std::fs::read_to_string(root.path().join("secret")).unwrap(),
            "host file"
        );
    }

    #[test]
    fn directories_are_made_listed_and_removed() {
        let root = tree();
        let a = CgroupDir::open(root.path(), &CgroupPath::parse("/a").unwrap()).unwrap();
        assert!(a.mkdir("c").unwrap());
        assert!(!a.mkdir("c").unwrap());
        let mut subdirs = a.subdirs().unwrap();
        subdirs.sort();
        assert_eq!(subdirs, ["b", "c"]);
        assert!(a.rmdir("c").unwrap());
        assert!(!a.rmdir("c").unwrap());
        assert!(a.mkdir("../x").is_err());
        assert!(a.rmdir("..").is_err());
    }
}
