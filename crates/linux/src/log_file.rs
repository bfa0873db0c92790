//! Containers' CRI log files, below a pod's log directory that others can
//! write (kubelet, and log shippers given a writable hostPath of
//! `/var/log/pods`). Whoever plants a symlink there (the log file, the
//! pod's log directory or a directory between them) must not get root's
//! appends to a host file, so [`open_log_file`] walks from the parent of
//! the pod's log directory (the node's: followed as it is) one component at
//! a time, never following a symlink, and accepts only a regular file with
//! no other hard links at the end.
//!
//! No openat2 here: the walk creates missing directories as it goes, and
//! plain `openat` does not answer `EAGAIN` on a busy node.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;

use crate::fs::{Dir, FileKind};

/// Modes of what [`open_log_file`] creates (the umask applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogModes {
    pub dir: u32,
    pub file: u32,
}

impl Default for LogModes {
    /// Readable by log collectors running as other users, as kubelet's
    /// own directories are; the log file only for the owner's group.
    fn default() -> Self {
        LogModes {
            dir: 0o755,
            file: 0o640,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogFileError {
    /// The path is unusable as given (relative, `..`, empty).
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: &'static str },
    /// Something in the pod's log directory is in the way: a symlink, a
    /// non-directory on the way, or a log file that is not a plain regular
    /// file. Whoever writes that directory did it, not the host.
    #[error("{path}: {why}")]
    Refused { path: PathBuf, why: &'static str },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Errno,
    },
}

impl LogFileError {
    /// Whether the log path, not the host, is at fault.
    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            LogFileError::Refused { .. } | LogFileError::Invalid { .. }
        )
    }
}

/// Opens the log file `rel` (relative, e.g. `<container>/<attempt>.log`)
/// below the pod's log directory `directory` (absolute) for appending,
/// creating it and missing directories on the way. The parent of
/// `directory` is created if missing and followed as it is (the node's);
/// `directory` itself and everything below are never followed if
/// symlinks, and the file must be a regular file with one link.
pub fn open_log_file(directory: &Path, rel: &Path, modes: LogModes) -> Result<File, LogFileError> {
    let invalid = |path: &Path, why| LogFileError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    if !directory.is_absolute() || !plain(directory) {
        return Err(invalid(
            directory,
            "is not an absolute path without '.' or '..'",
        ));
    }
    // `/` as the pod's log directory: the node's root is the anchor.
    let (parent, top) = match (directory.parent(), directory.file_name()) {
        (Some(parent), Some(top)) => (parent, Some(top)),
        _ => (directory, None),
    };
    if rel.is_absolute() || !plain(rel) {
        return Err(invalid(rel, "is not a relative path without '.' or '..'"));
    }
    let Some(name) = rel.file_name() else {
        return Err(invalid(rel, "has no file name"));
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(modes.dir)
        .create(parent)
        .map_err(|e| LogFileError::Io {
            op: "creating",
            path: parent.to_path_buf(),
            source: e.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
        })?;
    let mut dir = Dir::open_following(parent).map_err(|source| LogFileError::Io {
        op: "opening",
        path: parent.to_path_buf(),
        source,
    })?;
    let mut at = directory.to_path_buf();
    if let Some(top) = top {
        dir = step(&dir, top, &at, modes.dir)?;
    }
    for c in rel.parent().into_iter().flat_map(Path::components) {
        let c = c.as_os_str();
        at.push(c);
        dir = step(&dir, c, &at, modes.dir)?;
    }
    at.push(name);
    open_file(&dir, name, &at, modes.file)
}

/// Only normal components (a root is allowed; `.` and `..` are not).
fn plain(p: &Path) -> bool {
    p.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::RootDir))
}

/// Opens (creating if missing) the directory `name` in `dir`, never
/// through a symlink.
fn step(dir: &Dir, name: &OsStr, at: &Path, mode: u32) -> Result<Dir, LogFileError> {
    let refused = |why| LogFileError::Refused {
        path: at.to_path_buf(),
        why,
    };
    let io = |op, source| LogFileError::Io {
        op,
        path: at.to_path_buf(),
        source,
    };
    match dir.open_dir(name) {
        Ok(d) => return Ok(d),
        Err(Errno::ENOENT) => {}
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            return Err(refused("is a symlink or not a directory"));
        }
        Err(e) => return Err(io("opening", e)),
    }
    match dir.create_dir(name, mode) {
        // Made by someone else meanwhile: opened (and checked) below.
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(io("creating", e)),
    }
    dir.open_dir(name).map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => refused("is a symlink or not a directory"),
        e => io("opening", e),
    })
}

fn open_file(dir: &Dir, name: &OsStr, at: &Path, mode: u32) -> Result<File, LogFileError> {
    let refused = |why| LogFileError::Refused {
        path: at.to_path_buf(),
        why,
    };
    // Looked at first so that a device or FIFO planted there is not even
    // opened; the open below is as strict about symlinks if it is swapped.
    match dir.kind(name) {
        Ok(FileKind::Symlink) => return Err(refused("is a symlink")),
        Ok(FileKind::Directory) => return Err(refused("is a directory")),
        Ok(FileKind::Other) | Err(Errno::ENOENT) => {}
        Err(source) => {
            return Err(LogFileError::Io {
                op: "inspecting",
                path: at.to_path_buf(),
                source,
            });
        }
    }
    let file = dir.open_append(name, mode).map_err(|e| match e {
        Errno::ELOOP => refused("is a symlink"),
        Errno::EISDIR => refused("is a directory"),
        // A FIFO without a reader.
        Errno::ENXIO => refused("is not a regular file"),
        source => LogFileError::Io {
            op: "opening",
            path: at.to_path_buf(),
            source,
        },
    })?;
    let meta = file.metadata().map_err(|e| LogFileError::Io {
        op: "inspecting",
        path: at.to_path_buf(),
        source: e.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
    })?;
    let ft = meta.file_type();
    if !ft.is_file() || ft.is_fifo() || ft.is_socket() {
        return Err(refused("is not a regular file"));
    }
    // A hard link to a host file (same file system, made by someone with
    // CAP_FOWNER or without protected_hardlinks) is as bad as a symlink.
    if meta.nlink() > 1 {
        return Err(refused("has other hard links"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::symlink;

    fn open(dir: &Path, rel: &str) -> Result<File, LogFileError> {
        open_log_file(dir, Path::new(rel), LogModes::default())
    }

    /// `<tmp>/pods/pod` as the pod's log dir, `<tmp>/host` as a host file.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("pods/pod");
        let host = tmp.path().join("host");
        std::fs::write(&host, "host\n").unwrap();
        (tmp, pod, host)
    }

    fn assert_refused(r: Result<File, LogFileError>, path: &Path) {
        match r {
            Err(e @ LogFileError::Refused { .. }) => {
                assert!(e.is_refused());
                assert!(
                    e.to_string().starts_with(&path.display().to_string()),
                    "{e}"
                );
            }
            other => panic!("expected a refusal naming {}: {other:?}", path.display()),
        }
    }

    #[test]
    fn creates_missing_dirs_and_appends() {
        let (_tmp, pod, _) = setup();
        let mut f = open(&pod, "c/0.log").unwrap();
        f.write_all(b"one\n").unwrap();
        let mut f = open(&pod, "c/0.log").unwrap();
        f.write_all(b"two\n").unwrap();
        assert_eq!(std::fs::read(pod.join("c/0.log")).unwrap(), b"one\ntwo\n");
        let m = std::fs::metadata(pod.join("c/0.log")).unwrap();
        assert_eq!(m.mode() & 0o022, 0, "{:o}", m.mode());
        open(&pod, "flat.log").unwrap();
    }

    #[test]
    fn a_symlinked_log_file_is_refused() {
        let (_tmp, pod, host) = setup();
        std::fs::create_dir_all(pod.join("c")).unwrap();
        symlink(&host, pod.join("c/0.log")).unwrap();
        assert_refused(open(&pod, "c/0.log"), &pod.join("c/0.log"));
        // Dangling: O_CREAT through it would create the target.
        symlink(pod.join("new-host-file"), pod.join("c/1.log")).unwrap();
        assert_refused(open(&pod, "c/1.log"), &pod.join("c/1.log"));
        assert!(!pod.join("new-host-file").exists());
        assert_eq!(std::fs::read(&host).unwrap(), b"host\n");
    }

    #[test]
    fn a_symlink_on_the_way_is_refused() {
        let (tmp, pod, host) = setup();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("c")).unwrap();
        std::fs::create_dir_all(&pod).unwrap();
        symlink(&elsewhere, pod.join("c")).unwrap();
        assert_refused(open(&pod, "c/0.log"), &pod.join("c"));
        // The pod's log directory itself.
        let pod2 = tmp.path().join("pods/pod2");
        symlink(&elsewhere, &pod2).unwrap();
        assert_refused(open(&pod2, "c/0.log"), &pod2);
        // A file where a directory goes.
        std::fs::write(pod.join("f"), "").unwrap();
        assert_refused(open(&pod, "f/0.log"), &pod.join("f"));
        assert!(!elsewhere.join("c/0.log").exists());
        assert_eq!(std::fs::read(&host).unwrap(), b"host\n");
    }

    #[test]
    fn the_nodes_part_is_followed() {
        let (tmp, _, _) = setup();
        let disk = tmp.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        symlink(&disk, tmp.path().join("linked")).unwrap();
        let pod = tmp.path().join("linked/pod");
        open(&pod, "c/0.log").unwrap();
        assert!(disk.join("pod/c/0.log").is_file());
    }

    #[test]
    fn special_files_and_hard_links_are_refused() {
        let (_tmp, pod, host) = setup();
        std::fs::create_dir_all(pod.join("d/0.log")).unwrap();
        assert_refused(open(&pod, "d/0.log"), &pod.join("d/0.log"));
        nix::unistd::mkfifo(&pod.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_refused(open(&pod, "fifo"), &pod.join("fifo"));
        std::fs::hard_link(&host, pod.join("hard.log")).unwrap();
        assert_refused(open(&pod, "hard.log"), &pod.join("hard.log"));
        assert_eq!(std::fs::read(&host).unwrap(), b"host\n");
    }

    #[test]
    fn bad_paths_are_invalid() {
        let (_tmp, pod, _) = setup();
        for rel in ["", "/abs", "../x", "c/../x", "./x"] {
            let e = open(&pod, rel).unwrap_err();
            assert!(matches!(e, LogFileError::Invalid { .. }), "{rel:?}: {e}");
        }
        for dir in ["rel/dir", "/a/../b"] {
            let e = open(Path::new(dir), "x.log").unwrap_err();
            assert!(matches!(e, LogFileError::Invalid { .. }), "{dir:?}: {e}");
        }
    }
}
