//! cgroup resources (cpu, cpuset, memory, swap, hugepages, unified) and
//! oom_score_adj, as containerd maps LinuxContainerResources.

use std::collections::HashMap;

use crust_api::v1::LinuxContainerResources;
use crust_quote::quote_os;
use oci_spec::runtime::{LinuxCpu, LinuxHugepageLimit, LinuxMemory, LinuxResources};

use crate::{RuntimeFacts, SpecError};

const F: &str = "config.linux.resources";

/// A cpuset list: `0-3,8,10-11`.
fn cpuset(field: &str, s: &str) -> Result<(), SpecError> {
    let bad = || {
        SpecError::invalid(
            field,
            format!("{s} is not a CPU/node list like 0-3,8", s = quote_os(&s)),
        )
    };
    if s.len() > 4096 {
        return Err(bad());
    }
    for item in s.split(',') {
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let num = |x: &str| -> Result<u32, SpecError> {
            if x.is_empty() || x.len() > 9 || !x.bytes().all(|c| c.is_ascii_digit()) {
                return Err(bad());
            }
            x.parse().map_err(|_| bad())
        };
        if num(a)? > num(b)? {
            return Err(bad());
        }
    }
    Ok(())
}

/// A hugepage size as kubelet and runc write it: `2MB`, `1GB`, `64KB`.
fn page_size(field: &str, s: &str) -> Result<(), SpecError> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[digits.len()..];
    let ok = !digits.is_empty()
        && digits.len() <= 6
        && digits.bytes().all(|c| c.is_ascii_digit())
        && matches!(unit, "KB" | "MB" | "GB" | "TB" | "PB");
    if !ok {
        return Err(SpecError::invalid(
            field,
            format!("{s} is not a page size like 2MB or 1GB", s = quote_os(&s)),
        ));
    }
    Ok(())
}

/// A cgroup v2 interface file name for `unified`: `<controller>.<name>`,
/// lowercase letters, digits, `_` and `.`, not a `cgroup.*` core file
/// (cgroup.procs, cgroup.subtree_control... would let a request move
/// processes or change the hierarchy).
fn unified_key(field: &str, k: &str) -> Result<(), SpecError> {
    let ok = k.len() <= 255
        && k.split_once('.')
            .is_some_and(|(c, rest)| !c.is_empty() && !rest.is_empty())
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.'))
        && !k.contains("..")
        && !k.ends_with('.');
    if !ok {
        return Err(SpecError::invalid(
            field,
            format!(
                "{k} is not a cgroup v2 file name like memory.high",
                k = quote_os(&k)
            ),
        ));
    }
    if k.starts_with("cgroup.") {
        return Err(SpecError::invalid(
            field,
            format!("{k}: cgroup core files cannot be set", k = quote_os(&k)),
        ));
    }
    Ok(())
}

/// LinuxResources (without devices) for a container.
pub(crate) fn container_resources(
    res: Option<&LinuxContainerResources>,
    runtime: &RuntimeFacts,
) -> Result<LinuxResources, SpecError> {
    let mut out = LinuxResources::default();
    let Some(r) = res else {
        return Ok(out);
    };

    // CPU
    let mut cpu = LinuxCpu::default();
    let mut any_cpu = false;
    if r.cpu_period < 0 {
        return Err(SpecError::invalid(
            format!("{F}.cpu_period"),
            format!("must not be negative, got {}", r.cpu_period),
        ));
    }
    if r.cpu_period != 0 {
        cpu.set_period(Some(r.cpu_period as u64));
        any_cpu = true;
    }
    if r.cpu_quota < -1 {
        return Err(SpecError::invalid(
            format!("{F}.cpu_quota"),
            format!("must be -1 (unlimited) or positive, got {}", r.cpu_quota),
        ));
    }
    if r.cpu_quota != 0 {
        cpu.set_quota(Some(r.cpu_quota));
        any_cpu = true;
    }
    if r.cpu_shares < 0 {
        return Err(SpecError::invalid(
            format!("{F}.cpu_shares"),
            format!("must not be negative, got {}", r.cpu_shares),
        ));
    }
    if r.cpu_shares != 0 {
        cpu.set_shares(Some(r.cpu_shares as u64));
        any_cpu = true;
    }
    if !r.cpuset_cpus.is_empty() {
        cpuset(&format!("{F}.cpuset_cpus"), &r.cpuset_cpus)?;
        cpu.set_cpus(Some(r.cpuset_cpus.clone()));
        any_cpu = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpuset(&format!("{F}.cpuset_mems"), &r.cpuset_mems)?;
        cpu.set_mems(Some(r.cpuset_mems.clone()));
        any_cpu = true;
    }
    if any_cpu {
        out.set_cpu(Some(cpu));
    }

    // Memory. OCI `swap` is memory+swap, as CRI's memory_swap_limit_in_bytes.
    let limit = r.memory_limit_in_bytes;
    let swap = r.memory_swap_limit_in_bytes;
    if limit < 0 {
        return Err(SpecError::invalid(
            format!("{F}.memory_limit_in_bytes"),
            format!("must not be negative, got {limit}"),
        ));
    }
    if swap < -1 {
        return Err(SpecError::invalid(
            format!("{F}.memory_swap_limit_in_bytes"),
            format!("must be -1 (unlimited), 0 (unset) or positive, got {swap}"),
        ));
    }
    if swap > 0 && limit > 0 && swap < limit {
        return Err(SpecError::invalid(
            format!("{F}.memory_swap_limit_in_bytes"),
            format!("{swap} is less than memory_limit_in_bytes {limit} (it is memory+swap)"),
        ));
    }
    let mut mem = LinuxMemory::default();
    let mut any_mem = false;
    if limit != 0 {
        mem.set_limit(Some(limit));
        any_mem = true;
        // No swap unless asked for, when swap is accounted at all.
        if swap == 0 && runtime.swap_available {
            mem.set_swap(Some(limit));
        }
    }
    if swap != 0 && runtime.swap_available {
        mem.set_swap(Some(swap));
        any_mem = true;
    }
    if any_mem {
        out.set_memory(Some(mem));
    }

    // Hugepages: skipped without the hugetlb controller (containerd's
    // tolerate_missing_hugetlb_controller default).
    if !r.hugepage_limits.is_empty() {
        let mut limits = Vec::new();
        for (i, h) in r.hugepage_limits.iter().enumerate() {
            page_size(&format!("{F}.hugepage_limits[{i}].page_size"), &h.page_size)?;
            let l = i64::try_from(h.limit).map_err(|_| {
                SpecError::invalid(
                    format!("{F}.hugepage_limits[{i}].limit"),
                    format!("{} is too large", h.limit),
                )
            })?;
            let mut hl = LinuxHugepageLimit::default();
            hl.set_page_size(h.page_size.clone());
            hl.set_limit(l);
            limits.push(hl);
        }
        if runtime.hugetlb_available {
            out.set_hugepage_limits(Some(limits));
        }
    }

    // Unified (cgroup v2 only).
    if !r.unified.is_empty() {
        if !runtime.cgroup_v2 {
            return Err(SpecError::unsupported(
                format!("{F}.unified"),
                "unified cgroup resources on a cgroup v1 host",
            ));
        }
        let mut unified = HashMap::new();
        for (k, v) in &r.unified {
            let field = format!("{F}.unified[{k}]", k = quote_os(&k));
            unified_key(&field, k)?;
            if v.contains(['\0', '\n']) || v.len() > 4096 {
                return Err(SpecError::invalid(
                    field,
                    "value must be at most 4096 bytes without NUL or newline",
                ));
            }
            unified.insert(k.clone(), v.clone());
        }
        out.set_unified(Some(unified));
    }
    Ok(out)
}

/// The process's oom_score_adj: the request's, raised to the daemon's own
/// (`min`) since lowering it needs CAP_SYS_RESOURCE. None without resources.
pub(crate) fn oom_score_adj(
    res: Option<&LinuxContainerResources>,
    min: i64,
) -> Result<Option<i32>, SpecError> {
    let Some(r) = res else {
        return Ok(None);
    };
    if !(-1000..=1000).contains(&r.oom_score_adj) {
        return Err(SpecError::invalid(
            format!("{F}.oom_score_adj"),
            format!("must be between -1000 and 1000, got {}", r.oom_score_adj),
        ));
    }
    Ok(Some(r.oom_score_adj.max(min.clamp(-1000, 1000)) as i32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::HugepageLimit;

    fn facts() -> RuntimeFacts {
        RuntimeFacts::default()
    }

    #[test]
    fn none_is_empty() {
        let r = container_resources(None, &facts()).unwrap();
        assert_eq!(r, LinuxResources::default());
        assert_eq!(oom_score_adj(None, -500).unwrap(), None);
    }

    #[test]
    fn zero_values_set_nothing() {
        let r = container_resources(Some(&LinuxContainerResources::default()), &facts()).unwrap();
        assert!(r.cpu().is_none());
        assert!(r.memory().is_none());
        assert!(r.hugepage_limits().is_none());
        assert!(r.unified().is_none());
    }

    #[test]
    fn cpu_fields() {
        let res = LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            cpuset_cpus: "0-1,3".into(),
            cpuset_mems: "0".into(),
            ..Default::default()
        };
        let r = container_resources(Some(&res), &facts()).unwrap();
        let cpu = r.cpu().clone().unwrap();
        assert_eq!(cpu.period(), Some(100_000));
        assert_eq!(cpu.quota(), Some(50_000));
        assert_eq!(cpu.shares(), Some(512));
        assert_eq!(cpu.cpus().as_deref(), Some("0-1,3"));
        assert_eq!(cpu.mems().as_deref(), Some("0"));
    }

    #[test]
    fn unlimited_quota() {
        let res = LinuxContainerResources {
            cpu_quota: -1,
            ..Default::default()
        };
        let r = container_resources(Some(&res), &facts()).unwrap();
        assert_eq!(r.cpu().clone().unwrap().quota(), Some(-1));
    }

    #[test]
    fn bad_cpu_values() {
        for (res, field) in [
            (
                LinuxContainerResources {
                    cpu_period: -1,
                    ..Default::default()
                },
                "cpu_period",
            ),
            (
                LinuxContainerResources {
                    cpu_quota: -2,
                    ..Default::default()
                },
                "cpu_quota",
            ),
            (
                LinuxContainerResources {
                    cpu_shares: -5,
                    ..Default::default()
                },
                "cpu_shares",
            ),
        ] {
            let e = container_resources(Some(&res), &facts()).unwrap_err();
            assert_eq!(e.field(), format!("config.linux.resources.{field}"));
        }
    }

    #[test]
    fn cpuset_syntax() {
        for ok in ["0", "0-3", "0,2,4", "0-1,5-7", "12"] {
            assert!(cpuset("f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "a",
            "0-",
            "-1",
            "3-1",
            "0,,1",
            "0\n1",
            "1 ",
            "0-1-2",
            "9999999999",
        ] {
            assert!(cpuset("f", bad).is_err(), "{bad:?}");
        }
        let res = LinuxContainerResources {
            cpuset_mems: "0;echo".into(),
            ..Default::default()
        };
        let e = container_resources(Some(&res), &facts()).unwrap_err();
        assert_eq!(e.field(), "config.linux.resources.cpuset_mems");
    }

    #[test]
    fn memory_limit_sets_swap_equal() {
        let res = LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        };
        let m = container_resources(Some(&res), &facts())
            .unwrap()
            .memory()
            .unwrap();
        assert_eq!(m.limit(), Some(64 << 20));
        assert_eq!(m.swap(), Some(64 << 20));
        let no_swap = RuntimeFacts {
            swap_available: false,
            ..facts()
        };
        let m = container_resources(Some(&res), &no_swap)
            .unwrap()
            .memory()
            .unwrap();
        assert_eq!(m.limit(), Some(64 << 20));
        assert_eq!(m.swap(), None);
    }

    #[test]
    fn memory_swap_limit() {
        let res = LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 128 << 20,
            ..Default::default()
        };
        let m = container_resources(Some(&res), &facts())
            .unwrap()
            .memory()
            .unwrap();
        assert_eq!(m.swap(), Some(128 << 20));
        let res = LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: -1,
            ..Default::default()
        };
        let m = container_resources(Some(&res), &facts())
            .unwrap()
            .memory()
            .unwrap();
        assert_eq!(m.swap(), Some(-1));
    }

    #[test]
    fn bad_memory_values() {
        for (limit, swap, field) in [
            (-1, 0, "memory_limit_in_bytes"),
            (0, -2, "memory_swap_limit_in_bytes"),
            (100 << 20, 50 << 20, "memory_swap_limit_in_bytes"),
        ] {
            let res = LinuxContainerResources {
                memory_limit_in_bytes: limit,
                memory_swap_limit_in_bytes: swap,
                ..Default::default()
            };
            let e = container_resources(Some(&res), &facts()).unwrap_err();
            assert_eq!(e.field(), format!("config.linux.resources.{field}"));
        }
    }

    #[test]
    fn hugepages() {
        let res = LinuxContainerResources {
            hugepage_limits: vec![
                HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 << 20,
                },
                HugepageLimit {
                    page_size: "1GB".into(),
                    limit: 0,
                },
            ],
            ..Default::default()
        };
        let r = container_resources(Some(&res), &facts()).unwrap();
        let h = r.hugepage_limits().clone().unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].page_size(), "2MB");
        assert_eq!(h[0].limit(), 4 << 20);
        assert_eq!(h[1].page_size(), "1GB");
        let without = RuntimeFacts {
            hugetlb_available: false,
            ..facts()
        };
        assert!(
            container_resources(Some(&res), &without)
                .unwrap()
                .hugepage_limits()
                .is_none()
        );
    }

    #[test]
    fn bad_hugepages() {
        for (size, limit, field) in [
            ("2M", 1, "page_size"),
            ("MB", 1, "page_size"),
            ("2MB/../x", 1, "page_size"),
            ("2MB", u64::MAX, "limit"),
        ] {
            let res = LinuxContainerResources {
                hugepage_limits: vec![HugepageLimit {
                    page_size: size.into(),
                    limit,
                }],
                ..Default::default()
            };
            let e = container_resources(Some(&res), &facts()).unwrap_err();
            assert_eq!(
                e.field(),
                format!("config.linux.resources.hugepage_limits[0].{field}")
            );
        }
    }

    #[test]
    fn unified_on_v2() {
        let res = LinuxContainerResources {
            unified: [("memory.high".to_string(), "1000000".to_string())].into(),
            ..Default::default()
        };
        let r = container_resources(Some(&res), &facts()).unwrap();
        assert_eq!(r.unified().clone().unwrap()["memory.high"], "1000000");
    }

    #[test]
    fn unified_on_v1_is_error() {
        let res = LinuxContainerResources {
            unified: [("memory.high".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let v1 = RuntimeFacts {
            cgroup_v2: false,
            ..facts()
        };
        let e = container_resources(Some(&res), &v1).unwrap_err();
        assert_eq!(e.field(), "config.linux.resources.unified");
    }

    #[test]
    fn unified_rejects_bad_keys_and_values() {
        for k in [
            "memory",
            "../memory.high",
            "memory/high",
            "cgroup.procs",
            "cgroup.subtree_control",
            "Memory.High",
            "memory..high",
            "memory.",
            ".high",
        ] {
            assert!(unified_key("f", k).is_err(), "{k:?}");
        }
        let res = LinuxContainerResources {
            unified: [("memory.high".to_string(), "1\nmax".to_string())].into(),
            ..Default::default()
        };
        let e = container_resources(Some(&res), &facts()).unwrap_err();
        assert_eq!(e.field(), "config.linux.resources.unified[\"memory.high\"]");
    }

    #[test]
    fn oom_score_adj_clamped_to_min() {
        let res = LinuxContainerResources {
            oom_score_adj: -998,
            ..Default::default()
        };
        assert_eq!(oom_score_adj(Some(&res), -500).unwrap(), Some(-500));
        assert_eq!(oom_score_adj(Some(&res), -1000).unwrap(), Some(-998));
        let res = LinuxContainerResources {
            oom_score_adj: 1000,
            ..Default::default()
        };
        assert_eq!(oom_score_adj(Some(&res), -500).unwrap(), Some(1000));
        let res = LinuxContainerResources::default();
        assert_eq!(oom_score_adj(Some(&res), 0).unwrap(), Some(0));
    }

    #[test]
    fn oom_score_adj_range() {
        for bad in [-1001, 1001] {
            let res = LinuxContainerResources {
                oom_score_adj: bad,
                ..Default::default()
            };
            let e = oom_score_adj(Some(&res), -1000).unwrap_err();
            assert_eq!(e.field(), "config.linux.resources.oom_score_adj");
        }
    }
}
