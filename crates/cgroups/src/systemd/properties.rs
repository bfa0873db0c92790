//! OCI resources as systemd unit properties (systemd.resource-control(5)),
//! the way runc's systemd drivers set them: systemd owns the limits of the
//! units it manages and would otherwise put its own values back on the
//! next daemon-reload. What systemd has no property for is written to the
//! cgroup files afterwards (see [`super::Systemd::apply`]).

use oci_spec::runtime::LinuxResources;

use crate::convert::{cpu_list_to_mask, cpu_quota_per_sec, shares_to_weight, swap_v2};
use crate::error::{Error, Result, quote};
use crate::hierarchy::Hierarchy;

/// systemd's "infinity" for limits and CPUQuotaPerSecUSec.
pub const INFINITY: u64 = u64::MAX;

/// The systemd versions that brought a property.
pub const CPU_QUOTA_PERIOD_SINCE: u32 = 242;
pub const ALLOWED_CPUS_SINCE: u32 = 244;
pub const CPU_IDLE_SINCE: u32 = 252;
pub const OOM_POLICY_SINCE: u32 = 253;

/// A property value, in the D-Bus type systemd declares for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `t`
    U64(u64),
    /// `b`
    Bool(bool),
    /// `s`
    Str(String),
    /// `ay` (CPU and node masks)
    Bytes(Vec<u8>),
    /// `au` (PIDs)
    U32s(Vec<u32>),
    /// `as` (Wants=, After=)
    Strs(Vec<String>),
}

/// One unit property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Property {
    pub name: &'static str,
    pub value: Value,
}

pub(crate) fn prop(name: &'static str, value: Value) -> Property {
    Property { name, value }
}

fn limit_or_infinity(v: i64) -> u64 {
    if v < 0 { INFINITY } else { v as u64 }
}

/// The properties for `resources` on a unit of a `hierarchy` host run by
/// systemd `version` (properties older systemds lack are left to the
/// cgroup files). Also returns the CPU quota to write to the cgroup, which
/// systemd rounds up to whole percents of a CPU.
pub fn resource_properties(
    resources: &LinuxResources,
    hierarchy: Hierarchy,
    version: u32,
) -> Result<(Vec<Property>, Option<i64>)> {
    let v2 = hierarchy.is_unified();
    let mut props = Vec::new();
    let mut quota_out = None;
    let mut idle = false;

    if let Some(m) = resources.memory() {
        let limit = m.limit().filter(|l| *l != 0);
        if let Some(l) = limit {
            let name = if v2 { "MemoryMax" } else { "MemoryLimit" };
            props.push(prop(name, Value::U64(limit_or_infinity(l))));
        }
        if v2 {
            if let Some(r) = m.reservation().filter(|r| *r != 0) {
                props.push(prop("MemoryLow", Value::U64(limit_or_infinity(r))));
            }
            if let Some(swap) = swap_v2(m.swap(), limit)? {
                props.push(prop("MemorySwapMax", Value::U64(limit_or_infinity(swap))));
            }
        }
    }

    if let Some(cpu) = resources.cpu() {
        if v2 && cpu.idle() == Some(1) && version >= CPU_IDLE_SINCE {
            // CPUWeight=0 is how systemd sets cpu.idle.
            props.push(prop("CPUWeight", Value::U64(0)));
            idle = true;
        }
        if let Some(shares) = cpu.shares().filter(|s| *s != 0) {
            if !v2 {
                props.push(prop("CPUShares", Value::U64(shares)));
            } else if !idle {
                props.push(prop("CPUWeight", Value::U64(shares_to_weight(shares))));
            }
        }
        let quota = cpu.quota().unwrap_or(0);
        let period = cpu.period().unwrap_or(0);
        if period != 0 && version >= CPU_QUOTA_PERIOD_SINCE {
            props.push(prop("CPUQuotaPeriodUSec", Value::U64(period)));
        }
        if quota != 0 || period != 0 {
            let (per_sec, adjusted) = cpu_quota_per_sec(quota, period);
            props.push(prop("CPUQuotaPerSecUSec", Value::U64(per_sec)));
            if adjusted != quota {
                quota_out = Some(adjusted);
            }
        }
        if version >= ALLOWED_CPUS_SINCE {
            if let Some(cpus) = cpu.cpus().as_deref().filter(|s| !s.is_empty()) {
                let mask = cpu_list_to_mask("resources.cpu.cpus", cpus)?;
                props.push(prop("AllowedCPUs", Value::Bytes(mask)));
            }
            if let Some(mems) = cpu.mems().as_deref().filter(|s| !s.is_empty()) {
                let mask = cpu_list_to_mask("resources.cpu.mems", mems)?;
                props.push(prop("AllowedMemoryNodes", Value::Bytes(mask)));
            }
        }
    }

    if let Some(pids) = resources.pids() {
        match pids.limit() {
            0 => {}
            l => props.push(prop("TasksMax", Value::U64(limit_or_infinity(l)))),
        }
    }

    if !v2
        && let Some(w) = resources.block_io().as_ref().and_then(|b| b.weight())
        && w != 0
    {
        props.push(prop("BlockIOWeight", Value::U64(u64::from(w))));
    }

    if v2 && let Some(unified) = resources.unified() {
        let mut keys: Vec<&String> = unified.keys().collect();
        keys.sort();
        for key in keys {
            unified_property(key, unified[key].trim(), version, idle, &mut props)?;
        }
    }
    Ok((props, quota_out))
}

/// The systemd property for a `unified` entry systemd knows; others are
/// only written to the cgroup file.
fn unified_property(
    key: &str,
    value: &str,
    version: u32,
    idle: bool,
    props: &mut Vec<Property>,
) -> Result<()> {
    let bad = || {
        Error::invalid(
            format!("unified key {}", quote(key)),
            format!("{} is not a value for it", quote(value)),
        )
    };
    let num_or_max = |v: &str| -> Result<u64> {
        if v == "max" {
            Ok(INFINITY)
        } else {
            v.parse().map_err(|_| bad())
        }
    };
    match key {
        "cpu.weight" if !idle => {
            let w: u64 = value.parse().map_err(|_| bad())?;
            props.push(prop("CPUWeight", Value::U64(w)));
        }
        "cpu.idle" if value == "1" && version >= CPU_IDLE_SINCE => {
            props.push(prop("CPUWeight", Value::U64(0)));
        }
        "cpu.max" => {
            let mut parts = value.split_ascii_whitespace();
            let quota = match parts.next() {
                Some("max") => 0,
                Some(q) => q.parse::<i64>().map_err(|_| bad())?,
                None => return Err(bad()),
            };
            let period = match parts.next() {
                Some(p) => p.parse::<u64>().map_err(|_| bad())?,
                None => crate::convert::DEFAULT_CPU_PERIOD,
            };
            if parts.next().is_some() {
                return Err(bad());
            }
            if version >= CPU_QUOTA_PERIOD_SINCE {
                props.push(prop("CPUQuotaPeriodUSec", Value::U64(period)));
            }
            let (per_sec, _) = cpu_quota_per_sec(quota, period);
            props.push(prop("CPUQuotaPerSecUSec", Value::U64(per_sec)));
        }
        "cpuset.cpus" | "cpuset.mems" if version >= ALLOWED_CPUS_SINCE => {
            let mask = cpu_list_to_mask(&format!("unified key {key:?}"), value)?;
            let name = if key == "cpuset.cpus" {
                "AllowedCPUs"
            } else {
                "AllowedMemoryNodes"
            };
            props.push(prop(name, Value::Bytes(mask)));
        }
        "memory.high" | "memory.low" | "memory.min" | "memory.max" | "memory.swap.max" => {
            let name = match key {
                "memory.high" => "MemoryHigh",
                "memory.low" => "MemoryLow",
                "memory.min" => "MemoryMin",
                "memory.max" => "MemoryMax",
                _ => "MemorySwapMax",
            };
            props.push(prop(name, Value::U64(num_or_max(value)?)));
        }
        "pids.max" => {
            // systemd takes no TasksMax=0.
            props.push(prop("TasksMax", Value::U64(num_or_max(value)?.max(1))));
        }
        _ => {}
    }
    Ok(())
}

/// OOMPolicy= for a new scope from `memory.oom.group` (systemd sets the
/// file from it and refuses to change it on a running scope).
pub fn oom_policy(resources: &LinuxResources, version: u32) -> Result<Option<Property>> {
    let Some(v) = resources
        .unified()
        .as_ref()
        .and_then(|u| u.get("memory.oom.group"))
    else {
        return Ok(None);
    };
    if version < OOM_POLICY_SINCE {
        return Ok(None);
    }
    match v.trim() {
        "1" => Ok(Some(prop("OOMPolicy", Value::Str("kill".into())))),
        "0" => Ok(Some(prop("OOMPolicy", Value::Str("continue".into())))),
        other => Err(Error::invalid(
            "unified key \"memory.oom.group\"",
            format!("{} is not 0 or 1", quote(other)),
        )),
    }
}

/// The properties every unit crust starts gets: accounting on (so that
/// stats exist and the controllers are delegated), no default
/// dependencies (a container must not be stopped with basic.target).
pub fn base_properties(description: String, hierarchy: Hierarchy) -> Vec<Property> {
    let io_accounting = if hierarchy.is_unified() {
        "IOAccounting"
    } else {
        "BlockIOAccounting"
    };
    vec![
        prop("Description", Value::Str(description)),
        prop("MemoryAccounting", Value::Bool(true)),
        prop("CPUAccounting", Value::Bool(true)),
        prop(io_accounting, Value::Bool(true)),
        prop("TasksAccounting", Value::Bool(true)),
        prop("DefaultDependencies", Value::Bool(false)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{
        LinuxBlockIoBuilder, LinuxCpuBuilder, LinuxMemoryBuilder, LinuxPidsBuilder,
        LinuxResourcesBuilder,
    };
    use std::collections::HashMap;

    fn get<'a>(props: &'a [Property], name: &str) -> Option<&'a Value> {
        props.iter().find(|p| p.name == name).map(|p| &p.value)
    }

    fn resources() -> LinuxResources {
        LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .shares(1024u64)
                    .quota(50_000i64)
                    .period(100_000u64)
                    .cpus("0-2,9")
                    .mems("0")
                    .build()
                    .unwrap(),
            )
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(256i64 << 20)
                    .swap(512i64 << 20)
                    .reservation(128i64 << 20)
                    .build()
                    .unwrap(),
            )
            .pids(LinuxPidsBuilder::default().limit(1024).build().unwrap())
            .block_io(
                LinuxBlockIoBuilder::default()
                    .weight(300u16)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn v2_properties() {
        let (p, quota) = resource_properties(&resources(), Hierarchy::V2, 252).unwrap();
        assert_eq!(get(&p, "MemoryMax"), Some(&Value::U64(256 << 20)));
        assert_eq!(get(&p, "MemoryLow"), Some(&Value::U64(128 << 20)));
        assert_eq!(get(&p, "MemorySwapMax"), Some(&Value::U64(256 << 20)));
        assert_eq!(get(&p, "CPUWeight"), Some(&Value::U64(100)));
        assert_eq!(get(&p, "CPUQuotaPerSecUSec"), Some(&Value::U64(500_000)));
        assert_eq!(get(&p, "CPUQuotaPeriodUSec"), Some(&Value::U64(100_000)));
        assert_eq!(get(&p, "TasksMax"), Some(&Value::U64(1024)));
        assert_eq!(
            get(&p, "AllowedCPUs"),
            Some(&Value::Bytes(vec![0b111, 0b10]))
        );
        assert_eq!(get(&p, "AllowedMemoryNodes"), Some(&Value::Bytes(vec![1])));
        assert_eq!(get(&p, "CPUShares"), None);
        assert_eq!(get(&p, "BlockIOWeight"), None);
        assert_eq!(quota, None);
    }

    #[test]
    fn v1_properties() {
        let (p, _) = resource_properties(&resources(), Hierarchy::V1, 247).unwrap();
        assert_eq!(get(&p, "MemoryLimit"), Some(&Value::U64(256 << 20)));
        assert_eq!(get(&p, "CPUShares"), Some(&Value::U64(1024)));
        assert_eq!(get(&p, "BlockIOWeight"), Some(&Value::U64(300)));
        assert_eq!(get(&p, "MemoryMax"), None);
        assert_eq!(get(&p, "MemorySwapMax"), None);
        assert_eq!(get(&p, "CPUWeight"), None);
    }

    #[test]
    fn old_systemds_get_fewer_properties() {
        let (p, _) = resource_properties(&resources(), Hierarchy::V2, 241).unwrap();
        assert_eq!(get(&p, "CPUQuotaPeriodUSec"), None);
        assert_eq!(get(&p, "AllowedCPUs"), None);
        assert_eq!(get(&p, "CPUQuotaPerSecUSec"), Some(&Value::U64(500_000)));
    }

    #[test]
    fn quota_is_rounded_and_reported() {
        let r = LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .quota(12_345i64)
                    .period(100_000u64)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let (p, quota) = resource_properties(&r, Hierarchy::V2, 252).unwrap();
        assert_eq!(get(&p, "CPUQuotaPerSecUSec"), Some(&Value::U64(130_000)));
        assert_eq!(quota, Some(13_000));
        let unlimited = LinuxResourcesBuilder::default()
            .cpu(LinuxCpuBuilder::default().quota(-1i64).build().unwrap())
            .memory(LinuxMemoryBuilder::default().limit(-1i64).build().unwrap())
            .pids(LinuxPidsBuilder::default().limit(-1).build().unwrap())
            .build()
            .unwrap();
        let (p, _) = resource_properties(&unlimited, Hierarchy::V2, 252).unwrap();
        assert_eq!(get(&p, "CPUQuotaPerSecUSec"), Some(&Value::U64(INFINITY)));
        assert_eq!(get(&p, "MemoryMax"), Some(&Value::U64(INFINITY)));
        assert_eq!(get(&p, "MemorySwapMax"), Some(&Value::U64(INFINITY)));
        assert_eq!(get(&p, "TasksMax"), Some(&Value::U64(INFINITY)));
    }

    #[test]
    fn idle_takes_cpu_weight() {
        let r = LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .idle(1i64)
                    .shares(2048u64)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let (p, _) = resource_properties(&r, Hierarchy::V2, 252).unwrap();
        let weights: Vec<_> = p.iter().filter(|p| p.name == "CPUWeight").collect();
        assert_eq!(weights.len(), 1);
        assert_eq!(weights[0].value, Value::U64(0));
        let (p, _) = resource_properties(&r, Hierarchy::V2, 251).unwrap();
        assert_eq!(get(&p, "CPUWeight"), Some(&Value::U64(174)));
    }

    #[test]
    fn unified_keys_systemd_knows() {
        let r = LinuxResourcesBuilder::default()
            .unified(HashMap::from([
                ("memory.high".to_string(), "1000000".to_string()),
                ("memory.min".to_string(), "max".to_string()),
                ("pids.max".to_string(), "0".to_string()),
                ("cpu.max".to_string(), "25000 50000".to_string()),
                ("cpuset.cpus".to_string(), "1".to_string()),
                ("memory.oom.group".to_string(), "1".to_string()),
                ("io.weight".to_string(), "50".to_string()),
            ]))
            .build()
            .unwrap();
        let (p, _) = resource_properties(&r, Hierarchy::V2, 252).unwrap();
        assert_eq!(get(&p, "MemoryHigh"), Some(&Value::U64(1_000_000)));
        assert_eq!(get(&p, "MemoryMin"), Some(&Value::U64(INFINITY)));
        assert_eq!(get(&p, "TasksMax"), Some(&Value::U64(1)));
        assert_eq!(get(&p, "CPUQuotaPerSecUSec"), Some(&Value::U64(500_000)));
        assert_eq!(get(&p, "CPUQuotaPeriodUSec"), Some(&Value::U64(50_000)));
        assert_eq!(get(&p, "AllowedCPUs"), Some(&Value::Bytes(vec![0b10])));
        // Left to the cgroup files.
        assert_eq!(p.len(), 6, "{p:?}");
        assert_eq!(
            oom_policy(&r, 253).unwrap(),
            Some(prop("OOMPolicy", Value::Str("kill".into())))
        );
        assert_eq!(oom_policy(&r, 252).unwrap(), None);
        for (k, v) in [
            ("memory.high", "lots"),
            ("cpu.max", "1 2 3"),
            ("cpu.max", ""),
            ("cpu.weight", "x"),
        ] {
            let r = LinuxResourcesBuilder::default()
                .unified(HashMap::from([(k.to_string(), v.to_string())]))
                .build()
                .unwrap();
            let e = resource_properties(&r, Hierarchy::V2, 252).unwrap_err();
            assert!(
                e.is_invalid_argument() && e.to_string().contains(k),
                "{k}={v}: {e}"
            );
        }
    }

    #[test]
    fn base() {
        let p = base_properties("crust container abc".into(), Hierarchy::V2);
        assert_eq!(get(&p, "IOAccounting"), Some(&Value::Bool(true)));
        assert_eq!(get(&p, "DefaultDependencies"), Some(&Value::Bool(false)));
        let p = base_properties("x".into(), Hierarchy::Hybrid);
        assert_eq!(get(&p, "BlockIOAccounting"), Some(&Value::Bool(true)));
    }
}
