//! What pods and containers use: CPU and memory of their cgroups (v1 or
//! v2, through crust-cgroups, the CPU rate from the previous sample) and
//! the disk use of containers' writable layers. Read for the stats RPCs
//! (and, later, the metrics ones).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crust_cgroups::{CgroupPath, StatsRequest};

use crate::cgroups::NodeCgroups;

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
    /// None in unit tests (no node).
    cgroups: Option<Arc<NodeCgroups>>,
    /// By pod or container ID.
    samples: Mutex<HashMap<String, CpuSample>>,
}

impl CgroupStats {
    pub fn new(cgroups: Option<Arc<NodeCgroups>>) -> CgroupStats {
        CgroupStats {
            cgroups,
            samples: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the cgroup at `path` (None if it cannot be read), sampled
    /// under `key` at `now`. Blocking.
    pub fn usage(&self, path: &CgroupPath, key: &str, now: i64) -> Option<Usage> {
        let cgroups = self.cgroups.as_ref()?;
        let st = cgroups
            .fs()
            .cgroup(path.clone())
            .stats(StatsRequest::CPU_MEMORY)
            .ok()?;
        let (cpu, m) = (st.cpu?, st.memory?);
        let nano_cores = self.sample(key, now, cpu.usage_ns);
        Some(Usage {
            timestamp: now,
            cpu_usage_ns: cpu.usage_ns,
            cpu_nano_cores: nano_cores,
            memory_usage_bytes: m.usage,
            memory_working_set_bytes: m.working_set,
            memory_available_bytes: m.limit.map(|l| l.saturating_sub(m.working_set)),
            memory_rss_bytes: Some(m.rss),
            page_faults: Some(m.page_faults),
            major_page_faults: Some(m.major_page_faults),
        })
    }

    /// [`CgroupStats::usage`] of a cgroup named by a path.
    pub fn usage_at(&self, path: &Path, key: &str, now: i64) -> Option<Usage> {
        self.usage(&CgroupPath::from_path(path).ok()?, key, now)
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
        let stats = CgroupStats::new(None);
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
