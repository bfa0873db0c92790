//! What NRI plugins are shown of crust's pods and containers, and the
//! translation of resources between NRI, the OCI spec and the CRI. Pure.
//!
//! A container is shown as its OCI spec says (the spec is what runs), read
//! as JSON: the kept `spec.json` of a created container, or the spec being
//! created. Resources NRI can express and the CRI cannot (memory
//! reservation, swappiness, pids, devices, ...) cannot take the CRI update
//! path: an update asking for them is refused, naming the field.

use std::collections::HashMap;

use crust_api::v1::{HugepageLimit as CriHugepageLimit, LinuxContainerResources};
use crust_nri::api::{self, ContainerState as NriState};
use serde_json::Value;

use crate::containers::{ContainerRecord, ContainerState};
use crate::pods::{PodRecord, PodState};

/// A pod as plugins see it.
pub fn pod_sandbox(rec: &PodRecord) -> api::PodSandbox {
    let config = rec.sandbox_config();
    let linux = config.linux.as_ref();
    let mut namespaces = Vec::new();
    for (kind, path) in [
        ("network", &rec.namespaces.net),
        ("ipc", &rec.namespaces.ipc),
        ("uts", &rec.namespaces.uts),
    ] {
        if let Some(p) = path {
            namespaces.push(api::LinuxNamespace {
                r#type: kind.into(),
                path: p.display().to_string(),
            });
        }
    }
    api::PodSandbox {
        id: rec.id.clone(),
        name: rec.metadata.name.clone(),
        uid: rec.metadata.uid.clone(),
        namespace: rec.metadata.namespace.clone(),
        labels: to_map(&rec.labels),
        annotations: to_map(&rec.annotations),
        runtime_handler: rec.runtime_handler.clone(),
        linux: Some(api::LinuxPodSandbox {
            pod_overhead: linux
                .and_then(|l| l.overhead.as_ref())
                .map(resources_from_cri),
            pod_resources: linux
                .and_then(|l| l.resources.as_ref())
                .map(resources_from_cri),
            cgroup_parent: rec.cgroup_parent.clone(),
            cgroups_path: rec.cgroup_path.display().to_string(),
            namespaces,
            resources: None,
        }),
        pid: 0,
        ips: rec.ips().to_vec(),
    }
}

/// Whether a pod still counts as running for plugins.
pub fn pod_ready(rec: &PodRecord) -> bool {
    rec.state == PodState::Ready
}

fn to_map(m: &std::collections::BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub fn container_state(s: ContainerState) -> NriState {
    match s {
        ContainerState::Creating | ContainerState::Created => NriState::ContainerCreated,
        ContainerState::Running => NriState::ContainerRunning,
        ContainerState::Exited => NriState::ContainerStopped,
    }
}

/// A container as plugins see it: the record's identity and status, the
/// rest from its OCI spec (JSON; `Value::Null` when it cannot be read).
pub fn container(rec: &ContainerRecord, spec: &Value) -> api::Container {
    let process = &spec["process"];
    let linux = &spec["linux"];
    let annotations = match spec["annotations"].as_object() {
        Some(a) => a
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        None => to_map(&rec.annotations),
    };
    let user = process["user"].as_object().map(|u| api::User {
        uid: u32_of(&u.get("uid").cloned().unwrap_or_default()),
        gid: u32_of(&u.get("gid").cloned().unwrap_or_default()),
        additional_gids: u
            .get("additionalGids")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(u32_of).collect())
            .unwrap_or_default(),
    });
    api::Container {
        id: rec.id.clone(),
        pod_sandbox_id: rec.pod_id.clone(),
        name: rec.name.clone(),
        state: container_state(rec.state) as i32,
        labels: to_map(&rec.labels),
        annotations,
        args: strings(&process["args"]),
        env: strings(&process["env"]),
        mounts: array(&spec["mounts"])
            .map(|m| api::Mount {
                destination: str_of(&m["destination"]),
                r#type: str_of(&m["type"]),
                source: str_of(&m["source"]),
                options: strings(&m["options"]),
            })
            .collect(),
        hooks: spec["hooks"].as_object().map(|_| hooks(&spec["hooks"])),
        linux: linux.as_object().map(|_| api::LinuxContainer {
            namespaces: array(&linux["namespaces"])
                .map(|n| api::LinuxNamespace {
                    r#type: str_of(&n["type"]),
                    path: str_of(&n["path"]),
                })
                .collect(),
            devices: array(&linux["devices"])
                .map(|d| api::LinuxDevice {
                    path: str_of(&d["path"]),
                    r#type: str_of(&d["type"]),
                    major: d["major"].as_i64().unwrap_or(0),
                    minor: d["minor"].as_i64().unwrap_or(0),
                    file_mode: d["fileMode"]
                        .as_u64()
                        .map(|v| api::OptionalFileMode { value: v as u32 }),
                    uid: d["uid"]
                        .as_u64()
                        .map(|v| api::OptionalUInt32 { value: v as u32 }),
                    gid: d["gid"]
                        .as_u64()
                        .map(|v| api::OptionalUInt32 { value: v as u32 }),
                })
                .collect(),
            resources: linux["resources"]
                .as_object()
                .map(|_| resources_from_oci(&linux["resources"])),
            oom_score_adj: process["oomScoreAdj"]
                .as_i64()
                .map(|v| api::OptionalInt { value: v }),
            cgroups_path: str_of(&linux["cgroupsPath"]),
            sysctl: linux["sysctl"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default(),
            ..Default::default()
        }),
        pid: u32::try_from(rec.pid)
            .ok()
            .filter(|_| rec.state.is_live())
            .unwrap_or(0),
        rlimits: array(&process["rlimits"])
            .map(|r| api::PosixRlimit {
                r#type: str_of(&r["type"]),
                hard: r["hard"].as_u64().unwrap_or(0),
                soft: r["soft"].as_u64().unwrap_or(0),
            })
            .collect(),
        created_at: rec.created_at,
        started_at: rec.started_at,
        finished_at: rec.finished_at,
        exit_code: rec.exit_code,
        status_reason: rec.reason.clone(),
        status_message: rec.message.clone(),
        cdi_devices: Vec::new(),
        user,
    }
}

fn hooks(h: &Value) -> api::Hooks {
    let list = |key: &str| -> Vec<api::Hook> {
        array(&h[key])
            .map(|x| api::Hook {
                path: str_of(&x["path"]),
                args: strings(&x["args"]),
                env: strings(&x["env"]),
                timeout: x["timeout"].as_i64().map(|v| api::OptionalInt { value: v }),
            })
            .collect()
    };
    api::Hooks {
        prestart: list("prestart"),
        create_runtime: list("createRuntime"),
        create_container: list("createContainer"),
        start_container: list("startContainer"),
        poststart: list("poststart"),
        poststop: list("poststop"),
    }
}

fn array(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn strings(v: &Value) -> Vec<String> {
    array(v)
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn u32_of(v: &Value) -> u32 {
    v.as_u64().and_then(|v| u32::try_from(v).ok()).unwrap_or(0)
}

/// The resources of an OCI spec (`linux.resources`, JSON) as NRI's.
pub fn resources_from_oci(r: &Value) -> api::LinuxResources {
    let i64_ = |v: &Value| v.as_i64().map(|value| api::OptionalInt64 { value });
    let u64_ = |v: &Value| v.as_u64().map(|value| api::OptionalUInt64 { value });
    let bool_ = |v: &Value| v.as_bool().map(|value| api::OptionalBool { value });
    let m = &r["memory"];
    let c = &r["cpu"];
    api::LinuxResources {
        memory: m.as_object().map(|_| api::LinuxMemory {
            limit: i64_(&m["limit"]),
            reservation: i64_(&m["reservation"]),
            swap: i64_(&m["swap"]),
            kernel: i64_(&m["kernel"]),
            kernel_tcp: i64_(&m["kernelTCP"]),
            swappiness: u64_(&m["swappiness"]),
            disable_oom_killer: bool_(&m["disableOOMKiller"]),
            use_hierarchy: bool_(&m["useHierarchy"]),
        }),
        cpu: c.as_object().map(|_| api::LinuxCpu {
            shares: u64_(&c["shares"]),
            quota: i64_(&c["quota"]),
            period: u64_(&c["period"]),
            realtime_runtime: i64_(&c["realtimeRuntime"]),
            realtime_period: u64_(&c["realtimePeriod"]),
            cpus: str_of(&c["cpus"]),
            mems: str_of(&c["mems"]),
        }),
        hugepage_limits: array(&r["hugepageLimits"])
            .map(|h| api::HugepageLimit {
                page_size: str_of(&h["pageSize"]),
                limit: h["limit"].as_u64().unwrap_or(0),
            })
            .collect(),
        blockio_class: None,
        rdt_class: None,
        unified: r["unified"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        devices: array(&r["devices"])
            .map(|d| api::LinuxDeviceCgroup {
                allow: d["allow"].as_bool().unwrap_or(false),
                r#type: str_of(&d["type"]),
                major: i64_(&d["major"]),
                minor: i64_(&d["minor"]),
                access: str_of(&d["access"]),
            })
            .collect(),
        pids: r["pids"]["limit"]
            .as_i64()
            .map(|limit| api::LinuxPids { limit }),
    }
}

/// CRI resources as NRI's (what UpdateContainer and pods show plugins).
pub fn resources_from_cri(r: &LinuxContainerResources) -> api::LinuxResources {
    let pos_i64 = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    let pos_u64 = |v: i64| (v > 0).then_some(api::OptionalUInt64 { value: v as u64 });
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: pos_i64(r.memory_limit_in_bytes),
            swap: pos_i64(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: pos_u64(r.cpu_shares),
            quota: pos_i64(r.cpu_quota),
            period: pos_u64(r.cpu_period),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// The resources of an OCI spec as CRI resources (what ContainerStatus
/// reports after plugins adjusted a new container).
pub fn cri_from_oci(spec: &Value) -> LinuxContainerResources {
    let r = &spec["linux"]["resources"];
    LinuxContainerResources {
        cpu_period: r["cpu"]["period"].as_i64().unwrap_or(0),
        cpu_quota: r["cpu"]["quota"].as_i64().unwrap_or(0),
        cpu_shares: r["cpu"]["shares"].as_i64().unwrap_or(0),
        memory_limit_in_bytes: r["memory"]["limit"].as_i64().unwrap_or(0),
        oom_score_adj: spec["process"]["oomScoreAdj"].as_i64().unwrap_or(0),
        cpuset_cpus: str_of(&r["cpu"]["cpus"]),
        cpuset_mems: str_of(&r["cpu"]["mems"]),
        hugepage_limits: array(&r["hugepageLimits"])
            .map(|h| CriHugepageLimit {
                page_size: str_of(&h["pageSize"]),
                limit: h["limit"].as_u64().unwrap_or(0),
            })
            .collect(),
        unified: r["unified"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        memory_swap_limit_in_bytes: r["memory"]["swap"].as_i64().unwrap_or(0),
    }
}

/// `base` with what an NRI update sets: the CRI resources the update path
/// applies. NRI fields the CRI cannot express are refused (an error naming
/// the first such field), not dropped.
pub fn cri_with_update(
    base: LinuxContainerResources,
    u: &api::LinuxResources,
) -> Result<LinuxContainerResources, String> {
    let mut r = base;
    let unsupported = |field: &str| {
        Err(format!(
            "{field} cannot be updated through the CRI resource update path"
        ))
    };
    if let Some(m) = &u.memory {
        if let Some(v) = &m.limit {
            r.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = &m.swap {
            r.memory_swap_limit_in_bytes = v.value;
        }
        for (set, field) in [
            (m.reservation.is_some(), "memory.reservation"),
            (m.kernel.is_some(), "memory.kernel"),
            (m.kernel_tcp.is_some(), "memory.kernel_tcp"),
            (m.swappiness.is_some(), "memory.swappiness"),
            (m.disable_oom_killer.is_some(), "memory.disable_oom_killer"),
            (m.use_hierarchy.is_some(), "memory.use_hierarchy"),
        ] {
            if set {
                return unsupported(field);
            }
        }
    }
    if let Some(c) = &u.cpu {
        if let Some(v) = &c.shares {
            r.cpu_shares = i64::try_from(v.value).map_err(|_| "cpu.shares out of range")?;
        }
        if let Some(v) = &c.quota {
            r.cpu_quota = v.value;
        }
        if let Some(v) = &c.period {
            r.cpu_period = i64::try_from(v.value).map_err(|_| "cpu.period out of range")?;
        }
        if !c.cpus.is_empty() {
            r.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            r.cpuset_mems = c.mems.clone();
        }
        if c.realtime_runtime.is_some() || c.realtime_period.is_some() {
            return unsupported("cpu.realtime_runtime/realtime_period");
        }
    }
    if !u.hugepage_limits.is_empty() {
        r.hugepage_limits = u
            .hugepage_limits
            .iter()
            .map(|h| CriHugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect();
    }
    if !u.unified.is_empty() {
        r.unified.extend(u.unified.clone());
    }
    for (set, field) in [
        (!u.devices.is_empty(), "devices"),
        (u.pids.is_some(), "pids"),
        (u.blockio_class.is_some(), "blockio_class"),
        (u.rdt_class.is_some(), "rdt_class"),
    ] {
        if set {
            return unsupported(field);
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resources_round_trip_between_cri_nri_and_oci() {
        let cri = LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0".into(),
            cpuset_mems: "0".into(),
            ..Default::default()
        };
        let nri = resources_from_cri(&cri);
        assert_eq!(
            nri.memory.as_ref().unwrap().limit.as_ref().unwrap().value,
            64 << 20
        );
        assert_eq!(
            nri.cpu.as_ref().unwrap().shares.as_ref().unwrap().value,
            512
        );
        assert!(nri.memory.as_ref().unwrap().swap.is_none());
        let back = cri_with_update(LinuxContainerResources::default(), &nri).unwrap();
        assert_eq!(back, cri);

        let spec = json!({
            "process": {"oomScoreAdj": 500},
            "linux": {"resources": {
                "memory": {"limit": 1048576, "swappiness": 10},
                "cpu": {"shares": 2, "cpus": "0-1"},
                "pids": {"limit": 20},
                "unified": {"memory.high": "max"}
            }}
        });
        let o = resources_from_oci(&spec["linux"]["resources"]);
        assert_eq!(
            o.memory
                .as_ref()
                .unwrap()
                .swappiness
                .as_ref()
                .unwrap()
                .value,
            10
        );
        assert_eq!(o.pids.as_ref().unwrap().limit, 20);
        assert_eq!(o.cpu.as_ref().unwrap().cpus, "0-1");
        let c = cri_from_oci(&spec);
        assert_eq!(c.memory_limit_in_bytes, 1 << 20);
        assert_eq!(c.oom_score_adj, 500);
        assert_eq!(c.unified["memory.high"], "max");
    }

    #[test]
    fn updates_the_cri_cannot_express_are_refused_by_name() {
        let base = LinuxContainerResources {
            memory_limit_in_bytes: 1 << 30,
            cpu_shares: 100,
            ..Default::default()
        };
        let u = api::LinuxResources {
            cpu: Some(api::LinuxCpu {
                cpus: "1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = cri_with_update(base.clone(), &u).unwrap();
        assert_eq!(r.cpuset_cpus, "1");
        assert_eq!(r.memory_limit_in_bytes, 1 << 30, "unset fields are kept");
        assert_eq!(r.cpu_shares, 100);
        let u = api::LinuxResources {
            pids: Some(api::LinuxPids { limit: 5 }),
            ..Default::default()
        };
        assert!(
            cri_with_update(base.clone(), &u)
                .unwrap_err()
                .contains("pids")
        );
        let u = api::LinuxResources {
            memory: Some(api::LinuxMemory {
                reservation: Some(api::OptionalInt64 { value: 1 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = cri_with_update(base, &u).unwrap_err();
        assert!(e.contains("memory.reservation"), "{e}");
    }

    fn record(id: &str, pod: &str, name: &str) -> ContainerRecord {
        ContainerRecord::for_test(id, pod, name)
    }

    #[test]
    fn a_container_is_shown_as_its_spec_says() {
        let spec = json!({
            "process": {
                "args": ["sleep", "1"], "env": ["A=1"], "oomScoreAdj": 100,
                "user": {"uid": 33, "gid": 33, "additionalGids": [1004]},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 10, "soft": 5}]
            },
            "mounts": [{"destination": "/data", "type": "bind", "source": "/x", "options": ["ro"]}],
            "hooks": {"prestart": [{"path": "/bin/true", "timeout": 3}]},
            "annotations": {"io.kubernetes.cri.container-name": "c"},
            "linux": {
                "cgroupsPath": "/crust/pod/c",
                "namespaces": [{"type": "pid"}, {"type": "network", "path": "/run/ns/net"}],
                "devices": [{"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 438}],
                "resources": {"memory": {"limit": 1024}}
            }
        });
        let rec = record("c1", "p1", "c");
        let c = container(&rec, &spec);
        assert_eq!(
            (c.id.as_str(), c.pod_sandbox_id.as_str(), c.name.as_str()),
            ("c1", "p1", "c")
        );
        assert_eq!(c.args, ["sleep", "1"]);
        assert_eq!(c.env, ["A=1"]);
        assert_eq!(c.mounts[0].destination, "/data");
        assert_eq!(c.mounts[0].options, ["ro"]);
        assert_eq!(
            c.hooks.as_ref().unwrap().prestart[0].timeout.unwrap().value,
            3
        );
        assert_eq!(c.annotations["io.kubernetes.cri.container-name"], "c");
        let l = c.linux.clone().unwrap();
        assert_eq!(l.cgroups_path, "/crust/pod/c");
        assert_eq!(l.namespaces[1].path, "/run/ns/net");
        assert_eq!(l.devices[0].file_mode.unwrap().value, 438);
        assert_eq!(l.oom_score_adj.unwrap().value, 100);
        assert_eq!(
            l.resources.unwrap().memory.unwrap().limit.unwrap().value,
            1024
        );
        assert_eq!(c.rlimits[0].r#type, "RLIMIT_NOFILE");
        assert_eq!(c.user.as_ref().unwrap().additional_gids, [1004]);
        assert_eq!(c.state(), NriState::ContainerCreated);
        // No spec (unreadable): identity and status only.
        let bare = container(&rec, &Value::Null);
        assert_eq!(bare.name, "c");
        assert!(bare.linux.is_none() && bare.args.is_empty());
    }
}
