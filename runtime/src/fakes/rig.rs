//! The real pods, containers and life cycle over the fakes.

use std::collections::BTreeMap;
use std::sync::Arc;

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
}

/// The image every test container runs.
pub const IMAGE: &str = "busybox";
pub const IMAGE_ID: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000001";

impl Rig {
    /// A fresh daemon on an empty node, with [`IMAGE`] pulled.
    pub async fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::default();
        let pod_host = Arc::new(FakePodHost::new(journal.clone()));
        let container_host = Arc::new(FakeContainerHost::new(journal.clone()));
        let images = Arc::new(FakeImages::new(journal.clone()));
        images.add(IMAGE, IMAGE_ID);
        Rig::open(dir, journal, pod_host, container_host, images).await
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
        } = self;
        drop((lifecycle, containers, pods, store));
        while_down(&container_host);
        Rig::open(dir, journal, pod_host, container_host, images).await
    }

    async fn open(
        dir: tempfile::TempDir,
        journal: Journal,
        pod_host: Arc<FakePodHost>,
        container_host: Arc<FakeContainerHost>,
        images: Arc<FakeImages>,
    ) -> Rig {
        use crust_shim_protocol::RuntimeConfig;
        let store = Arc::new(crust_store::Store::open(&dir.path().join("meta.db")).unwrap());
        let root = dir.path();
        let pods = Arc::new(crate::pods::Pods::new(
            root.join("run/pods"),
            root.join("root/pods"),
            false,
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
                        systemd_cgroup: false,
                    },
                ),
                (
                    "runc".to_string(),
                    RuntimeConfig::Cli {
                        path: "/usr/bin/runc".into(),
                        root: root.join("run/runtimes/runc"),
                        systemd_cgroup: false,
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
                cgroup_v2: false,
                ..Default::default()
            },
            crate::containers::Dirs {
                run_dir: root.join("run/containers"),
                layers_dir: root.join("root/containers"),
            },
        ));
        containers.recover().await.unwrap();
        let stats = Arc::new(crate::stats::CgroupStats::new(
            crust_linux::cgroups::Hierarchy::V1,
        ));
        Rig {
            lifecycle: crate::lifecycle::Lifecycle::new(pods.clone(), containers.clone(), stats),
            dir,
            journal,
            pod_host,
            container_host,
            images,
            store,
            pods,
            containers,
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
