//! Namespaces: the pod's pinned network/IPC/UTS namespaces joined by path
//! (or the host's for NODE pods), the PID namespace as the container asks
//! (POD, CONTAINER, NODE, TARGET), a new mount namespace, a new cgroup
//! namespace on cgroup v2. A pod with userns_options mode POD has a pinned
//! user namespace that owns the others; its containers join it by path.

use std::path::{Path, PathBuf};

use crust_api::v1::{
    LinuxContainerSecurityContext, NamespaceMode, NamespaceOption, PodSandboxConfig,
};
use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceType};

use crate::validate::abs_path;
use crate::{PodFacts, SpecError};

const SANDBOX_NS: &str = "sandbox_config.linux.security_context.namespace_options";
const CONTAINER_NS: &str = "config.linux.security_context.namespace_options";

/// The pod's namespace modes, from its sandbox config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PodModes {
    pub network: NamespaceMode,
    pub ipc: NamespaceMode,
    pub pid: NamespaceMode,
    /// userns_options mode POD: the pod has its own user namespace.
    pub user_pod: bool,
}

impl PodModes {
    pub fn net_host(&self) -> bool {
        self.network == NamespaceMode::Node
    }
    pub fn ipc_host(&self) -> bool {
        self.ipc == NamespaceMode::Node
    }
}

fn mode(field: String, v: i32) -> Result<NamespaceMode, SpecError> {
    NamespaceMode::try_from(v)
        .map_err(|_| SpecError::invalid(field, format!("unknown namespace mode {v}")))
}

fn check_userns(prefix: &str, opts: Option<&NamespaceOption>) -> Result<(), SpecError> {
    let Some(u) = opts.and_then(|o| o.userns_options.as_ref()) else {
        return Ok(());
    };
    let field = format!("{prefix}.userns_options.mode");
    match mode(field.clone(), u.mode)? {
        // POD: the daemon made (and pinned) the pod's user namespace;
        // pod_shared_namespaces joins it, or fails if there is none.
        NamespaceMode::Node | NamespaceMode::Pod => Ok(()),
        m => Err(SpecError::invalid(
            field,
            format!("{} is not a valid user namespace mode", m.as_str_name()),
        )),
    }
}

/// Reads and checks the pod's namespace modes. Network and IPC may be POD
/// or NODE; PID may be POD, CONTAINER or NODE; user namespaces must be the
/// node's.
pub(crate) fn pod_modes(sandbox: &PodSandboxConfig) -> Result<PodModes, SpecError> {
    let opts = sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let d = NamespaceOption::default();
    let o = opts.unwrap_or(&d);
    let network = mode(format!("{SANDBOX_NS}.network"), o.network)?;
    let ipc = mode(format!("{SANDBOX_NS}.ipc"), o.ipc)?;
    let pid = mode(format!("{SANDBOX_NS}.pid"), o.pid)?;
    for (name, m) in [("network", network), ("ipc", ipc)] {
        if !matches!(m, NamespaceMode::Pod | NamespaceMode::Node) {
            return Err(SpecError::invalid(
                format!("{SANDBOX_NS}.{name}"),
                format!("{} is not valid for a pod", m.as_str_name()),
            ));
        }
    }
    if pid == NamespaceMode::Target {
        return Err(SpecError::invalid(
            format!("{SANDBOX_NS}.pid"),
            "TARGET is not valid for a pod",
        ));
    }
    check_userns(SANDBOX_NS, opts)?;
    let user_pod = o
        .userns_options
        .as_ref()
        .is_some_and(|u| u.mode == NamespaceMode::Pod as i32);
    Ok(PodModes {
        network,
        ipc,
        pid,
        user_pod,
    })
}

fn ns(typ: LinuxNamespaceType, path: Option<PathBuf>) -> LinuxNamespace {
    let mut n = LinuxNamespace::default();
    n.set_typ(typ);
    n.set_path(path);
    n
}

fn pinned(field: &str, p: Option<&Path>) -> Result<PathBuf, SpecError> {
    let Some(p) = p else {
        return Err(SpecError::precondition(
            field,
            "the pod has no such namespace (daemon state is missing it)",
        ));
    };
    Ok(PathBuf::from(abs_path(field, &p.to_string_lossy())?))
}

/// The result of [`container_namespaces`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamespacePlan {
    pub namespaces: Vec<LinuxNamespace>,
    /// The container has its own (the pod's pinned) UTS namespace, so the
    /// spec carries the pod's hostname.
    pub uts_private: bool,
}

/// The container's namespaces.
pub(crate) fn container_namespaces(
    sc: Option<&LinuxContainerSecurityContext>,
    modes: PodModes,
    pod: &PodFacts,
    cgroup_v2: bool,
) -> Result<NamespacePlan, SpecError> {
    let opts = sc.and_then(|s| s.namespace_options.as_ref());
    let d = NamespaceOption::default();
    let o = opts.unwrap_or(&d);
    let c_net = mode(format!("{CONTAINER_NS}.network"), o.network)?;
    let c_ipc = mode(format!("{CONTAINER_NS}.ipc"), o.ipc)?;
    let c_pid = mode(format!("{CONTAINER_NS}.pid"), o.pid)?;
    check_userns(CONTAINER_NS, opts)?;
    if let Some(u) = o.userns_options.as_ref() {
        let pod_mode = if pod.user_ns.is_some() {
            NamespaceMode::Pod
        } else {
            NamespaceMode::Node
        };
        if u.mode != pod_mode as i32 {
            return Err(SpecError::invalid(
                format!("{CONTAINER_NS}.userns_options.mode"),
                format!(
                    "must be the pod's user namespace mode ({})",
                    pod_mode.as_str_name()
                ),
            ));
        }
    }

    // Network and IPC follow the pod. A container may not ask for the host's
    // when its pod does not have them; POD/CONTAINER are read as "the pod's",
    // as containerd does (crictl configs often leave them at the default).
    for (name, m, pod_m) in [("network", c_net, modes.network), ("ipc", c_ipc, modes.ipc)] {
        match m {
            NamespaceMode::Node if pod_m != NamespaceMode::Node => {
                return Err(SpecError::invalid(
                    format!("{CONTAINER_NS}.{name}"),
                    "NODE requires the pod to use the host's namespace",
                ));
            }
            NamespaceMode::Target => {
                return Err(SpecError::invalid(
                    format!("{CONTAINER_NS}.{name}"),
                    "TARGET is only valid for pid",
                ));
            }
            _ => {}
        }
    }

    let mut out = Vec::new();
    // PID
    match c_pid {
        NamespaceMode::Pod => {
            match modes.pid {
                NamespaceMode::Node => {
                    return Err(SpecError::invalid(
                        format!("{CONTAINER_NS}.pid"),
                        "POD, but the pod uses the host PID namespace; ask for NODE",
                    ));
                }
                NamespaceMode::Container => {
                    return Err(SpecError::invalid(
                        format!("{CONTAINER_NS}.pid"),
                        "POD, but the pod does not share a PID namespace (its pid mode is CONTAINER); ask for CONTAINER",
                    ));
                }
                _ => {}
            }
            out.push(ns(
                LinuxNamespaceType::Pid,
                Some(pinned("pod.pid_ns", pod.pid_ns.as_deref())?),
            ));
        }
        NamespaceMode::Container => out.push(ns(LinuxNamespaceType::Pid, None)),
        NamespaceMode::Node => {
            if modes.pid != NamespaceMode::Node {
                return Err(SpecError::invalid(
                    format!("{CONTAINER_NS}.pid"),
                    "NODE requires the pod to use the host PID namespace",
                ));
            }
        }
        NamespaceMode::Target => {
            let v = o.target_id.as_str();
            if v.is_empty() {
                return Err(SpecError::invalid(
                    format!("{CONTAINER_NS}.target_id"),
                    "must be set for pid mode TARGET",
                ));
            }
            crate::validate::id(&format!("{CONTAINER_NS}.target_id"), v)?;
            out.push(ns(
                LinuxNamespaceType::Pid,
                Some(pinned("pod.target_pid_ns", pod.target_pid_ns.as_deref())?),
            ));
        }
    }
    pod_shared_namespaces(out, modes, pod, cgroup_v2)
}

/// The pause process's namespaces: the pod's network/IPC/UTS, a new PID
/// namespace (that is what it is for), new mount, new cgroup on v2.
pub(crate) fn pause_namespaces(
    modes: PodModes,
    pod: &PodFacts,
    cgroup_v2: bool,
) -> Result<NamespacePlan, SpecError> {
    if modes.pid != NamespaceMode::Pod {
        return Err(SpecError::invalid(
            format!("{SANDBOX_NS}.pid"),
            format!(
                "{}: a pause process is only needed for pods that share a PID namespace (POD)",
                modes.pid.as_str_name()
            ),
        ));
    }
    let out = vec![ns(LinuxNamespaceType::Pid, None)];
    pod_shared_namespaces(out, modes, pod, cgroup_v2)
}

/// Appends what a container and the pause process take alike after their
/// PID namespace: the pod's IPC, UTS (which follows the network mode) and
/// network namespaces unless the pod uses the host's, a new mount
/// namespace, and a new cgroup namespace on v2.
fn pod_shared_namespaces(
    mut out: Vec<LinuxNamespace>,
    modes: PodModes,
    pod: &PodFacts,
    cgroup_v2: bool,
) -> Result<NamespacePlan, SpecError> {
    if modes.user_pod || pod.user_ns.is_some() {
        let path = pod.user_ns.as_ref().map(|u| u.path.as_path());
        // First: the runtime joins it before the namespaces it owns.
        out.insert(
            0,
            ns(LinuxNamespaceType::User, Some(pinned("pod.user_ns", path)?)),
        );
    }
    if !modes.ipc_host() {
        out.push(ns(
            LinuxNamespaceType::Ipc,
            Some(pinned("pod.ipc_ns", pod.ipc_ns.as_deref())?),
        ));
    }
    let uts_private = !modes.net_host();
    if uts_private {
        out.push(ns(
            LinuxNamespaceType::Uts,
            Some(pinned("pod.uts_ns", pod.uts_ns.as_deref())?),
        ));
    }
    out.push(ns(LinuxNamespaceType::Mount, None));
    if !modes.net_host() {
        out.push(ns(
            LinuxNamespaceType::Network,
            Some(pinned("pod.net_ns", pod.net_ns.as_deref())?),
        ));
    }
    if cgroup_v2 {
        out.push(ns(LinuxNamespaceType::Cgroup, None));
    }
    Ok(NamespacePlan {
        namespaces: out,
        uts_private,
    })
}
