//! Remove, GC, leases, prune, restart and import.

mod common;

use std::io::Write;

use common::*;
use crust_image::ErrorKind;

fn extra_layer(name: &str) -> Blob {
    gzip(&LayerTar::new().file(name, name.as_bytes()).finish())
}

/// Two images sharing the busybox base, each with one layer of its own.
async fn two_images(reg: &Registry) -> (TestImage, TestImage) {
    let a = build(ImageSpec {
        layers: vec![busybox_layer(), extra_layer("a")],
        ..ImageSpec::default()
    });
    let b = build(ImageSpec {
        layers: vec![busybox_layer(), extra_layer("b")],
        ..ImageSpec::default()
    });
    let p = Pusher::new(reg);
    p.image("gc/a", "latest", &a).await;
    p.image("gc/b", "latest", &b).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn remove_by_tag_id_and_digest_with_gc() {
    let reg = Registry::start();
    let (a, b) = two_images(&reg).await;
    let s = store().await;
    let ra = format!("{}/gc/a:latest", reg.host);
    let rb = format!("{}/gc/b:latest", reg.host);
    let ia = s.svc.pull(&ra, &anon()).await.unwrap();
    let ib = s.svc.pull(&rb, &anon()).await.unwrap();
    assert_eq!(s.layers().len(), 3);
    // 2 manifests + 2 configs + 3 layers.
    assert_eq!(s.blobs().len(), 7);

    // A second tag on a: removing by one tag removes the image with all its
    // names (as containerd, crictl and critest expect).
    let reg2 = Pusher::new(&reg);
    reg2.image("gc/a", "v2", &a).await;
    let ra2 = format!("{}/gc/a:v2", reg.host);
    s.svc.pull(&ra2, &anon()).await.unwrap();
    assert_eq!(
        s.svc.get(&ia.id).unwrap().unwrap().repo_tags,
        vec![ra.clone(), ra2.clone()]
    );
    assert!(s.svc.remove(&ra).await.unwrap());
    assert_eq!(s.svc.get(&ra2).unwrap(), None);
    assert_eq!(s.svc.get(&ia.id).unwrap(), None);
    // The shared base stays for b.
    assert_eq!(s.layers().len(), 2);
    assert_eq!(s.blobs().len(), 4);
    // Idempotent.
    assert!(!s.svc.remove(&ia.id).await.unwrap());
    assert!(!s.svc.remove(&ra).await.unwrap());

    // By ID.
    s.svc.pull(&ra, &anon()).await.unwrap();
    assert!(s.svc.remove(&ia.id).await.unwrap());
    assert_eq!(s.svc.get(&ra).unwrap(), None);
    assert_eq!(s.layers().len(), 2);

    // By digest reference: the tag goes too.
    let by_digest = format!("{}/gc/b@{}", reg.host, b.manifest_digest());
    assert!(s.svc.remove(&by_digest).await.unwrap());
    assert_eq!(s.svc.get(&ib.id).unwrap(), None);
    assert_eq!(s.svc.get(&rb).unwrap(), None);
    s.svc.pull(&by_digest, &anon()).await.unwrap();
    assert!(s.svc.remove(&by_digest).await.unwrap());
    assert!(s.svc.list().unwrap().is_empty());
    assert!(s.layers().is_empty(), "{:?}", s.layers());
    assert!(s.blobs().is_empty(), "{:?}", s.blobs());
    let usage = s.svc.fs_usage().await.unwrap();
    assert!(usage.inodes < 10, "{usage:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leased_image_can_be_removed_without_breaking_its_container() {
    let reg = Registry::start();
    let (a, _) = two_images(&reg).await;
    let s = store().await;
    let ra = format!("{}/gc/a", reg.host);
    let img = s.svc.pull(&ra, &anon()).await.unwrap();
    let dirs = s.svc.lease("ctr-1", &ra).await.unwrap();
    assert_eq!(dirs, s.svc.layer_dirs(&img));
    assert_eq!(s.svc.leases().unwrap()[0].1.image_id, a.id());

    // Prune skips images in use.
    assert!(s.svc.prune().await.unwrap().is_empty());
    assert!(s.svc.remove(&img.id).await.unwrap());
    assert!(s.svc.list().unwrap().is_empty());
    for d in &dirs {
        assert!(
            d.join(".").is_dir(),
            "leased layer {} was removed",
            d.display()
        );
    }
    // Blobs are not needed by a container and go at once.
    assert!(s.blobs().is_empty());
    s.svc.release("ctr-1").await.unwrap();
    s.svc.release("ctr-1").await.unwrap();
    assert!(s.layers().is_empty());
    let err = s.svc.lease("ctr-2", "no/such:image").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_keeps_pinned_images_and_state_survives_restart() {
    let reg = Registry::start();
    two_images(&reg).await;
    let root = tempfile::tempdir().unwrap();
    let meta = std::sync::Arc::new(crust_store::Store::open(&root.path().join("meta.db")).unwrap());
    let svc = crust_image::ImageService::open(crust_image::Config::new(root.path()), meta.clone())
        .await
        .unwrap();
    let ra = format!("{}/gc/a", reg.host);
    let rb = format!("{}/gc/b", reg.host);
    svc.pull(&ra, &anon()).await.unwrap();
    svc.pull(&rb, &anon()).await.unwrap();
    svc.set_pinned(&ra, true).await.unwrap();
    // Leftovers of a crash: a temp blob and a half-unpacked layer.
    std::fs::write(root.path().join("content/ingest/.tmp-left"), b"x").unwrap();
    std::fs::create_dir_all(root.path().join("layers/.tmp-half/diff")).unwrap();
    drop(svc);

    let svc = crust_image::ImageService::open(crust_image::Config::new(root.path()), meta)
        .await
        .unwrap();
    assert_eq!(svc.list().unwrap().len(), 2);
    assert!(list(&root.path().join("content/ingest")).is_empty());
    assert!(!root.path().join("layers/.tmp-half").exists());
    let pruned = svc.prune().await.unwrap();
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0].repo_tags, vec![format!("{rb}:latest")]);
    let kept = svc.list().unwrap();
    assert!(kept.len() == 1 && kept[0].pinned);
    assert_eq!(list(&root.path().join("layers")).len(), 2);
}

fn write_archive(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn imports_oci_layouts_and_docker_save_archives() {
    let s = store().await;
    let work = tempfile::tempdir().unwrap();

    let img = build(ImageSpec {
        layers: vec![
            busybox_layer(),
            zstd_layer(&LayerTar::new().file("z", b"z").finish()),
        ],
        ..ImageSpec::default()
    });
    let oci = oci_layout(&img, "registry.k8s.io/pause:3.9");
    let gz = gzip(&oci).bytes;
    let path = write_archive(work.path(), "oci.tar.gz", &gz);
    let got = s.svc.import(&path).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, img.id());
    assert_eq!(
        got[0].repo_tags,
        vec!["registry.k8s.io/pause:3.9".to_string()]
    );
    assert!(got[0].repo_digests.is_empty());
    assert!(s.svc.get("registry.k8s.io/pause:3.9").unwrap().is_some());

    let extra = LayerTar::new().file("x", b"x").finish();
    let (save, config_digest) =
        docker_save(&[busybox_tar(), extra, busybox_tar()], &["busybox:saved"]);
    let path = write_archive(work.path(), "save.tar", &save);
    let got = s.svc.import(&path).await.unwrap();
    assert_eq!(got[0].id, config_digest);
    assert_eq!(
        got[0].repo_tags,
        vec!["docker.io/library/busybox:saved".to_string()]
    );
    assert_eq!(got[0].config.user, "www-data");
    assert_eq!(got[0].chain_ids.len(), 3);
    let dirs = s.svc.layer_dirs(&got[0]);
    assert!(dirs[2].join("bin/busybox").is_file());
    // Nothing the archives held beyond the images stays (no stray blobs).
    assert!(s.ingest().is_empty());
    assert_eq!(s.svc.list().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_archives_are_refused() {
    let s = store().await;
    let work = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();

    // A blob stored under a name that is not its digest.
    let img = build(ImageSpec::default());
    let mut layout = oci_layout(&img, "a/b:c");
    let bad = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        let data = b"not what the name says";
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append_data(
            &mut h,
            format!("blobs/sha256/{}", "0".repeat(64)),
            &data[..],
        )
        .unwrap();
        b.into_inner().unwrap()
    };
    // Put the bad blob first (the rest of the layout follows).
    layout = [bad[..bad.len() - 1024].to_vec(), layout].concat();
    let err = s
        .svc
        .import(&write_archive(work.path(), "bad.tar", &layout))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidContent, "{err}");
    assert!(err.to_string().contains("has digest"), "{err}");

    // Paths escaping the archive are only names: nothing lands outside.
    let target = format!(
        "../../../../../../../..{}/escaped",
        outside.path().display()
    );
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    {
        let slot = &mut h.as_old_mut().name;
        slot[..target.len()].copy_from_slice(target.as_bytes());
    }
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let escaping = b.into_inner().unwrap();
    let err = s
        .svc
        .import(&write_archive(work.path(), "escape.tar", &escaping))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidContent, "{err}");
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());

    // An image in the archive with a hostile layer is refused like a pulled one.
    let hostile = LayerTar::new()
        .symlink("esc", outside.path().to_str().unwrap())
        .file("esc/evil", b"x")
        .finish();
    let (save, _) = docker_save(&[hostile], &["evil:latest"]);
    let err = s
        .svc
        .import(&write_archive(work.path(), "evil.tar", &save))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    assert!(s.svc.list().unwrap().is_empty());
    assert!(s.blobs().is_empty(), "{:?}", s.blobs());
    assert!(s.layers().is_empty(), "{:?}", s.layers());

    let err = s
        .svc
        .import(&write_archive(work.path(), "junk.tar", b"junk"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidContent, "{err}");
}

/// A pull that fails for want of a layer (the registry lost it: not bad
/// content, so nothing is collected at once) leaves its documents and the
/// layers it got; `orphans` reports them with their bytes and leaves them,
/// `orphans(true)` removes them, and what images use stays.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_pull_leaves_orphans_that_orphans_reports_and_removes() {
    use crust_image::ContentKind;
    let reg = Registry::start();
    let (a, b) = two_images(&reg).await;
    let s = store().await;
    let ra = format!("{}/gc/a:latest", reg.host);
    s.svc.pull(&ra, &anon()).await.unwrap();
    assert!(s.svc.orphans(false).await.unwrap().is_empty());

    // b's own layer is gone from the registry: its pull fails.
    std::fs::remove_file(reg.blob_data_path(&b.layers[1].digest())).unwrap();
    let rb = format!("{}/gc/b:latest", reg.host);
    let err = s.svc.pull(&rb, &anon()).await.unwrap_err();
    assert_ne!(err.kind(), ErrorKind::InvalidContent, "{err}");
    let found = s.svc.orphans(false).await.unwrap();
    let blobs: Vec<&str> = found
        .iter()
        .filter(|o| o.kind == ContentKind::Blob)
        .map(|o| o.name.as_str())
        .collect();
    // At least b's manifest and config (fetched before any layer).
    for want in [b.manifest_digest(), b.id()] {
        assert!(blobs.contains(&want.as_str()), "{want} not in {found:?}");
    }
    assert!(found.iter().all(|o| o.bytes > 0), "{found:?}");
    assert!(found.iter().all(|o| o.path.exists()), "{found:?}");
    // Reporting changed nothing; a's content is no orphan.
    assert_eq!(s.svc.orphans(false).await.unwrap(), found);
    assert!(!blobs.contains(&a.manifest_digest().as_str()));

    let removed = s.svc.orphans(true).await.unwrap();
    assert_eq!(removed.len(), found.len(), "{removed:?}");
    assert!(removed.iter().all(|o| !o.path.exists()), "{removed:?}");
    assert!(s.svc.orphans(false).await.unwrap().is_empty());
    // a is whole: 1 manifest + 1 config + 2 layers, 2 unpacked layers.
    assert_eq!(s.blobs().len(), 4, "{:?}", s.blobs());
    assert_eq!(s.layers().len(), 2, "{:?}", s.layers());
    s.svc.lease("c1", &ra).await.unwrap();
}

/// A record of the caller's, deleted in release_with's transaction.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Note {
    key: String,
}

impl crust_store::Record for Note {
    const KIND: crust_store::Kind = crust_store::Kind::Meta;
    fn key(&self) -> &str {
        &self.key
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn release_with_commits_the_callers_change_with_the_leases() {
    let reg = Registry::start();
    two_images(&reg).await;
    let root = tempfile::tempdir().unwrap();
    let meta = std::sync::Arc::new(crust_store::Store::open(&root.path().join("meta.db")).unwrap());
    let svc = crust_image::ImageService::open(crust_image::Config::new(root.path()), meta.clone())
        .await
        .unwrap();
    let ra = format!("{}/gc/a", reg.host);
    svc.pull(&ra, &anon()).await.unwrap();
    let dirs = svc.lease("ctr-1", &ra).await.unwrap();
    svc.lease_volume("ctr-1/volume/0", &ra).await.unwrap();
    svc.lease("ctr-2", &ra).await.unwrap();
    meta.put(&Note {
        key: "ctr-1".into(),
    })
    .unwrap();
    svc.release_prefixed_with(&["ctr-1"], &["ctr-1/volume/"], |tx| {
        tx.delete::<Note>("ctr-1").map(drop)
    })
    .await
    .unwrap();
    let holders: Vec<String> = svc.leases().unwrap().into_iter().map(|(h, _)| h).collect();
    assert_eq!(holders, vec!["ctr-2"]);
    assert_eq!(meta.get::<Note>("ctr-1").unwrap(), None);
    // The image still holds the layers: they stay.
    for d in &dirs {
        assert!(d.join(".").is_dir(), "{} was removed", d.display());
    }
}
