//! `crust check` against the real daemon: each kind of orphan made the way
//! a node gets it (records lost while the daemon was down, a crash after a
//! failed pull) or planted by the test (a dir, a cgroup with a process in
//! it, a process that looks like a monitor), found with its bytes through
//! the daemon and without it, repaired, and what is in use left alone (a
//! running container keeps running, a pulled image still makes
//! containers).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crust_store::{Kind, Record, Store};
use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, Pod, WithImage, cgroup_driver, container_config, create_container, daemon_with_image,
    exec_sync, host_network_pod, mounts_under, process_alive, run_container, run_crust, run_pod,
};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

fn test_image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep", "echo", "cat", "true"])
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

/// The exit status of `crust check` when orphans are left.
const ORPHANS_LEFT: i32 = 3;

// ---------------------------------------------------------------- helpers

/// `crust check --output json` for `d`'s dirs (through its socket while it
/// runs, else by itself), with `extra` flags: its exit status and report.
fn check(d: &Daemon, extra: &[&str]) -> (i32, Value) {
    let config = d.temp_dir().join("config.toml");
    let mut args = vec![
        "check".to_string(),
        "--output".into(),
        "json".into(),
        "--socket".into(),
        d.socket.display().to_string(),
        "--config".into(),
        config.display().to_string(),
        "--root".into(),
        d.root.display().to_string(),
        "--run-dir".into(),
        d.run_dir.display().to_string(),
        "--cgroup-driver".into(),
        cgroup_driver().into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_crust(&args);
    let code = out.status.code().expect("crust check exited by a signal");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        code == 0 || code == ORPHANS_LEFT,
        "crust check {extra:?} failed ({code}): {stderr}\n{}",
        d.logs()
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "crust check printed no JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let left = report["left"].as_u64().unwrap();
    assert_eq!(code == ORPHANS_LEFT, left > 0, "exit {code} for {report:#}");
    (code, report)
}

/// On a failing test, `crust check --repair` for the daemon's dirs: the
/// orphans the test made (records it deleted) are beyond the harness's
/// cleanup, which goes through the records. Declared after the daemon, so
/// it runs first.
struct RepairOnPanic(Vec<String>);

impl RepairOnPanic {
    fn new(d: &Daemon) -> RepairOnPanic {
        RepairOnPanic(vec![
            "check".into(),
            "--repair".into(),
            "--socket".into(),
            d.socket.display().to_string(),
            "--config".into(),
            d.temp_dir().join("config.toml").display().to_string(),
            "--root".into(),
            d.root.display().to_string(),
            "--run-dir".into(),
            d.run_dir.display().to_string(),
            "--cgroup-driver".into(),
            cgroup_driver().into(),
        ])
    }
}

impl Drop for RepairOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let args: Vec<&str> = self.0.iter().map(String::as_str).collect();
            let out = run_crust(&args);
            eprintln!(
                "cleanup: crust check --repair: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The orphans of a report as (kind, id).
fn found(report: &Value) -> Vec<(String, String)> {
    report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_string(),
                o["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn orphan<'a>(report: &'a Value, kind: &str, id: &str) -> &'a Value {
    report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == kind && o["id"] == id)
        .unwrap_or_else(|| panic!("no {kind} orphan {id} in {report:#}"))
}

/// Asserts that no orphan of the report belongs to any of `ids`.
fn untouched(report: &Value, ids: &[&str]) {
    for (kind, id) in found(report) {
        assert!(
            !ids.iter().any(|i| id.starts_with(i)),
            "{kind} {id} is in use, not an orphan: {report:#}"
        );
    }
}

/// Asserts that every orphan of a repair report was removed.
fn all_repaired(report: &Value) {
    for o in report["orphans"].as_array().unwrap() {
        assert_eq!(o["repaired"], true, "not repaired: {o:#}\n{report:#}");
    }
    assert_eq!(report["left"], 0, "{report:#}");
}

/// A record as the store keeps it: only its key and kind matter here.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct ContainerRec(Value);

impl Record for ContainerRec {
    const KIND: Kind = Kind::Container;
    fn key(&self) -> &str {
        self.0["id"].as_str().unwrap_or_default()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct PodRec(Value);

impl Record for PodRec {
    const KIND: Kind = Kind::Pod;
    fn key(&self) -> &str {
        self.0["id"].as_str().unwrap_or_default()
    }
}

/// An image lease as the store keeps it.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
struct LeaseRec(Value);

impl Record for LeaseRec {
    const KIND: Kind = Kind::Lease;
    fn key(&self) -> &str {
        self.0["container_id"].as_str().unwrap_or_default()
    }
}

/// Deletes records from a stopped daemon's metadata store, as a lost
/// write or a hand's `rm` would.
fn forget(root: &Path, containers: &[&str], pods: &[&str]) {
    let store = Store::open(&root.join("meta.db")).expect("the daemon is stopped");
    for id in containers {
        assert!(store.delete::<ContainerRec>(id).unwrap(), "{id}");
    }
    for id in pods {
        assert!(store.delete::<PodRec>(id).unwrap(), "{id}");
    }
}

/// A host-network pod named `name`.
async fn pod(rt: &mut Rt, name: &str) -> Pod {
    run_pod(rt, host_network_pod(name, "crust-check"), "").await
}

/// A running `sleep` container `name` in `pod`.
async fn sleeper(rt: &mut Rt, pod: &Pod, name: &str, image: &str) -> String {
    run_container(rt, pod, container_config(name, image)).await
}

/// The monitor's and the container's pids of container `id`.
fn pids_of(d: &Daemon, id: &str) -> (i32, i32) {
    let dir = d.run_dir.join("containers").join(id);
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|e| panic!("{f} of {id}: {e}"))
            .trim()
            .parse::<i32>()
            .unwrap()
    };
    (read("shim.pid"), read("container.pid"))
}

/// Waits (bounded) until none of `pids` runs.
async fn gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|p| process_alive(*p)) {
        assert!(Instant::now() < deadline, "still running: {pids:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The container still runs and answers.
async fn still_works(rt: &mut Rt, id: &str) {
    let (code, out, err) = exec_sync(rt, id, &["echo", "alive"], 30).await;
    assert_eq!((code, out.trim()), (0, "alive"), "{err}");
}

/// A new container of `image` in `pod` runs and answers.
async fn image_still_works(rt: &mut Rt, pod: &Pod, image: &str, name: &str) {
    let id = sleeper(rt, pod, name, image).await;
    still_works(rt, &id).await;
}

/// A child process killed on drop (the test's own).
struct Own(Child);

impl Drop for Own {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Own {
    fn exited(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(Some(_)))
    }

    async fn wait_exit(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.exited() {
            assert!(Instant::now() < deadline, "pid {} still runs", self.0.id());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A process whose command line is a monitor's of `state_dir` (`cat`
/// blocked on opening a FIFO named `container`, run as `crust-shim
/// container <state_dir>`): a stray monitor of the test's own.
fn fake_monitor(fifo_dir: &Path, state_dir: &Path) -> Own {
    nix::unistd::mkfifo(
        &fifo_dir.join("container"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let child = Command::new("cat")
        .arg0("/usr/local/bin/crust-shim")
        .arg("container")
        .arg(state_dir)
        .current_dir(fifo_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Own(child)
}

/// A cgroup named as crust names a container's (`crust-<id>`, or its
/// scope with the systemd driver) in the cgroup of pod `pod_id`, in every
/// hierarchy that has the pod's, holding a `sleep` of the test's own.
/// The cgroup dirs it made are removed on drop if still there.
struct PlantedCgroup {
    dirs: Vec<PathBuf>,
    sleep: Own,
}

impl Drop for PlantedCgroup {
    fn drop(&mut self) {
        let _ = self.sleep.0.kill();
        let _ = self.sleep.0.wait();
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn plant_cgroup(pod_id: &str, id: &str) -> PlantedCgroup {
    let (pod_rel, name) = if cgroup_driver() == "systemd" {
        (
            format!("crust.slice/crust-pod{pod_id}.slice"),
            format!("crust-{id}.scope"),
        )
    } else {
        (format!("crust/crust-{pod_id}"), format!("crust-{id}"))
    };
    let mut bases = vec![PathBuf::from("/sys/fs/cgroup")];
    for e in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        bases.push(e.path());
    }
    let sleep = Own(Command::new("sleep")
        .arg("1000")
        .stdin(Stdio::null())
        .spawn()
        .unwrap());
    let mut dirs = Vec::new();
    for base in bases {
        // A new cpuset cgroup has no CPUs to run a process on.
        if base.to_string_lossy().contains("cpuset") {
            continue;
        }
        let pod_dir = base.join(&pod_rel);
        if !pod_dir.join("cgroup.procs").exists() {
            continue;
        }
        let dir = pod_dir.join(&name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        std::fs::write(dir.join("cgroup.procs"), sleep.0.id().to_string())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        dirs.push(dir);
    }
    assert!(!dirs.is_empty(), "no cgroup of pod {pod_id} found");
    PlantedCgroup { dirs, sleep }
}

/// A fresh ID (64 hex characters).
fn new_id(seed: u8) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let s = format!("{seed:02x}{t:032x}{:08x}", std::process::id());
    format!("{s:0<64}")
}

/// The metrics address `crust status` reports.
fn metrics_address(d: &Daemon) -> String {
    let socket = d.socket.display().to_string();
    let out = run_crust(&["status", "--socket", &socket]);
    let status = String::from_utf8_lossy(&out.stdout);
    status
        .lines()
        .find_map(|l| l.strip_prefix("metrics:"))
        .unwrap_or_else(|| panic!("no metrics line in\n{status}"))
        .trim()
        .to_string()
}

/// `crust_orphaned_bytes{kind=...}` as the daemon serves it now.
async fn orphaned_bytes(addr: &str, kind: &str) -> u64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("crust_orphaned_bytes{{kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

async fn start(metrics: bool) -> (WithImage, Rt) {
    let mut builder = Daemon::builder();
    if metrics {
        builder = builder.arg("--metrics-address").arg("127.0.0.1:0");
    }
    let env = daemon_with_image(builder, "test/check", &test_image()).await;
    let rt = env.daemon.runtime_v1().await;
    (env, rt)
}

// ------------------------------------------------------------------ tests

/// Records lost while the daemon was down (a container's and its pod's):
/// without the daemon everything they described is found — dirs, the
/// rootfs and namespace mounts, the monitor, the cgroup, the image lease —
/// with bytes; the daemon's start repairs some of it itself (the pod's
/// dirs, the lease), `crust check` through the daemon finds the rest and
/// repairs it; the other pod's container runs on, the image still makes
/// containers, the gauge follows.
#[tokio::test(flavor = "multi_thread")]
async fn a_container_and_pod_whose_records_were_lost() {
    let (mut env, mut rt) = start(true).await;
    let _cleanup = RepairOnPanic::new(&env.daemon);
    let image = env.image.clone();
    let keep_pod = pod(&mut rt, "keep").await;
    let keep = sleeper(&mut rt, &keep_pod, "keep", &image).await;
    let lost_pod = pod(&mut rt, "lost").await;
    let lost = sleeper(&mut rt, &lost_pod, "lost", &image).await;
    let (lost_monitor, lost_init) = pids_of(&env.daemon, &lost);
    let (d, pod_id) = (&mut env.daemon, lost_pod.0.clone());

    // Nothing to find on a node in order.
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");
    assert_eq!(report["checked_by"], "daemon");

    drop(rt);
    assert!(d.stop().await.success());
    forget(&d.root, &[&lost], &[&pod_id]);

    // Without the daemon (its socket is gone).
    let (code, report) = check(d, &[]);
    assert_eq!(code, ORPHANS_LEFT);
    assert_eq!(report["checked_by"], "offline");
    let dirs = orphan(&report, "container_dirs", &lost);
    let paths: Vec<&str> = dirs["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let run = d.run_dir.join("containers").join(&lost);
    let layer = d.root.join("containers").join(&lost);
    assert!(paths.contains(&run.to_str().unwrap()), "{dirs:#}");
    assert!(paths.contains(&layer.to_str().unwrap()), "{dirs:#}");
    assert!(dirs["bytes"].as_u64().unwrap() > 0, "{dirs:#}");
    let rootfs = orphan(&report, "mounts", &lost);
    assert_eq!(
        rootfs["paths"][0],
        run.join("bundle/rootfs").to_str().unwrap()
    );
    let monitor = orphan(&report, "monitors", &lost);
    assert!(
        monitor["detail"]
            .as_str()
            .unwrap()
            .contains(&lost_monitor.to_string()),
        "{monitor:#}"
    );
    // The pod's cgroup holds the container's: one orphan, the top one.
    let cgroup = orphan(&report, "cgroups", &pod_id);
    assert!(
        cgroup["detail"].as_str().unwrap().contains("process"),
        "{cgroup:#}"
    );
    orphan(&report, "pod_dirs", &pod_id);
    orphan(&report, "leases", &lost);
    untouched(&report, &[&keep, &keep_pod.0]);
    assert!(
        report["summary"]["container_dirs"]["bytes"]
            .as_u64()
            .unwrap()
            > 0
    );

    // The daemon's start releases the lease and sweeps what it can of the
    // pod (its state dir; the run dir stays while the pod's pause process
    // runs there, which the start leaves); the rest stays.
    d.start_again().await;
    let addr = metrics_address(d);
    let (code, report) = check(d, &[]);
    assert_eq!(code, ORPHANS_LEFT);
    assert_eq!(report["checked_by"], "daemon");
    for (kind, id) in [
        ("container_dirs", &lost),
        ("mounts", &lost),
        ("monitors", &lost),
        ("cgroups", &pod_id),
    ] {
        orphan(&report, kind, id);
    }
    if let Some(o) = report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "pod_dirs")
    {
        let state = d.root.join("pods").join(&pod_id);
        assert!(
            !o["paths"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p == state.to_str().unwrap()),
            "{o:#}"
        );
    }
    let kinds: Vec<String> = found(&report).into_iter().map(|(k, _)| k).collect();
    assert!(!kinds.contains(&"leases".to_string()), "{report:#}");
    untouched(&report, &[&keep, &keep_pod.0]);
    let bytes = orphaned_bytes(&addr, "container_dirs").await;
    assert_eq!(
        bytes,
        report["summary"]["container_dirs"]["bytes"]
            .as_u64()
            .unwrap()
    );
    assert!(bytes > 0);
    assert!(
        process_alive(lost_init),
        "a check without --repair killed it"
    );

    let (code, report) = check(d, &["--repair"]);
    assert_eq!(code, 0, "{report:#}");
    all_repaired(&report);
    gone(&[lost_monitor, lost_init]).await;
    assert!(!run.exists() && !layer.exists());
    assert!(mounts_under(&run).is_empty());
    assert_eq!(orphaned_bytes(&addr, "container_dirs").await, 0);
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");

    let mut rt = d.runtime_v1().await;
    still_works(&mut rt, &keep).await;
    image_still_works(&mut rt, &keep_pod, &image, "after").await;
}

/// What the test plants — a dir with no record, a process that looks like
/// a monitor, a cgroup with a process in the cgroup of a pod; with the
/// daemon down, an unpacked layer no image lists, temp files of an
/// interrupted download and unpack, a lease of no container — is found
/// through the daemon and without it, repaired without it (never while it
/// runs), and the running container and the image are untouched.
#[tokio::test(flavor = "multi_thread")]
async fn planted_orphans_are_found_and_repaired_without_the_daemon() {
    let (mut env, mut rt) = start(false).await;
    let _cleanup = RepairOnPanic::new(&env.daemon);
    let image = env.image.clone();
    let keep_pod = pod(&mut rt, "keep").await;
    let keep = sleeper(&mut rt, &keep_pod, "keep", &image).await;
    let d = &mut env.daemon;

    let stray = new_id(1);
    let stray_dir = d.root.join("containers").join(&stray);
    std::fs::create_dir_all(stray_dir.join("upper")).unwrap();
    std::fs::write(stray_dir.join("upper/big"), vec![7u8; 1 << 20]).unwrap();
    let fake = new_id(2);
    let fifo_dir = tempfile::tempdir().unwrap();
    let fake_state = d.run_dir.join("containers").join(&fake);
    let mut monitor = fake_monitor(fifo_dir.path(), &fake_state);
    let planted = new_id(3);
    let mut cgroup = plant_cgroup(&keep_pod.0, &planted);

    let wanted = [
        ("container_dirs", stray.as_str()),
        ("monitors", fake.as_str()),
        ("cgroups", planted.as_str()),
    ];
    let (code, report) = check(d, &[]);
    assert_eq!(code, ORPHANS_LEFT);
    let mut got = found(&report);
    got.sort();
    let mut want: Vec<(String, String)> = wanted
        .iter()
        .map(|(k, i)| (k.to_string(), i.to_string()))
        .collect();
    want.sort();
    assert_eq!(got, want, "{report:#}");
    let dir = orphan(&report, "container_dirs", &stray);
    assert!(dir["bytes"].as_u64().unwrap() >= 1 << 20, "{dir:#}");
    let cg = orphan(&report, "cgroups", &planted);
    assert!(
        cg["detail"].as_str().unwrap().contains("1 process"),
        "{cg:#}"
    );

    // Never without the daemon while it runs.
    let (refused, why) = {
        let socket = d.socket.display().to_string();
        let root = d.root.display().to_string();
        let run_dir = d.run_dir.display().to_string();
        let out = run_crust(&[
            "check",
            "--offline",
            "--repair",
            "--socket",
            &socket,
            "--root",
            &root,
            "--run-dir",
            &run_dir,
        ]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(refused, Some(1), "{why}");
    assert!(why.contains("runs on"), "{why}");
    assert!(stray_dir.exists() && !monitor.exited());

    drop(rt);
    assert!(d.stop().await.success());
    // With the daemon down: an unpacked layer no image lists, the temp
    // files of an interrupted download and unpack, and an image lease of
    // a container with no record.
    let layer = new_id(5);
    let layer_dir = d.root.join("layers").join(&layer);
    std::fs::create_dir_all(layer_dir.join("diff")).unwrap();
    std::fs::write(layer_dir.join("diff/f"), vec![1u8; 64 << 10]).unwrap();
    let ingest = d.root.join("content/ingest/.tmpcheck");
    std::fs::write(&ingest, vec![2u8; 4096]).unwrap();
    let unpacking = d.root.join("layers/.tmp-check");
    std::fs::create_dir_all(unpacking.join("diff")).unwrap();
    let holder = new_id(6);
    {
        let store = Store::open(&d.root.join("meta.db")).unwrap();
        store
            .put(&LeaseRec(serde_json::json!({
                "container_id": holder,
                "image_id": test_image().id(),
                "chain_ids": [],
            })))
            .unwrap();
    }
    want.extend([
        ("image_layers".to_string(), format!("sha256:{layer}")),
        ("image_temp".to_string(), ".tmpcheck".to_string()),
        ("image_temp".to_string(), ".tmp-check".to_string()),
        ("leases".to_string(), holder.clone()),
    ]);
    want.sort();
    let (code, report) = check(d, &["--offline"]);
    assert_eq!(code, ORPHANS_LEFT);
    assert_eq!(report["checked_by"], "offline");
    let mut got = found(&report);
    got.sort();
    assert_eq!(got, want, "{report:#}");
    let l = orphan(&report, "image_layers", &format!("sha256:{layer}"));
    assert!(l["bytes"].as_u64().unwrap() >= 64 << 10, "{l:#}");
    let (code, report) = check(d, &["--offline", "--repair"]);
    assert_eq!(code, 0, "{report:#}");
    all_repaired(&report);
    assert!(!stray_dir.exists() && !layer_dir.exists());
    assert!(!ingest.exists() && !unpacking.exists());
    monitor.wait_exit().await;
    cgroup.sleep.wait_exit().await;
    assert!(cgroup.dirs.iter().all(|d| !d.exists()), "{:?}", cgroup.dirs);

    d.start_again().await;
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");
    let mut rt = d.runtime_v1().await;
    still_works(&mut rt, &keep).await;
    image_still_works(&mut rt, &keep_pod, &image, "after").await;
}

/// A pull that fails half-way (the registry lost a layer: not bad content,
/// so nothing is collected at once) leaves its manifest and config: the
/// daemon finds them with their bytes and repairs them. Left again and the
/// daemon SIGKILLed, they are found and repaired without it; the pulled
/// image still makes containers.
#[tokio::test(flavor = "multi_thread")]
async fn content_a_failed_pull_and_a_crash_leave() {
    let (mut env, rt) = start(true).await;
    let _cleanup = RepairOnPanic::new(&env.daemon);
    let broken = build(ImageSpec {
        layers: vec![
            busybox_layer(),
            gzip(&LayerTar::new().file("extra", b"extra").finish()),
        ],
        ..ImageSpec::default()
    });
    Pusher::new(&env.registry)
        .image("test/broken", "v1", &broken)
        .await;
    std::fs::remove_file(env.registry.blob_data_path(&broken.layers[1].digest())).unwrap();
    let broken_ref = format!("{}/test/broken:v1", env.registry.host);
    let d = &mut env.daemon;
    let pull_fails = |d: &Daemon| {
        let d_socket = d.socket.clone();
        let r = broken_ref.clone();
        async move {
            let mut ic = crust_test_support::connect(&d_socket)
                .await
                .map(v1::image_service_client::ImageServiceClient::new)
                .unwrap();
            let err = ic
                .pull_image(v1::PullImageRequest {
                    image: Some(v1::ImageSpec {
                        image: r,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_ne!(err.code(), crust_test_support::tonic::Code::Ok);
        }
    };
    pull_fails(d).await;
    let addr = metrics_address(d);

    let (code, report) = check(d, &[]);
    assert_eq!(code, ORPHANS_LEFT);
    for digest in [broken.manifest_digest(), broken.id()] {
        let o = orphan(&report, "image_blobs", &digest);
        assert!(o["bytes"].as_u64().unwrap() > 0, "{o:#}");
    }
    let test_image_id = test_image().id();
    untouched(&report, &[&test_image_id]);
    assert!(orphaned_bytes(&addr, "image_blobs").await > 0);
    let (code, report) = check(d, &["--repair"]);
    assert_eq!(code, 0, "{report:#}");
    all_repaired(&report);
    assert_eq!(orphaned_bytes(&addr, "image_blobs").await, 0);
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");

    // Again, and then the daemon crashes.
    pull_fails(d).await;
    drop(rt);
    d.signal_and_wait(Signal::SIGKILL, Duration::from_secs(10))
        .await;
    let (code, report) = check(d, &[]);
    assert_eq!(code, ORPHANS_LEFT);
    assert_eq!(report["checked_by"], "offline");
    orphan(&report, "image_blobs", &broken.manifest_digest());
    orphan(&report, "image_blobs", &broken.id());
    let (code, report) = check(d, &["--repair"]);
    assert_eq!(code, 0, "{report:#}");
    all_repaired(&report);

    d.start_again().await;
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");
    let mut rt = d.runtime_v1().await;
    let p = pod(&mut rt, "after").await;
    image_still_works(&mut rt, &p, &env.image, "after").await;
}

/// Records whose dirs are gone (a pod's, removed by hand) or whose pod is
/// (a container's, its pod's record lost): found without the daemon but
/// left (only the daemon removes records, undoing what they describe), then
/// removed through the daemon as RemovePodSandbox and RemoveContainer do,
/// with the lost pod's cgroup.
#[tokio::test(flavor = "multi_thread")]
async fn records_whose_dirs_or_pod_are_gone_are_removed_by_the_daemon() {
    let (mut env, mut rt) = start(false).await;
    let _cleanup = RepairOnPanic::new(&env.daemon);
    let image = env.image.clone();
    // No pause process (its own PID namespaces): its dirs are only dirs.
    let mut config = host_network_pod("empty", "crust-check");
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.pid = v1::NamespaceMode::Container as i32;
    }
    let empty = run_pod(&mut rt, config, "").await;
    let lost_pod = pod(&mut rt, "lost").await;
    let orphan_ctr = sleeper(&mut rt, &lost_pod, "orphan", &image).await;
    let (monitor, init) = pids_of(&env.daemon, &orphan_ctr);
    let d = &mut env.daemon;
    drop(rt);
    assert!(d.stop().await.success());

    // The empty pod's dirs, by hand.
    let run = d.run_dir.join("pods").join(&empty.0);
    let state = d.root.join("pods").join(&empty.0);
    for m in mounts_under(&run).into_iter().rev() {
        nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    std::fs::remove_dir_all(&run).unwrap();
    std::fs::remove_dir_all(&state).unwrap();
    forget(&d.root, &[], &[&lost_pod.0]);

    let (code, report) = check(d, &["--repair"]);
    assert_eq!(code, ORPHANS_LEFT);
    for (kind, id) in [
        ("pod_records", &empty.0),
        ("container_records", &orphan_ctr),
    ] {
        let o = orphan(&report, kind, id);
        assert_eq!(o["repaired"], false, "{o:#}");
        assert!(
            o["repair_error"]
                .as_str()
                .unwrap()
                .contains("by the daemon"),
            "{o:#}"
        );
    }
    let o = orphan(&report, "container_records", &orphan_ctr);
    assert!(o["detail"].as_str().unwrap().contains(&lost_pod.0), "{o:#}");
    // What was not a record went: the lost pod's dirs and its cgroup (and
    // the orphan container's processes with it).
    gone(&[init]).await;

    d.start_again().await;
    let (code, report) = check(d, &[]);
    assert_eq!(code, ORPHANS_LEFT);
    let mut got = found(&report);
    got.sort();
    let mut want = vec![
        ("container_records".to_string(), orphan_ctr.clone()),
        ("pod_records".to_string(), empty.0.clone()),
    ];
    want.sort();
    assert_eq!(got, want, "{report:#}");
    let (code, report) = check(d, &["--repair"]);
    assert_eq!(code, 0, "{report:#}");
    all_repaired(&report);
    gone(&[monitor]).await;
    let mut rt = d.runtime_v1().await;
    let pods = rt
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(pods.iter().all(|p| p.id != empty.0), "{pods:?}");
    let containers = rt
        .list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(
        containers.iter().all(|c| c.id != orphan_ctr),
        "{containers:?}"
    );
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");
    let p = pod(&mut rt, "after").await;
    let id = create_container(&mut rt, &p, container_config("after", &image))
        .await
        .unwrap();
    assert!(!id.is_empty());
}

/// `crust check --repair` through the daemon, again and again, while
/// containers are created, started, exec'd into, stopped and removed and
/// an image is pulled and removed: it finds nothing (what is being made
/// or taken apart is no orphan) and harms nothing (every step succeeds).
#[tokio::test(flavor = "multi_thread")]
async fn a_check_during_life_cycle_steps_finds_and_harms_nothing() {
    let (mut env, mut rt) = start(false).await;
    let _cleanup = RepairOnPanic::new(&env.daemon);
    let image = env.image.clone();
    let other = build(ImageSpec {
        layers: vec![gzip(&LayerTar::new().file("other", b"other").finish())],
        ..ImageSpec::default()
    });
    Pusher::new(&env.registry)
        .image("test/other", "v1", &other)
        .await;
    let other_ref = format!("{}/test/other:v1", env.registry.host);
    let p = pod(&mut rt, "busy").await;
    let d = &mut env.daemon;

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checks = {
        let done = done.clone();
        let args = RepairOnPanic::new(d).0.clone();
        tokio::task::spawn_blocking(move || {
            let mut reports = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
                a.extend(["--output", "json"]);
                let out = run_crust(&a);
                reports.push((
                    out.status.code(),
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                ));
            }
            reports
        })
    };
    let mut ic = d.image_v1().await;
    for i in 0..6 {
        let id = sleeper(&mut rt, &p, &format!("c{i}"), &image).await;
        still_works(&mut rt, &id).await;
        rt.stop_container(v1::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
        rt.remove_container(v1::RemoveContainerRequest { container_id: id })
            .await
            .unwrap();
        crust_test_support::pull_image(&mut ic, &other_ref).await;
        ic.remove_image(v1::RemoveImageRequest {
            image: Some(v1::ImageSpec {
                image: other_ref.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let reports = checks.await.unwrap();
    eprintln!("{} checks ran during the steps", reports.len());
    assert!(reports.len() >= 2, "only {} checks ran", reports.len());
    for (code, stdout, stderr) in &reports {
        assert_eq!(*code, Some(0), "{stdout}\n{stderr}");
        let report: Value = serde_json::from_str(stdout).unwrap();
        assert_eq!(found(&report), vec![], "{report:#}");
    }
    let (code, report) = check(d, &[]);
    assert_eq!((code, found(&report)), (0, vec![]), "{report:#}");
}

/// Reporting is for anyone who may reach the socket; repairing only for
/// root, by the caller's credentials on the socket (its mode may let a
/// group in).
#[tokio::test(flavor = "multi_thread")]
async fn only_root_may_repair() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start().await;
    let stray = d.root.join("containers").join(new_id(4));
    std::fs::create_dir_all(&stray).unwrap();
    let mut dir = d.socket.parent();
    while let Some(p) = dir {
        if p == Path::new("/tmp") || p == Path::new("/") {
            break;
        }
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir = p.parent();
    }
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let cli = d.temp_dir().join("crust-cli");
    std::fs::copy(crust_test_support::crust_bin(), &cli).unwrap();
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |args: &[&str]| {
        Command::new(&cli)
            .arg("check")
            .args(args)
            .args(["--socket", &d.socket.display().to_string()])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let out = as_nobody(&["--repair"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("root only") && err.contains("uid 65534"),
        "{err}"
    );
    assert!(stray.exists());
    let out = as_nobody(&["--output", "json"]);
    assert_eq!(
        out.status.code(),
        Some(ORPHANS_LEFT),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    orphan(
        &report,
        "container_dirs",
        stray.file_name().unwrap().to_str().unwrap(),
    );
    let (code, _) = check(&d, &["--repair"]);
    assert_eq!(code, 0);
    assert!(!stray.exists());
}
