//! CRI metrics: ListMetricDescriptors, ListPodSandboxMetrics and
//! StreamPodSandboxMetrics. With the `PodAndContainerStatsFromCRI` gate
//! the kubelet serves these as its `/metrics/cadvisor` endpoint, so the
//! names, units and labels are cadvisor's: every series carries
//! `container`, `id` (the cgroup path), `image`, `name` (the container or
//! pod sandbox ID), `namespace` and `pod`, plus its own keys (`cpu`,
//! `interface`, `device`, ...). Pod-level series (the pod cgroup's CPU and
//! memory, the pod network) have `container=""`, as cadvisor's pod cgroup
//! does. CRI values are integers: seconds are whole seconds (as in
//! containerd and CRI-O).
//!
//! Every descriptor listed has a sample for every running container (or,
//! for the pod-level ones, every pod), except where noted in its help: a
//! figure this host does not keep (PSI, swap accounting, I/O devices,
//! memory.peak) is left out rather than reported as 0.

use crust_api::v1::*;
use crust_cgroups::stats::Pressure;
use tonic::{Request, Response, Status};

use super::{Cri, ResponseStream, batched, internal};
use crate::clock::now_ns;
use crate::pod_metrics::{self, ContainerSample, PodSample};
use crate::pods::{ListFilter, PodState};

/// The labels of every series, in this order.
const BASE_LABELS: [&str; 6] = ["container", "id", "image", "name", "namespace", "pod"];

/// How a series is sampled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

struct Desc {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Keys after [`BASE_LABELS`].
    extra: &'static [&'static str],
}

const fn counter(name: &'static str, help: &'static str, extra: &'static [&'static str]) -> Desc {
    Desc {
        name,
        help,
        kind: Kind::Counter,
        extra,
    }
}

const fn gauge(name: &'static str, help: &'static str, extra: &'static [&'static str]) -> Desc {
    Desc {
        name,
        help,
        kind: Kind::Gauge,
        extra,
    }
}

/// Every metric served, as cadvisor names and explains them.
const DESCRIPTORS: &[Desc] = &[
    // CPU
    counter(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        &["cpu"],
    ),
    counter(
        "container_cpu_user_seconds_total",
        "Cumulative user cpu time consumed in seconds.",
        &[],
    ),
    counter(
        "container_cpu_system_seconds_total",
        "Cumulative system cpu time consumed in seconds.",
        &[],
    ),
    counter(
        "container_cpu_cfs_periods_total",
        "Number of elapsed enforcement period intervals.",
        &[],
    ),
    counter(
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals.",
        &[],
    ),
    counter(
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled.",
        &[],
    ),
    // Memory
    gauge(
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        &[],
    ),
    gauge(
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        &[],
    ),
    gauge("container_memory_rss", "Size of RSS in bytes.", &[]),
    gauge(
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        &[],
    ),
    gauge(
        "container_memory_mapped_file",
        "Size of memory mapped files in bytes.",
        &[],
    ),
    gauge(
        "container_memory_kernel_usage",
        "Size of kernel memory allocated in bytes (where the kernel accounts it).",
        &[],
    ),
    gauge(
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded in bytes (where the kernel keeps it).",
        &[],
    ),
    gauge(
        "container_memory_swap",
        "Container swap usage in bytes (where swap is accounted).",
        &[],
    ),
    counter(
        "container_memory_failcnt",
        "Number of memory usage hits limits",
        &[],
    ),
    counter(
        "container_memory_failures_total",
        "Cumulative count of memory allocation failures.",
        &["failure_type", "scope"],
    ),
    counter(
        "container_oom_events_total",
        "Count of out of memory events observed for the container",
        &[],
    ),
    // Network (pod level)
    counter(
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
        &["interface"],
    ),
    counter(
        "container_network_receive_packets_total",
        "Cumulative count of packets received",
        &["interface"],
    ),
    counter(
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
        &["interface"],
    ),
    counter(
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
        &["interface"],
    ),
    counter(
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
        &["interface"],
    ),
    counter(
        "container_network_transmit_packets_total",
        "Cumulative count of packets transmitted",
        &["interface"],
    ),
    counter(
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        &["interface"],
    ),
    counter(
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
        &["interface"],
    ),
    // Writable layer and its file system
    gauge(
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container's writable layer.",
        &["device"],
    ),
    gauge(
        "container_fs_inodes_total",
        "Number of inodes of the file system holding the writable layer.",
        &["device"],
    ),
    gauge(
        "container_fs_inodes_free",
        "Number of available inodes of the file system holding the writable layer.",
        &["device"],
    ),
    gauge(
        "container_fs_limit_bytes",
        "Number of bytes that can be consumed by the container on this filesystem.",
        &["device"],
    ),
    // Block I/O (devices the cgroup did I/O on)
    counter(
        "container_fs_reads_bytes_total",
        "Cumulative count of bytes read",
        &["device"],
    ),
    counter(
        "container_fs_writes_bytes_total",
        "Cumulative count of bytes written",
        &["device"],
    ),
    counter(
        "container_fs_reads_total",
        "Cumulative count of reads completed",
        &["device"],
    ),
    counter(
        "container_fs_writes_total",
        "Cumulative count of writes completed",
        &["device"],
    ),
    counter(
        "container_blkio_device_usage_total",
        "Blkio device bytes usage",
        &["device", "major", "minor", "operation"],
    ),
    // Processes
    gauge(
        "container_processes",
        "Number of processes running inside the container.",
        &[],
    ),
    gauge(
        "container_threads",
        "Number of threads running inside the container",
        &[],
    ),
    gauge(
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        &[],
    ),
    gauge(
        "container_file_descriptors",
        "Number of open file descriptors for the container.",
        &[],
    ),
    gauge(
        "container_sockets",
        "Number of open sockets for the container.",
        &[],
    ),
    // Spec
    gauge(
        "container_spec_cpu_period",
        "CPU period of the container.",
        &[],
    ),
    gauge(
        "container_spec_cpu_quota",
        "CPU quota of the container (only when one is set).",
        &[],
    ),
    gauge(
        "container_spec_cpu_shares",
        "CPU share of the container.",
        &[],
    ),
    gauge(
        "container_spec_memory_limit_bytes",
        "Memory limit for the container (0: none).",
        &[],
    ),
    gauge(
        "container_spec_memory_swap_limit_bytes",
        "Memory swap limit for the container (0: none or not accounted).",
        &[],
    ),
    gauge(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        &[],
    ),
    gauge(
        "container_last_seen",
        "Last time a container was seen by the exporter",
        &[],
    ),
    // Pressure (cgroup v2 or a hybrid host's cgroup2 side, with PSI on)
    counter(
        "container_pressure_cpu_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to CPU congestion (where the kernel keeps PSI).",
        &[],
    ),
    counter(
        "container_pressure_cpu_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to CPU congestion (where the kernel keeps PSI).",
        &[],
    ),
    counter(
        "container_pressure_memory_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to memory congestion (where the kernel keeps PSI).",
        &[],
    ),
    counter(
        "container_pressure_memory_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to memory congestion (where the kernel keeps PSI).",
        &[],
    ),
    counter(
        "container_pressure_io_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to IO congestion (where the kernel keeps PSI).",
        &[],
    ),
    counter(
        "container_pressure_io_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to IO congestion (where the kernel keeps PSI).",
        &[],
    ),
];

fn descriptor(name: &str) -> &'static Desc {
    DESCRIPTORS
        .iter()
        .find(|d| d.name == name)
        // Every name below is in the table (a unit test checks).
        .unwrap_or(&DESCRIPTORS[0])
}

pub(super) fn metric_descriptors() -> Vec<MetricDescriptor> {
    DESCRIPTORS
        .iter()
        .map(|d| MetricDescriptor {
            name: d.name.to_string(),
            help: d.help.to_string(),
            label_keys: BASE_LABELS
                .iter()
                .chain(d.extra)
                .map(|k| k.to_string())
                .collect(),
        })
        .collect()
}

const NS_PER_SEC: u64 = 1_000_000_000;

/// Builds the series of one cgroup (a container, or a pod at pod level).
struct Series {
    base: Vec<String>,
    at: i64,
    out: Vec<Metric>,
}

impl Series {
    fn new(base: Vec<String>, at: i64) -> Series {
        Series {
            base,
            at,
            out: Vec::new(),
        }
    }

    fn push(&mut self, name: &str, value: u64, extra: &[&str]) {
        let d = descriptor(name);
        debug_assert_eq!(d.name, name);
        debug_assert_eq!(d.extra.len(), extra.len(), "{name}");
        let mut labels = self.base.clone();
        labels.extend(extra.iter().map(|v| v.to_string()));
        self.out.push(Metric {
            name: d.name.to_string(),
            timestamp: self.at,
            metric_type: match d.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            } as i32,
            label_values: labels,
            value: Some(UInt64Value { value }),
        });
    }

    fn cpu(&mut self, st: &crust_cgroups::Stats) {
        let Some(c) = st.cpu else { return };
        self.push(
            "container_cpu_usage_seconds_total",
            c.usage_ns / NS_PER_SEC,
            &["total"],
        );
        self.push(
            "container_cpu_user_seconds_total",
            c.user_ns / NS_PER_SEC,
            &[],
        );
        self.push(
            "container_cpu_system_seconds_total",
            c.system_ns / NS_PER_SEC,
            &[],
        );
        self.push("container_cpu_cfs_periods_total", c.periods, &[]);
        self.push(
            "container_cpu_cfs_throttled_periods_total",
            c.throttled_periods,
            &[],
        );
        self.push(
            "container_cpu_cfs_throttled_seconds_total",
            c.throttled_ns / NS_PER_SEC,
            &[],
        );
    }

    fn memory(&mut self, st: &crust_cgroups::Stats) {
        let Some(m) = st.memory else { return };
        self.push("container_memory_usage_bytes", m.usage, &[]);
        self.push("container_memory_working_set_bytes", m.working_set, &[]);
        self.push("container_memory_rss", m.rss, &[]);
        self.push("container_memory_cache", m.cache, &[]);
        self.push("container_memory_mapped_file", m.mapped_file, &[]);
        if let Some(k) = m.kernel {
            self.push("container_memory_kernel_usage", k, &[]);
        }
        if let Some(v) = m.max_usage {
            self.push("container_memory_max_usage_bytes", v, &[]);
        }
        if let Some(v) = m.swap {
            self.push("container_memory_swap", v, &[]);
        }
        if let Some(v) = m.limit_hits {
            self.push("container_memory_failcnt", v, &[]);
        }
        // The figures count the whole subtree; a container's cgroup has no
        // children, so its own and its hierarchy's counts are the same.
        for scope in ["container", "hierarchy"] {
            self.push(
                "container_memory_failures_total",
                m.page_faults,
                &["pgfault", scope],
            );
            self.push(
                "container_memory_failures_total",
                m.major_page_faults,
                &["pgmajfault", scope],
            );
        }
        // v1 counts no OOM events; the OOM kills stand in (crust-cgroups).
        if let Some(v) = m.oom_events.or(m.oom_kills) {
            self.push("container_oom_events_total", v, &[]);
        }
        self.push(
            "container_spec_memory_limit_bytes",
            m.limit.unwrap_or(0),
            &[],
        );
        if m.swap.is_some() {
            self.push(
                "container_spec_memory_swap_limit_bytes",
                m.swap_limit.unwrap_or(0),
                &[],
            );
        }
    }

    fn pressure(&mut self, st: &crust_cgroups::Stats) {
        let Some(psi) = st.psi else { return };
        let us = |v: u64| v / 1_000_000;
        for (p, waiting, stalled) in [
            (
                psi.cpu,
                "container_pressure_cpu_waiting_seconds_total",
                "container_pressure_cpu_stalled_seconds_total",
            ),
            (
                psi.memory,
                "container_pressure_memory_waiting_seconds_total",
                "container_pressure_memory_stalled_seconds_total",
            ),
            (
                psi.io,
                "container_pressure_io_waiting_seconds_total",
                "container_pressure_io_stalled_seconds_total",
            ),
        ] {
            let Some(Pressure { some, full }) = p else {
                continue;
            };
            self.push(waiting, us(some.total_us), &[]);
            if let Some(full) = full {
                self.push(stalled, us(full.total_us), &[]);
            }
        }
    }

    fn network(&mut self, ifaces: &[crust_linux::netstats::InterfaceStats]) {
        for i in ifaces {
            let n = [i.name.as_str()];
            self.push("container_network_receive_bytes_total", i.rx_bytes, &n);
            self.push("container_network_receive_packets_total", i.rx_packets, &n);
            self.push(
                "container_network_receive_packets_dropped_total",
                i.rx_dropped,
                &n,
            );
            self.push("container_network_receive_errors_total", i.rx_errors, &n);
            self.push("container_network_transmit_bytes_total", i.tx_bytes, &n);
            self.push("container_network_transmit_packets_total", i.tx_packets, &n);
            self.push(
                "container_network_transmit_packets_dropped_total",
                i.tx_dropped,
                &n,
            );
            self.push("container_network_transmit_errors_total", i.tx_errors, &n);
        }
    }
}

/// `/sys/dev/block/M:m` names the device (`../../devices/.../vda`); the
/// label is `/dev/<name>` as cadvisor shows it, else `M:m`.
fn block_device_name(major: u32, minor: u32) -> String {
    let id = format!("{major}:{minor}");
    std::fs::read_link(format!("/sys/dev/block/{id}"))
        .ok()
        .and_then(|t| {
            t.file_name()
                .map(|n| format!("/dev/{}", n.to_string_lossy()))
        })
        .unwrap_or(id)
}

fn container_metrics(c: &ContainerSample, pod: &PodSample, at: i64) -> ContainerMetrics {
    let rec = &c.container;
    let base = vec![
        rec.name.clone(),
        c.cgroup.as_ref().map(|p| p.to_string()).unwrap_or_default(),
        // The image as the user named it (kubelet sends the ID as the
        // request's image), as containerd labels it.
        rec.reported_image().name,
        rec.id.clone(),
        pod.pod.metadata.namespace.clone(),
        pod.pod.metadata.name.clone(),
    ];
    let mut s = Series::new(base, at);
    if let Some(st) = &c.stats {
        s.cpu(st);
        s.memory(st);
        s.pressure(st);
        if let Some(p) = st.pids {
            s.push("container_threads_max", p.limit.unwrap_or(0), &[]);
        }
        for d in st.io.iter().flat_map(|io| &io.devices) {
            let dev = block_device_name(d.major, d.minor);
            let dev = dev.as_str();
            s.push("container_fs_reads_bytes_total", d.read_bytes, &[dev]);
            s.push("container_fs_writes_bytes_total", d.write_bytes, &[dev]);
            s.push("container_fs_reads_total", d.read_ios, &[dev]);
            s.push("container_fs_writes_total", d.write_ios, &[dev]);
            let (major, minor) = (d.major.to_string(), d.minor.to_string());
            s.push(
                "container_blkio_device_usage_total",
                d.read_bytes,
                &[dev, &major, &minor, "Read"],
            );
            s.push(
                "container_blkio_device_usage_total",
                d.write_bytes,
                &[dev, &major, &minor, "Write"],
            );
        }
    }
    let p = c.processes;
    s.push("container_processes", p.processes, &[]);
    s.push("container_threads", p.threads, &[]);
    s.push("container_file_descriptors", p.file_descriptors, &[]);
    s.push("container_sockets", p.sockets, &[]);
    if let Some((dir, fs)) = &c.layer_fs {
        let dev = dir.display().to_string();
        let dev = [dev.as_str()];
        s.push("container_fs_usage_bytes", c.writable_layer.0, &dev);
        s.push("container_fs_inodes_total", fs.inodes_total, &dev);
        s.push("container_fs_inodes_free", fs.inodes_free, &dev);
        s.push("container_fs_limit_bytes", fs.bytes_total, &dev);
    }
    let r = c.resources.clone().unwrap_or_default();
    // The kernel's defaults where the request left them unset.
    s.push(
        "container_spec_cpu_period",
        if r.cpu_period > 0 {
            r.cpu_period as u64
        } else {
            100_000
        },
        &[],
    );
    if r.cpu_quota > 0 {
        s.push("container_spec_cpu_quota", r.cpu_quota as u64, &[]);
    }
    s.push(
        "container_spec_cpu_shares",
        if r.cpu_shares > 0 {
            r.cpu_shares as u64
        } else {
            1024
        },
        &[],
    );
    s.push(
        "container_start_time_seconds",
        (rec.started_at.max(0) as u64) / NS_PER_SEC,
        &[],
    );
    s.push("container_last_seen", (at.max(0) as u64) / NS_PER_SEC, &[]);
    ContainerMetrics {
        container_id: rec.id.clone(),
        metrics: s.out,
    }
}

fn pod_metrics(pod: &PodSample, at: i64) -> PodSandboxMetrics {
    let base = vec![
        String::new(),
        pod.cgroup
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        String::new(),
        pod.pod.id.clone(),
        pod.pod.metadata.namespace.clone(),
        pod.pod.metadata.name.clone(),
    ];
    let mut s = Series::new(base, at);
    if let Some(st) = &pod.stats {
        s.cpu(st);
        if let Some(m) = st.memory {
            s.push("container_memory_usage_bytes", m.usage, &[]);
            s.push("container_memory_working_set_bytes", m.working_set, &[]);
            s.push("container_memory_rss", m.rss, &[]);
            s.push("container_memory_cache", m.cache, &[]);
        }
    }
    if let Some(ifaces) = &pod.network {
        s.network(ifaces);
    }
    PodSandboxMetrics {
        pod_sandbox_id: pod.pod.id.clone(),
        metrics: s.out,
        container_metrics: pod
            .containers
            .iter()
            .map(|c| container_metrics(c, pod, at))
            .collect(),
    }
}

impl Cri {
    /// Every ready pod's metrics.
    async fn pod_metrics(&self) -> Result<Vec<PodSandboxMetrics>, Status> {
        let d = self.daemon.clone();
        let pods = d.pods.list(&ListFilter {
            id: String::new(),
            state: Some(PodState::Ready),
            labels: Default::default(),
        });
        let containers = d.containers.list();
        tokio::task::spawn_blocking(move || {
            let at = now_ns();
            pod_metrics::sample(
                &d.stats,
                &|c| d.containers.cgroup_of(c).map(|cg| cg.path().clone()),
                pods,
                &containers,
            )
            .iter()
            .map(|p| pod_metrics(p, at))
            .collect()
        })
        .await
        .map_err(internal)
    }

    pub(super) async fn list_metric_descriptors_impl(
        &self,
        _req: Request<ListMetricDescriptorsRequest>,
    ) -> Result<Response<ListMetricDescriptorsResponse>, Status> {
        Ok(Response::new(ListMetricDescriptorsResponse {
            descriptors: metric_descriptors(),
        }))
    }

    pub(super) async fn list_pod_sandbox_metrics_impl(
        &self,
        _req: Request<ListPodSandboxMetricsRequest>,
    ) -> Result<Response<ListPodSandboxMetricsResponse>, Status> {
        Ok(Response::new(ListPodSandboxMetricsResponse {
            pod_metrics: self.pod_metrics().await?,
        }))
    }

    pub(super) async fn stream_pod_sandbox_metrics_impl(
        &self,
        _req: Request<StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<ResponseStream<StreamPodSandboxMetricsResponse>>, Status> {
        let all = self.pod_metrics().await?;
        Ok(Response::new(batched(all, |pod_sandbox_metrics| {
            StreamPodSandboxMetricsResponse {
                pod_sandbox_metrics,
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_unique_and_cadvisors() {
        let descs = metric_descriptors();
        let mut names: Vec<&str> = descs.iter().map(|d| d.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), descs.len());
        for d in &descs {
            assert!(d.name.starts_with("container_"), "{}", d.name);
            assert!(!d.help.is_empty() && !d.label_keys.is_empty());
            assert_eq!(&d.label_keys[..6], &BASE_LABELS.map(String::from));
        }
        for must in [
            "container_cpu_usage_seconds_total",
            "container_memory_working_set_bytes",
            "container_network_receive_bytes_total",
            "container_fs_usage_bytes",
            "container_oom_events_total",
        ] {
            assert!(names.contains(&must), "{must}");
        }
    }

    #[test]
    fn series_match_their_descriptors() {
        use crust_cgroups::stats::*;
        let st = Stats {
            cpu: Some(CpuStats {
                usage_ns: 2_500_000_000,
                ..Default::default()
            }),
            memory: Some(MemoryStats {
                usage: 70 << 20,
                working_set: 66 << 20,
                swap: Some(0),
                kernel: Some(1),
                max_usage: Some(80 << 20),
                limit_hits: Some(0),
                oom_kills: Some(1),
                ..Default::default()
            }),
            psi: Some(PsiStats {
                cpu: Some(Pressure {
                    some: PressureLine {
                        total_us: 3_000_000,
                        ..Default::default()
                    },
                    full: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut s = Series::new(vec!["c".into(); 6], 7);
        s.cpu(&st);
        s.memory(&st);
        s.pressure(&st);
        s.network(&[crust_linux::netstats::InterfaceStats {
            name: "eth0".into(),
            rx_bytes: 5,
            ..Default::default()
        }]);
        let descs = metric_descriptors();
        for m in &s.out {
            let d = descs.iter().find(|d| d.name == m.name).unwrap();
            assert_eq!(d.label_keys.len(), m.label_values.len(), "{}", m.name);
            assert_eq!(m.timestamp, 7);
        }
        let value = |name: &str| {
            s.out
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.value.unwrap().value)
        };
        // Whole seconds, as CRI's integer values allow.
        assert_eq!(value("container_cpu_usage_seconds_total"), Some(2));
        assert_eq!(value("container_memory_working_set_bytes"), Some(66 << 20));
        assert_eq!(value("container_oom_events_total"), Some(1));
        assert_eq!(
            value("container_pressure_cpu_waiting_seconds_total"),
            Some(3)
        );
        assert_eq!(value("container_pressure_cpu_stalled_seconds_total"), None);
        assert_eq!(value("container_network_receive_bytes_total"), Some(5));
        let rx = s
            .out
            .iter()
            .find(|m| m.name == "container_network_receive_bytes_total")
            .unwrap();
        assert_eq!(rx.label_values.last().unwrap(), "eth0");
        assert_eq!(rx.metric_type, MetricType::Counter as i32);
    }
}
