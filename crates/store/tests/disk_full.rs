//! A full disk poisons redb ("Previous I/O error occurred. Please close
//! and re-open the database") for every later operation, even once there
//! is room again. The store closes and reopens the database, reports the
//! failure through `health` until a write works again, and loses nothing
//! written before. On a real filesystem: a 4 MiB tmpfs (run as root),
//! filled up, unmounted at the end, also when the test fails.

use std::io::Write;
use std::path::{Path, PathBuf};

use crust_store::{Kind, Record, Store};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Rec {
    id: String,
    payload: String,
}

impl Record for Rec {
    const KIND: Kind = Kind::Pod;
    fn key(&self) -> &str {
        &self.id
    }
}

fn rec(id: &str, size: usize) -> Rec {
    Rec {
        id: id.into(),
        payload: "x".repeat(size),
    }
}

/// A small tmpfs, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts a tmpfs: run it as root (CI does)"
        );
        let dir = tempfile::tempdir().unwrap();
        mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0700").as_str()),
        )
        .expect("mount a tmpfs");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = umount2(self.dir.path(), MntFlags::MNT_DETACH);
    }
}

/// Fills the filesystem up with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    // The last bytes too, so nothing is left.
    for _ in 0..64 {
        let _ = f.write_all(&[0u8; 512]);
    }
    path
}

#[test]
fn a_full_disk_is_reported_and_the_store_recovers_once_there_is_room() {
    let fs = Tmpfs::mount("4m");
    let store = Store::open(&fs.path().join("meta.db")).unwrap();
    store.put(&rec("before", 100)).unwrap();
    assert_eq!(store.health(), Ok(()));

    let filler = fill(fs.path());
    // Records large enough to need new pages until the disk says no.
    let mut failed = None;
    for i in 0..64 {
        if let Err(e) = store.put(&rec(&format!("big{i}"), 256 << 10)) {
            failed = Some(e.to_string());
            break;
        }
    }
    let failed = failed.expect("a write on a full filesystem failed");
    let why = store.health().expect_err("health reports the failure");
    assert!(why.contains("No space left"), "{why} (write: {failed})");
    // Still full: still failing, still reported, and never redb's poison.
    let again = store.put(&rec("during", 100)).unwrap_err().to_string();
    assert!(!again.contains("Previous I/O error"), "{again}");
    assert!(store.health().is_err());
    assert!(store.probe().is_err());

    // A small write that finds room does not make it healthy: only a
    // probe of a record's size does.
    let _ = store.delete::<Rec>("during");
    assert!(store.health().is_err());

    // Room again: the store works without a restart.
    std::fs::remove_file(&filler).unwrap();
    store.probe().unwrap();
    assert_eq!(store.health(), Ok(()));
    store.put(&rec("after", 100)).unwrap();
    assert_eq!(
        store.get::<Rec>("before").unwrap(),
        Some(rec("before", 100))
    );
    assert_eq!(store.get::<Rec>("after").unwrap(), Some(rec("after", 100)));
    // Reopening from disk sees the same.
    drop(store);
    let store = Store::open(&fs.path().join("meta.db")).unwrap();
    assert!(store.get::<Rec>("before").unwrap().is_some());
    assert!(store.get::<Rec>("after").unwrap().is_some());
}
