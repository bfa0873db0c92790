//! Merging the answers of several plugins into one result, with NRI's
//! ownership rules (src/owners.rs) deciding conflicts.
//!
//! Port of containerd/nri v0.12.1 pkg/adaptation/result.go. As there, each
//! plugin's adjustment is also applied to the container of the request, so
//! the next plugin (in index order) sees the container as adjusted so far.
//! Two deliberate differences: removal markers for environment variables and
//! devices reach the merged adjustment (NRI 0.12.1 drops them there, so the
//! removal never reaches the OCI spec, unlike for mounts and annotations),
//! and a removed sysctl is marked in `sysctl` (0.12.1 marks it in
//! `annotations` by mistake).

use std::collections::{HashMap, HashSet};

use crate::api::*;
use crate::owners::{Conflict, Owners};

/// Why a set of plugin answers cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Conflict(#[from] Conflict),
    #[error("plugin {plugin:?} asked update of {id:?} during creation")]
    UpdateOfCreated { plugin: String, id: String },
}

/// Updates to containers other than the one being created (or, for
/// UpdateContainer, other than the one being updated), merged per container.
#[derive(Default, Debug)]
pub(crate) struct Updates {
    order: Vec<String>,
    by_id: HashMap<String, ContainerUpdate>,
}

impl Updates {
    pub fn into_vec(mut self) -> Vec<ContainerUpdate> {
        self.order
            .iter()
            .filter_map(|id| self.by_id.remove(id))
            .collect()
    }
}

fn empty_resources() -> LinuxResources {
    LinuxResources {
        memory: Some(LinuxMemory::default()),
        cpu: Some(LinuxCpu::default()),
        ..Default::default()
    }
}

/// Applies one plugin's memory settings, claiming each field it sets.
fn merge_memory(
    owners: &mut Owners,
    id: &str,
    plugin: &str,
    from: &LinuxMemory,
    into: &mut LinuxMemory,
    mut reply: Option<&mut LinuxMemory>,
) -> Result<(), Conflict> {
    macro_rules! field {
        ($f:ident, $field:expr) => {
            if let Some(v) = &from.$f {
                owners.claim(id, $field, plugin)?;
                into.$f = Some(v.clone());
                if let Some(r) = reply.as_mut() {
                    r.$f = Some(v.clone());
                }
            }
        };
    }
    field!(limit, Field::MemLimit);
    field!(reservation, Field::MemReservation);
    field!(swap, Field::MemSwapLimit);
    field!(kernel, Field::MemKernelLimit);
    field!(kernel_tcp, Field::MemTcpLimit);
    field!(swappiness, Field::MemSwappiness);
    field!(disable_oom_killer, Field::MemDisableOomKiller);
    field!(use_hierarchy, Field::MemUseHierarchy);
    Ok(())
}

/// Applies one plugin's CPU settings, claiming each field it sets.
fn merge_cpu(
    owners: &mut Owners,
    id: &str,
    plugin: &str,
    from: &LinuxCpu,
    into: &mut LinuxCpu,
    mut reply: Option<&mut LinuxCpu>,
) -> Result<(), Conflict> {
    macro_rules! field {
        ($f:ident, $field:expr) => {
            if let Some(v) = &from.$f {
                owners.claim(id, $field, plugin)?;
                into.$f = Some(v.clone());
                if let Some(r) = reply.as_mut() {
                    r.$f = Some(v.clone());
                }
            }
        };
    }
    field!(shares, Field::CpuShares);
    field!(quota, Field::CpuQuota);
    field!(period, Field::CpuPeriod);
    field!(realtime_runtime, Field::CpuRealtimeRuntime);
    field!(realtime_period, Field::CpuRealtimePeriod);
    if !from.cpus.is_empty() {
        owners.claim(id, Field::CpuSetCpUs, plugin)?;
        into.cpus = from.cpus.clone();
        if let Some(r) = reply.as_mut() {
            r.cpus = from.cpus.clone();
        }
    }
    if !from.mems.is_empty() {
        owners.claim(id, Field::CpuSetMems, plugin)?;
        into.mems = from.mems.clone();
        if let Some(r) = reply.as_mut() {
            r.mems = from.mems.clone();
        }
    }
    Ok(())
}

/// Merges one plugin's update of container `u.container_id` into `updates`.
/// `requested` is the UpdateContainer request's (id, resources), if any.
fn merge_update(
    owners: &mut Owners,
    updates: &mut Updates,
    creating: Option<&str>,
    requested: &mut Option<(String, LinuxResources)>,
    u: &ContainerUpdate,
    plugin: &str,
) -> Result<(), MergeError> {
    let id = u.container_id.as_str();
    if creating == Some(id) {
        return Err(MergeError::UpdateOfCreated {
            plugin: plugin.into(),
            id: id.into(),
        });
    }
    let is_requested = requested.as_ref().is_some_and(|(rid, _)| rid == id);
    if let Some(e) = updates.by_id.get_mut(id) {
        e.ignore_failure = e.ignore_failure && u.ignore_failure;
    } else {
        if !is_requested {
            updates.order.push(id.to_string());
        }
        updates.by_id.insert(
            id.to_string(),
            ContainerUpdate {
                container_id: id.to_string(),
                linux: Some(LinuxContainerUpdate {
                    resources: Some(empty_resources()),
                }),
                ignore_failure: u.ignore_failure,
            },
        );
    }
    let entry = updates.by_id.get_mut(id).expect("inserted above");
    let Some(from) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
        return Ok(());
    };
    // Work on a copy: an ignored failure leaves the collected update as it was.
    let mut res = if is_requested {
        requested.as_ref().unwrap().1.clone()
    } else {
        entry
            .linux
            .as_ref()
            .and_then(|l| l.resources.clone())
            .unwrap_or_else(empty_resources)
    };
    let result: Result<(), Conflict> = (|| {
        if let Some(m) = &from.memory {
            merge_memory(
                owners,
                id,
                plugin,
                m,
                res.memory.get_or_insert_with(Default::default),
                None,
            )?;
        }
        if let Some(c) = &from.cpu {
            merge_cpu(
                owners,
                id,
                plugin,
                c,
                res.cpu.get_or_insert_with(Default::default),
                None,
            )?;
        }
        for l in &from.hugepage_limits {
            owners.claim_entry(id, Field::HugepageLimits, &l.page_size, plugin)?;
            res.hugepage_limits.push(l.clone());
        }
        for (k, v) in &from.unified {
            owners.claim_entry(id, Field::CgroupsUnified, k, plugin)?;
            res.unified.insert(k.clone(), v.clone());
        }
        if let Some(v) = &from.blockio_class {
            owners.claim(id, Field::BlockioClass, plugin)?;
            res.blockio_class = Some(v.clone());
        }
        if let Some(v) = &from.rdt_class {
            owners.claim(id, Field::RdtClass, plugin)?;
            res.rdt_class = Some(v.clone());
        }
        if let Some(v) = &from.pids {
            owners.claim(id, Field::PidsLimit, plugin)?;
            res.pids = Some(*v);
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            entry.linux = Some(LinuxContainerUpdate {
                resources: Some(res.clone()),
            });
            if is_requested {
                requested.as_mut().unwrap().1 = res;
            }
            Ok(())
        }
        Err(_) if u.ignore_failure => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The merged answer to CreateContainer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateResult {
    /// What to change in the container being created (apply with
    /// [`crate::spec::apply_adjustment`]); `None` when no plugin adjusted it.
    pub adjust: Option<ContainerAdjustment>,
    /// Resource updates plugins asked for other containers.
    pub updates: Vec<ContainerUpdate>,
    /// Containers plugins asked to have stopped.
    pub evictions: Vec<ContainerEviction>,
}

/// Collects CreateContainer answers plugin by plugin.
pub(crate) struct CreateMerge {
    /// The container of the request, adjusted so far.
    pub container: Container,
    adjust: ContainerAdjustment,
    adjusted: bool,
    updates: Updates,
    evictions: Vec<ContainerEviction>,
    pub owners: Owners,
}

impl CreateMerge {
    pub fn new(container: Container) -> CreateMerge {
        CreateMerge {
            container,
            adjust: ContainerAdjustment::default(),
            adjusted: false,
            updates: Updates::default(),
            evictions: Vec::new(),
            owners: Owners::default(),
        }
    }

    /// Merges one plugin's answer.
    pub fn apply(&mut self, rsp: CreateContainerResponse, plugin: &str) -> Result<(), MergeError> {
        if let Some(a) = rsp.adjust {
            self.adjusted = true;
            self.adjust(a, plugin)?;
        }
        let id = self.container.id.clone();
        let mut none = None;
        for u in &rsp.update {
            merge_update(
                &mut self.owners,
                &mut self.updates,
                Some(&id),
                &mut none,
                u,
                plugin,
            )?;
        }
        self.evictions.extend(rsp.evict);
        Ok(())
    }

    /// The merged adjustment so far (for validators).
    pub fn adjustment(&self) -> Option<&ContainerAdjustment> {
        self.adjusted.then_some(&self.adjust)
    }

    pub fn updates_snapshot(&self) -> Vec<ContainerUpdate> {
        self.updates
            .order
            .iter()
            .filter_map(|id| self.updates.by_id.get(id).cloned())
            .collect()
    }

    pub fn finish(self) -> CreateResult {
        CreateResult {
            adjust: self.adjusted.then_some(self.adjust),
            updates: self.updates.into_vec(),
            evictions: self.evictions,
        }
    }

    fn adjust(&mut self, a: ContainerAdjustment, plugin: &str) -> Result<(), MergeError> {
        self.annotations(a.annotations, plugin)?;
        self.mounts(a.mounts, plugin)?;
        self.env(a.env, plugin)?;
        self.args(a.args, plugin)?;
        if let Some(h) = a.hooks {
            self.hooks(h, plugin);
        }
        if let Some(l) = a.linux {
            self.devices(l.devices, plugin)?;
            if let Some(r) = l.resources {
                self.resources(r, plugin)?;
            }
            self.simple_linux(
                l.cgroups_path,
                l.oom_score_adj,
                l.io_priority,
                l.seccomp_policy,
                l.scheduler,
                l.memory_policy,
                plugin,
            )?;
            self.namespaces(l.namespaces, plugin)?;
            self.sysctl(l.sysctl, plugin)?;
            self.net_devices(l.net_devices, plugin)?;
            if let Some(rdt) = l.rdt {
                self.rdt(rdt, plugin)?;
            }
        }
        self.rlimits(a.rlimits, plugin)?;
        self.cdi_devices(a.cdi_devices, plugin)?;
        Ok(())
    }

    fn id(&self) -> String {
        self.container.id.clone()
    }

    fn annotations(
        &mut self,
        mut annotations: HashMap<String, String>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        if annotations.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let mut del: HashSet<String> = HashSet::new();
        annotations.retain(|k, _| match removal_target(k) {
            Some(key) => {
                del.insert(key.to_string());
                false
            }
            None => true,
        });
        let mut keys: Vec<_> = annotations.into_iter().collect();
        keys.sort();
        for (k, v) in keys {
            if del.remove(&k) {
                self.owners.clear_entry(&id, Field::Annotations, &k, plugin);
                self.container.annotations.remove(&k);
                self.adjust
                    .annotations
                    .insert(mark_for_removal(&k), String::new());
            }
            self.owners
                .claim_entry(&id, Field::Annotations, &k, plugin)?;
            self.container.annotations.insert(k.clone(), v.clone());
            self.adjust.annotations.insert(k, v);
        }
        for k in del {
            self.adjust
                .annotations
                .insert(mark_for_removal(&k), String::new());
        }
        Ok(())
    }

    fn mounts(&mut self, mounts: Vec<Mount>, plugin: &str) -> Result<(), MergeError> {
        if mounts.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let mut add = Vec::new();
        let mut del: Vec<Mount> = Vec::new();
        let mut modified = HashSet::new();
        for m in mounts {
            match removal_target(&m.destination) {
                Some(_) => del.push(m),
                None => {
                    modified.insert(m.destination.clone());
                    add.push(m);
                }
            }
        }
        let removed: HashSet<String> = del
            .iter()
            .map(|m| clear_removal_marker(&m.destination).to_string())
            .collect();
        // drop removed mounts from what earlier plugins added
        let owners = &mut self.owners;
        self.adjust.mounts.retain(|m| {
            if removed.contains(&m.destination) {
                owners.clear_entry(&id, Field::Mounts, &m.destination, plugin);
                false
            } else {
                true
            }
        });
        // and from the container as the next plugin sees it
        self.container
            .mounts
            .retain(|m| !removed.contains(&m.destination) && !modified.contains(&m.destination));
        for m in &add {
            self.owners
                .claim_entry(&id, Field::Mounts, &m.destination, plugin)?;
            self.adjust.mounts.push(m.clone());
        }
        for m in del {
            if !modified.contains(clear_removal_marker(&m.destination)) {
                self.adjust.mounts.push(m);
            }
        }
        self.container.mounts.extend(add);
        Ok(())
    }

    fn devices(&mut self, devices: Vec<LinuxDevice>, plugin: &str) -> Result<(), MergeError> {
        if devices.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let mut add = Vec::new();
        let mut del: Vec<LinuxDevice> = Vec::new();
        let mut modified = HashSet::new();
        for d in devices {
            match removal_target(&d.path) {
                Some(_) => del.push(d),
                None => {
                    modified.insert(d.path.clone());
                    add.push(d);
                }
            }
        }
        let removed: HashSet<String> = del
            .iter()
            .map(|d| clear_removal_marker(&d.path).to_string())
            .collect();
        let owners = &mut self.owners;
        let (container, adjust) = (
            self.container.linux.get_or_insert_with(Default::default),
            self.adjust.linux.get_or_insert_with(Default::default),
        );
        adjust.devices.retain(|d| {
            if removed.contains(&d.path) {
                owners.clear_entry(&id, Field::Devices, &d.path, plugin);
                false
            } else {
                true
            }
        });
        container
            .devices
            .retain(|d| !removed.contains(&d.path) && !modified.contains(&d.path));
        adjust
            .devices
            .retain(|d| removal_target(&d.path).is_none_or(|k| !modified.contains(k)));
        for d in &add {
            owners.claim_entry(&id, Field::Devices, &d.path, plugin)?;
            adjust.devices.push(d.clone());
        }
        for d in del {
            if !modified.contains(clear_removal_marker(&d.path)) {
                adjust.devices.push(d);
            }
        }
        container.devices.extend(add);
        Ok(())
    }

    fn env(&mut self, env: Vec<KeyValue>, plugin: &str) -> Result<(), MergeError> {
        if env.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let mut add = Vec::new();
        let mut del: Vec<KeyValue> = Vec::new();
        let mut modified = HashSet::new();
        for e in env {
            match removal_target(&e.key) {
                Some(_) => del.push(e),
                None => {
                    modified.insert(e.key.clone());
                    add.push(e);
                }
            }
        }
        let removed: HashSet<String> = del
            .iter()
            .map(|e| clear_removal_marker(&e.key).to_string())
            .collect();
        let owners = &mut self.owners;
        self.adjust.env.retain(|e| {
            if removed.contains(&e.key) {
                owners.clear_entry(&id, Field::Env, &e.key, plugin);
                false
            } else {
                true
            }
        });
        self.container.env.retain(|e| {
            let key = e.split_once('=').map_or(e.as_str(), |(k, _)| k);
            !removed.contains(key) && !modified.contains(key)
        });
        // a set entry supersedes an earlier removal marker for it
        self.adjust
            .env
            .retain(|e| removal_target(&e.key).is_none_or(|k| !modified.contains(k)));
        for e in &add {
            self.owners.claim_entry(&id, Field::Env, &e.key, plugin)?;
            self.adjust.env.push(e.clone());
        }
        for e in del {
            if !modified.contains(clear_removal_marker(&e.key)) {
                self.adjust.env.push(e);
            }
        }
        self.container
            .env
            .extend(add.iter().map(|e| format!("{}={}", e.key, e.value)));
        Ok(())
    }

    fn args(&mut self, mut args: Vec<String>, plugin: &str) -> Result<(), MergeError> {
        if args.is_empty() {
            return Ok(());
        }
        let id = self.id();
        if args[0].is_empty() {
            self.owners.clear(&id, Field::Args, plugin);
            args.remove(0);
        }
        self.owners.claim(&id, Field::Args, plugin)?;
        self.adjust.args = args.clone();
        self.container.args = args;
        Ok(())
    }

    fn hooks(&mut self, h: Hooks, plugin: &str) {
        let reply = self.adjust.hooks.get_or_insert_with(Default::default);
        let container = self.container.hooks.get_or_insert_with(Default::default);
        let mut claim = false;
        for (from, r, c) in [
            (h.prestart, &mut reply.prestart, &mut container.prestart),
            (
                h.create_runtime,
                &mut reply.create_runtime,
                &mut container.create_runtime,
            ),
            (
                h.create_container,
                &mut reply.create_container,
                &mut container.create_container,
            ),
            (
                h.start_container,
                &mut reply.start_container,
                &mut container.start_container,
            ),
            (h.poststart, &mut reply.poststart, &mut container.poststart),
            (h.poststop, &mut reply.poststop, &mut container.poststop),
        ] {
            if !from.is_empty() {
                claim = true;
                r.extend(from.iter().cloned());
                c.extend(from);
            }
        }
        if claim {
            let id = self.id();
            self.owners.accumulate(&id, Field::OciHooks, plugin);
        }
    }

    fn resources(&mut self, r: LinuxResources, plugin: &str) -> Result<(), MergeError> {
        let id = self.id();
        let owners = &mut self.owners;
        let container = self
            .container
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(empty_resources);
        let reply = self
            .adjust
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(empty_resources);
        if let Some(m) = &r.memory {
            merge_memory(
                owners,
                &id,
                plugin,
                m,
                container.memory.get_or_insert_with(Default::default),
                Some(reply.memory.get_or_insert_with(Default::default)),
            )?;
        }
        if let Some(c) = &r.cpu {
            merge_cpu(
                owners,
                &id,
                plugin,
                c,
                container.cpu.get_or_insert_with(Default::default),
                Some(reply.cpu.get_or_insert_with(Default::default)),
            )?;
        }
        for l in r.hugepage_limits {
            owners.claim_entry(&id, Field::HugepageLimits, &l.page_size, plugin)?;
            container.hugepage_limits.push(l.clone());
            reply.hugepage_limits.push(l);
        }
        for d in r.devices {
            container.devices.push(d.clone());
            reply.devices.push(d);
        }
        let mut unified: Vec<_> = r.unified.into_iter().collect();
        unified.sort();
        for (k, v) in unified {
            owners.claim_entry(&id, Field::CgroupsUnified, &k, plugin)?;
            container.unified.insert(k.clone(), v.clone());
            reply.unified.insert(k, v);
        }
        if let Some(v) = r.blockio_class {
            owners.claim(&id, Field::BlockioClass, plugin)?;
            container.blockio_class = Some(v.clone());
            reply.blockio_class = Some(v);
        }
        if let Some(v) = r.rdt_class {
            owners.claim(&id, Field::RdtClass, plugin)?;
            container.rdt_class = Some(v.clone());
            reply.rdt_class = Some(v);
        }
        if let Some(v) = r.pids {
            owners.claim(&id, Field::PidsLimit, plugin)?;
            container.pids = Some(v);
            reply.pids = Some(v);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn simple_linux(
        &mut self,
        cgroups_path: String,
        oom_score_adj: Option<OptionalInt>,
        io_priority: Option<LinuxIoPriority>,
        seccomp: Option<LinuxSeccomp>,
        scheduler: Option<LinuxScheduler>,
        memory_policy: Option<LinuxMemoryPolicy>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        let id = self.id();
        let owners = &mut self.owners;
        let (container, reply) = (
            self.container.linux.get_or_insert_with(Default::default),
            self.adjust.linux.get_or_insert_with(Default::default),
        );
        if !cgroups_path.is_empty() {
            owners.claim(&id, Field::CgroupsPath, plugin)?;
            container.cgroups_path = cgroups_path.clone();
            reply.cgroups_path = cgroups_path;
        }
        if let Some(v) = oom_score_adj {
            owners.claim(&id, Field::OomScoreAdj, plugin)?;
            container.oom_score_adj = Some(v);
            reply.oom_score_adj = Some(v);
        }
        if let Some(v) = io_priority {
            owners.claim(&id, Field::IoPriority, plugin)?;
            container.io_priority = Some(v);
            reply.io_priority = Some(v);
        }
        if let Some(v) = seccomp {
            owners.claim(&id, Field::SeccompPolicy, plugin)?;
            container.seccomp_policy = Some(v.clone());
            reply.seccomp_policy = Some(v);
        }
        if let Some(v) = scheduler {
            owners.claim(&id, Field::LinuxSched, plugin)?;
            container.scheduler = Some(v.clone());
            reply.scheduler = Some(v);
        }
        if let Some(v) = memory_policy {
            owners.claim(&id, Field::MemoryPolicy, plugin)?;
            reply.memory_policy = Some(v);
        }
        Ok(())
    }

    fn namespaces(
        &mut self,
        namespaces: Vec<LinuxNamespace>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        if namespaces.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let owners = &mut self.owners;
        let (container, reply) = (
            self.container.linux.get_or_insert_with(Default::default),
            self.adjust.linux.get_or_insert_with(Default::default),
        );
        for n in namespaces {
            let key = clear_removal_marker(&n.r#type).to_string();
            owners.claim_entry(&id, Field::Namespace, &key, plugin)?;
            container.namespaces.retain(|c| c.r#type != key);
            if removal_target(&n.r#type).is_none() {
                container.namespaces.push(n.clone());
            }
            reply.namespaces.push(n);
        }
        Ok(())
    }

    fn sysctl(
        &mut self,
        mut sysctl: HashMap<String, String>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        if sysctl.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let mut del = HashSet::new();
        sysctl.retain(|k, _| match removal_target(k) {
            Some(key) => {
                del.insert(key.to_string());
                false
            }
            None => true,
        });
        let owners = &mut self.owners;
        let (container, reply) = (
            self.container.linux.get_or_insert_with(Default::default),
            self.adjust.linux.get_or_insert_with(Default::default),
        );
        let mut entries: Vec<_> = sysctl.into_iter().collect();
        entries.sort();
        for (k, v) in entries {
            if del.remove(&k) {
                owners.clear_entry(&id, Field::Sysctl, &k, plugin);
                container.sysctl.remove(&k);
                reply.sysctl.insert(mark_for_removal(&k), String::new());
            }
            owners.claim_entry(&id, Field::Sysctl, &k, plugin)?;
            container.sysctl.insert(k.clone(), v.clone());
            reply.sysctl.insert(k, v);
        }
        for k in del {
            reply.sysctl.insert(mark_for_removal(&k), String::new());
        }
        Ok(())
    }

    fn net_devices(
        &mut self,
        mut devices: HashMap<String, LinuxNetDevice>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        if devices.is_empty() {
            return Ok(());
        }
        let id = self.id();
        let mut del = HashSet::new();
        devices.retain(|k, _| match removal_target(k) {
            Some(key) => {
                del.insert(key.to_string());
                false
            }
            None => true,
        });
        let owners = &mut self.owners;
        let (container, reply) = (
            self.container.linux.get_or_insert_with(Default::default),
            self.adjust.linux.get_or_insert_with(Default::default),
        );
        let mut entries: Vec<_> = devices.into_iter().collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (k, v) in entries {
            if del.remove(&k) {
                owners.clear_entry(&id, Field::LinuxNetDevices, &k, plugin);
                container.net_devices.remove(&k);
                reply
                    .net_devices
                    .insert(mark_for_removal(&k), LinuxNetDevice::default());
            }
            owners.claim_entry(&id, Field::LinuxNetDevices, &k, plugin)?;
            container.net_devices.insert(k.clone(), v.clone());
            reply.net_devices.insert(k, v);
        }
        for k in del {
            reply
                .net_devices
                .insert(mark_for_removal(&k), LinuxNetDevice::default());
        }
        Ok(())
    }

    fn rdt(&mut self, rdt: LinuxRdt, plugin: &str) -> Result<(), MergeError> {
        let id = self.id();
        let owners = &mut self.owners;
        let reply = self.adjust.linux.get_or_insert_with(Default::default);
        let out = reply.rdt.get_or_insert_with(Default::default);
        if rdt.remove {
            owners.clear(&id, Field::RdtClosId, plugin);
            owners.clear(&id, Field::RdtSchemata, plugin);
            owners.clear(&id, Field::RdtEnableMonitoring, plugin);
            *out = LinuxRdt {
                remove: true,
                ..Default::default()
            };
        }
        if let Some(v) = rdt.clos_id {
            owners.claim(&id, Field::RdtClosId, plugin)?;
            out.clos_id = Some(v);
            out.remove = false;
        }
        if let Some(v) = rdt.schemata {
            owners.claim(&id, Field::RdtSchemata, plugin)?;
            out.schemata = Some(v);
            out.remove = false;
        }
        if let Some(v) = rdt.enable_monitoring {
            owners.claim(&id, Field::RdtEnableMonitoring, plugin)?;
            out.enable_monitoring = Some(v);
            out.remove = false;
        }
        Ok(())
    }

    fn rlimits(&mut self, rlimits: Vec<PosixRlimit>, plugin: &str) -> Result<(), MergeError> {
        let id = self.id();
        for l in rlimits {
            self.owners
                .claim_entry(&id, Field::Rlimits, &l.r#type, plugin)?;
            self.container.rlimits.push(l.clone());
            self.adjust.rlimits.push(l);
        }
        Ok(())
    }

    fn cdi_devices(&mut self, devices: Vec<CdiDevice>, plugin: &str) -> Result<(), MergeError> {
        // CDI references are only added (never removed) and not shown to later
        // plugins: the runtime resolves them.
        let id = self.id();
        for d in devices {
            self.owners
                .claim_entry(&id, Field::CdiDevices, &d.name, plugin)?;
            self.adjust.cdi_devices.push(d);
        }
        Ok(())
    }
}

/// The merged answer to UpdateContainer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateResult {
    /// The resources to give the container being updated: the request's,
    /// as plugins changed them.
    pub resources: LinuxResources,
    /// Resource updates plugins asked for other containers.
    pub updates: Vec<ContainerUpdate>,
    pub evictions: Vec<ContainerEviction>,
}

/// Collects UpdateContainer (or StopContainer) answers.
pub(crate) struct UpdateMerge {
    requested: Option<(String, LinuxResources)>,
    updates: Updates,
    evictions: Vec<ContainerEviction>,
    owners: Owners,
}

impl UpdateMerge {
    /// For UpdateContainer of `id` to `resources`.
    pub fn for_update(id: String, resources: LinuxResources) -> UpdateMerge {
        let mut resources = resources;
        resources.memory.get_or_insert_with(Default::default);
        resources.cpu.get_or_insert_with(Default::default);
        UpdateMerge {
            requested: Some((id, resources)),
            ..UpdateMerge::for_stop()
        }
    }

    /// For StopContainer (updates of the remaining containers only).
    pub fn for_stop() -> UpdateMerge {
        UpdateMerge {
            requested: None,
            updates: Updates::default(),
            evictions: Vec::new(),
            owners: Owners::default(),
        }
    }

    /// The resources the update request asks for now.
    pub fn requested_resources(&self) -> Option<&LinuxResources> {
        self.requested.as_ref().map(|(_, r)| r)
    }

    pub fn apply(
        &mut self,
        updates: &[ContainerUpdate],
        evict: Vec<ContainerEviction>,
        plugin: &str,
    ) -> Result<(), MergeError> {
        for u in updates {
            merge_update(
                &mut self.owners,
                &mut self.updates,
                None,
                &mut self.requested,
                u,
                plugin,
            )?;
        }
        self.evictions.extend(evict);
        Ok(())
    }

    pub fn finish(self) -> UpdateResult {
        UpdateResult {
            resources: self.requested.map(|(_, r)| r).unwrap_or_default(),
            updates: self.updates.into_vec(),
            evictions: self.evictions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container() -> Container {
        Container {
            id: "c1".into(),
            env: vec!["PATH=/bin".into(), "OLD=1".into()],
            mounts: vec![Mount {
                destination: "/data".into(),
                source: "/host".into(),
                ..Default::default()
            }],
            annotations: [("keep".to_string(), "1".to_string())].into(),
            ..Default::default()
        }
    }

    fn create(adj: ContainerAdjustment) -> CreateContainerResponse {
        CreateContainerResponse {
            adjust: Some(adj),
            ..Default::default()
        }
    }

    fn mem(limit: i64) -> LinuxContainerAdjustment {
        LinuxContainerAdjustment {
            resources: Some(LinuxResources {
                memory: Some(LinuxMemory {
                    limit: Some(OptionalInt64 { value: limit }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn independent_fields_merge_and_later_plugins_see_earlier_changes() {
        let mut m = CreateMerge::new(container());
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("A", "1"), KeyValue::new("OLD", "2")],
                annotations: [("a".to_string(), "x".to_string())].into(),
                ..Default::default()
            }),
            "00-a",
        )
        .unwrap();
        assert!(m.container.env.contains(&"A=1".to_string()));
        assert!(m.container.env.contains(&"OLD=2".to_string()));
        assert!(!m.container.env.contains(&"OLD=1".to_string()));
        m.apply(
            create(ContainerAdjustment {
                linux: Some(mem(1 << 20)),
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        let r = m.finish();
        let a = r.adjust.unwrap();
        assert_eq!(
            a.env,
            vec![KeyValue::new("A", "1"), KeyValue::new("OLD", "2")]
        );
        assert_eq!(a.annotations["a"], "x");
        assert_eq!(
            a.linux
                .unwrap()
                .resources
                .unwrap()
                .memory
                .unwrap()
                .limit
                .unwrap()
                .value,
            1 << 20
        );
    }

    #[test]
    fn same_field_from_two_plugins_is_a_conflict_naming_both() {
        for (first, second, what) in [
            (
                ContainerAdjustment {
                    linux: Some(mem(1)),
                    ..Default::default()
                },
                ContainerAdjustment {
                    linux: Some(mem(2)),
                    ..Default::default()
                },
                "MemLimit",
            ),
            (
                ContainerAdjustment {
                    env: vec![KeyValue::new("X", "1")],
                    ..Default::default()
                },
                ContainerAdjustment {
                    env: vec![KeyValue::new("X", "2")],
                    ..Default::default()
                },
                "Env X",
            ),
            (
                ContainerAdjustment {
                    mounts: vec![Mount {
                        destination: "/m".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ContainerAdjustment {
                    mounts: vec![Mount {
                        destination: "/m".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                "Mounts /m",
            ),
            (
                ContainerAdjustment {
                    annotations: [("k".to_string(), "1".to_string())].into(),
                    ..Default::default()
                },
                ContainerAdjustment {
                    annotations: [("k".to_string(), "2".to_string())].into(),
                    ..Default::default()
                },
                "Annotations k",
            ),
            (
                ContainerAdjustment {
                    args: vec!["a".into()],
                    ..Default::default()
                },
                ContainerAdjustment {
                    args: vec!["b".into()],
                    ..Default::default()
                },
                "Args",
            ),
            (
                ContainerAdjustment {
                    rlimits: vec![PosixRlimit {
                        r#type: "RLIMIT_NOFILE".into(),
                        hard: 1,
                        soft: 1,
                    }],
                    ..Default::default()
                },
                ContainerAdjustment {
                    rlimits: vec![PosixRlimit {
                        r#type: "RLIMIT_NOFILE".into(),
                        hard: 2,
                        soft: 2,
                    }],
                    ..Default::default()
                },
                "Rlimits RLIMIT_NOFILE",
            ),
            (
                ContainerAdjustment {
                    linux: Some(LinuxContainerAdjustment {
                        cgroups_path: "/a".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ContainerAdjustment {
                    linux: Some(LinuxContainerAdjustment {
                        cgroups_path: "/b".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "CgroupsPath",
            ),
            (
                ContainerAdjustment {
                    linux: Some(LinuxContainerAdjustment {
                        devices: vec![LinuxDevice {
                            path: "/dev/x".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ContainerAdjustment {
                    linux: Some(LinuxContainerAdjustment {
                        devices: vec![LinuxDevice {
                            path: "/dev/x".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "Devices /dev/x",
            ),
        ] {
            let mut m = CreateMerge::new(container());
            m.apply(create(first), "00-a").unwrap();
            let e = m.apply(create(second), "10-b").unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(r#"plugins "10-b" and "00-a" both tried to set {what}"#)
            );
        }
    }

    #[test]
    fn removal_markers_remove_and_reach_the_adjustment() {
        let mut m = CreateMerge::new(container());
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("-OLD", "")],
                mounts: vec![Mount {
                    destination: "-/data".into(),
                    ..Default::default()
                }],
                annotations: [("-keep".to_string(), String::new())].into(),
                linux: Some(LinuxContainerAdjustment {
                    devices: vec![LinuxDevice {
                        path: "-/dev/null".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "00-a",
        )
        .unwrap();
        assert_eq!(m.container.env, vec!["PATH=/bin".to_string()]);
        assert!(m.container.mounts.is_empty());
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("NEW", "1")],
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        let a = m.finish().adjust.unwrap();
        assert!(a.env.contains(&KeyValue::new("-OLD", "")));
        assert!(a.mounts.iter().any(|x| x.destination == "-/data"));
        assert_eq!(a.annotations.get("-keep").map(String::as_str), Some(""));
        assert_eq!(a.linux.unwrap().devices[0].path, "-/dev/null");
    }

    #[test]
    fn a_removal_owns_the_entry_against_later_plugins() {
        let mut m = CreateMerge::new(container());
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("FOO", "1")],
                ..Default::default()
            }),
            "00-a",
        )
        .unwrap();
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("-FOO", "")],
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        let e = m
            .apply(
                create(ContainerAdjustment {
                    env: vec![KeyValue::new("FOO", "3")],
                    ..Default::default()
                }),
                "20-c",
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"plugins "20-c" and "10-b" both tried to set Env FOO"#
        );
        let mut m = CreateMerge::new(container());
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("FOO", "1")],
                ..Default::default()
            }),
            "00-a",
        )
        .unwrap();
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("-FOO", "")],
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("FOO", "4")],
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        let a = m.finish().adjust.unwrap();
        assert_eq!(a.env, vec![KeyValue::new("FOO", "4")]);
    }

    #[test]
    fn a_later_plugin_may_override_a_removal_of_its_own_and_replace_earlier_adds() {
        let mut m = CreateMerge::new(container());
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("A", "1")],
                ..Default::default()
            }),
            "00-a",
        )
        .unwrap();
        // the same plugin removes and sets in one answer: a replacement
        m.apply(
            create(ContainerAdjustment {
                env: vec![KeyValue::new("-B", ""), KeyValue::new("B", "2")],
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        let a = m.finish().adjust.unwrap();
        assert_eq!(
            a.env,
            vec![KeyValue::new("A", "1"), KeyValue::new("B", "2")]
        );
    }

    #[test]
    fn hooks_accumulate_and_args_can_be_reset() {
        let hook = |p: &str| Hook {
            path: p.into(),
            ..Default::default()
        };
        let mut m = CreateMerge::new(container());
        m.apply(
            create(ContainerAdjustment {
                hooks: Some(Hooks {
                    prestart: vec![hook("/a")],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "00-a",
        )
        .unwrap();
        m.apply(
            create(ContainerAdjustment {
                hooks: Some(Hooks {
                    prestart: vec![hook("/b")],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "10-b",
        )
        .unwrap();
        m.apply(
            create(ContainerAdjustment {
                args: vec!["x".into()],
                ..Default::default()
            }),
            "20-c",
        )
        .unwrap();
        let a = m.finish().adjust.unwrap();
        assert_eq!(
            a.hooks
                .unwrap()
                .prestart
                .iter()
                .map(|h| h.path.as_str())
                .collect::<Vec<_>>(),
            ["/a", "/b"]
        );
        assert_eq!(a.args, ["x"]);
    }

    #[test]
    fn updates_merge_per_container_and_conflict_per_field() {
        let upd = |id: &str, cpus: &str, ignore: bool| ContainerUpdate {
            container_id: id.into(),
            linux: Some(LinuxContainerUpdate {
                resources: Some(LinuxResources {
                    cpu: Some(LinuxCpu {
                        cpus: cpus.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ignore_failure: ignore,
        };
        // CreateContainer: updating the container being created is refused
        let mut m = CreateMerge::new(container());
        let e = m
            .apply(
                CreateContainerResponse {
                    update: vec![upd("c1", "0", false)],
                    ..Default::default()
                },
                "00-a",
            )
            .unwrap_err();
        assert_eq!(
            e,
            MergeError::UpdateOfCreated {
                plugin: "00-a".into(),
                id: "c1".into()
            }
        );

        // UpdateContainer: the requested container's resources change in place
        let mut u = UpdateMerge::for_update("c1".into(), LinuxResources::default());
        u.apply(
            &[upd("c1", "0-1", false), upd("c2", "2", false)],
            Vec::new(),
            "00-a",
        )
        .unwrap();
        assert!(
            u.apply(&[upd("c2", "3", false)], Vec::new(), "10-b")
                .unwrap_err()
                .to_string()
                .contains("CPUSetCPUs")
        );
        // an ignorable conflicting update is dropped, not an error
        u.apply(&[upd("c2", "3", true)], Vec::new(), "10-b")
            .unwrap();
        let r = u.finish();
        assert_eq!(r.resources.cpu.unwrap().cpus, "0-1");
        assert_eq!(r.updates.len(), 1);
        assert_eq!(
            r.updates[0]
                .linux
                .as_ref()
                .unwrap()
                .resources
                .as_ref()
                .unwrap()
                .cpu
                .as_ref()
                .unwrap()
                .cpus,
            "2"
        );
    }
}
