//! Crash safety at every step (issue 17): the real daemon is killed at
//! every crash point of every life-cycle RPC, and at random moments into
//! each of them, and restarted each time. After every kill:
//!
//! - the restart reconciles: nothing reported done that is not, nothing
//!   half-made visible (a pod or container is either absent or in a state
//!   kubelet can go on from), no exit code lost;
//! - kubelet's retry (same metadata and attempt, or the next step of the
//!   life cycle) succeeds;
//! - once the trial's pod is removed, nothing is left: mounts, namespace
//!   pins, veths, IP leases, cgroups, monitor processes, records, CNI
//!   cache files, iptables rules;
//! - a long-running container in a pod of its own never notices (same
//!   process, running, answering exec), across every restart.
//!
//! How the kills are placed: the debug daemon has named crash points after
//! each step that persists something or changes the node
//! (runtime/src/crash.rs); with `CRUST_CRASH_POINTS=<dir>` it traces the
//! points it passes to `<dir>/trace` and SIGKILLs itself at the one named
//! in `<dir>/at`. A first run of each RPC learns its points from the
//! trace; then each point gets a trial. Random kills (SIGKILL from the
//! test at a random delay within the RPC's measured duration) reach the
//! steps between points (inside CNI plugins, inside a pull, inside the
//! namespace pinning); two such in-between states are also staged on
//! purpose (`crash_inside_pinning`, `crash_inside_cni_del`).
//! `CRUST_KILL_TRIALS=N` sets the random kills per RPC (default 2),
//! `CRUST_KILL_SEED` replays a run's delays (the seed is printed).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Status};
use crust_test_support::{Daemon, TestNetwork, iptables_save, mounts_under, process_alive};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type Img = v1::image_service_client::ImageServiceClient<Channel>;

/// How long an RPC under test may take (a crash point kills the daemon
/// long before).
const RPC_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rpc {
    RunPodCni,
    RunPodHostNetwork,
    CreateContainer,
    StartContainer,
    StopContainer,
    RemoveContainer,
    StopPod,
    RemovePod,
    PullImage,
    ExecSync,
}

const RPCS: [Rpc; 10] = [
    Rpc::RunPodCni,
    Rpc::RunPodHostNetwork,
    Rpc::CreateContainer,
    Rpc::StartContainer,
    Rpc::StopContainer,
    Rpc::RemoveContainer,
    Rpc::StopPod,
    Rpc::RemovePod,
    Rpc::PullImage,
    Rpc::ExecSync,
];

/// How a trial kills the daemon.
#[derive(Clone, Debug)]
enum Kill {
    /// None: the discovery run, nothing is killed.
    None,
    /// At this crash point.
    At(String),
    /// SIGKILL from outside after this delay into the RPC.
    After(Duration),
}

/// What a trial made before its RPC, and what the RPC is about.
#[derive(Clone, Debug, Default)]
struct Trial {
    name: String,
    pod: Option<(String, v1::PodSandboxConfig)>,
    container: Option<String>,
    /// The container's process, when it runs before the RPC.
    pid: Option<i32>,
}

/// What is on the node, for leak checks against the baseline (the
/// long-running pod alone).
#[derive(Debug, PartialEq, Eq, Clone)]
struct Snapshot {
    pods: Vec<String>,
    containers: Vec<String>,
    mounts: Vec<PathBuf>,
    dirs: BTreeMap<String, Vec<String>>,
    cgroups: Vec<PathBuf>,
    veths: usize,
    leases: Vec<String>,
    monitors: usize,
    cni_cache: Vec<String>,
    iptables: usize,
}

/// xorshift64*: the delays of the random kills, replayable by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A cgroup parent of the test's own; removed (with anything left) on drop.
struct CgroupParent(String);

impl CgroupParent {
    /// Every dir below the parent, in every hierarchy.
    fn below(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for top in cgroup_dirs(&self.0) {
            walk_dirs(&top, &mut out);
        }
        out.sort();
        out
    }
}

fn walk_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(e.path());
                walk_dirs(&e.path(), out);
            }
        }
    }
}

fn cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    let rel = rel.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(rel)];
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path().join(rel));
            }
        }
    }
    dirs.into_iter().filter(|d| d.is_dir()).collect()
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        for top in cgroup_dirs(&self.0) {
            let mut below = Vec::new();
            walk_dirs(&top, &mut below);
            for d in below.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
            let _ = std::fs::remove_dir(&top);
        }
    }
}

struct H {
    // Field order is drop order: the network's guard removes the pods
    // through the daemon, which must still run.
    net: TestNetwork,
    d: Daemon,
    _reg: Registry,
    parent: CgroupParent,
    logs: tempfile::TempDir,
    /// The crash points' dir (`CRUST_CRASH_POINTS`), removed on drop.
    points: tempfile::TempDir,
    rt: Rt,
    ic: Img,
    image: String,
    pull_image: String,
    /// The long-running container: pod, container, pid.
    steady: (String, String, i32),
    baseline: Option<Snapshot>,
    trials: usize,
    /// Trials per RPC, for the report.
    count: BTreeMap<String, usize>,
    /// Pods the restart left NOTREADY (kubelet removed them).
    not_ready_after_restart: usize,
}

fn test_image(marker: &str) -> TestImage {
    let busybox = std::fs::read(BUSYBOX).expect("busybox-static must be installed");
    let mut tar = LayerTar::new()
        .dir("bin/")
        .file_mode("bin/busybox", &busybox, 0o755);
    for applet in ["sh", "sleep", "echo", "true", "cat"] {
        tar = tar.symlink(&format!("bin/{applet}"), "busybox");
    }
    let layer = tar
        .dir("etc/")
        .file("etc/marker", marker.as_bytes())
        .dir("tmp/")
        .finish();
    build(ImageSpec {
        layers: vec![gzip(&layer)],
        cmd: &["sleep", "100000"],
        ..ImageSpec::default()
    })
}

impl H {
    async fn new() -> H {
        let reg = Registry::start();
        let pusher = Pusher::new(&reg);
        pusher
            .image("test/crash", "v1", &test_image("containers"))
            .await;
        pusher
            .image("test/crash-pull", "v1", &test_image("pulled"))
            .await;
        let points = tempfile::Builder::new()
            .prefix("crust-crash-points-")
            .tempdir()
            .unwrap();
        let d = Daemon::builder()
            .env("CRUST_CRASH_POINTS", points.path().display().to_string())
            .start()
            .await;
        let net = TestNetwork::install(&d, &[]);
        let image = format!("{}/test/crash:v1", reg.host);
        let pull_image = format!("{}/test/crash-pull:v1", reg.host);
        let mut ic = d.image_v1().await;
        ic.pull_image(v1::PullImageRequest {
            image: Some(image_spec(&image)),
            ..Default::default()
        })
        .await
        .expect("pull the test image");
        let rt = d.runtime_v1().await;
        let mut h = H {
            net,
            rt,
            ic,
            d,
            _reg: reg,
            parent: CgroupParent(format!("/crust-test-{}-crash", std::process::id())),
            logs: tempfile::tempdir().unwrap(),
            points,
            image,
            pull_image,
            steady: Default::default(),
            baseline: None,
            trials: 0,
            count: BTreeMap::new(),
            not_ready_after_restart: 0,
        };
        let pod = h.run_pod("steady", false).await.unwrap();
        let ctr = h.create(&pod, "steady").await.unwrap();
        h.start(&ctr).await.unwrap();
        let pid = h.pid_of(&ctr).await;
        h.steady = (pod.0, ctr, pid);
        h.baseline = Some(h.snapshot().await);
        h
    }

    fn pod_config(&self, name: &str, host_network: bool) -> v1::PodSandboxConfig {
        v1::PodSandboxConfig {
            metadata: Some(v1::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "crust-crash".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self.logs.path().join(name).display().to_string(),
            linux: Some(v1::LinuxPodSandboxConfig {
                cgroup_parent: self.parent.0.clone(),
                security_context: Some(v1::LinuxSandboxSecurityContext {
                    namespace_options: Some(v1::NamespaceOption {
                        network: if host_network {
                            v1::NamespaceMode::Node as i32
                        } else {
                            v1::NamespaceMode::Pod as i32
                        },
                        // A shared PID namespace: the pod has a pause
                        // process too.
                        pid: v1::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container_config(&self, name: &str) -> v1::ContainerConfig {
        v1::ContainerConfig {
            metadata: Some(v1::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(image_spec(&self.image)),
            log_path: format!("{name}.log"),
            linux: Some(v1::LinuxContainerConfig::default()),
            ..Default::default()
        }
    }

    async fn run_pod(
        &mut self,
        name: &str,
        host_network: bool,
    ) -> Result<(String, v1::PodSandboxConfig), Status> {
        let config = self.pod_config(name, host_network);
        let id = self
            .rt
            .run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await?
            .into_inner()
            .pod_sandbox_id;
        Ok((id, config))
    }

    async fn create(
        &mut self,
        pod: &(String, v1::PodSandboxConfig),
        name: &str,
    ) -> Result<String, Status> {
        let config = self.container_config(name);
        Ok(self
            .rt
            .create_container(v1::CreateContainerRequest {
                pod_sandbox_id: pod.0.clone(),
                config: Some(config),
                sandbox_config: Some(pod.1.clone()),
            })
            .await?
            .into_inner()
            .container_id)
    }

    async fn start(&mut self, id: &str) -> Result<(), Status> {
        self.rt
            .start_container(v1::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .map(drop)
    }

    async fn container(&mut self, id: &str) -> Option<(v1::ContainerStatus, i32)> {
        match self
            .rt
            .container_status(v1::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                let info: serde_json::Value =
                    serde_json::from_str(r.info.get("info").map_or("{}", |s| s)).unwrap();
                let pid = info["pid"].as_i64().unwrap_or(0) as i32;
                Some((r.status.unwrap(), pid))
            }
            Err(e) if e.code() == Code::NotFound => None,
            Err(e) => panic!("ContainerStatus {id}: {e}"),
        }
    }

    async fn pid_of(&mut self, id: &str) -> i32 {
        self.container(id).await.expect("container").1
    }

    /// The pods of this name (the trial's), any state.
    async fn pods_named(&mut self, name: &str) -> Vec<v1::PodSandbox> {
        self.rt
            .list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items
            .into_iter()
            .filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == name))
            .collect()
    }

    async fn containers_named(&mut self, pod: &str, name: &str) -> Vec<v1::Container> {
        self.rt
            .list_containers(v1::ListContainersRequest {
                filter: Some(v1::ContainerFilter {
                    pod_sandbox_id: pod.into(),
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .containers
            .into_iter()
            .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
            .collect()
    }

    async fn exec(&mut self, id: &str, script: &str) -> Result<(i32, String), Status> {
        let r = self
            .rt
            .exec_sync(v1::ExecSyncRequest {
                container_id: id.into(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout: 20,
            })
            .await?
            .into_inner();
        Ok((r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned()))
    }

    async fn remove_pod(&mut self, id: &str) -> Result<(), Status> {
        self.rt
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await?;
        self.rt
            .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .map(drop)
    }

    fn monitors(&self) -> Vec<String> {
        monitor_processes(&self.d.run_dir)
            .into_iter()
            .map(|(_, c)| c)
            .collect()
    }

    async fn snapshot(&mut self) -> Snapshot {
        let mut pods: Vec<String> = self
            .rt
            .list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items
            .into_iter()
            .map(|p| p.id)
            .collect();
        pods.sort();
        let mut containers: Vec<String> = crust_test_support::cri::list_containers(&mut self.rt)
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        containers.sort();
        let mut mounts = mounts_under(&self.d.run_dir);
        mounts.extend(mounts_under(&self.d.root));
        mounts.sort();
        let ls = |p: PathBuf| {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        let mut dirs = BTreeMap::new();
        for (k, p) in [
            ("run/pods", self.d.run_dir.join("pods")),
            ("root/pods", self.d.root.join("pods")),
            ("run/containers", self.d.run_dir.join("containers")),
            ("root/containers", self.d.root.join("containers")),
            ("root/content/ingest", self.d.root.join("content/ingest")),
        ] {
            dirs.insert(k.to_string(), ls(p));
        }
        let iptables = iptables_save()
            .lines()
            .filter(|l| l.contains(&self.net.name))
            .count();
        let mut leases = self.net.leases();
        leases.sort();
        Snapshot {
            pods,
            containers,
            mounts,
            dirs,
            cgroups: self.parent.below(),
            veths: self.net.veths().len(),
            leases,
            monitors: self.monitors().len(),
            cni_cache: ls(self.d.root.join("cni/cache")),
            iptables,
        }
    }

    /// Nothing but the long-running pod is left (monitor processes may
    /// take a moment to leave).
    async fn assert_no_leaks(&mut self, what: &str) {
        let baseline = self.baseline.clone().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.snapshot().await;
            if now == baseline {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{what}: left behind (now vs. baseline):\n{now:#?}\n{baseline:#?}\nmonitors:\n{}\n--- log ---\n{}",
                    self.monitors().join("\n"),
                    tail(&self.d.logs(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The long-running container noticed nothing.
    async fn assert_steady(&mut self, what: &str) {
        let (_, ctr, pid) = self.steady.clone();
        let (status, now) = self.container(&ctr).await.expect("the steady container");
        assert_eq!(
            status.state,
            v1::ContainerState::ContainerRunning as i32,
            "{what}: the long-running container is not running: {status:?}"
        );
        assert_eq!(now, pid, "{what}: the long-running container's pid changed");
        assert!(process_alive(pid), "{what}: its process is gone");
        let out = self.exec(&ctr, "echo alive").await;
        assert_eq!(
            out.map(|(c, o)| (c, o.trim().to_string()))
                .map_err(|e| e.to_string()),
            Ok((0, "alive".into())),
            "{what}: exec in the long-running container"
        );
    }

    fn trace_path(&self) -> PathBuf {
        self.points.path().join("trace")
    }

    fn arm(&self, point: &str) {
        std::fs::write(self.points.path().join("at"), point).unwrap();
    }

    fn disarm(&self) {
        let _ = std::fs::remove_file(self.points.path().join("at"));
    }

    /// The crash points passed since the last call, in order, each once.
    fn take_trace(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.trace_path()).unwrap_or_default();
        let _ = std::fs::remove_file(self.trace_path());
        let mut seen = BTreeSet::new();
        text.lines()
            .filter(|l| seen.insert(l.to_string()))
            .map(str::to_string)
            .collect()
    }

    /// What a trial of `rpc` makes before the RPC.
    async fn setup(&mut self, rpc: Rpc, name: &str) -> Trial {
        let mut t = Trial {
            name: name.to_string(),
            ..Default::default()
        };
        match rpc {
            Rpc::RunPodCni | Rpc::RunPodHostNetwork => {}
            Rpc::PullImage => {
                self.ic
                    .remove_image(v1::RemoveImageRequest {
                        image: Some(image_spec(&self.pull_image)),
                    })
                    .await
                    .expect("remove the image to pull");
            }
            _ => {
                let pod = self.run_pod(name, false).await.expect("setup: pod");
                if rpc != Rpc::CreateContainer {
                    let c = self.create(&pod, name).await.expect("setup: container");
                    if rpc != Rpc::StartContainer {
                        self.start(&c).await.expect("setup: start");
                        t.pid = Some(self.pid_of(&c).await);
                    }
                    t.container = Some(c);
                }
                t.pod = Some(pod);
            }
        }
        t
    }

    /// The RPC under test, on a client of its own (the daemon may die
    /// under it).
    async fn rpc(&self, rpc: Rpc, t: &Trial) -> Result<(), Status> {
        let ch = self.d.channel().await.unwrap();
        let mut rt = Rt::new(ch.clone());
        let mut ic = Img::new(ch);
        let ctr = || t.container.clone().unwrap_or_default();
        let pod_id = || t.pod.as_ref().map(|p| p.0.clone()).unwrap_or_default();
        let call = async {
            match rpc {
                Rpc::RunPodCni | Rpc::RunPodHostNetwork => rt
                    .run_pod_sandbox(v1::RunPodSandboxRequest {
                        config: Some(self.pod_config(&t.name, rpc == Rpc::RunPodHostNetwork)),
                        runtime_handler: String::new(),
                    })
                    .await
                    .map(drop),
                Rpc::CreateContainer => {
                    let pod = t.pod.clone().unwrap();
                    rt.create_container(v1::CreateContainerRequest {
                        pod_sandbox_id: pod.0,
                        config: Some(self.container_config(&t.name)),
                        sandbox_config: Some(pod.1),
                    })
                    .await
                    .map(drop)
                }
                Rpc::StartContainer => rt
                    .start_container(v1::StartContainerRequest {
                        container_id: ctr(),
                    })
                    .await
                    .map(drop),
                Rpc::StopContainer => rt
                    .stop_container(v1::StopContainerRequest {
                        container_id: ctr(),
                        timeout: 0,
                    })
                    .await
                    .map(drop),
                Rpc::RemoveContainer => rt
                    .remove_container(v1::RemoveContainerRequest {
                        container_id: ctr(),
                    })
                    .await
                    .map(drop),
                Rpc::StopPod => rt
                    .stop_pod_sandbox(v1::StopPodSandboxRequest {
                        pod_sandbox_id: pod_id(),
                    })
                    .await
                    .map(drop),
                Rpc::RemovePod => rt
                    .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                        pod_sandbox_id: pod_id(),
                    })
                    .await
                    .map(drop),
                Rpc::PullImage => ic
                    .pull_image(v1::PullImageRequest {
                        image: Some(image_spec(&self.pull_image)),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
                Rpc::ExecSync => rt
                    .exec_sync(v1::ExecSyncRequest {
                        container_id: ctr(),
                        cmd: vec!["sh".into(), "-c".into(), "echo out".into()],
                        timeout: 20,
                    })
                    .await
                    .map(|r| assert_eq!(r.into_inner().stdout, b"out\n")),
            }
        };
        match tokio::time::timeout(RPC_TIMEOUT, call).await {
            Ok(r) => r,
            Err(_) => panic!("{rpc:?} took over {RPC_TIMEOUT:?}"),
        }
    }

    /// After the restart: the state is one kubelet can go on from, and
    /// its retry (or the life cycle's next step) succeeds.
    async fn check_and_retry(&mut self, rpc: Rpc, t: &mut Trial, what: &str) {
        let logs = |h: &H| tail(&h.d.logs(), 80);
        match rpc {
            Rpc::RunPodCni | Rpc::RunPodHostNetwork => {
                let pods = self.pods_named(&t.name).await;
                assert!(pods.len() <= 1, "{what}: {pods:?}");
                let host = rpc == Rpc::RunPodHostNetwork;
                let id = match pods.first() {
                    // Ready, and kubelet adopts it.
                    Some(p) if p.state == v1::PodSandboxState::SandboxReady as i32 => p.id.clone(),
                    // Not ready: the restart could not undo the creation
                    // (seen: a CNI plugin killed with the daemon halfway
                    // through ADD leaves iptables rules its DEL then trips
                    // over). Kubelet removes such a sandbox and runs the
                    // same attempt again: both must work.
                    Some(p) => {
                        assert!(
                            !host,
                            "{what}: a host-network pod left half-made: {p:?}\n{}",
                            logs(self)
                        );
                        self.not_ready_after_restart += 1;
                        eprintln!("{what}: NOTREADY after the restart; removed and run again");
                        self.remove_pod(&p.id).await.unwrap_or_else(|e| {
                            panic!(
                                "{what}: removing the NOTREADY pod failed: {e}\n{}",
                                logs(self)
                            )
                        });
                        match self.run_pod(&t.name, host).await {
                            Ok((id, _)) => id,
                            Err(e) => panic!("{what}: the retry failed: {e}\n{}", logs(self)),
                        }
                    }
                    // Undone: kubelet's retry, same name and attempt.
                    None => match self.run_pod(&t.name, host).await {
                        Ok((id, _)) => id,
                        Err(e) => panic!("{what}: the retry failed: {e}\n{}", logs(self)),
                    },
                };
                let s = self
                    .rt
                    .pod_sandbox_status(v1::PodSandboxStatusRequest {
                        pod_sandbox_id: id.clone(),
                        verbose: false,
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .status
                    .unwrap();
                assert_eq!(s.state, v1::PodSandboxState::SandboxReady as i32);
                if rpc == Rpc::RunPodCni {
                    let ip = s.network.map(|n| n.ip).unwrap_or_default();
                    assert!(!ip.is_empty(), "{what}: a ready pod without an IP");
                }
                t.pod = Some((id, self.pod_config(&t.name, false)));
            }
            Rpc::CreateContainer => {
                let pod = t.pod.clone().unwrap();
                let found = self.containers_named(&pod.0, &t.name).await;
                assert!(found.len() <= 1, "{what}: {found:?}");
                let id = match found.first() {
                    Some(c) => {
                        assert_eq!(
                            c.state,
                            v1::ContainerState::ContainerCreated as i32,
                            "{what}: {c:?}"
                        );
                        c.id.clone()
                    }
                    None => match self.create(&pod, &t.name).await {
                        Ok(id) => id,
                        Err(e) => panic!("{what}: the retry failed: {e}\n{}", logs(self)),
                    },
                };
                self.start(&id)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: starting the created container: {e}"));
                assert_eq!(
                    self.exec(&id, "true")
                        .await
                        .map(|r| r.0)
                        .map_err(|e| e.to_string()),
                    Ok(0)
                );
            }
            Rpc::StartContainer => {
                let id = t.container.clone().unwrap();
                let (s, pid) = self.container(&id).await.expect("the container");
                if s.state == v1::ContainerState::ContainerCreated as i32 {
                    // Not started: the user's process must not run.
                    assert!(
                        !cmdline(pid).contains("sleep"),
                        "{what}: CREATED while its process runs: {}",
                        cmdline(pid)
                    );
                    self.start(&id).await.unwrap_or_else(|e| {
                        panic!("{what}: the retry failed: {e}\n{}", logs(self))
                    });
                } else {
                    assert_eq!(
                        s.state,
                        v1::ContainerState::ContainerRunning as i32,
                        "{what}: {s:?}\n{}",
                        logs(self)
                    );
                }
                let (s, pid) = self.container(&id).await.unwrap();
                assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
                // A start returns once the runtime let the process go; it
                // execs the image's command a moment later.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !cmdline(pid).contains("sleep") {
                    assert!(Instant::now() < deadline, "{what}: {}", cmdline(pid));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(
                    self.exec(&id, "true")
                        .await
                        .map(|r| r.0)
                        .map_err(|e| e.to_string()),
                    Ok(0)
                );
            }
            Rpc::StopContainer => {
                let id = t.container.clone().unwrap();
                let (s, _) = self.container(&id).await.expect("the container");
                if s.state == v1::ContainerState::ContainerExited as i32 {
                    assert_eq!(s.exit_code, 137, "{what}: a lost exit code: {s:?}");
                } else {
                    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
                }
                self.rt
                    .stop_container(v1::StopContainerRequest {
                        container_id: id.clone(),
                        timeout: 0,
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the retry failed: {e}"));
                let (s, _) = self.container(&id).await.unwrap();
                assert_eq!(
                    (s.state, s.exit_code),
                    (v1::ContainerState::ContainerExited as i32, 137),
                    "{what}: {s:?}"
                );
                assert!(
                    !process_alive(t.pid.unwrap()),
                    "{what}: the process runs on"
                );
            }
            Rpc::RemoveContainer => {
                let id = t.container.clone().unwrap();
                self.rt
                    .remove_container(v1::RemoveContainerRequest {
                        container_id: id.clone(),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the retry failed: {e}\n{}", logs(self)));
                assert!(self.container(&id).await.is_none());
                assert!(
                    !process_alive(t.pid.unwrap()),
                    "{what}: the process runs on"
                );
            }
            Rpc::StopPod => {
                let pod = t.pod.clone().unwrap().0;
                self.rt
                    .stop_pod_sandbox(v1::StopPodSandboxRequest {
                        pod_sandbox_id: pod.clone(),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the retry failed: {e}\n{}", logs(self)));
                let pods = self.pods_named(&t.name).await;
                assert_eq!(
                    pods.iter().map(|p| p.state).collect::<Vec<_>>(),
                    [v1::PodSandboxState::SandboxNotready as i32],
                    "{what}"
                );
                let id = t.container.clone().unwrap();
                let (s, _) = self.container(&id).await.unwrap();
                assert_eq!(
                    (s.state, s.exit_code),
                    (v1::ContainerState::ContainerExited as i32, 137),
                    "{what}: {s:?}"
                );
            }
            Rpc::RemovePod => {
                let pod = t.pod.clone().unwrap().0;
                self.rt
                    .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                        pod_sandbox_id: pod.clone(),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the retry failed: {e}\n{}", logs(self)));
                assert!(self.pods_named(&t.name).await.is_empty());
                t.pod = None;
            }
            Rpc::PullImage => {
                self.ic
                    .pull_image(v1::PullImageRequest {
                        image: Some(image_spec(&self.pull_image)),
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the retry failed: {e}\n{}", logs(self)));
                let s = self
                    .ic
                    .image_status(v1::ImageStatusRequest {
                        image: Some(image_spec(&self.pull_image)),
                        verbose: false,
                    })
                    .await
                    .unwrap()
                    .into_inner();
                assert!(s.image.is_some(), "{what}: pulled but not there");
            }
            Rpc::ExecSync => {
                let id = t.container.clone().unwrap();
                let (s, pid) = self.container(&id).await.unwrap();
                assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
                assert_eq!(Some(pid), t.pid, "{what}: the container was restarted");
                let out = self.exec(&id, "echo out").await;
                assert_eq!(
                    out.map_err(|e| e.to_string()),
                    Ok((0, "out\n".into())),
                    "{what}: the retry failed"
                );
            }
        }
    }

    /// One trial: set up, kill the daemon as `kill` says during `rpc`,
    /// restart, check, retry, clean up, check for leaks. Returns the crash
    /// points the RPC passed and how long it took (for the discovery run).
    async fn trial(&mut self, rpc: Rpc, kill: Kill) -> (Vec<String>, Duration) {
        self.trials += 1;
        let name = format!("t{}", self.trials);
        let what = format!("trial {name}: {rpc:?}, kill {kill:?}");
        *self.count.entry(format!("{rpc:?}")).or_default() += 1;
        let mut t = self.setup(rpc, &name).await;
        self.take_trace();
        let started = Instant::now();
        let (points, took) = match &kill {
            Kill::None => {
                let r = self.rpc(rpc, &t).await;
                let took = started.elapsed();
                r.unwrap_or_else(|e| panic!("{what}: {e}"));
                (self.take_trace(), took)
            }
            Kill::At(point) => {
                self.arm(point);
                let r = self.rpc(rpc, &t).await;
                let exit = self.d.wait_exit(Duration::from_secs(20)).await;
                self.disarm();
                assert!(
                    exit.is_some(),
                    "{what}: the daemon did not reach the point (the RPC answered {r:?})"
                );
                assert!(r.is_err(), "{what}: the RPC succeeded although killed");
                (Vec::new(), Duration::ZERO)
            }
            Kill::After(delay) => {
                let delay = *delay;
                let pid = self.d.pid();
                let killer = async move {
                    tokio::time::sleep(delay).await;
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                };
                let (_r, ()) = tokio::join!(self.rpc(rpc, &t), killer);
                let exit = self.d.wait_exit(Duration::from_secs(20)).await;
                assert!(exit.is_some(), "{what}: the daemon survived SIGKILL");
                (Vec::new(), Duration::ZERO)
            }
        };
        if !matches!(kill, Kill::None) {
            self.d.start_again().await;
            self.rt = self.d.runtime_v1().await;
            self.ic = self.d.image_v1().await;
            self.take_trace();
            self.assert_steady(&what).await;
            self.check_and_retry(rpc, &mut t, &what).await;
        }
        // Clean up as kubelet would, then nothing may be left.
        let pod = match rpc {
            Rpc::RunPodCni | Rpc::RunPodHostNetwork => {
                self.pods_named(&name).await.first().map(|p| p.id.clone())
            }
            _ => t.pod.as_ref().map(|p| p.0.clone()),
        };
        if let Some(pod) = pod {
            self.remove_pod(&pod)
                .await
                .unwrap_or_else(|e| panic!("{what}: removing the pod: {e}"));
        }
        self.take_trace();
        self.assert_no_leaks(&what).await;
        (points, took)
    }

    /// A crash inside the namespace pinning (between creating the pin
    /// files and mounting the namespaces onto them), which no crash point
    /// reaches: the daemon is killed right after the pod's dirs exist and
    /// the files such a crash leaves are made by hand, in the staging dir
    /// and (as older daemons left them) where the pins go. The restart
    /// undoes the pod; the retry works.
    async fn crash_inside_pinning(&mut self) {
        self.trials += 1;
        let name = format!("t{}", self.trials);
        let what = format!("trial {name}: a crash inside the pinning");
        *self
            .count
            .entry("RunPodCni (inside pinning)".into())
            .or_default() += 1;
        self.arm("pod.run.dirs");
        let r = self
            .rpc(
                Rpc::RunPodCni,
                &Trial {
                    name: name.clone(),
                    ..Default::default()
                },
            )
            .await;
        assert!(
            self.d.wait_exit(Duration::from_secs(20)).await.is_some(),
            "{what}: {r:?}"
        );
        self.disarm();
        let steady = self.steady.0.clone();
        let pods = self.d.run_dir.join("pods");
        let dir = std::fs::read_dir(&pods)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| !p.ends_with(&steady))
            .expect("the crashed pod's dir");
        for sub in ["ns.pinning", "ns"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            for kind in ["net", "ipc", "uts"] {
                std::fs::write(dir.join(sub).join(kind), b"").unwrap();
            }
        }
        self.d.start_again().await;
        self.rt = self.d.runtime_v1().await;
        self.ic = self.d.image_v1().await;
        self.assert_steady(&what).await;
        let mut t = Trial {
            name: name.clone(),
            ..Default::default()
        };
        self.check_and_retry(Rpc::RunPodCni, &mut t, &what).await;
        let id = t.pod.unwrap().0;
        self.remove_pod(&id).await.unwrap();
        self.take_trace();
        self.assert_no_leaks(&what).await;
    }

    /// A crash inside the bridge plugin's DEL, after it deleted the pod's
    /// interface, which no crash point reaches (random kills did, now and
    /// then): the pod's eth0 is deleted by hand, as that DEL left it, and
    /// the daemon is killed at the point before its own DEL. The plugin
    /// finds its masquerade rules through the addresses on eth0, so the
    /// retried DEL cannot; the daemon removes what the plugins tagged for
    /// the pod (iptables is part of the leak check).
    async fn crash_inside_cni_del(&mut self) {
        self.trials += 1;
        let name = format!("t{}", self.trials);
        let what = format!("trial {name}: a crash inside CNI DEL");
        *self
            .count
            .entry("RemovePod (inside CNI DEL)".into())
            .or_default() += 1;
        let mut t = self.setup(Rpc::RemovePod, &name).await;
        let pod = t.pod.clone().unwrap().0;
        let netns = self.d.run_dir.join("pods").join(&pod).join("ns/net");
        let deleted = std::process::Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["ip", "link", "del", "eth0"])
            .status()
            .unwrap();
        assert!(deleted.success(), "{what}: deleting the pod's eth0");
        self.arm("pod.stop.not_ready");
        let r = self.rpc(Rpc::RemovePod, &t).await;
        assert!(
            self.d.wait_exit(Duration::from_secs(20)).await.is_some(),
            "{what}: {r:?}"
        );
        self.disarm();
        self.d.start_again().await;
        self.rt = self.d.runtime_v1().await;
        self.ic = self.d.image_v1().await;
        self.take_trace();
        self.assert_steady(&what).await;
        self.check_and_retry(Rpc::RemovePod, &mut t, &what).await;
        self.take_trace();
        self.assert_no_leaks(&what).await;
    }

    /// An exit while the daemon is down is recorded at the restart.
    async fn exit_while_down(&mut self) {
        let what = "an exit while the daemon is down";
        let mut t = self.setup(Rpc::ExecSync, "exiter").await;
        self.d
            .signal_and_wait(nix::sys::signal::Signal::SIGKILL, Duration::from_secs(10))
            .await;
        let pid = t.pid.unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) {
            assert!(Instant::now() < deadline, "{what}: the process did not die");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.d.start_again().await;
        self.rt = self.d.runtime_v1().await;
        self.ic = self.d.image_v1().await;
        self.assert_steady(what).await;
        let id = t.container.take().unwrap();
        let (s, _) = self.container(&id).await.unwrap();
        assert_eq!(
            (s.state, s.exit_code),
            (v1::ContainerState::ContainerExited as i32, 137),
            "{what}: {s:?}"
        );
        let pod = t.pod.unwrap().0;
        self.remove_pod(&pod).await.unwrap();
        self.take_trace();
        self.assert_no_leaks(what).await;
    }
}

/// The monitors of the daemon on `run_dir`: (pid, command line).
fn monitor_processes(run_dir: &Path) -> Vec<(i32, String)> {
    let dir = run_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let c = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&c).replace('\0', " ")))
        })
        .filter(|(_, c)| c.contains("crust-shim") && c.contains(&dir))
        .collect()
}

impl Drop for H {
    /// A failed trial may leave the daemon dead, so that the guards cannot
    /// remove the pods through it: its monitors are ended by PID (a
    /// container ends with its monitor); the daemon's guard then unmounts
    /// what is left in the run dir (namespace pins, and with them the
    /// veths), the cgroup parent's guard removes the cgroups.
    fn drop(&mut self) {
        if self.d.is_running() {
            return;
        }
        for (pid, _) in monitor_processes(&self.d.run_dir) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn image_spec(image: &str) -> v1::ImageSpec {
    v1::ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kill_at_every_step_of_every_rpc_is_recovered() {
    let started = Instant::now();
    let random: usize = std::env::var("CRUST_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("CRUST_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill trials: CRUST_KILL_SEED={seed} CRUST_KILL_TRIALS={random}");
    let mut rng = Rng(seed);
    let mut h = H::new().await;

    h.exit_while_down().await;
    h.crash_inside_pinning().await;
    h.crash_inside_cni_del().await;
    let mut points_total = 0;
    for rpc in RPCS {
        let (points, took) = h.trial(rpc, Kill::None).await;
        assert!(
            !points.is_empty(),
            "{rpc:?} passed no crash point (is the daemon a debug build?)"
        );
        eprintln!(
            "{rpc:?}: {} crash points, {took:?}: {points:?}",
            points.len()
        );
        points_total += points.len();
        for point in points {
            h.trial(rpc, Kill::At(point)).await;
        }
        // Random moments, up to a little past the RPC's own duration.
        let span = (took.as_micros() as u64 * 5 / 4).max(1000);
        for _ in 0..random {
            let delay = Duration::from_micros(rng.next() % span);
            h.trial(rpc, Kill::After(delay)).await;
        }
    }

    // The long-running container, stopped at last, tells its exit.
    let (pod, ctr, _) = h.steady.clone();
    h.rt.stop_container(v1::StopContainerRequest {
        container_id: ctr.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let (s, _) = h.container(&ctr).await.unwrap();
    assert_eq!(
        (s.state, s.exit_code),
        (v1::ContainerState::ContainerExited as i32, 137)
    );
    h.remove_pod(&pod).await.unwrap();
    let end = h.snapshot().await;
    assert!(end.pods.is_empty() && end.containers.is_empty(), "{end:#?}");
    assert!(end.mounts.is_empty() && end.cgroups.is_empty(), "{end:#?}");
    assert_eq!((end.veths, end.monitors), (0, 0), "{end:#?}");
    assert!(
        end.leases.is_empty() && end.cni_cache.is_empty(),
        "{end:#?}"
    );
    eprintln!(
        "{} trials ({points_total} crash points, {random} random kills per RPC) in {:?}: {:?}; \
         pods left NOTREADY by a restart (then removed): {}",
        h.trials,
        started.elapsed(),
        h.count,
        h.not_ready_after_restart
    );
}
