//! CheckpointContainer through the real daemon: on a node where criu
//! cannot work it says why (FailedPrecondition) and changes nothing; where
//! it works (the VM test bed) it checkpoints a running container, which
//! keeps running.

use std::path::Path;

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::Code;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, DaemonBuilder, Pod, WithImage, container_config, container_status, create_container,
    daemon_with_image, exec_sync, host_network_pod, list_containers, patience, run_container,
    run_crust, run_pod, skipped,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

const HANDLERS: [&str; 2] = ["", "runc"];

fn test_image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep", "echo", "cat", "true", "rm"])
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

struct Env {
    d: Daemon,
    _reg: Registry,
    image: String,
    rt: Rt,
    dir: tempfile::TempDir,
}

async fn env(builder: DaemonBuilder) -> Env {
    let WithImage {
        daemon: d,
        registry,
        image,
    } = daemon_with_image(builder, "test/checkpoint", &test_image()).await;
    let rt = d.runtime_v1().await;
    Env {
        d,
        _reg: registry,
        image,
        rt,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Env {
    /// A pod on `handler` with one running container; (pod, container id).
    async fn running(&mut self, name: &str, handler: &str) -> (Pod, String) {
        let pod = new_pod(self, name, handler).await;
        let id = run_container(&mut self.rt, &pod, container_config("c", &self.image)).await;
        (pod, id)
    }

    async fn checkpoint(
        &mut self,
        id: &str,
        location: &str,
    ) -> Result<(), crust_test_support::tonic::Status> {
        self.rt
            .checkpoint_container(v1::CheckpointContainerRequest {
                container_id: id.into(),
                location: location.into(),
                timeout: 60,
            })
            .await
            .map(|_| ())
    }

    async fn assert_running(&mut self, id: &str) {
        let s = container_status(&mut self.rt, id).await.status.unwrap();
        assert_eq!(
            s.state,
            v1::ContainerState::ContainerRunning as i32,
            "container {id} no longer runs: {s:?}"
        );
    }

    /// Status's verbose `info["checkpoint"]`.
    async fn checkpoint_info(&mut self) -> serde_json::Value {
        let info = self
            .rt
            .status(v1::StatusRequest { verbose: true })
            .await
            .unwrap()
            .into_inner()
            .info;
        serde_json::from_str(&info["checkpoint"]).unwrap()
    }

    /// Whether criu works here; if not, the test is counted as skipped.
    async fn checkpointing_available(&mut self) -> bool {
        let info = self.checkpoint_info().await;
        let available = info["available"] == true;
        if !available {
            skipped(&format!(
                "checkpointing is not available here: {}",
                info["reason"].as_str().unwrap_or("?")
            ));
        }
        available
    }

    fn crust_status(&self) -> String {
        let socket = self.d.socket.display().to_string();
        let out = run_crust(&["status", "--socket", &socket]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Asserts a FailedPrecondition whose message contains `why`, and that
/// nothing was written at `location`.
fn assert_refused(r: Result<(), crust_test_support::tonic::Status>, why: &str, location: &Path) {
    let e = r.expect_err("checkpointing where criu cannot work succeeded");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("checkpointing is not available") && e.message().contains(why),
        "{e:?}"
    );
    assert!(e.message().len() <= 1024, "{}", e.message().len());
    assert!(!location.exists(), "{} was left behind", location.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_where_criu_fails_its_check_is_a_failed_precondition() {
    let mut e = env(Daemon::builder()).await;
    let info = e.checkpoint_info().await;
    if info["available"] == true {
        skipped("criu check passes here: the refusal is tested where it fails (the host)");
        return;
    }
    let reason = info["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("criu check") || reason.contains("not installed"),
        "{reason}"
    );
    assert!(
        e.crust_status()
            .contains(&format!("checkpoint:     unavailable: {reason}")),
        "{}",
        e.crust_status()
    );
    for handler in HANDLERS {
        let (_pod, id) = e
            .running(&format!("refused-{}", handler.len()), handler)
            .await;
        let location = e.dir.path().join(format!("{id}.tar"));
        let r = e.checkpoint(&id, &location.display().to_string()).await;
        assert_refused(r, &reason, &location);
        e.assert_running(&id).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_with_criu_missing_or_disabled_says_why() {
    for (config, why) in [
        (
            "[checkpoint]\ncriu_path = \"/nonexistent/criu\"\n",
            "criu is not installed (checkpoint.criu_path \"/nonexistent/criu\" not found)",
        ),
        ("[checkpoint]\nenable = false\n", "disabled in the config"),
    ] {
        let mut e = env(Daemon::builder().config(config)).await;
        let info = e.checkpoint_info().await;
        assert_eq!(info["available"], false, "{info}");
        assert!(info["reason"].as_str().unwrap().contains(why), "{info}");
        assert!(e.crust_status().contains(why), "{}", e.crust_status());
        let (_pod, id) = e.running("missing", "").await;
        let location = e.dir.path().join("c.tar");
        let r = e.checkpoint(&id, &location.display().to_string()).await;
        assert_refused(r, why, &location);
        e.assert_running(&id).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_bad_requests_are_clear_errors() {
    let mut e = env(Daemon::builder()).await;
    let (_pod, id) = e.running("bad", "").await;
    for (cid, location, code, says) in [
        (
            "no-such-container",
            "/tmp/x.tar",
            Code::NotFound,
            "no-such-container",
        ),
        (id.as_str(), "", Code::InvalidArgument, "location"),
        (
            id.as_str(),
            "relative.tar",
            Code::InvalidArgument,
            "absolute",
        ),
        ("", "/tmp/x.tar", Code::InvalidArgument, "container_id"),
    ] {
        let err = e
            .checkpoint(cid, location)
            .await
            .expect_err("a bad request succeeded");
        assert_eq!(err.code(), code, "{cid:?} {location:?}: {err:?}");
        assert!(err.message().contains(says), "{err:?}");
    }
    let long = format!("/{}", "a".repeat(5000));
    let err = e.checkpoint(&id, &long).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() <= 1024);
    e.assert_running(&id).await;
}

/// The container's counter (a shell variable, written out every 0.2 s).
async fn count(e: &mut Env, id: &str) -> u64 {
    let (code, out, err) = exec_sync(&mut e.rt, id, &["cat", "/tmp/count"], 20).await;
    assert_eq!(code, 0, "{out}{err}");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("count {out:?}"))
}

/// The archive's entries: path -> bytes of the regular files.
fn entries(tar_bytes: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut a = tar::Archive::new(tar_bytes);
    let mut out = std::collections::BTreeMap::new();
    for entry in a.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        out.insert(path.trim_end_matches('/').to_string(), data);
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_a_running_container_keeps_it_running() {
    let mut e = env(Daemon::builder()).await;
    if !e.checkpointing_available().await {
        return;
    }
    let pod = new_pod(&mut e, "ckpt", "runc").await;
    let mut config = container_config("c", &e.image);
    config.command = vec!["sh".into(), "-c".into()];
    config.args = vec![
        "echo in-layer > /tmp/file-in-layer; rm /bin/true; echo started; \
         i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"
            .into(),
    ];
    let id = run_container(&mut e.rt, &pod, config).await;
    let deadline = std::time::Instant::now() + patience(std::time::Duration::from_secs(10));
    while exec_sync(&mut e.rt, &id, &["cat", "/tmp/count"], 20)
        .await
        .0
        != 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the counter never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let before = count(&mut e, &id).await;

    let location = e.dir.path().join("ckpt.tar");
    e.checkpoint(&id, &location.display().to_string())
        .await
        .unwrap_or_else(|err| panic!("CheckpointContainer: {err:?}\n{}", e.d.logs()));
    let archive = entries(&std::fs::read(&location).unwrap());
    let names: Vec<&String> = archive.keys().collect();
    for want in [
        "config.dump",
        "spec.dump",
        "rootfs-diff.tar",
        "deleted.files",
        "restore.json",
        "container.log",
        "checkpoint/inventory.img",
    ] {
        assert!(archive.contains_key(want), "no {want} in {names:?}");
    }
    assert!(
        names.iter().any(|n| n.starts_with("checkpoint/pages-")),
        "no memory pages in {names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("work")), "{names:?}");
    let config: serde_json::Value = serde_json::from_slice(&archive["config.dump"]).unwrap();
    assert_eq!(config["id"], id.as_str(), "{config}");
    assert_eq!(config["runtime"], "runc", "{config}");
    let spec: serde_json::Value = serde_json::from_slice(&archive["spec.dump"]).unwrap();
    assert!(spec["process"]["args"].is_array(), "{spec}");
    let deleted: Vec<String> = serde_json::from_slice(&archive["deleted.files"]).unwrap();
    assert_eq!(deleted, ["/bin/true"]);
    let diff = entries(&archive["rootfs-diff.tar"]);
    assert_eq!(
        diff.get("tmp/file-in-layer").map(Vec::as_slice),
        Some(&b"in-layer\n"[..]),
        "{:?}",
        diff.keys()
    );
    assert!(String::from_utf8_lossy(&archive["container.log"]).contains("started"));

    // It kept running, counting on from where it was.
    e.assert_running(&id).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let after = count(&mut e, &id).await;
    assert!(after > before, "the counter went from {before} to {after}");

    // A second checkpoint to the same place is refused, the first stays.
    let err = e
        .checkpoint(&id, &location.display().to_string())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    // The embedded handler says it cannot yet.
    let (_pod, embedded) = e.running("ckpt-embedded", "").await;
    let elsewhere = e.dir.path().join("embedded.tar");
    let err = e
        .checkpoint(&embedded, &elsewhere.display().to_string())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert!(!elsewhere.exists());
    // Nothing of the staging is left in the container's layer dir.
    let layers = e.d.temp_dir().join("root/containers").join(&id);
    let left: Vec<_> = std::fs::read_dir(&layers)
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert!(
        !left
            .iter()
            .any(|n| n.to_string_lossy().starts_with("checkpoint.")),
        "{left:?}"
    );
}

// ---- Restore: CreateContainer with a checkpoint archive as the image ----

/// A pod on `handler` for a restored container (its own log dir).
async fn new_pod(e: &mut Env, name: &str, handler: &str) -> Pod {
    let mut pod_config = host_network_pod(name, "crust-test");
    pod_config.log_directory = e.dir.path().join(name).display().to_string();
    run_pod(&mut e.rt, pod_config, handler).await
}

/// CreateContainer in `pod` whose image is the archive at `archive`.
async fn create_restored(
    e: &mut Env,
    pod: &Pod,
    archive: &Path,
) -> Result<String, crust_test_support::tonic::Status> {
    let config = container_config("restored", &archive.display().to_string());
    create_container(&mut e.rt, pod, config).await
}

/// The store's ID of the suite's image.
async fn image_id(e: &Env) -> String {
    let mut ic = e.d.image_v1().await;
    ic.image_status(v1::ImageStatusRequest {
        image: Some(v1::ImageSpec {
            image: e.image.clone(),
            ..Default::default()
        }),
        verbose: false,
    })
    .await
    .unwrap()
    .into_inner()
    .image
    .expect("the suite's image is not there")
    .id
}

/// An archive in CheckpointContainer's layout whose CRIU images are not
/// real ones: enough for every check CreateContainer makes before it
/// creates anything. `skip` leaves that entry out.
fn synthetic_archive(e: &Env, name: &str, image_id: &str, skip: &str) -> std::path::PathBuf {
    let config = container_config("c", &e.image);
    let hex: String = prost::Message::encode_to_vec(&config)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let restore = serde_json::json!({
        "version": 1,
        "image": e.image,
        "imageId": image_id,
        "containerConfig": hex,
    });
    let empty_tar = tar::Builder::new(Vec::new()).into_inner().unwrap();
    let path = e.dir.path().join(name);
    let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
    for (entry, data) in [
        ("config.dump", b"{}".to_vec()),
        ("spec.dump", b"{}".to_vec()),
        ("rootfs-diff.tar", empty_tar),
        ("deleted.files", b"[]".to_vec()),
        ("checkpoint/inventory.img", b"not criu's".to_vec()),
        ("restore.json", serde_json::to_vec(&restore).unwrap()),
    ] {
        if entry == skip {
            continue;
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, entry, data.as_slice()).unwrap();
    }
    b.finish().unwrap();
    path
}

/// Nothing of a refused restore is left: no container in `pod`, no new
/// dir under the daemon's containers dir.
async fn assert_nothing_left(e: &mut Env, pod: &Pod, layers_before: usize) {
    let left: Vec<_> = list_containers(&mut e.rt)
        .await
        .into_iter()
        .filter(|c| c.pod_sandbox_id == pod.0)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(layer_dirs(e), layers_before, "a layer dir was left behind");
}

fn layer_dirs(e: &Env) -> usize {
    std::fs::read_dir(e.d.temp_dir().join("root/containers"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_of_a_damaged_archive_is_invalid_argument() {
    let mut e = env(Daemon::builder()).await;
    let pod = new_pod(&mut e, "damaged", "runc").await;
    let id = image_id(&e).await;
    let garbage = e.dir.path().join("garbage.tar");
    std::fs::write(&garbage, vec![0x5a; 10_000]).unwrap();
    let whole = synthetic_archive(&e, "whole.tar", &id, "");
    let truncated = e.dir.path().join("truncated.tar");
    let bytes = std::fs::read(&whole).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2 + 100]).unwrap();
    let no_restore = synthetic_archive(&e, "foreign.tar", &id, "restore.json");
    let no_images = synthetic_archive(&e, "no-images.tar", &id, "checkpoint/inventory.img");
    let before = layer_dirs(&e);
    for (archive, says) in [
        (&garbage, "not a checkpoint archive"),
        (&truncated, "not a checkpoint archive"),
        (&no_restore, "no restore.json"),
        (&no_images, "no checkpoint/inventory.img"),
    ] {
        let err = create_restored(&mut e, &pod, archive)
            .await
            .expect_err("a damaged archive was restored");
        assert_eq!(err.code(), Code::InvalidArgument, "{archive:?}: {err:?}");
        assert!(
            err.message().contains("config.image.image") && err.message().contains(says),
            "{err:?}"
        );
        assert!(err.message().len() <= 1024, "{}", err.message().len());
        assert_nothing_left(&mut e, &pod, before).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_without_its_base_image_is_not_found_naming_it() {
    let mut e = env(Daemon::builder()).await;
    let pod = new_pod(&mut e, "no-image", "runc").await;
    let missing = format!("sha256:{}", "e".repeat(64));
    let archive = synthetic_archive(&e, "no-image.tar", &missing, "");
    let before = layer_dirs(&e);
    let err = create_restored(&mut e, &pod, &archive)
        .await
        .expect_err("restored without its image");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(
        err.message().contains(&missing) && err.message().contains("not in the image store"),
        "{err:?}"
    );
    assert_nothing_left(&mut e, &pod, before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_on_the_embedded_handler_is_unimplemented() {
    let mut e = env(Daemon::builder()).await;
    let pod = new_pod(&mut e, "embedded", "").await;
    let id = image_id(&e).await;
    let archive = synthetic_archive(&e, "embedded.tar", &id, "");
    let before = layer_dirs(&e);
    let err = create_restored(&mut e, &pod, &archive)
        .await
        .expect_err("the embedded handler restored");
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    assert!(err.message().contains("runc handler restores"), "{err:?}");
    assert_nothing_left(&mut e, &pod, before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_where_criu_cannot_work_is_a_failed_precondition() {
    let mut e = env(Daemon::builder()).await;
    let info = e.checkpoint_info().await;
    if info["available"] == true {
        skipped("criu check passes here: the refusal is tested where it fails (the host)");
        return;
    }
    let pod = new_pod(&mut e, "no-criu", "runc").await;
    let id = image_id(&e).await;
    let archive = synthetic_archive(&e, "no-criu.tar", &id, "");
    let before = layer_dirs(&e);
    let err = create_restored(&mut e, &pod, &archive)
        .await
        .expect_err("restored where criu cannot work");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message()
            .contains("restoring a checkpoint is not possible")
            && err.message().contains(info["reason"].as_str().unwrap()),
        "{err:?}"
    );
    assert_nothing_left(&mut e, &pod, before).await;
}

/// `count N` lines of a CRI log: the Ns.
fn logged_counts(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(" count ").map(|(_, n)| n.trim().parse().ok()))
        .flatten()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_into_a_new_pod_continues_from_the_checkpoint() {
    let mut e = env(Daemon::builder()).await;
    if !e.checkpointing_available().await {
        return;
    }
    let old_pod = new_pod(&mut e, "before", "runc").await;
    let mut config = container_config("counter", &e.image);
    config.command = vec!["sh".into(), "-c".into()];
    config.args = vec![
        "echo in-layer > /tmp/file-in-layer; rm /bin/true; \
         i=0; while :; do i=$((i+1)); echo $i > /tmp/count; echo count $i; sleep 0.2; done"
            .into(),
    ];
    let old = run_container(&mut e.rt, &old_pod, config).await;
    // Far enough that a fresh start could not be mistaken for it.
    let deadline = std::time::Instant::now() + patience(std::time::Duration::from_secs(30));
    loop {
        let (code, out, _) = exec_sync(&mut e.rt, &old, &["cat", "/tmp/count"], 20).await;
        if code == 0 && out.trim().parse::<u64>().is_ok_and(|n| n >= 15) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the counter is slow");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let before = count(&mut e, &old).await;
    let archive = e.dir.path().join("counter.tar");
    e.checkpoint(&old, &archive.display().to_string())
        .await
        .unwrap_or_else(|err| panic!("CheckpointContainer: {err:?}\n{}", e.d.logs()));
    e.rt.stop_container(v1::StopContainerRequest {
        container_id: old.clone(),
        timeout: 0,
    })
    .await
    .unwrap();

    let pod = new_pod(&mut e, "after", "runc").await;
    let started = std::time::Instant::now();
    let id = create_restored(&mut e, &pod, &archive)
        .await
        .unwrap_or_else(|err| panic!("CreateContainer (restore): {err:?}\n{}", e.d.logs()));
    let created_in = started.elapsed();
    let s = container_status(&mut e.rt, &id).await.status.unwrap();
    assert_eq!(
        s.state,
        v1::ContainerState::ContainerCreated as i32,
        "{s:?}"
    );
    e.rt.start_container(v1::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|err| panic!("StartContainer (restore): {err:?}\n{}", e.d.logs()));
    eprintln!(
        "restore: CreateContainer {created_in:?}, with StartContainer {:?}",
        started.elapsed()
    );
    let status = container_status(&mut e.rt, &id).await;
    let s = status.status.unwrap();
    assert_eq!(
        s.state,
        v1::ContainerState::ContainerRunning as i32,
        "{s:?}"
    );
    assert_eq!(s.metadata.unwrap().name, "restored");
    let pid = serde_json::from_str::<serde_json::Value>(&status.info["info"]).unwrap()["pid"]
        .as_i64()
        .unwrap_or(0);
    assert!(pid > 0, "no pid after the restore: {:?}", status.info);

    // Counting on from the checkpoint's state, not from 0.
    let first = count(&mut e, &id).await;
    assert!(
        first >= before,
        "restored at {first}, checkpointed after {before}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let later = count(&mut e, &id).await;
    assert!(later > first, "the restored counter stands at {first}");
    // Its writable layer: the file written, the file deleted.
    let (code, out, err) = exec_sync(&mut e.rt, &id, &["cat", "/tmp/file-in-layer"], 20).await;
    assert_eq!((code, out.as_str()), (0, "in-layer\n"), "{err}");
    let (code, _, _) = exec_sync(&mut e.rt, &id, &["sh", "-c", "test -e /bin/true"], 20).await;
    assert_eq!(code, 1, "/bin/true is back after the restore");
    // Its output goes on into the new pod's log.
    let log = e.dir.path().join("after").join("restored.log");
    let logged = logged_counts(&log);
    assert!(
        logged.first().is_some_and(|&n| n > before),
        "new log {}: {logged:?}",
        log.display()
    );
    // The CRIU images are gone once restored.
    let layers = e.d.temp_dir().join("root/containers").join(&id);
    assert!(!layers.join("restore").exists());
    e.rt.stop_container(v1::StopContainerRequest {
        container_id: id.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    e.rt.remove_container(v1::RemoveContainerRequest { container_id: id })
        .await
        .unwrap();
}
