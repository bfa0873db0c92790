//! Assembly of the whole spec: [`container_spec`] and [`pause_spec`].

use std::collections::HashMap;
use std::path::PathBuf;

use crust_api::v1::PodSandboxConfig;
use oci_spec::runtime::{Linux, LinuxResources, Mount, Process, Root, Spec, User};
use serde::de::DeserializeOwned;

use crate::apparmor::container_apparmor;
use crate::caps::{ALL_CAPABILITIES, capabilities, no_capabilities};
use crate::cgroup::cgroups_path;
use crate::devices::{container_devices, deny_all};
use crate::mounts::{container_mounts, default_mounts};
use crate::namespaces::{container_namespaces, pause_namespaces, pod_modes};
use crate::process::{DEFAULT_PATH_ENV, process_args, process_cwd, process_env};
use crate::resources::{container_resources, oom_score_adj};
use crate::seccomp::{container_seccomp, default_seccomp_profile};
use crate::sysctls::pod_sysctls;
use crate::user::resolve_user;
use crate::validate::{abs_path, hostname, id, no_nul};
use crate::{PauseInput, SpecError, SpecInput};

/// The OCI runtime-spec version the generated specs declare.
pub const OCI_VERSION: &str = "1.1.0";

/// The uid/gid the pause process runs as (it needs no privilege at all).
pub const PAUSE_UID: u32 = 65535;

/// oom_score_adj of the pause process (containerd's sandbox value), raised
/// to the daemon's own when that is higher.
pub const PAUSE_OOM_SCORE_ADJ: i64 = -998;

/// Annotation keys, as containerd's CRI plugin sets them.
pub mod annotations {
    /// `sandbox` for the pause process, `container` otherwise.
    pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    pub const CONTAINER_TYPE_SANDBOX: &str = "sandbox";
    pub const CONTAINER_TYPE_CONTAINER: &str = "container";
    pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
    pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
    pub const SANDBOX_LOG_DIRECTORY: &str = "io.kubernetes.cri.sandbox-log-directory";
    pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
    pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
}

/// An oci-spec value with every optional field unset. (The crate's
/// `Default`s are runc-ish example configs: a shell, RLIMIT_NOFILE 1024,
/// hostname "youki"... none of which may leak into a container.)
fn blank<T: DeserializeOwned>(json: &str) -> T {
    serde_json::from_str(json).expect("static JSON matches the oci-spec type")
}

fn sandbox_annotations(sandbox: &PodSandboxConfig, sandbox_id: &str) -> HashMap<String, String> {
    let md = sandbox.metadata.clone().unwrap_or_default();
    HashMap::from([
        (annotations::SANDBOX_ID.to_string(), sandbox_id.to_string()),
        (annotations::SANDBOX_NAME.to_string(), md.name),
        (annotations::SANDBOX_NAMESPACE.to_string(), md.namespace),
        (annotations::SANDBOX_UID.to_string(), md.uid),
    ])
}

/// Kubernetes' default masked paths (= containerd's).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Kubernetes' default read-only paths (= containerd's).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn path_list(field: &str, given: &[String], default: &[&str]) -> Result<Vec<String>, SpecError> {
    if given.is_empty() {
        return Ok(default.iter().map(|p| p.to_string()).collect());
    }
    given
        .iter()
        .enumerate()
        .map(|(i, p)| abs_path(&format!("{field}[{i}]"), p))
        .collect()
}

/// The pod's user namespace mappings, which the runtime needs besides the
/// namespace's path (to own the container's /dev, for id-mapped mounts).
fn set_user_mappings(linux: &mut Linux, pod: &crate::PodFacts) {
    let Some(user) = &pod.user_ns else {
        return;
    };
    let map = |m: &crate::IdMapping| -> oci_spec::runtime::LinuxIdMapping {
        blank(&format!(
            r#"{{"containerID":{},"hostID":{},"size":{}}}"#,
            m.container_id, m.host_id, m.size
        ))
    };
    linux.set_uid_mappings(Some(vec![map(&user.uid)]));
    linux.set_gid_mappings(Some(vec![map(&user.gid)]));
}

/// The OCI runtime spec of a container.
///
/// Pure: everything it needs is in `input`, host facts come through
/// `input.host`. Every request field is validated; the error names it.
pub fn container_spec(input: &SpecInput<'_>) -> Result<Spec, SpecError> {
    let config = input.config;
    let sandbox = input.sandbox_config;
    let runtime = input.runtime;
    id("container_id", input.container_id)?;
    let rootfs = abs_path("rootfs", &input.rootfs.to_string_lossy())?;

    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let res = config.linux.as_ref().and_then(|l| l.resources.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    let readonly_rootfs = sc.is_some_and(|s| s.readonly_rootfs);
    let sandbox_privileged = sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|s| s.privileged);
    if privileged && !sandbox_privileged {
        return Err(SpecError::invalid(
            "config.linux.security_context.privileged",
            "privileged containers need a privileged pod (sandbox_config.linux.security_context.privileged)",
        ));
    }

    let modes = pod_modes(sandbox)?;
    let host_name = if sandbox.hostname.is_empty() {
        no_nul("node hostname", &runtime.node_hostname)?;
        runtime.node_hostname.clone()
    } else {
        hostname("sandbox_config.hostname", &sandbox.hostname)?;
        sandbox.hostname.clone()
    };

    // Process
    let args = process_args(config, input.image)?;
    let env = process_env(config, input.image, &host_name)?;
    let cwd = process_cwd(config, input.image)?;
    let who = resolve_user(sc, &input.image.user, input.etc_passwd, input.etc_group)?;
    let all_caps = runtime
        .all_capabilities
        .clone()
        .unwrap_or_else(|| ALL_CAPABILITIES.to_vec());
    let caps = capabilities(sc, &all_caps)?;
    let bounding = caps.bounding().clone().unwrap_or_default();
    let seccomp = container_seccomp(sc, &bounding, runtime, input.host)?;
    let oom = oom_score_adj(res, runtime.min_oom_score_adj)?;
    let apparmor = container_apparmor(sc, privileged, runtime, input.host)?;

    let mut user: User = blank("{}");
    user.set_uid(who.uid);
    user.set_gid(who.gid);
    user.set_additional_gids(Some(who.additional_gids));

    let mut process: Process = blank(r#"{"user":{},"cwd":"/"}"#);
    process.set_terminal(Some(config.tty));
    process.set_user(user);
    process.set_args(Some(args));
    process.set_env(Some(env));
    process.set_cwd(PathBuf::from(cwd));
    process.set_capabilities(Some(caps));
    process.set_no_new_privileges(Some(sc.is_some_and(|s| s.no_new_privs)));
    process.set_oom_score_adj(oom);
    process.set_apparmor_profile(apparmor);
    if !runtime.rlimits.is_empty() {
        process.set_rlimits(Some(runtime.rlimits.clone()));
    }

    // Namespaces, mounts, devices, resources
    let ns = container_namespaces(sc, modes, input.pod, runtime.cgroup_v2)?;
    let (mounts, rootfs_propagation) = container_mounts(
        config,
        privileged,
        readonly_rootfs,
        modes.ipc_host(),
        modes.net_host() && input.pod.user_ns.is_some(),
        input.pod,
        runtime,
        input.host,
    )?;
    let (devices, device_rules) = container_devices(config, privileged, input.host)?;
    let mut resources = container_resources(res, runtime)?;
    let mut rules = Vec::with_capacity(device_rules.len() + 1);
    if !privileged {
        rules.push(deny_all());
    }
    rules.extend(device_rules);
    resources.set_devices(Some(rules));

    let sysctls: HashMap<String, String> = pod_sysctls(sandbox)?.into_iter().collect();

    let (masked, readonly) = if privileged {
        (Vec::new(), Vec::new())
    } else {
        let f = "config.linux.security_context";
        let empty = Vec::new();
        (
            path_list(
                &format!("{f}.masked_paths"),
                sc.map(|s| &s.masked_paths).unwrap_or(&empty),
                DEFAULT_MASKED_PATHS,
            )?,
            path_list(
                &format!("{f}.readonly_paths"),
                sc.map(|s| &s.readonly_paths).unwrap_or(&empty),
                DEFAULT_READONLY_PATHS,
            )?,
        )
    };

    let cgroups = cgroups_path(
        runtime.cgroup_driver,
        &input.pod.cgroup_parent,
        input.container_id,
    )?;

    let mut linux: Linux = blank("{}");
    linux.set_namespaces(Some(ns.namespaces));
    set_user_mappings(&mut linux, input.pod);
    linux.set_resources(Some(resources));
    linux.set_cgroups_path(Some(PathBuf::from(cgroups)));
    linux.set_devices(Some(devices));
    linux.set_seccomp(seccomp);
    linux.set_masked_paths(Some(masked));
    linux.set_readonly_paths(Some(readonly));
    linux.set_rootfs_propagation(rootfs_propagation);
    if !sysctls.is_empty() {
        linux.set_sysctl(Some(sysctls));
    }

    let mut root: Root = blank("{}");
    root.set_path(PathBuf::from(rootfs));
    root.set_readonly(Some(readonly_rootfs));

    let mut ann = sandbox_annotations(sandbox, &input.pod.sandbox_id);
    ann.insert(
        annotations::CONTAINER_TYPE.into(),
        annotations::CONTAINER_TYPE_CONTAINER.into(),
    );
    ann.insert(
        annotations::CONTAINER_NAME.into(),
        config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
    );
    ann.insert(annotations::IMAGE_NAME.into(), input.image_name.to_string());

    let mut spec: Spec = blank("{}");
    spec.set_version(OCI_VERSION.to_string());
    spec.set_root(Some(root));
    spec.set_mounts(Some(mounts));
    spec.set_process(Some(process));
    if ns.uts_private && !host_name.is_empty() {
        spec.set_hostname(Some(host_name));
    }
    spec.set_annotations(Some(ann));
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// The OCI runtime spec of a pod's pause process: runs `input.command` from
/// a read-only minimal rootfs as uid/gid 65535 with no capabilities, no new
/// privileges and the default seccomp profile, in a new PID namespace and the
/// pod's network/IPC/UTS namespaces, with a cgroup under the pod's.
pub fn pause_spec(input: &PauseInput<'_>) -> Result<Spec, SpecError> {
    let sandbox = input.sandbox_config;
    let runtime = input.runtime;
    let pod = input.pod;
    id("sandbox_id", &pod.sandbox_id)?;
    let rootfs = abs_path("rootfs", &input.rootfs.to_string_lossy())?;
    let command = abs_path("pause command", input.command)?;
    let modes = pod_modes(sandbox)?;
    let ns = pause_namespaces(modes, pod, runtime.cgroup_v2)?;

    let mut user: User = blank("{}");
    user.set_uid(PAUSE_UID);
    user.set_gid(PAUSE_UID);
    user.set_additional_gids(Some(vec![PAUSE_UID]));

    let mut process: Process = blank(r#"{"user":{},"cwd":"/"}"#);
    process.set_terminal(Some(false));
    process.set_user(user);
    process.set_args(Some(vec![command]));
    process.set_env(Some(vec![DEFAULT_PATH_ENV.to_string()]));
    process.set_capabilities(Some(no_capabilities()));
    process.set_no_new_privileges(Some(true));
    process.set_oom_score_adj(Some(
        PAUSE_OOM_SCORE_ADJ.max(runtime.min_oom_score_adj.clamp(-1000, 1000)) as i32,
    ));

    let mounts: Vec<Mount> = default_mounts(false)
        .into_iter()
        .filter(|m| {
            matches!(
                m.destination().to_str(),
                Some("/proc" | "/dev" | "/dev/pts")
            )
        })
        .collect();

    let mut resources: LinuxResources = blank("{}");
    resources.set_devices(Some(vec![deny_all()]));

    let mut linux: Linux = blank("{}");
    linux.set_namespaces(Some(ns.namespaces));
    set_user_mappings(&mut linux, input.pod);
    linux.set_resources(Some(resources));
    linux.set_cgroups_path(Some(PathBuf::from(cgroups_path(
        runtime.cgroup_driver,
        &pod.cgroup_parent,
        &pod.sandbox_id,
    )?)));
    linux.set_devices(Some(Vec::new()));
    linux.set_seccomp(Some(default_seccomp_profile(
        &Default::default(),
        runtime.seccomp_arch,
    )));
    linux.set_masked_paths(Some(
        DEFAULT_MASKED_PATHS.iter().map(|p| p.to_string()).collect(),
    ));
    linux.set_readonly_paths(Some(
        DEFAULT_READONLY_PATHS
            .iter()
            .map(|p| p.to_string())
            .collect(),
    ));

    let mut root: Root = blank("{}");
    root.set_path(PathBuf::from(rootfs));
    root.set_readonly(Some(true));

    let mut ann = sandbox_annotations(sandbox, &pod.sandbox_id);
    ann.insert(
        annotations::CONTAINER_TYPE.into(),
        annotations::CONTAINER_TYPE_SANDBOX.into(),
    );
    ann.insert(
        annotations::SANDBOX_LOG_DIRECTORY.into(),
        sandbox.log_directory.clone(),
    );

    let mut spec: Spec = blank("{}");
    spec.set_version(OCI_VERSION.to_string());
    spec.set_root(Some(root));
    spec.set_mounts(Some(mounts));
    spec.set_process(Some(process));
    if ns.uts_private && !sandbox.hostname.is_empty() {
        hostname("sandbox_config.hostname", &sandbox.hostname)?;
        spec.set_hostname(Some(sandbox.hostname.clone()));
    }
    spec.set_annotations(Some(ann));
    spec.set_linux(Some(linux));
    Ok(spec)
}
