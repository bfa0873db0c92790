//! Hostile images served by a real registry: rejected with a clear error,
//! and nothing created outside the store.

mod common;

use common::*;
use crust_image::ErrorKind;

/// Pulls an image whose second layer is `tar`; returns the error text.
async fn pull_hostile(reg: &Registry, s: &Store, repo: &str, tar: Vec<u8>) -> String {
    let img = build(ImageSpec {
        layers: vec![busybox_layer(), gzip(&tar)],
        ..ImageSpec::default()
    });
    Pusher::new(reg).image(repo, "latest", &img).await;
    let err = s
        .svc
        .pull(&format!("{}/{repo}", reg.host), &anon())
        .await
        .expect_err("a hostile image was accepted");
    assert_eq!(err.kind(), ErrorKind::InvalidContent, "{err}");
    err.to_string()
}

/// A rejected image leaves nothing: no record, no temp file, and none of
/// its blobs or layers (not even the good ones).
fn assert_nothing_kept(s: &Store) {
    assert!(s.svc.list().unwrap().is_empty());
    assert!(s.ingest().is_empty(), "temp files left: {:?}", s.ingest());
    assert!(s.blobs().is_empty(), "blobs left: {:?}", s.blobs());
    assert!(s.layers().is_empty(), "layers left: {:?}", s.layers());
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_layers_are_rejected_and_nothing_escapes() {
    let reg = Registry::start();
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().to_str().unwrap().to_string();
    let s = store().await;
    let depth = "../".repeat(20);

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "traversal",
            LayerTar::new()
                .file(&format!("{depth}{}/evil", &out[1..]), b"x")
                .finish(),
            "'..'",
        ),
        (
            "symlink-escape",
            LayerTar::new()
                .symlink("escape", &out)
                .file("escape/evil", b"x")
                .finish(),
            "symlink",
        ),
        (
            "relative-symlink-escape",
            LayerTar::new()
                .symlink("escape", &format!("{depth}{}", &out[1..]))
                .file("escape/evil", b"x")
                .finish(),
            "symlink",
        ),
        (
            "hardlink-escape",
            LayerTar::new()
                .hardlink("evil", &format!("{depth}etc/passwd"))
                .finish(),
            "'..'",
        ),
        (
            "hardlink-absolute",
            LayerTar::new().hardlink("evil", "/etc/shadow").finish(),
            "not in this layer",
        ),
        (
            "hardlink-through-symlink",
            LayerTar::new()
                .symlink("hostetc", "/etc")
                .hardlink("evil", "hostetc/passwd")
                .finish(),
            "symlink",
        ),
    ];
    for (repo, tar, expect) in cases {
        let err = pull_hostile(&reg, &s, &format!("hostile/{repo}"), tar).await;
        assert!(err.contains(expect), "{repo}: {err}");
        assert!(
            err.contains("sha256:"),
            "{repo}: the error names the layer: {err}"
        );
        assert!(
            std::fs::read_dir(outside.path()).unwrap().next().is_none(),
            "{repo}: wrote outside the store"
        );
        assert_nothing_kept(&s);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn absolute_paths_stay_inside_the_layer() {
    let reg = Registry::start();
    let s = store().await;
    let marker = format!("/tmp/crust-absolute-{}", std::process::id());
    let tar = LayerTar::new().file(&marker, b"inside").finish();
    let img = build(ImageSpec {
        layers: vec![gzip(&tar)],
        ..ImageSpec::default()
    });
    Pusher::new(&reg).image("abs/path", "latest", &img).await;
    let got = s
        .svc
        .pull(&format!("{}/abs/path", reg.host), &anon())
        .await
        .unwrap();
    assert!(!std::path::Path::new(&marker).exists());
    let dirs = s.svc.layer_dirs(&got);
    assert_eq!(
        std::fs::read(dirs[0].join(&marker[1..])).unwrap(),
        b"inside"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_whose_digest_lies_is_rejected() {
    let reg = Registry::start();
    let img = build(ImageSpec::default());
    Pusher::new(&reg).image("lie/digest", "latest", &img).await;
    // The registry now serves other bytes, of the same length, for the layer.
    let layer = &img.layers[0];
    let mut forged = layer.bytes.clone();
    let mid = forged.len() / 2;
    forged[mid] ^= 0xff;
    std::fs::write(reg.blob_data_path(&layer.digest()), &forged).unwrap();

    let s = store().await;
    let err = s
        .svc
        .pull(&format!("{}/lie/digest", reg.host), &anon())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidContent, "{err}");
    assert!(err.to_string().contains(&layer.digest()), "{err}");
    assert!(!s.blobs().contains(&layer.digest()[7..].to_string()));
    assert_nothing_kept(&s);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_whose_size_lies_is_rejected() {
    let reg = Registry::start();
    let p = Pusher::new(&reg);
    let s = store().await;
    for (repo, delta, expect) in [
        ("lie/short", -100i64, "more data"),
        ("lie/long", 100, "got"),
    ] {
        let img = build(ImageSpec::default());
        let mut manifest: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
        let size = manifest["layers"][0]["size"].as_i64().unwrap();
        manifest["layers"][0]["size"] = (size + delta).into();
        let lying = TestImage {
            manifest: serde_json::to_vec(&manifest).unwrap(),
            ..img.clone()
        };
        p.image(repo, "latest", &lying).await;
        let err = s
            .svc
            .pull(&format!("{}/{repo}", reg.host), &anon())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidContent, "{repo}: {err}");
        assert!(err.to_string().contains(expect), "{repo}: {err}");
        assert_nothing_kept(&s);
    }
    // A truthful pull of the same layer works, and a later lie about an
    // already-present blob is still caught.
    let img = build(ImageSpec::default());
    p.image("honest/img", "latest", &img).await;
    s.svc
        .pull(&format!("{}/honest/img", reg.host), &anon())
        .await
        .unwrap();
    let err = s
        .svc
        .pull(&format!("{}/lie/long", reg.host), &anon())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("descriptor declares"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_that_lies_about_diff_ids_is_rejected() {
    let reg = Registry::start();
    let mut layer = busybox_layer();
    layer.diff_id = sha(b"not the layer");
    let img = build(ImageSpec {
        layers: vec![layer],
        ..ImageSpec::default()
    });
    Pusher::new(&reg).image("lie/diffid", "latest", &img).await;
    let s = store().await;
    let err = s
        .svc
        .pull(&format!("{}/lie/diffid", reg.host), &anon())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("diff ID"), "{err}");
    assert!(s.layers().is_empty());
    assert_nothing_kept(&s);
}
