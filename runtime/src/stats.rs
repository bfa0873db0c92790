//! What pods and containers use: CPU and memory of their cgroups (v1 or
//! v2, through libcgroups, the CPU rate from the previous sample) and the
//! disk use of containers' writable layers. Read for the stats RPCs (and,
//! later, the metrics ones).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use crust_linux::cgroups::{Hierarchy, PodCgroup};

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// One reading of a cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Nanoseconds since the Unix epoch.
    pub timestamp: i64,
    /// CPU time used, in nanoseconds.
    pub cpu_usage_ns: u64,
    /// CPU used since the previous sample of the same key, in
    /// nanoseconds per second; None for the first sample.
    pub cpu_nano_cores: Option<u64>,
    pub memory_usage_bytes: u64,
    /// Usage minus inactive file pages (what the kubelet evicts on).
    pub memory_working_set_bytes: u64,
    /// Limit minus working set, when there is a limit.
    pub memory_available_bytes: Option<u64>,
    pub memory_rss_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
}

/// The previous CPU sample of a cgroup.
#[derive(Clone, Copy)]
struct CpuSample {
    at: i64,
    usage_ns: u64,
}

pub struct CgroupStats {
    hierarchy: Hierarchy,
    /// By pod or container ID.
    samples: Mutex<HashMap<String, CpuSample>>,
}

impl CgroupStats {
    pub fn new(hierarchy: Hierarchy) -> CgroupStats {
        CgroupStats {
            hierarchy,
            samples: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the cgroup at `path` (None if it cannot be read), sampled
    /// under `key` at `now`. Blocking.
    pub fn usage(&self, path: &Path, key: &str, now: i64) -> Option<Usage> {
        let cg = PodCgroup::new(self.hierarchy, Path::new(CGROUP_ROOT), path).ok()?;
        let st = cg.stats().ok()?;
        let usage = st.cpu.usage.usage_total;
        let nano_cores = self.sample(key, now, usage);
        let m = &st.memory;
        let stat = |k: &str| m.stats.get(k).copied();
        let v2 = self.hierarchy.is_unified();
        let usage_bytes = m.memory.usage;
        let inactive = if v2 {
            stat("inactive_file")
        } else {
            stat("total_inactive_file")
        }
        .unwrap_or(0);
        let working_set = usage_bytes.saturating_sub(inactive);
        let (rss, pgfault, pgmajfault) = if v2 {
            (stat("anon"), stat("pgfault"), stat("pgmajfault"))
        } else {
            (
                stat("total_rss"),
                stat("total_pgfault"),
                stat("total_pgmajfault"),
            )
        };
        let limit = m.memory.limit;
        Some(Usage {
            timestamp: now,
            cpu_usage_ns: usage,
            cpu_nano_cores: nano_cores,
            memory_usage_bytes: usage_bytes,
            memory_working_set_bytes: working_set,
            memory_available_bytes: (limit > 0 && limit < (1u64 << 62))
                .then(|| limit.saturating_sub(working_set)),
            memory_rss_bytes: rss,
            page_faults: pgfault,
            major_page_faults: pgmajfault,
        })
    }

    /// Records CPU usage `usage_ns` of `key` at `now`; returns the rate
    /// since the previous sample (nanoseconds of CPU per second), if there
    /// is one and time and usage went forward.
    fn sample(&self, key: &str, now: i64, usage_ns: u64) -> Option<u64> {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let prev = samples.insert(key.to_string(), CpuSample { at: now, usage_ns });
        prev.and_then(|p| {
            let dt = now.saturating_sub(p.at);
            (dt > 0 && usage_ns >= p.usage_ns)
                .then(|| ((usage_ns - p.usage_ns) as u128 * 1_000_000_000 / dt as u128) as u64)
        })
    }

    #[cfg(test)]
    pub fn record_sample(&self, key: &str, now: i64, usage_ns: u64) -> Option<u64> {
        self.sample(key, now, usage_ns)
    }

    #[cfg(test)]
    pub fn has_sample(&self, key: &str) -> bool {
        self.samples.lock().unwrap().contains_key(key)
    }

    /// Drops the sample of a removed pod or container.
    pub fn forget(&self, key: &str) {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// The cgroup of a container below its pod's cgroup (cgroupfs driver).
pub fn container_cgroup(pod_cgroup: &Path, container_id: &str) -> std::path::PathBuf {
    pod_cgroup.join(format!("crust-{container_id}"))
}

/// Bytes and inodes used below `dir` (a container's writable layer).
/// Blocking.
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    crust_linux::mounts::disk_usage(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_rate_comes_from_the_previous_sample() {
        let stats = CgroupStats::new(Hierarchy::V1);
        assert_eq!(stats.record_sample("c", 1_000_000_000, 5_000), None);
        // Half a CPU over two seconds.
        assert_eq!(
            stats.record_sample("c", 3_000_000_000, 1_000_005_000),
            Some(500_000_000)
        );
        // Samples are per key; a counter that went back (a new cgroup under
        // the same name) or a clock that did not move gives no rate.
        assert_eq!(stats.record_sample("d", 3_000_000_000, 1), None);
        assert_eq!(stats.record_sample("c", 4_000_000_000, 7), None);
        assert_eq!(stats.record_sample("c", 4_000_000_000, 9), None);
        stats.forget("c");
        assert!(!stats.has_sample("c") && stats.has_sample("d"));
    }
}
