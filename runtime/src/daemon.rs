//! The daemon's parts, built once at start and handed to the services:
//! the store, the images, the pods, the containers and the life cycle that
//! orders them. This is the one place that wires the real node effects
//! (`RealPodHost`, `RealContainerHost`) into the domain modules.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use crust_cgroups::Hierarchy;
use crust_image::ImageService;
use crust_network::{Cni, DefaultNetwork};
use crust_nri::{Nri, RuntimeInfo};
use crust_store::{Kind, Record, Store};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::cgroups::NodeCgroups;
use crate::config::{CgroupDriver, Config};
use crate::containers::{self, Containers, RealContainerHost};
use crate::handlers::Handlers;
use crate::launch::Launcher;
use crate::lifecycle::{Lifecycle, NriBackend};
use crate::metrics::Metrics;
use crate::pods::{Pods, RealPodHost};
use crate::stats::CgroupStats;
use crate::streaming_backend::Sessions;

/// The run dir's lock file (holds the pid of the daemon that has it).
const RUN_DIR_LOCK: &str = "crust.lock";

pub struct Daemon {
    /// The config the daemon started with. What a reload may not change
    /// (`crate::reload`: socket, root, cgroup driver, ...) is read here;
    /// [`Daemon::live_config`] has the reloaded values.
    pub config: Config,
    /// The config in force: the start's, with reloads applied.
    live_config: RwLock<Arc<Config>>,
    /// Starts monitors (a reload changes its `log_size_max`).
    pub launcher: Launcher,
    /// Shared with the image service (redb opens a file once per process).
    pub store: Arc<Store>,
    pub cgroup_hierarchy: Hierarchy,
    /// Images: pull, store, unpack, GC (`crates/image`).
    pub images: ImageService,
    /// The runtime handlers and their features.
    pub handlers: Arc<Handlers>,
    /// Pod sandboxes (recovered from the store at start).
    pub pods: Arc<Pods>,
    /// Containers (recovered from the store and their monitors at start).
    pub containers: Arc<Containers>,
    /// Pod and container life-cycle steps, in order.
    pub lifecycle: Lifecycle,
    /// CPU and memory of pod and container cgroups.
    pub stats: Arc<CgroupStats>,
    /// AppArmor on the node (Status reports it).
    pub apparmor: crate::node::NodeAppArmor,
    /// Pod CIDRs from UpdateRuntimeConfig, for the default network config.
    pod_cidrs: RwLock<Vec<String>>,
    /// The exec / attach / port-forward server, set once at start (its
    /// backend needs the pods and containers, so it starts after `open`).
    pub streaming: std::sync::OnceLock<crust_streaming::StreamingServer>,
    /// What the daemon counts and times (served when `[metrics]` is on).
    pub metrics: Arc<Metrics>,
    /// Open exec / attach / port-forward sessions.
    pub sessions: Arc<Sessions>,
    /// CRIU on the node (CheckpointContainer), checked on first use.
    pub checkpoint: Arc<crate::checkpoint::Checkpointing>,
    /// This daemon's hold on the run dir, for its lifetime.
    _run_dir_lock: Flock<File>,
}

/// Runtime-wide settings that must survive a restart.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NetworkSettings {
    #[serde(default)]
    pub pod_cidrs: Vec<String>,
}

impl Record for NetworkSettings {
    const KIND: Kind = Kind::Meta;
    fn key(&self) -> &str {
        "network"
    }
}

impl Daemon {
    /// Opens everything and recovers the pods and containers of a previous
    /// run.
    pub async fn open(config: Config, metrics: Arc<Metrics>) -> anyhow::Result<Daemon> {
        // First: a node where monitors cannot run from a sealed copy of
        // their binary refuses to start before touching anything.
        let launcher = tokio::task::spawn_blocking({
            let config = config.clone();
            move || Launcher::from_config(&config)
        })
        .await?
        .context("preparing the monitor binary")?;
        for dir in [&config.root, &config.run_dir] {
            create_private_dir(dir)?;
        }
        warn_if_root_unsearchable(&config.root);
        let run_dir_lock = lock_run_dir(&config.run_dir)?;
        let systemd = config.cgroup_driver == CgroupDriver::Systemd;
        let cgroups =
            Arc::new(NodeCgroups::detect(systemd).context("detecting the cgroup hierarchies")?);
        let cgroup_hierarchy = cgroups.hierarchy();
        let store = Arc::new(
            Store::open(&config.root.join("meta.db"))
                .context("opening the metadata store (is another crust daemon using this root?)")?,
        );
        let network = store.get::<NetworkSettings>("network")?.unwrap_or_default();
        let apparmor = tokio::task::spawn_blocking(crate::node::NodeAppArmor::setup).await?;
        let mut facts = crate::node::runtime_facts(cgroups.fs(), systemd);
        facts.apparmor_default_profile = apparmor.default_profile();
        let handlers = Arc::new(Handlers::detect(&config).await);

        let daemon_launcher = launcher.clone();
        let pod_host = RealPodHost::new(
            open_cni(&config, &network.pod_cidrs)?,
            config.network.cni_conf_dir.clone(),
            cgroups.clone(),
            launcher.clone(),
            handlers.clone(),
            facts.clone(),
            config.root.clone(),
        )
        .with_cni_observer({
            let metrics = metrics.clone();
            Arc::new(move |add, ok, took| metrics.cni_operation(add, ok, took))
        });
        let (run_root, state_root) = (config.run_dir.join("pods"), config.root.join("pods"));
        for dir in [&run_root, &state_root] {
            create_private_dir(dir)?;
        }
        let pods = Arc::new(Pods::new(
            run_root,
            state_root,
            systemd,
            store.clone(),
            Arc::new(pod_host),
        ));
        pods.recover().await.context("recovering pod sandboxes")?;

        let images = open_images(&config, &store).await?;
        let containers = Arc::new(Containers::new(
            store.clone(),
            Arc::new(RealContainerHost::new(
                launcher,
                cgroups.clone(),
                crate::node::NodeHost {
                    apparmor: apparmor.apparmor.clone(),
                },
            )),
            Arc::new(images.clone()),
            handlers.clone(),
            facts,
            containers::Dirs {
                run_dir: config.run_dir.join("containers"),
                layers_dir: config.containers_dir(),
                cdi_spec_dirs: config.cdi_spec_dirs.clone(),
            },
        ));
        containers
            .recover()
            .await
            .context("recovering containers")?;
        // What recovery found (exits while the daemon was down) goes to
        // the GetContainerEvents subscribers of the next few minutes.
        containers
            .events()
            .recovered(crate::events::RECOVERY_REPLAY);
        let stats = Arc::new(CgroupStats::new(Some(cgroups)));
        let nri = start_nri(&config, &pods, &containers).await?;
        Ok(Daemon {
            lifecycle: Lifecycle::new(pods.clone(), containers.clone(), stats.clone(), nri),
            checkpoint: Arc::new(crate::checkpoint::Checkpointing::new(
                config.checkpoint.clone(),
            )),
            live_config: RwLock::new(Arc::new(config.clone())),
            launcher: daemon_launcher,
            config,
            store,
            cgroup_hierarchy,
            images,
            handlers,
            pods,
            containers,
            stats,
            apparmor,
            pod_cidrs: RwLock::new(network.pod_cidrs),
            streaming: std::sync::OnceLock::new(),
            metrics,
            sessions: Arc::default(),
            _run_dir_lock: run_dir_lock,
        })
    }

    /// The config in force (the start's, with reloads applied).
    pub fn live_config(&self) -> Arc<Config> {
        self.live_config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records what a reload put in force.
    pub fn set_live_config(&self, config: Config) {
        *self.live_config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    pub fn pod_cidrs(&self) -> Vec<String> {
        self.pod_cidrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Persists the pod CIDRs before making them visible.
    pub fn set_pod_cidrs(&self, cidrs: Vec<String>) -> Result<(), crust_store::Error> {
        let mut guard = self.pod_cidrs.write().unwrap_or_else(|e| e.into_inner());
        self.store.put(&NetworkSettings {
            pod_cidrs: cidrs.clone(),
        })?;
        *guard = cidrs;
        Ok(())
    }
}

/// NRI, once the pods and containers are recovered (pre-installed plugins
/// are started and synchronized with them before this returns). A socket
/// that cannot be served stops the daemon: NRI is on unless configured off.
async fn start_nri(
    config: &Config,
    pods: &Arc<Pods>,
    containers: &Arc<Containers>,
) -> anyhow::Result<Nri> {
    let nri = Nri::start(
        config.nri.clone(),
        RuntimeInfo {
            name: "crust".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        Arc::new(NriBackend::new(pods, containers)),
    )
    .await
    .context("starting NRI ([nri] in the config, --nri-socket)")?;
    if nri.is_enabled() {
        info!(
            socket = %config.nri.socket_path.display(),
            plugins = nri.plugins().len(),
            "NRI enabled"
        );
    }
    Ok(nri)
}

/// The CNI plugin runner; installs the default network first if the config
/// asks for it and the conf dir has none.
fn open_cni(config: &Config, pod_cidrs: &[String]) -> anyhow::Result<Cni> {
    let cni = Cni::new(config.network.cni_bin_dirs.clone())
        .context("network.cni_bin_dirs")?
        .with_cache_dir(config.root.join("cni").join("cache"));
    // Before any ADD: what a crash left of a cache write.
    match cni.remove_cache_temp_files() {
        Ok(0) => {}
        Ok(n) => info!(
            n,
            "removed temp files of CNI cache writes a crash cut short"
        ),
        Err(e) => warn!("cannot clean the CNI cache dir: {e}"),
    }
    if config.network.install_default_conflist {
        let net = if pod_cidrs.is_empty() {
            DefaultNetwork::default()
        } else {
            DefaultNetwork::with_pod_cidr(&pod_cidrs.join(","))
        };
        match crust_network::install_default_conflist(&config.network.cni_conf_dir, &net) {
            Ok(Some(path)) => info!(
                path = %path.display(),
                subnets = ?net.subnets,
                "installed the default pod network (network.install_default_conflist)"
            ),
            Ok(None) => {}
            // A read-only conf dir must not keep the daemon down: the node
            // reports NetworkReady=false instead.
            Err(e) => warn!("cannot install the default pod network: {e}"),
        }
    }
    Ok(cni)
}

/// Opens the image store (cleaning what an interrupted run left, then
/// collecting garbage) and the dir of container writable layers.
async fn open_images(config: &Config, store: &Arc<Store>) -> anyhow::Result<ImageService> {
    create_private_dir(&config.containers_dir())?;
    let mut image_config = crust_image::Config::new(&config.root);
    // A missing hosts.toml dir means defaults for every registry.
    image_config.registry_config_dir = Some(config.registry.config_dir.clone());
    image_config.max_concurrent_downloads = config.image.max_concurrent_downloads;
    image_config.pull_progress_timeout = pull_progress_timeout(&config.image);
    image_config.signature_policy = config.image.signature_policy_files();
    ImageService::open(image_config, store.clone())
        .await
        .context("opening the image store")
}

/// `image.pull_progress_timeout` as the image service takes it (0: never).
pub fn pull_progress_timeout(image: &crate::config::ImageSection) -> Option<std::time::Duration> {
    Some(image.pull_progress_timeout).filter(|d| !d.is_zero())
}

/// Takes the run dir for this daemon, as the metadata store's lock takes
/// the root: a second daemon on the same run dir (with another socket and
/// root) would unpin and unmount the first one's pods as orphans at its
/// recovery. The lock goes with the daemon (its descriptor is not
/// inherited by monitors or plugins: close-on-exec).
fn lock_run_dir(dir: &Path) -> anyhow::Result<Flock<File>> {
    let path = dir.join(RUN_DIR_LOCK);
    let lock = take_run_dir_lock(dir)?.map_err(|holder| {
        anyhow::anyhow!(
            "the run dir {} is in use by another crust daemon (pid {holder}): each daemon \
             needs its own run_dir",
            dir.display()
        )
    })?;
    let mut f: &File = &lock;
    f.set_len(0)
        .and_then(|()| f.write_all(format!("{}\n", std::process::id()).as_bytes()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(lock)
}

/// Takes the run dir's lock for a tool that must not run beside a daemon
/// (`crust check` with no daemon), leaving the pid in it alone: `Ok(Err(pid))`
/// when a daemon holds it, `Ok(Ok(None))` when the run dir does not exist
/// (no daemon runs on it).
pub fn hold_run_dir(dir: &Path) -> anyhow::Result<Result<Option<Flock<File>>, String>> {
    if !dir.is_dir() {
        return Ok(Ok(None));
    }
    Ok(take_run_dir_lock(dir)?.map(Some))
}

/// The run dir's lock, or the pid the daemon holding it wrote.
fn take_run_dir_lock(dir: &Path) -> anyhow::Result<Result<Flock<File>, String>> {
    let path = dir.join(RUN_DIR_LOCK);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Ok(lock)),
        Err((file, Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = (&file).take(32).read_to_string(&mut holder);
            Ok(Err(holder.trim().to_string()))
        }
        Err((_, e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// Says once, at start, when pods with user namespaces cannot run under
/// `root`: their mapped users must search every directory down to it.
fn warn_if_root_unsearchable(root: &Path) {
    use crate::pods::root_access::{Searcher, first_unsearchable};
    if let Ok(Some(b)) = first_unsearchable(root, Searcher::Others) {
        warn!(
            "--root {}: {b} cannot be searched by other users; pods with user namespaces \
             will be refused unless it is (o+x) or their mapped users own it",
            root.display()
        );
    }
}

/// Creates `dir` (and parents) readable only by root, as state dirs hold
/// namespaces, sockets and image content.
fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}
