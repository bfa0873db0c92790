//! The daemon's shared state, built once at start and handed to every
//! service.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use crust_image::ImageService;
use crust_linux::cgroups::{self, Hierarchy};
use crust_store::{Kind, Record, Store};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::pods::Pods;

pub struct Daemon {
    pub config: Config,
    /// Shared with the image service (redb opens a file once per process).
    pub store: Arc<Store>,
    pub cgroup_hierarchy: Hierarchy,
    /// Images: pull, store, unpack, GC (`crates/image`).
    pub images: ImageService,
    /// Pod sandboxes (recovered from the store at start).
    pub pods: Pods,
    /// Containers (recovered from the store and their monitors at start).
    pub containers: crate::containers::Containers,
    /// Pod CIDRs from UpdateRuntimeConfig, for the default network config.
    pod_cidrs: RwLock<Vec<String>>,
    /// The exec / attach / port-forward server, set once at start (its
    /// backend needs the daemon, so it starts after `open`).
    pub streaming: std::sync::OnceLock<crust_streaming::StreamingServer>,
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
    /// Also returns the container IDs whose image leases recovery must
    /// release (see [`crate::containers::release_orphan_leases`]).
    pub async fn open(config: Config) -> anyhow::Result<(Daemon, Vec<String>)> {
        for dir in [&config.root, &config.run_dir] {
            create_private_dir(dir)?;
        }
        let cgroup_hierarchy = cgroups::detect(Path::new("/sys/fs/cgroup"))
            .context("detecting the cgroup hierarchy")?;
        if config.cgroup_driver == crate::config::CgroupDriver::Systemd
            && !cgroups::systemd_booted()
        {
            anyhow::bail!(
                "cgroup_driver = \"systemd\" but systemd is not the init system on this host"
            );
        }
        let store = Arc::new(
            Store::open(&config.root.join("meta.db"))
                .context("opening the metadata store (is another crust daemon using this root?)")?,
        );
        let network = store.get::<NetworkSettings>("network")?.unwrap_or_default();
        let pods = Pods::open(&config, &store, cgroup_hierarchy, &network.pod_cidrs)
            .context("recovering pod sandboxes")?;
        let images = open_images(&config, &store).await?;
        let facts = crate::containers::host_facts(
            cgroup_hierarchy,
            config.cgroup_driver == crate::config::CgroupDriver::Systemd,
        );
        let handlers = crate::containers::handlers::resolve(&config);
        let features = crate::containers::handlers::detect_features(&handlers).await;
        let containers = crate::containers::Containers::new(
            &config,
            &store,
            facts,
            cgroup_hierarchy,
            handlers,
            features,
        );
        let release = containers.recover().context("recovering containers")?;
        let daemon = Daemon {
            config,
            store,
            cgroup_hierarchy,
            images,
            pods,
            containers,
            pod_cidrs: RwLock::new(network.pod_cidrs),
            streaming: std::sync::OnceLock::new(),
        };
        Ok((daemon, release))
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

/// Opens the image store (cleaning what an interrupted run left, then
/// collecting garbage) and the dir of container writable layers.
async fn open_images(config: &Config, store: &Arc<Store>) -> anyhow::Result<ImageService> {
    create_private_dir(&containers_dir(config))?;
    let mut image_config = crust_image::Config::new(&config.root);
    // A missing hosts.toml dir means defaults for every registry.
    image_config.registry_config_dir = Some(config.registry.config_dir.clone());
    ImageService::open(image_config, store.clone())
        .await
        .context("opening the image store")
}

/// Where containers' writable layers (overlayfs upper and work dirs) live.
pub fn containers_dir(config: &Config) -> PathBuf {
    config.root.join("containers")
}

/// Creates `dir` (and parents) readable only by root, as state dirs hold
/// namespaces, sockets and image content.
fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}
