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

/// Creates `dir` (and parents, with `mode`) and makes sure it is a real
/// directory, not a symlink someone planted. `what` names it in errors.
pub(crate) fn ensure_real_dir(dir: &Path, mode: u32, what: &'static str) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(Error::io(what, dir))?;
    let meta = std::fs::symlink_metadata(dir).map_err(Error::io(what, dir))?;
    if !meta.file_type().is_dir() {
        return Err(Error::Io {
            op: what,
            path: dir.to_path_buf(),
            source: std::io::Error::other("not a directory (symlink?)"),
        });
    }
    Ok(())
}

/// Mounts a tmpfs for the pod's shared `/dev/shm` at `path` (created if
/// missing, must not be a symlink). Containers of a pod with its own IPC
/// namespace bind-mount it, so POSIX shared memory is shared like SysV IPC.
pub fn mount_shm(path: &Path, size_bytes: u64) -> Result<(), Error> {
    if size_bytes == 0 {
        return Err(Error::invalid("shm size", "must be positive"));
    }
    ensure_real_dir(path, 0o700, "shm dir")?;
    let data = format!("mode=1777,size={size_bytes}");
    crate::retry::transient(|| {
        nix::mount::mount(
            Some("shm"),
            path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some(data.as_str()),
        )
    })
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
    unmount_all(path)?;
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

/// Mounts an overlayfs at `target`: `lowers` bottom first (an image's layer
/// dirs as the image service lists them), `upper` and `work` the
/// container's writable layer.
///
/// The mount option string is limited to one page. With absolute
/// `<root>/layers/<64 hex>/diff` paths only ~40 layers would fit, so when
/// every lower dir shares one parent dir the mount is made from a dedicated
/// thread that has its own working directory (`unshare(CLONE_FS)`) inside
/// that dir, and the lower dirs are passed relative to it.
pub fn mount_overlay(
    lowers: &[std::path::PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<(), Error> {
    overlay(lowers, Some((upper, work)), target)
}

/// Mounts a read-only overlay of `lowers` (bottom first) at `target`: an
/// image as an image volume, so also nosuid and nodev (an image's setuid
/// binaries and device nodes stay inert; not noexec, which KEP-4639
/// dropped: image volumes carry tools to run). Overlayfs wants two lower dirs when there is
/// no upper dir, so a one-layer image gets `empty` (an empty dir) under it.
pub fn mount_overlay_readonly(
    lowers: &[std::path::PathBuf],
    empty: &Path,
    target: &Path,
) -> Result<(), Error> {
    let mut all = lowers.to_vec();
    if all.len() == 1 {
        all.insert(0, empty.to_path_buf());
    }
    overlay(&all, None, target)
}

fn overlay(
    lowers: &[std::path::PathBuf],
    upper_work: Option<(&Path, &Path)>,
    target: &Path,
) -> Result<(), Error> {
    let (upper, work) = upper_work.unzip();
    if lowers.is_empty() {
        return Err(Error::invalid("overlay lower dirs", "none given"));
    }
    for p in lowers
        .iter()
        .map(|p| p.as_path())
        .chain(upper)
        .chain(work)
        .chain([target])
    {
        let s = p.as_os_str().as_encoded_bytes();
        if !p.is_absolute() || s.iter().any(|b| matches!(b, b',' | b':' | b'\0')) {
            return Err(Error::invalid(
                "overlay dir",
                format!("{} must be absolute without ',' or ':'", p.display()),
            ));
        }
    }
    // The common base: the parent of each layer's own dir
    // (`<base>/<hex>/diff`), when they all share it.
    let base = lowers[0]
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let relative: Option<Vec<String>> = base.as_ref().and_then(|b| {
        lowers
            .iter()
            .rev()
            .map(|l| {
                l.strip_prefix(b)
                    .ok()
                    .map(|r| r.to_string_lossy().into_owned())
            })
            .collect()
    });
    let target = target.to_path_buf();
    let (flags, rw) = match (upper, work) {
        (Some(u), Some(w)) => (
            MsFlags::empty(),
            format!(",upperdir={},workdir={}", u.display(), w.display()),
        ),
        _ => (
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            String::new(),
        ),
    };
    let do_mount = move |lowerdir: String, cwd: Option<std::path::PathBuf>| -> Result<(), Error> {
        if let Some(dir) = &cwd {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).map_err(|e| Error::Io {
                op: "unshare(CLONE_FS) for",
                path: dir.clone(),
                source: e.into(),
            })?;
            nix::unistd::chdir(dir.as_path()).map_err(|e| Error::Io {
                op: "chdir into",
                path: dir.clone(),
                source: e.into(),
            })?;
        }
        let data = format!("lowerdir={lowerdir}{rw}");
        if data.len() >= 4096 {
            return Err(Error::invalid(
                "overlay lower dirs",
                format!(
                    "too many layers for one mount ({} bytes of options)",
                    data.len()
                ),
            ));
        }
        crate::retry::transient(|| {
            nix::mount::mount(
                Some("overlay"),
                &target,
                Some("overlay"),
                flags,
                Some(data.as_str()),
            )
        })
        .map_err(|e| Error::Io {
            op: "mount overlay on",
            path: target.clone(),
            source: e.into(),
        })
    };
    match (relative, base) {
        (Some(rel), Some(base)) => {
            let lowerdir = rel.join(":");
            // A thread of its own: its working directory is private after
            // unshare(CLONE_FS) and dies with it.
            std::thread::scope(|s| {
                s.spawn(move || do_mount(lowerdir, Some(base)))
                    .join()
                    .unwrap_or_else(|_| Err(Error::invalid("overlay mount", "thread panicked")))
            })
        }
        _ => {
            let lowerdir: Vec<String> = lowers
                .iter()
                .rev()
                .map(|l| l.display().to_string())
                .collect();
            do_mount(lowerdir.join(":"), None)
        }
    }
}

/// Unmounts `path` (lazily, without following a symlink) if something is
/// mounted there. Idempotent.
pub fn unmount(path: &Path) -> Result<(), Error> {
    unmount_all(path)
}

/// Unmounts every mount stacked on `path` (lazily) without following a
/// symlink there. Not mounted or missing counts as done.
pub(crate) fn unmount_all(path: &Path) -> Result<(), Error> {
    // Bounded: a pin or a pod's /dev/shm is mounted once; more means
    // someone stacked mounts.
    for _ in 0..16 {
        // Lazy: never EBUSY; EINTR/EAGAIN retried, bounded.
        let detach = || nix::mount::umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
        match crate::retry::transient(detach) {
            Ok(()) => continue,
            Err(Errno::EINVAL | Errno::ENOENT) => return Ok(()),
            Err(e) => {
                return Err(Error::Io {
                    op: "unmount",
                    path: path.to_path_buf(),
                    source: e.into(),
                });
            }
        }
    }
    Err(Error::Io {
        op: "unmount",
        path: path.to_path_buf(),
        source: std::io::Error::other("still mounted after 16 unmounts"),
    })
}

/// Reads the regular file `rel` (e.g. `etc/passwd`) inside `root` without
/// following any symlink on the way (a hostile image cannot point it at a
/// host file), at most `max` bytes. `Ok(None)` when it is missing, a
/// symlink or not a regular file.
pub fn read_file_in_root(root: &Path, rel: &str, max: u64) -> Result<Option<Vec<u8>>, Error> {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::Mode;
    use std::io::Read;
    let open_err = |e: Errno| Error::Io {
        op: "open in rootfs",
        path: root.join(rel),
        source: e.into(),
    };
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a fresh fd from open(2)/openat(2), owned by nothing else.
    let own = |fd: i32| unsafe { OwnedFd::from_raw_fd(fd) };
    let mut dir: OwnedFd = match nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => own(fd),
        Err(e) => return Err(open_err(e)),
    };
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        if *part == ".." || *part == "." {
            return Ok(None);
        }
        let last = i + 1 == parts.len();
        let flags = OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC
            | if last {
                OFlag::O_RDONLY | OFlag::O_NONBLOCK
            } else {
                OFlag::O_PATH | OFlag::O_DIRECTORY
            };
        match openat(Some(dir.as_raw_fd()), *part, flags, Mode::empty()) {
            Ok(fd) => dir = own(fd),
            Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(open_err(e)),
        }
    }
    let f = std::fs::File::from(dir);
    let meta = f
        .metadata()
        .map_err(Error::io("stat in rootfs", &root.join(rel)))?;
    if !meta.is_file() {
        return Ok(None);
    }
    let mut buf = Vec::new();
    f.take(max)
        .read_to_end(&mut buf)
        .map_err(Error::io("read in rootfs", &root.join(rel)))?;
    Ok(Some(buf))
}

/// Resolves `rel` inside `root` as if `root` were `/` (openat2
/// RESOLVE_IN_ROOT: `..` and absolute symlinks stop at `root`, no magic
/// links, no crossing into another mount) and returns the host path of
/// what it names, which therefore lies inside `root`. For an image volume's
/// `image_sub_path` in the image's read-only mount.
pub fn resolve_in_root(root: &Path, rel: &str) -> Result<std::path::PathBuf, Error> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
    use nix::sys::stat::Mode;
    use std::os::fd::{FromRawFd, OwnedFd};
    let err = |op: &'static str, e: Errno| Error::Io {
        op,
        path: root.join(rel),
        source: e.into(),
    };
    let dir = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err("open", e))?;
    // SAFETY: a fresh fd from open(2), owned by nothing else.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let path = if rel.is_empty() { "." } else { rel };
    // EAGAIN: a mount or rename somewhere on the system while the lookup
    // went through `..`; the kernel asks to try again. Still racing after
    // the retries (or no openat2): the same walk in user space, which no
    // rename or mount can disturb.
    let fd =
        match crate::retry::transient(|| openat2(std::os::fd::AsRawFd::as_raw_fd(&dir), path, how))
        {
            // SAFETY: a fresh fd from openat2(2), owned by nothing else.
            Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(Errno::EAGAIN | Errno::ENOSYS) => walk_in_root(&dir, rel),
            Err(e) => Err(e),
        }
        .map_err(|e| match e {
            // What the path names is missing or not reachable without leaving
            // the root's mount: the caller's path is at fault.
            Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV => {
                Error::invalid("path in root", format!("{}: {}", quoted(rel), e.desc()))
            }
            e => err("resolve in root", e),
        })?;
    let real = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))
    .map_err(Error::io("read the resolved path of", &root.join(rel)))?;
    let root_real = std::fs::canonicalize(root).map_err(Error::io("resolve", root))?;
    if !real.starts_with(&root_real) {
        return Err(Error::invalid(
            "path in root",
            format!("{} resolves outside the root", quoted(rel)),
        ));
    }
    Ok(real)
}

/// [`resolve_in_root`]'s lookup in user space (openat2 `RESOLVE_IN_ROOT |
/// RESOLVE_NO_XDEV` semantics): one `O_PATH | O_NOFOLLOW` open per
/// component, holding every directory on the way, so that `..` goes back
/// to the one held (stopping at the root) instead of asking the kernel for
/// a parent a concurrent rename may have moved; symlinks are read and
/// walked in their place (absolute ones from the root), at most 40; every
/// step stays on the root's file system. Errors as openat2's.
fn walk_in_root(root: &std::os::fd::OwnedFd, rel: &str) -> Result<std::os::fd::OwnedFd, Errno> {
    use nix::fcntl::{OFlag, openat, readlinkat};
    use nix::sys::stat::{Mode, SFlag, fstat};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    const MAX_LINKS: usize = 40;
    let open = |dir: &OwnedFd, name: &[u8]| -> Result<OwnedFd, Errno> {
        let fd = openat(
            Some(dir.as_raw_fd()),
            std::ffi::OsStr::from_bytes(name),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: a fresh fd from openat(2), owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let root_dev = fstat(root.as_raw_fd())?.st_dev;
    // The directories below the root down to the current one.
    let mut held: Vec<OwnedFd> = Vec::new();
    // Components still to walk, the next one last.
    let mut todo: Vec<Vec<u8>> = rel
        .as_bytes()
        .rsplit(|b| *b == b'/')
        .map(<[u8]>::to_vec)
        .collect();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        match name.as_slice() {
            b"" | b"." => continue,
            b".." => {
                held.pop();
                continue;
            }
            _ => {}
        }
        let fd = open(held.last().unwrap_or(root), &name)?;
        let st = fstat(fd.as_raw_fd())?;
        if st.st_dev != root_dev {
            return Err(Errno::EXDEV);
        }
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => held.push(fd),
            SFlag::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(Errno::ELOOP);
                }
                let target = readlinkat(Some(fd.as_raw_fd()), "")?;
                let target = target.as_bytes();
                if target.starts_with(b"/") {
                    held.clear();
                }
                todo.extend(target.rsplit(|b| *b == b'/').map(<[u8]>::to_vec));
            }
            // A file names nothing below it, not even `.` or `..`.
            _ if todo.is_empty() => return Ok(fd),
            _ => return Err(Errno::ENOTDIR),
        }
    }
    match held.pop() {
        Some(fd) => Ok(fd),
        None => open(root, b"."),
    }
}

/// Bind-mounts `source` at `target` (an existing dir) id-mapped through the
/// user namespace at `userns` (open_tree(OPEN_TREE_CLONE) +
/// mount_setattr(MOUNT_ATTR_IDMAP) + move_mount): a file owned by ID `n`
/// appears owned by the host ID that the namespace maps `n` to, so an
/// image's root-owned files belong to the namespace's root and nothing is
/// chowned. Needs kernel >= 5.12 and a filesystem that
/// supports id-mapped mounts (ext4, xfs, btrfs, tmpfs >= 6.3, ...).
pub fn mount_idmapped(source: &Path, target: &Path, userns: &Path) -> Result<(), Error> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    /// `struct mount_attr` (MOUNT_ATTR_SIZE_VER0).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| Error::invalid("mount path", "contains NUL"))
    };
    let (src, dst) = (cstr(source)?, cstr(target)?);
    let ns = std::fs::File::open(userns).map_err(Error::io("open user namespace", userns))?;
    let io = |op: &'static str, path: &Path| {
        let source = std::io::Error::last_os_error();
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    // SAFETY: a valid C string; the kernel returns a new fd or -1.
    let tree = retried_syscall(|| unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    });
    if tree < 0 {
        return Err(io("open_tree", source));
    }
    // SAFETY: a fresh fd owned by nothing else.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: ns.as_raw_fd() as u64,
    };
    // SAFETY: valid fd, empty C string, a properly sized mount_attr.
    let rc = retried_syscall(|| unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    });
    if rc < 0 {
        return Err(io("mount_setattr(MOUNT_ATTR_IDMAP)", source));
    }
    // SAFETY: valid fds and C strings.
    let rc = retried_syscall(|| unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    });
    if rc < 0 {
        return Err(io("move_mount", target));
    }
    Ok(())
}

/// A raw syscall (`-1` and errno on failure) retried on EAGAIN/EINTR;
/// errno still holds the last failure's when it returns `-1`.
fn retried_syscall(mut call: impl FnMut() -> libc::c_long) -> libc::c_long {
    let r = crate::retry::transient(|| match call() {
        rc if rc < 0 => Err(Errno::last()),
        rc => Ok(rc),
    });
    match r {
        Ok(rc) => rc,
        Err(e) => {
            Errno::set_raw(e as i32);
            -1
        }
    }
}

/// `s` quoted for an error message, at most 256 bytes of it.
fn quoted(s: &str) -> String {
    let mut end = s.len().min(256);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let tail = if end < s.len() { "..." } else { "" };
    format!("{:?}{tail}", &s[..end])
}

/// Bytes and inodes used under `dir` (not crossing into other
/// filesystems), for a container's writable layer.
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let dev = top.dev();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = std::collections::HashSet::new();
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            inodes += 1;
            if m.nlink() > 1 && !seen.insert(m.ino()) {
                continue;
            }
            bytes += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// Size and free space of the file system holding `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsCapacity {
    pub bytes_total: u64,
    pub bytes_available: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
}

/// statvfs(2) of `path`'s file system (container_fs_limit_bytes and the
/// inode metrics of writable layers).
pub fn filesystem_capacity(path: &Path) -> Result<FsCapacity, Error> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| Error::Io {
        op: "statvfs",
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let frsize = st.fragment_size() as u64;
    Ok(FsCapacity {
        bytes_total: (st.blocks() as u64).saturating_mul(frsize),
        bytes_available: (st.blocks_available() as u64).saturating_mul(frsize),
        inodes_total: st.files() as u64,
        inodes_free: st.files_free() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_in_root_stays_inside() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(t.path().join("outside")).unwrap();
        std::os::unix::fs::symlink("/a/b", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../outside", root.join("a/up")).unwrap();
        std::os::unix::fs::symlink("/", root.join("slash")).unwrap();
        let real = std::fs::canonicalize(&root).unwrap();
        assert_eq!(resolve_in_root(&root, "a/b").unwrap(), real.join("a/b"));
        assert_eq!(resolve_in_root(&root, "").unwrap(), real);
        // An absolute symlink is read relative to the root.
        assert_eq!(resolve_in_root(&root, "abs").unwrap(), real.join("a/b"));
        assert_eq!(resolve_in_root(&root, "slash").unwrap(), real);
        // `..` stops at the root: "outside" is looked up inside it.
        let e = resolve_in_root(&root, "a/up").unwrap_err();
        assert!(e.is_invalid_argument(), "{e}");
        let e = resolve_in_root(&root, "../outside").unwrap_err();
        assert!(e.is_invalid_argument(), "{e}");
        assert_eq!(resolve_in_root(&root, "a/../../..").unwrap(), real);
        let e = resolve_in_root(&root, "missing").unwrap_err();
        assert!(e.to_string().contains("\"missing\""), "{e}");
    }

    /// The user-space walk answers as openat2 does, case by case.
    #[test]
    fn the_walk_in_root_agrees_with_openat2() {
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
        use nix::sys::stat::Mode;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/file"), b"x").unwrap();
        std::fs::create_dir_all(t.path().join("outside")).unwrap();
        let link =
            |target: &str, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
        link("/a/b", "abs");
        link("../../../outside", "a/up");
        link("/", "slash");
        link("loop2", "loop1");
        link("loop1", "loop2");
        link("a/file", "tofile");
        link("/proc/self", "proc");
        // A chain that climbs before each next link.
        for i in 0..8 {
            link(&format!("{}c{}", "../".repeat(5), i + 1), &format!("c{i}"));
        }
        link("a/b", "c8");
        let at_root = |p: &std::path::Path| {
            let fd = open(
                p,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            // SAFETY: a fresh fd from open(2).
            unsafe { OwnedFd::from_raw_fd(fd) }
        };
        let dir = at_root(&root);
        let real =
            |fd: &OwnedFd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_IN_ROOT
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        for rel in [
            "",
            ".",
            "a",
            "a/b",
            "a/b/",
            "abs",
            "abs/..",
            "a/up",
            "../outside",
            "a/../../..",
            "slash",
            "slash/a/b",
            "missing",
            "a/missing/x",
            "loop1",
            "tofile",
            "tofile/",
            "tofile/..",
            "a/file/x",
            "c0",
            "c3",
            "proc",
            "/a/b",
            "//a//b//",
        ] {
            let kernel = openat2(dir.as_raw_fd(), if rel.is_empty() { "." } else { rel }, how)
                // SAFETY: a fresh fd from openat2(2).
                .map(|fd| real(&unsafe { OwnedFd::from_raw_fd(fd) }));
            let walked = walk_in_root(&dir, rel).map(|fd| real(&fd));
            assert_eq!(walked, kernel, "{rel:?}");
        }
    }
}
