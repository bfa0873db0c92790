//! The container's CRI log file: appended to, reopened on request (after
//! kubelet rotated it). A write error is reported once, not per line.
//!
//! Opened and reopened through [`crust_linux::log_file`]: never through a
//! symlink at or below the pod's log directory, which others can write.
//! The descriptor is kept, so a symlink put in the file's place later is
//! only seen (and refused) at the next reopen; until a reopen succeeds,
//! output is dropped rather than written anywhere else.
//!
//! With a size cap (`log_size_max`, as CRI-O's), output that would take
//! the file past it is dropped, whole lines at a time, until the next
//! reopen; the file says so once, in one CRI line.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crust_linux::log_file::{LogFileError, LogModes, open_log_file};

use crate::logfmt;

/// Where the log goes: the pod's log directory (the anchor) and the path
/// below it.
#[derive(Debug, Clone)]
pub(super) struct LogTarget {
    directory: PathBuf,
    rel: PathBuf,
}

impl LogTarget {
    /// `path` (absolute) below `directory`, or, without one, below its own
    /// directory.
    pub fn new(path: &Path, directory: Option<&Path>) -> Result<LogTarget, String> {
        let (directory, rel) = match directory {
            Some(d) => (d, path.strip_prefix(d).ok()),
            None => match path.parent() {
                Some(d) => (d, path.file_name().map(Path::new)),
                None => (path, None),
            },
        };
        match rel {
            Some(rel) if !rel.as_os_str().is_empty() => Ok(LogTarget {
                directory: directory.to_path_buf(),
                rel: rel.to_path_buf(),
            }),
            _ => Err(format!(
                "log path {} is not below {}",
                path.display(),
                directory.display()
            )),
        }
    }

    fn path(&self) -> PathBuf {
        self.directory.join(&self.rel)
    }

    fn open(&self) -> Result<File, LogFileError> {
        open_log_file(&self.directory, &self.rel, LogModes::default())
    }
}

pub(super) struct LogFile {
    target: LogTarget,
    file: Option<File>,
    warned: bool,
    /// 0: no cap.
    size_max: u64,
    /// Bytes in the file (its size when opened, plus what we wrote).
    size: u64,
    /// Output dropped since the last reopen (the cap, or no file).
    dropping: bool,
    /// Bytes dropped over the container's life.
    dropped_total: u64,
}

impl LogFile {
    pub fn open(target: LogTarget, size_max: u64) -> Result<LogFile, LogFileError> {
        let mut log = LogFile {
            target,
            file: None,
            warned: false,
            size_max,
            size: 0,
            dropping: false,
            dropped_total: 0,
        };
        log.set(log.target.open()?);
        Ok(log)
    }

    fn set(&mut self, file: File) {
        self.size = file.metadata().map_or(0, |m| m.len());
        self.file = Some(file);
        self.warned = false;
        self.dropping = false;
    }

    /// Bytes of output dropped so far (the cap, or a failed reopen).
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped_total
    }

    /// Appends `data`, complete CRI lines.
    pub fn write(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.file.is_none() {
            self.dropped_total += data.len() as u64;
            return;
        }
        let keep = self.fitting(data);
        if keep > 0 {
            self.append(&data[..keep]);
        }
        if keep < data.len() {
            self.dropped_total += (data.len() - keep) as u64;
            if !self.dropping {
                self.dropping = true;
                let notice = cap_notice(self.size_max, SystemTime::now());
                self.append(&notice);
            }
        }
    }

    /// How much of `data` goes in under the cap: all, or the complete lines
    /// that fit (none once dropping began, until the next reopen).
    fn fitting(&self, data: &[u8]) -> usize {
        if self.size_max == 0 {
            return data.len();
        }
        if self.dropping {
            return 0;
        }
        let room = self.size_max.saturating_sub(self.size);
        if data.len() as u64 <= room {
            return data.len();
        }
        let room = room as usize;
        data[..room]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1)
    }

    fn append(&mut self, data: &[u8]) {
        let Some(f) = self.file.as_mut() else { return };
        match f.write_all(data) {
            Ok(()) => self.size += data.len() as u64,
            Err(e) if !self.warned => {
                eprintln!(
                    "crust-shim: writing log {}: {e}",
                    self.target.path().display()
                );
                self.warned = true;
            }
            Err(_) => {}
        }
    }

    /// Opens the log path again (kubelet renamed the file). On failure no
    /// file is written until a later reopen succeeds.
    pub fn reopen(&mut self) -> Result<(), LogFileError> {
        self.file = None;
        let file = self.target.open()?;
        self.set(file);
        Ok(())
    }
}

/// The one line said when output starts being dropped.
fn cap_notice(size_max: u64, now: SystemTime) -> Vec<u8> {
    format!(
        "{} stderr F crust: the log reached its size limit of {size_max} bytes \
         (log_size_max); output is dropped until the log is rotated\n",
        logfmt::format_timestamp(now)
    )
    .into_bytes()
}

/// A [`LogFileError`] as the monitor reports it: a refusal (something in
/// the pod's log directory is in the way) is the caller's to fix.
pub(super) fn open_error(e: LogFileError) -> super::Error {
    if e.is_refused() {
        super::Error::LogRefused(clip(format!("log file {e}")))
    } else {
        super::Error::Io {
            what: "opening the log".into(),
            source: io::Error::other(e.to_string()),
        }
    }
}

/// Messages stay short: the paths come from a client (bounded there, but
/// up to a few KiB).
fn clip(mut s: String) -> String {
    const MAX: usize = 512;
    if s.len() > MAX {
        let mut cut = MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.extend(std::iter::repeat_n(b'x', len - 1));
            out.push(b'\n');
        }
        out
    }

    #[test]
    fn the_cap_drops_whole_lines_says_so_once_and_lifts_at_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pod/c/0.log");
        let target = LogTarget::new(&path, Some(&tmp.path().join("pod"))).unwrap();
        let mut log = LogFile::open(target, 1000).unwrap();
        log.write(&lines(9, 100));
        log.write(&lines(3, 100)); // one line fits, two are dropped
        log.write(&lines(5, 100));
        let text = std::fs::read_to_string(&path).unwrap();
        let notices = text.matches("size limit of 1000 bytes").count();
        assert_eq!(notices, 1, "{text}");
        let body = text.len() - text.lines().last().unwrap().len() - 1;
        assert_eq!(body, 1000);
        assert_eq!(log.dropped_bytes(), 700);
        std::fs::rename(&path, tmp.path().join("old")).unwrap();
        log.reopen().unwrap();
        log.write(&lines(2, 100));
        assert_eq!(std::fs::read(&path).unwrap().len(), 200);
    }

    #[test]
    fn no_cap_writes_everything() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("0.log");
        let mut log = LogFile::open(LogTarget::new(&path, None).unwrap(), 0).unwrap();
        log.write(&lines(100, 100));
        assert_eq!(std::fs::read(&path).unwrap().len(), 10_000);
    }

    #[test]
    fn a_symlink_at_reopen_is_refused_and_nothing_is_written_through_it() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("pod");
        let path = pod.join("0.log");
        let host = tmp.path().join("host");
        std::fs::write(&host, "host\n").unwrap();
        let mut log = LogFile::open(LogTarget::new(&path, Some(&pod)).unwrap(), 0).unwrap();
        log.write(b"a\n");
        std::fs::rename(&path, pod.join("0.log.1")).unwrap();
        std::os::unix::fs::symlink(&host, &path).unwrap();
        let e = log.reopen().unwrap_err();
        assert!(e.is_refused(), "{e}");
        log.write(b"b\n");
        assert_eq!(std::fs::read(&host).unwrap(), b"host\n");
        assert_eq!(log.dropped_bytes(), 2);
    }

    #[test]
    fn targets_must_lie_below_their_directory() {
        let t = LogTarget::new(
            Path::new("/var/log/pods/p/c/0.log"),
            Some(Path::new("/var/log/pods/p")),
        )
        .unwrap();
        assert_eq!(t.rel, Path::new("c/0.log"));
        assert!(LogTarget::new(Path::new("/x/0.log"), Some(Path::new("/var/log/pods/p"))).is_err());
        assert!(LogTarget::new(Path::new("/p"), Some(Path::new("/p"))).is_err());
    }
}
