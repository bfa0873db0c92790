//! The persistent record of a pod sandbox.
//!
//! It is written (state `creating`) before RunPodSandbox touches the host,
//! and holds every path and network setting the pod's effects will have, so
//! tearing a pod down, also after a crash at any step, needs nothing but
//! the record. Every teardown step is idempotent.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crust_api::v1::PodSandboxConfig;
use crust_network::Attachment;
use crust_network::config::NetworkConfigList;
use crust_store::{Kind, Record};
use prost::Message;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodState {
    /// RunPodSandbox is (or was, before a crash) setting the pod up; not
    /// visible to clients.
    Creating,
    Ready,
    NotReady,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMetadata {
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub attempt: u32,
}

/// Where the pod's own namespaces are (to be) pinned; None: the node's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacePaths {
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
    /// The pod's user namespace (userns_options mode POD), which owns the
    /// others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<PathBuf>,
    /// Its uid and gid mapping: (container ID, host ID, length) each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_mappings: Option<[(u32, u32, u32); 2]>,
}

/// The pod's CNI attachment: what ADD got, so DEL gets the same config and
/// capabilities (portmap and bridge find their rules by them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkRecord {
    /// The network config list as loaded at RunPodSandbox.
    pub config: NetworkConfigList,
    pub attachment: Attachment,
    /// The ADD result (prevResult for DEL); None until ADD succeeded.
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    /// The pod IPs from the result, IPv4 first.
    #[serde(default)]
    pub ips: Vec<String>,
    /// Whether a DEL is owed: set before ADD, cleared once DEL succeeded.
    pub attached: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    /// 64 hex characters.
    pub id: String,
    pub state: PodState,
    /// Nanoseconds since the Unix epoch.
    pub created_at: i64,
    pub metadata: PodMetadata,
    pub runtime_handler: String,
    /// The hostname the pod's containers see (config's, else the node's).
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub log_directory: String,
    pub host_network: bool,
    pub host_ipc: bool,
    pub host_pid: bool,
    /// As the request gave it (kubelet's format for the cgroup driver).
    pub cgroup_parent: String,
    /// The pod cgroup in every hierarchy: `<parent>/crust-<id>` (cgroupfs
    /// driver) or its slice's (systemd); containers' cgroups go below it.
    pub cgroup_path: PathBuf,
    /// The pod's slice (systemd driver; records of older daemons have
    /// none: their `cgroup_path` is a plain cgroup).
    #[serde(default)]
    pub slice: Option<crate::cgroups::PodSlice>,
    /// `<run_dir>/pods/<id>`: pinned namespaces and the shm mount.
    pub run_dir: PathBuf,
    /// `<root>/pods/<id>`: hostname, hosts and resolv.conf.
    pub state_dir: PathBuf,
    /// The dir holding the pinned namespaces (`<run_dir>/ns`).
    pub ns_dir: PathBuf,
    pub namespaces: NamespacePaths,
    /// The pod's /dev/shm tmpfs; None with host IPC (containers use the
    /// node's).
    pub shm: Option<PathBuf>,
    pub hostname_path: PathBuf,
    pub hosts_path: PathBuf,
    pub resolv_conf_path: PathBuf,
    /// None for host-network pods.
    pub network: Option<NetworkRecord>,
    /// The whole PodSandboxConfig as protobuf, hex-encoded (for verbose
    /// status and for the containers that join the pod).
    pub config: String,
}

impl Record for PodRecord {
    const KIND: Kind = Kind::Pod;
    fn key(&self) -> &str {
        &self.id
    }
}

impl PodRecord {
    /// The request's config, as stored.
    pub fn sandbox_config(&self) -> PodSandboxConfig {
        hex::decode(&self.config)
            .ok()
            .and_then(|bytes| PodSandboxConfig::decode(bytes.as_slice()).ok())
            .unwrap_or_default()
    }

    /// The pod IPs while the pod is attached to its network.
    pub fn ips(&self) -> &[String] {
        match &self.network {
            Some(n) if n.attached && self.state == PodState::Ready => &n.ips,
            _ => &[],
        }
    }

    /// Whether a CNI DEL is still owed.
    pub fn network_attached(&self) -> bool {
        self.network.as_ref().is_some_and(|n| n.attached)
    }
}

/// The `hex` encoding of a config, for [`PodRecord::config`].
pub fn encode_config(config: &PodSandboxConfig) -> String {
    hex::encode(config.encode_to_vec())
}
