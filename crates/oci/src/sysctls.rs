//! The pod's sysctls (PodSandboxConfig.linux.sysctls): validated, and only
//! those that live in a namespace the pod owns.

use std::collections::BTreeMap;

use crust_api::v1::PodSandboxConfig;
use crust_quote::quote_os;

use crate::SpecError;
use crate::namespaces::pod_modes;

/// Which namespace a sysctl belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SysctlNamespace {
    Ipc,
    Net,
    Uts,
}

/// The namespace of a (valid) sysctl name, or None for node-wide ones.
pub fn sysctl_namespace(name: &str) -> Option<SysctlNamespace> {
    const IPC: &[&str] = &[
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
    ];
    if IPC.contains(&name) || name.starts_with("fs.mqueue.") {
        Some(SysctlNamespace::Ipc)
    } else if name.starts_with("net.") {
        Some(SysctlNamespace::Net)
    } else if name == "kernel.domainname" {
        Some(SysctlNamespace::Uts)
    } else {
        None
    }
}

fn name_ok(name: &str) -> bool {
    name.len() <= 256
        && name.split('.').count() >= 2
        && name.split('.').all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        })
}

/// The pod's sysctls, checked: names are dot-separated segments of
/// `[A-Za-z0-9_-]` (no `/`, no empty segment, so no `..`), values have no
/// NUL or newline and fit in 4096 bytes, and each sysctl lives in a
/// namespace the pod owns (net.* needs a pod network namespace, IPC ones a
/// pod IPC namespace, kernel.domainname a pod UTS namespace).
/// `kernel.hostname` is rejected: the hostname is a field of its own.
pub fn pod_sysctls(sandbox: &PodSandboxConfig) -> Result<BTreeMap<String, String>, SpecError> {
    let Some(linux) = sandbox.linux.as_ref() else {
        return Ok(BTreeMap::new());
    };
    if linux.sysctls.is_empty() {
        return Ok(BTreeMap::new());
    }
    let modes = pod_modes(sandbox)?;
    let mut out = BTreeMap::new();
    for (name, value) in &linux.sysctls {
        let field = format!(
            "sandbox_config.linux.sysctls[{name}]",
            name = quote_os(&name)
        );
        if !name_ok(name) {
            return Err(SpecError::invalid(
                field,
                "sysctl name must be dot-separated segments of [A-Za-z0-9_-] (no '/' or '..')",
            ));
        }
        if value.len() > 4096 || value.contains(['\0', '\n']) {
            return Err(SpecError::invalid(
                field,
                "value must be at most 4096 bytes without NUL or newline",
            ));
        }
        if name == "kernel.hostname" {
            return Err(SpecError::invalid(
                field,
                "set the pod's hostname instead of kernel.hostname",
            ));
        }
        match sysctl_namespace(name) {
            None => {
                return Err(SpecError::invalid(
                    field,
                    "not a namespaced sysctl; it would change the whole node",
                ));
            }
            Some(SysctlNamespace::Net | SysctlNamespace::Uts) if modes.net_host() => {
                return Err(SpecError::invalid(
                    field,
                    "not allowed in a pod that uses the host network",
                ));
            }
            Some(SysctlNamespace::Ipc) if modes.ipc_host() => {
                return Err(SpecError::invalid(
                    field,
                    "not allowed in a pod that uses the host IPC namespace",
                ));
            }
            Some(_) => {}
        }
        out.insert(name.clone(), value.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::{
        LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    };

    fn pod(sysctls: &[(&str, &str)], net: NamespaceMode, ipc: NamespaceMode) -> PodSandboxConfig {
        PodSandboxConfig {
            linux: Some(LinuxPodSandboxConfig {
                sysctls: sysctls
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: net as i32,
                        ipc: ipc as i32,
                        pid: NamespaceMode::Container as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn namespaced_sysctls_pass() {
        let p = pod(
            &[
                ("net.ipv4.ip_unprivileged_port_start", "0"),
                ("net.ipv4.ping_group_range", "0 2147483647"),
                ("kernel.shm_rmid_forced", "1"),
                ("kernel.msgmax", "65536"),
                ("fs.mqueue.msg_max", "20"),
                ("kernel.sem", "250 32000 100 128"),
                ("net.ipv4.conf.eth0.rp_filter", "1"),
            ],
            NamespaceMode::Pod,
            NamespaceMode::Pod,
        );
        let s = pod_sysctls(&p).unwrap();
        assert_eq!(s.len(), 7);
        assert_eq!(s["net.ipv4.ping_group_range"], "0 2147483647");
    }

    #[test]
    fn empty_is_empty() {
        assert!(
            pod_sysctls(&PodSandboxConfig::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_names_rejected() {
        for bad in [
            "net/ipv4/ip_forward",
            "net.ipv4..ip_forward",
            "net.ipv4.conf.../x",
            "..",
            "net",
            "net.ipv4.ip_forward ",
            "net.ipv4.ip\0",
            "",
        ] {
            let e = pod_sysctls(&pod(&[(bad, "1")], NamespaceMode::Pod, NamespaceMode::Pod))
                .unwrap_err();
            assert!(
                e.field().starts_with("sandbox_config.linux.sysctls["),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bad_values_rejected() {
        for bad in ["1\nkernel.x=1", "a\0", &"x".repeat(4097)] {
            assert!(
                pod_sysctls(&pod(
                    &[("net.ipv4.ip_forward", bad)],
                    NamespaceMode::Pod,
                    NamespaceMode::Pod
                ))
                .is_err()
            );
        }
    }

    #[test]
    fn node_wide_sysctls_rejected() {
        for name in [
            "vm.swappiness",
            "kernel.panic",
            "fs.file-max",
            "kernel.hostname",
        ] {
            let e = pod_sysctls(&pod(&[(name, "1")], NamespaceMode::Pod, NamespaceMode::Pod))
                .unwrap_err();
            assert_eq!(e.field(), format!("sandbox_config.linux.sysctls[{name:?}]"));
        }
    }

    #[test]
    fn host_namespaces_block_their_sysctls() {
        let e = pod_sysctls(&pod(
            &[("net.ipv4.ip_forward", "1")],
            NamespaceMode::Node,
            NamespaceMode::Pod,
        ))
        .unwrap_err();
        assert!(e.to_string().contains("host network"), "{e}");
        let e = pod_sysctls(&pod(
            &[("kernel.shmmax", "1")],
            NamespaceMode::Pod,
            NamespaceMode::Node,
        ))
        .unwrap_err();
        assert!(e.to_string().contains("host IPC"), "{e}");
        // IPC sysctls are fine with host network.
        assert!(
            pod_sysctls(&pod(
                &[("kernel.shmmax", "1")],
                NamespaceMode::Node,
                NamespaceMode::Pod
            ))
            .is_ok()
        );
    }

    #[test]
    fn classification() {
        assert_eq!(
            sysctl_namespace("net.core.somaxconn"),
            Some(SysctlNamespace::Net)
        );
        assert_eq!(
            sysctl_namespace("kernel.shmall"),
            Some(SysctlNamespace::Ipc)
        );
        assert_eq!(
            sysctl_namespace("fs.mqueue.queues_max"),
            Some(SysctlNamespace::Ipc)
        );
        assert_eq!(
            sysctl_namespace("kernel.domainname"),
            Some(SysctlNamespace::Uts)
        );
        assert_eq!(sysctl_namespace("kernel.shmallx"), None);
        assert_eq!(sysctl_namespace("vm.overcommit_memory"), None);
    }
}
