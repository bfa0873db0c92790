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
    Daemon, DaemonBuilder, Pod, WithImage, container_config, container_status, daemon_with_image,
    exec_sync, host_network_pod, patience, run_container, run_crust, run_pod, skipped,
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
        let mut pod_config = host_network_pod(name, "crust-test");
        pod_config.log_directory = self.dir.path().join(name).display().to_string();
        let pod = run_pod(&mut self.rt, pod_config, handler).await;
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
    let info = e.checkpoint_info().await;
    if info["available"] != true {
        skipped(&format!(
            "checkpointing is not available here: {}",
            info["reason"].as_str().unwrap_or("?")
        ));
        return;
    }
    let mut pod_config = host_network_pod("ckpt", "crust-test");
    pod_config.log_directory = e.dir.path().join("ckpt").display().to_string();
    let pod = run_pod(&mut e.rt, pod_config, "runc").await;
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
