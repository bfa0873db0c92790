//! Conversions between the OCI (cgroup v1 shaped) resource values, cgroup
//! v2 values and systemd properties, as runc defines them.

use crate::error::{Error, Result, quote};

/// The kernel's default CFS period (µs), v1 and v2.
pub const DEFAULT_CPU_PERIOD: u64 = 100_000;

/// cpu.shares (v1, 2..=262144, default 1024) to cpu.weight (v2,
/// 1..=10000, default 100): the quadratic fit through those three points
/// in log2 space that runc, crun and kubelet use since 2025 (1024 -> 100,
/// the old linear formula gave 39). 0 means unset.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    if shares <= 2 {
        return 1;
    }
    if shares >= 262_144 {
        return 10_000;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    10f64.powf(exponent).ceil() as u64
}

/// blkio.weight (v1, 10..=1000) to io.weight (v2, 1..=10000), linearly.
/// 0 means unset.
pub fn blkio_weight_to_io_weight(weight: u16) -> u64 {
    if weight == 0 {
        return 0;
    }
    let w = u64::from(weight.max(10));
    1 + (w - 10) * 9999 / 990
}

/// The v2 `cpu.max` value for an OCI quota and period: `"<quota|max>
/// [period]"`; None when neither is set (quota 0 and period 0 mean unset,
/// a negative quota means no limit).
pub fn cpu_max(quota: Option<i64>, period: Option<u64>) -> Option<String> {
    let quota = quota.unwrap_or(0);
    let period = period.unwrap_or(0);
    if quota == 0 && period == 0 {
        return None;
    }
    let mut s = if quota > 0 {
        quota.to_string()
    } else {
        "max".to_string()
    };
    if period != 0 {
        s.push(' ');
        s.push_str(&period.to_string());
    }
    Some(s)
}

/// memory.swap.max from OCI's memory+swap `swap` and `limit`: v2 accounts
/// swap alone. Some(-1) is "max", Some(0) no swap, None unset.
pub fn swap_v2(swap: Option<i64>, limit: Option<i64>) -> Result<Option<i64>> {
    let swap = swap.unwrap_or(0);
    let limit = limit.unwrap_or(0);
    let bad = |why: &str| Err(Error::invalid("resources.memory.swap", why.to_string()));
    match (swap, limit) {
        // Unlimited memory with swap unset: unlimited swap too, as v1.
        (0, -1) => Ok(Some(-1)),
        (0, _) => Ok(None),
        (-1, _) => Ok(Some(-1)),
        (s, _) if s < -1 => bad("must be -1 (unlimited), 0 (unset) or positive"),
        (s, -1) => Ok(Some(s)),
        (_, 0) => bad("a swap limit needs a memory limit (it is memory+swap)"),
        (_, l) if l < 0 => Err(Error::invalid(
            "resources.memory.limit",
            format!("must be -1 (unlimited), 0 (unset) or positive, got {l}"),
        )),
        (s, l) if s < l => bad("memory+swap is less than the memory limit"),
        (s, l) => Ok(Some(s - l)),
    }
}

/// systemd's CPUQuotaPerSecUSec for a quota and period, and the quota to
/// write to the cgroup so that both agree: systemd keeps the quota as a
/// whole percent of a CPU, so a fraction is rounded up to the next 10 ms
/// per second (runc does the same). u64::MAX is "infinity".
pub fn cpu_quota_per_sec(quota: i64, period: u64) -> (u64, i64) {
    if quota <= 0 {
        return (u64::MAX, quota);
    }
    let period = if period == 0 {
        DEFAULT_CPU_PERIOD
    } else {
        period
    };
    let per_sec = (quota as u64).saturating_mul(1_000_000) / period;
    if per_sec.is_multiple_of(10_000) {
        return (per_sec, quota);
    }
    let rounded = (per_sec / 10_000 + 1) * 10_000;
    (
        rounded,
        (rounded as u128 * period as u128 / 1_000_000) as i64,
    )
}

/// The highest CPU or node number accepted in a list.
pub const MAX_CPU: u32 = 8191;

/// Parses a cpuset list (`0-3,8,10-11`) into its sorted ranges. Refuses
/// what the kernel would (empty items, reversed ranges, junk) up front.
pub fn parse_cpu_list(field: &str, list: &str) -> Result<Vec<(u32, u32)>> {
    let bad = || {
        Error::invalid(
            field.to_string(),
            format!("{} is not a CPU/node list like 0-3,8", quote(list)),
        )
    };
    if list.is_empty() || list.len() > 4096 {
        return Err(bad());
    }
    let num = |x: &str| -> Result<u32> {
        if x.is_empty() || x.len() > 5 || !x.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u32 = x.parse().map_err(|_| bad())?;
        if n > MAX_CPU {
            return Err(bad());
        }
        Ok(n)
    };
    let mut ranges = Vec::new();
    for item in list.split(',') {
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(bad());
        }
        ranges.push((a, b));
    }
    ranges.sort_unstable();
    Ok(ranges)
}

/// A cpuset list as systemd's AllowedCPUs / AllowedMemoryNodes byte mask:
/// bit `n % 8` of byte `n / 8` for CPU `n`, as long as the highest CPU
/// needs.
pub fn cpu_list_to_mask(field: &str, list: &str) -> Result<Vec<u8>> {
    let ranges = parse_cpu_list(field, list)?;
    let max = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let mut mask = vec![0u8; max as usize / 8 + 1];
    for (a, b) in ranges {
        for n in a..=b {
            mask[n as usize / 8] |= 1 << (n % 8);
        }
    }
    Ok(mask)
}

/// A hugepage size as kubelet and runc write it (`2MB`, `1GB`, `64KB`),
/// which is also how hugetlb control files are named.
pub fn check_page_size(field: &str, size: &str) -> Result<()> {
    let digits = size.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &size[digits.len()..];
    let ok = !digits.is_empty()
        && digits.len() <= 6
        && digits.bytes().all(|c| c.is_ascii_digit())
        && !digits.starts_with('0')
        && matches!(unit, "KB" | "MB" | "GB" | "TB" | "PB");
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            field.to_string(),
            format!("{} is not a page size like 2MB or 1GB", quote(size)),
        ))
    }
}

/// A page size in kB from /sys/kernel/mm/hugepages (`hugepages-2048kB`) as
/// the hugetlb file name part (`2MB`).
pub fn page_size_name(kb: u64) -> String {
    const UNITS: [&str; 5] = ["KB", "MB", "GB", "TB", "PB"];
    let mut size = kb;
    let mut unit = 0;
    while size >= 1024 && size.is_multiple_of(1024) && unit + 1 < UNITS.len() {
        size /= 1024;
        unit += 1;
    }
    format!("{size}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_to_weight_fits_runc() {
        // The fixed points (min, just above, default, just below max, max,
        // out of range) and a few values worked out by hand.
        for (shares, weight) in [
            (0, 0),
            (1, 1),
            (2, 1),
            (3, 2),
            (1024, 100),
            (262_143, 10_000),
            (262_144, 10_000),
            (300_000, 10_000),
            (512, 59),
            (2048, 174),
            (102, 17),
        ] {
            assert_eq!(shares_to_weight(shares), weight, "shares {shares}");
        }
        // Monotonic over the range.
        let mut last = 0;
        for s in (2..262_144).step_by(97) {
            let w = shares_to_weight(s);
            assert!(w >= last && (1..=10_000).contains(&w), "{s} -> {w}");
            last = w;
        }
    }

    #[test]
    fn blkio_weights() {
        assert_eq!(blkio_weight_to_io_weight(0), 0);
        assert_eq!(blkio_weight_to_io_weight(10), 1);
        assert_eq!(blkio_weight_to_io_weight(500), 4950);
        assert_eq!(blkio_weight_to_io_weight(1000), 10_000);
    }

    #[test]
    fn cpu_max_strings() {
        assert_eq!(cpu_max(None, None), None);
        assert_eq!(cpu_max(Some(0), Some(0)), None);
        assert_eq!(
            cpu_max(Some(50_000), Some(100_000)).unwrap(),
            "50000 100000"
        );
        assert_eq!(cpu_max(Some(50_000), None).unwrap(), "50000");
        assert_eq!(cpu_max(Some(-1), Some(100_000)).unwrap(), "max 100000");
        assert_eq!(cpu_max(Some(-1), None).unwrap(), "max");
        assert_eq!(cpu_max(None, Some(20_000)).unwrap(), "max 20000");
    }

    #[test]
    fn swap_conversion() {
        assert_eq!(swap_v2(None, None).unwrap(), None);
        assert_eq!(swap_v2(Some(0), Some(-1)).unwrap(), Some(-1));
        assert_eq!(swap_v2(None, Some(100)).unwrap(), None);
        assert_eq!(swap_v2(Some(-1), Some(100)).unwrap(), Some(-1));
        assert_eq!(swap_v2(Some(300), Some(100)).unwrap(), Some(200));
        assert_eq!(swap_v2(Some(100), Some(100)).unwrap(), Some(0));
        assert_eq!(swap_v2(Some(300), Some(-1)).unwrap(), Some(300));
        assert!(swap_v2(Some(50), Some(100)).is_err());
        assert!(swap_v2(Some(50), None).is_err());
        assert!(swap_v2(Some(-2), Some(100)).is_err());
        assert!(swap_v2(Some(50), Some(-5)).is_err());
    }

    #[test]
    fn quota_per_second() {
        assert_eq!(cpu_quota_per_sec(50_000, 100_000), (500_000, 50_000));
        assert_eq!(cpu_quota_per_sec(50_000, 0), (500_000, 50_000));
        assert_eq!(cpu_quota_per_sec(-1, 100_000), (u64::MAX, -1));
        assert_eq!(cpu_quota_per_sec(0, 100_000), (u64::MAX, 0));
        // 0.5% of a CPU rounds up to 1%, and the cgroup quota with it.
        assert_eq!(cpu_quota_per_sec(500, 100_000), (10_000, 1000));
        assert_eq!(cpu_quota_per_sec(123_456, 100_000), (1_240_000, 124_000));
        assert_eq!(cpu_quota_per_sec(10_000, 50_000), (200_000, 10_000));
    }

    #[test]
    fn cpu_lists_and_masks() {
        assert_eq!(parse_cpu_list("f", "3,0-1").unwrap(), vec![(0, 1), (3, 3)]);
        assert_eq!(cpu_list_to_mask("f", "0").unwrap(), vec![0b1]);
        assert_eq!(cpu_list_to_mask("f", "0-3").unwrap(), vec![0x0f]);
        assert_eq!(cpu_list_to_mask("f", "1,3-5").unwrap(), vec![0b0011_1010]);
        assert_eq!(cpu_list_to_mask("f", "8").unwrap(), vec![0, 1]);
        assert_eq!(cpu_list_to_mask("f", "0,15").unwrap(), vec![1, 0x80]);
        assert_eq!(cpu_list_to_mask("f", "7-9").unwrap(), vec![0x80, 0x03]);
        for bad in [
            "", "a", "0-", "-1", "3-1", "0,,1", "0\n1", "1 ", "0-1-2", "99999", "8192",
        ] {
            let e = parse_cpu_list("resources.cpu.cpus", bad).unwrap_err();
            assert!(e.to_string().contains("resources.cpu.cpus"), "{bad:?}");
        }
    }

    #[test]
    fn page_sizes() {
        for ok in ["2MB", "1GB", "64KB", "16GB"] {
            check_page_size("f", ok).unwrap();
        }
        for bad in [
            "2M",
            "MB",
            "2MB/../x",
            "02MB",
            "2mb",
            "",
            "1234567MB",
            "2 MB",
        ] {
            assert!(check_page_size("f", bad).is_err(), "{bad:?}");
        }
        assert_eq!(page_size_name(2048), "2MB");
        assert_eq!(page_size_name(1_048_576), "1GB");
        assert_eq!(page_size_name(64), "64KB");
        assert_eq!(page_size_name(1536), "1536KB");
    }
}
