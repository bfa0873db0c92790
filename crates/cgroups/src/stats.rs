//! Resource usage of a cgroup as kubelet and cadvisor read it, for v1 and
//! v2, plus PSI where the kernel exposes `*.pressure` files. Only what is
//! asked for is read, one open per file, into one reused buffer, parsed by
//! splitting: ListPodSandboxMetrics reads this for every pod every 10 s.

use crate::convert::page_size_name;
use crate::dir::CgroupDir;
use crate::error::{Error, Result};

/// Which groups of figures to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsRequest {
    /// Total CPU time.
    pub cpu: bool,
    /// User/system split and CFS throttling (on v1 two more files).
    pub cpu_details: bool,
    /// Usage, limit, working set and the memory.stat figures.
    pub memory: bool,
    /// Peak, swap, kernel memory, limit hits and OOM events (v1: five
    /// more files, v2: three).
    pub memory_details: bool,
    pub pids: bool,
    pub io: bool,
    pub hugetlb: bool,
    /// cpu/memory/io `*.pressure` (v2, or the hybrid cgroup2 side).
    pub psi: bool,
}

impl StatsRequest {
    /// Everything.
    pub const ALL: StatsRequest = StatsRequest {
        cpu: true,
        cpu_details: true,
        memory: true,
        memory_details: true,
        pids: true,
        io: true,
        hugetlb: true,
        psi: true,
    };
    /// CPU and memory, lean: what ContainerStats and PodSandboxStats need.
    pub const CPU_MEMORY: StatsRequest = StatsRequest {
        cpu: true,
        cpu_details: false,
        memory: true,
        memory_details: false,
        pids: false,
        io: false,
        hugetlb: false,
        psi: false,
    };
    pub const NONE: StatsRequest = StatsRequest {
        cpu: false,
        cpu_details: false,
        memory: false,
        memory_details: false,
        pids: false,
        io: false,
        hugetlb: false,
        psi: false,
    };
}

/// The figures read; a group is None when not asked for or when its
/// controller is not there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub pids: Option<PidsStats>,
    pub io: Option<IoStats>,
    pub hugetlb: Vec<HugetlbStats>,
    pub psi: Option<PsiStats>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Total CPU time, ns.
    pub usage_ns: u64,
    /// User and system time, ns (v1: from USER_HZ ticks); 0 unless
    /// asked for on v1.
    pub user_ns: u64,
    pub system_ns: u64,
    /// CFS bandwidth periods, and those throttled.
    pub periods: u64,
    pub throttled_periods: u64,
    /// Time throttled, ns.
    pub throttled_ns: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// memory.current / memory.usage_in_bytes.
    pub usage: u64,
    /// None: no limit.
    pub limit: Option<u64>,
    /// Peak usage where the kernel keeps it (v2 memory.peak, v1
    /// max_usage_in_bytes).
    pub max_usage: Option<u64>,
    /// usage - inactive_file, at least 0: what kubelet evicts on.
    pub working_set: u64,
    /// Anonymous memory (v2 anon, v1 total_rss).
    pub rss: u64,
    /// Page cache (v2 file, v1 total_cache).
    pub cache: u64,
    pub inactive_file: u64,
    pub active_file: u64,
    pub mapped_file: u64,
    pub shmem: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// Swap in use (v2 memory.swap.current, v1 memsw - usage), when
    /// accounted.
    pub swap: Option<u64>,
    /// Swap limit (v2 memory.swap.max; v1 memsw limit less the memory
    /// limit), None when unlimited or not accounted.
    pub swap_limit: Option<u64>,
    /// Kernel memory (v2 `kernel` of memory.stat, or its parts on older
    /// kernels; v1 kmem usage).
    pub kernel: Option<u64>,
    /// Times the limit was hit (v2 memory.events `max`, v1 failcnt).
    /// This and the two below: None unless `memory_details` was asked.
    pub limit_hits: Option<u64>,
    /// OOM events (v2 `oom`; v1 under_oom episodes are not counted, so
    /// the OOM kills stand in).
    pub oom_events: Option<u64>,
    /// Processes the OOM killer killed (v2 `oom_kill`, v1 oom_control
    /// `oom_kill`, kernel 4.13+).
    pub oom_kills: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PidsStats {
    pub current: u64,
    /// None: no limit.
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoStats {
    pub devices: Vec<IoDeviceStats>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoDeviceStats {
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ios: u64,
    pub write_ios: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HugetlbStats {
    /// `2MB`, `1GB`.
    pub page_size: String,
    pub usage: u64,
    pub max_usage: Option<u64>,
    /// Allocations refused at the limit.
    pub failcnt: u64,
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiStats {
    pub cpu: Option<Pressure>,
    pub memory: Option<Pressure>,
    pub io: Option<Pressure>,
}

/// One `*.pressure` file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub some: PressureLine,
    /// Absent from cpu.pressure on kernels before 5.13.
    pub full: Option<PressureLine>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PressureLine {
    /// Percent of time stalled over 10 s, 60 s, 300 s.
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time, µs.
    pub total_us: u64,
}

/// Values at or above this are "no limit" (v1 writes PAGE_COUNTER_MAX
/// times the page size, 0x7ffffffffffff000 on x86-64).
const UNLIMITED: u64 = 1 << 62;

/// USER_HZ: cpuacct.stat counts in these ticks on every Linux ABI.
const NS_PER_TICK: u64 = 10_000_000;

// ---------------------------------------------------------------------
// Parsers: plain splitting over bytes, no allocation.

fn text(buf: &[u8]) -> &str {
    // Control files are ASCII; anything else cannot parse anyway.
    std::str::from_utf8(buf).unwrap_or("")
}

/// Calls `f(key, value)` for each `key value` line (cpu.stat, memory.stat,
/// memory.events, cpuacct.stat ...). Lines whose value is not a number are
/// skipped.
pub fn parse_flat_keyed(buf: &[u8], mut f: impl FnMut(&str, u64)) {
    for line in text(buf).lines() {
        let mut parts = line.split_ascii_whitespace();
        if let (Some(k), Some(v)) = (parts.next(), parts.next())
            && let Ok(v) = v.parse()
        {
            f(k, v);
        }
    }
}

/// A single number, or `max` (None).
pub fn parse_limit(buf: &[u8]) -> Result<Option<u64>, String> {
    let s = text(buf).trim();
    if s == "max" {
        return Ok(None);
    }
    let v: u64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    Ok((v < UNLIMITED).then_some(v))
}

fn parse_u64(buf: &[u8]) -> Result<u64, String> {
    let s = text(buf).trim();
    s.parse().map_err(|_| format!("{s:?} is not a number"))
}

/// A PSI file: `some avg10=0.00 avg60=0.00 avg300=0.00 total=0` and
/// optionally a `full ...` line.
pub fn parse_pressure(buf: &[u8]) -> Result<Pressure, String> {
    let mut some = None;
    let mut full = None;
    for line in text(buf).lines() {
        let mut parts = line.split_ascii_whitespace();
        let kind = parts.next();
        let mut p = PressureLine::default();
        let mut seen = 0;
        for field in parts {
            let Some((k, v)) = field.split_once('=') else {
                continue;
            };
            let bad = || format!("bad PSI field {field:?}");
            match k {
                "avg10" => p.avg10 = v.parse().map_err(|_| bad())?,
                "avg60" => p.avg60 = v.parse().map_err(|_| bad())?,
                "avg300" => p.avg300 = v.parse().map_err(|_| bad())?,
                "total" => p.total_us = v.parse().map_err(|_| bad())?,
                _ => continue,
            }
            seen += 1;
        }
        if seen != 4 {
            return Err(format!("incomplete PSI line {line:?}"));
        }
        match kind {
            Some("some") => some = Some(p),
            Some("full") => full = Some(p),
            _ => {}
        }
    }
    Ok(Pressure {
        some: some.ok_or("no \"some\" line")?,
        full,
    })
}

fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// v2 io.stat: `8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0`.
pub fn parse_io_stat(buf: &[u8], out: &mut Vec<IoDeviceStats>) {
    for line in text(buf).lines() {
        let mut parts = line.split_ascii_whitespace();
        let Some((major, minor)) = parts.next().and_then(parse_dev) else {
            continue;
        };
        let mut d = IoDeviceStats {
            major,
            minor,
            ..Default::default()
        };
        for field in parts {
            let Some((k, v)) = field.split_once('=') else {
                continue;
            };
            let v = v.parse().unwrap_or(0);
            match k {
                "rbytes" => d.read_bytes = v,
                "wbytes" => d.write_bytes = v,
                "rios" => d.read_ios = v,
                "wios" => d.write_ios = v,
                _ => {}
            }
        }
        out.push(d);
    }
}

/// v1 blkio: `8:0 Read 4096` lines (and a `Total` line); `bytes` says
/// whether these are bytes or operations.
pub fn parse_blkio(buf: &[u8], bytes: bool, out: &mut Vec<IoDeviceStats>) {
    for line in text(buf).lines() {
        let mut parts = line.split_ascii_whitespace();
        let (Some(dev), Some(op), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some((major, minor)) = parse_dev(dev) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else {
            continue;
        };
        let i = match out
            .iter()
            .position(|d| d.major == major && d.minor == minor)
        {
            Some(i) => i,
            None => {
                out.push(IoDeviceStats {
                    major,
                    minor,
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        let d = &mut out[i];
        match (op, bytes) {
            ("Read", true) => d.read_bytes = v,
            ("Write", true) => d.write_bytes = v,
            ("Read", false) => d.read_ios = v,
            ("Write", false) => d.write_ios = v,
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------
// Readers.

/// Reads `name` from `dir` into `buf`; Ok(false) when absent.
fn read(dir: &CgroupDir, name: &str, buf: &mut Vec<u8>) -> Result<bool> {
    dir.read_into(name, buf)
        .map_err(Error::io("read", dir.file_path(name)))
}

fn parse_err(dir: &CgroupDir, name: &str, why: String) -> Error {
    Error::Parse {
        path: dir.file_path(name),
        why,
    }
}

fn read_u64(dir: &CgroupDir, name: &str, buf: &mut Vec<u8>) -> Result<Option<u64>> {
    if !read(dir, name, buf)? {
        return Ok(None);
    }
    parse_u64(buf)
        .map(Some)
        .map_err(|e| parse_err(dir, name, e))
}

fn read_limit(dir: &CgroupDir, name: &str, buf: &mut Vec<u8>) -> Result<Option<Option<u64>>> {
    if !read(dir, name, buf)? {
        return Ok(None);
    }
    parse_limit(buf)
        .map(Some)
        .map_err(|e| parse_err(dir, name, e))
}

pub(crate) fn cpu_v2(dir: &CgroupDir, buf: &mut Vec<u8>) -> Result<Option<CpuStats>> {
    if !read(dir, "cpu.stat", buf)? {
        return Ok(None);
    }
    let mut c = CpuStats::default();
    parse_flat_keyed(buf, |k, v| match k {
        "usage_usec" => c.usage_ns = v.saturating_mul(1000),
        "user_usec" => c.user_ns = v.saturating_mul(1000),
        "system_usec" => c.system_ns = v.saturating_mul(1000),
        "nr_periods" => c.periods = v,
        "nr_throttled" => c.throttled_periods = v,
        "throttled_usec" => c.throttled_ns = v.saturating_mul(1000),
        _ => {}
    });
    Ok(Some(c))
}

/// v1: `cpuacct` for usage, `cpu` for throttling (separate mounts on some
/// hosts, co-mounted on others).
pub(crate) fn cpu_v1(
    cpuacct: Option<&CgroupDir>,
    cpu: Option<&CgroupDir>,
    details: bool,
    buf: &mut Vec<u8>,
) -> Result<Option<CpuStats>> {
    let Some(acct) = cpuacct else {
        return Ok(None);
    };
    let mut c = CpuStats {
        usage_ns: read_u64(acct, "cpuacct.usage", buf)?.unwrap_or(0),
        ..Default::default()
    };
    if !details {
        return Ok(Some(c));
    }
    if read(acct, "cpuacct.stat", buf)? {
        parse_flat_keyed(buf, |k, v| match k {
            "user" => c.user_ns = v.saturating_mul(NS_PER_TICK),
            "system" => c.system_ns = v.saturating_mul(NS_PER_TICK),
            _ => {}
        });
    }
    if let Some(cpu) = cpu
        && read(cpu, "cpu.stat", buf)?
    {
        parse_flat_keyed(buf, |k, v| match k {
            "nr_periods" => c.periods = v,
            "nr_throttled" => c.throttled_periods = v,
            "throttled_time" => c.throttled_ns = v,
            _ => {}
        });
    }
    Ok(Some(c))
}

pub(crate) fn memory_v2(
    dir: &CgroupDir,
    details: bool,
    buf: &mut Vec<u8>,
) -> Result<Option<MemoryStats>> {
    // memory.stat exists wherever the controller is enabled (the root
    // too); memory.current does not exist in the root.
    if !read(dir, "memory.stat", buf)? {
        return Ok(None);
    }
    let mut m = MemoryStats::default();
    let (mut kernel, mut kernel_parts, mut have_kernel) = (0, 0, false);
    parse_flat_keyed(buf, |k, v| match k {
        "anon" => m.rss = v,
        "file" => m.cache = v,
        "inactive_file" => m.inactive_file = v,
        "active_file" => m.active_file = v,
        "file_mapped" => m.mapped_file = v,
        "shmem" => m.shmem = v,
        "pgfault" => m.page_faults = v,
        "pgmajfault" => m.major_page_faults = v,
        "kernel" => {
            kernel = v;
            have_kernel = true;
        }
        "kernel_stack" | "pagetables" | "sock" | "percpu" | "slab" => kernel_parts += v,
        _ => {}
    });
    m.kernel = Some(if have_kernel { kernel } else { kernel_parts });
    m.usage = read_u64(dir, "memory.current", buf)?.unwrap_or(0);
    m.limit = read_limit(dir, "memory.max", buf)?.flatten();
    m.working_set = m.usage.saturating_sub(m.inactive_file);
    if !details {
        return Ok(Some(m));
    }
    m.max_usage = read_u64(dir, "memory.peak", buf)?;
    m.swap = read_u64(dir, "memory.swap.current", buf)?;
    if m.swap.is_some() {
        m.swap_limit = read_limit(dir, "memory.swap.max", buf)?.flatten();
    }
    if read(dir, "memory.events", buf)? {
        let (mut max, mut oom, mut kills) = (0, 0, 0);
        parse_flat_keyed(buf, |k, v| match k {
            "max" => max = v,
            "oom" => oom = v,
            "oom_kill" => kills = v,
            _ => {}
        });
        (m.limit_hits, m.oom_events, m.oom_kills) = (Some(max), Some(oom), Some(kills));
    }
    Ok(Some(m))
}

pub(crate) fn memory_v1(
    dir: &CgroupDir,
    details: bool,
    buf: &mut Vec<u8>,
) -> Result<Option<MemoryStats>> {
    if !read(dir, "memory.stat", buf)? {
        return Ok(None);
    }
    let mut m = MemoryStats::default();
    let mut swap_total = None;
    // The total_ figures include the cgroup's descendants, as v2's do.
    parse_flat_keyed(buf, |k, v| match k {
        "total_rss" => m.rss = v,
        "total_cache" => m.cache = v,
        "total_inactive_file" => m.inactive_file = v,
        "total_active_file" => m.active_file = v,
        "total_mapped_file" => m.mapped_file = v,
        "total_shmem" => m.shmem = v,
        "total_pgfault" => m.page_faults = v,
        "total_pgmajfault" => m.major_page_faults = v,
        "total_swap" => swap_total = Some(v),
        _ => {}
    });
    m.usage = read_u64(dir, "memory.usage_in_bytes", buf)?.unwrap_or(0);
    m.limit = read_limit(dir, "memory.limit_in_bytes", buf)?.flatten();
    m.working_set = m.usage.saturating_sub(m.inactive_file);
    if !details {
        return Ok(Some(m));
    }
    m.max_usage = read_u64(dir, "memory.max_usage_in_bytes", buf)?;
    m.limit_hits = read_u64(dir, "memory.failcnt", buf)?;
    m.kernel = read_u64(dir, "memory.kmem.usage_in_bytes", buf)?;
    if let Some(memsw) = read_u64(dir, "memory.memsw.usage_in_bytes", buf)? {
        m.swap = Some(swap_total.unwrap_or(memsw.saturating_sub(m.usage)));
        let memsw_limit = read_limit(dir, "memory.memsw.limit_in_bytes", buf)?.flatten();
        m.swap_limit = match (memsw_limit, m.limit) {
            (Some(sw), Some(l)) => Some(sw.saturating_sub(l)),
            _ => None,
        };
    }
    if read(dir, "memory.oom_control", buf)? {
        let mut kills = 0;
        parse_flat_keyed(buf, |k, v| {
            if k == "oom_kill" {
                kills = v;
            }
        });
        (m.oom_events, m.oom_kills) = (Some(kills), Some(kills));
    }
    Ok(Some(m))
}

/// pids.current and pids.max (same names on v1 and v2).
pub(crate) fn pids(dir: &CgroupDir, buf: &mut Vec<u8>) -> Result<Option<PidsStats>> {
    let Some(current) = read_u64(dir, "pids.current", buf)? else {
        return Ok(None);
    };
    Ok(Some(PidsStats {
        current,
        limit: read_limit(dir, "pids.max", buf)?.flatten(),
    }))
}

pub(crate) fn io_v2(dir: &CgroupDir, buf: &mut Vec<u8>) -> Result<Option<IoStats>> {
    if !read(dir, "io.stat", buf)? {
        return Ok(None);
    }
    let mut io = IoStats::default();
    parse_io_stat(buf, &mut io.devices);
    Ok(Some(io))
}

/// v1: the throttle files count every I/O whatever the scheduler.
pub(crate) fn io_v1(dir: &CgroupDir, buf: &mut Vec<u8>) -> Result<Option<IoStats>> {
    let mut io = IoStats::default();
    let mut any = false;
    for (recursive, plain, bytes) in [
        (
            "blkio.throttle.io_service_bytes_recursive",
            "blkio.throttle.io_service_bytes",
            true,
        ),
        (
            "blkio.throttle.io_serviced_recursive",
            "blkio.throttle.io_serviced",
            false,
        ),
    ] {
        if read(dir, recursive, buf)? || read(dir, plain, buf)? {
            any = true;
            parse_blkio(buf, bytes, &mut io.devices);
        }
    }
    Ok(any.then_some(io))
}

/// The host's huge page sizes, as hugetlb file names use them.
pub fn hugepage_sizes() -> Vec<String> {
    let mut sizes: Vec<(u64, String)> = std::fs::read_dir("/sys/kernel/mm/hugepages")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let kb: u64 = name
                .to_str()?
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some((kb, page_size_name(kb)))
        })
        .collect();
    sizes.sort();
    sizes.into_iter().map(|s| s.1).collect()
}

pub(crate) fn hugetlb(
    dir: &CgroupDir,
    v2: bool,
    sizes: &[String],
    buf: &mut Vec<u8>,
) -> Result<Vec<HugetlbStats>> {
    let mut out = Vec::new();
    for size in sizes {
        let mut h = HugetlbStats {
            page_size: size.clone(),
            ..Default::default()
        };
        if v2 {
            let Some(usage) = read_u64(dir, &format!("hugetlb.{size}.current"), buf)? else {
                continue;
            };
            h.usage = usage;
            h.limit = read_limit(dir, &format!("hugetlb.{size}.max"), buf)?.flatten();
            if read(dir, &format!("hugetlb.{size}.events"), buf)? {
                parse_flat_keyed(buf, |k, v| {
                    if k == "max" {
                        h.failcnt = v;
                    }
                });
            }
        } else {
            let Some(usage) = read_u64(dir, &format!("hugetlb.{size}.usage_in_bytes"), buf)? else {
                continue;
            };
            h.usage = usage;
            h.max_usage = read_u64(dir, &format!("hugetlb.{size}.max_usage_in_bytes"), buf)?;
            h.failcnt = read_u64(dir, &format!("hugetlb.{size}.failcnt"), buf)?.unwrap_or(0);
            h.limit = read_limit(dir, &format!("hugetlb.{size}.limit_in_bytes"), buf)?.flatten();
        }
        out.push(h);
    }
    Ok(out)
}

/// cpu/memory/io.pressure of a cgroup2 directory; None when the kernel
/// keeps no PSI (CONFIG_PSI off, or `psi=0`).
pub(crate) fn psi(dir: &CgroupDir, buf: &mut Vec<u8>) -> Result<Option<PsiStats>> {
    let mut out = PsiStats::default();
    let mut any = false;
    for (name, slot) in [
        ("cpu.pressure", &mut out.cpu),
        ("memory.pressure", &mut out.memory),
        ("io.pressure", &mut out.io),
    ] {
        // Reading a pressure file fails with EOPNOTSUPP when PSI is
        // compiled in but disabled at boot.
        match dir.read_into(name, buf) {
            Ok(true) => {
                *slot = Some(parse_pressure(buf).map_err(|e| parse_err(dir, name, e))?);
                any = true;
            }
            Ok(false) => {}
            Err(e) if e.raw_os_error() == Some(95) => {}
            Err(e) => return Err(Error::io("read", dir.file_path(name))(e)),
        }
    }
    Ok(any.then_some(out))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::path::CgroupPath;

    /// memory.stat of a v2 container on kernel 6.1 (trimmed).
    pub(crate) const MEMORY_STAT_V2: &str = "\
anon 73728000
file 5132288
kernel 1572864
kernel_stack 65536
pagetables 299008
sock 0
shmem 0
file_mapped 2027520
file_dirty 0
file_writeback 0
inactive_anon 73711616
active_anon 16384
inactive_file 4145152
active_file 987136
unevictable 0
slab 1001648
pgfault 21369
pgmajfault 33
";

    const MEMORY_STAT_V1: &str = "\
cache 1351680
rss 69632000
rss_huge 0
shmem 0
mapped_file 1216512
swap 0
pgpgin 17979
pgfault 18420
pgmajfault 12
inactive_file 1081344
active_file 270336
hierarchical_memory_limit 104857600
total_cache 2351680
total_rss 79632000
total_shmem 4096
total_mapped_file 1216512
total_swap 0
total_pgfault 28420
total_pgmajfault 22
total_inactive_file 2081344
total_active_file 270336
";

    fn fake(files: &[(&str, &str)]) -> (tempfile::TempDir, CgroupDir) {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("c")).unwrap();
        for (name, content) in files {
            std::fs::write(root.path().join("c").join(name), content).unwrap();
        }
        let dir = CgroupDir::open(root.path(), &CgroupPath::parse("/c").unwrap()).unwrap();
        (root, dir)
    }

    #[test]
    fn psi_files() {
        let p = parse_pressure(
            b"some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\nfull avg10=0.10 avg60=0.00 avg300=0.00 total=789\n",
        )
        .unwrap();
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.avg60, 0.25);
        assert_eq!(p.some.total_us, 123_456);
        assert_eq!(p.full.unwrap().total_us, 789);
        let cpu_old = parse_pressure(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n").unwrap();
        assert_eq!(cpu_old.full, None);
        for bad in [
            &b""[..],
            b"some avg10=x avg60=0 avg300=0 total=1\n",
            b"some avg10=0.00\n",
            b"full avg10=0 avg60=0 avg300=0 total=1\n",
        ] {
            assert!(
                parse_pressure(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn limits_and_numbers() {
        assert_eq!(parse_limit(b"max\n").unwrap(), None);
        assert_eq!(parse_limit(b"1048576\n").unwrap(), Some(1 << 20));
        assert_eq!(parse_limit(b"9223372036854771712\n").unwrap(), None);
        assert!(parse_limit(b"lots\n").is_err());
        let mut seen = Vec::new();
        parse_flat_keyed(b"a 1\nb x\nc 3 extra\n\nd\n", |k, v| {
            seen.push((k.to_string(), v))
        });
        assert_eq!(seen, [("a".to_string(), 1), ("c".to_string(), 3)]);
    }

    #[test]
    fn io_files() {
        let mut v = Vec::new();
        parse_io_stat(
            b"8:0 rbytes=1024 wbytes=2048 rios=3 wios=4 dbytes=0 dios=0\n253:1 rbytes=5 wbytes=6 rios=7 wios=8 dbytes=0 dios=0\n",
            &mut v,
        );
        assert_eq!(v.len(), 2);
        assert_eq!(
            v[0],
            IoDeviceStats {
                major: 8,
                minor: 0,
                read_bytes: 1024,
                write_bytes: 2048,
                read_ios: 3,
                write_ios: 4
            }
        );
        let mut v = Vec::new();
        parse_blkio(
            b"8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Async 12288\n8:0 Discard 0\n8:0 Total 12288\nTotal 12288\n",
            true,
            &mut v,
        );
        parse_blkio(b"8:0 Read 1\n8:0 Write 2\nTotal 3\n", false, &mut v);
        assert_eq!(
            v,
            [IoDeviceStats {
                major: 8,
                minor: 0,
                read_bytes: 4096,
                write_bytes: 8192,
                read_ios: 1,
                write_ios: 2
            }]
        );
    }

    #[test]
    fn v2_memory_from_files() {
        let (_root, dir) = fake(&[
            ("memory.stat", MEMORY_STAT_V2),
            ("memory.current", "80000000\n"),
            ("memory.max", "104857600\n"),
            ("memory.peak", "90000000\n"),
            ("memory.swap.current", "4096\n"),
            ("memory.swap.max", "max\n"),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\noom_group_kill 0\n",
            ),
        ]);
        let m = memory_v2(&dir, true, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(m.usage, 80_000_000);
        assert_eq!(m.limit, Some(104_857_600));
        assert_eq!(m.max_usage, Some(90_000_000));
        assert_eq!(m.working_set, 80_000_000 - 4_145_152);
        assert_eq!(m.rss, 73_728_000);
        assert_eq!(m.cache, 5_132_288);
        assert_eq!(m.page_faults, 21_369);
        assert_eq!(m.major_page_faults, 33);
        assert_eq!(m.kernel, Some(1_572_864));
        assert_eq!(m.swap, Some(4096));
        assert_eq!(m.swap_limit, None);
        assert_eq!(
            (m.limit_hits, m.oom_events, m.oom_kills),
            (Some(7), Some(2), Some(1))
        );
        // Lean: the three files that give usage, limit and working set.
        let lean = memory_v2(&dir, false, &mut Vec::new()).unwrap().unwrap();
        assert_eq!((lean.usage, lean.working_set), (m.usage, m.working_set));
        assert_eq!(
            (lean.max_usage, lean.swap, lean.oom_kills),
            (None, None, None)
        );
    }

    #[test]
    fn v2_memory_of_an_old_kernel_and_a_big_cache() {
        // No `kernel` line (before 5.18): its parts are summed. A working
        // set never goes below 0.
        let stat = MEMORY_STAT_V2.replace("kernel 1572864\n", "");
        let (_root, dir) = fake(&[
            ("memory.stat", &stat),
            ("memory.current", "1000\n"),
            ("memory.max", "max\n"),
        ]);
        let m = memory_v2(&dir, true, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(m.kernel, Some(65_536 + 299_008 + 1_001_648));
        assert_eq!(m.working_set, 0);
        assert_eq!(m.limit, None);
        assert_eq!(m.swap, None);
        assert_eq!(m.max_usage, None);
    }

    #[test]
    fn v1_memory_from_files() {
        let (_root, dir) = fake(&[
            ("memory.stat", MEMORY_STAT_V1),
            ("memory.usage_in_bytes", "82000000\n"),
            ("memory.limit_in_bytes", "104857600\n"),
            ("memory.max_usage_in_bytes", "99000000\n"),
            ("memory.failcnt", "3\n"),
            ("memory.kmem.usage_in_bytes", "2000000\n"),
            ("memory.memsw.usage_in_bytes", "82004096\n"),
            ("memory.memsw.limit_in_bytes", "209715200\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
            ),
        ]);
        let m = memory_v1(&dir, true, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(m.usage, 82_000_000);
        assert_eq!(m.working_set, 82_000_000 - 2_081_344);
        assert_eq!(m.rss, 79_632_000);
        assert_eq!(m.cache, 2_351_680);
        assert_eq!(m.page_faults, 28_420);
        assert_eq!(m.major_page_faults, 22);
        assert_eq!(m.kernel, Some(2_000_000));
        assert_eq!(m.swap, Some(0));
        assert_eq!(m.swap_limit, Some(104_857_600));
        assert_eq!(m.max_usage, Some(99_000_000));
        assert_eq!((m.limit_hits, m.oom_kills), (Some(3), Some(4)));
        let (_root, dir) = fake(&[
            ("memory.stat", MEMORY_STAT_V1),
            ("memory.usage_in_bytes", "1\n"),
            ("memory.limit_in_bytes", "9223372036854771712\n"),
        ]);
        let m = memory_v1(&dir, true, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(m.limit, None);
        assert_eq!(m.swap, None);
    }

    #[test]
    fn cpu_from_files() {
        let (_r, dir) = fake(&[(
            "cpu.stat",
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\ncore_sched.force_idle_usec 0\nnr_periods 10\nnr_throttled 2\nthrottled_usec 300\nnr_bursts 0\nburst_usec 0\n",
        )]);
        let c = cpu_v2(&dir, &mut Vec::new()).unwrap().unwrap();
        assert_eq!(
            c,
            CpuStats {
                usage_ns: 1_500_000,
                user_ns: 1_000_000,
                system_ns: 500_000,
                periods: 10,
                throttled_periods: 2,
                throttled_ns: 300_000
            }
        );
        let (_r1, acct) = fake(&[
            ("cpuacct.usage", "123456789\n"),
            ("cpuacct.stat", "user 5\nsystem 2\n"),
        ]);
        let (_r2, cpu) = fake(&[(
            "cpu.stat",
            "nr_periods 4\nnr_throttled 1\nthrottled_time 999\n",
        )]);
        let lean = cpu_v1(Some(&acct), Some(&cpu), false, &mut Vec::new())
            .unwrap()
            .unwrap();
        assert_eq!(
            (lean.usage_ns, lean.user_ns, lean.periods),
            (123_456_789, 0, 0)
        );
        let c = cpu_v1(Some(&acct), Some(&cpu), true, &mut Vec::new())
            .unwrap()
            .unwrap();
        assert_eq!(
            c,
            CpuStats {
                usage_ns: 123_456_789,
                user_ns: 50_000_000,
                system_ns: 20_000_000,
                periods: 4,
                throttled_periods: 1,
                throttled_ns: 999
            }
        );
        assert_eq!(
            cpu_v1(None, Some(&cpu), true, &mut Vec::new()).unwrap(),
            None
        );
    }

    #[test]
    fn pids_hugetlb_psi_from_files() {
        let (_r, dir) = fake(&[
            ("pids.current", "3\n"),
            ("pids.max", "max\n"),
            ("hugetlb.2MB.current", "2097152\n"),
            ("hugetlb.2MB.max", "4194304\n"),
            ("hugetlb.2MB.events", "max 1\n"),
            (
                "cpu.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=10\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=5\n",
            ),
            (
                "memory.pressure",
                "some avg10=2.00 avg60=0.00 avg300=0.00 total=10\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=5\n",
            ),
        ]);
        let mut buf = Vec::new();
        assert_eq!(
            pids(&dir, &mut buf).unwrap(),
            Some(PidsStats {
                current: 3,
                limit: None
            })
        );
        let h = hugetlb(&dir, true, &["2MB".into(), "1GB".into()], &mut buf).unwrap();
        assert_eq!(
            h,
            [HugetlbStats {
                page_size: "2MB".into(),
                usage: 2 << 20,
                max_usage: None,
                failcnt: 1,
                limit: Some(4 << 20)
            }]
        );
        let p = psi(&dir, &mut buf).unwrap().unwrap();
        assert_eq!(p.cpu.unwrap().full.unwrap().total_us, 5);
        assert_eq!(p.memory.unwrap().some.avg10, 2.0);
        assert_eq!(p.io, None);
        let (_r, empty) = fake(&[]);
        assert_eq!(psi(&empty, &mut buf).unwrap(), None);
        assert_eq!(pids(&empty, &mut buf).unwrap(), None);
        let (_r, broken) = fake(&[("pids.current", "many\n")]);
        assert!(matches!(pids(&broken, &mut buf), Err(Error::Parse { .. })));
    }
}
