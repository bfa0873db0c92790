//! The operator's side end to end, against the real daemon: the metrics and
//! health endpoint (parsed by the Prometheus project's own Python parser),
//! `crust status`, the log level at run time, the SIGUSR1 state dump, a
//! grpc-core client (Python grpcio, default options), and
//! GetContainerEvents (order, no silent loss, recovery).
//!
//! The Python parts need the test venv that `make deps-test` makes
//! (`target/test-venv`, or `$CRUST_TEST_PYTHON`): without it they fail,
//! saying so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crust_test_support::crust_api::{v1, v1alpha2};
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Streaming};
use crust_test_support::{
    Daemon, TestNetwork, container_config, host_network_pod, pull_image, run_crust, run_pod,
};
use nix::sys::signal::Signal;
use serde_json::Value;

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

// ---------------------------------------------------------------- helpers

/// The test venv's python (grpcio, grpcio-tools, prometheus-client).
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CRUST_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-venv/bin/python3");
    assert!(
        p.exists(),
        "{} is missing: `make deps-test` makes the test venv (grpcio, grpcio-tools, prometheus-client)",
        p.display()
    );
    p
}

fn py_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("py").join(name)
}

/// Runs a Python helper with `args`, `stdin`; its stdout as JSON.
async fn run_python(script: &str, args: &[&str], stdin: &str) -> Value {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(python())
        .arg(py_script(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run python");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("python helper timed out")
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `crust <args> --socket <d.socket>`: stdout, or panic with stderr.
fn crust(d: &Daemon, args: &[&str]) -> String {
    let socket = d.socket.display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--socket", &socket]);
    let out = run_crust(&all);
    assert!(
        out.status.success(),
        "crust {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The metrics address `crust status` reports.
fn metrics_address(d: &Daemon) -> String {
    let status = crust(d, &["status"]);
    let line = status
        .lines()
        .find(|l| l.starts_with("metrics:"))
        .unwrap_or_else(|| panic!("no metrics line in\n{status}"));
    line.trim_start_matches("metrics:").trim().to_string()
}

/// GET http://<addr><path>: status and body.
async fn get(addr: &str, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("http://{addr}{path}"))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// One scrape, parsed: family name -> its samples.
struct Scrape(Value);

impl Scrape {
    async fn take(addr: &str) -> Scrape {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        Scrape(run_python("parse_metrics.py", &[], &text).await)
    }

    fn family(&self, name: &str) -> &Value {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no family {name} in {}", self.names().join(", ")))
    }

    fn names(&self) -> Vec<String> {
        self.0.as_object().unwrap().keys().cloned().collect()
    }

    /// The value of sample `sample` (of family `family`) whose labels
    /// include `labels`; 0 when there is none.
    fn value(&self, family: &str, sample: &str, labels: &[(&str, &str)]) -> f64 {
        self.family(family)["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"] == sample)
            .filter(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
            .map(|s| s["value"].as_f64().unwrap())
            .sum()
    }
}

fn test_image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep", "true"]).dir("tmp/").finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

/// A daemon with the test image in a local registry (not pulled yet).
struct Env {
    d: Daemon,
    reg: Registry,
    image: String,
    rt: Rt,
}

impl Env {
    async fn start(builder: crust_test_support::DaemonBuilder) -> Env {
        let reg = Registry::start();
        Pusher::new(&reg)
            .image("test/op", "v1", &test_image())
            .await;
        let d = builder.start().await;
        let image = format!("{}/test/op:v1", reg.host);
        let rt = d.runtime_v1().await;
        Env { d, reg, image, rt }
    }

    async fn pull(&self) {
        pull_image(&mut self.d.image_v1().await, &self.image).await;
    }

    /// A pod on the host network (no CNI).
    async fn host_pod(&mut self, name: &str) -> (String, v1::PodSandboxConfig) {
        let config = host_network_pod(name, "crust-operator-test");
        self.run_pod(config).await
    }

    async fn run_pod(&mut self, config: v1::PodSandboxConfig) -> (String, v1::PodSandboxConfig) {
        run_pod(&mut self.rt, config, "").await
    }

    fn container(&self, name: &str, cmd: &[&str]) -> v1::ContainerConfig {
        v1::ContainerConfig {
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: String::new(),
            linux: Some(v1::LinuxContainerConfig::default()),
            ..container_config(name, &self.image)
        }
    }

    async fn create(
        rt: &mut Rt,
        pod: &(String, v1::PodSandboxConfig),
        config: v1::ContainerConfig,
    ) -> String {
        rt.create_container(v1::CreateContainerRequest {
            pod_sandbox_id: pod.0.clone(),
            config: Some(config),
            sandbox_config: Some(pod.1.clone()),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"))
        .into_inner()
        .container_id
    }

    async fn add(
        &mut self,
        pod: &(String, v1::PodSandboxConfig),
        name: &str,
        cmd: &[&str],
    ) -> String {
        let config = self.container(name, cmd);
        Env::create(&mut self.rt, pod, config).await
    }

    async fn start_container(&mut self, id: &str) {
        self.rt
            .start_container(v1::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    }

    async fn state(&mut self, id: &str) -> i32 {
        self.rt
            .container_status(v1::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
            .state
    }

    async fn events(&self) -> Streaming<v1::ContainerEventResponse> {
        self.d
            .runtime_v1()
            .await
            .get_container_events(v1::GetEventsRequest {})
            .await
            .expect("GetContainerEvents")
            .into_inner()
    }
}

/// The next event, within `within`.
async fn next_event(
    s: &mut Streaming<v1::ContainerEventResponse>,
    within: Duration,
) -> v1::ContainerEventResponse {
    tokio::time::timeout(within, s.message())
        .await
        .expect("no event in time")
        .expect("event stream broke")
        .expect("event stream ended")
}

fn kind(e: &v1::ContainerEventResponse) -> v1::ContainerEventType {
    v1::ContainerEventType::try_from(e.container_event_type).unwrap()
}

// ------------------------------------------------------- metrics, health

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_and_move_when_pods_start() {
    let mut env = Env::start(
        Daemon::builder()
            .arg("--metrics-address")
            .arg("127.0.0.1:0"),
    )
    .await;
    let addr = metrics_address(&env.d);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    assert_eq!(get(&addr, "/healthz").await, (200, "ok\n".to_string()));
    let (status, _) = get(&addr, "/nope").await;
    assert_eq!(status, 404);

    let before = Scrape::take(&addr).await;
    for family in [
        "crust_cri_requests",
        "crust_cri_request_duration_seconds",
        "crust_cri_requests_in_flight",
        "crust_pod_sandboxes",
        "crust_containers",
        "crust_monitors",
        "crust_streaming_sessions",
        "crust_image_pulls",
        "crust_image_pull_bytes",
        "crust_image_pull_duration_seconds",
        "crust_cni_operation_duration_seconds",
        "crust_build",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_threads",
        "process_start_time_seconds",
        "process_cpu_seconds",
    ] {
        before.family(family);
    }
    assert_eq!(before.family("crust_cri_requests")["type"], "counter");
    assert_eq!(
        before.family("crust_cri_request_duration_seconds")["type"],
        "histogram"
    );
    assert_eq!(before.family("crust_build")["type"], "info");
    assert!(
        before.value(
            "process_resident_memory_bytes",
            "process_resident_memory_bytes",
            &[]
        ) > 1e6
    );
    let started = before.value(
        "process_start_time_seconds",
        "process_start_time_seconds",
        &[],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started > now - 600.0 && started <= now + 1.0,
        "{started} vs {now}"
    );
    let ready = |s: &Scrape| {
        s.value(
            "crust_pod_sandboxes",
            "crust_pod_sandboxes",
            &[("state", "ready")],
        )
    };
    let running = |s: &Scrape| {
        s.value(
            "crust_containers",
            "crust_containers",
            &[("state", "running")],
        )
    };
    let rpc = |s: &Scrape, service: &str, method: &str, code: &str| {
        s.value(
            "crust_cri_requests",
            "crust_cri_requests_total",
            &[("service", service), ("method", method), ("code", code)],
        )
    };
    const V1: &str = "runtime.v1.RuntimeService";
    assert_eq!(ready(&before), 0.0);

    // A pull, pods on the host and on a CNI network, a running container.
    env.pull().await;
    let net = TestNetwork::install(&env.d, &[]);
    let mut pods = Vec::new();
    for i in 0..3 {
        pods.push(env.host_pod(&format!("m{i}")).await);
    }
    let mut cni_config = pods[0].1.clone();
    cni_config.metadata.as_mut().unwrap().name = "cni".into();
    cni_config.metadata.as_mut().unwrap().uid = "uid-cni".into();
    cni_config.linux = Some(v1::LinuxPodSandboxConfig::default());
    let cni_pod = env.run_pod(cni_config).await;
    let c = env.add(&pods[0], "app", &["sleep", "1000"]).await;
    env.start_container(&c).await;
    // An error code, and a v1alpha2 call.
    let err = env
        .rt
        .container_status(v1::ContainerStatusRequest {
            container_id: "nonexistent".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    env.d
        .runtime_v1alpha2()
        .await
        .version(v1alpha2::VersionRequest::default())
        .await
        .unwrap();

    let after = Scrape::take(&addr).await;
    assert_eq!(ready(&after), 4.0);
    assert_eq!(running(&after), 1.0);
    assert_eq!(after.value("crust_monitors", "crust_monitors", &[]), 1.0);
    assert_eq!(rpc(&after, V1, "RunPodSandbox", "OK"), 4.0);
    assert_eq!(rpc(&after, V1, "StartContainer", "OK"), 1.0);
    assert_eq!(rpc(&after, V1, "ContainerStatus", "NotFound"), 1.0);
    // Counted once, under the name it came with.
    assert_eq!(
        rpc(&after, "runtime.v1alpha2.RuntimeService", "Version", "OK"),
        1.0
    );
    assert_eq!(
        after.value(
            "crust_cri_request_duration_seconds",
            "crust_cri_request_duration_seconds_count",
            &[("service", V1), ("method", "RunPodSandbox")]
        ),
        4.0
    );
    assert_eq!(
        after.value(
            "crust_image_pulls",
            "crust_image_pulls_total",
            &[("result", "success")]
        ),
        1.0
    );
    assert!(
        after.value(
            "crust_image_pull_bytes",
            "crust_image_pull_bytes_total",
            &[]
        ) > 100_000.0
    );
    assert_eq!(
        after.value(
            "crust_cni_operation_duration_seconds",
            "crust_cni_operation_duration_seconds_count",
            &[("operation", "add"), ("result", "success")]
        ),
        1.0
    );
    // The scrape in flight counts nothing; the admin call of `crust status`
    // is counted too.
    assert_eq!(rpc(&after, "crust.admin.v1.Daemon", "Status", "OK"), 1.0);

    // Stopping the CNI pod: a DEL.
    env.rt
        .stop_pod_sandbox(v1::StopPodSandboxRequest {
            pod_sandbox_id: cni_pod.0.clone(),
        })
        .await
        .unwrap();
    let last = Scrape::take(&addr).await;
    assert_eq!(ready(&last), 3.0);
    assert_eq!(
        last.value(
            "crust_pod_sandboxes",
            "crust_pod_sandboxes",
            &[("state", "notready")]
        ),
        1.0
    );
    assert_eq!(
        last.value(
            "crust_cni_operation_duration_seconds",
            "crust_cni_operation_duration_seconds_count",
            &[("operation", "del"), ("result", "success")]
        ),
        1.0
    );
    env.d.remove_all_pods().await;
    drop(net);
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_is_503_while_stopping_and_the_endpoint_is_off_by_default() {
    let d = Daemon::start().await;
    assert!(
        crust(&d, &["status"]).contains("metrics:        off"),
        "{}",
        crust(&d, &["status"])
    );
    drop(d);

    let mut d = Daemon::builder()
        .config("[metrics]\naddress = \"127.0.0.1:0\"\n")
        .start()
        .await;
    let addr = metrics_address(&d);
    assert_eq!(get(&addr, "/healthz").await.0, 200);
    // A stream that never ends keeps the daemon draining after SIGTERM.
    let mut events = d
        .runtime_v1()
        .await
        .get_container_events(v1::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let _ = nix::sys::signal::kill(d.pid(), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(8);
    let body = loop {
        let (status, body) = get(&addr, "/healthz").await;
        if status == 503 {
            break body;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "still healthy after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(body, "stopping\n");
    // The drain ends the stream; the daemon exits.
    let _ = tokio::time::timeout(Duration::from_secs(15), events.message()).await;
    let status = d
        .signal_and_wait(Signal::SIGTERM, Duration::from_secs(15))
        .await;
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_metrics_address_in_use_stops_the_daemon_with_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = run_crust(&[
        "daemon",
        "--socket",
        &dir.path().join("s.sock").display().to_string(),
        "--root",
        &dir.path().join("root").display().to_string(),
        "--run-dir",
        &dir.path().join("run").display().to_string(),
        "--metrics-address",
        &addr,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&addr) && err.contains("metrics"), "{err}");
    let out = run_crust(&["daemon", "--metrics-address", "localhost:9090"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("metrics.address"),
        "{err}"
    );
}

// ------------------------------------------- status, log level, dump

#[tokio::test(flavor = "multi_thread")]
async fn status_shows_what_the_daemon_runs_with() {
    let mut env = Env::start(Daemon::builder()).await;
    let pod = env.host_pod("s").await;
    let out = crust(&env.d, &["status", "--config"]);
    for want in [
        format!("version:        {}", env!("CARGO_PKG_VERSION")),
        "health:         serving".into(),
        format!("socket:         {}", env.d.socket.display()),
        "streaming:      http://127.0.0.1:".into(),
        "cgroups:        cgroupfs driver, ".into(),
        "log level:      debug".into(),
        "pod sandboxes:  1 (1 ready, 0 notready)".into(),
        "containers:     0 (0 running, 0 created, 0 exited)".into(),
        "\"\" (default): embedded".into(),
        "runc: cli /".into(),
        format!("  root = \"{}\"", env.d.root.display()),
    ] {
        assert!(out.contains(&want), "{want:?} missing in\n{out}");
    }
    let _ = pod;
    env.d.remove_all_pods().await;
    drop(env.reg);
}

/// `crust status` lists each handler's features exactly as CRI Status
/// (crictl info) reports them: it left out `user_namespaces`.
#[tokio::test(flavor = "multi_thread")]
async fn status_lists_the_handler_features_cri_status_reports() {
    use std::collections::BTreeSet;
    let d = Daemon::builder().start().await;
    let mut rt = d.runtime_v1().await;
    let cri: HashMap<String, BTreeSet<String>> = rt
        .status(v1::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner()
        .runtime_handlers
        .into_iter()
        .map(|h| {
            let f = h.features.unwrap_or_default();
            let on: BTreeSet<String> = [
                ("recursive_read_only_mounts", f.recursive_read_only_mounts),
                ("user_namespaces", f.user_namespaces),
            ]
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| n.to_string())
            .collect();
            (h.name, on)
        })
        .collect();
    let out = crust(&d, &["status"]);
    // `  <name>: <kind>[ <path>][ [f1, f2]]` under `handlers:`.
    let cli: HashMap<String, BTreeSet<String>> = out
        .lines()
        .skip_while(|l| *l != "handlers:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let (name, rest) = l.trim_start().split_once(": ").unwrap();
            let name = if name == "\"\" (default)" { "" } else { name };
            let features = rest
                .split_once(" [")
                .map(|(_, f)| {
                    f.trim_end_matches(']')
                        .split(", ")
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            (name.to_string(), features)
        })
        .collect();
    assert!(!cri.is_empty());
    assert_eq!(cli, cri, "crust status:\n{out}");
    // This kernel has user namespaces: the comparison is not of empties.
    assert!(
        cri.values().any(|f| f.contains("user_namespaces")),
        "{cri:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn log_level_changes_for_a_while_and_reverts_by_itself() {
    let d = Daemon::builder()
        .arg("--log-level")
        .arg("info")
        .start()
        .await;
    assert_eq!(crust(&d, &["log-level"]).trim(), "info");
    let debug_lines = || d.logs().lines().filter(|l| l.contains("DEBUG")).count();
    let call = || async {
        d.runtime_v1()
            .await
            .version(v1::VersionRequest::default())
            .await
            .unwrap();
    };
    call().await;
    assert_eq!(debug_lines(), 0, "{}", d.logs());

    let set = crust(&d, &["log-level", "debug", "--for", "3s"]);
    assert!(set.starts_with("debug (for 3s more, then info)"), "{set}");
    let shown = crust(&d, &["log-level"]);
    assert!(shown.starts_with("debug (for"), "{shown}");
    call().await;
    let during = debug_lines();
    assert!(during > 0, "no debug line while at debug:\n{}", d.logs());

    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(crust(&d, &["log-level"]).trim(), "info");
    let reverted = debug_lines();
    call().await;
    call().await;
    assert_eq!(debug_lines(), reverted, "debug lines after the revert");
    assert!(
        d.logs()
            .contains("log level reverted to the configured one")
    );

    // Bad input: named; no duration without a level.
    let socket = d.socket.display().to_string();
    let out = run_crust(&["log-level", "loud", "--socket", &socket]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("loud"), "{err}");
    let out = run_crust(&["log-level", "debug", "--for", "10x", "--socket", &socket]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--for"));
}

#[tokio::test(flavor = "multi_thread")]
async fn only_root_may_change_the_log_level() {
    let d = Daemon::builder()
        .arg("--log-level")
        .arg("info")
        .start()
        .await;
    // The daemon must say no by the peer's credentials alone.
    let as_nobody = |args: &[&str]| d.cli_as_nobody(args);
    let out = as_nobody(&["log-level", "debug"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody changed the log level");
    assert!(
        err.contains("root only") && err.contains("uid 65534"),
        "{err}"
    );
    assert_eq!(crust(&d, &["log-level"]).trim(), "info");
    // Reading it is fine.
    let out = as_nobody(&["log-level"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigusr1_dumps_the_state_to_the_log() {
    let mut env = Env::start(Daemon::builder()).await;
    env.pull().await;
    let pod = env.host_pod("dump").await;
    let c = env.add(&pod, "app", &["sleep", "1000"]).await;
    env.start_container(&c).await;
    // A call in flight: an open event stream.
    let _events = env.events().await;
    let _ = nix::sys::signal::kill(env.d.pid(), Signal::SIGUSR1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !env.d.logs().contains("calls in flight") {
        assert!(Instant::now() < deadline, "no dump:\n{}", env.d.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let logs = env.d.logs();
    let dump = &logs[logs.find("state dump (SIGUSR1)").unwrap()..];
    for want in [
        "pod sandboxes: 1".to_string(),
        format!(
            "pod {} crust-operator-test/dump attempt 0 state ready",
            pod.0
        ),
        "containers: 1".into(),
        format!(
            "container {} \"app\" attempt 0 pod {} state running",
            c, pod.0
        ),
        "monitors watched: 1".into(),
        "streaming sessions: 0".into(),
        "calls in flight: 1".into(),
        "/runtime.v1.RuntimeService/GetContainerEvents for ".into(),
    ] {
        assert!(dump.contains(&want), "{want:?} missing in\n{dump}");
    }
    env.d.remove_all_pods().await;
}

// ------------------------------------------------------ grpc-core client

#[tokio::test(flavor = "multi_thread")]
async fn a_grpc_core_client_with_default_options_is_served() {
    let mut env = Env::start(Daemon::builder()).await;
    let pod = env.host_pod("py").await;
    let proto_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/proto");
    let socket = env.d.socket.display().to_string();
    let answer = run_python(
        "cri_client.py",
        &[&proto_root.display().to_string(), &socket],
        "",
    )
    .await;
    assert_eq!(answer["pods"], serde_json::json!([pod.0]), "{answer}");
    assert_eq!(answer["pods_again"], answer["pods"]);
    assert_eq!(answer["version"], "v1");
    assert_eq!(answer["version_v1alpha2"], "v1alpha2");
    assert_eq!(answer["unknown_container"], "NOT_FOUND");
    // tonic clients on the same daemon are unaffected.
    let pods = env
        .rt
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(pods.len(), 1);
    env.d.remove_all_pods().await;
}

// --------------------------------------------------- GetContainerEvents

#[tokio::test(flavor = "multi_thread")]
async fn container_events_come_in_order_with_statuses() {
    let mut env = Env::start(Daemon::builder()).await;
    env.pull().await;
    let mut events = env.events().await;
    let pod = env.host_pod("ev").await;
    let sleeper = env.add(&pod, "sleeper", &["sleep", "1000"]).await;
    // Exits at once: STARTED must still come before STOPPED.
    let quick = env.add(&pod, "quick", &["true"]).await;
    let idle = env.add(&pod, "idle", &["sleep", "1000"]).await;
    env.start_container(&sleeper).await;
    env.start_container(&quick).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.state(&quick).await != v1::ContainerState::ContainerExited as i32 {
        assert!(Instant::now() < deadline, "quick did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.rt
        .stop_container(v1::StopContainerRequest {
            container_id: sleeper.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    for id in [&sleeper, &quick, &idle] {
        env.rt
            .remove_container(v1::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .unwrap();
    }
    use v1::ContainerEventType::*;
    let mut seen: HashMap<String, Vec<v1::ContainerEventType>> = HashMap::new();
    let mut deleted = 0;
    while deleted < 3 {
        let e = next_event(&mut events, Duration::from_secs(20)).await;
        let k = kind(&e);
        assert_eq!(
            e.pod_sandbox_status.as_ref().map(|p| p.id.as_str()),
            Some(pod.0.as_str())
        );
        // The event's own container, as the change left it.
        let own = e
            .containers_statuses
            .iter()
            .find(|s| s.id == e.container_id);
        let want_state = match k {
            ContainerCreatedEvent => Some(v1::ContainerState::ContainerCreated),
            ContainerStartedEvent => Some(v1::ContainerState::ContainerRunning),
            ContainerStoppedEvent => Some(v1::ContainerState::ContainerExited),
            ContainerDeletedEvent => None,
        };
        assert_eq!(
            own.map(|s| v1::ContainerState::try_from(s.state).unwrap()),
            want_state,
            "{k:?} of {}",
            e.container_id
        );
        if k == ContainerDeletedEvent {
            deleted += 1;
        }
        seen.entry(e.container_id.clone()).or_default().push(k);
    }
    let full = vec![
        ContainerCreatedEvent,
        ContainerStartedEvent,
        ContainerStoppedEvent,
        ContainerDeletedEvent,
    ];
    assert_eq!(seen[&sleeper], full);
    assert_eq!(seen[&quick], full);
    assert_eq!(
        seen[&idle],
        vec![
            ContainerCreatedEvent,
            ContainerStoppedEvent,
            ContainerDeletedEvent
        ]
    );
    env.d.remove_all_pods().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscriber_that_falls_behind_is_cut_off_not_silently_skipped() {
    const PODS: usize = 50;
    const PER_POD: usize = 20; // 1,000 containers: 3,000 events
    let mut env = Env::start(Daemon::builder()).await;
    env.pull().await;
    // Subscribed, then not read until everything happened.
    let mut slow = env.events().await;
    // Subscribed and read as events come: gets every one of them.
    let mut keeping_up = env.events().await;
    let reader = tokio::spawn(async move {
        let mut got: HashMap<String, Vec<v1::ContainerEventType>> = HashMap::new();
        let (mut n, mut deleted) = (0, 0);
        while deleted < PODS * PER_POD {
            let e = tokio::time::timeout(Duration::from_secs(120), keeping_up.message())
                .await
                .unwrap_or_else(|_| panic!("the reader waited in vain after {n} events"))
                .unwrap_or_else(|e| panic!("the reader's stream broke after {n} events: {e}"))
                .unwrap_or_else(|| panic!("the reader's stream ended after {n} events"));
            n += 1;
            if kind(&e) == v1::ContainerEventType::ContainerDeletedEvent {
                deleted += 1;
            }
            got.entry(e.container_id.clone())
                .or_default()
                .push(kind(&e));
        }
        got
    });
    let mut pods = Vec::new();
    for i in 0..PODS {
        pods.push(env.host_pod(&format!("slow{i}")).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut all_ids = Vec::new();
    for (i, pod) in pods.iter().cloned().enumerate() {
        let mut rt = env.rt.clone();
        let configs: Vec<v1::ContainerConfig> = (0..PER_POD)
            .map(|j| env.container(&format!("c{i}-{j}"), &["sleep", "1000"]))
            .collect();
        tasks.spawn(async move {
            let mut ids = Vec::new();
            for c in configs {
                ids.push(Env::create(&mut rt, &pod, c).await);
            }
            for id in &ids {
                rt.remove_container(v1::RemoveContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
            }
            ids
        });
        // Two pods at a time on two cores.
        if tasks.len() >= 2 {
            all_ids.extend(tasks.join_next().await.unwrap().unwrap());
        }
    }
    while let Some(r) = tasks.join_next().await {
        all_ids.extend(r.unwrap());
    }
    // The reader that kept up: every change of all 1,000 (removing a
    // created container stops it first), in order, no gap.
    let got = reader.await.unwrap();
    assert_eq!(got.len(), PODS * PER_POD);
    {
        use v1::ContainerEventType::*;
        for id in &all_ids {
            assert_eq!(
                got.get(id).map(Vec::as_slice),
                Some(
                    [
                        ContainerCreatedEvent,
                        ContainerStoppedEvent,
                        ContainerDeletedEvent
                    ]
                    .as_slice()
                ),
                "{id}"
            );
        }
    }
    // Now read: some events in order, then a clear error, never a gap.
    let mut received: HashMap<String, Vec<v1::ContainerEventType>> = HashMap::new();
    let mut count = 0;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(30), slow.message()).await {
            Err(_) => panic!("the stream neither ended nor broke after {count} events"),
            Ok(Ok(Some(e))) => {
                count += 1;
                received
                    .entry(e.container_id.clone())
                    .or_default()
                    .push(kind(&e));
            }
            Ok(Ok(None)) => panic!("the stream ended quietly after {count} of 3,000 events"),
            Ok(Err(status)) => break status,
        }
    };
    assert!(
        count < 3000,
        "all events arrived: the subscriber never fell behind"
    );
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(
        status.message().contains("events lost") && status.message().contains("fell behind by"),
        "{}",
        status.message()
    );
    // What did arrive is in order per container.
    use v1::ContainerEventType::*;
    for (id, kinds) in &received {
        let ok = matches!(
            kinds.as_slice(),
            [ContainerCreatedEvent]
                | [ContainerCreatedEvent, ContainerStoppedEvent]
                | [
                    ContainerCreatedEvent,
                    ContainerStoppedEvent,
                    ContainerDeletedEvent
                ]
                | [ContainerStoppedEvent]
                | [ContainerStoppedEvent, ContainerDeletedEvent]
                | [ContainerDeletedEvent]
        );
        assert!(ok, "{id}: {kinds:?}");
    }
    assert!(env.d.logs().contains("fell behind"));
    // A new subscriber is served as usual.
    let mut fresh = env.events().await;
    let c = env.add(&pods[0], "after", &["sleep", "1000"]).await;
    let e = next_event(&mut fresh, Duration::from_secs(20)).await;
    assert_eq!(
        (e.container_id.as_str(), kind(&e)),
        (c.as_str(), ContainerCreatedEvent)
    );
    env.d.remove_all_pods().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exit_while_the_daemon_was_down_is_an_event_after_restart() {
    let mut env = Env::start(Daemon::builder()).await;
    env.pull().await;
    let pod = env.host_pod("restart").await;
    let short = env.add(&pod, "short", &["sleep", "3"]).await;
    let long = env.add(&pod, "long", &["sleep", "1000"]).await;
    env.start_container(&short).await;
    env.start_container(&long).await;
    let pid = {
        let r = env
            .rt
            .container_status(v1::ContainerStatusRequest {
                container_id: short.clone(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        let v: Value = serde_json::from_str(&r.info["info"]).unwrap();
        v["pid"].as_i64().unwrap() as i32
    };
    let status = env.d.stop().await;
    assert!(status.success(), "{status}");
    // The container ends while no daemon runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    while crust_test_support::process_alive(pid) {
        assert!(Instant::now() < deadline, "the container did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.d.start_again().await;
    env.rt = env.d.runtime_v1().await;
    let mut events = env.events().await;
    let e = next_event(&mut events, Duration::from_secs(10)).await;
    assert_eq!(
        (e.container_id.as_str(), kind(&e)),
        (
            short.as_str(),
            v1::ContainerEventType::ContainerStoppedEvent
        )
    );
    let own = e
        .containers_statuses
        .iter()
        .find(|s| s.id == short)
        .unwrap();
    assert_eq!(own.state, v1::ContainerState::ContainerExited as i32);
    assert_eq!(own.exit_code, 0);
    let other = e.containers_statuses.iter().find(|s| s.id == long).unwrap();
    assert_eq!(other.state, v1::ContainerState::ContainerRunning as i32);
    // Nothing else was found; live events follow.
    env.rt
        .stop_container(v1::StopContainerRequest {
            container_id: long.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    let e = next_event(&mut events, Duration::from_secs(10)).await;
    assert_eq!(
        (e.container_id.as_str(), kind(&e)),
        (long.as_str(), v1::ContainerEventType::ContainerStoppedEvent)
    );
    env.d.remove_all_pods().await;
}
