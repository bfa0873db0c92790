//! The OCI spec of a new container (through `crust_oci`, from the request,
//! the pod, the image and the node). An update's resources go through the
//! same conversion (`crust_oci::linux_resources`, in `lifecycle.rs`).

use std::path::PathBuf;

use crust_api::v1::ContainerConfig;
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
