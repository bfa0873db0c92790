//! A container's rootfs (an image's, so hostile) looked at and made ready
//! for the runtime's mounts before the container is created, never
//! following a symlink of it on the host.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use crate::Error;
use crate::fs::own;
use crate::retry::Retry;

/// Bound on retries of an openat2 answering EAGAIN (a mount or rename
/// somewhere on the system during the lookup).
const EAGAIN_RETRIES: u32 = 64;

fn io(op: &'static str, root: &Path, rel: &str) -> impl Fn(Errno) -> Error {
    let path = root.join(rel);
    move |e: Errno| Error::Io {
        op,
        path: path.clone(),
        source: e.into(),
    }
}

fn open_root(root: &Path) -> Result<OwnedFd, Error> {
    nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(own)
    .map_err(io("open rootfs", root, ""))
}

/// Slash-separated components of `rel`; None if one is `.` or `..`.
fn components(rel: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    (!parts.iter().any(|c| *c == "." || *c == "..")).then_some(parts)
}

/// The first component of `rel` inside `root` that is a symlink, as the
/// path up to it (`"dev"` for `dev/shm` when /dev is a link); None when
/// there is none. The walk stops (None) at a missing component or one that
/// is no directory: the runtime creates what is missing, inside the root.
/// Nothing is followed.
pub fn symlink_on_path(root: &Path, rel: &str) -> Result<Option<String>, Error> {
    let parts =
        components(rel).ok_or_else(|| Error::invalid("path in rootfs", "'.' or '..' component"))?;
    let mut dir = open_root(root)?;
    for (i, part) in parts.iter().enumerate() {
        let st = match nix::sys::stat::fstatat(
            Some(dir.as_raw_fd()),
            *part,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(io("stat in rootfs", root, rel)(e)),
        };
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFLNK => return Ok(Some(parts[..=i].join("/"))),
            SFlag::S_IFDIR => {}
            _ => return Ok(None),
        }
        dir = match nix::fcntl::openat(
            Some(dir.as_raw_fd()),
            *part,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => own(fd),
            // Replaced between the stat and the open: a link now.
            Err(Errno::ELOOP | Errno::ENOTDIR) => return Ok(Some(parts[..=i].join("/"))),
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(io("open in rootfs", root, rel)(e)),
        };
    }
    Ok(None)
}

/// Opens `rel` inside `root` as if `root` were `/` (openat2
/// RESOLVE_IN_ROOT: `..` and absolute links stop at the root, no magic
/// links, no other mount), as a runtime resolves a mount destination.
/// EAGAIN is retried, bounded. `Ok(None)` when it is missing or no dir.
fn open_dir_in_root(root_fd: &OwnedFd, rel: &str) -> Result<Option<OwnedFd>, Errno> {
    if rel.is_empty() {
        return nix::fcntl::openat(
            Some(root_fd.as_raw_fd()),
            ".",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(|fd| Some(own(fd)));
    }
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    // A freshly mounted overlay answers EAGAIN while mounts come and go
    // anywhere on the node: more attempts than the default.
    match Retry::TRANSIENT
        .attempts(EAGAIN_RETRIES)
        .run(|| nix::fcntl::openat2(root_fd.as_raw_fd(), rel, how))
    {
        Ok(fd) => Ok(Some(own(fd))),
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes sure the file `rel` of the rootfs at `root` is no symlink before a
/// file is bind-mounted on it: a link there is removed (in the container's
/// writable layer: the link and its target in the image stay as they are)
/// and an empty regular file with `mode` takes its place. Nothing is ever
/// followed to its target on the host: the parent dir is resolved inside
/// the root, as the runtime will resolve the mount's destination. True if
/// a link was replaced; a missing parent is left to the runtime (false).
pub fn replace_symlink_with_file(root: &Path, rel: &str, mode: u32) -> Result<bool, Error> {
    let parts =
        components(rel).ok_or_else(|| Error::invalid("path in rootfs", "'.' or '..' component"))?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(Error::invalid("path in rootfs", "empty"));
    };
    let root_fd = open_root(root)?;
    let Some(dir) = open_dir_in_root(&root_fd, &parents.join("/")).map_err(io(
        "resolve in rootfs",
        root,
        rel,
    ))?
    else {
        return Ok(false);
    };
    let st =
        match nix::sys::stat::fstatat(Some(dir.as_raw_fd()), *name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(io("stat in rootfs", root, rel)(e)),
        };
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFLNK {
        return Ok(false);
    }
    nix::unistd::unlinkat(Some(dir.as_raw_fd()), *name, UnlinkatFlags::NoRemoveDir).map_err(io(
        "remove symlink in rootfs",
        root,
        rel,
    ))?;
    let fd = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        *name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(io("create in rootfs", root, rel))?;
    drop(own(fd));
    Ok(true)
}

/// Makes the directory `path` (absolute, as [`resolve_path`] answers it:
/// no symlink on its existing part) and its missing parents in the rootfs
/// at `root`, each with `mode`, as runc and CRI-O make a working dir the
/// image lacks. Every component is opened beneath the one before with
/// O_NOFOLLOW: a symlink or a non-directory on the way is ENOTDIR (or
/// ELOOP), never followed. True if something was made.
pub fn make_dirs(root: &Path, path: &str, mode: u32) -> Result<bool, Error> {
    let rel = path.trim_start_matches('/');
    let parts =
        components(rel).ok_or_else(|| Error::invalid("path in rootfs", "'.' or '..' component"))?;
    let err = io("make dir in rootfs", root, rel);
    let mut dir = open_root(root)?;
    let mut made = false;
    for part in parts {
        let open = |dir: &OwnedFd| {
            nix::fcntl::openat(
                Some(dir.as_raw_fd()),
                part,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map(own)
        };
        dir = match open(&dir) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match nix::sys::stat::mkdirat(
                    Some(dir.as_raw_fd()),
                    part,
                    Mode::from_bits_truncate(mode),
                ) {
                    Ok(()) => made = true,
                    // Made meanwhile by someone else: open what is there.
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(err(e)),
                }
                open(&dir).map_err(&err)?
            }
            Err(e) => return Err(err(e)),
        };
    }
    Ok(made)
}

/// Most symlinks followed in one [`resolve_path`] (the kernel's own
/// bound, MAXSYMLINKS).
const MAX_LINKS: usize = 40;

/// The path the absolute `path` names inside the rootfs at `root` once the
/// image's symlinks on it are resolved as the container will see them
/// (absolute links and `..` stop at the root), without mounts: e.g.
/// `/proc/self/fd/7` for a working dir `/w` when the image links `/w` to
/// it. Components from the first missing one on are taken as written (the
/// runtime creates them). Every link is read with readlinkat, none is
/// followed by the kernel; more than 40 is ELOOP.
pub fn resolve_path(root: &Path, path: &str) -> Result<String, Error> {
    use std::collections::VecDeque;
    let root_fd = open_root(root)?;
    let err = io("resolve in rootfs", root, path.trim_start_matches('/'));
    let mut todo: VecDeque<String> = path.split('/').map(str::to_string).collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut links = 0;
    // The dir `resolved` names (a real dir: every part of it was one).
    let open_resolved = |resolved: &[String]| -> Result<OwnedFd, Errno> {
        let mut fd = nix::fcntl::openat(
            Some(root_fd.as_raw_fd()),
            ".",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(own)?;
        for part in resolved {
            fd = nix::fcntl::openat(
                Some(fd.as_raw_fd()),
                part.as_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map(own)?;
        }
        Ok(fd)
    };
    let mut missing = false;
    while let Some(part) = todo.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        if missing {
            resolved.push(part);
            continue;
        }
        let dir = match open_resolved(&resolved) {
            Ok(d) => d,
            Err(Errno::ENOENT | Errno::ENOTDIR) => {
                missing = true;
                resolved.push(part);
                continue;
            }
            Err(e) => return Err(err(e)),
        };
        let st = match nix::sys::stat::fstatat(
            Some(dir.as_raw_fd()),
            part.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::ENOENT | Errno::ENOTDIR) => {
                missing = true;
                resolved.push(part);
                continue;
            }
            Err(e) => return Err(err(e)),
        };
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFLNK {
            resolved.push(part);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(err(Errno::ELOOP));
        }
        let target = nix::fcntl::readlinkat(Some(dir.as_raw_fd()), part.as_str()).map_err(&err)?;
        let target = target.to_string_lossy();
        if target.starts_with('/') {
            resolved.clear();
        }
        for t in target.split('/').rev() {
            todo.push_front(t.to_string());
        }
    }
    Ok(format!("/{}", resolved.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn makes_missing_dirs_inside_the_root_and_follows_no_link() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("usr")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, root.join("link")).unwrap();
        std::fs::write(root.join("file"), b"").unwrap();

        assert!(make_dirs(&root, "/usr/src/app", 0o755).unwrap());
        let made = std::fs::metadata(root.join("usr/src/app")).unwrap();
        assert!(made.is_dir());
        // 0755 less the process's umask.
        assert_eq!(made.permissions().mode() & 0o700, 0o700);
        // Already there: nothing made.
        assert!(!make_dirs(&root, "/usr/src/app", 0o755).unwrap());
        assert!(!make_dirs(&root, "/", 0o755).unwrap());
        // A link or a file on the way is an error, and nothing appears
        // where the link points.
        assert!(make_dirs(&root, "/link/x", 0o755).is_err());
        assert!(!outside.join("x").exists());
        assert!(make_dirs(&root, "/file/x", 0o755).is_err());
        assert!(make_dirs(&root, "/usr/../x", 0o755).is_err());
    }

    #[test]
    fn finds_the_first_symlink_without_following_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("dev")).unwrap();
        std::fs::create_dir_all(root.join("real")).unwrap();
        symlink("/etc", root.join("proc")).unwrap();
        symlink("real", root.join("sys")).unwrap();
        symlink("/nowhere", root.join("dev/shm")).unwrap();
        std::fs::write(root.join("file"), b"").unwrap();
        assert_eq!(
            symlink_on_path(&root, "proc").unwrap().as_deref(),
            Some("proc")
        );
        assert_eq!(
            symlink_on_path(&root, "/sys/x").unwrap().as_deref(),
            Some("sys")
        );
        assert_eq!(
            symlink_on_path(&root, "dev/shm").unwrap().as_deref(),
            Some("dev/shm")
        );
        assert_eq!(symlink_on_path(&root, "dev").unwrap(), None);
        assert_eq!(symlink_on_path(&root, "missing/x").unwrap(), None);
        assert_eq!(symlink_on_path(&root, "file/x").unwrap(), None);
        assert!(symlink_on_path(&root, "dev/../proc").is_err());
    }

    #[test]
    fn resolves_paths_as_the_container_sees_them() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("srv/app")).unwrap();
        std::fs::create_dir_all(root.join("proc")).unwrap();
        symlink("/proc/self/fd/7", root.join("w")).unwrap();
        symlink("../../../../proc/1/cwd", root.join("srv/up")).unwrap();
        symlink("app", root.join("srv/rel")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        std::fs::write(root.join("file"), b"").unwrap();
        for (path, want) in [
            ("/w", "/proc/self/fd/7"),
            ("/w/x/..", "/proc/self/fd/7"),
            ("/srv/up", "/proc/1/cwd"),
            ("/srv/rel/x", "/srv/app/x"),
            ("/srv/./app/../rel", "/srv/app"),
            ("/missing/../srv", "/srv"),
            ("/file/x", "/file/x"),
            ("/", "/"),
            ("/../..", "/"),
        ] {
            assert_eq!(resolve_path(&root, path).unwrap(), want, "{path}");
        }
        assert!(resolve_path(&root, "/loop").is_err());
    }

    #[test]
    fn replaces_links_in_place_and_never_follows_them() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, b"host\n").unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("usr/etc")).unwrap();
        std::fs::write(root.join("etc/hosts.real"), b"image\n").unwrap();
        symlink("hosts.real", root.join("etc/hosts")).unwrap();
        symlink(&outside, root.join("etc/resolv.conf")).unwrap();
        symlink("../../../../../outside", root.join("usr/etc/hostname")).unwrap();
        std::fs::write(root.join("etc/plain"), b"plain\n").unwrap();
        // A parent that is a link is resolved inside the root.
        symlink("/usr/etc", root.join("etc2")).unwrap();

        for rel in ["etc/hosts", "etc/resolv.conf", "etc2/hostname"] {
            assert!(
                replace_symlink_with_file(&root, rel, 0o644).unwrap(),
                "{rel}"
            );
        }
        for rel in ["etc/hosts", "etc/resolv.conf", "usr/etc/hostname"] {
            let meta = std::fs::symlink_metadata(root.join(rel)).unwrap();
            assert!(meta.is_file() && meta.len() == 0, "{rel}: {meta:?}");
        }
        assert!(!replace_symlink_with_file(&root, "etc/plain", 0o644).unwrap());
        assert!(!replace_symlink_with_file(&root, "etc/missing", 0o644).unwrap());
        assert!(!replace_symlink_with_file(&root, "nodir/hosts", 0o644).unwrap());
        assert_eq!(std::fs::read(root.join("etc/plain")).unwrap(), b"plain\n");
        assert_eq!(
            std::fs::read(root.join("etc/hosts.real")).unwrap(),
            b"image\n"
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"host\n");
        assert!(replace_symlink_with_file(&root, "etc/../x", 0o644).is_err());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// Entries of a hostile image: dirs, files and links pointing up,
        /// out (absolute host paths of the test's own "outside" dir),
        /// into the image, in loops.
        fn entries() -> impl Strategy<Value = Vec<(String, u8, String)>> {
            let name = prop_oneof![
                Just("etc"),
                Just("etc/hosts"),
                Just("etc/resolv.conf"),
                Just("proc"),
                Just("dev"),
                Just("dev/shm"),
                Just("a"),
                Just("a/b"),
            ]
            .prop_map(str::to_string);
            let target = prop_oneof![
                Just("OUT"),
                Just("OUT/file"),
                Just("../../../../OUTREL/file"),
                Just("/a"),
                Just("a/b"),
                Just("hosts"),
                Just("."),
                Just(".."),
                Just("/proc/self/fd/0"),
            ]
            .prop_map(str::to_string);
            proptest::collection::vec((name, 0u8..3, target), 0..10)
        }

        /// Whether every parent of `name` under `root` is a real dir
        /// and `name` itself does not exist yet.
        fn real_dirs_up_to(root: &Path, name: &str) -> bool {
            let mut p = root.to_path_buf();
            let parts: Vec<&str> = name.split('/').collect();
            for (i, part) in parts.iter().enumerate() {
                p.push(part);
                let meta = std::fs::symlink_metadata(&p);
                if i + 1 == parts.len() {
                    return meta.is_err();
                }
                if !meta.is_ok_and(|m| m.file_type().is_dir()) {
                    return false;
                }
            }
            false
        }

        fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
            let mut out = Vec::new();
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let data = std::fs::read(e.path()).unwrap_or_default();
                out.push((e.path(), data));
            }
            out.sort();
            out
        }

        use std::path::PathBuf;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            /// Whatever the image holds, nothing outside its root changes
            /// and a replaced link is an empty regular file.
            #[test]
            fn links_are_never_followed_out(tree in entries(), rel in prop_oneof![
                Just("etc/hosts"), Just("etc/resolv.conf"), Just("a/b"), Just("dev/shm"),
            ]) {
                let t = tempfile::tempdir().unwrap();
                let outside = t.path().join("outside");
                std::fs::create_dir(&outside).unwrap();
                std::fs::write(outside.join("file"), b"host\n").unwrap();
                let root = t.path().join("root");
                std::fs::create_dir(&root).unwrap();
                for (name, kind, target) in &tree {
                    // The fixture itself never goes through a link (nor
                    // writes over one): only into real dirs of the root.
                    if !real_dirs_up_to(&root, name) {
                        continue;
                    }
                    let p = root.join(name);
                    let target = target
                        .replace("OUTREL", "outside")
                        .replace("OUT", &outside.display().to_string());
                    let _ = match kind {
                        0 => std::fs::create_dir(&p),
                        1 => std::fs::write(&p, b"image\n"),
                        _ => symlink(&target, &p),
                    };
                }
                let before = snapshot(&outside);
                let _ = symlink_on_path(&root, rel);
                let replaced = replace_symlink_with_file(&root, rel, 0o644);
                prop_assert_eq!(snapshot(&outside), before);
                if let Ok(true) = replaced {
                    // Resolved inside the root, it is a new empty file.
                    let fd = open_root(&root).unwrap();
                    let (parent, name) = rel.rsplit_once('/').unwrap();
                    let dir = open_dir_in_root(&fd, parent).unwrap().unwrap();
                    let st = nix::sys::stat::fstatat(
                        Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW,
                    ).unwrap();
                    prop_assert_eq!(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT, SFlag::S_IFREG);
                    prop_assert_eq!(st.st_size, 0);
                }
            }
        }
    }
}
