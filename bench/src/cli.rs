//! The command line: subcommands that push the bench's images, and the
//! flags of a run (endpoints, counts, scenarios).

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "crust-bench",
    about = "Benchmark a CRI endpoint",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub args: Args,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// Run an OTLP/gRPC trace receiver on 127.0.0.1 (the test harness's)
    /// for a daemon with `[tracing] endpoint`: prints its endpoint, then
    /// runs until SIGTERM and prints how many spans it received.
    OtlpReceiver,
}

#[derive(clap::Args)]
pub struct Args {
    /// CRI endpoint under test (unix:///path or a path).
    #[arg(long, default_value = "unix:///run/crust/crust.sock")]
    pub endpoint: String,
    /// A second endpoint to compare against (e.g. containerd's socket).
    #[arg(long)]
    pub vs: Option<String>,
    /// Name of --endpoint in the table (default: the endpoint).
    #[arg(long)]
    pub label: Option<String>,
    /// Name of --vs in the table (default: the endpoint).
    #[arg(long)]
    pub vs_label: Option<String>,
    /// PID of the daemon behind --endpoint (for its RSS).
    #[arg(long)]
    pub daemon_pid: Option<u32>,
    /// PID of the daemon behind --vs.
    #[arg(long)]
    pub vs_daemon_pid: Option<u32>,
    /// Measured iterations of the fast RPCs (Version, Status, ExecSync,
    /// ContainerStatus).
    #[arg(long, default_value_t = 1000)]
    pub iterations: usize,
    /// Unmeasured warm-up iterations of the fast RPCs.
    #[arg(long, default_value_t = 50)]
    pub warmup: usize,
    /// Measured iterations of the pod / container lifecycles and lists.
    #[arg(long, default_value_t = 50)]
    pub lifecycle_iterations: usize,
    /// Warm-up iterations of the pod / container lifecycles and lists.
    #[arg(long, default_value_t = 5)]
    pub lifecycle_warmup: usize,
    /// Rounds the iterations are split into, alternating endpoints.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Scenarios to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub scenario: Vec<Scenario>,
    /// Image for the container scenarios (pulled once per endpoint).
    #[arg(long)]
    pub image: Option<String>,
    /// Runtime handlers of the container scenarios, comma-separated
    /// ("" is the endpoint's default).
    #[arg(long, value_delimiter = ',', default_value = "runc,embedded")]
    pub handler: Vec<String>,
    /// Containers present while ListContainers / ListPodSandbox are timed.
    #[arg(long, default_value_t = 1000)]
    pub list_containers: usize,
    /// Registry (host:port, plain http) to push the pull scenario's
    /// generated image to.
    #[arg(long)]
    pub registry: Option<String>,
    /// Size of the pull scenario's image in MiB (split in 5 layers).
    #[arg(long, default_value_t = 100)]
    pub pull_mib: usize,
    /// The daemon's `[image] signature_policy_dir` (the --endpoint's, not
    /// --vs's): the image-pull-signed scenario writes its namespace's
    /// policy there (the daemon reads policies at every pull).
    #[arg(long)]
    pub signature_policy_dir: Option<std::path::PathBuf>,
    /// Pulls of each kind in the image-pull-signed scenario.
    #[arg(long, default_value_t = 10)]
    pub signed_pulls: usize,
    /// Size of the image-pull-signed scenario's images in MiB (5 layers).
    #[arg(long, default_value_t = 10)]
    pub signed_pull_mib: usize,
    /// Pods (one container each) of the density scenario.
    #[arg(long, default_value_t = 100)]
    pub density_pods: usize,
    /// Pods (one running container each) present while the metrics and
    /// stats lists are timed.
    #[arg(long, default_value_t = 100)]
    pub metrics_pods: usize,
    /// How many density pods are started / removed at a time.
    #[arg(long, default_value_t = 10)]
    pub density_parallel: usize,
    /// cgroup_parent of every pod the bench starts (cgroupfs form), so its
    /// pods never share a cgroup with anyone else's; emptied directories
    /// below it are removed at exit. Default: /crust-bench-<pid>. "" leaves
    /// it to the runtime.
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    /// Seconds a monitor is left alone before its footprint is read (the
    /// crust monitor trims its working set 2 s after its last request).
    #[arg(long, default_value_t = 3.0)]
    pub settle_secs: f64,
    /// Images to pull on every endpoint before measuring (e.g. the sandbox
    /// image a runtime pulls on its first RunPodSandbox).
    #[arg(long, value_delimiter = ',')]
    pub prepull: Vec<String>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The Prometheus endpoint of --endpoint (http://IP:PORT/metrics): the
    /// density scenario scrapes it while its pods run (latency, bytes,
    /// daemon CPU per scrape).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// The Prometheus endpoint of --vs.
    #[arg(long)]
    pub vs_metrics_url: Option<String>,
    /// Timed scrapes of a --metrics-url (after 5 untimed ones).
    #[arg(long, default_value_t = 100)]
    pub scrapes: usize,
}

impl Args {
    /// The scenarios of this run: those named, or all.
    pub fn scenarios(&self) -> Vec<Scenario> {
        if self.scenario.is_empty() {
            Scenario::value_variants().to_vec()
        } else {
            self.scenario.clone()
        }
    }

    /// How long a process is left alone before its footprint is read.
    pub fn settle(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.settle_secs.max(0.0))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
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
    /// What checking a cosign signature adds to a pull: cold pulls of
    /// signed 5-layer images in a namespace whose policy (sigstoreSigned,
    /// a key of the run's own) checks them, alternating with the same
    /// pulls in a namespace without a policy (--endpoint only; needs
    /// --signature-policy-dir)
    ImagePullSigned,
    /// --density-pods pods with a container each, --density-parallel at a time
    Density,
    /// ListPodSandboxMetrics, ListContainerStats and ListPodSandboxStats
    /// with --metrics-pods pods (CNI network if ready) running a container each
    Metrics,
}
