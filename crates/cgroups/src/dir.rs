//! Confined, fd-relative access to cgroup directories and their files.
//!
//! A cgroup directory is opened once from its hierarchy's mount point with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` (on kernels without openat2: one `openat(O_NOFOLLOW)`
//! per checked component); every control file is then opened relative to
//! that descriptor by a plain name (no separator, never `.` or `..`), with
//! the same resolve flags and `O_NOFOLLOW`, and never created. Whatever a
//! name holds, nothing outside the cgroup directory can be opened, and a
//! symlink planted in a writable cgroup tree is never followed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::path::CgroupPath;

/// Set once openat2 turned out to be missing (ENOSYS: kernel < 5.6) or
/// filtered (EPERM from a seccomp profile): the per-component walk is used
/// from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

/// An open cgroup directory in one hierarchy.
#[derive(Debug)]
pub(crate) struct CgroupDir {
    fd: OwnedFd,
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

fn plain(name: &str) -> std::io::Result<&str> {
    if is_plain_name(name) {
        Ok(name)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ))
    }
}

/// openat2 beneath `dir`, or the per-component fallback. `rel` is either a
/// plain name or a `CgroupPath`'s checked relative form.
fn open_beneath(dir: &OwnedFd, rel: &str, flags: OFlags) -> std::io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY;
    if rel.split('/').any(|c| c == "." || c == "..") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{rel:?} has a . or .. component"),
        ));
    }
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match rustix::fs::openat2(dir, rel, flags, Mode::empty(), resolve_flags()) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOSYS) | Err(Errno::PERM) => NO_OPENAT2.store(true, Ordering::Relaxed),
            // EAGAIN: a concurrent rename somewhere on the system; the
            // fallback below is as safe.
            Err(Errno::AGAIN) => {}
            Err(e) => return Err(e.into()),
        }
    }
    open_walk(dir, rel, flags)
}

/// The fallback of [`open_beneath`]: one `openat(O_NOFOLLOW)` per plain
/// component, so neither `..` nor a symlink is ever resolved.
fn open_walk(dir: &OwnedFd, rel: &str, flags: OFlags) -> std::io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY;
    let mut components = rel.split('/').filter(|c| !c.is_empty()).peekable();
    let mut current: Option<OwnedFd> = None;
    while let Some(component) = components.next() {
        let component = plain(component)?;
        let parent = current.as_ref().unwrap_or(dir);
        let step_flags = if components.peek().is_none() {
            flags
        } else {
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW
        };
        current = Some(rustix::fs::openat(
            parent,
            component,
            step_flags,
            Mode::empty(),
        )?);
    }
    match current {
        Some(fd) => Ok(fd),
        // "" means the directory itself.
        None => Ok(rustix::fs::openat(dir, ".", flags, Mode::empty())?),
    }
}

impl CgroupDir {
    /// Opens a hierarchy's mount point (a trusted path from the mount
    /// table or configuration), the anchor every cgroup is opened beneath.
    pub(crate) fn open_mount(mount: &Path) -> std::io::Result<OwnedFd> {
        Ok(rustix::fs::open(
            mount,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Opens `cgroup` below the hierarchy mounted at `mount`.
    pub(crate) fn open(mount: &Path, cgroup: &CgroupPath) -> std::io::Result<CgroupDir> {
        Self::open_in(&Self::open_mount(mount)?, mount, cgroup)
    }

    /// Opens `cgroup` beneath `root`, an open mount point (`mount` names
    /// it in messages).
    pub(crate) fn open_in(
        root: &OwnedFd,
        mount: &Path,
        cgroup: &CgroupPath,
    ) -> std::io::Result<CgroupDir> {
        let fd = if cgroup.is_root() {
            // A descriptor of our own for the root.
            rustix::fs::openat(
                root,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?
        } else {
            open_beneath(root, cgroup.relative(), OFlags::RDONLY | OFlags::DIRECTORY)?
        };
        Ok(CgroupDir {
            fd,
            path: cgroup.under(mount),
        })
    }

    /// The open directory, for clone3(CLONE_INTO_CGROUP).
    pub(crate) fn into_fd(self) -> OwnedFd {
        self.fd
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
        let fd = open_beneath(&self.fd, plain(name)?, OFlags::RDONLY | OFlags::DIRECTORY)?;
        Ok(CgroupDir {
            fd,
            path: self.path.join(name),
        })
    }

    fn open_file(&self, name: &str, flags: OFlags) -> std::io::Result<File> {
        // No fstat to check the type (a syscall per file on the stats
        // path): RESOLVE_NO_XDEV keeps the open on the cgroup file system,
        // where nothing but control files and directories exist, a
        // directory fails the read or write (EISDIR), and NONBLOCK keeps a
        // FIFO in a fake tree from hanging us.
        let fd = open_beneath(&self.fd, plain(name)?, flags | OFlags::NONBLOCK)?;
        Ok(File::from(fd))
    }

    /// Whether a control file exists (without following anything).
    pub(crate) fn has(&self, name: &str) -> bool {
        is_plain_name(name)
            && rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|s| {
                rustix::fs::FileType::from_raw_mode(s.st_mode) == rustix::fs::FileType::RegularFile
            })
    }

    /// Reads a control file into `buf` (cleared first). Ok(false) when it
    /// does not exist.
    pub(crate) fn read_into(&self, name: &str, buf: &mut Vec<u8>) -> std::io::Result<bool> {
        buf.clear();
        let mut file = match self.open_file(name, OFlags::RDONLY) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
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
    pub(crate) fn write(&self, name: &str, value: &str) -> std::io::Result<()> {
        let mut file = self.open_file(name, OFlags::WRONLY | OFlags::TRUNC)?;
        let n = file.write(value.as_bytes())?;
        if n != value.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write to {name}: {n} of {} bytes", value.len()),
            ));
        }
        Ok(())
    }

    /// Creates a child directory; Ok(false) when it existed.
    pub(crate) fn mkdir(&self, name: &str) -> std::io::Result<bool> {
        match rustix::fs::mkdirat(&self.fd, plain(name)?, Mode::from_raw_mode(0o755)) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes an empty child directory (a cgroup rmdir); Ok(false) when
    /// it did not exist.
    pub(crate) fn rmdir(&self, name: &str) -> std::io::Result<bool> {
        match rustix::fs::unlinkat(&self.fd, plain(name)?, AtFlags::REMOVEDIR) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The names of the child directories (child cgroups).
    pub(crate) fn subdirs(&self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        let dir = rustix::fs::Dir::read_from(self.fd.as_fd())?;
        for entry in dir {
            let entry = entry?;
            if entry.file_type() != rustix::fs::FileType::Directory {
                continue;
            }
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name != "." && name != ".." {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }

    /// The filesystem magic of the directory.
    pub(crate) fn fs_type(&self) -> std::io::Result<i64> {
        Ok(rustix::fs::fstatfs(&self.fd)?.f_type as i64)
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
    fn the_fallback_walk_is_as_strict() {
        let root = tree();
        let b = root.path().join("a/b");
        symlink(root.path().join("secret"), b.join("memory.high")).unwrap();
        symlink(root.path().join("a"), root.path().join("evil")).unwrap();
        let dir = CgroupDir::open(root.path(), &CgroupPath::root()).unwrap();
        // The fallback used without openat2, driven directly.
        assert!(walk(&dir.fd, "evil/b").is_err());
        let b = walk(&dir.fd, "a/b").unwrap();
        let b = CgroupDir {
            fd: b,
            path: PathBuf::from("b"),
        };
        assert!(walk(&b.fd, "memory.high").is_err());
        assert!(walk(&b.fd, "memory.max").is_ok());
        assert!(walk(&b.fd, "../b").is_err());
    }

    fn walk(dir: &OwnedFd, rel: &str) -> std::io::Result<OwnedFd> {
        open_walk(dir, rel, OFlags::RDONLY)
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
