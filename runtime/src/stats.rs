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
        let nano_cores = {
            let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            let prev = samples.insert(
                key.to_string(),
                CpuSample {
                    at: now,
                    usage_ns: usage,
                },
            );
            prev.and_then(|p| {
                let dt = now.saturating_sub(p.at);
                (dt > 0 && usage >= p.usage_ns)
                    .then(|| ((usage - p.usage_ns) as u128 * 1_000_000_000 / dt as u128) as u64)
            })
        };
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
