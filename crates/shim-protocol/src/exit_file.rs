//! The exit record (`exit.json`): written once by the monitor, atomically
//! (the durable record of how the process ended, even across a daemon
//! crash), read by the daemon.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use crate::messages::ExitInfo;

/// Writes `data` to `dir/name` atomically and durably: a temp file, fsync,
/// rename, fsync of the directory. For what must outlive the machine (the
/// exit record).
pub fn write_atomic(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    write_replace(dir, name, data, true)
}

/// Writes `data` to `dir/name` atomically for every reader (a temp file,
/// then rename: the old content or the new, never a part), without the
/// fsyncs of [`write_atomic`]. For the files of a state dir that describe
/// live processes (`shim.json`, `shim.pid`): a daemon crash loses nothing
/// of them (the page cache stays), and the processes they describe do not
/// survive the machine; after a power loss such a file may be empty, which
/// readers take as "no monitor". Each fsync costs milliseconds on a busy
/// disk, on the path of every CreateContainer.
pub fn write_replace_volatile(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    write_replace(dir, name, data, false)
}

fn write_replace(dir: &Path, name: &str, data: &[u8], durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(data)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Reads an exit record, `Ok(None)` if there is none (yet).
pub fn read_exit_file(path: &Path) -> io::Result<Option<ExitInfo>> {
    match fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_and_read() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("exit.json");
        assert!(read_exit_file(&path).unwrap().is_none());
        let info = ExitInfo {
            pid: 7,
            exit_code: 42,
            signal: None,
            oom_killed: false,
            exited_at: "1970-01-01T00:00:01.000000005Z".into(),
            exited_at_unix_nanos: 1_000_000_005,
        };
        write_atomic(d.path(), "exit.json", &serde_json::to_vec(&info).unwrap()).unwrap();
        assert_eq!(read_exit_file(&path).unwrap().unwrap(), info);
        assert!(!d.path().join(".exit.json.tmp").exists());
        write_replace_volatile(d.path(), "shim.pid", b"42").unwrap();
        assert_eq!(fs::read(d.path().join("shim.pid")).unwrap(), b"42");
        assert!(!d.path().join(".shim.pid.tmp").exists());
        fs::write(&path, b"{").unwrap();
        assert_eq!(
            read_exit_file(&path).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
