//! Applying a merged [`ContainerAdjustment`] to an OCI runtime spec, as
//! containerd/nri's `pkg/runtime-tools/generate` does, so every handler (the
//! embedded runtime, runc, crun) runs the container as plugins adjusted it.
//!
//! Pure: no host access. Two things need the runtime's help and are passed
//! in [`ApplyOptions`]: CDI device references (resolved against the node's
//! CDI specs) and block I/O classes (resolved against its class config); an
//! adjustment asking for either without a resolver is an error, never
//! silently dropped. An RDT class becomes the CLOS id of the same name, as
//! in containerd. Differences from the Go generator, all in the direction of
//! honouring more of what plugins set: memory reservation, swap, swappiness,
//! kernel (TCP) limits and OOM-killer settings are applied (Go only applies
//! the limit), an explicit swap is kept (Go always sets swap = limit), and an
//! rlimit replaces one of the same type instead of being appended next to it.
//! Host mount propagation for rshared/rslave adjustment mounts is not checked
//! here (that needs the host); the rootfs propagation is set as in Go.

use std::collections::HashMap;

use oci_spec::runtime::{
    Hooks, Linux, LinuxBlockIo, LinuxCpu, LinuxDevice, LinuxDeviceCgroup, LinuxIntelRdt,
    LinuxMemory, LinuxNamespace, LinuxNetDevice as OciNetDevice, LinuxPids,
    LinuxResources as OciResources, LinuxSchedulerFlag, Mount as OciMount, PosixRlimit, Process,
    Spec,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::api::{
    ContainerAdjustment, Hook, LinuxDevice as NriDevice, LinuxResources, LinuxSchedulerPolicy,
    Mount, removal_target,
};

/// An adjustment that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot apply NRI adjustment of {field}: {message}")]
pub struct ApplyError {
    /// The adjusted field ("mounts", "linux.seccomp_policy", ...).
    pub field: &'static str,
    pub message: String,
}

/// Resolves CDI device names into `spec`.
pub type CdiInjector<'a> = &'a dyn Fn(&mut Spec, &[String]) -> Result<(), String>;
/// Resolves a block I/O class name.
pub type BlockIoResolver<'a> = &'a dyn Fn(&str) -> Result<LinuxBlockIo, String>;

/// What the runtime resolves itself.
#[derive(Default, Clone, Copy)]
pub struct ApplyOptions<'a> {
    pub inject_cdi_devices: Option<CdiInjector<'a>>,
    pub resolve_blockio_class: Option<BlockIoResolver<'a>>,
}

fn err(field: &'static str, message: impl std::fmt::Display) -> ApplyError {
    ApplyError {
        field,
        message: message.to_string(),
    }
}

/// Builds an oci-spec value from its JSON form (the OCI spec's own
/// spelling), so unknown enum values are rejected with a clear message.
fn from_json<T: DeserializeOwned>(field: &'static str, v: Value) -> Result<T, ApplyError> {
    serde_json::from_value(v).map_err(|e| err(field, e))
}

/// Applies `adj` to `spec`.
pub fn apply_adjustment(
    spec: &mut Spec,
    adj: &ContainerAdjustment,
    opts: ApplyOptions<'_>,
) -> Result<(), ApplyError> {
    annotations(spec, &adj.annotations);
    env(spec, &adj.env);
    if !adj.args.is_empty() {
        process(spec).set_args(Some(adj.args.clone()));
    }
    if let Some(h) = &adj.hooks {
        hooks(spec, h)?;
    }
    if !adj.cdi_devices.is_empty() {
        let names: Vec<String> = adj.cdi_devices.iter().map(|d| d.name.clone()).collect();
        let inject = opts
            .inject_cdi_devices
            .ok_or_else(|| err("cdi_devices", "this runtime does not resolve CDI devices"))?;
        inject(spec, &names).map_err(|e| err("cdi_devices", e))?;
    }
    if let Some(l) = &adj.linux {
        devices(spec, &l.devices)?;
        if !l.cgroups_path.is_empty() {
            linux(spec).set_cgroups_path(Some(l.cgroups_path.clone().into()));
        }
        if let Some(v) = l.oom_score_adj {
            let v =
                i32::try_from(v.value).map_err(|_| err("linux.oom_score_adj", "out of range"))?;
            process(spec).set_oom_score_adj(Some(v));
        }
        if let Some(p) = &l.io_priority {
            let class = p.class();
            let prio = if class == crate::api::IoPrioClass::IoprioClassNone {
                None
            } else {
                Some(from_json(
                    "linux.io_priority",
                    json!({"class": class.as_str_name(), "priority": p.priority}),
                )?)
            };
            process(spec).set_io_priority(prio);
        }
        if let Some(s) = &l.scheduler {
            process(spec).set_scheduler(scheduler(s)?);
        }
        if let Some(s) = &l.seccomp_policy {
            let v = json!({
                "defaultAction": s.default_action,
                "defaultErrnoRet": s.default_errno.map(|e| e.value),
                "architectures": s.architectures,
                "flags": s.flags,
                "listenerPath": (!s.listener_path.is_empty()).then_some(&s.listener_path),
                "listenerMetadata": (!s.listener_metadata.is_empty()).then_some(&s.listener_metadata),
                "syscalls": s.syscalls.iter().map(|c| json!({
                    "names": c.names,
                    "action": c.action,
                    "errnoRet": c.errno_ret.map(|e| e.value),
                    "args": c.args.iter().map(|a| json!({
                        "index": a.index, "value": a.value, "valueTwo": a.value_two, "op": a.op,
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            linux(spec).set_seccomp(Some(from_json("linux.seccomp_policy", strip_nulls(v))?));
        }
        namespaces(spec, &l.namespaces)?;
        keyed_map(linux(spec).sysctl_mut(), &l.sysctl, |v| v.clone());
        let net: HashMap<String, OciNetDevice> = l
            .net_devices
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    from_json("linux.net_devices", json!({"name": v.name}))?,
                ))
            })
            .collect::<Result<_, ApplyError>>()?;
        keyed_map(linux(spec).net_devices_mut(), &net, |v| v.clone());
        if let Some(m) = &l.memory_policy {
            let mode = m.mode();
            let policy = json!({
                "mode": mode.as_str_name(),
                "nodes": (!m.nodes.is_empty()).then_some(&m.nodes),
                "flags": m.flags().map(|f| f.as_str_name()).collect::<Vec<_>>(),
            });
            linux(spec)
                .set_memory_policy(Some(from_json("linux.memory_policy", strip_nulls(policy))?));
        }
        if let Some(r) = &l.resources {
            resources(spec, r, opts)?;
        }
        if let Some(rdt) = &l.rdt {
            if rdt.remove {
                linux(spec).set_intel_rdt(None);
            }
            if rdt.clos_id.is_some() || rdt.schemata.is_some() || rdt.enable_monitoring.is_some() {
                let r = linux(spec)
                    .intel_rdt_mut()
                    .get_or_insert_with(LinuxIntelRdt::default);
                if let Some(c) = &rdt.clos_id {
                    r.set_clos_id(Some(c.value.clone()));
                }
                if let Some(s) = &rdt.schemata {
                    r.set_schemata(Some(s.value.clone()));
                }
                if let Some(m) = rdt.enable_monitoring {
                    r.set_enable_monitoring(Some(m.value));
                }
            }
        }
    }
    mounts(spec, &adj.mounts)?;
    rlimits(spec, &adj.rlimits)?;
    Ok(())
}

/// An empty section (oci-spec's `Default`s come with a full default
/// container: args, namespaces, masked paths, which must not sneak in).
fn empty<T: DeserializeOwned>() -> T {
    serde_json::from_value(json!({})).expect("empty OCI section")
}

fn process(spec: &mut Spec) -> &mut Process {
    spec.process_mut().get_or_insert_with(|| {
        let mut p: Process =
            from_json("process", json!({"user": {"uid": 0, "gid": 0}, "cwd": "/"}))
                .expect("minimal process");
        p.set_args(None);
        p
    })
}

fn linux(spec: &mut Spec) -> &mut Linux {
    spec.linux_mut().get_or_insert_with(empty)
}

fn oci_resources(spec: &mut Spec) -> &mut OciResources {
    linux(spec)
        .resources_mut()
        .get_or_insert_with(OciResources::default)
}

/// JSON `null`s stand for "unset": drop them so optional fields stay absent.
fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        v => v,
    }
}

/// Adds, replaces and ('-key') removes entries of a keyed spec map.
fn keyed_map<V, A>(
    target: &mut Option<HashMap<String, V>>,
    adj: &HashMap<String, A>,
    conv: impl Fn(&A) -> V,
) {
    if adj.is_empty() {
        return;
    }
    let map = target.get_or_insert_with(HashMap::new);
    let mut keys: Vec<&String> = adj.keys().collect();
    keys.sort();
    for k in keys {
        match removal_target(k) {
            Some(key) => {
                map.remove(key);
            }
            None => {
                map.insert(k.clone(), conv(&adj[k]));
            }
        }
    }
}

fn annotations(spec: &mut Spec, adj: &HashMap<String, String>) {
    keyed_map(spec.annotations_mut(), adj, |v| v.clone());
}

fn env(spec: &mut Spec, adj: &[crate::api::KeyValue]) {
    if adj.is_empty() {
        return;
    }
    let p = process(spec);
    let mut env = p.env().clone().unwrap_or_default();
    for e in adj {
        let key = crate::api::clear_removal_marker(&e.key);
        let pos = env
            .iter()
            .position(|x| x.split_once('=').map_or(x.as_str(), |(k, _)| k) == key);
        match (removal_target(&e.key), pos) {
            (Some(_), Some(i)) => {
                env.remove(i);
            }
            (Some(_), None) => {}
            (None, Some(i)) => env[i] = format!("{}={}", e.key, e.value),
            (None, None) => env.push(format!("{}={}", e.key, e.value)),
        }
    }
    p.set_env(Some(env));
}

fn hook(h: &Hook) -> Result<oci_spec::runtime::Hook, ApplyError> {
    from_json(
        "hooks",
        strip_nulls(json!({
            "path": h.path,
            "args": (!h.args.is_empty()).then_some(&h.args),
            "env": (!h.env.is_empty()).then_some(&h.env),
            "timeout": h.timeout.map(|t| t.value),
        })),
    )
}

fn hooks(spec: &mut Spec, h: &crate::api::Hooks) -> Result<(), ApplyError> {
    let all = [
        &h.prestart,
        &h.create_runtime,
        &h.create_container,
        &h.start_container,
        &h.poststart,
        &h.poststop,
    ];
    if all.iter().all(|l| l.is_empty()) {
        return Ok(());
    }
    let convert = |l: &Vec<Hook>| l.iter().map(hook).collect::<Result<Vec<_>, _>>();
    let hooks = spec.hooks_mut().get_or_insert_with(Hooks::default);
    let append = |cur: Option<Vec<oci_spec::runtime::Hook>>, add: Vec<oci_spec::runtime::Hook>| {
        let mut v = cur.unwrap_or_default();
        v.extend(add);
        (!v.is_empty()).then_some(v)
    };
    #[allow(deprecated)]
    {
        hooks.set_prestart(append(hooks.prestart().clone(), convert(&h.prestart)?));
    }
    hooks.set_create_runtime(append(
        hooks.create_runtime().clone(),
        convert(&h.create_runtime)?,
    ));
    hooks.set_create_container(append(
        hooks.create_container().clone(),
        convert(&h.create_container)?,
    ));
    hooks.set_start_container(append(
        hooks.start_container().clone(),
        convert(&h.start_container)?,
    ));
    hooks.set_poststart(append(hooks.poststart().clone(), convert(&h.poststart)?));
    hooks.set_poststop(append(hooks.poststop().clone(), convert(&h.poststop)?));
    Ok(())
}

/// NRI's access string for a device rule: read and write, plus mknod for
/// block devices (containerd/nri LinuxDevice.AccessString).
fn access(d: &NriDevice) -> &'static str {
    if d.r#type == "b" { "rwm" } else { "rw" }
}

fn devices(spec: &mut Spec, adj: &[NriDevice]) -> Result<(), ApplyError> {
    for d in adj {
        let path = crate::api::clear_removal_marker(&d.path);
        let l = linux(spec);
        if let Some(list) = l.devices_mut() {
            list.retain(|x| x.path().to_str() != Some(path));
        }
        if removal_target(&d.path).is_some() {
            continue;
        }
        let dev: LinuxDevice = from_json(
            "linux.devices",
            strip_nulls(json!({
                "path": d.path,
                "type": d.r#type,
                "major": d.major,
                "minor": d.minor,
                "fileMode": d.file_mode.map(|m| m.value),
                "uid": d.uid.map(|u| u.value),
                "gid": d.gid.map(|g| g.value),
            })),
        )?;
        l.devices_mut().get_or_insert_with(Vec::new).push(dev);
        let rule: LinuxDeviceCgroup = from_json(
            "linux.devices",
            json!({"allow": true, "type": d.r#type, "major": d.major, "minor": d.minor, "access": access(d)}),
        )?;
        oci_resources(spec)
            .devices_mut()
            .get_or_insert_with(Vec::new)
            .push(rule);
    }
    Ok(())
}

fn scheduler(
    s: &crate::api::LinuxScheduler,
) -> Result<Option<oci_spec::runtime::Scheduler>, ApplyError> {
    use crate::api::LinuxSchedulerFlag as F;
    if s.policy() == LinuxSchedulerPolicy::SchedNone {
        return Ok(None);
    }
    // oci-spec spells SCHED_FLAG_RESET_ON_FORK differently from the OCI spec,
    // so flags map by variant, not by name.
    let flags: Vec<LinuxSchedulerFlag> = s
        .flags()
        .map(|f| match f {
            F::SchedFlagResetOnFork => LinuxSchedulerFlag::SchedResetOnFork,
            F::SchedFlagReclaim => LinuxSchedulerFlag::SchedFlagReclaim,
            F::SchedFlagDlOverrun => LinuxSchedulerFlag::SchedFlagDLOverrun,
            F::SchedFlagKeepPolicy => LinuxSchedulerFlag::SchedFlagKeepPolicy,
            F::SchedFlagKeepParams => LinuxSchedulerFlag::SchedFlagKeepParams,
            F::SchedFlagUtilClampMin => LinuxSchedulerFlag::SchedFlagUtilClampMin,
            F::SchedFlagUtilClampMax => LinuxSchedulerFlag::SchedFlagUtilClampMax,
        })
        .collect();
    let mut sched: oci_spec::runtime::Scheduler = from_json(
        "linux.scheduler",
        json!({
            "policy": s.policy().as_str_name(),
            "nice": s.nice,
            "priority": s.priority,
            "runtime": s.runtime,
            "deadline": s.deadline,
            "period": s.period,
        }),
    )?;
    sched.set_flags((!flags.is_empty()).then_some(flags));
    Ok(Some(sched))
}

fn namespaces(spec: &mut Spec, adj: &[crate::api::LinuxNamespace]) -> Result<(), ApplyError> {
    for n in adj {
        let typ = crate::api::clear_removal_marker(&n.r#type);
        let ns: LinuxNamespace = from_json(
            "linux.namespaces",
            strip_nulls(json!({"type": typ, "path": (!n.path.is_empty()).then_some(&n.path)})),
        )?;
        let list = linux(spec).namespaces_mut().get_or_insert_with(Vec::new);
        let existing = list.iter().position(|x| x.typ() == ns.typ());
        match (removal_target(&n.r#type), existing) {
            (Some(_), Some(i)) => {
                list.remove(i);
            }
            (Some(_), None) => {}
            (None, Some(i)) => list[i] = ns,
            (None, None) => list.push(ns),
        }
    }
    Ok(())
}

fn resources(
    spec: &mut Spec,
    r: &LinuxResources,
    opts: ApplyOptions<'_>,
) -> Result<(), ApplyError> {
    let res = oci_resources(spec);
    if let Some(c) = &r.cpu {
        let cpu = res.cpu_mut().get_or_insert_with(LinuxCpu::default);
        if let Some(v) = c.shares {
            cpu.set_shares(Some(v.value));
        }
        if let Some(v) = c.quota {
            cpu.set_quota(Some(v.value));
        }
        if let Some(v) = c.period {
            cpu.set_period(Some(v.value));
        }
        if let Some(v) = c.realtime_runtime {
            cpu.set_realtime_runtime(Some(v.value));
        }
        if let Some(v) = c.realtime_period {
            cpu.set_realtime_period(Some(v.value));
        }
        if !c.cpus.is_empty() {
            cpu.set_cpus(Some(c.cpus.clone()));
        }
        if !c.mems.is_empty() {
            cpu.set_mems(Some(c.mems.clone()));
        }
    }
    if let Some(m) = &r.memory {
        let mem = res.memory_mut().get_or_insert_with(LinuxMemory::default);
        if let Some(v) = m.limit
            && v.value != 0
        {
            mem.set_limit(Some(v.value));
            // As Go NRI: without an explicit swap, memory+swap = limit.
            if m.swap.is_none() {
                mem.set_swap(Some(v.value));
            }
        }
        if let Some(v) = m.swap {
            mem.set_swap(Some(v.value));
        }
        if let Some(v) = m.reservation {
            mem.set_reservation(Some(v.value));
        }
        if let Some(v) = m.kernel {
            #[allow(deprecated)]
            mem.set_kernel(Some(v.value));
        }
        if let Some(v) = m.kernel_tcp {
            mem.set_kernel_tcp(Some(v.value));
        }
        if let Some(v) = m.swappiness {
            mem.set_swappiness(Some(v.value));
        }
        if let Some(v) = m.disable_oom_killer {
            mem.set_disable_oom_killer(Some(v.value));
        }
        if let Some(v) = m.use_hierarchy {
            mem.set_use_hierarchy(Some(v.value));
        }
    }
    for h in &r.hugepage_limits {
        let list = res.hugepage_limits_mut().get_or_insert_with(Vec::new);
        let limit = i64::try_from(h.limit)
            .map_err(|_| err("linux.resources.hugepage_limits", "limit out of range"))?;
        list.retain(|x| x.page_size() != &h.page_size);
        list.push(from_json(
            "linux.resources.hugepage_limits",
            json!({"pageSize": h.page_size, "limit": limit}),
        )?);
    }
    if !r.unified.is_empty() {
        let u = res.unified_mut().get_or_insert_with(HashMap::new);
        for (k, v) in &r.unified {
            u.insert(k.clone(), v.clone());
        }
    }
    if let Some(p) = r.pids {
        let mut pids = LinuxPids::default();
        pids.set_limit(p.limit);
        res.set_pids(Some(pids));
    }
    for d in &r.devices {
        let rule: LinuxDeviceCgroup = from_json(
            "linux.resources.devices",
            strip_nulls(json!({
                "allow": d.allow,
                "type": (!d.r#type.is_empty()).then_some(&d.r#type),
                "major": d.major.map(|v| v.value),
                "minor": d.minor.map(|v| v.value),
                "access": (!d.access.is_empty()).then_some(&d.access),
            })),
        )?;
        res.devices_mut().get_or_insert_with(Vec::new).push(rule);
    }
    if let Some(class) = &r.blockio_class {
        if class.value.is_empty() {
            res.set_block_io(None);
        } else {
            let resolve = opts.resolve_blockio_class.ok_or_else(|| {
                err(
                    "linux.resources.blockio_class",
                    "this runtime has no block I/O classes",
                )
            })?;
            let bio = resolve(&class.value).map_err(|e| err("linux.resources.blockio_class", e))?;
            res.set_block_io(Some(bio));
        }
    }
    if let Some(class) = &r.rdt_class {
        let rdt = if class.value.is_empty() {
            None
        } else {
            let mut rdt = LinuxIntelRdt::default();
            rdt.set_clos_id(Some(class.value.clone()));
            Some(rdt)
        };
        linux(spec).set_intel_rdt(rdt);
    }
    Ok(())
}

fn mount_parts(m: &OciMount) -> usize {
    let d = m.destination().to_string_lossy();
    let clean = d.trim_end_matches('/');
    clean.matches('/').count()
}

fn mounts(spec: &mut Spec, adj: &[Mount]) -> Result<(), ApplyError> {
    if adj.is_empty() {
        return Ok(());
    }
    let mut list = spec.mounts().clone().unwrap_or_default();
    let mut root_propagation: Option<&'static str> = None;
    for m in adj {
        let dest = crate::api::clear_removal_marker(&m.destination);
        list.retain(|x| x.destination().to_str() != Some(dest));
        if removal_target(&m.destination).is_some() {
            continue;
        }
        for o in &m.options {
            match o.as_str() {
                "rshared" => root_propagation = Some("rshared"),
                "rslave" if root_propagation != Some("rshared") => {
                    root_propagation = Some("rslave")
                }
                _ => {}
            }
        }
        list.push(from_json(
            "mounts",
            strip_nulls(json!({
                "destination": m.destination,
                "type": (!m.r#type.is_empty()).then_some(&m.r#type),
                "source": (!m.source.is_empty()).then_some(&m.source),
                "options": (!m.options.is_empty()).then_some(&m.options),
            })),
        )?);
    }
    // Parents before children (fewer path components first), then by path.
    list.sort_by(|a, b| {
        mount_parts(a)
            .cmp(&mount_parts(b))
            .then_with(|| a.destination().cmp(b.destination()))
    });
    spec.set_mounts(Some(list));
    if let Some(p) = root_propagation {
        let l = linux(spec);
        let current = l.rootfs_propagation().clone();
        let keep = p == "rslave" && matches!(current.as_deref(), Some("rshared") | Some("rslave"));
        if !keep {
            l.set_rootfs_propagation(Some(p.to_string()));
        }
    }
    Ok(())
}

fn rlimits(spec: &mut Spec, adj: &[crate::api::PosixRlimit]) -> Result<(), ApplyError> {
    if adj.is_empty() {
        return Ok(());
    }
    let p = process(spec);
    let mut list: Vec<PosixRlimit> = p.rlimits().clone().unwrap_or_default();
    for l in adj {
        let r: PosixRlimit = from_json(
            "rlimits",
            json!({"type": l.r#type, "hard": l.hard, "soft": l.soft}),
        )?;
        list.retain(|x| x.typ() != r.typ());
        list.push(r);
    }
    p.set_rlimits(Some(list));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{ApplyOptions, Spec, apply_adjustment, from_json, linux, process};
    use crate::api::*;
    use oci_spec::runtime::LinuxSchedulerFlag as OciFlag;
    use serde_json::json;

    fn bare() -> Spec {
        serde_json::from_value(json!({"ociVersion": "1.2.0"})).unwrap()
    }

    fn base_spec() -> Spec {
        let mut spec = bare();
        let p = process(&mut spec);
        p.set_env(Some(vec![
            "PATH=/bin".into(),
            "DROP=1".into(),
            "KEEP=1".into(),
        ]));
        p.set_args(Some(vec!["sleep".into(), "1".into()]));
        spec.set_mounts(Some(vec![
            from_json(
                "m",
                json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            )
            .unwrap(),
            from_json(
                "m",
                json!({"destination": "/old", "type": "bind", "source": "/x"}),
            )
            .unwrap(),
        ]));
        spec.set_annotations(Some([("gone".to_string(), "1".to_string())].into()));
        spec
    }

    #[test]
    fn applies_every_kind_of_adjustment() {
        let mut spec = base_spec();
        let adj = ContainerAdjustment {
            annotations: [
                ("new".to_string(), "v".to_string()),
                ("-gone".to_string(), String::new()),
            ]
            .into(),
            env: vec![
                KeyValue::new("KEEP", "2"),
                KeyValue::new("-DROP", ""),
                KeyValue::new("ADDED", "3"),
            ],
            mounts: vec![
                Mount {
                    destination: "-/old".into(),
                    ..Default::default()
                },
                Mount {
                    destination: "/data/sub".into(),
                    r#type: "bind".into(),
                    source: "/s".into(),
                    options: vec!["rbind".into(), "rslave".into()],
                },
                Mount {
                    destination: "/data".into(),
                    r#type: "bind".into(),
                    source: "/d".into(),
                    options: vec!["rbind".into()],
                },
            ],
            hooks: Some(Hooks {
                prestart: vec![Hook {
                    path: "/bin/hook".into(),
                    args: vec!["hook".into()],
                    ..Default::default()
                }],
                poststop: vec![Hook {
                    path: "/bin/after".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            rlimits: vec![PosixRlimit {
                r#type: "RLIMIT_NOFILE".into(),
                hard: 1024,
                soft: 512,
            }],
            args: vec!["true".into()],
            linux: Some(LinuxContainerAdjustment {
                devices: vec![LinuxDevice {
                    path: "/dev/fuse".into(),
                    r#type: "c".into(),
                    major: 10,
                    minor: 229,
                    file_mode: Some(OptionalFileMode { value: 0o666 }),
                    ..Default::default()
                }],
                resources: Some(LinuxResources {
                    memory: Some(LinuxMemory {
                        limit: Some(OptionalInt64 { value: 100 << 20 }),
                        reservation: Some(OptionalInt64 { value: 50 << 20 }),
                        ..Default::default()
                    }),
                    cpu: Some(LinuxCpu {
                        shares: Some(OptionalUInt64 { value: 256 }),
                        quota: Some(OptionalInt64 { value: 50000 }),
                        period: Some(OptionalUInt64 { value: 100000 }),
                        cpus: "0-1".into(),
                        mems: "0".into(),
                        ..Default::default()
                    }),
                    hugepage_limits: vec![HugepageLimit {
                        page_size: "2MB".into(),
                        limit: 4 << 20,
                    }],
                    unified: [("memory.high".to_string(), "max".to_string())].into(),
                    pids: Some(LinuxPids { limit: 100 }),
                    rdt_class: Some(OptionalString {
                        value: "gold".into(),
                    }),
                    ..Default::default()
                }),
                cgroups_path: "/nri/c1".into(),
                oom_score_adj: Some(OptionalInt { value: 500 }),
                io_priority: Some(LinuxIoPriority {
                    class: IoPrioClass::IoprioClassBe as i32,
                    priority: 4,
                }),
                seccomp_policy: Some(LinuxSeccomp {
                    default_action: "SCMP_ACT_ERRNO".into(),
                    architectures: vec!["SCMP_ARCH_X86_64".into()],
                    syscalls: vec![LinuxSyscall {
                        names: vec!["read".into()],
                        action: "SCMP_ACT_ALLOW".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                namespaces: vec![LinuxNamespace {
                    r#type: "network".into(),
                    path: "/var/run/netns/x".into(),
                }],
                sysctl: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
                scheduler: Some(LinuxScheduler {
                    policy: LinuxSchedulerPolicy::SchedBatch as i32,
                    nice: 5,
                    flags: vec![LinuxSchedulerFlag::SchedFlagResetOnFork as i32],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply_adjustment(&mut spec, &adj, ApplyOptions::default()).unwrap();

        let ann = spec.annotations().as_ref().unwrap();
        assert_eq!(ann.get("new").map(String::as_str), Some("v"));
        assert!(!ann.contains_key("gone"));
        let p = spec.process().as_ref().unwrap();
        assert_eq!(
            p.env().as_ref().unwrap(),
            &["PATH=/bin", "KEEP=2", "ADDED=3"]
        );
        assert_eq!(p.args().as_ref().unwrap(), &["true"]);
        assert_eq!(p.oom_score_adj(), Some(500));
        assert_eq!(p.rlimits().as_ref().unwrap()[0].hard(), 1024);
        assert!(p.io_priority().is_some());
        let sched = p.scheduler().as_ref().unwrap();
        assert_eq!(
            sched.flags().as_ref().unwrap(),
            &[OciFlag::SchedResetOnFork]
        );
        let dests: Vec<_> = spec
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.destination().to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            dests,
            ["/data", "/proc", "/data/sub"],
            "sorted by depth, /old removed"
        );
        let hooks = spec.hooks().as_ref().unwrap();
        #[allow(deprecated)]
        let pre = hooks.prestart().as_ref().unwrap();
        assert_eq!(pre[0].path().to_str(), Some("/bin/hook"));
        assert_eq!(hooks.poststop().as_ref().unwrap().len(), 1);
        let l = spec.linux().as_ref().unwrap();
        assert_eq!(l.rootfs_propagation().as_deref(), Some("rslave"));
        assert_eq!(l.cgroups_path().as_ref().unwrap().to_str(), Some("/nri/c1"));
        assert_eq!(
            l.devices().as_ref().unwrap()[0].path().to_str(),
            Some("/dev/fuse")
        );
        let r = l.resources().as_ref().unwrap();
        let rule = r.devices().as_ref().unwrap()[0].clone();
        assert_eq!(
            (
                rule.allow(),
                rule.major(),
                rule.minor(),
                rule.access().as_deref()
            ),
            (true, Some(10), Some(229), Some("rw"))
        );
        let m = r.memory().unwrap();
        assert_eq!(
            (m.limit(), m.swap(), m.reservation()),
            (Some(100 << 20), Some(100 << 20), Some(50 << 20))
        );
        let c = r.cpu().as_ref().unwrap();
        assert_eq!(
            (c.shares(), c.quota(), c.period()),
            (Some(256), Some(50000), Some(100000))
        );
        assert_eq!(
            (c.cpus().as_deref(), c.mems().as_deref()),
            (Some("0-1"), Some("0"))
        );
        assert_eq!(r.hugepage_limits().as_ref().unwrap()[0].limit(), 4 << 20);
        assert_eq!(r.unified().as_ref().unwrap()["memory.high"], "max");
        assert_eq!(r.pids().unwrap().limit(), 100);
        assert_eq!(
            l.intel_rdt().as_ref().unwrap().clos_id().as_deref(),
            Some("gold")
        );
        assert!(l.seccomp().is_some());
        assert_eq!(
            l.namespaces().as_ref().unwrap()[0]
                .path()
                .as_ref()
                .unwrap()
                .to_str(),
            Some("/var/run/netns/x")
        );
        assert_eq!(l.sysctl().as_ref().unwrap()["net.ipv4.ip_forward"], "1");
    }

    #[test]
    fn namespace_removal_and_replacement() {
        let mut spec = bare();
        let list = linux(&mut spec)
            .namespaces_mut()
            .get_or_insert_with(Vec::new);
        list.push(from_json("n", json!({"type": "network", "path": "/a"})).unwrap());
        list.push(from_json("n", json!({"type": "ipc"})).unwrap());
        let adj = ContainerAdjustment {
            linux: Some(LinuxContainerAdjustment {
                namespaces: vec![
                    LinuxNamespace {
                        r#type: "network".into(),
                        path: "/b".into(),
                    },
                    LinuxNamespace {
                        r#type: "-ipc".into(),
                        path: String::new(),
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        apply_adjustment(&mut spec, &adj, ApplyOptions::default()).unwrap();
        let ns = spec
            .linux()
            .as_ref()
            .unwrap()
            .namespaces()
            .as_ref()
            .unwrap();
        assert_eq!(ns.len(), 1);
        assert_eq!(ns[0].path().as_ref().unwrap().to_str(), Some("/b"));
    }

    #[test]
    fn what_needs_the_runtime_is_an_error_without_it_and_resolved_with_it() {
        let cdi = ContainerAdjustment {
            cdi_devices: vec![CdiDevice {
                name: "vendor.com/gpu=0".into(),
            }],
            ..Default::default()
        };
        let e = apply_adjustment(&mut bare(), &cdi, ApplyOptions::default()).unwrap_err();
        assert_eq!(e.field, "cdi_devices");
        let inject = |s: &mut Spec, names: &[String]| {
            s.set_annotations(Some([("cdi".to_string(), names.join(","))].into()));
            Ok(())
        };
        let mut spec = bare();
        apply_adjustment(
            &mut spec,
            &cdi,
            ApplyOptions {
                inject_cdi_devices: Some(&inject),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            spec.annotations().as_ref().unwrap()["cdi"],
            "vendor.com/gpu=0"
        );

        let bio = ContainerAdjustment {
            linux: Some(LinuxContainerAdjustment {
                resources: Some(LinuxResources {
                    blockio_class: Some(OptionalString {
                        value: "slow".into(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = apply_adjustment(&mut bare(), &bio, ApplyOptions::default()).unwrap_err();
        assert_eq!(e.field, "linux.resources.blockio_class");

        let bad = ContainerAdjustment {
            linux: Some(LinuxContainerAdjustment {
                seccomp_policy: Some(LinuxSeccomp {
                    default_action: "SCMP_ACT_BOGUS".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = apply_adjustment(&mut bare(), &bad, ApplyOptions::default()).unwrap_err();
        assert_eq!(e.field, "linux.seccomp_policy");
    }

    #[test]
    fn explicit_swap_is_kept_and_rlimits_replace() {
        let mut spec = bare();
        process(&mut spec).set_rlimits(Some(vec![
            from_json("r", json!({"type": "RLIMIT_NOFILE", "hard": 1, "soft": 1})).unwrap(),
        ]));
        let adj = ContainerAdjustment {
            rlimits: vec![PosixRlimit {
                r#type: "RLIMIT_NOFILE".into(),
                hard: 9,
                soft: 8,
            }],
            linux: Some(LinuxContainerAdjustment {
                resources: Some(LinuxResources {
                    memory: Some(LinuxMemory {
                        limit: Some(OptionalInt64 { value: 10 }),
                        swap: Some(OptionalInt64 { value: 20 }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply_adjustment(&mut spec, &adj, ApplyOptions::default()).unwrap();
        let m = spec
            .linux()
            .as_ref()
            .unwrap()
            .resources()
            .as_ref()
            .unwrap()
            .memory()
            .unwrap();
        assert_eq!((m.limit(), m.swap()), (Some(10), Some(20)));
        let rl = spec.process().as_ref().unwrap().rlimits().clone().unwrap();
        assert_eq!(rl.len(), 1);
        assert_eq!(rl[0].hard(), 9);
    }
}
