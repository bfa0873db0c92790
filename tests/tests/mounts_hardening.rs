//! Mount hardening (issue 27), end to end through the real daemon on the
//! embedded and runc handlers: image volumes are nosuid and nodev (not noexec),
//! and so is any volume whose `mount_options` ask for it (KEP-5855, crun
//! too);
//! Bidirectional propagation is for privileged containers only; magic-link
//! working dirs and images whose /proc, /sys or /dev/shm are symlinks are
//! refused with an error naming what is wrong; images whose /etc/hosts,
//! /etc/resolv.conf or /etc/hostname are symlinks run with the pod's files,
//! without the links being followed.

use std::path::{Path, PathBuf};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Status};
use crust_test_support::{
    Daemon, Need, Pod, WithImage, container_config, daemon_with_image, exec_sync, host_network_pod,
    mounts_under, pull_image, require,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type Ic = v1::image_service_client::ImageServiceClient<Channel>;

const APPLETS: &[&str] = &[
    "sh", "cat", "id", "sleep", "echo", "grep", "ls", "true", "mount", "umount", "mkdir",
];

/// busybox with a user `app` (1000).
fn base_layer() -> LayerTar {
    busybox_with(APPLETS)
        .dir("etc/")
        .file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
        )
        .file("etc/group", b"root:x:0:\napp:x:1000:\n")
        .dir("tmp/")
}

/// A static x86-64 ELF that exits with its effective uid (low 8 bits):
/// geteuid(); exit(euid). 0 means it ran as root.
fn euid_probe() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    // mov eax,107 (geteuid); syscall; mov edi,eax; mov eax,60 (exit); syscall
    let code = [
        0xb8, 0x6b, 0, 0, 0, 0x0f, 0x05, 0x89, 0xc7, 0xb8, 0x3c, 0, 0, 0, 0x0f, 0x05,
    ];
    let total = (64 + 56 + code.len()) as u64;
    let mut elf = Vec::new();
    elf.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&(BASE + 120).to_le_bytes()); // entry
    elf.extend_from_slice(&64u64.to_le_bytes()); // phoff
    elf.extend_from_slice(&0u64.to_le_bytes()); // shoff
    elf.extend_from_slice(&0u32.to_le_bytes()); // flags
    for v in [64u16, 56, 1, 0, 0, 0] {
        elf.extend_from_slice(&v.to_le_bytes());
    }
    elf.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // R+X
    for v in [0, BASE, BASE, total, total, 0x1000] {
        elf.extend_from_slice(&v.to_le_bytes());
    }
    elf.extend_from_slice(&code);
    elf
}

/// An "artifact" image for an image volume: a setuid-root euid probe and a
/// character device (1:3, /dev/null's numbers, which the device cgroup
/// allows), both root-owned.
fn hostile_artifact() -> TestImage {
    let mut tar = tar::Builder::new(Vec::new());
    let mut add =
        |kind: tar::EntryType, name: &str, mode: u32, data: &[u8], dev: Option<(u32, u32)>| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_path(name).unwrap();
            h.set_mode(mode);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_700_000_000);
            h.set_size(data.len() as u64);
            if let Some((major, minor)) = dev {
                h.set_device_major(major).unwrap();
                h.set_device_minor(minor).unwrap();
            }
            h.set_cksum();
            tar.append(&h, data).unwrap();
        };
    add(tar::EntryType::Directory, "bin/", 0o755, b"", None);
    add(
        tar::EntryType::Regular,
        "bin/euid",
        0o4755,
        &euid_probe(),
        None,
    );
    add(tar::EntryType::Char, "null", 0o666, b"", Some((1, 3)));
    let layer = tar.into_inner().unwrap();
    build(ImageSpec {
        layers: vec![gzip(&layer)],
        ..ImageSpec::default()
    })
}

/// `img` with its config's WorkingDir set to `dir`.
fn with_workdir(mut img: TestImage, dir: &str) -> TestImage {
    let mut config: serde_json::Value = serde_json::from_slice(&img.config).unwrap();
    config["config"]["WorkingDir"] = dir.into();
    img.config = serde_json::to_vec(&config).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
    manifest["config"]["digest"] = sha(&img.config).into();
    manifest["config"]["size"] = img.config.len().into();
    img.manifest = serde_json::to_vec(&manifest).unwrap();
    img
}

struct Env {
    // Field order = drop order: the daemon (which removes its pods) first.
    d: Daemon,
    reg: Registry,
    image: String,
    rt: Rt,
    ic: Ic,
    logs: tempfile::TempDir,
}

async fn env() -> Env {
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(
        Daemon::builder(),
        "test/base",
        &one_layer_image(&base_layer().finish(), &["sleep", "1000"]),
    )
    .await;
    let ic = d.image_v1().await;
    let rt = d.runtime_v1().await;
    Env {
        rt,
        ic,
        d,
        reg,
        image,
        logs: tempfile::tempdir().unwrap(),
    }
}

impl Env {
    async fn pod(&mut self, name: &str, handler: &str, privileged: bool) -> Pod {
        let mut config = v1::PodSandboxConfig {
            hostname: format!("host-{name}"),
            log_directory: self.logs.path().join(name).display().to_string(),
            ..host_network_pod(name, "crust-test")
        };
        if privileged {
            let sc = config
                .linux
                .as_mut()
                .unwrap()
                .security_context
                .as_mut()
                .unwrap();
            sc.privileged = true;
        }
        let id = self
            .rt
            .run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
            .into_inner()
            .pod_sandbox_id;
        (id, config)
    }

    async fn remove_pod(&mut self, pod: &Pod) {
        self.rt
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: pod.0.clone(),
            })
            .await
            .unwrap();
        self.rt
            .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: pod.0.clone(),
            })
            .await
            .unwrap();
        assert_eq!(mounts_under(&self.d.run_dir), Vec::<PathBuf>::new());
    }

    /// Pushes and pulls `img` as `test/<name>:v1`; its reference.
    async fn push(&mut self, name: &str, img: &TestImage) -> String {
        Pusher::new(&self.reg)
            .image(&format!("test/{name}"), "v1", img)
            .await;
        let r = format!("{}/test/{name}:v1", self.reg.host);
        pull_image(&mut self.ic, &r).await;
        r
    }

    async fn create(&mut self, pod: &Pod, config: v1::ContainerConfig) -> Result<String, Status> {
        crust_test_support::create_container(&mut self.rt, pod, config).await
    }

    async fn run(&mut self, pod: &Pod, config: v1::ContainerConfig) -> String {
        crust_test_support::run_container(&mut self.rt, pod, config).await
    }

    async fn sh(&mut self, id: &str, script: &str) -> (i32, String) {
        let (code, out, err) = exec_sync(&mut self.rt, id, &["sh", "-c", script], 20).await;
        (code, format!("{out}{err}"))
    }
}

fn field_of(e: &Status) -> &str {
    e.message().split(':').next().unwrap_or_default()
}

/// A refusal a client can act on, naming `field`, bounded.
fn assert_refused(e: &Status, codes: &[Code], field: &str) {
    assert!(codes.contains(&e.code()), "{e}");
    assert_eq!(field_of(e), field, "{e}");
    assert!(e.message().len() <= 1024, "{e}");
}

// ---------------------------------------------------------------------------
// Image volumes: nosuid, nodev (binaries in them run)

/// The pod's user namespace of [`image_volume_flags`] with `userns`.
const USERNS_HOST_ID: u32 = 300_000;

async fn image_volume_flags(handler: &str, userns: bool) {
    if std::env::consts::ARCH != "x86_64" {
        crust_test_support::skip!("the euid probe is an x86-64 binary");
    }
    let mut e = env().await;
    let artifact = e.push("hostile", &hostile_artifact()).await;
    // A user namespace pod (own network: kubelet refuses host network with
    // one) id-maps the image volume's mount through its namespace.
    let _net = userns.then(|| crust_test_support::TestNetwork::install(&e.d, &[]));
    let mapping = vec![v1::IdMapping {
        container_id: 0,
        host_id: USERNS_HOST_ID,
        length: 65536,
    }];
    let pod = if userns {
        let mut config = v1::PodSandboxConfig {
            hostname: "host-imgvol".into(),
            log_directory: e.logs.path().join("imgvol").display().to_string(),
            ..host_network_pod("imgvol", "crust-test")
        };
        let ns = config
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options
            .as_mut()
            .unwrap();
        ns.network = v1::NamespaceMode::Pod as i32;
        ns.userns_options = Some(v1::UserNamespace {
            mode: v1::NamespaceMode::Pod as i32,
            uids: mapping.clone(),
            gids: mapping.clone(),
        });
        let id =
            e.rt.run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .unwrap_or_else(|err| panic!("RunPodSandbox: {err}"))
            .into_inner()
            .pod_sandbox_id;
        (id, config)
    } else {
        e.pod("imgvol", handler, false).await
    };
    let mut c = container_config("app", &e.image);
    if userns {
        c.linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options = pod
            .1
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone());
    }
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .run_as_user = Some(v1::Int64Value { value: 1000 });
    c.mounts = vec![v1::Mount {
        container_path: "/vol".into(),
        image: Some(v1::ImageSpec {
            image: artifact,
            ..Default::default()
        }),
        uid_mappings: if userns { mapping.clone() } else { vec![] },
        gid_mappings: if userns { mapping.clone() } else { vec![] },
        ..Default::default()
    }];
    let id = e.run(&pod, c).await;
    let (_, out) = e.sh(&id, "id -u").await;
    assert_eq!(out.trim(), "1000");

    // The setuid-root probe runs (image volumes are not noexec: KEP-4639,
    // critest) and nosuid keeps its euid 1000 (232 = 1000 & 0xff); exit
    // status 0 would be euid 0.
    let (code, out) = e.sh(&id, "/vol/bin/euid; echo status=$?").await;
    assert!(
        out.contains("status=232"),
        "the setuid probe in the image volume: {out} ({code})"
    );
    assert!(!out.contains("status=0"), "euid 0 in the container: {out}");
    // The device node cannot be opened.
    let (_, out) = e
        .sh(
            &id,
            "cat /vol/null && echo READ; echo x > /vol/null && echo WROTE",
        )
        .await;
    assert!(
        !out.contains("READ") && !out.contains("WROTE"),
        "a device node of the image volume opened: {out}"
    );
    // The mount itself, as the container sees it.
    let (code, out) = e.sh(&id, "grep ' /vol ' /proc/self/mountinfo").await;
    assert_eq!(code, 0, "{out}");
    let opts = out
        .split_whitespace()
        .nth(5)
        .unwrap_or_default()
        .to_string();
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(opts.split(',').any(|o| o == flag), "{flag} missing: {out}");
    }
    assert!(
        !opts.split(',').any(|o| o == "noexec"),
        "an image volume is noexec: {out}"
    );
    e.remove_pod(&pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volume_flags_embedded() {
    image_volume_flags("embedded", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volume_flags_runc() {
    require!(Need::Runc);
    image_volume_flags("runc", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volume_flags_userns_embedded() {
    image_volume_flags("embedded", true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volume_flags_userns_runc() {
    require!(Need::Runc);
    image_volume_flags("runc", true).await;
}

// ---------------------------------------------------------------------------
// Mount.mount_options (KEP-5855): nosuid, nodev, noexec on a volume's bind

/// A host dir as a volume: the setuid-root euid probe and a character
/// device (1:3, which the device cgroup allows), both root-owned.
fn hostile_volume() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("euid");
    std::fs::write(&probe, euid_probe()).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    nix::sys::stat::mknod(
        &dir.path().join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    // mknod's mode went through the umask.
    std::fs::set_permissions(
        dir.path().join("null"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    // The controls below need a host file system that honours both.
    let st = nix::sys::statvfs::statvfs(dir.path()).unwrap();
    let host = nix::sys::statvfs::FsFlags::ST_NOSUID | nix::sys::statvfs::FsFlags::ST_NODEV;
    assert!(
        !st.flags().intersects(host),
        "the test's temp dir is on a nosuid/nodev file system"
    );
    dir
}

async fn mount_options(handler: &str) {
    if std::env::consts::ARCH != "x86_64" {
        crust_test_support::skip!("the euid probe is an x86-64 binary");
    }
    let mut e = env().await;
    let status =
        e.rt.status(v1::StatusRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(status.features.unwrap().mount_options, "{status:?}");
    let vol = hostile_volume();
    let pod = e.pod("mountopts", handler, false).await;
    let mount = |at: &str, options: &[&str]| v1::Mount {
        container_path: at.into(),
        host_path: vol.path().display().to_string(),
        mount_options: options.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    let mut c = container_config("app", &e.image);
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .run_as_user = Some(v1::Int64Value { value: 1000 });
    c.mounts = vec![
        mount("/plain", &[]),
        mount("/nosuid", &["nosuid"]),
        mount("/noexec", &["noexec"]),
        mount("/nodev", &["nodev"]),
        mount("/all", &["noexec", "nosuid", "nodev", "nosuid"]),
    ];
    let id = e.run(&pod, c).await;

    // The setuid-root probe exits with its euid's low byte: 0 is root,
    // 232 is 1000 (the setuid bit ignored), 126 is no exec at all.
    let (_, out) = e
        .sh(
            &id,
            "for d in plain nosuid noexec nodev all; do /$d/euid; echo $d=$?; done",
        )
        .await;
    let status_of = |d: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{d}=")))
            .unwrap_or_else(|| panic!("no status of /{d}: {out}"))
            .to_string()
    };
    assert_eq!(status_of("plain"), "0", "setuid without options: {out}");
    assert_eq!(status_of("nodev"), "0", "{out}");
    assert_eq!(status_of("nosuid"), "232", "nosuid: {out}");
    assert_eq!(status_of("noexec"), "126", "noexec: {out}");
    assert_eq!(status_of("all"), "126", "{out}");

    // The device node opens only where nodev is not asked for.
    let (_, out) = e
        .sh(
            &id,
            "for d in plain nosuid noexec nodev all; do echo x > /$d/null && echo $d=W; done",
        )
        .await;
    let wrote: Vec<&str> = out.lines().filter_map(|l| l.strip_suffix("=W")).collect();
    assert_eq!(wrote, ["plain", "nosuid", "noexec"], "{out}");

    // The mounts as the container sees them.
    let (code, out) = e.sh(&id, "cat /proc/self/mountinfo").await;
    assert_eq!(code, 0, "{out}");
    let flags = |at: &str| -> Vec<String> {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some(at))
            .unwrap_or_else(|| panic!("{at} not mounted: {out}"));
        let opts = line.split_whitespace().nth(5).unwrap_or_default();
        ["nosuid", "nodev", "noexec"]
            .into_iter()
            .filter(|f| opts.split(',').any(|o| o == *f))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(flags("/plain"), Vec::<String>::new());
    assert_eq!(flags("/nosuid"), ["nosuid"]);
    assert_eq!(flags("/nodev"), ["nodev"]);
    assert_eq!(flags("/noexec"), ["noexec"]);
    assert_eq!(flags("/all"), ["nosuid", "nodev", "noexec"]);

    // Anything else is refused naming the option, bounded, and leaves no
    // container behind.
    for (options, field, said) in [
        (
            vec!["nodev".to_string(), "exec".to_string()],
            "config.mounts[1].mount_options[1]",
            "\"exec\"",
        ),
        (
            vec!["x".repeat(100_000)],
            "config.mounts[1].mount_options[0]",
            "over the limit",
        ),
        (
            vec![format!("noexec,{}", "y".repeat(40))],
            "config.mounts[1].mount_options[0]",
            "unknown bind mount option",
        ),
    ] {
        let mut c = container_config("bad", &e.image);
        c.mounts = vec![mount("/plain", &[]), mount("/hard", &[])];
        c.mounts[1].mount_options = options;
        let err = e.create(&pod, c).await.unwrap_err();
        assert_refused(&err, &[Code::InvalidArgument], field);
        assert!(err.message().contains(said), "{err}");
    }
    let listed = crust_test_support::cri::list_containers(&mut e.rt).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    e.remove_pod(&pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mount_options_embedded() {
    mount_options("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mount_options_runc() {
    require!(Need::Runc);
    mount_options("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mount_options_crun() {
    require!(Need::Crun);
    mount_options("crun").await;
}

// ---------------------------------------------------------------------------
// Bidirectional propagation

/// A temp dir bind-mounted on itself and made shared (what Bidirectional
/// needs on the host side); unmounted on drop.
struct SharedDir(tempfile::TempDir);

impl SharedDir {
    fn new() -> SharedDir {
        use nix::mount::{MsFlags, mount};
        let dir = tempfile::tempdir().unwrap();
        mount(
            Some(dir.path()),
            dir.path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let d = SharedDir(dir);
        mount(
            None::<&str>,
            d.0.path(),
            None::<&str>,
            MsFlags::MS_SHARED,
            None::<&str>,
        )
        .unwrap();
        d
    }
}

impl Drop for SharedDir {
    fn drop(&mut self) {
        for _ in 0..4 {
            let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

async fn bidirectional(handler: &str) {
    let mut e = env().await;
    let shared = SharedDir::new();
    let mount = |name: &str| v1::Mount {
        container_path: format!("/{name}"),
        host_path: shared.0.path().display().to_string(),
        propagation: v1::MountPropagation::PropagationBidirectional as i32,
        ..Default::default()
    };
    let pod = e.pod("bidi", handler, true).await;
    // Not privileged, even with CAP_SYS_ADMIN: refused, naming the mount.
    let mut c = container_config("plain", &e.image);
    c.mounts = vec![
        v1::Mount {
            container_path: "/h2c".into(),
            host_path: shared.0.path().display().to_string(),
            propagation: v1::MountPropagation::PropagationHostToContainer as i32,
            ..Default::default()
        },
        mount("shared"),
    ];
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .capabilities = Some(v1::Capability {
        add_capabilities: vec!["CAP_SYS_ADMIN".into()],
        ..Default::default()
    });
    let before = mounts_under(&e.d.run_dir).len();
    let err = e.create(&pod, c.clone()).await.unwrap_err();
    assert_refused(
        &err,
        &[Code::InvalidArgument],
        "config.mounts[1].propagation",
    );
    assert_eq!(mounts_under(&e.d.run_dir).len(), before);

    // HostToContainer alone stays allowed.
    c.mounts.truncate(1);
    let id = e.run(&pod, c).await;
    let (code, out) = e.sh(&id, "ls /h2c && echo OK").await;
    assert_eq!(code, 0, "{out}");

    // Privileged: allowed, and a mount made inside shows on the host.
    let mut c = container_config("priv", &e.image);
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .privileged = true;
    c.mounts = vec![mount("shared")];
    let id = e.run(&pod, c).await;
    let (code, out) = e
        .sh(
            &id,
            "mkdir -p /shared/sub && mount -t tmpfs t /shared/sub && echo OK",
        )
        .await;
    assert_eq!((code, out.trim()), (0, "OK"));
    let seen = mounts_under(shared.0.path());
    let (code, out) = e.sh(&id, "umount /shared/sub").await;
    assert_eq!(code, 0, "{out}");
    assert!(seen.contains(&shared.0.path().join("sub")), "{seen:?}");
    e.remove_pod(&pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bidirectional_propagation_embedded() {
    bidirectional("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bidirectional_propagation_runc() {
    require!(Need::Runc);
    bidirectional("runc").await;
}

// ---------------------------------------------------------------------------
// Magic-link working dirs

async fn magic_link_working_dir(handler: &str) {
    let mut e = env().await;
    let wd_image = with_workdir(
        one_layer_image(&base_layer().finish(), &["sleep", "1000"]),
        "/proc/self/fd/7",
    );
    let wd_ref = e.push("workdir", &wd_image).await;
    // A working dir that is an image's symlink to one.
    let link_image = with_workdir(
        one_layer_image(
            &base_layer()
                .symlink("w", "/proc/self/fd/7")
                .dir("srv/")
                .symlink("srv/up", "../../../proc/1/cwd")
                .finish(),
            &["sleep", "1000"],
        ),
        "/w",
    );
    let link_ref = e.push("workdir-link", &link_image).await;
    let pod = e.pod("cwd", handler, false).await;
    let before = mounts_under(&e.d.run_dir).len();
    for (i, dir) in [
        "/proc/self/fd/7",
        "/proc/1/cwd",
        "/proc/thread-self/root/x",
        "/dev/fd/5",
    ]
    .iter()
    .enumerate()
    {
        let mut c = container_config(&format!("c{i}"), &e.image);
        c.working_dir = dir.to_string();
        let err = e.create(&pod, c).await.unwrap_err();
        assert_refused(&err, &[Code::InvalidArgument], "config.working_dir");
    }
    for (name, image) in [("img", &wd_ref), ("link", &link_ref)] {
        let c = container_config(name, image);
        let err = e.create(&pod, c).await.unwrap_err();
        assert_refused(
            &err,
            &[Code::InvalidArgument, Code::FailedPrecondition],
            "image.config.WorkingDir",
        );
    }
    let mut c = container_config("link-req", &link_ref);
    c.working_dir = "/srv/up/x".into();
    let err = e.create(&pod, c).await.unwrap_err();
    assert_refused(&err, &[Code::InvalidArgument], "config.working_dir");
    assert_eq!(mounts_under(&e.d.run_dir).len(), before);
    // A plain working dir still works.
    let mut c = container_config("ok", &e.image);
    c.working_dir = "/tmp".into();
    let id = e.run(&pod, c).await;
    let (code, out) = e.sh(&id, "pwd").await;
    assert_eq!((code, out.trim()), (0, "/tmp"));
    e.remove_pod(&pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn magic_link_working_dir_embedded() {
    magic_link_working_dir("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn magic_link_working_dir_runc() {
    require!(Need::Runc);
    magic_link_working_dir("runc").await;
}

// ---------------------------------------------------------------------------
// Images whose mount points are symlinks

/// Every entry under `dir`, recursively (to see that nothing was created).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

async fn rootfs_symlinks_out(handler: &str) {
    let mut e = env().await;
    // Where the links point: a host dir of the test's own, which must stay
    // as it is (empty but for a marker file).
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("marker"), b"host\n").unwrap();
    let out = |name: &str| outside.path().join(name).display().to_string();
    let pod = e.pod("links", handler, false).await;
    let cases: Vec<(&str, LayerTar)> = vec![
        ("proc", base_layer().symlink("proc", &out("proc"))),
        ("sys", base_layer().symlink("sys", &out("sys"))),
        ("dev", base_layer().symlink("dev", &out("dev"))),
        (
            "shm",
            base_layer().dir("dev/").symlink("dev/shm", &out("shm")),
        ),
    ];
    for (name, layer) in cases {
        let img = one_layer_image(&layer.finish(), &["sleep", "1000"]);
        let r = e.push(&format!("link-{name}"), &img).await;
        let c = container_config(name, &r);
        let before = mounts_under(&e.d.run_dir).len();
        match e.create(&pod, c).await {
            Err(err) => {
                assert_refused(
                    &err,
                    &[Code::FailedPrecondition, Code::InvalidArgument],
                    "config.image.image",
                );
                assert_eq!(mounts_under(&e.d.run_dir).len(), before, "{name}");
            }
            Ok(id) => {
                // Accepted: then it must run, with nothing outside touched.
                e.rt.start_container(v1::StartContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .unwrap_or_else(|err| panic!("StartContainer of {name}: {err}"));
                let (code, o) = e.sh(&id, "echo OK").await;
                assert_eq!((code, o.trim()), (0, "OK"), "{name}");
            }
        }
        assert_eq!(
            tree(outside.path()),
            vec![outside.path().join("marker")],
            "{name}"
        );
    }
    e.remove_pod(&pod).await;
    assert_eq!(tree(outside.path()), vec![outside.path().join("marker")]);
}

#[tokio::test(flavor = "multi_thread")]
async fn rootfs_symlinks_out_embedded() {
    rootfs_symlinks_out("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rootfs_symlinks_out_runc() {
    require!(Need::Runc);
    rootfs_symlinks_out("runc").await;
}

// ---------------------------------------------------------------------------
// /etc files that are symlinks

async fn etc_file_symlinks(handler: &str) {
    let mut e = env().await;
    let outside = tempfile::tempdir().unwrap();
    let host_file = outside.path().join("hosts");
    std::fs::write(&host_file, b"host file\n").unwrap();
    let layer = base_layer()
        .dir("run/")
        .file("etc/hosts.img", b"image hosts\n")
        .file("run/resolv.img", b"image resolv\n")
        .file("etc/hostname.img", b"image-hostname\n")
        .symlink("etc/hosts", "hosts.img")
        .symlink("etc/resolv.conf", "../run/resolv.img")
        .symlink("etc/hostname", "/etc/hostname.img");
    let inside = e
        .push(
            "etc-inside",
            &one_layer_image(&layer.finish(), &["sleep", "1000"]),
        )
        .await;
    // The same, pointing at a host file by its absolute path.
    let layer = base_layer()
        .symlink("etc/hosts", &host_file.display().to_string())
        .symlink("etc/resolv.conf", &host_file.display().to_string())
        .symlink("etc/hostname", &host_file.display().to_string());
    let out = e
        .push(
            "etc-out",
            &one_layer_image(&layer.finish(), &["sleep", "1000"]),
        )
        .await;
    let pod = e.pod("etc", handler, false).await;
    for (i, image) in [inside, out].into_iter().enumerate() {
        let mut c = container_config(&format!("c{i}"), &image);
        if i == 1 {
            // A read-only rootfs too.
            c.linux
                .as_mut()
                .unwrap()
                .security_context
                .as_mut()
                .unwrap()
                .readonly_rootfs = true;
        }
        let id = e.run(&pod, c).await;
        let (code, o) = e.sh(&id, "cat /etc/hostname").await;
        assert_eq!((code, o.as_str()), (0, "host-etc\n"));
        let (code, o) = e.sh(&id, "cat /etc/hosts").await;
        assert_eq!(code, 0, "{o}");
        assert!(o.contains("localhost"), "the pod's /etc/hosts: {o}");
        let (code, o) = e.sh(&id, "cat /etc/resolv.conf; echo END").await;
        assert_eq!(code, 0, "{o}");
        assert!(!o.contains("image") && !o.contains("host file"), "{o}");
        if i == 0 {
            // The links' targets in the image are untouched.
            let (code, o) = e
                .sh(&id, "cat /etc/hosts.img /run/resolv.img /etc/hostname.img")
                .await;
            assert_eq!(
                (code, o.as_str()),
                (0, "image hosts\nimage resolv\nimage-hostname\n")
            );
        }
    }
    e.remove_pod(&pod).await;
    assert_eq!(std::fs::read(&host_file).unwrap(), b"host file\n");
    assert_eq!(tree(outside.path()), vec![host_file]);
}

#[tokio::test(flavor = "multi_thread")]
async fn etc_file_symlinks_embedded() {
    etc_file_symlinks("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn etc_file_symlinks_runc() {
    require!(Need::Runc);
    etc_file_symlinks("runc").await;
}
