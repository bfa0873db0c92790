//! The container's CRI log file: appended to, reopened on request (after
//! kubelet rotated it). A write error is reported once, not per line.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub(super) struct LogFile {
    path: PathBuf,
    file: Option<File>,
    warned: bool,
}

impl LogFile {
    pub fn open(path: PathBuf) -> io::Result<LogFile> {
        let file = Self::open_file(&path)?;
        Ok(LogFile {
            path,
            file: Some(file),
            warned: false,
        })
    }

    fn open_file(path: &Path) -> io::Result<File> {
        // std opens close-on-exec: the runtime and the container never get it.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
    }

    pub fn write(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if let Some(f) = self.file.as_mut()
            && let Err(e) = f.write_all(data)
            && !self.warned
        {
            eprintln!("crust-shim: writing log {}: {e}", self.path.display());
            self.warned = true;
        }
    }

    pub fn reopen(&mut self) -> io::Result<()> {
        self.file = None;
        self.file = Some(Self::open_file(&self.path)?);
        self.warned = false;
        Ok(())
    }
}
