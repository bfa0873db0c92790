//! Files reached through directory descriptors without ever following a
//! symlink: unpacking hostile image layers under a directory without
//! leaving it (every call is relative to a [`Dir`], one component at a
//! time), and writing files in crust's own directories.
//!
//! Errors are the kernel's [`Errno`], so that callers can tell "missing"
//! (`ENOENT`) from "a symlink is in the way" (`ELOOP`, `ENOTDIR`).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

pub use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};

pub type Result<T> = std::result::Result<T, Errno>;

/// What a directory entry is, as far as a walk cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    Symlink,
    /// A regular file, a device, a FIFO, a socket, or unknown.
    Other,
}

/// The special files [`Dir::make_node`] creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    CharDevice,
    BlockDevice,
    Fifo,
}

/// An open directory (`O_DIRECTORY | O_NOFOLLOW`): names given to its
/// methods are single components resolved inside it, and none of them
/// follows a symlink at the last component.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Set once openat2 turned out to be missing (ENOSYS: kernel < 5.6) or
/// filtered (EPERM from a seccomp profile): [`Dir::open_beneath`] walks
/// one component at a time from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// How [`Dir::open_beneath`] and [`Dir::open_existing`] open what they
/// open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Write to the start of an existing file (`O_TRUNC`, which pseudo
    /// file systems such as cgroupfs ignore).
    Write,
}

/// Takes ownership of a descriptor a syscall has just returned.
pub(crate) fn own(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by open(2)/openat(2)/openat2(2) and nothing else
    // refers to it, so this is its one owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl Dir {
    /// Opens the directory `path` (relative paths against the current
    /// directory); its last component must not be a symlink.
    pub fn open(path: &Path) -> Result<Dir> {
        let fd = nix::fcntl::openat(None, path, dir_flags(), Mode::empty())?;
        Ok(Dir { fd: own(fd) })
    }

    /// Opens the directory `path`, following symlinks everywhere (for
    /// paths that belong to the node, such as the parent of a pod's log
    /// directory, where an operator may have linked a data disk in).
    pub fn open_following(path: &Path) -> Result<Dir> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(None, path, flags, Mode::empty())?;
        Ok(Dir { fd: own(fd) })
    }

    /// A second, independent descriptor for the same directory.
    pub fn reopen(&self) -> Result<Dir> {
        self.open_dir(OsStr::new("."))
    }

    /// Opens the subdirectory `name`: `ELOOP` or `ENOTDIR` if it is a
    /// symlink or not a directory.
    pub fn open_dir(&self, name: &OsStr) -> Result<Dir> {
        let fd = nix::fcntl::openat(Some(self.raw()), name, dir_flags(), Mode::empty())?;
        Ok(Dir { fd: own(fd) })
    }

    /// `mkdirat` (the umask applies).
    pub fn create_dir(&self, name: &OsStr, mode: u32) -> Result<()> {
        nix::sys::stat::mkdirat(Some(self.raw()), name, Mode::from_bits_truncate(mode))
    }

    /// What `name` is, without following a symlink.
    pub fn kind(&self, name: &OsStr) -> Result<FileKind> {
        let st = nix::sys::stat::fstatat(Some(self.raw()), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        Ok(
            match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFDIR => FileKind::Directory,
                SFlag::S_IFLNK => FileKind::Symlink,
                _ => FileKind::Other,
            },
        )
    }

    /// Creates the regular file `name`, which must not exist yet (not even
    /// as a dangling symlink), for writing.
    pub fn create_file(&self, name: &OsStr, mode: u32) -> Result<File> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(
            Some(self.raw()),
            name,
            flags,
            Mode::from_bits_truncate(mode),
        )?;
        Ok(File::from(own(fd)))
    }

    /// Creates the symlink `name` pointing at `target` (text only: nothing
    /// is resolved).
    pub fn symlink(&self, name: &OsStr, target: &OsStr) -> Result<()> {
        nix::unistd::symlinkat(target, Some(self.raw()), name)
    }

    /// Creates `name` as a hard link to `target_name` in `target_dir`; a
    /// symlink there is linked as the symlink.
    pub fn hard_link(&self, name: &OsStr, target_dir: &Dir, target_name: &OsStr) -> Result<()> {
        nix::unistd::linkat(
            Some(target_dir.raw()),
            target_name,
            Some(self.raw()),
            name,
            AtFlags::empty(),
        )
    }

    /// `mknodat`: a device node (`major`, `minor`) or a FIFO (the umask
    /// applies to `mode`).
    pub fn make_node(
        &self,
        name: &OsStr,
        kind: NodeKind,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<()> {
        let kind = match kind {
            NodeKind::CharDevice => SFlag::S_IFCHR,
            NodeKind::BlockDevice => SFlag::S_IFBLK,
            NodeKind::Fifo => SFlag::S_IFIFO,
        };
        let dev = nix::sys::stat::makedev(major.into(), minor.into());
        nix::sys::stat::mknodat(
            Some(self.raw()),
            name,
            kind,
            Mode::from_bits_truncate(mode),
            dev,
        )
    }

    /// `fchmodat` of `name` (which the caller made and knows is no
    /// symlink: Linux cannot change a symlink's mode).
    pub fn set_mode_of(&self, name: &OsStr, mode: u32) -> Result<()> {
        nix::sys::stat::fchmodat(
            Some(self.raw()),
            name,
            Mode::from_bits_truncate(mode),
            FchmodatFlags::FollowSymlink,
        )
    }

    /// Owner of `name` itself (a symlink's own owner, not its target's).
    pub fn set_owner_of(&self, name: &OsStr, uid: u32, gid: u32) -> Result<()> {
        nix::unistd::fchownat(
            Some(self.raw()),
            name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
    }

    /// Access and modification time of `name` itself to `secs` since the
    /// epoch.
    pub fn set_mtime_of(&self, name: &OsStr, secs: i64) -> Result<()> {
        let t = TimeSpec::new(secs, 0);
        nix::sys::stat::utimensat(
            Some(self.raw()),
            name,
            &t,
            &t,
            UtimensatFlags::NoFollowSymlink,
        )
    }

    /// Removes the non-directory `name`.
    pub fn remove_file(&self, name: &OsStr) -> Result<()> {
        nix::unistd::unlinkat(Some(self.raw()), name, UnlinkatFlags::NoRemoveDir)
    }

    /// Removes the empty directory `name`.
    pub fn remove_dir(&self, name: &OsStr) -> Result<()> {
        nix::unistd::unlinkat(Some(self.raw()), name, UnlinkatFlags::RemoveDir)
    }

    /// The entries (without `.` and `..`) and what each is, as the
    /// filesystem reports it in the listing.
    pub fn entries(&self) -> Result<Vec<(OsString, FileKind)>> {
        let mut dir = nix::dir::Dir::openat(
            Some(self.raw()),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                Some(nix::dir::Type::Directory) => FileKind::Directory,
                Some(nix::dir::Type::Symlink) => FileKind::Symlink,
                _ => FileKind::Other,
            };
            out.push((OsString::from_vec(name.to_vec()), kind));
        }
        Ok(out)
    }

    /// Opens the directory `rel` (slash-separated components, no `.` or
    /// `..`) below this one, never leaving it: `openat2` with
    /// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
    /// RESOLVE_NO_XDEV`, or, where the kernel has no openat2, one
    /// `O_NOFOLLOW` open per component. An empty `rel` is this directory.
    pub fn open_beneath(&self, rel: &Path) -> Result<Dir> {
        let fd = self.beneath(rel, dir_flags())?;
        Ok(Dir { fd })
    }

    /// Opens the existing file `name` (one component) for reading or
    /// writing: never created, never through a symlink or onto another
    /// mount, non-blocking (a FIFO cannot hang the caller).
    pub fn open_existing(&self, name: &OsStr, access: Access) -> Result<File> {
        if !is_one_component(name) {
            return Err(Errno::EINVAL);
        }
        let flags = match access {
            Access::Read => OFlag::O_RDONLY,
            Access::Write => OFlag::O_WRONLY | OFlag::O_TRUNC,
        } | OFlag::O_NONBLOCK
            | OFlag::O_NOFOLLOW
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        Ok(File::from(self.beneath(Path::new(name), flags)?))
    }

    /// Opens `name` (one component) for appending, created with `mode` if
    /// missing: never through a symlink (`ELOOP`), non-blocking and
    /// without becoming a controlling tty (a FIFO or device planted there
    /// cannot hang or take over the caller; the caller checks what it got).
    pub fn open_append(&self, name: &OsStr, mode: u32) -> Result<File> {
        if !is_one_component(name) {
            return Err(Errno::EINVAL);
        }
        let flags = OFlag::O_WRONLY
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(
            Some(self.raw()),
            name,
            flags,
            Mode::from_bits_truncate(mode),
        )?;
        Ok(File::from(own(fd)))
    }

    /// The magic number of the file system the directory is on
    /// (`statfs(2)`'s `f_type`).
    pub fn fs_type(&self) -> Result<i64> {
        Ok(nix::sys::statfs::fstatfs(&self.fd)?.filesystem_type().0 as i64)
    }

    /// The descriptor, e.g. for `clone3(CLONE_INTO_CGROUP)`.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    fn beneath(&self, rel: &Path, flags: OFlag) -> Result<OwnedFd> {
        let components: Vec<&OsStr> = rel
            .as_os_str()
            .as_bytes()
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .map(OsStr::from_bytes)
            .collect();
        if rel.is_absolute() || components.iter().any(|c| !is_one_component(c)) {
            return Err(Errno::EINVAL);
        }
        let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if components.is_empty() {
            let fd = nix::fcntl::openat(Some(self.raw()), ".", flags, Mode::empty())?;
            return Ok(own(fd));
        }
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            use nix::fcntl::{OpenHow, ResolveFlag};
            let how = OpenHow::new().flags(flags).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
            // EAGAIN: a mount or rename somewhere on the system during the
            // lookup; EINTR: a signal. Retried, bounded.
            match crate::retry::transient(|| nix::fcntl::openat2(self.raw(), rel, how)) {
                Ok(fd) => return Ok(own(fd)),
                Err(Errno::ENOSYS) | Err(Errno::EPERM) => NO_OPENAT2.store(true, Ordering::Relaxed),
                // Still racing after the retries: the walk below is as
                // strict (no `..`, no symlinks).
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
        self.walk(&components, flags)
    }

    /// [`Dir::beneath`] without openat2: one `O_NOFOLLOW` open per
    /// component, so neither `..` nor a symlink is ever resolved (mount
    /// crossings are not detected: the caller's tree is trusted for that).
    fn walk(&self, components: &[&OsStr], flags: OFlag) -> Result<OwnedFd> {
        let Some((last, parents)) = components.split_last() else {
            return Err(Errno::EINVAL);
        };
        let mut current: Option<OwnedFd> = None;
        for c in parents {
            let parent = current.as_ref().map_or(self.raw(), |fd| fd.as_raw_fd());
            let fd = nix::fcntl::openat(
                Some(parent),
                *c,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            current = Some(own(fd));
        }
        let parent = current.as_ref().map_or(self.raw(), |fd| fd.as_raw_fd());
        Ok(own(nix::fcntl::openat(
            Some(parent),
            *last,
            flags,
            Mode::empty(),
        )?))
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// One path component: not empty, not `.` or `..`, no `/` or NUL.
fn is_one_component(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.iter().any(|c| *c == b'/' || *c == 0)
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `fchown` of an open file or directory.
pub fn set_owner(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<()> {
    nix::unistd::fchown(
        fd.as_raw_fd(),
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
    )
}

/// `fchmod` of an open file or directory.
pub fn set_mode(fd: BorrowedFd<'_>, mode: u32) -> Result<()> {
    nix::sys::stat::fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(mode))
}

/// Access and modification time of an open file or directory to `secs`
/// since the epoch.
pub fn set_mtime(fd: BorrowedFd<'_>, secs: i64) -> Result<()> {
    let t = TimeSpec::new(secs, 0);
    nix::sys::stat::futimens(fd.as_raw_fd(), &t, &t)
}

/// `fsetxattr`: sets the extended attribute `name` of an open file.
pub fn set_xattr(fd: BorrowedFd<'_>, name: &OsStr, value: &[u8]) -> Result<()> {
    let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: `fd` is open for the call, `name` is a NUL-terminated string
    // and `value` a buffer of `value.len()` bytes, both only read.
    let r = unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    Errno::result(r).map(drop)
}

/// `lgetxattr`: reads the extended attribute `name` of `path` itself into
/// `buf`; returns its length.
pub fn get_xattr(path: &Path, name: &OsStr, buf: &mut [u8]) -> Result<usize> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and only read; the kernel
    // writes at most `buf.len()` bytes into `buf`.
    let r = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    Errno::result(r).map(|n| n as usize)
}

/// `syncfs`: writes out everything cached for the filesystem that holds
/// the open file `fd`.
pub fn sync_filesystem(fd: BorrowedFd<'_>) -> Result<()> {
    nix::unistd::syncfs(fd.as_raw_fd())
}

/// The major and minor numbers of a device number (`st_rdev`).
pub fn device_numbers(rdev: u64) -> (u32, u32) {
    (
        nix::sys::stat::major(rdev) as u32,
        nix::sys::stat::minor(rdev) as u32,
    )
}

/// Whether this process runs with effective uid 0.
pub fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Writes `content` to `path`, never through a symlink at `path`: an
/// existing regular file is truncated in place (its inode, which others
/// may have bind-mounted, stays), a missing one is created with `mode`.
pub fn write_no_follow(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.write_all(content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A tree with a file below `a/b`, a host file beside it, and
    /// symlinks planted inside pointing out.
    fn planted() -> (tempfile::TempDir, Dir) {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/file"), "x").unwrap();
        std::fs::write(root.join("secret"), "host file").unwrap();
        symlink(root.join("secret"), root.join("a/b/abs")).unwrap();
        symlink("../../secret", root.join("a/b/rel")).unwrap();
        symlink(root.join("a"), root.join("evil")).unwrap();
        let dir = Dir::open(root).unwrap();
        (tmp, dir)
    }

    fn confined_checks(dir: &Dir, tmp: &Path) {
        let n = OsStr::new;
        let b = dir.open_beneath(Path::new("a/b")).unwrap();
        let mut f = b.open_existing(n("file"), Access::Write).unwrap();
        f.write_all(b"y").unwrap();
        assert_eq!(std::fs::read_to_string(tmp.join("a/b/file")).unwrap(), "y");
        for name in ["abs", "rel", "missing", "..", ".", "", "x/y", "a\0b"] {
            assert!(b.open_existing(n(name), Access::Write).is_err(), "{name:?}");
        }
        assert_eq!(
            b.open_existing(n("missing"), Access::Read).unwrap_err(),
            Errno::ENOENT
        );
        for rel in ["evil/b", "a/../a/b", "../x", "a/b/rel", "/a/b", "a/./b"] {
            assert!(dir.open_beneath(Path::new(rel)).is_err(), "{rel:?}");
        }
        assert!(dir.open_beneath(Path::new("a//b/")).is_ok());
        assert_eq!(
            std::fs::read_to_string(tmp.join("secret")).unwrap(),
            "host file"
        );
        // The directory itself.
        assert!(dir.open_beneath(Path::new("")).is_ok());
    }

    #[test]
    fn confined_opens_never_leave_the_directory() {
        let (tmp, dir) = planted();
        confined_checks(&dir, tmp.path());
        assert_ne!(dir.fs_type().unwrap(), 0);
    }

    #[test]
    fn the_walk_without_openat2_is_as_strict() {
        let (tmp, dir) = planted();
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let c = |s: &'static str| -> Vec<&'static OsStr> { s.split('/').map(OsStr::new).collect() };
        assert!(dir.walk(&c("evil/b"), flags).is_err());
        assert!(dir.walk(&c("a/b/abs"), flags).is_err());
        assert!(dir.walk(&c("a/b/rel"), flags).is_err());
        assert!(dir.walk(&c("a/b/file"), flags).is_ok());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("secret")).unwrap(),
            "host file"
        );
    }

    #[test]
    fn walks_and_creates_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let root_path = tmp.path().join("root");
        std::fs::create_dir(&root_path).unwrap();
        let root = Dir::open(&root_path).unwrap();
        let n = OsStr::new;

        root.create_dir(n("d"), 0o755).unwrap();
        let d = root.open_dir(n("d")).unwrap();
        let mut f = d.create_file(n("f"), 0o600).unwrap();
        f.write_all(b"hi").unwrap();
        set_mode(f.as_fd(), 0o640).unwrap();
        set_mtime(f.as_fd(), 1_600_000_000).unwrap();
        drop(f);
        assert_eq!(d.create_file(n("f"), 0o600).unwrap_err(), Errno::EEXIST);
        let m = std::fs::metadata(root_path.join("d/f")).unwrap();
        assert_eq!((m.mode() & 0o7777, m.mtime()), (0o640, 1_600_000_000));

        root.symlink(n("esc"), outside.as_os_str()).unwrap();
        assert_eq!(root.kind(n("esc")).unwrap(), FileKind::Symlink);
        assert_eq!(root.kind(n("d")).unwrap(), FileKind::Directory);
        assert_eq!(root.open_dir(n("esc")).unwrap_err(), Errno::ENOTDIR);
        root.set_mtime_of(n("esc"), 1_500_000_000).unwrap();
        let m = std::fs::symlink_metadata(root_path.join("esc")).unwrap();
        assert_eq!(m.mtime(), 1_500_000_000);

        d.hard_link(n("g"), &d, n("f")).unwrap();
        assert_eq!(std::fs::metadata(root_path.join("d/f")).unwrap().nlink(), 2);
        d.make_node(n("p"), NodeKind::Fifo, 0o600, 0, 0).unwrap();
        d.set_mode_of(n("p"), 0o644).unwrap();
        let mut names: Vec<_> = d.entries().unwrap();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            names,
            [
                (OsString::from("f"), FileKind::Other),
                ("g".into(), FileKind::Other),
                ("p".into(), FileKind::Other)
            ]
        );
        for (name, _) in &names {
            d.remove_file(name).unwrap();
        }
        root.remove_dir(n("d")).unwrap();
        assert_eq!(root.kind(n("d")).unwrap_err(), Errno::ENOENT);
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
        sync_filesystem(root.reopen().unwrap().as_fd()).unwrap();
    }

    #[test]
    fn device_numbers_split() {
        let null = std::fs::metadata("/dev/null").unwrap().rdev();
        assert_eq!(device_numbers(null), (1, 3));
        assert_eq!(
            device_numbers(nix::sys::stat::makedev(136, 70000)),
            (136, 70000)
        );
    }

    #[test]
    fn user_xattrs_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x");
        let f = File::create(&p).unwrap();
        set_xattr(f.as_fd(), OsStr::new("user.crust"), b"y").unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(
            get_xattr(&p, OsStr::new("user.crust"), &mut buf).unwrap(),
            1
        );
        assert_eq!(buf[0], b'y');
    }

    #[test]
    fn write_no_follow_keeps_the_inode_and_refuses_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("hosts");
        write_no_follow(&p, b"one\n", 0o644).unwrap();
        let ino = std::fs::metadata(&p).unwrap().ino();
        write_no_follow(&p, b"2\n", 0o644).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.ino(), m.mode() & 0o777), (ino, 0o644));
        assert_eq!(std::fs::read(&p).unwrap(), b"2\n");
        let target = tmp.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write_no_follow(&link, b"x", 0o644).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
}
