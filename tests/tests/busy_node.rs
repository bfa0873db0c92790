//! A busy node (issue 27, defect 6): lookups with openat2 `RESOLVE_IN_ROOT`
//! that go through `..` answer EAGAIN whenever a mount or a rename happens
//! anywhere on the system meanwhile. Under the harness's noisy neighbour
//! (crates/test-support `noisy`), which mounts and renames all the time, the
//! answers must stay what they are on an idle node: a client's bad image
//! sub path is InvalidArgument, never `Internal: ... Resource temporarily
//! unavailable`.
//!
//! The lookups climb on purpose, as a hostile image may: a chain of
//! symlinks that each go up 31 levels before naming the next one, resolved
//! in a freshly mounted overlay as an image volume is (a cold cache: the
//! kernel walks it the slow way, with references, where a mount anywhere
//! makes `..` answer EAGAIN). Under the default noise about one lookup in
//! four needs a retry (measured: 13 retries in 50 lookups).

use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::noisy;
use crust_test_support::registry::*;
use crust_test_support::tonic::Code;
use crust_test_support::{
    Daemon, Need, WithImage, container_config, create_container, daemon_with_image,
    host_network_pod, mounts_under, require, run_pod,
};

/// Links in the chain (the kernel follows at most 40 in one lookup).
const LINKS: usize = 16;

/// `(name, target)` of the chain: `s0` -> `../../…/s1` -> … -> `missing`.
fn chain() -> Vec<(String, String)> {
    (0..LINKS)
        .map(|i| {
            let next = if i + 1 == LINKS {
                "missing".to_string()
            } else {
                format!("s{}", i + 1)
            };
            (format!("s{i}"), format!("{}{next}", "../".repeat(31)))
        })
        .collect()
}

/// How many lookups the in-process test makes.
const LOOKUPS: usize = 200;

/// How many creates each daemon test makes (a refused create costs tens
/// of ms).
const CREATES: usize = 80;

/// crust-linux's own lookup in this process, as the daemon makes it: a
/// fresh read-only overlay (crust-linux's image volume mount), the sub path
/// resolved in it, the overlay unmounted.
#[test]
fn resolve_in_root_answers_invalid_argument_under_noise() {
    let _noise = noisy::always();
    let dir = tempfile::tempdir().unwrap();
    let (lower, empty, target) = (
        dir.path().join("lower"),
        dir.path().join("empty"),
        dir.path().join("target"),
    );
    for d in [&lower, &empty, &target] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::create_dir_all(lower.join("data")).unwrap();
    std::os::unix::fs::symlink("../../../../../etc", lower.join("data/up")).unwrap();
    for (name, target) in chain() {
        std::os::unix::fs::symlink(target, lower.join(name)).unwrap();
    }
    // Unmounted even when an assertion fails.
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = crust_linux::mounts::unmount(self.0);
        }
    }
    // Let the neighbour get going.
    std::thread::sleep(Duration::from_millis(50));
    let retried = crust_linux::retry::retried();
    let start = Instant::now();
    let mut wrong = Vec::new();
    for i in 0..LOOKUPS {
        crust_linux::mounts::mount_overlay_readonly(std::slice::from_ref(&lower), &empty, &target)
            .unwrap();
        let _mounted = Unmount(&target);
        let sub = if i % 4 == 3 { "data/up" } else { "s0" };
        match crust_linux::mounts::resolve_in_root(&target, sub) {
            Err(e) if e.is_invalid_argument() => {}
            other => wrong.push(format!("lookup {i} of {sub:?}: {other:?}")),
        }
    }
    // How many single attempts the noise spoiled, for the record.
    eprintln!(
        "{LOOKUPS} lookups in {:?}: {} retries, {} answered wrong, neighbour {:?}",
        start.elapsed(),
        crust_linux::retry::retried() - retried,
        wrong.len(),
        noisy::shared_counts()
    );
    assert!(
        wrong.is_empty(),
        "{} of {LOOKUPS} lookups answered wrong, the first: {}",
        wrong.len(),
        wrong[0]
    );
}

/// The image volume's `image_sub_path` through the real daemon: the chain
/// and a link that points up, each resolved in the image's mount.
async fn image_sub_path_under_noise(handler: &str) {
    let _noise = noisy::always();
    let mut layer = LayerTar::new()
        .dir("data/")
        .file("data/file", b"data\n")
        .symlink("data/up", "../../../../../etc");
    for (name, target) in chain() {
        layer = layer.symlink(&name, &target);
    }
    let image = one_layer_image(&layer.finish(), &["/none"]);
    let WithImage {
        daemon: d,
        registry: _reg,
        image,
    } = daemon_with_image(Daemon::builder(), "test/climbing", &image).await;
    let mut rt = d.runtime_v1().await;
    let pod = run_pod(&mut rt, host_network_pod("busy", "crust-test"), handler).await;
    let before = mounts_under(&d.run_dir).len();
    let start = Instant::now();
    let mut wrong = Vec::new();
    for i in 0..CREATES {
        let sub = if i % 4 == 3 { "data/up" } else { "s0" };
        let mut c = container_config(&format!("c{i}"), &image);
        c.mounts = vec![v1::Mount {
            container_path: "/x".into(),
            image: Some(v1::ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            image_sub_path: sub.into(),
            readonly: true,
            ..Default::default()
        }];
        let err = create_container(&mut rt, &pod, c)
            .await
            .expect_err("a sub path that leads nowhere is refused");
        let answer = (err.code(), err.message().split(':').next().unwrap_or(""));
        if answer != (Code::InvalidArgument, "config.mounts[0].image_sub_path") {
            wrong.push(format!("create {i} ({sub:?}): {err}"));
        }
    }
    eprintln!(
        "{handler}: {CREATES} refused creates in {:?}, {} answered wrong, neighbour {:?}",
        start.elapsed(),
        wrong.len(),
        noisy::shared_counts()
    );
    assert!(
        wrong.is_empty(),
        "{} of {CREATES} creates answered wrong, the first: {}",
        wrong.len(),
        wrong[0]
    );
    assert_eq!(
        mounts_under(&d.run_dir).len(),
        before,
        "a refused create leaves no mount"
    );
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn image_sub_path_under_noise_embedded() {
    image_sub_path_under_noise("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_sub_path_under_noise_runc() {
    require!(Need::Runc);
    image_sub_path_under_noise("runc").await;
}
