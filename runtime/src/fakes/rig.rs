//! The real pods, containers and life cycle over the fakes.

use std::collections::BTreeMap;
use std::sync::Arc;

use crust_cgroups::Controllers;

use super::{FakeContainerHost, FakeImages, FakePodHost, Journal};
use crate::pods::PodError;

/// The daemon's domain parts over the fakes and a real store in a temp
/// dir: what the life-cycle tests drive.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub journal: Journal,
    pub pod_host: Arc<FakePodHost>,
    pub container_host: Arc<FakeContainerHost>,
    pub images: Arc<FakeImages>,
    pub store: Arc<crust_store::Store>,
    pub pods: Arc<crate::pods::Pods>,
    pub containers: Arc<crate::containers::Containers>,
    pub lifecycle: crate::lifecycle::Lifecycle,
    /// The systemd cgroup driver (pods are slices, containers scopes).
    pub systemd: bool,
    /// A cgroup v2 node with these controllers (None: v1).
    pub v2: Option<Controllers>,
}

/// The image every test container runs.
pub const IMAGE: &str = "busybox";
pub const IMAGE_ID: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000001";

impl Rig {
    /// A fresh daemon on an empty node, with [`IMAGE`] pulled.
    pub async fn new() -> Rig {
        Rig::with(false, None).await
    }

    /// [`Rig::new`] with the systemd cgroup driver and, for a cgroup v2
    /// node, its controllers.
    pub async fn with(systemd: bool, v2: Option<Controllers>) -> Rig {
        Rig::fresh(systemd, v2, None).await
    }

    /// [`Rig::new`] with NRI on, its socket in the rig's dir
    /// ([`Rig::nri_socket`]) and `request_timeout` for plugins' answers.
    pub async fn with_nri(request_timeout: std::time::Duration) -> Rig {
        Rig::fresh(false, None, Some(request_timeout)).await
    }

    async fn fresh(
        systemd: bool,
        v2: Option<Controllers>,
        nri: Option<std::time::Duration>,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::default();
        let pod_host = Arc::new(FakePodHost::new(journal.clone()));
        let container_host = Arc::new(FakeContainerHost::new(journal.clone()));
        let images = Arc::new(FakeImages::new(journal.clone()));
        images.add(IMAGE, IMAGE_ID);
        pod_host.set_controllers(v2);
        container_host.set_controllers(v2);
        let nri = nri.map(|timeout| crust_nri::Config {
            socket_path: dir.path().join("nri/nri.sock"),
            plugin_path: dir.path().join("nri/plugins"),
            plugin_config_path: dir.path().join("nri/conf.d"),
            plugin_request_timeout: timeout,
            ..crust_nri::Config::default()
        });
        Rig::open(
            dir,
            journal,
            pod_host,
            container_host,
            images,
            systemd,
            v2,
            nri,
        )
        .await
    }

    /// Where NRI plugins connect (see [`Rig::with_nri`]).
    pub fn nri_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("nri/nri.sock")
    }

    /// The daemon restarts: everything in memory is gone, the store and
    /// the node stay.
    pub async fn restart(self) -> Rig {
        self.restart_with(|_| {}).await
    }

    /// [`Rig::restart`], with `while_down` happening to the node's
    /// containers while no daemon runs.
    pub async fn restart_with(self, while_down: impl FnOnce(&FakeContainerHost)) -> Rig {
        let Rig {
            dir,
            journal,
            pod_host,
            container_host,
            images,
            store,
            pods,
            containers,
            lifecycle,
            systemd,
            v2,
        } = self;
        drop((lifecycle, containers, pods, store));
        while_down(&container_host);
        Rig::open(
            dir,
            journal,
            pod_host,
            container_host,
            images,
            systemd,
            v2,
            None,
        )
        .await
    }

    // The rig's parts, handed back in across a restart.
    #[allow(clippy::too_many_arguments)]
    async fn open(
        dir: tempfile::TempDir,
        journal: Journal,
        pod_host: Arc<FakePodHost>,
        container_host: Arc<FakeContainerHost>,
        images: Arc<FakeImages>,
        systemd: bool,
        v2: Option<Controllers>,
        nri: Option<crust_nri::Config>,
    ) -> Rig {
        use crust_shim_protocol::RuntimeConfig;
        let store = Arc::new(crust_store::Store::open(&dir.path().join("meta.db")).unwrap());
        let root = dir.path();
        let pods = Arc::new(crate::pods::Pods::new(
            root.join("run/pods"),
            root.join("root/pods"),
            systemd,
            store.clone(),
            pod_host.clone(),
        ));
        pods.recover().await.unwrap();
        let handlers = crate::handlers::Handlers::from_parts(
            BTreeMap::from([
                (
                    String::new(),
                    RuntimeConfig::Embedded {
                        root: root.join("run/runtimes/default"),
                        systemd_cgroup: systemd,
                    },
                ),
                (
                    "runc".to_string(),
                    RuntimeConfig::Cli {
                        path: "/usr/bin/runc".into(),
                        root: root.join("run/runtimes/runc"),
                        systemd_cgroup: systemd,
                    },
                ),
            ]),
            BTreeMap::new(),
        );
        let containers = Arc::new(crate::containers::Containers::new(
            store.clone(),
            container_host.clone(),
            images.clone(),
            Arc::new(handlers),
            crust_oci::RuntimeFacts {
                cgroup_v2: v2.is_some(),
                cgroup_driver: if systemd {
                    crust_oci::CgroupDriver::Systemd
                } else {
                    crust_oci::CgroupDriver::Cgroupfs
                },
                ..Default::default()
            },
            crate::containers::Dirs {
                run_dir: root.join("run/containers"),
                layers_dir: root.join("root/containers"),
                cdi_spec_dirs: vec![root.join("cdi")],
            },
        ));
        containers.recover().await.unwrap();
        let stats = Arc::new(crate::stats::CgroupStats::new(None));
        let nri = match nri {
            Some(config) => crust_nri::Nri::start(
                config,
                crust_nri::RuntimeInfo {
                    name: "crust".into(),
                    version: "test".into(),
                },
                Arc::new(crate::lifecycle::NriBackend::new(&pods, &containers)),
            )
            .await
            .unwrap(),
            None => crust_nri::Nri::disabled(),
        };
        Rig {
            lifecycle: crate::lifecycle::Lifecycle::new(
                pods.clone(),
                containers.clone(),
                stats,
                nri,
            ),
            dir,
            journal,
            pod_host,
            container_host,
            images,
            store,
            pods,
            containers,
            systemd,
            v2,
        }
    }

    /// RunPodSandbox of a pod named `name` (pid mode CONTAINER, so no
    /// pause process, on the CNI network).
    pub async fn run_pod(&self, name: &str) -> Result<String, PodError> {
        self.lifecycle.run_pod(pod_spec(name, |_| {})).await
    }

    /// A ready pod and a created container `name` in it.
    pub async fn pod_and_container(&self, name: &str) -> (String, String) {
        let pod = self.run_pod("web").await.unwrap();
        let id = self
            .lifecycle
            .create_container(&pod, Some(container_config(name, |_| {})))
            .await
            .unwrap();
        (pod, id)
    }

    /// The records of a kind in the store.
    pub fn stored<R: crust_store::Record + serde::de::DeserializeOwned>(&self) -> Vec<R> {
        self.store.list::<R>().unwrap()
    }
}

/// A checked RunPodSandbox request for `name` (namespace "ns", uid
/// "uid-<name>", attempt 0, pid mode CONTAINER, a log directory), changed
/// by `f`.
pub fn pod_spec(
    name: &str,
    f: impl FnOnce(&mut crust_api::v1::PodSandboxConfig),
) -> crate::pods::PodSpec {
    use crust_api::v1::*;
    let mut config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            attempt: 0,
        }),
        log_directory: format!("/var/log/pods/{name}"),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    pid: NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    f(&mut config);
    crate::pods::PodSpec::from_request(RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .unwrap()
}

/// A CreateContainer config for `name` (attempt 0, [`IMAGE`], pid mode
/// CONTAINER, a log path), changed by `f`.
pub fn container_config(
    name: &str,
    f: impl FnOnce(&mut crust_api::v1::ContainerConfig),
) -> crust_api::v1::ContainerConfig {
    use crust_api::v1::*;
    let mut config = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        log_path: format!("{name}/0.log"),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(NamespaceOption {
                    pid: NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    f(&mut config);
    config
}
