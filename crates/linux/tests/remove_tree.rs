//! Privileged tests (run as root): `remove_tree` never deletes what a
//! mount left inside the removed directory holds. Mounts are undone by a
//! Drop guard, also on failure.

use std::path::{Path, PathBuf};

use crust_linux::remove_tree::remove_tree;
use nix::mount::{MntFlags, MsFlags};

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

fn bind(source: &Path, target: &Path) -> Unmount {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    Unmount(target.to_path_buf())
}

/// A bind mount of the same file system (same device number) deep inside:
/// std's remove_dir_all empties it; remove_tree stops at it.
#[test]
fn a_bind_mount_inside_stops_the_removal_and_keeps_its_contents() {
    let tmp = tempfile::tempdir().unwrap();
    let precious = tmp.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("data"), b"keep me").unwrap();
    let victim = tmp.path().join("container");
    let target = victim.join("bundle/rootfs/mnt");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(victim.join("bundle/config.json"), b"{}").unwrap();
    let _mount = bind(&precious, &target);

    let err = remove_tree(&victim).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ResourceBusy, "{err}");
    assert!(err.to_string().contains("is a mount point"), "{err}");
    assert_eq!(std::fs::read(precious.join("data")).unwrap(), b"keep me");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"keep me");
}

/// The removed directory itself is a mount point: nothing is deleted.
#[test]
fn a_mount_point_itself_is_not_emptied() {
    let tmp = tempfile::tempdir().unwrap();
    let precious = tmp.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("data"), b"keep me").unwrap();
    let victim = tmp.path().join("pod");
    std::fs::create_dir(&victim).unwrap();
    let _mount = bind(&precious, &victim);

    let err = remove_tree(&victim).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ResourceBusy, "{err}");
    assert_eq!(std::fs::read(precious.join("data")).unwrap(), b"keep me");
}

/// A tmpfs (another device) inside: its files stay.
#[test]
fn a_tmpfs_inside_keeps_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("pod");
    let shm = victim.join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    let _mount = Unmount(shm.clone());
    std::fs::write(shm.join("segment"), b"x").unwrap();

    assert!(remove_tree(&victim).is_err());
    assert!(shm.join("segment").exists());
    drop(_mount);
    remove_tree(&victim).unwrap();
    assert!(!victim.exists());
}
