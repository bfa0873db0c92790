//! A pull whose download stops making progress is given up after
//! `pull_progress_timeout` with an error naming the blob, the registry and
//! the timeout, leaving no partial blob; a slow download that keeps coming
//! is not. Against a registry of the test's own that stalls mid-blob
//! (`SlowRegistry`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use crust_image::{ErrorKind, ImageService, PullSettings};

async fn store_with_timeout(timeout: Option<Duration>) -> Store {
    store_configured(|c| c.pull_progress_timeout = timeout).await
}

fn settings(svc: &ImageService) -> PullSettings {
    (*svc.pull_settings()).clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_download_is_given_up_with_an_error_naming_it() {
    let img = noise_image(1);
    let layer = img.layers[0].digest();
    assert!(img.layers[0].bytes.len() > 200_000);
    let reg = SlowRegistry::start("test/stall", "v1", &img, BlobPace::StallAfter(100_000));
    let s = store_with_timeout(Some(Duration::from_secs(1))).await;
    let t = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        s.svc.pull(&reg.reference(), &anon()),
    )
    .await
    .expect("the stalled pull ends by itself")
    .unwrap_err();
    let took = t.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let msg = err.to_string();
    for part in [&layer, &reg.host, "1s", "pull_progress_timeout"] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // Nothing half-written stays, and no image was recorded.
    assert!(s.ingest().is_empty(), "{:?}", s.ingest());
    assert!(
        !s.blobs().iter().any(|b| layer.ends_with(b)),
        "{:?}",
        s.blobs()
    );
    assert!(s.svc.list().unwrap().is_empty());

    // Once the registry sends again, the same pull completes.
    reg.set_pace(BlobPace::Full);
    assert_eq!(
        s.svc.pull(&reg.reference(), &anon()).await.unwrap().id,
        img.id()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_download_that_keeps_coming_is_not_given_up() {
    let img = noise_image(1);
    // 3 s in all, never 1 s without a byte.
    let pace = BlobPace::Trickle {
        chunks: 10,
        every: Duration::from_millis(300),
    };
    let reg = SlowRegistry::start("test/trickle", "v1", &img, pace);
    let s = store_with_timeout(Some(Duration::from_secs(1))).await;
    let t = Instant::now();
    let pulled = s.svc.pull(&reg.reference(), &anon()).await.unwrap();
    assert_eq!(pulled.id, img.id());
    assert!(
        t.elapsed() >= Duration::from_millis(2700),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_progress_timeout_a_stalled_download_waits() {
    let img = noise_image(1);
    let reg = SlowRegistry::start("test/off", "v1", &img, BlobPace::StallAfter(1000));
    let s = store_with_timeout(None).await;
    let (reference, creds) = (reg.reference(), anon());
    let pull = tokio::time::timeout(Duration::from_secs(3), s.svc.pull(&reference, &creds));
    assert!(pull.await.is_err(), "the pull must still wait");
    // Dropping the pull cancels it: nothing half-written stays.
    assert!(s.ingest().is_empty(), "{:?}", s.ingest());
}

/// New settings apply to the next pull: the timeout, and how many layers
/// download at once.
#[tokio::test(flavor = "multi_thread")]
async fn pull_settings_can_change_between_pulls() {
    let img = noise_image(3);
    let reg = SlowRegistry::start("test/settings", "v1", &img, BlobPace::StallAfter(1000));
    let s = store_with_timeout(None).await;
    s.svc.set_pull_settings(PullSettings {
        max_concurrent_downloads: 1,
        progress_timeout: Some(Duration::from_secs(1)),
        ..settings(&s.svc)
    });
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        s.svc.pull(&reg.reference(), &anon()),
    )
    .await
    .expect("the new timeout applies")
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(reg.max_blobs_in_flight(), 1);

    s.svc.set_pull_settings(PullSettings {
        max_concurrent_downloads: 3,
        ..settings(&s.svc)
    });
    let err = s.svc.pull(&reg.reference(), &anon()).await.unwrap_err();
    assert!(err.to_string().contains("pull_progress_timeout"), "{err}");
    assert_eq!(reg.max_blobs_in_flight(), 3);
    assert!(s.ingest().is_empty(), "{:?}", s.ingest());
}

/// A mirror that stalls is given up like one that is down: the next host
/// serves the pull.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_mirror_falls_back_to_the_next_host() {
    let img = noise_image(1);
    let upstream = Registry::start();
    Pusher::new(&upstream)
        .image("test/mirror", "v1", &img)
        .await;
    let mirror = SlowRegistry::start("test/mirror", "v1", &img, BlobPace::StallAfter(1000));
    let hosts = tempfile::tempdir().unwrap();
    write_hosts(hosts.path(), &upstream.host, &mirror.host);
    let root = tempfile::tempdir().unwrap();
    let meta = Arc::new(crust_store::Store::open(&root.path().join("meta.db")).unwrap());
    let mut config = crust_image::Config::new(root.path());
    config.registry_config_dir = Some(hosts.path().to_path_buf());
    config.pull_progress_timeout = Some(Duration::from_secs(1));
    let svc = ImageService::open(config, meta).await.unwrap();
    let reference = format!("{}/test/mirror:v1", upstream.host);
    assert_eq!(svc.pull(&reference, &anon()).await.unwrap().id, img.id());
    assert!(mirror.count_requests(&img.layers[0].digest()) >= 1);
}

fn write_hosts(dir: &Path, registry: &str, mirror: &str) {
    let d = dir.join(registry);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{mirror}\"]\n\
             capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();
}
