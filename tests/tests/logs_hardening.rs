//! Container logs against whoever can write a pod's log directory, and
//! against a container that floods its log (issue 27): through the real
//! daemon, on the embedded and runc handlers.
//!
//! - A symlink where the log file goes, or on the way to it (a directory
//!   of the log path, or the pod's log directory itself), is refused at
//!   CreateContainer (FailedPrecondition naming `config.log_path`), and its
//!   target gets nothing.
//! - A symlink put in place of the log file before ReopenContainerLog is
//!   refused, its target gets nothing, and a later reopen of a plain file
//!   works again.
//! - With `log_size_max`, a flood stops at the cap plus one notice line,
//!   and logging resumes after ReopenContainerLog.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Status};
use crust_test_support::{
    Daemon, DaemonBuilder, Need, Pod, WithImage, container_config, create_container,
    daemon_with_image, host_network_pod, require, run_container, run_pod,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

const HOST_TEXT: &[u8] = b"a host file\n";

fn image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep", "echo", "yes", "true"])
        .dir("etc/")
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

struct Env {
    // Field order = drop order: the daemon (which removes its pods) first.
    d: Daemon,
    _reg: Registry,
    image: String,
    rt: Rt,
    /// Pods' log directories go below `<tmp>/pods`; host files beside.
    tmp: tempfile::TempDir,
}

async fn env_with(builder: DaemonBuilder) -> Env {
    let WithImage {
        daemon: d,
        registry,
        image,
    } = daemon_with_image(builder, "test/logs", &image()).await;
    let rt = d.runtime_v1().await;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("pods")).unwrap();
    Env {
        d,
        _reg: registry,
        image,
        rt,
        tmp,
    }
}

impl Env {
    fn log_dir(&self, pod: &str) -> PathBuf {
        self.tmp.path().join("pods").join(pod)
    }

    /// A host file that must never change.
    fn host_file(&self, name: &str) -> PathBuf {
        let p = self.tmp.path().join(name);
        std::fs::write(&p, HOST_TEXT).unwrap();
        p
    }

    async fn pod(&mut self, name: &str, handler: &str) -> Pod {
        let config = v1::PodSandboxConfig {
            log_directory: self.log_dir(name).display().to_string(),
            ..host_network_pod(name, "crust-logs")
        };
        run_pod(&mut self.rt, config, handler).await
    }

    fn container(&self, name: &str, log_path: &str, script: &str) -> v1::ContainerConfig {
        v1::ContainerConfig {
            log_path: log_path.into(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..container_config(name, &self.image)
        }
    }

    async fn reopen(&mut self, id: &str) -> Result<(), Status> {
        self.rt
            .reopen_container_log(v1::ReopenContainerLogRequest {
                container_id: id.into(),
            })
            .await
            .map(drop)
    }

    async fn stop(&mut self, id: &str) {
        self.rt
            .stop_container(v1::StopContainerRequest {
                container_id: id.into(),
                timeout: 0,
            })
            .await
            .unwrap();
    }
}

fn assert_refused(r: Result<String, Status>, what: &str) {
    let err = r.expect_err(what);
    assert_eq!(err.code(), Code::FailedPrecondition, "{what}: {err}");
    assert!(
        err.message().starts_with("config.log_path: "),
        "{what}: {err}"
    );
    assert!(err.message().len() <= 1024, "{what}: {err}");
}

/// Waits until `path` holds `needle` (or panics after 10 s).
async fn wait_for(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in {}: {text:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn symlinks_are_refused_at_create(handler: &str) {
    let mut e = env_with(Daemon::builder()).await;
    let pod = e.pod("links", handler).await;
    let dir = e.log_dir("links");
    let host = e.host_file("host-file");

    // The log file itself, to an existing host file and dangling.
    std::fs::create_dir_all(dir.join("c")).unwrap();
    symlink(&host, dir.join("c/0.log")).unwrap();
    let c = e.container("c", "c/0.log", "echo owned");
    assert_refused(
        create_container(&mut e.rt, &pod, c).await,
        "a symlinked log file",
    );
    let dangling = e.tmp.path().join("created-through-link");
    symlink(&dangling, dir.join("c/1.log")).unwrap();
    let mut c = e.container("c", "c/1.log", "echo owned");
    c.metadata.as_mut().unwrap().attempt = 1;
    assert_refused(
        create_container(&mut e.rt, &pod, c).await,
        "a dangling symlinked log file",
    );

    // A directory on the way.
    let outside = e.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    symlink(&outside, dir.join("d")).unwrap();
    let c = e.container("d", "d/0.log", "echo owned");
    assert_refused(
        create_container(&mut e.rt, &pod, c).await,
        "a symlinked directory in the log path",
    );

    // The pod's log directory itself.
    symlink(&outside, e.log_dir("linked-pod")).unwrap();
    let linked = e.pod("linked-pod", handler).await;
    let c = e.container("l", "l.log", "echo owned");
    assert_refused(
        create_container(&mut e.rt, &linked, c).await,
        "a symlinked pod log directory",
    );

    assert_eq!(std::fs::read(&host).unwrap(), HOST_TEXT);
    assert!(!dangling.exists(), "created through a dangling link");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);

    // A plain path still works (the name refused above is free again).
    let c = e.container("c", "c/2.log", "echo fine; exec sleep 1000");
    let id = run_container(&mut e.rt, &pod, c).await;
    wait_for(&dir.join("c/2.log"), "stdout F fine").await;
    e.stop(&id).await;
    drop(e.d);
}

#[tokio::test(flavor = "multi_thread")]
async fn symlinks_are_refused_at_create_embedded() {
    symlinks_are_refused_at_create("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn symlinks_are_refused_at_create_runc() {
    require!(Need::Runc);
    symlinks_are_refused_at_create("runc").await;
}

async fn a_symlink_at_reopen_is_refused(handler: &str) {
    let mut e = env_with(Daemon::builder()).await;
    let pod = e.pod("reopen", handler).await;
    let log = e.log_dir("reopen").join("c/0.log");
    let host = e.host_file("host-file");
    let c = e.container(
        "c",
        "c/0.log",
        "i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.1; done",
    );
    let id = run_container(&mut e.rt, &pod, c).await;
    wait_for(&log, "tick-2").await;

    // kubelet's rotation, with a symlink in the new file's place.
    std::fs::rename(&log, log.with_extension("log.1")).unwrap();
    symlink(&host, &log).unwrap();
    let err = e.reopen(&id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("symlink"), "{err}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(std::fs::read(&host).unwrap(), HOST_TEXT);

    // kubelet recreates the file: logging resumes in it.
    std::fs::remove_file(&log).unwrap();
    e.reopen(&id).await.unwrap();
    let text = wait_for(&log, "tick-").await;
    assert!(
        text.lines().all(|l| l.contains(" stdout F tick-")),
        "{text}"
    );
    assert_eq!(std::fs::read(&host).unwrap(), HOST_TEXT);
    e.stop(&id).await;
    drop(e.d);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlink_at_reopen_is_refused_embedded() {
    a_symlink_at_reopen_is_refused("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlink_at_reopen_is_refused_runc() {
    require!(Need::Runc);
    a_symlink_at_reopen_is_refused("runc").await;
}

const CAP: u64 = 64 * 1024;
const NOTICE: &str = "size limit of 65536 bytes";

/// Waits until the size of `path` has not changed for a while (the flood
/// is being dropped); its text.
async fn settled(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        if len == last && len > 0 {
            return std::fs::read_to_string(path).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "{} keeps growing",
            path.display()
        );
        last = len;
    }
}

/// The file holds at most the cap of whole lines, then the notice once.
fn check_capped(text: &str) {
    let notices = text.matches(NOTICE).count();
    assert_eq!(notices, 1, "notices in {} bytes", text.len());
    let last = text.lines().last().unwrap();
    assert!(last.contains(NOTICE), "the notice is not last: {last:?}");
    assert!(last.contains(" stderr F crust: "), "{last:?}");
    let body = text.len() - last.len() - 1;
    assert!(body as u64 <= CAP, "{body} bytes before the notice");
    // Nearly full: lines are short.
    assert!(body as u64 > CAP - 256, "{body} bytes before the notice");
    assert!(
        text.lines()
            .take_while(|l| !l.contains(NOTICE))
            .all(|l| l.ends_with(" stdout F y")),
        "a cut line"
    );
}

async fn a_flood_stops_at_the_cap(handler: &str) {
    let mut e = env_with(Daemon::builder().config(&format!("log_size_max = {CAP}\n"))).await;
    let pod = e.pod("flood", handler).await;
    let log = e.log_dir("flood").join("c/0.log");
    let c = e.container("c", "c/0.log", "exec yes");
    let id = run_container(&mut e.rt, &pod, c).await;
    check_capped(&settled(&log).await);

    std::fs::rename(&log, log.with_extension("log.1")).unwrap();
    e.reopen(&id).await.unwrap();
    check_capped(&settled(&log).await);
    // The rotated file was not written after the rotation.
    check_capped(&std::fs::read_to_string(log.with_extension("log.1")).unwrap());
    e.stop(&id).await;
    drop(e.d);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_stops_at_the_cap_embedded() {
    a_flood_stops_at_the_cap("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_stops_at_the_cap_runc() {
    require!(Need::Runc);
    a_flood_stops_at_the_cap("runc").await;
}
