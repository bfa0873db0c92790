//! Privileged tests (run as root): real namespaces, mounts and cgroups on
//! this host. Every test cleans up through Drop guards, also on failure.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crust_linux::cgroups::{self, Hierarchy, PodCgroup};
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

/// Removes a test's cgroup parent (and anything left below it) in every
/// hierarchy it may have been created in.
struct CgroupParentGuard {
    mounts: Vec<PathBuf>,
    parent: PathBuf,
}

impl Drop for CgroupParentGuard {
    fn drop(&mut self) {
        fn remove_tree(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        remove_tree(&e.path());
                    }
                }
            }
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::SIGKILL,
                    );
                }
            }
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        for mount in &self.mounts {
            remove_tree(&mount.join(self.parent.strip_prefix("/").unwrap()));
        }
    }
}

fn v1_mounts() -> Vec<PathBuf> {
    let mut mounts: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" - cgroup "))
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|m| !m.ends_with("systemd"))
        .collect();
    mounts.sort();
    mounts.dedup();
    mounts
}

fn cgroup2_mount() -> Option<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4).map(PathBuf::from))
}

/// Starts a process and moves it into `dir` in each of `mounts`, standing
/// in for a container the pod still has at removal.
fn spawn_into(mounts: &[PathBuf], rel: &Path) -> std::process::Child {
    let child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    for mount in mounts {
        let dir = mount.join(rel.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if dir.join(file).exists() {
                let parent = std::fs::read_to_string(dir.parent().unwrap().join(file)).unwrap();
                std::fs::write(dir.join(file), parent.trim()).unwrap();
            }
        }
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    }
    child
}

#[test]
fn pod_cgroup_on_this_hosts_hierarchy() {
    let root = Path::new("/sys/fs/cgroup");
    let hierarchy = cgroups::detect(root).unwrap();
    let parent = format!("/crust-test-{}/burstable/pod-1", std::process::id());
    let mounts = match hierarchy {
        Hierarchy::V2 => vec![root.to_path_buf()],
        Hierarchy::V1 | Hierarchy::Hybrid => v1_mounts(),
    };
    let _guard = CgroupParentGuard {
        mounts: mounts.clone(),
        parent: PathBuf::from(format!("/crust-test-{}", std::process::id())),
    };
    let path = cgroups::pod_cgroup_path(&parent, "sandbox1").unwrap();
    let cg = PodCgroup::new(hierarchy, root, &path).unwrap();
    assert!(!cg.exists());
    cg.create().unwrap();
    cg.create().unwrap();
    assert!(cg.exists());
    for mount in &mounts {
        let dir = mount.join(path.strip_prefix("/").unwrap());
        assert!(dir.is_dir(), "{}", dir.display());
        if dir.join("cpuset.cpus").exists() {
            assert!(!read_trimmed(dir.join("cpuset.cpus").to_str().unwrap()).is_empty());
        }
    }

    // A container cgroup with a live process is left in the pod at removal.
    let mut child = spawn_into(&mounts, &path.join("ctr1"));
    assert_eq!(cg.pids().unwrap(), vec![child.id() as i32]);
    cg.delete().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the leftover process was killed");
    assert!(!cg.exists());
    for mount in &mounts {
        assert!(!mount.join(path.strip_prefix("/").unwrap()).exists());
        // The parent (kubelet's) stays.
        assert!(mount.join(parent.strip_prefix("/").unwrap()).is_dir());
    }
    cg.delete().unwrap();
}

#[test]
fn pod_cgroup_on_a_unified_hierarchy() {
    // On a hybrid host the controller-less cgroup2 mount exercises the v2
    // code path (directories, cgroup.kill, removal).
    let Some(unified) = cgroup2_mount() else {
        eprintln!("no cgroup2 mount; skipped");
        return;
    };
    let parent = PathBuf::from(format!("/crust-test-v2-{}", std::process::id()));
    let _guard = CgroupParentGuard {
        mounts: vec![unified.clone()],
        parent: parent.clone(),
    };
    let path = cgroups::pod_cgroup_path(parent.to_str().unwrap(), "sandbox2").unwrap();
    let cg = PodCgroup::new(Hierarchy::V2, &unified, &path).unwrap();
    cg.create().unwrap();
    assert!(unified.join(path.strip_prefix("/").unwrap()).is_dir());
    let mut child = spawn_into(std::slice::from_ref(&unified), &path.join("ctr"));
    cg.delete().unwrap();
    assert!(!child.wait().unwrap().success());
    assert!(!cg.exists());
    cg.delete().unwrap();
}
