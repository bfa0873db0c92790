//! `crust-bench`: latency, throughput and footprint of a CRI endpoint, and
//! the ratio against a second endpoint (`--vs`), measured in alternating
//! rounds so machine drift hits both alike.
//!
//! Everything the bench creates (pods, their containers, images it pulled)
//! is removed through the CRI API at the end, also after an error or
//! Ctrl-C / SIGTERM.

mod push;
mod stats;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use crust_api::v1;
use indicatif::{ProgressBar, ProgressStyle};
use stats::{Figure, Report};
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
#[command(
    name = "crust-bench",
    about = "Benchmark a CRI endpoint",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: Args,
}

#[derive(Subcommand)]
enum Command {
    /// Build the bench's busybox-static image and push it to a registry
    /// (plain http), as REGISTRY/crust-bench/busybox:latest.
    PushTestImage {
        /// host:port of the registry, e.g. 127.0.0.1:5000.
        #[arg(long)]
        registry: String,
    },
    /// Push a pod sandbox ("pause") image made of one static binary, as
    /// REGISTRY/crust-bench/pause:3.9, for runtimes that start a sandbox
    /// container per pod (containerd), on machines without internet.
    PushPauseImage {
        /// host:port of the registry.
        #[arg(long)]
        registry: String,
        /// The static binary to run as /pause.
        #[arg(long)]
        binary: PathBuf,
    },
}

#[derive(clap::Args)]
struct Args {
    /// CRI endpoint under test (unix:///path or a path).
    #[arg(long, default_value = "unix:///run/crust/crust.sock")]
    endpoint: String,
    /// A second endpoint to compare against (e.g. containerd's socket).
    #[arg(long)]
    vs: Option<String>,
    /// Name of --endpoint in the table (default: the endpoint).
    #[arg(long)]
    label: Option<String>,
    /// Name of --vs in the table (default: the endpoint).
    #[arg(long)]
    vs_label: Option<String>,
    /// PID of the daemon behind --endpoint (for its RSS).
    #[arg(long)]
    daemon_pid: Option<u32>,
    /// PID of the daemon behind --vs.
    #[arg(long)]
    vs_daemon_pid: Option<u32>,
    /// Measured iterations of the fast RPCs (Version, Status, ExecSync,
    /// ContainerStatus).
    #[arg(long, default_value_t = 1000)]
    iterations: usize,
    /// Unmeasured warm-up iterations of the fast RPCs.
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Measured iterations of the pod / container lifecycles and lists.
    #[arg(long, default_value_t = 50)]
    lifecycle_iterations: usize,
    /// Warm-up iterations of the pod / container lifecycles and lists.
    #[arg(long, default_value_t = 5)]
    lifecycle_warmup: usize,
    /// Rounds the iterations are split into, alternating endpoints.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Scenarios to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    scenario: Vec<Scenario>,
    /// Image for the container scenarios (pulled once per endpoint).
    #[arg(long)]
    image: Option<String>,
    /// Runtime handlers of the container scenarios, comma-separated
    /// ("" is the endpoint's default).
    #[arg(long, value_delimiter = ',', default_value = "runc,embedded")]
    handler: Vec<String>,
    /// Containers present while ListContainers / ListPodSandbox are timed.
    #[arg(long, default_value_t = 1000)]
    list_containers: usize,
    /// Registry (host:port, plain http) to push the pull scenario's
    /// generated image to.
    #[arg(long)]
    registry: Option<String>,
    /// Size of the pull scenario's image in MiB (split in 5 layers).
    #[arg(long, default_value_t = 100)]
    pull_mib: usize,
    /// Pods (one container each) of the density scenario.
    #[arg(long, default_value_t = 100)]
    density_pods: usize,
    /// Pods (one running container each) present while the metrics and
    /// stats lists are timed.
    #[arg(long, default_value_t = 100)]
    metrics_pods: usize,
    /// How many density pods are started / removed at a time.
    #[arg(long, default_value_t = 10)]
    density_parallel: usize,
    /// cgroup_parent of every pod the bench starts (cgroupfs form), so its
    /// pods never share a cgroup with anyone else's; emptied directories
    /// below it are removed at exit. Default: /crust-bench-<pid>. "" leaves
    /// it to the runtime.
    #[arg(long)]
    cgroup_parent: Option<String>,
    /// Seconds a monitor is left alone before its footprint is read (the
    /// crust monitor trims its working set 2 s after its last request).
    #[arg(long, default_value_t = 3.0)]
    settle_secs: f64,
    /// Images to pull on every endpoint before measuring (e.g. the sandbox
    /// image a runtime pulls on its first RunPodSandbox).
    #[arg(long, value_delimiter = ',')]
    prepull: Vec<String>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The Prometheus endpoint of --endpoint (http://IP:PORT/metrics): the
    /// density scenario scrapes it while its pods run (latency, bytes,
    /// daemon CPU per scrape).
    #[arg(long)]
    metrics_url: Option<String>,
    /// The Prometheus endpoint of --vs.
    #[arg(long)]
    vs_metrics_url: Option<String>,
    /// Timed scrapes of a --metrics-url (after 5 untimed ones).
    #[arg(long, default_value_t = 100)]
    scrapes: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// RuntimeService.Version
    Version,
    /// RuntimeService.Status (verbose=false), what kubelet polls
    Status,
    /// Run/Stop/RemovePodSandbox with host network
    PodHost,
    /// Run/Stop/RemovePodSandbox on the CNI network (when NetworkReady)
    PodCni,
    /// Create/Start/Stop/RemoveContainer per --handler
    Container,
    /// ExecSync `true` in a running container
    ExecSync,
    /// ContainerStatus of a running container
    ContainerStatus,
    /// ListContainers and ListPodSandbox with --list-containers present
    List,
    /// Daemon RSS, monitor RSS/PSS with and without an exec
    Footprint,
    /// PullImage of a generated image, cold and with its layers present
    ImagePull,
    /// --density-pods pods with a container each, --density-parallel at a time
    Density,
    /// ListPodSandboxMetrics, ListContainerStats and ListPodSandboxStats
    /// with --metrics-pods pods (CNI network if ready) running a container each
    Metrics,
}

struct Target {
    name: String,
    index: usize,
    rt: v1::runtime_service_client::RuntimeServiceClient<Channel>,
    img: v1::image_service_client::ImageServiceClient<Channel>,
    pid: Option<u32>,
    network_ready: bool,
    /// The container image as the endpoint resolved it.
    image: Option<String>,
    /// Fixtures of the scenario being measured.
    pods: Vec<(String, String, v1::PodSandboxConfig)>,
    container: Option<String>,
    /// Left out of the scenario being measured (e.g. it has no such
    /// runtime handler).
    skip: bool,
    /// Its Prometheus endpoint, if it has one.
    metrics_url: Option<String>,
}

/// Pods created and not yet removed, as (target index, pod id): removed at
/// exit whatever happened.
static CREATED: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
/// Images pulled by the pull scenario, as (target index, image ref).
static PULLED: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());
static SEQ: AtomicU64 = AtomicU64::new(0);
/// cgroup_parent of the bench's pods ("" = the runtime's default).
static CGROUP_PARENT: OnceLock<String> = OnceLock::new();

fn track(index: usize, pod: &str) {
    CREATED.lock().unwrap().push((index, pod.to_string()));
}

fn untrack(index: usize, pod: &str) {
    CREATED
        .lock()
        .unwrap()
        .retain(|(i, p)| !(*i == index && p == pod));
}

fn log_root() -> PathBuf {
    std::env::temp_dir().join(format!("crust-bench-{}", std::process::id()))
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

async fn connect(
    endpoint: &str,
    label: Option<&String>,
    index: usize,
    pid: Option<u32>,
) -> anyhow::Result<Target> {
    let uri = if endpoint.starts_with("unix:") {
        endpoint.to_string()
    } else {
        format!("unix://{endpoint}")
    };
    let channel = Endpoint::from_shared(uri.clone())?
        .connect()
        .await
        .with_context(|| format!("connecting to {uri}"))?;
    let mut rt = v1::runtime_service_client::RuntimeServiceClient::new(channel.clone());
    let status = rt
        .status(v1::StatusRequest { verbose: false })
        .await
        .with_context(|| format!("Status of {endpoint}"))?
        .into_inner();
    let network_ready = status
        .status
        .map(|s| {
            s.conditions
                .iter()
                .any(|c| c.r#type == "NetworkReady" && c.status)
        })
        .unwrap_or(false);
    Ok(Target {
        name: label.cloned().unwrap_or_else(|| endpoint.to_string()),
        index,
        rt,
        img: v1::image_service_client::ImageServiceClient::new(channel),
        pid,
        network_ready,
        image: None,
        pods: Vec::new(),
        container: None,
        skip: false,
        metrics_url: None,
    })
}

fn pod_config(name: &str, host_network: bool) -> v1::PodSandboxConfig {
    let network = if host_network {
        v1::NamespaceMode::Node
    } else {
        v1::NamespaceMode::Pod
    };
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "crust-bench".into(),
            attempt: 0,
        }),
        // As kubelet: a host-network pod keeps the node's UTS namespace and
        // hostname.
        hostname: if host_network {
            String::new()
        } else {
            name.into()
        },
        log_directory: log_root().join(name).display().to_string(),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: CGROUP_PARENT.get().cloned().unwrap_or_default(),
            security_context: Some(v1::LinuxSandboxSecurityContext {
                // kubelet's defaults: pod network and IPC, per-container
                // PID namespace (no pause process).
                namespace_options: Some(v1::NamespaceOption {
                    network: network as i32,
                    pid: v1::NamespaceMode::Container as i32,
                    ipc: v1::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of the pod `sandbox`, in its network namespace mode (as
/// kubelet asks: NODE in a host-network pod).
fn container_config(
    name: &str,
    image: &str,
    sandbox: &v1::PodSandboxConfig,
) -> v1::ContainerConfig {
    let network = sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .map_or(0, |n| n.network);
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: vec!["sleep".into(), "3600".into()],
        log_path: format!("{name}.log"),
        linux: Some(v1::LinuxContainerConfig {
            security_context: Some(v1::LinuxContainerSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network,
                    pid: v1::NamespaceMode::Container as i32,
                    ipc: v1::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

type RuntimeClient = v1::runtime_service_client::RuntimeServiceClient<Channel>;

async fn run_pod(
    rt: &mut RuntimeClient,
    index: usize,
    handler: &str,
    host_network: bool,
) -> anyhow::Result<(String, v1::PodSandboxConfig)> {
    let config = pod_config(&unique("bench"), host_network);
    // As kubelet: the pod's log directory exists before the pod.
    std::fs::create_dir_all(&config.log_directory)
        .with_context(|| format!("creating {}", config.log_directory))?;
    let id = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id;
    track(index, &id);
    Ok((id, config))
}

async fn remove_pod(rt: &mut RuntimeClient, index: usize, id: &str) -> anyhow::Result<()> {
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .context("StopPodSandbox")?;
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .context("RemovePodSandbox")?;
    untrack(index, id);
    Ok(())
}

async fn create_container(
    rt: &mut RuntimeClient,
    pod: &(String, v1::PodSandboxConfig),
    image: &str,
) -> anyhow::Result<String> {
    Ok(rt
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: pod.0.clone(),
            config: Some(container_config(&unique("c"), image, &pod.1)),
            sandbox_config: Some(pod.1.clone()),
        })
        .await
        .context("CreateContainer")?
        .into_inner()
        .container_id)
}

async fn start_container(rt: &mut RuntimeClient, id: &str) -> anyhow::Result<()> {
    rt.start_container(v1::StartContainerRequest {
        container_id: id.into(),
    })
    .await
    .context("StartContainer")?;
    Ok(())
}

fn handler_label(h: &str) -> &str {
    if h.is_empty() { "default" } else { h }
}

/// One timed operation of a scenario.
#[derive(Clone)]
enum Op {
    Version,
    Status,
    Pod {
        cni: bool,
    },
    /// Uses the fixture pod `t.pods[0]`.
    Container {
        handler: String,
    },
    /// Uses the fixture container.
    ExecSync,
    ContainerStatus,
    ListContainers,
    ListPods,
    ListPodSandboxMetrics,
    ListContainerStats,
    ListPodSandboxStats,
}

type Phases = Vec<(String, Duration)>;

async fn once(t: &mut Target, op: &Op) -> anyhow::Result<Phases> {
    let start = Instant::now();
    let one = |name: &str, start: Instant| vec![(name.to_string(), start.elapsed())];
    match op {
        Op::Version => {
            t.rt.version(v1::VersionRequest::default()).await?;
            Ok(one("Version", start))
        }
        Op::Status => {
            t.rt.status(v1::StatusRequest { verbose: false }).await?;
            Ok(one("Status", start))
        }
        Op::Pod { cni } => {
            let net = if *cni { "cni" } else { "host" };
            let (id, _) = run_pod(&mut t.rt, t.index, "", !cni).await?;
            let ran = start.elapsed();
            let s = Instant::now();
            t.rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .context("StopPodSandbox")?;
            let stopped = s.elapsed();
            let s = Instant::now();
            t.rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .context("RemovePodSandbox")?;
            let removed = s.elapsed();
            untrack(t.index, &id);
            Ok(vec![
                (format!("pod {net} run"), ran),
                (format!("pod {net} stop"), stopped),
                (format!("pod {net} remove"), removed),
                (format!("pod {net} total"), start.elapsed()),
            ])
        }
        Op::Container { handler } => {
            let h = handler_label(handler);
            let (_, pod_id, config) = t.pods.first().context("no fixture pod")?.clone();
            let image = t.image.clone().context("no image")?;
            let id = create_container(&mut t.rt, &(pod_id, config), &image).await?;
            let created = start.elapsed();
            let s = Instant::now();
            start_container(&mut t.rt, &id).await?;
            let started = s.elapsed();
            let s = Instant::now();
            t.rt.stop_container(v1::StopContainerRequest {
                container_id: id.clone(),
                timeout: 0,
            })
            .await
            .context("StopContainer")?;
            let stopped = s.elapsed();
            let s = Instant::now();
            t.rt.remove_container(v1::RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await
            .context("RemoveContainer")?;
            let removed = s.elapsed();
            Ok(vec![
                (format!("ctr[{h}] create"), created),
                (format!("ctr[{h}] start"), started),
                (format!("ctr[{h}] create+start"), created + started),
                (format!("ctr[{h}] stop"), stopped),
                (format!("ctr[{h}] remove"), removed),
            ])
        }
        Op::ExecSync => {
            let id = t.container.clone().context("no fixture container")?;
            let r =
                t.rt.exec_sync(v1::ExecSyncRequest {
                    container_id: id,
                    cmd: vec!["true".into()],
                    timeout: 10,
                })
                .await
                .context("ExecSync")?
                .into_inner();
            if r.exit_code != 0 {
                bail!(
                    "ExecSync true exited {}: {}",
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr)
                );
            }
            Ok(one("ExecSync true", start))
        }
        Op::ContainerStatus => {
            let id = t.container.clone().context("no fixture container")?;
            t.rt.container_status(v1::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
            .context("ContainerStatus")?;
            Ok(one("ContainerStatus", start))
        }
        Op::ListContainers => {
            let n =
                t.rt.list_containers(v1::ListContainersRequest::default())
                    .await
                    .context("ListContainers")?
                    .into_inner()
                    .containers
                    .len();
            Ok(one(&format!("ListContainers ({n})"), start))
        }
        Op::ListPods => {
            let n =
                t.rt.list_pod_sandbox(v1::ListPodSandboxRequest::default())
                    .await
                    .context("ListPodSandbox")?
                    .into_inner()
                    .items
                    .len();
            Ok(one(&format!("ListPodSandbox ({n})"), start))
        }
        Op::ListPodSandboxMetrics => {
            let pods =
                t.rt.list_pod_sandbox_metrics(v1::ListPodSandboxMetricsRequest::default())
                    .await
                    .context("ListPodSandboxMetrics")?
                    .into_inner()
                    .pod_metrics;
            let series: usize = pods
                .iter()
                .map(|p| {
                    p.metrics.len()
                        + p.container_metrics
                            .iter()
                            .map(|c| c.metrics.len())
                            .sum::<usize>()
                })
                .sum();
            // The series count is in the name: it says what one call costs.
            Ok(one(
                &format!(
                    "ListPodSandboxMetrics ({} pods, {series} series)",
                    pods.len()
                ),
                start,
            ))
        }
        Op::ListContainerStats => {
            let n =
                t.rt.list_container_stats(v1::ListContainerStatsRequest::default())
                    .await
                    .context("ListContainerStats")?
                    .into_inner()
                    .stats
                    .len();
            Ok(one(&format!("ListContainerStats ({n})"), start))
        }
        Op::ListPodSandboxStats => {
            let n =
                t.rt.list_pod_sandbox_stats(v1::ListPodSandboxStatsRequest::default())
                    .await
                    .context("ListPodSandboxStats")?
                    .into_inner()
                    .stats
                    .len();
            Ok(one(&format!("ListPodSandboxStats ({n})"), start))
        }
    }
}

fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:<28} [{bar:40}] {pos}/{len} {elapsed_precise}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.to_string());
    pb
}

/// Warm-up, then `iterations` timed runs of `op` per target, split in
/// `rounds` rounds alternating the targets.
async fn measure(
    report: &mut Report,
    targets: &mut [Target],
    op: &Op,
    label: &str,
    warmup: usize,
    iterations: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    let active = targets.iter().filter(|t| !t.skip).count();
    let pb = bar(((warmup + iterations) * active) as u64, label);
    for t in targets.iter_mut().filter(|t| !t.skip) {
        for _ in 0..warmup {
            once(t, op).await?;
            pb.inc(1);
        }
    }
    let per_round = iterations.div_ceil(rounds.max(1));
    // Per target: phases in first-seen order with their samples.
    let mut samples: Vec<Vec<(String, Vec<Duration>)>> = vec![Vec::new(); targets.len()];
    let mut done: Vec<usize> = targets
        .iter()
        .map(|t| if t.skip { iterations } else { 0 })
        .collect();
    while done.iter().any(|&d| d < iterations) {
        for (i, t) in targets.iter_mut().enumerate() {
            for _ in 0..per_round {
                if done[i] >= iterations {
                    break;
                }
                for (phase, d) in once(t, op).await? {
                    match samples[i].iter_mut().find(|(p, _)| *p == phase) {
                        Some((_, v)) => v.push(d),
                        None => samples[i].push((phase, vec![d])),
                    }
                }
                done[i] += 1;
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    for (t, phases) in targets.iter().zip(samples) {
        for (phase, s) in phases {
            report.results.push(stats::summarize(&phase, &t.name, s));
        }
    }
    Ok(())
}

/// (VmRSS, VmHWM) of a process in KiB.
fn proc_rss(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// (Rss, Pss) of a process in KiB, from smaps_rollup.
fn rss_pss(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((field("Rss:")?, field("Pss:")?))
}

fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    pids.sort();
    pids
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: fields follow the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether `pid` is in the container's cgroup: with the cgroupfs driver
/// every runtime names it after the container ID (crust `crust-<id>`,
/// containerd `<id>`).
fn in_container_cgroup(pid: u32, container_id: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
        s.lines().any(|l| {
            l.rsplit('/')
                .next()
                .is_some_and(|last| last.ends_with(container_id))
        })
    })
}

/// The monitor of a running container: the parent of the container's init
/// (the first process of its cgroup whose parent is outside it). That is
/// crust-shim for crust and containerd-shim-runc-v2 for containerd (there
/// one shim serves the whole pod). Falls back to a `*shim*` process whose
/// command line names the container.
fn monitor_of(container_id: &str) -> Option<u32> {
    let all = pids();
    let inside: Vec<u32> = all
        .iter()
        .copied()
        .filter(|&p| in_container_cgroup(p, container_id))
        .collect();
    let from_cgroup = inside
        .iter()
        .filter_map(|&p| ppid(p))
        .find(|pp| !inside.contains(pp) && *pp > 1);
    from_cgroup.or_else(|| {
        all.into_iter().find(|&pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            (String::from_utf8_lossy(argv0).contains("shim") || comm(pid).contains("shim"))
                && String::from_utf8_lossy(&cmdline).contains(container_id)
        })
    })
}

/// Whether `pid` runs in a pod's cgroup below the bench's cgroup parent (a
/// container or a sandbox / pause process, not a monitor).
fn in_pod_cgroup(pid: u32) -> bool {
    let parent = CGROUP_PARENT.get().map_or("", |p| p.trim_end_matches('/'));
    !parent.is_empty()
        && std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
            s.lines().any(|l| {
                l.split(':')
                    .nth(2)
                    .is_some_and(|path| path.starts_with(&format!("{parent}/")))
            })
        })
}

/// The monitor and the helper processes it has running for the container:
/// its descendants outside the container's cgroup (a forked child, a
/// runtime binary, an exec session, a sandbox's pause process), and any
/// other `*shim*` process whose command line names the container.
fn monitor_tree(monitor: u32, container_id: &str) -> Vec<(u32, String)> {
    let all = pids();
    let parent: Vec<(u32, Option<u32>)> = all.iter().map(|&p| (p, ppid(p))).collect();
    let mut tree = vec![monitor];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        for (c, pp) in &parent {
            if *pp == Some(p) && !tree.contains(c) && !in_container_cgroup(*c, container_id) {
                tree.push(*c);
            }
        }
        i += 1;
    }
    for &pid in &all {
        if tree.contains(&pid) || !comm(pid).contains("shim") {
            continue;
        }
        if std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(container_id))
        {
            tree.push(pid);
        }
    }
    tree.into_iter().map(|p| (p, comm(p))).collect()
}

fn figure(report: &mut Report, name: &str, endpoint: &str, value: f64, unit: &'static str) {
    report.figures.push(Figure {
        name: name.to_string(),
        endpoint: endpoint.to_string(),
        value,
        unit,
    });
}

/// The scenario `name` does not apply to the target (e.g. no such runtime
/// handler): reported as n/a, not as a failure.
fn not_applicable(report: &mut Report, name: &str, t: &mut Target, why: &anyhow::Error) {
    let reason = format!("{why:#}");
    let reason = reason.lines().next().unwrap_or_default();
    report.not_applicable.push(stats::NotApplicable {
        name: name.to_string(),
        endpoint: t.name.clone(),
        reason: reason.chars().take(160).collect(),
    });
    t.skip = true;
}

async fn footprint_monitor(
    report: &mut Report,
    t: &mut Target,
    handler: &str,
    settle: Duration,
) -> anyhow::Result<()> {
    let h = handler_label(handler);
    let image = t.image.clone().context("no image")?;
    let pod = match run_pod(&mut t.rt, t.index, handler, true).await {
        Ok(pod) => pod,
        Err(e) => {
            not_applicable(report, &format!("monitor[{h}]"), t, &e);
            t.skip = false;
            return Ok(());
        }
    };
    let result = async {
        let id = create_container(&mut t.rt, &pod, &image).await?;
        start_container(&mut t.rt, &id).await?;
        // Idle: no request for `settle` (a monitor may trim itself then).
        tokio::time::sleep(settle).await;
        let Some(monitor) = monitor_of(&id) else {
            report.skipped.push(format!(
                "monitor footprint [{h}] on {}: no monitor process found",
                t.name
            ));
            return Ok(());
        };
        let name = comm(monitor);
        if let Some((rss, pss)) = rss_pss(monitor) {
            figure(report, &format!("monitor[{h}] rss"), &t.name, rss, "KiB");
            figure(report, &format!("monitor[{h}] pss"), &t.name, pss, "KiB");
        }
        let mut rt = t.rt.clone();
        let exec_id = id.clone();
        // An exec that outlives the measurement by a safe margin.
        let exec_secs = settle.as_secs() + 3;
        let exec = tokio::spawn(async move {
            rt.exec_sync(v1::ExecSyncRequest {
                container_id: exec_id,
                cmd: vec!["sleep".into(), exec_secs.to_string()],
                timeout: exec_secs as i64 + 10,
            })
            .await
        });
        tokio::time::sleep(settle).await;
        if let Some((rss, pss)) = rss_pss(monitor) {
            figure(
                report,
                &format!("monitor[{h}] rss, exec"),
                &t.name,
                rss,
                "KiB",
            );
            figure(
                report,
                &format!("monitor[{h}] pss, exec"),
                &t.name,
                pss,
                "KiB",
            );
        }
        // Monitor processes (the monitor, helpers it forked or ran, exec
        // sessions), and the pod's sandbox processes (a pause container)
        // the monitor also parents: together, the per-pod overhead.
        let all = monitor_tree(monitor, &id);
        let (mut mon, mut pod) = ((0.0, 0.0), (0.0, 0.0));
        let (mut mon_names, mut sandbox_names) = (Vec::new(), Vec::new());
        for (p, n) in &all {
            let Some((r, s)) = rss_pss(*p) else { continue };
            if in_pod_cgroup(*p) {
                sandbox_names.push(n.as_str());
            } else {
                mon = (mon.0 + r, mon.1 + s);
                mon_names.push(n.as_str());
            }
            pod = (pod.0 + r, pod.1 + s);
        }
        report.notes.push(format!(
            "monitor[{h}] on {}: {name} (pid {monitor}); with an exec, monitors: {}; sandbox: {}",
            t.name,
            mon_names.join(" + "),
            if sandbox_names.is_empty() {
                "none".to_string()
            } else {
                sandbox_names.join(" + ")
            }
        ));
        for (what, (rss, pss)) in [("monitors", mon), ("pod overhead", pod)] {
            figure(
                report,
                &format!("{what}[{h}] rss, exec"),
                &t.name,
                rss,
                "KiB",
            );
            figure(
                report,
                &format!("{what}[{h}] pss, exec"),
                &t.name,
                pss,
                "KiB",
            );
        }
        exec.await?.context("ExecSync sleep")?;
        anyhow::Ok(())
    }
    .await;
    let removed = remove_pod(&mut t.rt, t.index, &pod.0).await;
    result.and(removed)
}

async fn pull(t: &mut Target, image: &str) -> anyhow::Result<String> {
    Ok(t.img
        .pull_image(v1::PullImageRequest {
            image: Some(v1::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .with_context(|| format!("PullImage {image}"))?
        .into_inner()
        .image_ref)
}

async fn image_pull(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    let Some(registry) = &args.registry else {
        report
            .skipped
            .push("image-pull: needs --registry HOST:PORT".into());
        return Ok(());
    };
    let pusher = push::Pusher::new(registry);
    let layers = 5;
    let per_layer = args.pull_mib.div_ceil(layers).max(1);
    for t in targets.iter_mut() {
        let pb = bar(4, &format!("image pull ({})", t.name));
        // Distinct data per endpoint and run: the first pull is cold.
        let seed = std::process::id() as u64 * 1000
            + t.index as u64
            + std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
        let cold = push::big_image(layers, per_layer, seed);
        // Same layers, another config: a pull with every layer present.
        let mut warm_spec_layers = cold.layers.clone();
        let warm = crust_tests::registry::build(crust_tests::registry::ImageSpec {
            layers: std::mem::take(&mut warm_spec_layers),
            cmd: &["sh", "-c", "true"],
            ..Default::default()
        });
        let mb = cold.size() as f64 / 1e6;
        let tag = unique("t");
        pb.inc(1);
        pusher.image("crust-bench/big", &tag, &cold).await?;
        pusher
            .image("crust-bench/big", &format!("{tag}-warm"), &warm)
            .await?;
        pb.inc(1);
        for (kind, tag) in [
            ("cold", tag.clone()),
            ("layers present", format!("{tag}-warm")),
        ] {
            let reference = format!("{registry}/crust-bench/big:{tag}");
            let start = Instant::now();
            let image_ref = pull(t, &reference).await?;
            let secs = start.elapsed().as_secs_f64();
            PULLED.lock().unwrap().push((t.index, image_ref));
            figure(
                report,
                &format!("pull {:.0} MB {kind}", mb),
                &t.name,
                secs * 1e3,
                "ms",
            );
            figure(
                report,
                &format!("pull {:.0} MB {kind} rate", mb),
                &t.name,
                mb / secs,
                "MB/s",
            );
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    Ok(())
}

/// Starts `n` pods (host network unless `cni`) with a running container
/// each, `par` at a time; returns the pod IDs.
async fn start_pods(
    t: &Target,
    n: usize,
    par: usize,
    cni: bool,
    label: &str,
) -> anyhow::Result<Vec<String>> {
    let image = t.image.clone().context("no image")?;
    let pb = bar(n as u64, &format!("{label} ({})", t.name));
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(par.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut rt = t.rt.clone();
        let sem = sem.clone();
        let image = image.clone();
        let index = t.index;
        let pb = pb.clone();
        set.spawn(async move {
            let _permit = sem.acquire().await?;
            let pod = run_pod(&mut rt, index, "", !cni).await?;
            let id = create_container(&mut rt, &pod, &image).await?;
            start_container(&mut rt, &id).await?;
            pb.inc(1);
            anyhow::Ok(pod.0)
        });
    }
    let mut pods = Vec::new();
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        match r? {
            Ok(p) => pods.push(p),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    pb.finish_and_clear();
    match first_err {
        Some(e) => {
            // Started ones are tracked and go at exit.
            Err(e.context(format!("{label}: starting pods")))
        }
        None => Ok(pods),
    }
}

/// Removes `pods`, `par` at a time.
async fn remove_pods(t: &Target, pods: Vec<String>, par: usize) -> anyhow::Result<()> {
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(par.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for pod in pods {
        let mut rt = t.rt.clone();
        let sem = sem.clone();
        let index = t.index;
        set.spawn(async move {
            let _permit = sem.acquire().await?;
            remove_pod(&mut rt, index, &pod).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

/// The metrics scenario: what a kubelet scraping /metrics/cadvisor and
/// /stats/summary from the runtime costs it, per call, with
/// --metrics-pods pods running.
async fn metrics(report: &mut Report, targets: &mut [Target], args: &Args) -> anyhow::Result<()> {
    let n = args.metrics_pods;
    let par = args.density_parallel;
    let cni = targets.iter().all(|t| t.network_ready);
    let mut started = Vec::new();
    let mut r = Ok(());
    for t in targets.iter_mut() {
        match start_pods(t, n, par, cni, "metrics pods").await {
            Ok(p) => started.push(p),
            Err(e) => {
                r = Err(e);
                break;
            }
        }
    }
    if r.is_ok() {
        let (w, iters) = (args.lifecycle_warmup, args.lifecycle_iterations);
        for op in [Op::ListContainerStats, Op::ListPodSandboxStats] {
            if r.is_ok() {
                r = measure(report, targets, &op, "metrics", w, iters, args.rounds).await;
            }
        }
        if r.is_ok() {
            for t in targets.iter_mut() {
                // containerd 1.x has no metrics RPCs.
                if let Err(e) = once(t, &Op::ListPodSandboxMetrics).await {
                    not_applicable(report, "ListPodSandboxMetrics", t, &e);
                }
            }
            if targets.iter().any(|t| !t.skip) {
                r = measure(
                    report,
                    targets,
                    &Op::ListPodSandboxMetrics,
                    "metrics",
                    w,
                    iters,
                    args.rounds,
                )
                .await;
            }
            for t in targets.iter_mut() {
                t.skip = false;
            }
        }
    }
    for (t, pods) in targets.iter().zip(started) {
        remove_pods(t, pods, par).await?;
    }
    r
}

async fn density(report: &mut Report, targets: &mut [Target], args: &Args) -> anyhow::Result<()> {
    let n = args.density_pods;
    let par = args.density_parallel.max(1);
    for t in targets.iter_mut() {
        let start = Instant::now();
        let pods = start_pods(t, n, par, false, "density").await?;
        figure(
            report,
            &format!("density {n} pods running"),
            &t.name,
            start.elapsed().as_secs_f64() * 1e3,
            "ms",
        );
        if let Some(url) = t.metrics_url.clone() {
            scrape(report, t, &url, n, args.scrapes).await?;
        }
        let start = Instant::now();
        remove_pods(t, pods, par).await?;
        figure(
            report,
            &format!("density {n} pods removed"),
            &t.name,
            start.elapsed().as_secs_f64() * 1e3,
            "ms",
        );
    }
    Ok(())
}

/// (utime + stime) of a process, in seconds.
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ, which /proc reports in, is 100 on every Linux ABI.
    Some(ticks / 100.0)
}

/// `scrapes` timed GETs of the target's /metrics while `pods` pods with a
/// running container each exist: latency, response size, and the daemon's
/// CPU time per scrape (from /proc, so it includes whatever else the daemon
/// did meanwhile: nothing, as the bench waits).
async fn scrape(
    report: &mut Report,
    t: &Target,
    url: &str,
    pods: usize,
    scrapes: usize,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let get = |http: reqwest::Client| async move {
        let r = http
            .get(url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        anyhow::ensure!(r.status().is_success(), "GET {url}: {}", r.status());
        anyhow::Ok(r.bytes().await?.len())
    };
    for _ in 0..5 {
        get(http.clone()).await?;
    }
    let cpu_before = t.pid.and_then(cpu_secs);
    let mut samples = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let start = Instant::now();
        bytes = get(http.clone()).await?;
        samples.push(start.elapsed());
    }
    let cpu_after = t.pid.and_then(cpu_secs);
    report.results.push(stats::summarize(
        &format!("metrics scrape, {pods} pods"),
        &t.name,
        samples,
    ));
    figure(
        report,
        &format!("metrics scrape size, {pods} pods"),
        &t.name,
        bytes as f64 / 1024.0,
        "KiB",
    );
    if let (Some(a), Some(b)) = (cpu_before, cpu_after) {
        figure(
            report,
            &format!("metrics scrape cpu, {pods} pods"),
            &t.name,
            (b - a) * 1e3 / scrapes as f64,
            "ms",
        );
    }
    Ok(())
}

async fn run_scenarios(
    args: &Args,
    targets: &mut [Target],
    report: &mut Report,
) -> anyhow::Result<()> {
    let scenarios = if args.scenario.is_empty() {
        Scenario::value_variants().to_vec()
    } else {
        args.scenario.clone()
    };
    let has = |s: Scenario| scenarios.contains(&s);
    let fast = (args.warmup, args.iterations);
    let slow = (args.lifecycle_warmup, args.lifecycle_iterations);

    if has(Scenario::Footprint) {
        // Idle as for the monitors: no request for --settle-secs (crust's
        // daemon trims itself after 2 s of quiet).
        tokio::time::sleep(Duration::from_secs_f64(args.settle_secs.max(0.0))).await;
        for t in targets.iter() {
            if let Some((rss, _)) = t.pid.and_then(proc_rss) {
                figure(report, "daemon rss idle", &t.name, rss, "KiB");
            }
        }
    }
    let needs_image = [
        Scenario::Container,
        Scenario::ExecSync,
        Scenario::ContainerStatus,
        Scenario::List,
        Scenario::Footprint,
        Scenario::Density,
        Scenario::Metrics,
    ]
    .iter()
    .any(|s| has(*s));
    let image = match (&args.image, needs_image) {
        (Some(i), true) => Some(i.clone()),
        (None, true) => {
            report
                .skipped
                .push("container scenarios: need --image REF".into());
            None
        }
        _ => None,
    };
    if let Some(image) = &image {
        for t in targets.iter_mut() {
            t.image = Some(pull(t, image).await?);
        }
    }
    for image in &args.prepull {
        for t in targets.iter_mut() {
            pull(t, image).await?;
        }
    }

    for (s, op) in [
        (Scenario::Version, Op::Version),
        (Scenario::Status, Op::Status),
    ] {
        if has(s) {
            measure(
                report,
                targets,
                &op,
                &format!("{s:?}"),
                fast.0,
                fast.1,
                args.rounds,
            )
            .await?;
        }
    }
    if has(Scenario::PodHost) {
        let op = Op::Pod { cni: false };
        measure(
            report,
            targets,
            &op,
            "pod host",
            slow.0,
            slow.1,
            args.rounds,
        )
        .await?;
    }
    if has(Scenario::PodCni) {
        if targets.iter().all(|t| t.network_ready) {
            let op = Op::Pod { cni: true };
            measure(report, targets, &op, "pod cni", slow.0, slow.1, args.rounds).await?;
        } else {
            report
                .skipped
                .push("pod-cni: an endpoint's Status is not NetworkReady".into());
        }
    }
    if image.is_none() {
        return Ok(());
    }
    if has(Scenario::Container) {
        for handler in &args.handler {
            let h = handler_label(handler);
            for t in targets.iter_mut() {
                match run_pod(&mut t.rt, t.index, handler, true).await {
                    Ok(pod) => t.pods = vec![(handler.clone(), pod.0, pod.1)],
                    Err(e) => not_applicable(report, &format!("ctr[{h}]"), t, &e),
                }
            }
            let op = Op::Container {
                handler: handler.clone(),
            };
            let label = format!("container [{h}]");
            let r = if targets.iter().any(|t| !t.skip) {
                measure(report, targets, &op, &label, slow.0, slow.1, args.rounds).await
            } else {
                Ok(())
            };
            for t in targets.iter_mut() {
                t.skip = false;
                for (_, id, _) in std::mem::take(&mut t.pods) {
                    remove_pod(&mut t.rt, t.index, &id).await?;
                }
            }
            r?;
        }
    }
    if has(Scenario::ExecSync) || has(Scenario::ContainerStatus) {
        for t in targets.iter_mut() {
            let image = t.image.clone().context("no image")?;
            let pod = run_pod(&mut t.rt, t.index, "", true).await?;
            let id = create_container(&mut t.rt, &pod, &image).await?;
            start_container(&mut t.rt, &id).await?;
            t.pods = vec![(String::new(), pod.0, pod.1)];
            t.container = Some(id);
        }
        let mut r = Ok(());
        for (s, op) in [
            (Scenario::ExecSync, Op::ExecSync),
            (Scenario::ContainerStatus, Op::ContainerStatus),
        ] {
            if has(s) && r.is_ok() {
                // ExecSync runs a process per call: lifecycle-sized counts.
                let (w, n) = if s == Scenario::ExecSync {
                    (slow.0, (fast.1 / 5).max(slow.1))
                } else {
                    fast
                };
                r = measure(report, targets, &op, &format!("{s:?}"), w, n, args.rounds).await;
            }
        }
        for t in targets.iter_mut() {
            t.container = None;
            for (_, id, _) in std::mem::take(&mut t.pods) {
                remove_pod(&mut t.rt, t.index, &id).await?;
            }
        }
        r?;
    }
    if has(Scenario::List) && args.list_containers > 0 {
        for t in targets.iter_mut() {
            let image = t.image.clone().context("no image")?;
            let pod = run_pod(&mut t.rt, t.index, "", true).await?;
            t.pods = vec![(String::new(), pod.0.clone(), pod.1.clone())];
            let pb = bar(
                args.list_containers as u64,
                &format!("creating containers ({})", t.name),
            );
            for _ in 0..args.list_containers {
                create_container(&mut t.rt, &pod, &image).await?;
                pb.inc(1);
            }
            pb.finish_and_clear();
        }
        let mut r = Ok(());
        for op in [Op::ListContainers, Op::ListPods] {
            if r.is_ok() {
                r = measure(report, targets, &op, "list", slow.0, slow.1, args.rounds).await;
            }
        }
        for t in targets.iter_mut() {
            for (_, id, _) in std::mem::take(&mut t.pods) {
                remove_pod(&mut t.rt, t.index, &id).await?;
            }
        }
        r?;
    }
    if has(Scenario::Footprint) {
        for t in targets.iter_mut() {
            for handler in &args.handler {
                let settle = Duration::from_secs_f64(args.settle_secs.max(0.0));
                footprint_monitor(report, t, handler, settle).await?;
            }
        }
    }
    if has(Scenario::ImagePull) {
        image_pull(report, targets, args).await?;
    }
    if has(Scenario::Density) {
        density(report, targets, args).await?;
    }
    if has(Scenario::Metrics) {
        metrics(report, targets, args).await?;
    }
    Ok(())
}

async fn run(args: &Args, targets: &mut [Target], report: &mut Report) -> anyhow::Result<()> {
    run_scenarios(args, targets, report).await?;
    if args.scenario.is_empty() || args.scenario.contains(&Scenario::Footprint) {
        for t in targets.iter() {
            if let Some((rss, hwm)) = t.pid.and_then(proc_rss) {
                figure(report, "daemon rss after", &t.name, rss, "KiB");
                figure(report, "daemon rss peak", &t.name, hwm, "KiB");
            }
        }
    }
    Ok(())
}

/// Pods of this bench process the endpoint lists (also those whose
/// RunPodSandbox was cut short, so the bench never learnt their id).
async fn own_pods(t: &mut Target) -> Vec<String> {
    let prefix = format!("bench-{}-", std::process::id());
    let Ok(list) =
        t.rt.list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await
    else {
        return Vec::new();
    };
    list.into_inner()
        .items
        .into_iter()
        .filter(|p| {
            p.metadata
                .as_ref()
                .is_some_and(|m| m.namespace == "crust-bench" && m.name.starts_with(&prefix))
        })
        .map(|p| p.id)
        .collect()
}

/// Removes every pod the bench created and did not remove, and every image
/// the pull scenario pulled.
async fn cleanup(targets: &mut [Target]) {
    let pods = std::mem::take(&mut *CREATED.lock().unwrap());
    if !pods.is_empty() {
        eprintln!("cleaning up {} pod(s)", pods.len());
    }
    for (i, id) in pods {
        let t = &mut targets[i];
        if let Err(e) = remove_pod(&mut t.rt, i, &id).await {
            eprintln!("cleanup of pod {id} on {}: {e:#}", t.name);
        }
    }
    // Calls in flight when the bench was interrupted may still create pods:
    // sweep by name until two passes in a row find none.
    let mut quiet = 0;
    for _ in 0..20 {
        let mut found = 0;
        for t in targets.iter_mut() {
            for id in own_pods(t).await {
                found += 1;
                let i = t.index;
                if let Err(e) = remove_pod(&mut t.rt, i, &id).await {
                    eprintln!("cleanup of pod {id} on {}: {e:#}", t.name);
                }
            }
        }
        quiet = if found == 0 { quiet + 1 } else { 0 };
        if quiet >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let images = std::mem::take(&mut *PULLED.lock().unwrap());
    for (i, image) in images {
        let t = &mut targets[i];
        let r = t
            .img
            .remove_image(v1::RemoveImageRequest {
                image: Some(v1::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
            })
            .await;
        if let Err(e) = r {
            eprintln!("cleanup of image {image} on {}: {e}", t.name);
        }
    }
    let _ = std::fs::remove_dir_all(log_root());
}

/// Removes the bench's cgroup parent in every hierarchy, deepest first
/// (rmdir only: a cgroup that still has processes stays, and says so).
fn remove_cgroup_parent(parent: &str) {
    let rel = parent.trim_matches('/');
    if rel.is_empty() {
        return;
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    fn rm(dir: &std::path::Path) -> bool {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rm(&e.path());
                }
            }
        }
        std::fs::remove_dir(dir).is_ok()
    }
    for h in hierarchies.flatten() {
        let dir = h.path().join(rel);
        if dir.is_dir() && !rm(&dir) {
            eprintln!("cgroup {} is not empty; left in place", dir.display());
        }
    }
    // A top-level "/crust-bench-N": nothing above it to clean.
}

async fn push_test_image(registry: &str) -> anyhow::Result<()> {
    let img = push::busybox_image()?;
    push::Pusher::new(registry)
        .image("crust-bench/busybox", "latest", &img)
        .await?;
    println!("{registry}/crust-bench/busybox:latest");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::PushTestImage { registry }) => return push_test_image(registry).await,
        Some(Command::PushPauseImage { registry, binary }) => {
            let img = push::pause_image(binary)?;
            push::Pusher::new(registry)
                .image("crust-bench/pause", "3.9", &img)
                .await?;
            println!("{registry}/crust-bench/pause:3.9");
            return Ok(());
        }
        None => {}
    }
    let args = cli.args;
    let cgroup_parent = args
        .cgroup_parent
        .clone()
        .unwrap_or_else(|| format!("/crust-bench-{}", std::process::id()));
    let _ = CGROUP_PARENT.set(cgroup_parent.clone());
    anyhow::ensure!(
        args.iterations > 0 && args.rounds > 0 && args.lifecycle_iterations > 0,
        "iterations and rounds must be > 0"
    );
    let mut targets = vec![connect(&args.endpoint, args.label.as_ref(), 0, args.daemon_pid).await?];
    targets[0].metrics_url = args.metrics_url.clone();
    if let Some(vs) = &args.vs {
        targets.push(connect(vs, args.vs_label.as_ref(), 1, args.vs_daemon_pid).await?);
        targets[1].metrics_url = args.vs_metrics_url.clone();
    }
    std::fs::create_dir_all(log_root())?;
    let mut report = Report::default();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        r = run(&args, &mut targets, &mut report) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    cleanup(&mut targets).await;
    remove_cgroup_parent(&cgroup_parent);
    if let [a, b] = &targets[..] {
        report.compute_ratios(&a.name, &b.name);
    }
    report.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    result
}
