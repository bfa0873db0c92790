//! `crust`: the daemon and the operator CLI.
//!
//! The daemon reads top-down, one hop per step (`layering` checks that no
//! module imports one that imports it back):
//!
//! ```text
//! server.rs            the CRI socket, serving, orderly shutdown
//! daemon.rs            builds the parts below once, wires in the real node effects
//! services/            gRPC: translate, validate, map domain errors to tonic::Status
//!   runtime.rs           RuntimeService dispatch, Version/Status/RuntimeConfig
//!   pod.rs, container.rs pod sandbox and container RPCs
//!   stats.rs, events.rs  stats RPCs, GetContainerEvents
//!   metrics.rs           CRI metrics RPCs: cadvisor's names and labels
//!   stream.rs            Exec/Attach/PortForward URLs
//!   image.rs, admin.rs   ImageService, crust's admin API (over crust_image)
//! lifecycle/           the one place that orders pod and container steps
//! pods/                pod sandboxes (know nothing of containers)
//!   lifecycle.rs         run (and its undo), stop, remove
//!   recovery.rs          reconciling store and node at start
//!   host.rs              PodHost: every node effect of a pod (RealPodHost)
//!   pause.rs             the pause process of a shared PID namespace
//!   spec.rs, record.rs, files.rs, info.rs, error.rs
//! containers/          containers (know nothing of pods: a PodView value)
//!   lifecycle.rs         create (and its undo), start, stop, remove, exec-sync, update
//!   recovery.rs          exits, exit watchers, recovery at start
//!   host.rs              ContainerHost: every node effect of a container
//!   validate.rs, spec.rs, record.rs, error.rs
//! streaming_backend.rs exec / attach / port-forward sessions for crust_streaming
//! launch.rs            the one launch path: bundle, monitor, start
//! monitor.rs           the one monitor client (async), with time limits
//! images.rs            what containers need of the image store (leases)
//! index.rs             ID / unique-prefix index with name reservation
//! handlers.rs, node.rs runtime handlers; node facts and spec look-ups
//! cgroups.rs           the node's cgroups (crust-cgroups): pod cgroups and
//!                      slices, container cgroups and scopes, unified keys
//! stats.rs, events.rs  cgroup usage sampling; container event channel
//! metrics.rs           what the metrics RPCs read: cgroups, pod netns, layers
//! check/               `crust check`: what nothing references, and its repair
//! checkpoint.rs        CheckpointContainer (criu through the runc handler), its archive
//! crash.rs             crash points of the kill-at-every-step test (debug builds)
//! clock.rs, ids.rs, tasks.rs   now_ns, random IDs, blocking()
//! quote.rs             bounded quoting of client input in messages
//! reload.rs            re-reading the config (SIGHUP, `crust reload`)
//! otel/                OpenTelemetry: [tracing] config, exporter, CRI call spans
//! config.rs, api_version.rs, idle.rs, cli/
//! ```

mod api_version;
mod authority;
mod cgroups;
mod check;
mod checkpoint;
mod cli;
mod clock;
mod config;
mod containers;
mod crash;
mod daemon;
mod events;
mod handlers;
mod idle;
mod ids;
mod images;
mod index;
mod introspect;
mod launch;
mod lifecycle;
mod logging;
mod metrics;
mod monitor;
mod node;
mod otel;
mod pod_metrics;
mod pods;
mod reload;
mod server;
mod services;
mod stats;
mod streaming_backend;
mod tasks;

#[cfg(test)]
mod fakes;
#[cfg(test)]
mod layering;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use config::{
    CgroupDriver, Config, ConfigSource, DEFAULT_CONFIG_PATH, LogFormat, LogLevel, Overrides,
};

#[derive(Parser)]
#[command(
    name = "crust",
    version,
    about = "A Kubernetes container runtime (CRI)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CRI on a Unix socket.
    Daemon(DaemonArgs),
    /// Pull, list, remove, import and prune images (through the daemon).
    Images(cli::images::ImagesArgs),
    /// Show the running daemon's version, config, cgroups, handlers,
    /// pods and containers, addresses and health.
    Status(cli::status::StatusArgs),
    /// Show or change the running daemon's log level (changing: root only).
    LogLevel(cli::log_level::LogLevelArgs),
    /// Find (and with --repair remove) what nothing references: image
    /// content, container and pod dirs, mounts, monitors, cgroups, records.
    Check(cli::check::CheckArgs),
    /// Make the running daemon read its config file again (as SIGHUP does)
    /// and show what it applied and what needs a restart (root only).
    Reload(cli::reload::ReloadArgs),
    /// Inspect the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the full default configuration as TOML.
    Default,
}

/// Flags override the config file's values.
#[derive(Args)]
struct DaemonArgs {
    /// Config file (TOML). A missing file at the default path means defaults.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// CRI socket path.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Persistent state directory.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Volatile state directory.
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<LogLevel>,
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    #[arg(long, value_name = "DRIVER")]
    cgroup_driver: Option<CgroupDriver>,
    /// CNI network config directory.
    #[arg(long, value_name = "DIR")]
    cni_conf_dir: Option<PathBuf>,
    /// CNI plugin directories, colon-separated.
    #[arg(long, value_name = "DIR[:DIR...]", value_delimiter = ':')]
    cni_bin_dir: Option<Vec<PathBuf>>,
    /// Write the default bridge network into an empty CNI conf dir at start.
    #[arg(long)]
    install_default_conflist: bool,
    /// Registry host config directory (containerd hosts.toml layout).
    #[arg(long, value_name = "DIR")]
    registry_config_dir: Option<PathBuf>,
    /// Serve /metrics and /healthz over HTTP on this IP:PORT.
    #[arg(long, value_name = "IP:PORT")]
    metrics_address: Option<String>,
    /// The socket NRI plugins connect to (`nri.socket_path`).
    #[arg(long, value_name = "PATH")]
    nri_socket: Option<PathBuf>,
}

impl DaemonArgs {
    /// The config file and the flags that win over it (at start and at
    /// every reload).
    fn into_source(self) -> ConfigSource {
        ConfigSource {
            explicit: self.config.is_some(),
            path: self
                .config
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH)),
            overrides: Overrides {
                socket: self.socket,
                root: self.root,
                run_dir: self.run_dir,
                log_level: self.log_level,
                log_format: self.log_format,
                cgroup_driver: self.cgroup_driver,
                cni_conf_dir: self.cni_conf_dir,
                cni_bin_dirs: self.cni_bin_dir,
                install_default_conflist: self.install_default_conflist,
                registry_config_dir: self.registry_config_dir,
                metrics_address: self.metrics_address,
                nri_socket: self.nri_socket,
            },
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Daemon(args) => run_daemon(args.into_source()),
        Command::Images(args) => cli::images::run(args),
        Command::Status(args) => cli::status::run(args),
        Command::LogLevel(args) => cli::log_level::run(args),
        Command::Check(args) => cli::check::run(args),
        Command::Reload(args) => cli::reload::run(args),
        Command::Config {
            command: ConfigCommand::Default,
        } => {
            print!("{}", Config::default_toml());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crust: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_daemon(source: ConfigSource) -> anyhow::Result<()> {
    let loaded = source.load()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("crust")
        .build()
        .context("starting the async runtime")?;
    // Inside the runtime: the OTLP exporter's channel lives there.
    let log = {
        let _in_runtime = rt.enter();
        // Dependencies' chatter stays down unless tracing everything.
        logging::init(
            &loaded.config,
            "h2=warn,hyper=warn,tower=warn,tonic=warn,loona_hpack=warn,libcgroups=error,zbus=warn",
        )?
    };
    // A socket per live container (its watcher) and per client: take the
    // hard limit, and hand the node's soft limit on to monitors.
    match crust_linux::process::raise_open_files_limit() {
        Ok(soft) => crust_shim_protocol::set_monitor_open_files_limit(soft),
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    let result = rt.block_on(server::serve(source, loaded, log.clone()));
    // The spans of the last calls, while the runtime (and so the
    // exporter's channel) still runs.
    rt.block_on(async move {
        let _ = tokio::task::spawn_blocking(move || log.flush_traces()).await;
    });
    result
}
