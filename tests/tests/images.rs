//! The CRI ImageService and `crust images` end to end: the real daemon
//! pulling from a real registry (Debian's docker-registry on 127.0.0.1) the
//! small images these tests build and push themselves.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crust_test_support::crust_api::{v1, v1alpha2};
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Request};
use crust_test_support::{Daemon, run_crust};

type ImageClient = v1::image_service_client::ImageServiceClient<Channel>;

/// A daemon whose registry config is `hosts` (an empty dir by default, so
/// the host's /etc/crust/certs.d never leaks into a test).
async fn daemon_with_hosts(hosts: Option<&Path>) -> (Daemon, tempfile::TempDir) {
    let empty = tempfile::tempdir().unwrap();
    let dir = hosts.unwrap_or(empty.path()).to_str().unwrap().to_string();
    let d = Daemon::builder()
        .arg("--registry-config-dir")
        .arg(dir)
        .start()
        .await;
    (d, empty)
}

fn spec(image: &str) -> Option<v1::ImageSpec> {
    Some(v1::ImageSpec {
        image: image.to_string(),
        ..v1::ImageSpec::default()
    })
}

async fn pull(
    c: &mut ImageClient,
    image: &str,
) -> Result<String, crust_test_support::tonic::Status> {
    c.pull_image(v1::PullImageRequest {
        image: spec(image),
        auth: None,
        sandbox_config: None,
    })
    .await
    .map(|r| r.into_inner().image_ref)
}

async fn status(c: &mut ImageClient, image: &str, verbose: bool) -> v1::ImageStatusResponse {
    c.image_status(v1::ImageStatusRequest {
        image: spec(image),
        verbose,
    })
    .await
    .unwrap_or_else(|e| panic!("ImageStatus {image}: {e}"))
    .into_inner()
}

async fn image(c: &mut ImageClient, image: &str) -> Option<v1::Image> {
    status(c, image, false).await.image
}

async fn list(c: &mut ImageClient, filter: Option<&str>) -> Vec<v1::Image> {
    c.list_images(v1::ListImagesRequest {
        filter: filter.map(|f| v1::ImageFilter { image: spec(f) }),
    })
    .await
    .unwrap()
    .into_inner()
    .images
}

async fn remove(c: &mut ImageClient, image: &str) {
    c.remove_image(v1::RemoveImageRequest { image: spec(image) })
        .await
        .unwrap_or_else(|e| panic!("RemoveImage {image}: {e}"));
}

async fn fs_info(c: &mut ImageClient) -> v1::ImageFsInfoResponse {
    c.image_fs_info(v1::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Names in a dir, hidden ones included.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn blobs(d: &Daemon) -> Vec<String> {
    entries(&d.root.join("content/blobs/sha256"))
}

fn layers(d: &Daemon) -> Vec<String> {
    entries(&d.root.join("layers"))
}

fn with_user(user: &str) -> TestImage {
    build(ImageSpec {
        user,
        ..ImageSpec::default()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn pull_list_status_and_remove_by_tag_digest_and_id() {
    let reg = Registry::start();
    let img = with_user("1002:1002");
    let other = build(ImageSpec {
        layers: vec![
            busybox_layer(),
            gzip(&LayerTar::new().file("other", b"o").finish()),
        ],
        ..ImageSpec::default()
    });
    let p = Pusher::new(&reg);
    p.image("test/app", "v1", &img).await;
    p.image("test/app", "v2", &img).await;
    p.image("test/other", "latest", &other).await;
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1().await;
    let tag = format!("{}/test/app:v1", reg.host);
    let tag2 = format!("{}/test/app:v2", reg.host);
    let by_digest = format!("{}/test/app@{}", reg.host, img.manifest_digest());

    assert!(
        image(&mut c, &tag).await.is_none(),
        "absent = nil, no error"
    );
    assert!(list(&mut c, None).await.is_empty());

    // Concurrent pulls of one image: both get it, done once.
    let (mut c1, mut c2) = (c.clone(), c.clone());
    let (a, b) = tokio::join!(pull(&mut c1, &tag), pull(&mut c2, &tag));
    assert_eq!(a.unwrap(), img.id(), "PullImage answers the image ID");
    assert_eq!(b.unwrap(), img.id());
    assert_eq!(pull(&mut c, &tag2).await.unwrap(), img.id());
    let other_tag = format!("{}/test/other", reg.host);
    assert_eq!(pull(&mut c, &other_tag).await.unwrap(), other.id());

    let got = image(&mut c, &tag).await.expect("pulled");
    assert_eq!(got.id, img.id());
    assert_eq!(got.repo_tags, vec![tag.clone(), tag2.clone()]);
    assert_eq!(got.repo_digests, vec![by_digest.clone()]);
    assert_eq!(got.size, img.size());
    assert_eq!(got.uid.map(|u| u.value), Some(1002));
    assert_eq!(got.username, "");
    assert!(!got.pinned);
    // Every kind of reference finds the same image.
    let short_id = img.id()[7..19].to_string();
    for r in [&img.id(), &img.id()[7..], &short_id, &tag2, &by_digest] {
        assert_eq!(image(&mut c, r).await.as_ref(), Some(&got), "{r}");
    }

    // Verbose: containerd's info JSON.
    let verbose = status(&mut c, &tag, true).await;
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    assert_eq!(info["imageSpec"]["config"]["User"], "1002:1002");
    assert_eq!(info["imageSpec"]["architecture"], "amd64");
    assert!(
        info["chainID"].as_str().unwrap().starts_with("sha256:"),
        "{info}"
    );
    assert!(status(&mut c, &tag, false).await.info.is_empty());

    // ListImages and its filter.
    assert_eq!(list(&mut c, None).await.len(), 2);
    let ids = |v: Vec<v1::Image>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
    assert_eq!(ids(list(&mut c, Some(&tag)).await), vec![img.id()]);
    assert_eq!(ids(list(&mut c, Some(&by_digest)).await), vec![img.id()]);
    assert_eq!(ids(list(&mut c, Some(&short_id)).await), vec![img.id()]);
    assert_eq!(ids(list(&mut c, Some(&other_tag)).await), vec![other.id()]);
    let repo = format!("{}/test/app", reg.host);
    assert_eq!(ids(list(&mut c, Some(&repo)).await), vec![img.id()]);
    assert!(list(&mut c, Some("no/such:image")).await.is_empty());

    // Remove by one tag: the image goes with all its names (critest's
    // "removing image by one tag should remove all tags").
    remove(&mut c, &tag).await;
    for r in [&tag, &tag2, &by_digest, &img.id()] {
        assert!(image(&mut c, r).await.is_none(), "{r} still there");
    }
    remove(&mut c, &tag).await;
    remove(&mut c, &img.id()).await;

    // By digest: no tag recorded, the digest reference is.
    assert_eq!(pull(&mut c, &by_digest).await.unwrap(), img.id());
    let got = image(&mut c, &by_digest).await.unwrap();
    assert!(got.repo_tags.is_empty(), "{:?}", got.repo_tags);
    assert_eq!(got.repo_digests, vec![by_digest.clone()]);
    remove(&mut c, &by_digest).await;
    assert!(image(&mut c, &img.id()).await.is_none());

    // By ID.
    remove(&mut c, &other.id()).await;
    assert!(list(&mut c, None).await.is_empty());
    assert!(blobs(&d).is_empty(), "{:?}", blobs(&d));
    assert!(layers(&d).is_empty(), "{:?}", layers(&d));

    // Requests without an image name are refused, naming the field.
    let err = pull(&mut c, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("image"), "{}", err.message());
    let err = c
        .remove_image(v1::RemoveImageRequest { image: None })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread")]
async fn image_users_as_critest_expects() {
    let reg = Registry::start();
    let p = Pusher::new(&reg);
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1().await;
    for (n, (user, uid, username)) in [
        ("1002", Some(1002), ""),
        ("www-data", None, "www-data"),
        ("1002:1002", Some(1002), ""),
        ("www-data:www-data", None, "www-data"),
        ("", None, ""),
    ]
    .into_iter()
    .enumerate()
    {
        let img = with_user(user);
        p.image(&format!("users/u{n}"), "latest", &img).await;
        let r = format!("{}/users/u{n}", reg.host);
        pull(&mut c, &r).await.unwrap();
        let got = image(&mut c, &r).await.unwrap();
        assert_eq!(got.uid.map(|u| u.value), uid, "User {user:?}");
        assert_eq!(got.username, username, "User {user:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pulls_registry_k8s_io_through_a_hosts_toml_mirror() {
    let reg = Registry::start();
    let img = build(ImageSpec::default());
    Pusher::new(&reg)
        .image("e2e-test-images/busybox", "1.29-2", &img)
        .await;
    let hosts = tempfile::tempdir().unwrap();
    let dir = hosts.path().join("registry.k8s.io");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"https://registry.k8s.io\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            reg.host
        ),
    )
    .unwrap();
    let (d, _) = daemon_with_hosts(Some(hosts.path())).await;
    let mut c = d.image_v1().await;
    let r = "registry.k8s.io/e2e-test-images/busybox:1.29-2";
    assert_eq!(pull(&mut c, r).await.unwrap(), img.id());
    let got = image(&mut c, r).await.unwrap();
    assert_eq!(got.repo_tags, vec![r.to_string()]);
    assert_eq!(
        got.repo_digests,
        vec![format!(
            "registry.k8s.io/e2e-test-images/busybox@{}",
            img.manifest_digest()
        )]
    );
    assert!(
        reg.count_gets("/v2/e2e-test-images/busybox/manifests/1.29-2") >= 1,
        "the mirror served it:\n{}",
        reg.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn image_fs_info_follows_pulls_and_removals() {
    let reg = Registry::start();
    let img = build(ImageSpec::default());
    Pusher::new(&reg).image("fs/img", "latest", &img).await;
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1().await;

    let before = fs_info(&mut c).await;
    let usage = |r: &v1::ImageFsInfoResponse| {
        let fs = &r.image_filesystems[0];
        (
            fs.used_bytes.as_ref().unwrap().value,
            fs.inodes_used.as_ref().unwrap().value,
        )
    };
    assert_eq!(before.image_filesystems.len(), 1);
    let fs = &before.image_filesystems[0];
    assert_eq!(
        fs.fs_id.as_ref().unwrap().mountpoint,
        d.root.to_str().unwrap()
    );
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(
        (now_ns - fs.timestamp).abs() < 60_000_000_000,
        "timestamp in ns: {}",
        fs.timestamp
    );
    // The containers' writable-layer filesystem, even with no container.
    assert_eq!(before.container_filesystems.len(), 1);
    let cfs = &before.container_filesystems[0];
    let containers = d.root.join("containers");
    assert_eq!(
        cfs.fs_id.as_ref().unwrap().mountpoint,
        containers.to_str().unwrap()
    );
    assert!(containers.is_dir());
    assert!(cfs.inodes_used.as_ref().unwrap().value >= 1);

    pull(&mut c, &format!("{}/fs/img", reg.host)).await.unwrap();
    let after = fs_info(&mut c).await;
    let (b0, i0) = usage(&before);
    let (b1, i1) = usage(&after);
    let busybox = std::fs::metadata(BUSYBOX).unwrap().len();
    assert!(
        b1 >= b0 + busybox,
        "bytes {b0} -> {b1} (busybox alone is {busybox})"
    );
    assert!(i1 >= i0 + 8, "inodes {i0} -> {i1}");
    assert!(after.image_filesystems[0].timestamp >= fs.timestamp);

    remove(&mut c, &img.id()).await;
    let (b2, i2) = usage(&fs_info(&mut c).await);
    assert!(b2 < b1 && i2 < i1, "{b1}/{i1} -> {b2}/{i2}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_image_is_refused_clearly_and_leaves_nothing() {
    let reg = Registry::start();
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().to_str().unwrap().to_string();
    let traversal = LayerTar::new()
        .file(&format!("{}{}/evil", "../".repeat(20), &out[1..]), b"x")
        .finish();
    let escape = LayerTar::new()
        .symlink("escape", &out)
        .file("escape/evil", b"x")
        .finish();
    let p = Pusher::new(&reg);
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1().await;
    for (repo, tar, expect) in [
        ("evil/dots", traversal, "'..'"),
        ("evil/link", escape, "symlink"),
    ] {
        let img = build(ImageSpec {
            layers: vec![busybox_layer(), gzip(&tar)],
            ..ImageSpec::default()
        });
        p.image(repo, "latest", &img).await;
        let r = format!("{}/{repo}", reg.host);
        let err = pull(&mut c, &r).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let msg = err.message();
        assert!(msg.contains(&r), "names the reference: {msg}");
        assert!(msg.contains(expect), "says what is wrong: {msg}");
        assert!(
            msg.contains(&img.layers[1].digest()),
            "names the layer: {msg}"
        );
        assert!(
            std::fs::read_dir(outside.path()).unwrap().next().is_none(),
            "{repo} wrote outside the store"
        );
        assert!(list(&mut c, None).await.is_empty());
        assert!(blobs(&d).is_empty(), "{repo}: blobs left {:?}", blobs(&d));
        assert!(
            layers(&d).is_empty(),
            "{repo}: layers left {:?}",
            layers(&d)
        );
        assert!(entries(&d.root.join("content/ingest")).is_empty());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_from_the_auth_config_and_unknown_images() {
    let reg = Registry::start_with(RegistryAuth::Basic {
        user: "alice".into(),
        password: "s3cret-pw".into(),
    });
    let img = build(ImageSpec::default());
    Pusher::new(&reg)
        .with_basic("alice", "s3cret-pw")
        .image("private/app", "v1", &img)
        .await;
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1().await;
    let r = format!("{}/private/app:v1", reg.host);
    let pull_as = |user: &str, password: &str| v1::PullImageRequest {
        image: spec(&r),
        auth: Some(v1::AuthConfig {
            username: user.into(),
            password: password.into(),
            ..v1::AuthConfig::default()
        }),
        sandbox_config: None,
    };

    let err = pull(&mut c, &r).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let err = c.pull_image(pull_as("alice", "wrong")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let got = c.pull_image(pull_as("alice", "s3cret-pw")).await.unwrap();
    assert_eq!(got.into_inner().image_ref, img.id());
    assert!(
        !d.logs().contains("s3cret-pw"),
        "the password reached the log"
    );

    // An image the registry does not have.
    let missing = format!("{}/private/none:v1", reg.host);
    let mut req = pull_as("alice", "s3cret-pw");
    req.image = spec(&missing);
    let err = c.pull_image(req).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains(&missing), "{}", err.message());
    // Nothing listens there: Unavailable.
    let port = free_port();
    let err = pull(&mut c, &format!("127.0.0.1:{port}/x/y:z"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let err = pull(&mut c, "Not A Reference").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pull_past_its_deadline_fails_and_the_next_one_works() {
    let reg = Registry::start();
    let img = build(ImageSpec::default());
    Pusher::new(&reg).image("slow/img", "latest", &img).await;
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1().await;
    let r = format!("{}/slow/img", reg.host);
    let mut req = Request::new(v1::PullImageRequest {
        image: spec(&r),
        auth: None,
        sandbox_config: None,
    });
    req.set_timeout(Duration::from_millis(1));
    let err = c.pull_image(req).await.unwrap_err();
    // Go clients see DeadlineExceeded (their own deadline fires first);
    // tonic's server reports its expiry of `grpc-timeout` as Cancelled.
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err}"
    );
    assert_eq!(pull(&mut c, &r).await.unwrap(), img.id());
    assert!(entries(&d.root.join("content/ingest")).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_flows_over_v1alpha2() {
    let reg = Registry::start();
    let img = with_user("www-data:www-data");
    Pusher::new(&reg).image("old/api", "v1", &img).await;
    let (d, _hosts) = daemon_with_hosts(None).await;
    let mut c = d.image_v1alpha2().await;
    let r = format!("{}/old/api:v1", reg.host);
    let spec = |image: &str| {
        Some(v1alpha2::ImageSpec {
            image: image.into(),
            ..v1alpha2::ImageSpec::default()
        })
    };
    let status = |image: Option<v1alpha2::ImageSpec>, verbose: bool| v1alpha2::ImageStatusRequest {
        image,
        verbose,
    };

    let none = c.image_status(status(spec(&r), false)).await.unwrap();
    assert!(none.into_inner().image.is_none());
    let pulled = c
        .pull_image(v1alpha2::PullImageRequest {
            image: spec(&r),
            auth: Some(v1alpha2::AuthConfig::default()),
            sandbox_config: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pulled.image_ref, img.id());

    let got = c
        .image_status(status(spec(&r), true))
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&got.info["info"]).unwrap();
    assert_eq!(info["imageSpec"]["config"]["User"], "www-data:www-data");
    let got = got.image.unwrap();
    assert_eq!(got.id, img.id());
    assert_eq!(got.repo_tags, vec![r.clone()]);
    assert_eq!(got.username, "www-data");
    assert!(got.uid.is_none());

    let listed = c
        .list_images(v1alpha2::ListImagesRequest {
            filter: Some(v1alpha2::ImageFilter { image: spec(&r) }),
        })
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, img.id());

    let fs = c
        .image_fs_info(v1alpha2::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fs.image_filesystems.len(), 1);
    assert!(fs.image_filesystems[0].used_bytes.as_ref().unwrap().value > 0);

    for _ in 0..2 {
        c.remove_image(v1alpha2::RemoveImageRequest { image: spec(&r) })
            .await
            .unwrap();
    }
    let gone = c
        .image_status(status(spec(&img.id()), false))
        .await
        .unwrap();
    assert!(gone.into_inner().image.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn images_survive_a_daemon_restart() {
    let reg = Registry::start();
    let img = with_user("1002");
    Pusher::new(&reg).image("keep/me", "v1", &img).await;
    let (mut d, _hosts) = daemon_with_hosts(None).await;
    let r = format!("{}/keep/me:v1", reg.host);
    let mut c = d.image_v1().await;
    pull(&mut c, &r).await.unwrap();
    let before = image(&mut c, &r).await.unwrap();
    let layers_before = layers(&d);
    drop(c);

    d.restart().await;
    let mut c = d.image_v1().await;
    assert_eq!(image(&mut c, &r).await, Some(before.clone()));
    assert_eq!(list(&mut c, None).await, vec![before]);
    assert_eq!(layers(&d), layers_before, "GC at start keeps used layers");
    // And pulling again is a no-op that answers the same ID.
    assert_eq!(pull(&mut c, &r).await.unwrap(), img.id());
    remove(&mut c, &r).await;
    assert!(layers(&d).is_empty());
}

fn crust_images(d: &Daemon, args: &[&str]) -> std::process::Output {
    let socket = d.socket.to_str().unwrap();
    let mut all = vec!["images", "--socket", socket];
    all.extend_from_slice(args);
    run_crust(&all)
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ok(o: std::process::Output) -> String {
    assert!(
        o.status.success(),
        "crust failed: {}\nstdout: {}\nstderr: {}",
        o.status,
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(&o)
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn the_crust_images_commands() {
    let reg = Registry::start_with(RegistryAuth::Basic {
        user: "ops".into(),
        password: "pw:with:colons".into(),
    });
    let img = build(ImageSpec {
        layers: vec![
            busybox_layer(),
            zstd_layer(&LayerTar::new().file("cli", b"cli").finish()),
        ],
        ..ImageSpec::default()
    });
    Pusher::new(&reg)
        .with_basic("ops", "pw:with:colons")
        .image("cli/app", "v1", &img)
        .await;
    let (d, _hosts) = daemon_with_hosts(None).await;
    let r = format!("{}/cli/app:v1", reg.host);

    // pull: needs the credentials; progress goes to stderr, the result to
    // stdout.
    let out = crust_images(&d, &["pull", &r]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Unauthenticated"), "{err}");
    let out = crust_images(&d, &["pull", &r, "--creds", "ops:pw:with:colons"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = ok(out);
    assert!(text.contains(&img.id()), "{text}");
    for layer in &img.layers {
        let short = &layer.digest()[..19];
        assert!(
            stderr.contains(short),
            "a line per layer ({short}): {stderr}"
        );
    }

    // ls
    let text = ok(crust_images(&d, &["ls"]));
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("IMAGE") && header.contains("IMAGE ID"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("{}/cli/app ", reg.host)))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains(" v1 ") && row.contains(&img.id()[7..20]),
        "{row}"
    );
    assert_eq!(ok(crust_images(&d, &["ls", "-q"])).trim(), img.id());

    // import: an OCI layout (gzip) and a docker save archive.
    let work = tempfile::tempdir().unwrap();
    let offline = build(ImageSpec {
        layers: vec![
            busybox_layer(),
            gzip(&LayerTar::new().file("offline", b"1").finish()),
        ],
        user: "1002",
        ..ImageSpec::default()
    });
    let oci = write_file(
        work.path(),
        "oci.tar.gz",
        &gzip(&oci_layout(&offline, "example.com/offline/app:1")).bytes,
    );
    let text = ok(crust_images(&d, &["import", oci.to_str().unwrap()]));
    assert!(text.contains("example.com/offline/app:1"), "{text}");
    assert!(text.contains(&offline.id()), "{text}");
    let extra = LayerTar::new().file("saved", b"s").finish();
    let (save, saved_id) = docker_save(&[busybox_tar(), extra], &["saved/app:v2"]);
    let save = write_file(work.path(), "save.tar", &save);
    // A relative path works too (from any working dir, `..` enough times
    // is `/`): the CLI hands the daemon an absolute one.
    let rel = format!("{}{}", "../".repeat(32), &save.to_str().unwrap()[1..]);
    let text = ok(crust_images(&d, &["import", &rel]));
    assert!(text.contains("docker.io/saved/app:v2"), "{text}");
    assert!(text.contains(&saved_id), "{text}");
    let mut c = d.image_v1().await;
    let got = image(&mut c, "example.com/offline/app:1").await.unwrap();
    assert_eq!(got.uid.map(|u| u.value), Some(1002));
    assert!(image(&mut c, "saved/app:v2").await.is_some());
    let text = ok(crust_images(&d, &["ls"]));
    assert_eq!(text.lines().count(), 4, "{text}");

    let bad = write_file(work.path(), "junk.tar", b"not an archive");
    let out = crust_images(&d, &["import", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("junk.tar"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // rm: by tag and by ID; an unknown image is an error naming it.
    let text = ok(crust_images(&d, &["rm", &r, &saved_id]));
    assert!(text.contains(&format!("Deleted: {r}")), "{text}");
    assert!(text.contains("Deleted: docker.io/saved/app:v2"), "{text}");
    let out = crust_images(&d, &["rm", "nothing/here:v1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such image nothing/here:v1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // prune: removes what is left (no container uses it).
    let text = ok(crust_images(&d, &["prune"]));
    assert!(
        text.contains("Deleted: example.com/offline/app:1"),
        "{text}"
    );
    assert!(text.contains("1 images removed"), "{text}");
    assert!(ok(crust_images(&d, &["ls", "-q"])).trim().is_empty());
    assert!(blobs(&d).is_empty() && layers(&d).is_empty());

    // No daemon there: a clear error.
    let out = run_crust(&["images", "--socket", "/nonexistent/crust.sock", "ls"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is the daemon running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
