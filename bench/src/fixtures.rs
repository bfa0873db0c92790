//! The CRI configs of the pods and containers the bench creates, and the
//! names it gives them: unique per bench process, so that its pods can be
//! found again (and removed) by name.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crust_api::v1;

/// The namespace of every pod the bench creates.
const NAMESPACE: &str = "crust-bench";

/// What every fixture of one bench run shares.
pub struct Fixtures {
    /// cgroup_parent of the bench's pods ("" = the runtime's default).
    pub cgroup_parent: String,
    /// Where the pods' log directories go (removed at exit).
    pub log_root: PathBuf,
    /// Numbers the names of this run.
    seq: AtomicU64,
}

impl Fixtures {
    pub fn new(cgroup_parent: String) -> Fixtures {
        Fixtures {
            cgroup_parent,
            log_root: std::env::temp_dir().join(format!("crust-bench-{}", std::process::id())),
            seq: AtomicU64::new(0),
        }
    }

    /// `<prefix>-<bench pid>-<n>`, a name no other call (or bench) gives.
    pub fn unique(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{}-{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A fresh pod name ([`Fixtures::is_own_pod`] knows it).
    pub fn pod_name(&self) -> String {
        self.unique("bench")
    }

    /// Whether a listed pod is one this bench process created (also one
    /// whose RunPodSandbox was cut short, so the bench never learnt its id).
    pub fn is_own_pod(&self, metadata: &v1::PodSandboxMetadata) -> bool {
        let prefix = format!("bench-{}-", std::process::id());
        metadata.namespace == NAMESPACE && metadata.name.starts_with(&prefix)
    }

    pub fn pod_config(&self, name: &str, host_network: bool) -> v1::PodSandboxConfig {
        let network = if host_network {
            v1::NamespaceMode::Node
        } else {
            v1::NamespaceMode::Pod
        };
        v1::PodSandboxConfig {
            metadata: Some(v1::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: NAMESPACE.into(),
                attempt: 0,
            }),
            // As kubelet: a host-network pod keeps the node's UTS namespace
            // and hostname.
            hostname: if host_network {
                String::new()
            } else {
                name.into()
            },
            log_directory: self.log_root.join(name).display().to_string(),
            linux: Some(v1::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
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
}

/// A container of the pod `sandbox` running `sleep 3600`, in the pod's
/// network namespace mode (as kubelet asks: NODE in a host-network pod).
pub fn container_config(
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

/// How a runtime handler is shown in figure names.
pub fn handler_label(h: &str) -> &str {
    if h.is_empty() { "default" } else { h }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network_of(c: &v1::PodSandboxConfig) -> i32 {
        c.linux
            .as_ref()
            .unwrap()
            .security_context
            .as_ref()
            .unwrap()
            .namespace_options
            .as_ref()
            .unwrap()
            .network
    }

    #[test]
    fn names_are_unique_and_pods_recognised_as_own() {
        let f = Fixtures::new("/crust-bench-test".into());
        let (a, b) = (f.pod_name(), f.pod_name());
        assert_ne!(a, b);
        let c = f.pod_config(&a, true);
        assert!(f.is_own_pod(c.metadata.as_ref().unwrap()));
        let foreign = v1::PodSandboxMetadata {
            name: a.clone(),
            namespace: "default".into(),
            ..Default::default()
        };
        assert!(!f.is_own_pod(&foreign));
        let other_bench = v1::PodSandboxMetadata {
            name: "bench-1-0".into(),
            namespace: NAMESPACE.into(),
            ..Default::default()
        };
        assert_eq!(f.is_own_pod(&other_bench), std::process::id() == 1);
    }

    #[test]
    fn pods_get_the_runs_cgroup_parent_and_kubelets_namespaces() {
        let f = Fixtures::new("/crust-bench-test".into());
        let host = f.pod_config("p", true);
        assert_eq!(
            host.linux.as_ref().unwrap().cgroup_parent,
            "/crust-bench-test"
        );
        assert_eq!(
            host.hostname, "",
            "a host-network pod keeps the node's hostname"
        );
        assert_eq!(network_of(&host), v1::NamespaceMode::Node as i32);
        let cni = f.pod_config("p", false);
        assert_eq!(cni.hostname, "p");
        assert_eq!(network_of(&cni), v1::NamespaceMode::Pod as i32);
        assert!(cni.log_directory.starts_with(f.log_root.to_str().unwrap()));
    }

    #[test]
    fn a_container_follows_its_pods_network_mode() {
        let f = Fixtures::new(String::new());
        for host in [true, false] {
            let pod = f.pod_config("p", host);
            let c = container_config("c", "img", &pod);
            let ns = c
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .namespace_options
                .unwrap();
            assert_eq!(ns.network, network_of(&pod));
        }
        assert_eq!(handler_label(""), "default");
        assert_eq!(handler_label("runc"), "runc");
    }
}
