//! The OCI spec of a new container (through `crust_oci`, from the request,
//! the pod, the image and the node), and the OCI resources of an update.
//! (Create's resources come from `crust_oci::container_spec`, an update's
//! from [`update_resources`]: the two are to become one validated path,
//! which UpdatePodSandboxResources will share.)

use std::path::PathBuf;

use crust_api::v1::{ContainerConfig, LinuxContainerResources};
use crust_oci::{RuntimeFacts, SpecInput};

use super::PodView;
use super::error::ContainerError;
use crate::images::ImageFacts;

/// A new container's spec and what its record keeps of it.
pub struct Built {
    pub spec: crust_oci::Spec,
    /// uid, gid, supplementary gids.
    pub user: (u32, u32, Vec<u32>),
    pub stop_signal: i32,
}

/// What goes into a new container's spec.
pub struct Parts<'a> {
    pub id: &'a str,
    pub config: &'a ContainerConfig,
    pub pod: &'a PodView,
    pub image_name: &'a str,
    pub image: &'a ImageFacts,
    pub rootfs: &'a std::path::Path,
    /// The image's /etc/passwd and /etc/group, if it has them.
    pub etc_passwd: Option<&'a str>,
    pub etc_group: Option<&'a str>,
    /// pid mode TARGET: the PID namespace of the target container.
    pub target_pid_ns: Option<PathBuf>,
    /// The node's facts, with the pod's handler's features.
    pub runtime: &'a RuntimeFacts,
    /// The CDI edits of the devices the request names, in order.
    pub cdi: &'a [crust_oci::cdi::ContainerEdits],
}

/// The spec, the user the process runs as and the stop signal.
pub fn build(p: &Parts<'_>, host: &dyn crust_oci::Host) -> Result<Built, ContainerError> {
    let mut facts = p.pod.facts.clone();
    facts.target_pid_ns = p.target_pid_ns.clone();
    let img = &p.image.config;
    let input = SpecInput {
        container_id: p.id,
        config: p.config,
        sandbox_config: &p.pod.sandbox_config,
        image: img,
        image_name: p.image_name,
        etc_passwd: p.etc_passwd,
        etc_group: p.etc_group,
        rootfs: p.rootfs,
        pod: &facts,
        runtime: p.runtime,
        host,
    };
    let mut spec = crust_oci::container_spec(&input).map_err(ContainerError::from_spec)?;
    crust_oci::cdi::apply(&mut spec, p.cdi, "config.CDI_devices", host)
        .map_err(ContainerError::from_spec)?;
    let user = crust_oci::resolve_user(
        p.config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref()),
        &img.user,
        p.etc_passwd,
        p.etc_group,
    )
    .map_err(ContainerError::from_spec)?;
    let stop_signal = crust_oci::stop_signal(p.config, img).map_err(ContainerError::from_spec)?;
    Ok(Built {
        spec,
        user: (user.uid, user.gid, user.additional_gids),
        stop_signal,
    })
}

/// The OCI `LinuxResources` JSON of CRI resources (through the spec crate,
/// so updates get exactly what creation would).
pub fn update_resources(
    res: &LinuxContainerResources,
    facts: &RuntimeFacts,
) -> Result<serde_json::Value, ContainerError> {
    let mut v = serde_json::Map::new();
    let mut cpu = serde_json::Map::new();
    if res.cpu_shares > 0 {
        cpu.insert("shares".into(), res.cpu_shares.into());
    }
    if res.cpu_quota != 0 {
        cpu.insert("quota".into(), res.cpu_quota.into());
    }
    if res.cpu_period > 0 {
        cpu.insert("period".into(), res.cpu_period.into());
    }
    if !res.cpuset_cpus.is_empty() {
        cpu.insert("cpus".into(), res.cpuset_cpus.clone().into());
    }
    if !res.cpuset_mems.is_empty() {
        cpu.insert("mems".into(), res.cpuset_mems.clone().into());
    }
    if !cpu.is_empty() {
        v.insert("cpu".into(), cpu.into());
    }
    let mut mem = serde_json::Map::new();
    if res.memory_limit_in_bytes > 0 {
        mem.insert("limit".into(), res.memory_limit_in_bytes.into());
        if facts.swap_available && res.memory_swap_limit_in_bytes == 0 {
            mem.insert("swap".into(), res.memory_limit_in_bytes.into());
        }
    }
    if res.memory_swap_limit_in_bytes > 0 && facts.swap_available {
        mem.insert("swap".into(), res.memory_swap_limit_in_bytes.into());
    }
    if !mem.is_empty() {
        v.insert("memory".into(), mem.into());
    }
    if !res.unified.is_empty() {
        if !facts.cgroup_v2 {
            return Err(ContainerError::InvalidArgument(
                "linux.unified: needs cgroup v2, this node uses v1".into(),
            ));
        }
        v.insert(
            "unified".into(),
            serde_json::to_value(&res.unified).map_err(ContainerError::internal)?,
        );
    }
    Ok(v.into())
}
