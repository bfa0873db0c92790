//! Verbose PodSandboxStatus: the pod as containerd shows it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde_json::{Value, json};

use super::Pods;
use super::record::{PodRecord, PodState};

impl Pods {
    /// The verbose part of PodSandboxStatus (`info["info"]`), shaped like
    /// containerd's so tools that read it find the same keys.
    pub fn verbose_info(&self, rec: &PodRecord) -> Value {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let net_closed = rec
            .namespaces
            .net
            .as_deref()
            .is_none_or(|p| !self.host.is_pinned(p));
        let config = rec.sandbox_config();
        json!({
            // The pause process of a pid = POD pod; else nothing runs until
            // containers do.
            "pid": self.host.pause_pid(rec).unwrap_or(0),
            "state": match rec.state {
                PodState::Ready => "ready",
                PodState::NotReady => "notready",
                PodState::Creating => "creating",
            },
            "runtimeHandler": rec.runtime_handler,
            "netNamespacePath": path(&rec.namespaces.net),
            "netNamespaceClosed": net_closed,
            "namespaces": {
                "network": path(&rec.namespaces.net),
                "ipc": path(&rec.namespaces.ipc),
                "uts": path(&rec.namespaces.uts),
            },
            "cgroupParent": rec.cgroup_parent,
            "cgroupPath": rec.cgroup_path,
            "shmPath": path(&rec.shm),
            "hostname": rec.hostname,
            "hostnamePath": rec.hostname_path,
            "hostsPath": rec.hosts_path,
            "resolvConfPath": rec.resolv_conf_path,
            "cniNetwork": rec.network.as_ref().map(|n| n.config.name.clone()),
            "cniResult": rec.network.as_ref().and_then(|n| n.result.clone()),
            "config": config_json(&config),
        })
    }
}

/// PodSandboxConfig as JSON with the CRI's field names (as containerd's
/// verbose info shows it).
fn config_json(c: &crust_api::v1::PodSandboxConfig) -> Value {
    let md = c.metadata.clone().unwrap_or_default();
    let linux = c.linux.clone().unwrap_or_default();
    let sc = linux.security_context.clone().unwrap_or_default();
    let ns = sc.namespace_options.clone().unwrap_or_default();
    let mode = |m: i32| {
        crust_api::v1::NamespaceMode::try_from(m)
            .map(|m| m.as_str_name().to_string())
            .unwrap_or_else(|_| m.to_string())
    };
    let dns = c.dns_config.clone().unwrap_or_default();
    json!({
        "metadata": {
            "name": md.name,
            "uid": md.uid,
            "namespace": md.namespace,
            "attempt": md.attempt,
        },
        "hostname": c.hostname,
        "log_directory": c.log_directory,
        "dns_config": {
            "servers": dns.servers,
            "searches": dns.searches,
            "options": dns.options,
        },
        "port_mappings": c.port_mappings.iter().map(|p| json!({
            "protocol": crust_api::v1::Protocol::try_from(p.protocol)
                .map(|p| p.as_str_name().to_string())
                .unwrap_or_else(|_| p.protocol.to_string()),
            "container_port": p.container_port,
            "host_port": p.host_port,
            "host_ip": p.host_ip,
        })).collect::<Vec<_>>(),
        "labels": sorted(&c.labels),
        "annotations": sorted(&c.annotations),
        "linux": {
            "cgroup_parent": linux.cgroup_parent,
            "sysctls": sorted(&linux.sysctls),
            "security_context": {
                "namespace_options": {
                    "network": mode(ns.network),
                    "pid": mode(ns.pid),
                    "ipc": mode(ns.ipc),
                    "target_id": ns.target_id,
                },
                "privileged": sc.privileged,
                "readonly_rootfs": sc.readonly_rootfs,
                "run_as_user": sc.run_as_user.map(|u| u.value),
                "run_as_group": sc.run_as_group.map(|g| g.value),
                "supplemental_groups": sc.supplemental_groups,
            },
        },
    })
}

fn sorted(m: &HashMap<String, String>) -> BTreeMap<&String, &String> {
    m.iter().collect()
}
