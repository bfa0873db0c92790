//! Pod security features kubelet 1.36 uses (issue 13), end to end through the
//! real daemon on the embedded and runc handlers: supplemental groups policy,
//! image volumes, user namespaces, CDI devices. Every check is made from
//! inside the container or on the host side of what it did.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Status};
use crust_test_support::{
    Daemon, DaemonBuilder, Need, WithImage, container_config, container_status, daemon_with_image,
    exec_sync, host_network_pod, mounts_under, pull_image, require,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type Ic = v1::image_service_client::ImageServiceClient<Channel>;

/// busybox with a user `app` (1000) that /etc/group puts in `extra` (50000).
fn base_image() -> TestImage {
    let layer = busybox_with(&[
        "sh", "cat", "id", "sleep", "echo", "touch", "ls", "stat", "mkdir", "true", "env",
    ])
    .dir("etc/")
    .file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n",
    )
    .file("etc/group", b"root:x:0:\napp:x:1000:\nextra:x:50000:app\n")
    .dir("tmp/")
    .dir("data/")
    .finish();
    one_layer_image(&layer, &["sleep", "1000"])
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

async fn env_with(builder: DaemonBuilder) -> Env {
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(builder, "test/base", &base_image()).await;
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

async fn env() -> Env {
    env_with(Daemon::builder()).await
}

use crust_test_support::Pod;

impl Env {
    fn pod_config(&self, name: &str) -> v1::PodSandboxConfig {
        v1::PodSandboxConfig {
            hostname: format!("host-{name}"),
            log_directory: self.logs.path().join(name).display().to_string(),
            ..host_network_pod(name, "crust-test")
        }
    }

    async fn try_pod(
        &mut self,
        config: v1::PodSandboxConfig,
        handler: &str,
    ) -> Result<Pod, Status> {
        let id = self
            .rt
            .run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id;
        Ok((id, config))
    }

    async fn pod(&mut self, name: &str, handler: &str) -> Pod {
        let config = self.pod_config(name);
        self.try_pod(config, handler)
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
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
    }

    fn container(&self, name: &str) -> v1::ContainerConfig {
        container_config(name, &self.image)
    }

    async fn create(&mut self, pod: &Pod, config: v1::ContainerConfig) -> Result<String, Status> {
        crust_test_support::create_container(&mut self.rt, pod, config).await
    }

    async fn run(&mut self, pod: &Pod, config: v1::ContainerConfig) -> String {
        crust_test_support::run_container(&mut self.rt, pod, config).await
    }

    async fn exec(&mut self, id: &str, cmd: &[&str]) -> (i32, String, String) {
        exec_sync(&mut self.rt, id, cmd, 20).await
    }

    async fn sh(&mut self, id: &str, script: &str) -> (i32, String) {
        let (code, out, err) = self.exec(id, &["sh", "-c", script]).await;
        (code, format!("{out}{err}"))
    }

    async fn status(&mut self, id: &str) -> (v1::ContainerStatus, HashMap<String, String>) {
        let r = container_status(&mut self.rt, id).await;
        (r.status.unwrap(), r.info)
    }

    async fn pid_of(&mut self, id: &str) -> i32 {
        let (_, info) = self.status(id).await;
        let v: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
        v["pid"].as_i64().unwrap() as i32
    }

    /// The first log line of container `name` in `pod`, waiting for it.
    async fn first_log_line(&self, pod: &Pod, name: &str) -> String {
        let path = Path::new(&pod.1.log_directory).join(format!("{name}.log"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if let Some(line) = text.lines().next() {
                // <time> stdout F <text>
                return line.splitn(4, ' ').nth(3).unwrap_or_default().to_string();
            }
            assert!(Instant::now() < deadline, "no log line in {path:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn assert_clean(&self) {
        assert_eq!(
            mounts_under(&self.d.run_dir),
            Vec::<std::path::PathBuf>::new()
        );
    }
}

fn field_of(e: &Status) -> &str {
    e.message().split(':').next().unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Supplemental groups policy

async fn supplemental_groups_policy(handler: &str) {
    let mut e = env().await;
    let status =
        e.rt.status(v1::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    assert!(
        status.features.unwrap().supplemental_groups_policy,
        "Status advertises supplemental_groups_policy"
    );
    let pod = e.pod("sgp", handler).await;
    for (name, policy, want) in [
        (
            "merge",
            v1::SupplementalGroupsPolicy::Merge,
            "1000 1234 50000",
        ),
        ("strict", v1::SupplementalGroupsPolicy::Strict, "1000 1234"),
    ] {
        let mut c = e.container(name);
        c.command = vec!["sh".into(), "-c".into(), "id -G; exec sleep 1000".into()];
        let sc = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
        sc.run_as_user = Some(v1::Int64Value { value: 1000 });
        sc.supplemental_groups = vec![1234];
        sc.supplemental_groups_policy = policy as i32;
        let id = e.run(&pod, c).await;
        assert_eq!(
            e.first_log_line(&pod, name).await,
            want,
            "{name}: first process"
        );
        let (_, out, _) = e.exec(&id, &["id", "-G"]).await;
        assert_eq!(out.trim(), want, "{name}: exec'd process");
        let pid = e.pid_of(&id).await;
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let groups = st.lines().find(|l| l.starts_with("Groups:")).unwrap();
        assert_eq!(
            groups
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" "),
            want
        );
        let (st, _) = e.status(&id).await;
        let u = st.user.unwrap().linux.unwrap();
        let mut groups = u.supplemental_groups.clone();
        groups.sort();
        let want: Vec<i64> = want.split(' ').map(|g| g.parse().unwrap()).collect();
        assert_eq!(
            (u.uid, u.gid, groups),
            (1000, 1000, want),
            "{name}: status.user"
        );
    }
    let mut c = e.container("bad");
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .supplemental_groups_policy = 7;
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        field_of(&err),
        "config.linux.security_context.supplemental_groups_policy"
    );
    e.remove_pod(&pod).await;
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn supplemental_groups_policy_embedded() {
    supplemental_groups_policy("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn supplemental_groups_policy_runc() {
    supplemental_groups_policy("runc").await;
}

// ---------------------------------------------------------------------------
// Image volumes

/// A two-layer "artifact" (the second layer overrides a file of the first)
/// with symlinks that point up and out, and a one-layer one.
fn artifact_images() -> (TestImage, TestImage) {
    let bottom = LayerTar::new()
        .dir("data/")
        .dir("data/sub/")
        .file("data/sub/file", b"from layer 1\n")
        .file("data/top", b"top\n")
        .finish();
    let top = LayerTar::new()
        .dir("data/")
        .dir("data/sub/")
        .file("data/sub/file", b"from layer 2\n")
        .symlink("data/up", "../../../../../etc")
        .symlink("data/abs", "/data/sub")
        .finish();
    let two = build(ImageSpec {
        layers: vec![gzip(&bottom), gzip(&top)],
        ..ImageSpec::default()
    });
    let one = build(ImageSpec {
        layers: vec![gzip(&LayerTar::new().file("only", b"one layer\n").finish())],
        ..ImageSpec::default()
    });
    (two, one)
}

fn image_volume(path: &str, image: &str, sub: &str) -> v1::Mount {
    v1::Mount {
        container_path: path.into(),
        image: Some(v1::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        image_sub_path: sub.into(),
        // Asked writable: mounted read-only all the same.
        readonly: false,
        ..Default::default()
    }
}

async fn image_volumes(handler: &str) {
    let mut e = env().await;
    let (two, one) = artifact_images();
    let reg = Pusher::new(&e.reg);
    reg.image("test/artifact", "v1", &two).await;
    reg.image("test/one", "v1", &one).await;
    let two_ref = format!("{}/test/artifact:v1", e.reg.host);
    let one_ref = format!("{}/test/one:v1", e.reg.host);
    let two_id = pull_image(&mut e.ic, &two_ref).await;
    pull_image(&mut e.ic, &one_ref).await;
    assert_eq!(two_id, two.id());
    let pod = e.pod("imgvol", handler).await;

    let mut c = e.container("reader");
    c.mounts = vec![
        image_volume("/vol", &two_ref, ""),
        image_volume("/sub", &two_ref, "data/sub"),
        // An absolute symlink is read inside the image.
        image_volume("/abs", &two_ref, "data/abs"),
        image_volume("/one", &one_ref, ""),
    ];
    let id = e.run(&pod, c).await;
    let (code, out) = e
        .sh(
            &id,
            "cat /vol/data/sub/file /vol/data/top /sub/file /abs/file /one/only",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        "from layer 2\ntop\nfrom layer 2\nfrom layer 2\none layer\n"
    );
    for dir in ["/vol", "/sub", "/one"] {
        let (code, out) = e.sh(&id, &format!("touch {dir}/new && echo WROTE")).await;
        assert!(
            code != 0 && !out.contains("WROTE"),
            "{dir} is read-only: {out}"
        );
    }
    let (st, _) = e.status(&id).await;
    let m = &st.mounts[0];
    let img = m.image.as_ref().unwrap();
    assert_eq!(
        (img.image.as_str(), img.image_ref.as_str()),
        (two_id.as_str(), two_id.as_str())
    );
    assert_eq!(img.user_specified_image, two_ref);
    assert!(m.readonly, "{m:?}");
    // The image status kubelet asks for with that digest.
    let found =
        e.ic.image_status(v1::ImageStatusRequest {
            image: Some(v1::ImageSpec {
                image: img.image.clone(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .image
        .unwrap();
    assert_eq!(found.id, two_id);

    // The image cannot go while the container uses it.
    let err =
        e.ic.remove_image(v1::RemoveImageRequest {
            image: Some(v1::ImageSpec {
                image: two_ref.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("image volume"), "{err}");

    // Refusals, each leaving nothing behind.
    let before = mounts_under(&e.d.run_dir).len();
    let cases: Vec<(v1::Mount, Code, &str)> = vec![
        (
            image_volume("/x", &two_ref, "../etc"),
            Code::InvalidArgument,
            "config.mounts[0].image_sub_path",
        ),
        (
            image_volume("/x", &two_ref, "/data"),
            Code::InvalidArgument,
            "config.mounts[0].image_sub_path",
        ),
        // A symlink pointing up ends at the image's root: no /etc there.
        (
            image_volume("/x", &two_ref, "data/up"),
            Code::InvalidArgument,
            "config.mounts[0].image_sub_path",
        ),
        (
            image_volume("/x", &two_ref, "data/missing"),
            Code::InvalidArgument,
            "config.mounts[0].image_sub_path",
        ),
        (
            image_volume("/x", &format!("{}/test/absent:v1", e.reg.host), ""),
            Code::NotFound,
            "config.mounts[0].image",
        ),
    ];
    for (i, (m, code, field)) in cases.into_iter().enumerate() {
        let mut c = e.container(&format!("bad{i}"));
        c.mounts = vec![m];
        let err = e.create(&pod, c).await.unwrap_err();
        assert_eq!((err.code(), field_of(&err)), (code, field), "{err}");
    }
    assert_eq!(
        mounts_under(&e.d.run_dir).len(),
        before,
        "a refused create leaves no mount"
    );

    e.remove_pod(&pod).await;
    e.assert_clean();
    // Released with the container: now it can be removed.
    e.ic.remove_image(v1::RemoveImageRequest {
        image: Some(v1::ImageSpec {
            image: two_ref.clone(),
            ..Default::default()
        }),
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volumes_embedded() {
    image_volumes("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volumes_runc() {
    image_volumes("runc").await;
}

/// `ImageSpec.image_ref` of an image volume (a digest, as ContainerStatus
/// reports it, KEP-5365) pins what is mounted: the image it names or none.
async fn image_volume_refs(handler: &str) {
    let mut e = env().await;
    let (two, one) = artifact_images();
    let reg = Pusher::new(&e.reg);
    reg.image("test/artifact", "v1", &two).await;
    reg.image("test/one", "v1", &one).await;
    let two_ref = format!("{}/test/artifact:v1", e.reg.host);
    let one_ref = format!("{}/test/one:v1", e.reg.host);
    let two_id = pull_image(&mut e.ic, &two_ref).await;
    pull_image(&mut e.ic, &one_ref).await;
    let two_digest = format!("{}/test/artifact@{}", e.reg.host, two.manifest_digest());
    let pod = e.pod("imgref", handler).await;
    let pinned = |image: &str, image_ref: &str| {
        let mut m = image_volume("/vol", image, "");
        m.image.as_mut().unwrap().image_ref = image_ref.into();
        m
    };

    // By image ID and by digest reference; `image` gone while the pinned
    // content is here: the pinned image is mounted.
    let absent = format!("{}/test/absent:v1", e.reg.host);
    for (i, (image, image_ref)) in [
        (&two_ref, &two_id),
        (&two_ref, &two_digest),
        (&absent, &two_id),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = e.container(&format!("pinned{i}"));
        c.mounts = vec![pinned(image, image_ref)];
        let id = e.run(&pod, c).await;
        let (code, out) = e.sh(&id, "cat /vol/data/sub/file").await;
        assert_eq!((code, out.as_str()), (0, "from layer 2\n"), "{image_ref}");
        let (st, _) = e.status(&id).await;
        assert_eq!(st.mounts[0].image.as_ref().unwrap().image_ref, two_id);
    }

    // Refusals name the field and leave nothing behind.
    let before = mounts_under(&e.d.run_dir).len();
    let missing = format!("sha256:{}", "0".repeat(64));
    let cases: Vec<(v1::Mount, Code, &str)> = vec![
        // `image` names another image than the pinned one.
        (
            pinned(&one_ref, &two_id),
            Code::InvalidArgument,
            "config.mounts[0].image.image_ref",
        ),
        (
            pinned(&two_ref, &missing),
            Code::NotFound,
            "config.mounts[0].image.image_ref",
        ),
        // A tag pins nothing.
        (
            pinned(&two_ref, &one_ref),
            Code::InvalidArgument,
            "config.mounts[0].image.image_ref",
        ),
        (
            pinned("", &two_id),
            Code::InvalidArgument,
            "config.mounts[0].image.image",
        ),
    ];
    for (i, (m, code, field)) in cases.into_iter().enumerate() {
        let mut c = e.container(&format!("bad{i}"));
        c.mounts = vec![m];
        let err = e.create(&pod, c).await.unwrap_err();
        assert_eq!((err.code(), field_of(&err)), (code, field), "{err}");
        assert!(err.message().len() <= 1024, "{err}");
    }
    assert_eq!(
        mounts_under(&e.d.run_dir).len(),
        before,
        "a refused create leaves no mount"
    );
    let listed = crust_test_support::cri::list_containers(&mut e.rt).await;
    assert_eq!(listed.len(), 3, "{listed:?}");
    e.remove_pod(&pod).await;
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volume_refs_embedded() {
    image_volume_refs("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volume_refs_runc() {
    require!(Need::Runc);
    image_volume_refs("runc").await;
}

// ---------------------------------------------------------------------------
// User namespaces

const USERNS_HOST_ID: u32 = 200_000;

fn userns_pod(
    e: &Env,
    name: &str,
    uids: Vec<v1::IdMapping>,
    mode: v1::NamespaceMode,
) -> v1::PodSandboxConfig {
    let mut config = e.pod_config(name);
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
        mode: mode as i32,
        uids: uids.clone(),
        gids: uids,
    });
    config
}

fn mapping(container_id: u32, host_id: u32, length: u32) -> v1::IdMapping {
    v1::IdMapping {
        container_id,
        host_id,
        length,
    }
}

/// A tmpfs mounted by the test (an emptyDir with medium Memory), unmounted
/// on drop, also when the test fails.
struct TestTmpfs(tempfile::TempDir);

impl TestTmpfs {
    fn new() -> TestTmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs");
        TestTmpfs(dir)
    }
}

impl Drop for TestTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// A `v5.channel.k8s.io` WebSocket session (exec or attach): stdin (then
/// its close), everything until the server closes; stdout and the status.
async fn ws_session(url: &str, stdin: Option<&[u8]>) -> (String, String) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    if let Some(data) = stdin {
        ws.send(Message::binary([&[0u8][..], data].concat()))
            .await
            .unwrap();
        ws.send(Message::binary(vec![255, 0])).await.unwrap();
    }
    let (mut out, mut status) = (Vec::new(), Vec::new());
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("the session ends in time");
        match msg {
            Some(Ok(Message::Binary(b))) if !b.is_empty() => match b[0] {
                1 => out.extend_from_slice(&b[1..]),
                3 => status.extend_from_slice(&b[1..]),
                _ => {}
            },
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{e}"),
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&status).into_owned(),
    )
}

/// `(uid, gid)` of a host path.
fn owner(p: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    (m.uid(), m.gid())
}

async fn user_namespaces(handler: &str) {
    use std::os::unix::fs::PermissionsExt;
    let mut e = env().await;
    // hostUsers: false pods with their own network (the node's network:
    // userns_host_network below).
    let _net = crust_test_support::TestNetwork::install(&e.d, &[]);
    let status =
        e.rt.status(v1::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    let h = status
        .runtime_handlers
        .iter()
        .find(|h| h.name == handler)
        .unwrap();
    assert!(h.features.unwrap().user_namespaces, "{h:?}");

    // Volumes as kubelet makes them, owned by the host's root and readable
    // by it alone: a dir (hostPath / emptyDir on disk), a tmpfs (emptyDir
    // medium Memory, Secrets), a single file (a ConfigMap key, subPath).
    let vol = tempfile::tempdir().unwrap();
    std::fs::write(vol.path().join("owned"), "host root's\n").unwrap();
    std::fs::set_permissions(
        vol.path().join("owned"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let mem = TestTmpfs::new();
    let file = vol.path().join("config-file");
    std::fs::write(&file, "key=value\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let good = vec![mapping(0, USERNS_HOST_ID, 65536)];
    let config = userns_pod(&e, "userns", good.clone(), v1::NamespaceMode::Pod);
    let pod = e
        .try_pod(config, handler)
        .await
        .unwrap_or_else(|err| panic!("RunPodSandbox: {err}"));
    let pod_ns = pod
        .1
        .linux
        .as_ref()
        .unwrap()
        .security_context
        .as_ref()
        .unwrap()
        .namespace_options
        .clone();
    let idmapped = |host: &Path, container: &str| v1::Mount {
        container_path: container.into(),
        host_path: host.display().to_string(),
        uid_mappings: good.clone(),
        gid_mappings: good.clone(),
        ..Default::default()
    };
    let mut c = e.container("main");
    c.command = vec![
        "sh".into(),
        "-c".into(),
        "echo started as $(id -u); exec sleep 1000".into(),
    ];
    c.mounts = vec![
        idmapped(vol.path(), "/vol"),
        idmapped(mem.0.path(), "/mem"),
        idmapped(&file, "/etc/config-file"),
    ];
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options = pod_ns.clone();
    let id = e.run(&pod, c).await;
    // The log is written on the host side.
    assert_eq!(e.first_log_line(&pod, "main").await, "started as 0");

    let (_, out, _) = e.exec(&id, &["cat", "/proc/self/uid_map"]).await;
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields, ["0", "200000", "65536"], "{out}");
    let (_, out, _) = e.exec(&id, &["id", "-u"]).await;
    assert_eq!(out.trim(), "0");
    // Root inside owns its rootfs (id-mapped layers, the writable layer
    // given to the mapped root): it can write, and the host sees the
    // mapped uid.
    let (code, out) = e
        .sh(&id, "echo hi > /tmp/written && ls -ln /tmp/written")
        .await;
    assert_eq!(code, 0, "{out}");
    let pid = e.pid_of(&id).await;
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    assert_eq!(
        map.split_whitespace().collect::<Vec<_>>(),
        ["0", "200000", "65536"]
    );
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = st.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(uid_line.contains("200000"), "{uid_line}");
    assert_eq!(
        owner(Path::new(&format!("/proc/{pid}/root/tmp/written"))),
        (USERNS_HOST_ID, USERNS_HOST_ID)
    );

    // Volumes are id-mapped: the host's root-owned files are root's inside
    // (a 0600 file is readable), and what root writes inside is the host
    // root's on the host, as kubelet expects (KEP-127).
    let (code, out) = e
        .sh(
            &id,
            "stat -c %u:%g /vol/owned /mem /etc/config-file && cat /vol/owned /etc/config-file \
             && echo new > /vol/new && echo new > /mem/new && mkdir /vol/d",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "0:0\n0:0\n0:0\nhost root's\nkey=value\n",
        "id-mapped volumes"
    );
    for p in [
        vol.path().join("new"),
        vol.path().join("d"),
        mem.0.path().join("new"),
    ] {
        assert_eq!(owner(&p), (0, 0), "{p:?}");
    }

    // /proc, /sys (of the pod's network namespace), /dev/shm and the pod's
    // /etc files work from inside.
    let (code, out) = e
        .sh(
            &id,
            "cat /etc/hostname && grep -c Uid /proc/self/status && ls /sys/class/net \
             && echo x > /dev/shm/x && cat /dev/shm/x && test -s /etc/hosts \
             && test -e /etc/resolv.conf && echo ok",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("host-userns\n1\n"), "{out}");
    assert!(out.contains("eth0") && out.ends_with("x\nok\n"), "{out}");

    // Exec and attach through the streaming server join the namespace.
    let url =
        e.rt.exec(v1::ExecRequest {
            container_id: id.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "id -u; cat /proc/self/uid_map".into(),
            ],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|err| panic!("Exec: {err}"))
        .into_inner()
        .url;
    let (out, _) = ws_session(&url, None).await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["0", "0", "200000", "65536"],
        "{out}"
    );
    let mut c = e.container("answer");
    c.command = vec![
        "sh".into(),
        "-c".into(),
        "read l; echo got $l as $(id -u)".into(),
    ];
    c.stdin = true;
    c.stdin_once = true;
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options = pod_ns.clone();
    let answer = e.run(&pod, c).await;
    let url =
        e.rt.attach(v1::AttachRequest {
            container_id: answer,
            stdin: true,
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|err| panic!("Attach: {err}"))
        .into_inner()
        .url;
    let (out, _) = ws_session(&url, Some(b"hello\n")).await;
    assert_eq!(out, "got hello as 0\n");

    // Mount mappings other than the pod's are refused, naming the field.
    let mut c = e.container("badmount");
    let mut m = idmapped(vol.path(), "/vol");
    m.gid_mappings = vec![mapping(0, USERNS_HOST_ID + 1, 65536)];
    c.mounts = vec![m];
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(
        (err.code(), field_of(&err)),
        (Code::InvalidArgument, "config.mounts[0].gidMappings"),
        "{err}"
    );
    // ... and so are id-mapped mounts in a pod without a user namespace.
    let plain = e.pod("plain", handler).await;
    let mut c = e.container("idmapped");
    c.mounts = vec![idmapped(vol.path(), "/vol")];
    let err = e.create(&plain, c).await.unwrap_err();
    assert_eq!(
        (err.code(), field_of(&err)),
        (Code::InvalidArgument, "config.mounts[0].uidMappings"),
        "{err}"
    );
    e.remove_pod(&plain).await;

    // Refusals name the field and leave nothing behind.
    const F: &str = "config.linux.security_context.namespace_options.userns_options";
    let cases = [
        (
            vec![mapping(0, 1000, 10), mapping(10, 2000, 10)],
            v1::NamespaceMode::Pod,
            format!("{F}.uids"),
        ),
        (
            vec![mapping(1, 1000, 100000)],
            v1::NamespaceMode::Pod,
            format!("{F}.uids"),
        ),
        (vec![], v1::NamespaceMode::Container, format!("{F}.mode")),
        (vec![], v1::NamespaceMode::Target, format!("{F}.mode")),
    ];
    for (i, (uids, mode, field)) in cases.into_iter().enumerate() {
        let config = userns_pod(&e, &format!("bad{i}"), uids, mode);
        let err = e.try_pod(config, handler).await.unwrap_err();
        assert_eq!(
            (err.code(), field_of(&err)),
            (Code::InvalidArgument, field.as_str()),
            "{err}"
        );
    }
    e.remove_pod(&pod).await;
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn user_namespaces_embedded() {
    user_namespaces("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn user_namespaces_runc() {
    require!(Need::Runc);
    user_namespaces("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn user_namespaces_crun() {
    require!(Need::Crun);
    user_namespaces("crun").await;
}

/// The names of the network interfaces `/sys/class/net` lists.
fn interfaces(listing: &str) -> Vec<String> {
    let mut v: Vec<String> = listing.split_whitespace().map(str::to_string).collect();
    v.sort();
    v
}

/// A user namespace pod on the node's network (kubelet 1.36's
/// UserNamespacesHostNetworkSupport): root inside is the mapping's first
/// host ID, the container sees the node's interfaces through the node's
/// /sys, bound read-only (its user namespace cannot mount sysfs for the
/// node's network namespace).
async fn userns_host_network(handler: &str) {
    let mut e = env().await;
    let status =
        e.rt.status(v1::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    let features = status.features.unwrap();
    assert!(features.user_namespaces_host_network, "{features:?}");

    let good = vec![mapping(0, USERNS_HOST_ID, 65536)];
    let mut config = userns_pod(&e, "usernshost", good.clone(), v1::NamespaceMode::Pod);
    let set_ns = |config: &mut v1::PodSandboxConfig, f: &dyn Fn(&mut v1::NamespaceOption)| {
        f(config
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options
            .as_mut()
            .unwrap())
    };
    set_ns(&mut config, &|o| o.network = v1::NamespaceMode::Node as i32);
    let pod = e
        .try_pod(config.clone(), handler)
        .await
        .unwrap_or_else(|err| panic!("RunPodSandbox: {err}"));
    let mut c = e.container("main");
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    let id = e.run(&pod, c).await;

    let (_, out, _) = e.exec(&id, &["cat", "/proc/self/uid_map"]).await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["0", "200000", "65536"],
        "{out}"
    );
    let (_, out, _) = e.exec(&id, &["id", "-u"]).await;
    assert_eq!(out.trim(), "0");
    // The node's network namespace and interfaces, in a user namespace of
    // the pod's own.
    let pid = e.pid_of(&id).await;
    let ns = |p: String| std::fs::read_link(p).unwrap();
    assert_eq!(
        ns(format!("/proc/{pid}/ns/net")),
        ns("/proc/self/ns/net".into())
    );
    assert_ne!(
        ns(format!("/proc/{pid}/ns/user")),
        ns("/proc/self/ns/user".into())
    );
    // Other tests add and remove veths meanwhile: compared while the
    // node's list holds still.
    let host = || {
        let names: Vec<String> = std::fs::read_dir("/sys/class/net")
            .unwrap()
            .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        interfaces(&names.join(" "))
    };
    for attempt in 0.. {
        let before = host();
        let (code, out) = e.sh(&id, "ls /sys/class/net").await;
        assert_eq!(code, 0, "{out}");
        if before != host() && attempt < 20 {
            continue;
        }
        assert_eq!(interfaces(&out), before);
        assert!(before.len() > 1, "the node has more than lo: {before:?}");
        break;
    }
    // The node's hostname (its UTS namespace goes with its network).
    let (_, out, _) = e.exec(&id, &["cat", "/proc/sys/kernel/hostname"]).await;
    assert_eq!(
        out.trim(),
        nix::unistd::gethostname().unwrap().to_string_lossy()
    );
    // /sys: the node's sysfs, read-only, not writable by the container's
    // root; /proc, /sys/fs/cgroup and /dev/shm work.
    let (code, out) = e.sh(&id, "grep ' /sys ' /proc/self/mountinfo").await;
    assert_eq!(code, 0, "{out}");
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert!(
        fields[5].split(',').any(|o| o == "ro") && out.contains(" - sysfs "),
        "{out}"
    );
    let (code, out) = e
        .sh(
            &id,
            "echo change > /sys/kernel/uevent_helper || mkdir /sys/x || echo refused",
        )
        .await;
    assert!(code == 0 && out.contains("refused"), "{out}");
    let (code, out) = e
        .sh(
            &id,
            "ls /sys/fs/cgroup >/dev/null && grep -c Uid /proc/self/status \
             && echo x > /dev/shm/x && cat /dev/shm/x",
        )
        .await;
    assert_eq!((code, out.as_str()), (0, "1\nx\n"), "{out}");

    // The node's IPC or PID namespace stays refused with a user namespace.
    const F: &str = "config.linux.security_context.namespace_options.userns_options.mode";
    for (i, host) in [
        (|o: &mut v1::NamespaceOption| o.ipc = v1::NamespaceMode::Node as i32)
            as fn(&mut v1::NamespaceOption),
        |o: &mut v1::NamespaceOption| o.pid = v1::NamespaceMode::Node as i32,
    ]
    .into_iter()
    .enumerate()
    {
        let mut bad = userns_pod(
            &e,
            &format!("usernshost{i}"),
            good.clone(),
            v1::NamespaceMode::Pod,
        );
        set_ns(&mut bad, &|o| o.network = v1::NamespaceMode::Node as i32);
        set_ns(&mut bad, &|o| host(o));
        let err = e.try_pod(bad, handler).await.unwrap_err();
        assert_eq!(
            (err.code(), field_of(&err)),
            (Code::InvalidArgument, F),
            "{err}"
        );
    }
    e.remove_pod(&pod).await;
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_host_network_embedded() {
    userns_host_network("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_host_network_runc() {
    require!(Need::Runc);
    userns_host_network("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_host_network_crun() {
    require!(Need::Crun);
    userns_host_network("crun").await;
}

// ---------------------------------------------------------------------------
// CDI devices

async fn cdi_devices(handler: &str) {
    // Spec files as a device plugin or DRA driver writes them: a JSON one in
    // the low-priority dir and a YAML one in the high-priority dir that
    // redefines a device (the later dir wins).
    let cdi = tempfile::tempdir().unwrap();
    let (etc, run) = (cdi.path().join("etc"), cdi.path().join("run"));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&run).unwrap();
    let shared = cdi.path().join("shared");
    std::fs::write(&shared, "from the vendor\n").unwrap();
    std::fs::write(
        etc.join("crust-test.json"),
        format!(
            r#"{{"cdiVersion": "0.6.0", "kind": "crust.test/dev",
                "containerEdits": {{"env": ["CDI_VENDOR=crust"]}},
                "devices": [
                  {{"name": "null0", "containerEdits": {{
                    "env": ["CDI_DEVICE=null0"],
                    "deviceNodes": [{{"path": "/dev/cdi-null", "hostPath": "/dev/null"}}],
                    "mounts": [{{"hostPath": "{}", "containerPath": "/cdi/shared", "options": ["ro", "bind"]}}]
                  }}}},
                  {{"name": "zero0", "containerEdits": {{"env": ["ZERO=from-etc"]}}}}
                ]}}"#,
            shared.display()
        ),
    )
    .unwrap();
    std::fs::write(
        run.join("crust-test.yaml"),
        "cdiVersion: 0.6.0\nkind: crust.test/dev\ndevices:\n- name: zero0\n  containerEdits:\n    env: [ZERO=from-run]\n    deviceNodes:\n    - path: /dev/cdi-zero\n      hostPath: /dev/zero\n      permissions: rw\n",
    )
    .unwrap();
    let mut e = env_with(Daemon::builder().config(&format!(
        "cdi_spec_dirs = [{:?}, {:?}]\n",
        etc.display().to_string(),
        run.display().to_string()
    )))
    .await;
    let pod = e.pod("cdi", handler).await;
    // One device through CDI_devices, one through the annotation kubelet's
    // device manager used before.
    let mut c = e.container("main");
    c.cdi_devices = vec![v1::CdiDevice {
        name: "crust.test/dev=null0".into(),
    }];
    c.annotations.insert(
        "cdi.k8s.io/crust-test".into(),
        "crust.test/dev=zero0".into(),
    );
    let id = e.run(&pod, c).await;
    let (code, out) = e
        .sh(
            &id,
            "stat -c %t:%T /dev/cdi-null /dev/cdi-zero && echo x > /dev/cdi-null \
             && echo x > /dev/cdi-zero && cat /dev/cdi-null && cat /cdi/shared \
             && echo $CDI_VENDOR $CDI_DEVICE $ZERO",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out, "1:3\n1:5\nfrom the vendor\ncrust null0 from-run\n",
        "CDI edits seen from inside"
    );
    let (code, out) = e.sh(&id, "echo y > /cdi/shared").await;
    assert_ne!(code, 0, "the CDI mount is read-only: {out}");

    // An unknown device is InvalidArgument naming the field and the device,
    // and leaves no container behind.
    let mut c = e.container("unknown");
    c.cdi_devices = vec![
        v1::CdiDevice {
            name: "crust.test/dev=null0".into(),
        },
        v1::CdiDevice {
            name: "crust.test/dev=missing".into(),
        },
    ];
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(
        (err.code(), field_of(&err)),
        (Code::InvalidArgument, "config.CDI_devices[1].name"),
        "{err}"
    );
    assert!(err.message().contains("crust.test/dev=missing"), "{err}");
    let mut c = e.container("unknown-annotation");
    c.annotations
        .insert("cdi.k8s.io/x".into(), "crust.test/dev=gone".into());
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(
        err.message()
            .starts_with("config.annotations[\"cdi.k8s.io/x\"]")
            && err.message().contains("crust.test/dev=gone"),
        "{err}"
    );
    let listed = crust_test_support::cri::list_containers(&mut e.rt).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    e.remove_pod(&pod).await;
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn cdi_devices_embedded() {
    cdi_devices("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cdi_devices_runc() {
    require!(Need::Runc);
    cdi_devices("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cdi_devices_crun() {
    require!(Need::Crun);
    cdi_devices("crun").await;
}

// ---------------------------------------------------------------------------
// User namespaces: refusals up front (issue 27)

/// A gid mapping whose length differs from the uid mapping's is refused
/// at RunPodSandbox, naming the field, and leaves no pod behind.
async fn userns_gid_length_differs(handler: &str) {
    let mut e = env().await;
    let _net = crust_test_support::TestNetwork::install(&e.d, &[]);
    let mut config = userns_pod(
        &e,
        "gid-length",
        vec![mapping(0, USERNS_HOST_ID, 65536)],
        v1::NamespaceMode::Pod,
    );
    config
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options
        .as_mut()
        .unwrap()
        .userns_options
        .as_mut()
        .unwrap()
        .gids = vec![mapping(0, USERNS_HOST_ID, 1000)];
    let err = e.try_pod(config, handler).await.unwrap_err();
    assert_eq!(
        (err.code(), field_of(&err)),
        (
            Code::InvalidArgument,
            "config.linux.security_context.namespace_options.userns_options.gids"
        ),
        "{err}"
    );
    let pods =
        e.rt.list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
    assert!(pods.is_empty(), "{pods:?}");
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_gid_length_differs_embedded() {
    userns_gid_length_differs("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_gid_length_differs_runc() {
    require!(Need::Runc);
    userns_gid_length_differs("runc").await;
}

/// crust's `--root` under a directory the pod's mapped users cannot search
/// (a 0700 temp dir): RunPodSandbox with a user namespace answers
/// FailedPrecondition naming that directory and its mode, and the daemon
/// said so once at start.
async fn userns_root_not_searchable(handler: &str) {
    use std::os::unix::fs::PermissionsExt;
    let private = tempfile::Builder::new()
        .prefix("crust-private-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut e = env_with(Daemon::builder().root(private.path().join("root"))).await;
    let _net = crust_test_support::TestNetwork::install(&e.d, &[]);
    let config = userns_pod(
        &e,
        "private-root",
        vec![mapping(0, USERNS_HOST_ID, 65536)],
        v1::NamespaceMode::Pod,
    );
    let res = e.try_pod(config, handler).await;
    let dir = private.path().display().to_string();
    match res {
        Ok(pod) => {
            e.remove_pod(&pod).await;
            panic!("RunPodSandbox succeeded under {dir} (0700)");
        }
        Err(err) => {
            assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
            assert!(
                err.message().contains(&dir) && err.message().contains("0700"),
                "{err}"
            );
        }
    }
    let pods =
        e.rt.list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
    assert!(pods.is_empty(), "{pods:?}");
    // A pod without a user namespace runs there as before.
    let plain = e.pod("plain", handler).await;
    e.remove_pod(&plain).await;
    let log = std::fs::read_to_string(&e.d.log).unwrap();
    let warnings = log
        .lines()
        .filter(|l| l.contains("cannot be searched by other users") && l.contains(&dir))
        .count();
    assert_eq!(warnings, 1, "one warning at start naming {dir}:\n{log}");
    e.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_root_not_searchable_embedded() {
    userns_root_not_searchable("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn userns_root_not_searchable_runc() {
    require!(Need::Runc);
    userns_root_not_searchable("runc").await;
}
