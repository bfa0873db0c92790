//! Stats RPCs: ContainerStats, ListContainerStats, PodSandboxStats,
//! ListPodSandboxStats. Translation of `crate::stats` readings.

use crust_api::v1::*;
use crust_cgroups::stats::{Pressure, PressureLine};
use tonic::{Request, Response, Status};

use super::container::{labels_match, metadata};
use super::{Cri, container_error, internal, map, pod_error};
use crate::clock::now_ns;
use crate::containers::{ContainerRecord, ContainerState as CState};
use crate::pod_metrics;
use crate::pods::{ListFilter, PodRecord, PodState};
use crate::stats::{self, Usage};
use crust_linux::netstats::InterfaceStats;

impl Cri {
    /// Blocking: reads the cgroup and walks the writable layer.
    fn stats_of(&self, rec: &ContainerRecord) -> ContainerStats {
        let d = &self.daemon;
        let now = now_ns();
        let attributes = Some(ContainerAttributes {
            id: rec.id.clone(),
            metadata: Some(metadata(rec)),
            labels: map(&rec.labels),
            annotations: map(&rec.annotations),
        });
        let (bytes, inodes) = stats::disk_usage(&rec.layer_dir.join("upper"));
        let writable_layer = Some(FilesystemUsage {
            timestamp: now,
            fs_id: Some(FilesystemIdentifier {
                mountpoint: d.images.layers_dir().display().to_string(),
            }),
            used_bytes: Some(UInt64Value { value: bytes }),
            inodes_used: Some(UInt64Value { value: inodes }),
        });
        let mut stats = ContainerStats {
            attributes,
            cpu: None,
            memory: None,
            writable_layer,
            swap: None,
            io: None,
        };
        if rec.state != CState::Running {
            return stats;
        }
        // Where the runtime put it: `<pod cgroup>/crust-<id>`, or the
        // `crust-<id>.scope` of the pod's slice.
        let Some(cg) = d.containers.cgroup_of(rec) else {
            return stats;
        };
        let (cpu, memory, io) = usage_messages(d.stats.usage(cg.path(), &rec.id, now));
        stats.cpu = cpu;
        stats.memory = memory;
        stats.io = io;
        stats
    }

    pub(super) async fn container_stats_impl(
        &self,
        req: Request<ContainerStatsRequest>,
    ) -> Result<Response<ContainerStatsResponse>, Status> {
        let rec = self
            .daemon
            .containers
            .get(&req.into_inner().container_id)
            .map_err(container_error)?;
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || this.stats_of(&rec))
            .await
            .map_err(internal)?;
        Ok(Response::new(ContainerStatsResponse { stats: Some(stats) }))
    }

    pub(super) async fn list_container_stats_impl(
        &self,
        req: Request<ListContainerStatsRequest>,
    ) -> Result<Response<ListContainerStatsResponse>, Status> {
        let f = req.into_inner().filter.unwrap_or_default();
        let recs: Vec<std::sync::Arc<ContainerRecord>> = self
            .daemon
            .containers
            .list()
            .into_iter()
            .filter(|r| f.id.is_empty() || r.id.starts_with(&f.id))
            .filter(|r| f.pod_sandbox_id.is_empty() || r.pod_id.starts_with(&f.pod_sandbox_id))
            .filter(|r| labels_match(r, &f.label_selector))
            .filter(|r| r.state == CState::Running)
            .collect();
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || {
            recs.iter().map(|r| this.stats_of(r)).collect::<Vec<_>>()
        })
        .await
        .map_err(internal)?;
        Ok(Response::new(ListContainerStatsResponse { stats }))
    }

    /// Blocking, as [`Cri::stats_of`]. `network`: the interfaces of the
    /// pod's network namespace (see [`pod_metrics::read_networks`]).
    fn pod_stats_of(
        &self,
        pod: &PodRecord,
        network: Option<Vec<InterfaceStats>>,
    ) -> PodSandboxStats {
        let now = now_ns();
        let containers: Vec<ContainerStats> = self
            .daemon
            .containers
            .list()
            .iter()
            .filter(|r| r.pod_id == pod.id && r.state == CState::Running)
            .map(|r| self.stats_of(r))
            .collect();
        let pod_cgroup = crust_cgroups::CgroupPath::from_path(&pod.cgroup_path).ok();
        let (cpu, memory, io) = usage_messages(
            pod_cgroup
                .as_ref()
                .and_then(|p| self.daemon.stats.usage(p, &pod.id, now)),
        );
        PodSandboxStats {
            attributes: Some(PodSandboxAttributes {
                id: pod.id.clone(),
                metadata: Some(PodSandboxMetadata {
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                    namespace: pod.metadata.namespace.clone(),
                    attempt: pod.metadata.attempt,
                }),
                labels: map(&pod.labels),
                annotations: map(&pod.annotations),
            }),
            linux: Some(LinuxPodSandboxStats {
                cpu,
                memory,
                network: network.map(|n| network_usage(&n, now)),
                process: Some(ProcessUsage {
                    timestamp: now,
                    process_count: Some(UInt64Value {
                        value: pod_cgroup
                            .as_ref()
                            .map_or(0, |p| self.daemon.stats.pids(p).len())
                            as u64,
                    }),
                }),
                containers,
                io,
            }),
            windows: None,
        }
    }

    pub(super) async fn pod_sandbox_stats_impl(
        &self,
        req: Request<PodSandboxStatsRequest>,
    ) -> Result<Response<PodSandboxStatsResponse>, Status> {
        let id = req.into_inner().pod_sandbox_id;
        let pod = self.daemon.pods.get(&id).map_err(pod_error)?;
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || {
            let network = pod_metrics::read_networks(&[netns(&pod)]).pop().flatten();
            this.pod_stats_of(&pod, network)
        })
        .await
        .map_err(internal)?;
        Ok(Response::new(PodSandboxStatsResponse {
            stats: Some(stats),
        }))
    }

    pub(super) async fn list_pod_sandbox_stats_impl(
        &self,
        req: Request<ListPodSandboxStatsRequest>,
    ) -> Result<Response<ListPodSandboxStatsResponse>, Status> {
        let f = req.into_inner().filter.unwrap_or_default();
        let pods: Vec<_> = self
            .daemon
            .pods
            .list(&ListFilter {
                id: String::new(),
                state: Some(PodState::Ready),
                labels: f.label_selector.into_iter().collect(),
            })
            .into_iter()
            .filter(|p| f.id.is_empty() || p.id.starts_with(&f.id))
            .collect();
        let this = self.clone();
        let stats = tokio::task::spawn_blocking(move || {
            // One namespace-visiting thread for all pods.
            let netns: Vec<_> = pods.iter().map(netns).collect();
            let networks = pod_metrics::read_networks(&netns);
            pods.iter()
                .zip(networks)
                .map(|(p, n)| this.pod_stats_of(p, n))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(internal)?;
        Ok(Response::new(ListPodSandboxStatsResponse { stats }))
    }
}

/// The network namespace whose counters are the pod's: none for
/// host-network pods (their traffic is the node's).
fn netns(pod: &PodRecord) -> Option<&std::path::Path> {
    if pod.host_network {
        None
    } else {
        pod.namespaces.net.as_deref()
    }
}

/// CRI's NetworkUsage: every interface but `lo`, `eth0` as the default.
fn network_usage(ifaces: &[InterfaceStats], now: i64) -> NetworkUsage {
    let usage = |i: &InterfaceStats| NetworkInterfaceUsage {
        name: i.name.clone(),
        rx_bytes: Some(UInt64Value { value: i.rx_bytes }),
        rx_errors: Some(UInt64Value { value: i.rx_errors }),
        tx_bytes: Some(UInt64Value { value: i.tx_bytes }),
        tx_errors: Some(UInt64Value { value: i.tx_errors }),
    };
    NetworkUsage {
        timestamp: now,
        default_interface: pod_metrics::default_interface(ifaces).map(usage),
        interfaces: ifaces.iter().map(usage).collect(),
    }
}

/// CRI's PSI message of one pressure file.
fn psi(p: Option<Pressure>) -> Option<PsiStats> {
    let data = |l: PressureLine| PsiData {
        total: l.total_us,
        avg10: l.avg10,
        avg60: l.avg60,
        avg300: l.avg300,
    };
    p.map(|p| PsiStats {
        full: p.full.map(data),
        some: Some(data(p.some)),
    })
}

/// CRI's CPU, memory and IO messages of a cgroup reading (none without
/// one; IO only carries PSI, so it is there only where PSI is).
fn usage_messages(
    usage: Option<Usage>,
) -> (Option<CpuUsage>, Option<MemoryUsage>, Option<IoUsage>) {
    let Some(u) = usage else {
        return (None, None, None);
    };
    let pressure = u.psi.unwrap_or_default();
    let v = |value: u64| Some(UInt64Value { value });
    let cpu = CpuUsage {
        timestamp: u.timestamp,
        usage_core_nano_seconds: v(u.cpu_usage_ns),
        usage_nano_cores: u.cpu_nano_cores.and_then(v),
        psi: psi(pressure.cpu),
    };
    let memory = MemoryUsage {
        timestamp: u.timestamp,
        working_set_bytes: v(u.memory_working_set_bytes),
        available_bytes: u.memory_available_bytes.and_then(v),
        usage_bytes: v(u.memory_usage_bytes),
        rss_bytes: u.memory_rss_bytes.and_then(v),
        page_faults: u.page_faults.and_then(v),
        major_page_faults: u.major_page_faults.and_then(v),
        psi: psi(pressure.memory),
    };
    let io = pressure.io.map(|p| IoUsage {
        timestamp: u.timestamp,
        psi: psi(Some(p)),
    });
    (Some(cpu), Some(memory), io)
}
