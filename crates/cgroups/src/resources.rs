//! OCI `LinuxResources` to control-file writes, for v1 and v2, as runc
//! maps them. [`plan`] checks everything and returns the writes in order;
//! nothing is written unless the whole request is valid and supported.

use std::collections::HashMap;

use oci_spec::runtime::{LinuxBlockIo, LinuxCpu, LinuxMemory, LinuxResources};

use crate::convert::{
    blkio_weight_to_io_weight, check_page_size, cpu_max, parse_cpu_list, shares_to_weight, swap_v2,
};
use crate::error::{Error, Result, quote};
use crate::hierarchy::{Controller, Controllers, Hierarchy};
use crate::unified::validate_unified;

/// One control-file write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The controller the file belongs to (on v1: which hierarchy).
    pub controller: Controller,
    pub file: String,
    pub value: String,
}

impl Write {
    fn new(controller: Controller, file: impl Into<String>, value: impl ToString) -> Self {
        Write {
            controller,
            file: file.into(),
            value: value.to_string(),
        }
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Write(Write),
    /// Two files the kernel checks against each other (v1 CFS period and
    /// quota, memory limit and memory+swap limit): `.0` then `.1`, or, when
    /// the kernel refuses `.0` with EINVAL in the current state, `.1` then
    /// `.0`.
    Pair(Write, Write),
    /// The first of these files that exists (BFQ's weight files, else the
    /// generic ones).
    FirstExisting(Vec<Write>),
    /// Written only where the file exists (hugetlb reservations; turning
    /// off swap where swap is not accounted).
    IfExists(Write),
    /// Refuse (before the next write) when the cgroup uses more memory than
    /// this: OCI's `checkBeforeUpdate`.
    CheckMemoryUsage(i64),
}

/// The writes for `resources` on a cgroup with `controllers`, in order.
/// Every value is checked; a resource the hierarchy cannot carry, or whose
/// controller the cgroup lacks, is refused ([`Error::Unsupported`]), never
/// dropped. Device rules are the OCI runtime's and are refused here.
pub fn plan(
    resources: &LinuxResources,
    hierarchy: Hierarchy,
    controllers: Controllers,
) -> Result<Vec<Step>> {
    if resources.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(Error::unsupported(
            "resources.devices",
            "device cgroup rules are applied by the OCI runtime, not to a cgroup directly",
        ));
    }
    let mut steps = Vec::new();
    let v2 = hierarchy.is_unified();
    if let Some(cpu) = resources.cpu() {
        plan_cpu(cpu, v2, &mut steps)?;
    }
    if let Some(memory) = resources.memory() {
        plan_memory(memory, v2, &mut steps)?;
    }
    if let Some(pids) = resources.pids() {
        // 0 leaves the limit alone (runc); negative is no limit.
        match pids.limit() {
            0 => {}
            l if l < 0 => steps.push(Step::Write(Write::new(Controller::Pids, "pids.max", "max"))),
            l => steps.push(Step::Write(Write::new(Controller::Pids, "pids.max", l))),
        }
    }
    if let Some(io) = resources.block_io() {
        plan_block_io(io, v2, &mut steps)?;
    }
    if let Some(limits) = resources.hugepage_limits() {
        for (i, h) in limits.iter().enumerate() {
            let field = format!("resources.hugepage_limits[{i}]");
            check_page_size(&format!("{field}.page_size"), h.page_size())?;
            if h.limit() < 0 {
                return Err(Error::invalid(
                    format!("{field}.limit"),
                    format!("must not be negative, got {}", h.limit()),
                ));
            }
            let size = h.page_size();
            let (limit, rsvd) = if v2 {
                (
                    format!("hugetlb.{size}.max"),
                    format!("hugetlb.{size}.rsvd.max"),
                )
            } else {
                (
                    format!("hugetlb.{size}.limit_in_bytes"),
                    format!("hugetlb.{size}.rsvd.limit_in_bytes"),
                )
            };
            steps.push(Step::Write(Write::new(
                Controller::Hugetlb,
                limit,
                h.limit(),
            )));
            steps.push(Step::IfExists(Write::new(
                Controller::Hugetlb,
                rsvd,
                h.limit(),
            )));
        }
    }
    if let Some(net) = resources.network() {
        plan_network(net, v2, &mut steps)?;
    }
    if let Some(rdma) = resources.rdma() {
        let mut devices: Vec<_> = rdma.iter().collect();
        devices.sort_by(|a, b| a.0.cmp(b.0));
        for (device, limit) in devices {
            if device.is_empty()
                || device.len() > 64
                || !device.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err(Error::invalid(
                    format!("resources.rdma[{}]", quote(device)),
                    "not an RDMA device name",
                ));
            }
            let n = |v: Option<u32>| v.map_or("max".to_string(), |v| v.to_string());
            steps.push(Step::Write(Write::new(
                Controller::Rdma,
                "rdma.max",
                format!(
                    "{device} hca_handle={} hca_object={}",
                    n(limit.hca_handles()),
                    n(limit.hca_objects())
                ),
            )));
        }
    }
    if let Some(unified) = resources.unified().as_ref().filter(|u| !u.is_empty()) {
        if !v2 {
            return Err(Error::unsupported(
                "resources.unified",
                format!(
                    "unified cgroup resources need cgroup v2; this host is {}",
                    hierarchy.as_str()
                ),
            ));
        }
        plan_unified(unified, controllers, &mut steps)?;
    }
    check_controllers(&steps, controllers, hierarchy)?;
    Ok(steps)
}

fn plan_cpu(cpu: &LinuxCpu, v2: bool, steps: &mut Vec<Step>) -> Result<()> {
    let period = cpu.period().filter(|p| *p != 0);
    if let Some(p) = period
        && !(1000..=1_000_000).contains(&p)
    {
        return Err(Error::invalid(
            "resources.cpu.period",
            format!("must be 1000 to 1000000 µs, got {p}"),
        ));
    }
    let quota = cpu.quota().filter(|q| *q != 0);
    match quota {
        Some(q) if q < -1 => {
            return Err(Error::invalid(
                "resources.cpu.quota",
                format!("must be -1 (unlimited) or at least 1000 µs, got {q}"),
            ));
        }
        Some(q) if q > 0 && q < 1000 => {
            return Err(Error::invalid(
                "resources.cpu.quota",
                format!("must be -1 (unlimited) or at least 1000 µs, got {q}"),
            ));
        }
        _ => {}
    }
    if let Some(shares) = cpu.shares().filter(|s| *s != 0) {
        if v2 {
            steps.push(Step::Write(Write::new(
                Controller::Cpu,
                "cpu.weight",
                shares_to_weight(shares),
            )));
        } else {
            steps.push(Step::Write(Write::new(
                Controller::Cpu,
                "cpu.shares",
                shares,
            )));
        }
    }
    if v2 {
        if let Some(max) = cpu_max(quota, period) {
            steps.push(Step::Write(Write::new(Controller::Cpu, "cpu.max", max)));
        }
        if let Some(burst) = cpu.burst() {
            steps.push(Step::Write(Write::new(
                Controller::Cpu,
                "cpu.max.burst",
                burst,
            )));
        }
        if cpu.realtime_runtime().is_some_and(|r| r != 0)
            || cpu.realtime_period().is_some_and(|p| p != 0)
        {
            return Err(Error::unsupported(
                "resources.cpu.realtime_runtime",
                "real-time CPU bandwidth is cgroup v1 only",
            ));
        }
    } else {
        let period_w = period.map(|p| Write::new(Controller::Cpu, "cpu.cfs_period_us", p));
        let quota_w = quota.map(|q| Write::new(Controller::Cpu, "cpu.cfs_quota_us", q.max(-1)));
        push_pair(steps, period_w, quota_w);
        if let Some(burst) = cpu.burst() {
            steps.push(Step::Write(Write::new(
                Controller::Cpu,
                "cpu.cfs_burst_us",
                burst,
            )));
        }
        let rt_period = cpu
            .realtime_period()
            .filter(|p| *p != 0)
            .map(|p| Write::new(Controller::Cpu, "cpu.rt_period_us", p));
        let rt_runtime = cpu
            .realtime_runtime()
            .filter(|r| *r != 0)
            .map(|r| Write::new(Controller::Cpu, "cpu.rt_runtime_us", r));
        push_pair(steps, rt_period, rt_runtime);
    }
    if let Some(idle) = cpu.idle() {
        if !(0..=1).contains(&idle) {
            return Err(Error::invalid(
                "resources.cpu.idle",
                format!("must be 0 or 1, got {idle}"),
            ));
        }
        steps.push(Step::Write(Write::new(Controller::Cpu, "cpu.idle", idle)));
    }
    if let Some(cpus) = cpu.cpus().as_deref().filter(|s| !s.is_empty()) {
        parse_cpu_list("resources.cpu.cpus", cpus)?;
        steps.push(Step::Write(Write::new(
            Controller::Cpuset,
            "cpuset.cpus",
            cpus,
        )));
    }
    if let Some(mems) = cpu.mems().as_deref().filter(|s| !s.is_empty()) {
        parse_cpu_list("resources.cpu.mems", mems)?;
        steps.push(Step::Write(Write::new(
            Controller::Cpuset,
            "cpuset.mems",
            mems,
        )));
    }
    Ok(())
}

fn push_pair(steps: &mut Vec<Step>, first: Option<Write>, second: Option<Write>) {
    match (first, second) {
        (Some(a), Some(b)) => steps.push(Step::Pair(a, b)),
        (Some(a), None) | (None, Some(a)) => steps.push(Step::Write(a)),
        (None, None) => {}
    }
}

fn max_or(v: i64) -> String {
    if v < 0 { "max".into() } else { v.to_string() }
}

fn plan_memory(m: &LinuxMemory, v2: bool, steps: &mut Vec<Step>) -> Result<()> {
    let limit = m.limit().filter(|l| *l != 0);
    for (field, value) in [
        ("resources.memory.limit", limit),
        ("resources.memory.reservation", m.reservation()),
        ("resources.memory.swap", m.swap()),
    ] {
        if let Some(v) = value
            && v < -1
        {
            return Err(Error::invalid(
                field,
                format!("must be -1 (unlimited), 0 (unset) or positive, got {v}"),
            ));
        }
    }
    if m.kernel().is_some_and(|k| k != 0) {
        return Err(Error::unsupported(
            "resources.memory.kernel",
            "kernel memory limits are gone from current kernels",
        ));
    }
    if m.check_before_update() == Some(true)
        && let Some(l) = limit.filter(|l| *l > 0)
    {
        steps.push(Step::CheckMemoryUsage(l));
    }
    if v2 {
        if let Some(swap) = swap_v2(m.swap(), limit)? {
            let w = Write::new(Controller::Memory, "memory.swap.max", max_or(swap));
            // Where swap is not accounted, "no swap" and "any swap" are
            // both what the host does anyway (runc).
            if swap == 0 || swap == -1 {
                steps.push(Step::IfExists(w));
            } else {
                steps.push(Step::Write(w));
            }
        }
        if let Some(l) = limit {
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.max",
                max_or(l),
            )));
        }
        if let Some(r) = m.reservation().filter(|r| *r != 0) {
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.low",
                max_or(r),
            )));
        }
        for (field, set) in [
            (
                "resources.memory.kernelTCP",
                m.kernel_tcp().is_some_and(|k| k != 0),
            ),
            ("resources.memory.swappiness", m.swappiness().is_some()),
            (
                "resources.memory.disableOOMKiller",
                m.disable_oom_killer() == Some(true),
            ),
        ] {
            if set {
                return Err(Error::unsupported(field, "a cgroup v1 memory setting"));
            }
        }
    } else {
        let swap = m.swap().filter(|s| *s != 0);
        if let (Some(s), Some(l)) = (swap, limit)
            && s > 0
            && l > 0
            && s < l
        {
            return Err(Error::invalid(
                "resources.memory.swap",
                format!("{s} is less than the memory limit {l} (it is memory+swap)"),
            ));
        }
        push_pair(
            steps,
            limit.map(|l| Write::new(Controller::Memory, "memory.limit_in_bytes", l)),
            swap.map(|s| Write::new(Controller::Memory, "memory.memsw.limit_in_bytes", s)),
        );
        if let Some(r) = m.reservation().filter(|r| *r != 0) {
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.soft_limit_in_bytes",
                r,
            )));
        }
        if let Some(k) = m.kernel_tcp().filter(|k| *k != 0) {
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.kmem.tcp.limit_in_bytes",
                k,
            )));
        }
        if let Some(s) = m.swappiness() {
            if s > 100 {
                return Err(Error::invalid(
                    "resources.memory.swappiness",
                    format!("must be 0 to 100, got {s}"),
                ));
            }
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.swappiness",
                s,
            )));
        }
        if let Some(d) = m.disable_oom_killer() {
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.oom_control",
                u8::from(d),
            )));
        }
        if let Some(h) = m.use_hierarchy() {
            steps.push(Step::Write(Write::new(
                Controller::Memory,
                "memory.use_hierarchy",
                u8::from(h),
            )));
        }
    }
    Ok(())
}

fn device(field: &str, major: i64, minor: i64) -> Result<String> {
    if !(0..=0xfff).contains(&major) || !(0..=0xfffff).contains(&minor) {
        return Err(Error::invalid(
            field.to_string(),
            format!("{major}:{minor} is not a device number"),
        ));
    }
    Ok(format!("{major}:{minor}"))
}

fn check_weight(field: &str, w: u16) -> Result<()> {
    if (10..=1000).contains(&w) {
        Ok(())
    } else {
        Err(Error::invalid(
            field.to_string(),
            format!("must be 10 to 1000, got {w}"),
        ))
    }
}

fn plan_block_io(io: &LinuxBlockIo, v2: bool, steps: &mut Vec<Step>) -> Result<()> {
    let (ctl, bfq, plain) = if v2 {
        (Controller::Io, "io.bfq.weight", "io.weight")
    } else {
        (Controller::Blkio, "blkio.bfq.weight", "blkio.weight")
    };
    if let Some(w) = io.weight().filter(|w| *w != 0) {
        check_weight("resources.blockIO.weight", w)?;
        let generic = if v2 {
            blkio_weight_to_io_weight(w)
        } else {
            u64::from(w)
        };
        steps.push(Step::FirstExisting(vec![
            Write::new(ctl, bfq, w),
            Write::new(ctl, plain, generic),
        ]));
    }
    if let Some(w) = io.leaf_weight().filter(|w| *w != 0) {
        if v2 {
            return Err(Error::unsupported(
                "resources.blockIO.leafWeight",
                "a cgroup v1 setting",
            ));
        }
        check_weight("resources.blockIO.leafWeight", w)?;
        steps.push(Step::Write(Write::new(ctl, "blkio.leaf_weight", w)));
    }
    for (i, d) in io.weight_device().iter().flatten().enumerate() {
        let field = format!("resources.blockIO.weightDevice[{i}]");
        let dev = device(&field, d.major(), d.minor())?;
        if let Some(w) = d.weight() {
            check_weight(&format!("{field}.weight"), w)?;
            let generic = if v2 {
                blkio_weight_to_io_weight(w)
            } else {
                u64::from(w)
            };
            let (bfq_dev, plain_dev) = if v2 {
                ("io.bfq.weight", "io.weight")
            } else {
                ("blkio.bfq.weight_device", "blkio.weight_device")
            };
            steps.push(Step::FirstExisting(vec![
                Write::new(ctl, bfq_dev, format!("{dev} {w}")),
                Write::new(ctl, plain_dev, format!("{dev} {generic}")),
            ]));
        }
        if let Some(w) = d.leaf_weight() {
            if v2 {
                return Err(Error::unsupported(
                    format!("{field}.leafWeight"),
                    "a cgroup v1 setting",
                ));
            }
            check_weight(&format!("{field}.leafWeight"), w)?;
            steps.push(Step::Write(Write::new(
                ctl,
                "blkio.leaf_weight_device",
                format!("{dev} {w}"),
            )));
        }
    }
    for (list, name, v1_file, v2_key) in [
        (
            io.throttle_read_bps_device(),
            "throttleReadBpsDevice",
            "blkio.throttle.read_bps_device",
            "rbps",
        ),
        (
            io.throttle_write_bps_device(),
            "throttleWriteBpsDevice",
            "blkio.throttle.write_bps_device",
            "wbps",
        ),
        (
            io.throttle_read_iops_device(),
            "throttleReadIOPSDevice",
            "blkio.throttle.read_iops_device",
            "riops",
        ),
        (
            io.throttle_write_iops_device(),
            "throttleWriteIOPSDevice",
            "blkio.throttle.write_iops_device",
            "wiops",
        ),
    ] {
        for (i, t) in list.iter().flatten().enumerate() {
            let dev = device(
                &format!("resources.blockIO.{name}[{i}]"),
                t.major(),
                t.minor(),
            )?;
            let w = if v2 {
                // 0 removes the limit, as writing 0 does on v1.
                let rate = if t.rate() == 0 {
                    "max".to_string()
                } else {
                    t.rate().to_string()
                };
                Write::new(ctl, "io.max", format!("{dev} {v2_key}={rate}"))
            } else {
                Write::new(ctl, v1_file, format!("{dev} {}", t.rate()))
            };
            steps.push(Step::Write(w));
        }
    }
    Ok(())
}

fn plan_network(
    net: &oci_spec::runtime::LinuxNetwork,
    v2: bool,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let any = net.class_id().is_some() || net.priorities().as_ref().is_some_and(|p| !p.is_empty());
    if any && v2 {
        return Err(Error::unsupported(
            "resources.network",
            "net_cls and net_prio are cgroup v1 only",
        ));
    }
    if let Some(id) = net.class_id() {
        steps.push(Step::Write(Write::new(
            Controller::NetCls,
            "net_cls.classid",
            id,
        )));
    }
    for (i, p) in net.priorities().iter().flatten().enumerate() {
        let name = p.name();
        if name.is_empty()
            || name.len() > 15
            || name.contains('/')
            || !name.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::invalid(
                format!("resources.network.priorities[{i}].name"),
                format!("{} is not an interface name", quote(name)),
            ));
        }
        steps.push(Step::Write(Write::new(
            Controller::NetPrio,
            "net_prio.ifpriomap",
            format!("{name} {}", p.priority()),
        )));
    }
    Ok(())
}

/// Unified entries go last, so that they override the mapped fields (as
/// runc), in key order.
fn plan_unified(
    unified: &HashMap<String, String>,
    controllers: Controllers,
    steps: &mut Vec<Step>,
) -> Result<()> {
    validate_unified(unified, controllers)?;
    let mut keys: Vec<&String> = unified.keys().collect();
    keys.sort();
    for key in keys {
        let controller = crate::unified::validate_unified_entry(key, &unified[key], controllers)?;
        steps.push(Step::Write(Write::new(
            controller,
            key.as_str(),
            &unified[key],
        )));
    }
    Ok(())
}

/// Every write's controller must be there: enabled in the v2 cgroup, or
/// mounted on v1.
fn check_controllers(steps: &[Step], controllers: Controllers, hierarchy: Hierarchy) -> Result<()> {
    for step in steps {
        let writes: Vec<&Write> = match step {
            Step::Write(w) | Step::IfExists(w) => vec![w],
            Step::Pair(a, b) => vec![a, b],
            Step::FirstExisting(ws) => ws.iter().collect(),
            Step::CheckMemoryUsage(_) => vec![],
        };
        for w in writes {
            if !controllers.contains(w.controller) {
                let where_ = if hierarchy.is_unified() {
                    format!("enabled in this cgroup (enabled: {controllers})")
                } else {
                    "mounted on this host".to_string()
                };
                return Err(Error::unsupported(
                    format!("resources ({})", w.file),
                    format!("the {} controller is not {where_}", w.controller),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{
        LinuxBlockIoBuilder, LinuxCpuBuilder, LinuxHugepageLimitBuilder, LinuxMemoryBuilder,
        LinuxPidsBuilder, LinuxResourcesBuilder, LinuxThrottleDeviceBuilder,
        LinuxWeightDeviceBuilder,
    };

    fn v2_all() -> Controllers {
        Controllers::parse("cpuset cpu io memory hugetlb pids rdma misc")
    }

    fn v1_all() -> Controllers {
        Controllers::parse(
            "cpu cpuacct cpuset memory devices freezer blkio pids hugetlb net_cls net_prio",
        )
    }

    fn writes(steps: &[Step]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for s in steps {
            match s {
                Step::Write(w) | Step::IfExists(w) => out.push((w.file.clone(), w.value.clone())),
                Step::Pair(a, b) => {
                    out.push((a.file.clone(), a.value.clone()));
                    out.push((b.file.clone(), b.value.clone()));
                }
                Step::FirstExisting(ws) => {
                    out.extend(ws.iter().map(|w| (w.file.clone(), w.value.clone())))
                }
                Step::CheckMemoryUsage(l) => out.push(("<check>".into(), l.to_string())),
            }
        }
        out
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn full() -> LinuxResources {
        LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .shares(512u64)
                    .quota(50_000i64)
                    .period(100_000u64)
                    .cpus("0-1")
                    .mems("0")
                    .build()
                    .unwrap(),
            )
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(64i64 << 20)
                    .swap(128i64 << 20)
                    .reservation(32i64 << 20)
                    .build()
                    .unwrap(),
            )
            .pids(LinuxPidsBuilder::default().limit(100).build().unwrap())
            .hugepage_limits(vec![
                LinuxHugepageLimitBuilder::default()
                    .page_size("2MB")
                    .limit(4i64 << 20)
                    .build()
                    .unwrap(),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn v2_mapping() {
        let steps = plan(&full(), Hierarchy::V2, v2_all()).unwrap();
        assert_eq!(
            writes(&steps),
            pairs(&[
                ("cpu.weight", "59"),
                ("cpu.max", "50000 100000"),
                ("cpuset.cpus", "0-1"),
                ("cpuset.mems", "0"),
                ("memory.swap.max", "67108864"),
                ("memory.max", "67108864"),
                ("memory.low", "33554432"),
                ("pids.max", "100"),
                ("hugetlb.2MB.max", "4194304"),
                ("hugetlb.2MB.rsvd.max", "4194304"),
            ])
        );
    }

    #[test]
    fn v1_mapping() {
        let steps = plan(&full(), Hierarchy::V1, v1_all()).unwrap();
        assert_eq!(
            writes(&steps),
            pairs(&[
                ("cpu.shares", "512"),
                ("cpu.cfs_period_us", "100000"),
                ("cpu.cfs_quota_us", "50000"),
                ("cpuset.cpus", "0-1"),
                ("cpuset.mems", "0"),
                ("memory.limit_in_bytes", "67108864"),
                ("memory.memsw.limit_in_bytes", "134217728"),
                ("memory.soft_limit_in_bytes", "33554432"),
                ("pids.max", "100"),
                ("hugetlb.2MB.limit_in_bytes", "4194304"),
                ("hugetlb.2MB.rsvd.limit_in_bytes", "4194304"),
            ])
        );
        // Period and quota, limit and memsw, are ordered pairs.
        assert!(
            matches!(&steps[1], Step::Pair(a, b) if a.file == "cpu.cfs_period_us" && b.file == "cpu.cfs_quota_us")
        );
        assert!(matches!(&steps[4], Step::Pair(a, b) if a.file == "memory.limit_in_bytes"));
        // The same on a hybrid host.
        assert_eq!(plan(&full(), Hierarchy::Hybrid, v1_all()).unwrap(), steps);
    }

    #[test]
    fn unlimited_values() {
        let r = LinuxResourcesBuilder::default()
            .cpu(LinuxCpuBuilder::default().quota(-1i64).build().unwrap())
            .memory(LinuxMemoryBuilder::default().limit(-1i64).build().unwrap())
            .pids(LinuxPidsBuilder::default().limit(-1).build().unwrap())
            .build()
            .unwrap();
        assert_eq!(
            writes(&plan(&r, Hierarchy::V2, v2_all()).unwrap()),
            pairs(&[
                ("cpu.max", "max"),
                ("memory.swap.max", "max"),
                ("memory.max", "max"),
                ("pids.max", "max"),
            ])
        );
        assert_eq!(
            writes(&plan(&r, Hierarchy::V1, v1_all()).unwrap()),
            pairs(&[
                ("cpu.cfs_quota_us", "-1"),
                ("memory.limit_in_bytes", "-1"),
                ("pids.max", "max"),
            ])
        );
    }

    #[test]
    fn zero_means_unset() {
        let r = LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .shares(0u64)
                    .quota(0i64)
                    .period(0u64)
                    .build()
                    .unwrap(),
            )
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(0i64)
                    .swap(0i64)
                    .build()
                    .unwrap(),
            )
            .pids(LinuxPidsBuilder::default().limit(0).build().unwrap())
            .build()
            .unwrap();
        assert!(plan(&r, Hierarchy::V2, v2_all()).unwrap().is_empty());
        assert!(plan(&r, Hierarchy::V1, v1_all()).unwrap().is_empty());
        assert!(
            plan(
                &LinuxResources::default(),
                Hierarchy::V2,
                Controllers::new()
            )
            .unwrap()
            .is_empty()
        );
    }

    #[test]
    fn bad_values_are_refused_by_field() {
        for (r, field) in [
            (
                LinuxResourcesBuilder::default()
                    .cpu(LinuxCpuBuilder::default().quota(-2i64).build().unwrap())
                    .build()
                    .unwrap(),
                "resources.cpu.quota",
            ),
            (
                LinuxResourcesBuilder::default()
                    .cpu(LinuxCpuBuilder::default().quota(10i64).build().unwrap())
                    .build()
                    .unwrap(),
                "resources.cpu.quota",
            ),
            (
                LinuxResourcesBuilder::default()
                    .cpu(LinuxCpuBuilder::default().period(5u64).build().unwrap())
                    .build()
                    .unwrap(),
                "resources.cpu.period",
            ),
            (
                LinuxResourcesBuilder::default()
                    .cpu(LinuxCpuBuilder::default().cpus("0-").build().unwrap())
                    .build()
                    .unwrap(),
                "resources.cpu.cpus",
            ),
            (
                LinuxResourcesBuilder::default()
                    .cpu(LinuxCpuBuilder::default().mems("0;echo").build().unwrap())
                    .build()
                    .unwrap(),
                "resources.cpu.mems",
            ),
            (
                LinuxResourcesBuilder::default()
                    .memory(LinuxMemoryBuilder::default().limit(-5i64).build().unwrap())
                    .build()
                    .unwrap(),
                "resources.memory.limit",
            ),
            (
                LinuxResourcesBuilder::default()
                    .memory(
                        LinuxMemoryBuilder::default()
                            .limit(100i64)
                            .swap(50i64)
                            .build()
                            .unwrap(),
                    )
                    .build()
                    .unwrap(),
                "resources.memory.swap",
            ),
            (
                LinuxResourcesBuilder::default()
                    .hugepage_limits(vec![
                        LinuxHugepageLimitBuilder::default()
                            .page_size("2MB/../../x")
                            .limit(1i64)
                            .build()
                            .unwrap(),
                    ])
                    .build()
                    .unwrap(),
                "resources.hugepage_limits[0].page_size",
            ),
            (
                LinuxResourcesBuilder::default()
                    .block_io(LinuxBlockIoBuilder::default().weight(5u16).build().unwrap())
                    .build()
                    .unwrap(),
                "resources.blockIO.weight",
            ),
        ] {
            for (h, c) in [(Hierarchy::V2, v2_all()), (Hierarchy::V1, v1_all())] {
                let e = plan(&r, h, c).unwrap_err();
                assert!(e.is_invalid_argument(), "{field} on {h:?}: {e}");
                assert!(e.to_string().contains(field), "{field} on {h:?}: {e}");
            }
        }
    }

    #[test]
    fn unified_is_validated_and_written_last() {
        let r = LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(100i64 << 20)
                    .build()
                    .unwrap(),
            )
            .unified(HashMap::from([
                ("memory.max".to_string(), "200000000".to_string()),
                ("memory.high".to_string(), "150000000".to_string()),
            ]))
            .build()
            .unwrap();
        let steps = plan(&r, Hierarchy::V2, v2_all()).unwrap();
        assert_eq!(
            writes(&steps),
            pairs(&[
                ("memory.max", "104857600"),
                ("memory.high", "150000000"),
                ("memory.max", "200000000"),
            ])
        );
        for key in ["../x", "/etc/x", "cgroup.procs", "memory.max/../../x"] {
            let r = LinuxResourcesBuilder::default()
                .unified(HashMap::from([(key.to_string(), "1".to_string())]))
                .build()
                .unwrap();
            let e = plan(&r, Hierarchy::V2, v2_all()).unwrap_err();
            assert!(
                e.is_invalid_argument() && e.to_string().contains(&quote(key)),
                "{key}: {e}"
            );
        }
        // On v1 unified is refused whole, before any key is looked at.
        let e = plan(&r, Hierarchy::Hybrid, v1_all()).unwrap_err();
        assert!(
            e.is_unsupported() && e.to_string().contains("resources.unified"),
            "{e}"
        );
    }

    #[test]
    fn missing_controllers_are_refused() {
        let e = plan(
            &full(),
            Hierarchy::V2,
            Controllers::parse("cpu memory pids"),
        )
        .unwrap_err();
        assert!(e.is_unsupported(), "{e}");
        assert!(e.to_string().contains("cpuset"), "{e}");
        let r = LinuxResourcesBuilder::default()
            .hugepage_limits(vec![
                LinuxHugepageLimitBuilder::default()
                    .page_size("2MB")
                    .limit(0i64)
                    .build()
                    .unwrap(),
            ])
            .build()
            .unwrap();
        let e = plan(&r, Hierarchy::Hybrid, Controllers::parse("cpu memory")).unwrap_err();
        assert!(
            e.to_string().contains("hugetlb controller is not mounted"),
            "{e}"
        );
    }

    #[test]
    fn version_specific_settings_are_refused_elsewhere() {
        let rt = LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .realtime_runtime(950_000i64)
                    .realtime_period(1_000_000u64)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        assert!(
            plan(&rt, Hierarchy::V2, v2_all())
                .unwrap_err()
                .is_unsupported()
        );
        assert_eq!(
            writes(&plan(&rt, Hierarchy::V1, v1_all()).unwrap()),
            pairs(&[
                ("cpu.rt_period_us", "1000000"),
                ("cpu.rt_runtime_us", "950000")
            ])
        );
        let swappiness = LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .swappiness(10u64)
                    .disable_oom_killer(true)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        assert!(
            plan(&swappiness, Hierarchy::V2, v2_all())
                .unwrap_err()
                .is_unsupported()
        );
        assert_eq!(
            writes(&plan(&swappiness, Hierarchy::V1, v1_all()).unwrap()),
            pairs(&[("memory.swappiness", "10"), ("memory.oom_control", "1")])
        );
        let kernel = LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .kernel(1i64 << 20)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        assert!(
            plan(&kernel, Hierarchy::V1, v1_all())
                .unwrap_err()
                .is_unsupported()
        );
        let devices = LinuxResourcesBuilder::default()
            .devices(vec![oci_spec::runtime::LinuxDeviceCgroup::default()])
            .build()
            .unwrap();
        assert!(
            plan(&devices, Hierarchy::V1, v1_all())
                .unwrap_err()
                .is_unsupported()
        );
    }

    #[test]
    fn block_io_mapping() {
        let r = LinuxResourcesBuilder::default()
            .block_io(
                LinuxBlockIoBuilder::default()
                    .weight(500u16)
                    .weight_device(vec![
                        LinuxWeightDeviceBuilder::default()
                            .major(8i64)
                            .minor(0i64)
                            .weight(100u16)
                            .build()
                            .unwrap(),
                    ])
                    .throttle_read_bps_device(vec![
                        LinuxThrottleDeviceBuilder::default()
                            .major(8i64)
                            .minor(0i64)
                            .rate(1_048_576u64)
                            .build()
                            .unwrap(),
                    ])
                    .throttle_write_iops_device(vec![
                        LinuxThrottleDeviceBuilder::default()
                            .major(8i64)
                            .minor(16i64)
                            .rate(0u64)
                            .build()
                            .unwrap(),
                    ])
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let v2 = plan(&r, Hierarchy::V2, v2_all()).unwrap();
        assert_eq!(
            v2[0],
            Step::FirstExisting(vec![
                Write::new(Controller::Io, "io.bfq.weight", 500),
                Write::new(Controller::Io, "io.weight", 4950),
            ])
        );
        assert_eq!(
            writes(&v2[1..]),
            pairs(&[
                ("io.bfq.weight", "8:0 100"),
                ("io.weight", "8:0 910"),
                ("io.max", "8:0 rbps=1048576"),
                ("io.max", "8:16 wiops=max"),
            ])
        );
        assert_eq!(
            writes(&plan(&r, Hierarchy::V1, v1_all()).unwrap()),
            pairs(&[
                ("blkio.bfq.weight", "500"),
                ("blkio.weight", "500"),
                ("blkio.bfq.weight_device", "8:0 100"),
                ("blkio.weight_device", "8:0 100"),
                ("blkio.throttle.read_bps_device", "8:0 1048576"),
                ("blkio.throttle.write_iops_device", "8:16 0"),
            ])
        );
    }

    #[test]
    fn check_before_update_comes_first() {
        let r = LinuxResourcesBuilder::default()
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(1i64 << 20)
                    .check_before_update(true)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let steps = plan(&r, Hierarchy::V2, v2_all()).unwrap();
        assert_eq!(steps[0], Step::CheckMemoryUsage(1 << 20));
    }
}
