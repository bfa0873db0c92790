//! The daemon's parts, built once at start and handed to the services:
//! the store, the images, the pods, the containers and the life cycle that
//! orders them. This is the one place that wires the real node effects
//! (`RealPodHost`, `RealContainerHost`) into the domain modules.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use crust_image::ImageService;
use crust_linux::cgroups::{self, Hierarchy};
use crust_network::{Cni, DefaultNetwork};
use crust_store::{Kind, Record, Store};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::{CgroupDriver, Config};
use crate::containers::{self, Containers, RealContainerHost};
use crate::handlers::Handlers;
use crate::launch::Launcher;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::pods::{Pods, RealPodHost};
use crate::stats::CgroupStats;
use crate::streaming_backend::Sessions;

pub struct Daemon {
    pub config: Config,
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
    /// Pod CIDRs from UpdateRuntimeConfig, for the default network config.
    pod_cidrs: RwLock<Vec<String>>,
    /// The exec / attach / port-forward server, set once at start (its
    /// backend needs the pods and containers, so it starts after `open`).
    pub streaming: std::sync::OnceLock<crust_streaming::StreamingServer>,
    /// What the daemon counts and times (served when `[metrics]` is on).
    pub metrics: Arc<Metrics>,
    /// Open exec / attach / port-forward sessions.
    pub sessions: Arc<Sessions>,
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
        for dir in [&config.root, &config.run_dir] {
            create_private_dir(dir)?;
        }
        let cgroup_hierarchy = cgroups::detect(Path::new("/sys/fs/cgroup"))
            .context("detecting the cgroup hierarchy")?;
        let systemd = config.cgroup_driver == CgroupDriver::Systemd;
        if systemd && !cgroups::systemd_booted() {
            anyhow::bail!(
                "cgroup_driver = \"systemd\" but systemd is not the init system on this host"
            );
        }
        let store = Arc::new(
            Store::open(&config.root.join("meta.db"))
                .context("opening the metadata store (is another crust daemon using this root?)")?,
        );
        let network = store.get::<NetworkSettings>("network")?.unwrap_or_default();
        let facts = crate::node::runtime_facts(cgroup_hierarchy, systemd);
        let handlers = Arc::new(Handlers::detect(&config).await);
        let launcher = Launcher::from_config(&config);

        let pod_host = RealPodHost::new(
            open_cni(&config, &network.pod_cidrs)?,
            config.network.cni_conf_dir.clone(),
            cgroup_hierarchy,
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
            Arc::new(RealContainerHost::new(launcher, cgroup_hierarchy)),
            Arc::new(images.clone()),
            handlers.clone(),
            facts,
            containers::Dirs {
                run_dir: config.run_dir.join("containers"),
                layers_dir: config.containers_dir(),
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
        let stats = Arc::new(CgroupStats::new(cgroup_hierarchy));
        Ok(Daemon {
            lifecycle: Lifecycle::new(pods.clone(), containers.clone(), stats.clone()),
            config,
            store,
            cgroup_hierarchy,
            images,
            handlers,
            pods,
            containers,
            stats,
            pod_cidrs: RwLock::new(network.pod_cidrs),
            streaming: std::sync::OnceLock::new(),
            metrics,
            sessions: Arc::default(),
        })
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

/// The CNI plugin runner; installs the default network first if the config
/// asks for it and the conf dir has none.
fn open_cni(config: &Config, pod_cidrs: &[String]) -> anyhow::Result<Cni> {
    let cni = Cni::new(config.network.cni_bin_dirs.clone())
        .context("network.cni_bin_dirs")?
        .with_cache_dir(config.root.join("cni").join("cache"));
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
    ImageService::open(image_config, store.clone())
        .await
        .context("opening the image store")
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
