//! Pulls from a real registry (docker-registry on 127.0.0.1) of images the
//! tests build themselves.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use crust_image::{ErrorKind, image_user};

/// Layer 2 (zstd) adds files and a dir; layer 3 (uncompressed) deletes
/// /etc/motd with a whiteout and makes /data opaque.
fn three_layer_image() -> TestImage {
    let l2 = LayerTar::new()
        .dir("usr/")
        .file("usr/hello", b"from layer two\n")
        .file_mode("usr/setuid", b"x", 0o4755)
        .finish();
    let l3 = LayerTar::new()
        .file("etc/.wh.motd", b"")
        .dir("data/")
        .file("data/.wh..wh..opq", b"")
        .file("data/new", b"only file in data\n")
        .finish();
    build(ImageSpec {
        layers: vec![busybox_layer(), zstd_layer(&l2), plain(&l3)],
        user: "1002:1002",
        ..ImageSpec::default()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn pulls_a_multi_layer_image_with_whiteouts_and_opaque_dir() {
    let reg = Registry::start();
    let img = three_layer_image();
    Pusher::new(&reg).image("test/multi", "v1", &img).await;
    let s = store().await;

    let reference = format!("{}/test/multi:v1", reg.host);
    let got = s.svc.pull(&reference, &anon()).await.unwrap();
    assert_eq!(got.id, img.id());
    assert_eq!(got.repo_tags, vec![reference.clone()]);
    assert_eq!(
        got.repo_digests,
        vec![format!("{}/test/multi@{}", reg.host, img.manifest_digest())]
    );
    assert_eq!(got.size, img.size());
    assert_eq!(got.config.user, "1002:1002");
    assert_eq!(got.config.cmd, ["sh"]);
    assert_eq!(got.config.working_dir, "/tmp");
    assert_eq!(got.config.volumes, ["/data"]);
    assert_eq!(got.config.labels["test"], "crust");
    assert_eq!(got.platform.architecture, "amd64");
    assert_eq!(got.chain_ids.len(), 3);

    let dirs = s.svc.layer_dirs(&got);
    let (base, two, three) = (&dirs[0], &dirs[1], &dirs[2]);
    let bb = std::fs::metadata(base.join("bin/busybox")).unwrap();
    assert_eq!(bb.len(), std::fs::metadata(BUSYBOX).unwrap().len());
    assert_eq!(bb.mode() & 0o7777, 0o755);
    assert_eq!(bb.nlink(), 2, "bin/cat is a hardlink");
    assert_eq!(
        std::fs::read_link(base.join("bin/sh")).unwrap().to_str(),
        Some("busybox")
    );
    assert_eq!(
        std::fs::read(two.join("usr/hello")).unwrap(),
        b"from layer two\n"
    );
    assert_eq!(
        std::fs::metadata(two.join("usr/setuid")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(
        std::fs::metadata(two.join("usr/hello")).unwrap().mtime(),
        1_704_067_200
    );
    if crust_image::unpack::running_as_root() {
        let wh = std::fs::symlink_metadata(three.join("etc/motd")).unwrap();
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
        let mut buf = [0u8; 4];
        let n = crust_linux::fs::get_xattr(
            &three.join("data"),
            std::ffi::OsStr::new("trusted.overlay.opaque"),
            &mut buf[..],
        );
        assert_eq!(n.unwrap(), 1);
        assert_eq!(&buf[..1], b"y");
    }
    assert!(!three.join("data/.wh..wh..opq").exists());

    // Lookups by every kind of name.
    let short = &img.id()[7..19];
    for q in [
        &got.id[..],
        &got.id[7..],
        short,
        &reference,
        &got.repo_digests[0],
    ] {
        assert_eq!(
            s.svc.get(q).unwrap().map(|i| i.id),
            Some(got.id.clone()),
            "{q}"
        );
    }
    assert_eq!(s.svc.get("nothing:here").unwrap(), None);
    assert_eq!(s.svc.list().unwrap().len(), 1);
    let usage = s.svc.fs_usage().await.unwrap();
    assert!(usage.bytes > 2_000_000 && usage.inodes > 10, "{usage:?}");
    assert_eq!(
        s.svc.config_json(&got).unwrap(),
        img.config,
        "verbose info reads the stored config"
    );

    // Pulling again changes nothing; pulling by digest adds nothing new.
    let again = s.svc.pull(&reference, &anon()).await.unwrap();
    assert_eq!(again, got);
    let by_digest = format!("{}/test/multi@{}", reg.host, img.manifest_digest());
    let d = s.svc.pull(&by_digest, &anon()).await.unwrap();
    assert_eq!(d.id, got.id);
    assert_eq!(d.repo_digests, got.repo_digests);
    assert!(s.ingest().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_schema2_and_tag_plus_digest() {
    let reg = Registry::start();
    let img = build(ImageSpec {
        docker_types: true,
        ..ImageSpec::default()
    });
    Pusher::new(&reg).image("docker/style", "1", &img).await;
    let s = store().await;
    let r = format!("{}/docker/style:1@{}", reg.host, img.manifest_digest());
    let got = s.svc.pull(&r, &anon()).await.unwrap();
    assert_eq!(got.id, img.id());
    assert_eq!(got.repo_tags, vec![format!("{}/docker/style:1", reg.host)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn multi_arch_index_picks_the_host_platform() {
    let reg = Registry::start();
    let other_layer = gzip(&LayerTar::new().file("arch", b"arm64").finish());
    let arm = build(ImageSpec {
        layers: vec![other_layer.clone()],
        arch: "arm64",
        ..ImageSpec::default()
    });
    let host_arch = crust_image::manifest::host_platform().architecture;
    let native = build(ImageSpec {
        arch: &host_arch,
        ..ImageSpec::default()
    });
    let p = Pusher::new(&reg);
    p.image("multi/arch", &arm.manifest_digest(), &arm).await;
    p.image("multi/arch", &native.manifest_digest(), &native)
        .await;
    let idx = index(&[(&arm, "arm64"), (&native, &host_arch)]);
    p.manifest("multi/arch", "latest", OCI_INDEX, &idx).await;

    let s = store().await;
    let got = s
        .svc
        .pull(&format!("{}/multi/arch", reg.host), &anon())
        .await
        .unwrap();
    assert_eq!(got.id, native.id());
    assert_eq!(got.manifest_digest.to_string(), native.manifest_digest());
    assert_eq!(
        got.repo_digests,
        vec![format!("{}/multi/arch@{}", reg.host, sha(&idx))]
    );
    assert_eq!(got.size, native.size() + idx.len() as u64);
    // The other platform's layer was never fetched.
    assert_eq!(reg.count_gets(&other_layer.digest()), 0);
    assert!(!s.blobs().contains(&other_layer.digest()[7..].to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kind_of_image_user_and_shared_layers() {
    let reg = Registry::start();
    let p = Pusher::new(&reg);
    let s = store().await;
    let cases = [
        ("1002", Some(1002), ""),
        ("www-data", None, "www-data"),
        ("1002:1002", Some(1002), ""),
        ("www-data:www-data", None, "www-data"),
        ("1002:group", Some(1002), ""),
    ];
    for (i, (user, uid, name)) in cases.iter().enumerate() {
        let img = build(ImageSpec {
            user,
            ..ImageSpec::default()
        });
        let repo = format!("users/u{i}");
        p.image(&repo, "latest", &img).await;
        let got = s
            .svc
            .pull(&format!("{}/{repo}", reg.host), &anon())
            .await
            .unwrap();
        assert_eq!(got.config.user, *user);
        let u = image_user(&got.config.user);
        assert_eq!((u.uid, u.username.as_str()), (*uid, *name), "{user}");
    }
    // Five images, one base layer: downloaded and unpacked once.
    assert_eq!(s.layers().len(), 1);
    assert_eq!(reg.count_gets(&busybox_layer().digest()), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_pulls_of_one_image_run_once() {
    let reg = Registry::start();
    let img = three_layer_image();
    Pusher::new(&reg).image("conc/img", "latest", &img).await;
    let s = store().await;
    let reference = format!("{}/conc/img", reg.host);
    let pulls = (0..6).map(|_| {
        let svc = s.svc.clone();
        let r = reference.clone();
        tokio::spawn(async move { svc.pull(&r, &anon()).await })
    });
    for p in futures_util::future::join_all(pulls).await {
        assert_eq!(p.unwrap().unwrap().id, img.id());
    }
    for l in &img.layers {
        assert_eq!(
            reg.count_gets(&l.digest()),
            1,
            "layer fetched more than once"
        );
    }
    assert_eq!(reg.count_gets("/manifests/latest"), 1, "{}", reg.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_is_reported_per_layer() {
    let reg = Registry::start();
    let img = three_layer_image();
    Pusher::new(&reg).image("prog/img", "latest", &img).await;
    let s = store().await;
    let seen = Arc::new(AtomicU64::new(0));
    let seen2 = seen.clone();
    let progress: crust_image::ProgressFn = Arc::new(move |p: crust_image::Progress| {
        assert!(p.done <= p.total);
        seen2.fetch_max(p.done, Ordering::Relaxed);
    });
    s.svc
        .pull_with_progress(&format!("{}/prog/img", reg.host), &anon(), Some(progress))
        .await
        .unwrap();
    assert_eq!(
        seen.load(Ordering::Relaxed),
        img.layers[0].bytes.len() as u64
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_images_and_bad_references() {
    let reg = Registry::start();
    let s = store().await;
    let err = s
        .svc
        .pull(&format!("{}/no/such:thing", reg.host), &anon())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = s.svc.pull("Bad/Ref", &anon()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Nothing listens there: the error says why.
    let port = free_port();
    let err = s
        .svc
        .pull(&format!("127.0.0.1:{port}/x:y"), &anon())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(s.svc.list().unwrap().is_empty());
    assert!(s.blobs().is_empty() && s.layers().is_empty() && s.ingest().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_pull_leaves_no_blob_and_the_next_one_works() {
    let reg = Registry::start();
    // A big incompressible layer so the download is still running when cut.
    let noise: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let big = plain(&LayerTar::new().file("noise", &noise).finish());
    let img = build(ImageSpec {
        layers: vec![busybox_layer(), big],
        ..ImageSpec::default()
    });
    Pusher::new(&reg).image("cut/img", "latest", &img).await;
    let s = store().await;
    let reference = format!("{}/cut/img", reg.host);
    let cut = tokio::time::timeout(
        std::time::Duration::from_millis(150),
        s.svc.pull(&reference, &anon()),
    )
    .await;
    assert!(cut.is_err(), "pull finished before it could be interrupted");
    // Dropping the pull cancels unpacks at their next entry; give a running
    // one a moment to notice.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(s.ingest().is_empty(), "temp files left: {:?}", s.ingest());
    assert!(
        s.layers().iter().all(|l| !l.starts_with(".tmp")),
        "half-unpacked layer left: {:?}",
        s.layers()
    );
    for blob in s.blobs() {
        let bytes = std::fs::read(s.root.path().join("content/blobs/sha256").join(&blob)).unwrap();
        assert_eq!(sha(&bytes)[7..], blob, "a visible blob is incomplete");
    }
    let got = s.svc.pull(&reference, &anon()).await.unwrap();
    assert_eq!(got.id, img.id());
}
