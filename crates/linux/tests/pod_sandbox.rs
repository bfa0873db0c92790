//! Privileged tests (run as root): real namespaces and mounts on this
//! host (pod cgroups are tested in crates/cgroups/tests/host.rs). Every test cleans up through Drop guards, also on failure.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crust_linux::mounts;
use crust_linux::ns::{self, NamespaceKind, PinOptions};

/// Unpins whatever a test pinned in `dir`.
struct PinGuard(PathBuf);

impl Drop for PinGuard {
    fn drop(&mut self) {
        let _ = ns::unpin_namespaces(&self.0);
    }
}

fn mounted_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| m.starts_with(dir))
        })
        .map(str::to_string)
        .collect()
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[test]
fn pinned_namespaces_carry_hostname_sysctls_and_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ns");
    let _guard = PinGuard(dir.clone());
    let host_somaxconn = read_trimmed("/proc/sys/net/core/somaxconn");
    let host_msgmax = read_trimmed("/proc/sys/kernel/msgmax");
    let opts = PinOptions {
        net: true,
        ipc: true,
        uts: true,
        hostname: Some("crust-test-pod".into()),
        sysctls: vec![
            ("net.core.somaxconn".into(), "777".into()),
            ("kernel.msgmax".into(), "12345".into()),
        ],
        loopback_up: true,
        ..Default::default()
    };
    let pinned = ns::pin_namespaces(&dir, &opts).unwrap();

    for kind in NamespaceKind::ALL {
        let path = pinned.get(kind).unwrap();
        assert_eq!(path, ns::pin_path(&dir, kind));
        assert!(ns::is_pinned(path), "{kind:?}");
        let own = std::fs::metadata(format!("/proc/self/ns/{}", kind.proc_name())).unwrap();
        assert_ne!(
            std::fs::metadata(path).unwrap().ino(),
            own.ino(),
            "{kind:?} is the host's"
        );
    }

    let uts = pinned.uts.as_deref().unwrap();
    let hostname = ns::run_in_namespaces(&[(NamespaceKind::Uts, uts)], || {
        nix::unistd::gethostname().unwrap()
    })
    .unwrap();
    assert_eq!(hostname, "crust-test-pod");
    assert_ne!(nix::unistd::gethostname().unwrap(), "crust-test-pod");

    let net = pinned.net.as_deref().unwrap();
    let ipc = pinned.ipc.as_deref().unwrap();
    let (somaxconn, loopback_echo) = ns::run_in_namespaces(&[(NamespaceKind::Net, net)], || {
        let somaxconn = read_trimmed("/proc/sys/net/core/somaxconn");
        // lo is up: a connection to 127.0.0.1 inside the pod works.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(b"hi").unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let mut buf = [0u8; 2];
        server.read_exact(&mut buf).unwrap();
        (somaxconn, buf)
    })
    .unwrap();
    assert_eq!(somaxconn, "777");
    assert_eq!(&loopback_echo, b"hi");
    let msgmax = ns::run_in_namespaces(&[(NamespaceKind::Ipc, ipc)], || {
        read_trimmed("/proc/sys/kernel/msgmax")
    })
    .unwrap();
    assert_eq!(msgmax, "12345");
    // The node's values are untouched.
    assert_eq!(read_trimmed("/proc/sys/net/core/somaxconn"), host_somaxconn);
    assert_eq!(read_trimmed("/proc/sys/kernel/msgmax"), host_msgmax);

    // Sysctls can also be written later (after CNI ADD), still checked.
    ns::apply_sysctls(&pinned, &[("net.core.somaxconn".into(), "888".into())]).unwrap();
    let somaxconn = ns::run_in_namespaces(&[(NamespaceKind::Net, net)], || {
        read_trimmed("/proc/sys/net/core/somaxconn")
    })
    .unwrap();
    assert_eq!(somaxconn, "888");
    assert!(ns::apply_sysctls(&pinned, &[("vm.swappiness".into(), "1".into())]).is_err());
    assert_eq!(read_trimmed("/proc/sys/net/core/somaxconn"), host_somaxconn);

    // Pinning again into the same dir is refused and leaves the pins alone.
    assert!(ns::pin_namespaces(&dir, &opts).is_err());
    assert!(ns::is_pinned(net));

    ns::unpin_namespaces(&dir).unwrap();
    assert!(mounted_under(&dir).is_empty(), "{:?}", mounted_under(&dir));
    assert!(!dir.exists());
    ns::unpin_namespaces(&dir).unwrap();
}

#[test]
fn host_network_pod_pins_only_ipc_and_uts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ns");
    let _guard = PinGuard(dir.clone());
    let opts = PinOptions {
        ipc: true,
        uts: true,
        hostname: Some("hostnet".into()),
        ..Default::default()
    };
    let pinned = ns::pin_namespaces(&dir, &opts).unwrap();
    assert!(pinned.net.is_none());
    assert!(!ns::pin_path(&dir, NamespaceKind::Net).exists());
    assert!(ns::is_pinned(pinned.ipc.as_deref().unwrap()));
    ns::unpin_namespaces(&dir).unwrap();
    assert!(mounted_under(&dir).is_empty());
}

#[test]
fn a_sysctl_the_kernel_refuses_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ns");
    let _guard = PinGuard(dir.clone());
    let opts = PinOptions {
        net: true,
        ipc: true,
        uts: true,
        sysctls: vec![("net.ipv4.crust_no_such_sysctl".into(), "1".into())],
        ..Default::default()
    };
    let err = ns::pin_namespaces(&dir, &opts).unwrap_err();
    assert!(err.is_invalid_argument(), "{err}");
    assert!(
        err.to_string().contains("net.ipv4.crust_no_such_sysctl"),
        "{err}"
    );
    assert!(mounted_under(&dir).is_empty());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn shm_tmpfs_mounts_and_unmounts() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("shm");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = mounts::unmount_and_remove_dir(&self.0);
        }
    }
    let _guard = Unmount(shm.clone());
    mounts::mount_shm(&shm, 1024 * 1024).unwrap();
    assert!(mounts::is_shm_mounted(&shm));
    let fs = nix::sys::statvfs::statvfs(&shm).unwrap();
    assert_eq!(fs.blocks() * fs.fragment_size(), 1024 * 1024);
    mounts::unmount_and_remove_dir(&shm).unwrap();
    assert!(!shm.exists());
    assert!(mounted_under(tmp.path()).is_empty());
    mounts::unmount_and_remove_dir(&shm).unwrap();
}
