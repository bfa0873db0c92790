//! The persistent record of a container.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crust_api::v1::{ContainerConfig, LinuxContainerResources};
use crust_shim_protocol::{ExitInfo, RuntimeConfig};
use crust_store::{Kind, Record};
use prost::Message;
use serde::{Deserialize, Serialize};

use super::image_names::ReportedImage;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerState {
    /// CreateContainer is (or was, before a crash) setting it up.
    Creating,
    Created,
    Running,
    Exited,
}

impl ContainerState {
    /// Created or running: its process exists and a monitor watches it.
    pub fn is_live(self) -> bool {
        matches!(self, ContainerState::Created | ContainerState::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Creating => "CREATING",
            ContainerState::Created => "CREATED",
            ContainerState::Running => "RUNNING",
            ContainerState::Exited => "EXITED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// 64 hex characters.
    pub id: String,
    pub pod_id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    /// The image as the request named it (kubelet: the image ID).
    pub image: String,
    /// The image ID (`sha256:...`). Stored as `image_ref`, its name in
    /// records of older daemons.
    #[serde(rename = "image_ref")]
    pub image_id: String,
    /// The name and repo digest its status reports; None in records of
    /// older daemons (see [`ContainerRecord::reported_image`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_image: Option<ReportedImage>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The CRI log file (pod log dir + config.log_path).
    pub log_path: Option<PathBuf>,
    /// ContainerConfig as protobuf, hex-encoded.
    pub config: String,
    /// The request's image annotations and user-specified name, kept out
    /// of `config` so that listing need not decode it. `None` in records
    /// written before this field (then `config` is decoded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_request: Option<ImageRequest>,
    pub handler: String,
    pub runtime: RuntimeConfig,
    /// `<run_dir>/containers/<id>`: the monitor's state dir.
    pub state_dir: PathBuf,
    /// `<state_dir>/bundle`.
    pub bundle: PathBuf,
    /// `<bundle>/rootfs`: the overlay mount.
    pub rootfs: PathBuf,
    /// `<root>/containers/<id>`: overlay upper and work dirs.
    pub layer_dir: PathBuf,
    /// uid, gid, supplementary gids.
    pub user: Option<(u32, u32, Vec<u32>)>,
    /// Current LinuxContainerResources as protobuf, hex-encoded.
    pub resources: Option<String>,
    pub stop_signal: i32,
    /// The container's init pid (host namespace).
    pub pid: i32,
    /// The image IDs of the request's image volumes, by index in
    /// `config.mounts` (ContainerStatus.mounts[].image reports them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_volumes: BTreeMap<usize, String>,
    /// When StartContainer asked the monitor to start the process (0:
    /// never), in records of older daemons, which wrote it (with an fsync)
    /// before the request. Recovery now asks the monitor whether and when
    /// the start got there (`State.started_at_unix_nanos`); this is the
    /// fallback for monitors of those daemons.
    #[serde(default)]
    pub start_requested_at: i64,
    /// The cgroupsPath its spec gave the OCI runtime (`/pod/crust-<id>`
    /// or `<slice>:crust:<id>`): where stats and the orphan cleanup look.
    /// None in records of older daemons (then the bundle's config.json
    /// tells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroups_path: Option<String>,
    /// The checkpoint archive it is created from (StartContainer restores
    /// its processes instead of starting new ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<PathBuf>,
}

/// What of the request's ImageSpec a container's status repeats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageRequest {
    pub annotations: BTreeMap<String, String>,
    pub user_specified_image: String,
}

impl From<Option<crust_api::v1::ImageSpec>> for ImageRequest {
    fn from(spec: Option<crust_api::v1::ImageSpec>) -> Self {
        let spec = spec.unwrap_or_default();
        ImageRequest {
            annotations: spec.annotations.into_iter().collect(),
            user_specified_image: spec.user_specified_image,
        }
    }
}

impl Record for ContainerRecord {
    const KIND: Kind = Kind::Container;
    fn key(&self) -> &str {
        &self.id
    }
}

impl ContainerRecord {
    pub fn name_key(&self) -> (String, String, u32) {
        (self.pod_id.clone(), self.name.clone(), self.attempt)
    }

    /// The request's ContainerConfig, as stored.
    pub fn config(&self) -> ContainerConfig {
        hex::decode(&self.config)
            .ok()
            .and_then(|b| ContainerConfig::decode(b.as_slice()).ok())
            .unwrap_or_default()
    }

    /// What its status reports of its image. Records of older daemons did
    /// not keep it: they report the name the user gave (or the request's
    /// image) and the ID as image_ref, as those daemons did.
    pub fn reported_image(&self) -> ReportedImage {
        if let Some(r) = &self.reported_image {
            return r.clone();
        }
        let user_specified = self
            .image_request
            .as_ref()
            .map(|r| r.user_specified_image.clone())
            .unwrap_or_else(|| {
                self.config()
                    .image
                    .map(|i| i.user_specified_image)
                    .unwrap_or_default()
            });
        ReportedImage {
            name: if user_specified.is_empty() {
                self.image.clone()
            } else {
                user_specified
            },
            image_ref: self.image_id.clone(),
        }
    }

    /// The current resources (as created or last updated).
    pub fn resources(&self) -> Option<LinuxContainerResources> {
        self.resources
            .as_ref()
            .and_then(|h| hex::decode(h).ok())
            .and_then(|b| LinuxContainerResources::decode(b.as_slice()).ok())
    }

    pub fn set_exit(&mut self, e: &ExitInfo) {
        self.state = ContainerState::Exited;
        self.finished_at = e.exited_at_unix_nanos;
        self.exit_code = e.exit_code;
        self.reason = if e.oom_killed {
            "OOMKilled"
        } else if e.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
        .to_string();
        if self.started_at == 0 && self.finished_at > 0 {
            // Killed before it was started.
            self.started_at = 0;
        }
    }
}

#[cfg(test)]
impl ContainerRecord {
    /// A created container record for unit tests.
    pub(crate) fn for_test(id: &str, pod: &str, name: &str) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            pod_id: pod.into(),
            name: name.into(),
            attempt: 0,
            state: super::ContainerState::Created,
            created_at: 1,
            started_at: 0,
            start_requested_at: 0,
            cgroups_path: None,
            restore: None,
            image_volumes: Default::default(),
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_id: "sha256:1".into(),
            reported_image: None,
            labels: Default::default(),
            annotations: Default::default(),
            log_path: None,
            config: String::new(),
            image_request: None,
            handler: String::new(),
            runtime: crust_shim_protocol::RuntimeConfig::Embedded {
                root: "/run/x".into(),
                systemd_cgroup: false,
            },
            state_dir: "/run/x/c1".into(),
            bundle: "/run/x/c1/bundle".into(),
            rootfs: "/run/x/c1/bundle/rootfs".into(),
            layer_dir: "/var/x/c1".into(),
            user: None,
            resources: None,
            stop_signal: 15,
            pid: 42,
        }
    }
}
