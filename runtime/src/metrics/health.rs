//! The daemon's health as `GET /healthz` and `crust status` report it:
//! healthy only while it serves the CRI socket, which it does once
//! recovery has finished and until shutdown begins, and only while the
//! socket file is still the one it bound (someone removing or replacing
//! it cuts kubelet off just as surely).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Opening the store, recovering pods and containers.
    Starting,
    Serving,
    /// SIGTERM / SIGINT: finishing in-flight calls.
    Stopping,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Serving => "serving",
            Phase::Stopping => "stopping",
        }
    }
}

/// The bound socket, by path and identity.
#[derive(Debug)]
struct BoundSocket {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

#[derive(Debug)]
pub struct Health {
    phase: AtomicU8,
    socket: OnceLock<BoundSocket>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            phase: AtomicU8::new(Phase::Starting as u8),
            socket: OnceLock::new(),
        }
    }
}

impl Health {
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Starting,
            1 => Phase::Serving,
            _ => Phase::Stopping,
        }
    }

    /// The socket at `path` is bound and served from now on.
    pub fn serving(&self, path: PathBuf) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(&path)?;
        let _ = self.socket.set(BoundSocket {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
        });
        self.phase.store(Phase::Serving as u8, Ordering::Release);
        Ok(())
    }

    pub fn stopping(&self) {
        self.phase.store(Phase::Stopping as u8, Ordering::Release);
    }

    /// Ok while healthy, else why not.
    pub fn check(&self) -> Result<(), String> {
        match self.phase() {
            Phase::Starting => return Err("starting: recovery has not finished".into()),
            Phase::Stopping => return Err("stopping".into()),
            Phase::Serving => {}
        }
        let Some(bound) = self.socket.get() else {
            return Err("the CRI socket is not bound".into());
        };
        match std::fs::symlink_metadata(&bound.path) {
            Ok(m) if m.dev() == bound.dev && m.ino() == bound.ino => Ok(()),
            Ok(_) => Err(format!(
                "{} is no longer the daemon's socket",
                bound.path.display()
            )),
            Err(e) => Err(format!("{}: {e}", bound.path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_only_while_serving_its_own_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let h = Health::default();
        assert!(h.check().unwrap_err().contains("starting"));
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        h.serving(path.clone()).unwrap();
        h.check().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(h.check().is_err());
        std::fs::write(&path, "").unwrap();
        assert!(h.check().unwrap_err().contains("no longer"));
        h.stopping();
        assert_eq!(h.check().unwrap_err(), "stopping");
    }
}
