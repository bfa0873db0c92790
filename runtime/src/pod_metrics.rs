//! What the CRI metrics RPCs report, read from the node: per pod its
//! cgroup and the interface counters of its network namespace, per running
//! container its cgroup (every group of figures crust-cgroups reads), its
//! processes, its writable layer and the file system under it. The names
//! and labels the kubelet shows are `services/metrics.rs`'s business.
//!
//! Cost, for a scrape of every pod every 10 s: one helper thread and one
//! setns + read per pod for the network, about 15 small control-file
//! reads per cgroup, one readdir per process, one tree walk per writable
//! layer (as ContainerStats does) and one statvfs per container.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crust_api::v1::LinuxContainerResources;
use crust_cgroups::{CgroupPath, Stats, StatsRequest};
use crust_linux::mounts::FsCapacity;
use crust_linux::netstats::InterfaceStats;
use crust_linux::procstats::ProcessCounts;
use tracing::debug;

use crate::containers::ContainerRecord;
use crate::pods::PodRecord;
use crate::stats::{self, CgroupStats};

/// Where a container's cgroup is (`Containers::cgroup_of`): below the pod
/// cgroup, or a scope in the pod's slice with the systemd driver.
pub type CgroupOf<'a> = &'a dyn Fn(&ContainerRecord) -> Option<CgroupPath>;

/// What the pod-level metrics need: CPU and memory of the pod cgroup.
const POD_FIGURES: StatsRequest = StatsRequest {
    cpu: true,
    cpu_details: true,
    memory: true,
    memory_details: false,
    pids: false,
    io: false,
    hugetlb: false,
    psi: false,
};

/// Everything but huge pages (their metrics are not served).
const CONTAINER_FIGURES: StatsRequest = StatsRequest {
    hugetlb: false,
    ..StatsRequest::ALL
};

/// One pod's reading.
pub struct PodSample {
    pub pod: PodRecord,
    /// The pod cgroup (its path is cadvisor's `id` label).
    pub cgroup: Option<CgroupPath>,
    pub stats: Option<Stats>,
    /// Interfaces of the pod's network namespace, loopback left out; None
    /// for host-network pods (their traffic is the node's) or when the
    /// namespace could not be read.
    pub network: Option<Vec<InterfaceStats>>,
    pub containers: Vec<ContainerSample>,
}

/// One running container's reading.
pub struct ContainerSample {
    pub container: Arc<ContainerRecord>,
    pub cgroup: Option<CgroupPath>,
    pub stats: Option<Stats>,
    pub processes: ProcessCounts,
    /// Bytes and inodes of the writable layer.
    pub writable_layer: (u64, u64),
    /// The file system holding the writable layer, and where it is.
    pub layer_fs: Option<(PathBuf, FsCapacity)>,
    pub resources: Option<LinuxContainerResources>,
}

/// Reads `pods` and their running `containers` (which may include other
/// pods' containers). Blocking: call from `spawn_blocking`.
pub fn sample(
    cgroups: &CgroupStats,
    cgroup_of: CgroupOf<'_>,
    pods: Vec<PodRecord>,
    containers: &[Arc<ContainerRecord>],
) -> Vec<PodSample> {
    let netns: Vec<Option<&Path>> = pods
        .iter()
        .map(|p| {
            if p.host_network {
                None
            } else {
                p.namespaces.net.as_deref()
            }
        })
        .collect();
    let networks = read_networks(&netns);
    let mut buf = Vec::with_capacity(8192);
    pods.into_iter()
        .zip(networks)
        .map(|(pod, network)| {
            let containers = containers
                .iter()
                .filter(|c| {
                    c.pod_id == pod.id && c.state == crate::containers::ContainerState::Running
                })
                .map(|c| sample_container(cgroups, cgroup_of(c), c.clone(), &mut buf))
                .collect();
            let cgroup = CgroupPath::from_path(&pod.cgroup_path).ok();
            PodSample {
                stats: cgroup
                    .as_ref()
                    .and_then(|p| cgroups.read(p, POD_FIGURES, &mut buf)),
                cgroup,
                network,
                containers,
                pod,
            }
        })
        .collect()
}

fn sample_container(
    cgroups: &CgroupStats,
    cgroup: Option<CgroupPath>,
    container: Arc<ContainerRecord>,
    buf: &mut Vec<u8>,
) -> ContainerSample {
    let stats = cgroup
        .as_ref()
        .and_then(|p| cgroups.read(p, CONTAINER_FIGURES, buf));
    let pids = cgroup.as_ref().map(|p| cgroups.pids(p)).unwrap_or_default();
    let processes = crust_linux::procstats::count(&pids);
    let writable_layer = stats::disk_usage(&container.layer_dir.join("upper"));
    let layer_fs = crust_linux::mounts::filesystem_capacity(&container.layer_dir)
        .ok()
        .map(|c| (container.layer_dir.clone(), c));
    ContainerSample {
        resources: container.resources(),
        container,
        cgroup,
        stats,
        processes,
        writable_layer,
        layer_fs,
    }
}

/// The interfaces (without `lo`) in each given namespace; None where there
/// is none or it cannot be read.
pub fn read_networks(netns: &[Option<&Path>]) -> Vec<Option<Vec<InterfaceStats>>> {
    let paths: Vec<&Path> = netns.iter().flatten().copied().collect();
    let mut read = match crust_linux::netstats::interface_stats_in(&paths) {
        Ok(r) => r.into_iter(),
        Err(e) => {
            debug!(error = %e, "reading pod network counters");
            Vec::new().into_iter()
        }
    };
    netns
        .iter()
        .map(|p| {
            p.and_then(|p| match read.next()? {
                Ok(ifaces) => Some(
                    ifaces
                        .into_iter()
                        .filter(|i| i.name != "lo")
                        .collect::<Vec<_>>(),
                ),
                Err(e) => {
                    debug!(netns = %p.display(), error = %e, "reading pod network counters");
                    None
                }
            })
        })
        .collect()
}

/// The interface a pod's traffic goes through: `eth0` (what CNI plugins
/// name it) if present, else the first one.
pub fn default_interface(ifaces: &[InterfaceStats]) -> Option<&InterfaceStats> {
    ifaces
        .iter()
        .find(|i| i.name == "eth0")
        .or_else(|| ifaces.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str) -> InterfaceStats {
        InterfaceStats {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn eth0_is_the_default_interface() {
        assert_eq!(
            default_interface(&[iface("net1"), iface("eth0")])
                .unwrap()
                .name,
            "eth0"
        );
        assert_eq!(default_interface(&[iface("net1")]).unwrap().name, "net1");
        assert!(default_interface(&[]).is_none());
    }

    #[test]
    fn namespaces_that_cannot_be_read_have_no_network() {
        let missing = Path::new("/nonexistent/ns/net");
        let got = read_networks(&[None, Some(missing), None]);
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|n| n.is_none()));
    }
}
