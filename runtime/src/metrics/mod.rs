//! The daemon's metrics (Prometheus / OpenMetrics) and its health, served
//! over plain HTTP when `[metrics] address` is set.
//!
//! - [`Metrics`]: the registry and the handles the rest of the daemon
//!   records into (CRI calls through [`grpc::RpcMetricsLayer`], image
//!   pulls, CNI calls), plus what is read at scrape time: the node's pods
//!   and containers (a [`NodeCounts`] source set once the daemon is open),
//!   the process figures ([`process`]) and the build.
//! - [`health`]: what `GET /healthz` answers.
//! - [`http`]: the endpoint itself.
//!
//! Nothing here knows of tonic or of the daemon's domain modules: the
//! counts come through a function the daemon hands in.

pub mod grpc;
pub mod health;
pub mod http;
mod process;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Latency buckets of CRI calls (seconds): 100 µs (Version) to 2 min
/// (image pulls, long stops).
const RPC_BUCKETS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0,
];
/// Image pull durations (seconds).
const PULL_BUCKETS: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// CNI ADD / DEL durations (seconds).
const CNI_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A gRPC method as labels; calls to paths no proto of ours defines are
/// all `unknown`, so clients cannot grow the label set.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub service: &'static str,
    pub method: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    service: &'static str,
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CniLabels {
    operation: &'static str,
    result: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// What the node holds, counted at scrape time (and for `crust status`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeCounts {
    /// Pod sandboxes by state, every state listed (zeros too).
    pub pods: Vec<(&'static str, u64)>,
    /// Containers by state, every state listed.
    pub containers: Vec<(&'static str, u64)>,
    /// Container monitors (`crust-shim`) the daemon watches.
    pub monitors: u64,
    /// Open exec / attach / port-forward sessions by kind.
    pub streaming_sessions: Vec<(&'static str, u64)>,
}

pub type NodeCountsFn = Box<dyn Fn() -> NodeCounts + Send + Sync>;

/// A CRI call being served, for the in-flight gauge and the state dump.
#[derive(Debug, Clone)]
pub struct InFlightCall {
    pub labels: MethodLabels,
    pub started: Instant,
}

/// The daemon's metrics. Made once at start; recording is lock-free but
/// for the first use of a label set.
pub struct Metrics {
    registry: Registry,
    methods: HashMap<&'static str, MethodLabels>,
    rpcs: Family<RpcLabels, Counter>,
    rpc_seconds: HistogramFamily<MethodLabels>,
    in_flight: Arc<InFlight>,
    pulls: Family<ResultLabels, Counter>,
    pull_bytes: Counter,
    pull_seconds: HistogramFamily<ResultLabels>,
    cni_seconds: HistogramFamily<CniLabels>,
    reloads: Family<ResultLabels, Counter>,
    signatures: Family<ResultLabels, Counter>,
    node: Arc<NodeCollector>,
    orphaned_bytes: Family<KindLabels, Gauge>,
    orphans: Family<KindLabels, Gauge>,
}

/// What a signature policy decided for a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureResult {
    /// Signed as the policy requires (sigstoreSigned), signature verified.
    Verified,
    /// The policy accepts it unsigned (insecureAcceptAnything).
    Accepted,
    /// The policy refused it (or could not be used).
    Refused,
}

impl SignatureResult {
    fn label(self) -> &'static str {
        match self {
            SignatureResult::Verified => "verified",
            SignatureResult::Accepted => "accepted",
            SignatureResult::Refused => "refused",
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

const UNKNOWN_METHOD: MethodLabels = MethodLabels {
    service: "unknown",
    method: "unknown",
};

impl Metrics {
    pub fn new() -> Metrics {
        // No prefix: collectors name their families in full, and the
        // process_* families keep their standard names.
        let mut registry = Registry::default();
        let rpcs = Family::<RpcLabels, Counter>::default();
        registry.register(
            "crust_cri_requests",
            "gRPC calls served on the CRI socket (CRI v1 and v1alpha2, crust's admin API) by method and status code",
            rpcs.clone(),
        );
        let rpc_seconds: HistogramFamily<MethodLabels> =
            Family::new_with_constructor(|| Histogram::new(RPC_BUCKETS));
        registry.register_with_unit(
            "crust_cri_request_duration",
            "Time from a call's arrival to its status (a stream's whole life for streaming calls)",
            Unit::Seconds,
            rpc_seconds.clone(),
        );
        let in_flight = Arc::new(InFlight::default());
        registry.register_collector(Box::new(in_flight.clone()));
        let pulls = Family::<ResultLabels, Counter>::default();
        registry.register(
            "crust_image_pulls",
            "Image pulls (PullImage and `crust images pull`) by result",
            pulls.clone(),
        );
        let pull_bytes = Counter::default();
        registry.register_with_unit(
            "crust_image_pull",
            "Bytes downloaded from registries by image pulls (blobs already present not counted)",
            Unit::Bytes,
            pull_bytes.clone(),
        );
        let pull_seconds: HistogramFamily<ResultLabels> =
            Family::new_with_constructor(|| Histogram::new(PULL_BUCKETS));
        registry.register_with_unit(
            "crust_image_pull_duration",
            "Duration of image pulls by result",
            Unit::Seconds,
            pull_seconds.clone(),
        );
        let cni_seconds: HistogramFamily<CniLabels> =
            Family::new_with_constructor(|| Histogram::new(CNI_BUCKETS));
        registry.register_with_unit(
            "crust_cni_operation_duration",
            "Duration of CNI ADD and DEL of pod networks by result",
            Unit::Seconds,
            cni_seconds.clone(),
        );
        let reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "crust_config_reloads",
            "Config reloads (SIGHUP and `crust reload`) by result: success (the file was read \
             and what can change in a running daemon was applied) or failure (nothing changed)",
            reloads.clone(),
        );
        let signatures = Family::<ResultLabels, Counter>::default();
        registry.register(
            "crust_image_signature_checks",
            "Image pulls checked against a signature policy (image.signature_policy, \
             image.signature_policy_dir) by result: verified (signatures the policy requires \
             were verified), accepted (the policy takes the image unsigned: \
             insecureAcceptAnything) or refused (nothing of the image was kept)",
            signatures.clone(),
        );
        for result in [
            SignatureResult::Verified,
            SignatureResult::Accepted,
            SignatureResult::Refused,
        ] {
            let _ = signatures.get_or_create(&ResultLabels {
                result: result.label(),
            });
        }
        let node = Arc::new(NodeCollector::default());
        registry.register_collector(Box::new(node.clone()));
        let orphaned_bytes = Family::<KindLabels, Gauge>::default();
        registry.register_with_unit(
            "crust_orphaned",
            "Bytes on disk that nothing references, by kind, as the last `crust check` left them",
            Unit::Bytes,
            orphaned_bytes.clone(),
        );
        let orphans = Family::<KindLabels, Gauge>::default();
        registry.register(
            "crust_orphans",
            "Things nothing references (files, mounts, processes, cgroups, records), by kind, as the last `crust check` left them",
            orphans.clone(),
        );
        registry.register(
            "crust_build",
            "The crust build",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                profile: if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                },
            }),
        );
        // Standard process_* names, without the crust prefix.
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        // Known label values start at zero, so that the series exist (and
        // rates work) before the first pull or CNI call.
        for result in ["success", "failure"] {
            let labels = ResultLabels { result };
            let _ = pulls.get_or_create(&labels);
            let _ = pull_seconds.get_or_create(&labels);
            let _ = reloads.get_or_create(&labels);
            for operation in ["add", "del"] {
                let _ = cni_seconds.get_or_create(&CniLabels { operation, result });
            }
        }
        let methods = crust_api::GRPC_METHODS
            .iter()
            .filter_map(|path| Some((*path, method_labels(path)?)))
            .collect();
        Metrics {
            registry,
            methods,
            rpcs,
            rpc_seconds,
            in_flight,
            pulls,
            pull_bytes,
            pull_seconds,
            cni_seconds,
            reloads,
            signatures,
            node,
            orphaned_bytes,
            orphans,
        }
    }

    /// What the last `crust check` left, by kind: (kind, count, bytes).
    pub fn orphans(&self, by_kind: &[(&'static str, u64, u64)]) {
        for &(kind, count, bytes) in by_kind {
            let labels = KindLabels { kind };
            self.orphans
                .get_or_create(&labels)
                .set(count.try_into().unwrap_or(i64::MAX));
            self.orphaned_bytes
                .get_or_create(&labels)
                .set(bytes.try_into().unwrap_or(i64::MAX));
        }
    }

    /// Where the node's pods and containers are counted at scrape time;
    /// set once when the daemon is open (until then they are not
    /// reported).
    pub fn set_node_counts(&self, f: NodeCountsFn) {
        let _ = self.node.source.set(f);
    }

    /// The OpenMetrics text of every metric (what `GET /metrics` serves).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The labels of the gRPC method at `path` (`unknown` for any other).
    pub fn method(&self, path: &str) -> MethodLabels {
        self.methods.get(path).copied().unwrap_or(UNKNOWN_METHOD)
    }

    /// Counts a CRI call that started and is now being served.
    pub fn start_call(self: &Arc<Self>, path: &str) -> CallGuard {
        let labels = self.method(path);
        let id = self.in_flight.insert(labels);
        CallGuard {
            metrics: self.clone(),
            labels,
            id,
            started: Instant::now(),
            code: Some(grpc::CANCELLED),
        }
    }

    /// The calls being served now, oldest first.
    pub fn in_flight(&self) -> Vec<InFlightCall> {
        let mut calls: Vec<InFlightCall> = self.in_flight.calls().into_values().collect();
        calls.sort_by_key(|c| c.started);
        calls
    }

    /// Records one image pull: how it ended, the bytes it downloaded and
    /// how long it took.
    pub fn image_pull(&self, ok: bool, bytes: u64, took: Duration) {
        let labels = ResultLabels {
            result: if ok { "success" } else { "failure" },
        };
        self.pulls.get_or_create(&labels).inc();
        self.pull_bytes.inc_by(bytes);
        self.pull_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records what a signature policy decided for one pull.
    pub fn image_signature(&self, result: SignatureResult) {
        self.signatures
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc();
    }

    /// Records one config reload: whether the file was applied.
    pub fn config_reload(&self, ok: bool) {
        let labels = ResultLabels {
            result: if ok { "success" } else { "failure" },
        };
        self.reloads.get_or_create(&labels).inc();
    }

    /// Records one CNI ADD (`add == true`) or DEL of a pod network.
    pub fn cni_operation(&self, add: bool, ok: bool, took: Duration) {
        let labels = CniLabels {
            operation: if add { "add" } else { "del" },
            result: if ok { "success" } else { "failure" },
        };
        self.cni_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    fn finish_call(&self, id: u64, labels: MethodLabels, code: &'static str, took: Duration) {
        self.in_flight.remove(id);
        self.rpcs
            .get_or_create(&RpcLabels {
                service: labels.service,
                method: labels.method,
                code,
            })
            .inc();
        self.rpc_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// `/pkg.Service/Method` as labels.
fn method_labels(path: &'static str) -> Option<MethodLabels> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some(MethodLabels { service, method })
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    profile: &'static str,
}

/// One CRI call from its arrival to its status. Recorded once: with the
/// status code it ended with, or `Cancelled` when it is dropped first (the
/// client went away).
pub struct CallGuard {
    metrics: Arc<Metrics>,
    labels: MethodLabels,
    id: u64,
    started: Instant,
    code: Option<&'static str>,
}

impl CallGuard {
    /// The call ended with gRPC status `code` (its numeric value as text,
    /// as the `grpc-status` header carries it).
    pub fn finish(mut self, code: &[u8]) {
        self.code = Some(grpc::code_name(code));
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(code) = self.code.take() {
            let took = self.started.elapsed();
            tracing::debug!(
                service = self.labels.service,
                method = self.labels.method,
                code,
                micros = took.as_micros() as u64,
                "gRPC call"
            );
            self.metrics.finish_call(self.id, self.labels, code, took);
        }
    }
}

/// The calls being served.
#[derive(Debug, Default)]
struct InFlight {
    next: AtomicU64,
    calls: Mutex<HashMap<u64, InFlightCall>>,
}

impl InFlight {
    fn insert(&self, labels: MethodLabels) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            InFlightCall {
                labels,
                started: Instant::now(),
            },
        );
        id
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn calls(&self) -> HashMap<u64, InFlightCall> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, InFlightCall>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Collector for InFlight {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut by_method: HashMap<MethodLabels, i64> = HashMap::new();
        for call in self.lock().values() {
            *by_method.entry(call.labels).or_default() += 1;
        }
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "crust_cri_requests_in_flight",
            "gRPC calls being served now (streams included) by method",
            None,
            gauge.metric_type(),
        )?;
        for (labels, n) in by_method {
            ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Pods, containers, monitors and streaming sessions, read at scrape time.
#[derive(Default)]
struct NodeCollector {
    source: OnceLock<NodeCountsFn>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCollector").finish_non_exhaustive()
    }
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(source) = self.source.get() else {
            return Ok(());
        };
        let counts = source();
        let gauge_type = ConstGauge::new(0i64).metric_type();
        for (name, help, by_state) in [
            (
                "crust_pod_sandboxes",
                "Pod sandboxes by state",
                &counts.pods,
            ),
            (
                "crust_containers",
                "Containers by state",
                &counts.containers,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, gauge_type)?;
            for (state, n) in by_state {
                ConstGauge::new(*n as i64).encode(family.encode_family(&StateLabels { state })?)?;
            }
        }
        ConstGauge::new(counts.monitors as i64).encode(encoder.encode_descriptor(
            "crust_monitors",
            "Container monitors (crust-shim) alive and watched by the daemon: one per created or running container",
            None,
            gauge_type,
        )?)?;
        let mut family = encoder.encode_descriptor(
            "crust_streaming_sessions",
            "Open exec, attach and port-forward sessions by kind",
            None,
            gauge_type,
        )?;
        for (kind, n) in &counts.streaming_sessions {
            ConstGauge::new(*n as i64).encode(family.encode_family(&KindLabels { kind })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_known_by_path_and_others_are_unknown() {
        let m = Metrics::new();
        assert_eq!(
            m.method("/runtime.v1.RuntimeService/Version"),
            MethodLabels {
                service: "runtime.v1.RuntimeService",
                method: "Version"
            }
        );
        assert_eq!(
            m.method("/runtime.v1alpha2.ImageService/PullImage").service,
            "runtime.v1alpha2.ImageService"
        );
        assert_eq!(m.method("/crust.admin.v1.Daemon/Status").method, "Status");
        assert_eq!(m.method("/x.Y/Z"), UNKNOWN_METHOD);
        assert_eq!(m.method("/runtime.v1.RuntimeService/Nope"), UNKNOWN_METHOD);
    }

    #[test]
    fn calls_are_counted_once_with_their_code_or_as_cancelled() {
        let m = Arc::new(Metrics::new());
        m.start_call("/runtime.v1.RuntimeService/Version")
            .finish(b"0");
        m.start_call("/runtime.v1.RuntimeService/Version")
            .finish(b"5");
        let pending = m.start_call("/runtime.v1.RuntimeService/ListContainers");
        assert_eq!(m.in_flight().len(), 1);
        let text = m.encode();
        assert!(
            text.contains(
                "crust_cri_requests_in_flight{service=\"runtime.v1.RuntimeService\",method=\"ListContainers\"} 1"
            ),
            "{text}"
        );
        drop(pending);
        assert!(m.in_flight().is_empty());
        let text = m.encode();
        for line in [
            "crust_cri_requests_total{service=\"runtime.v1.RuntimeService\",method=\"Version\",code=\"OK\"} 1",
            "crust_cri_requests_total{service=\"runtime.v1.RuntimeService\",method=\"Version\",code=\"NotFound\"} 1",
            "crust_cri_requests_total{service=\"runtime.v1.RuntimeService\",method=\"ListContainers\",code=\"Canceled\"} 1",
            "crust_cri_request_duration_seconds_count{service=\"runtime.v1.RuntimeService\",method=\"Version\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn pulls_cni_and_node_counts_are_encoded() {
        let m = Metrics::new();
        m.image_pull(true, 1000, Duration::from_millis(300));
        m.image_pull(false, 10, Duration::from_millis(50));
        m.cni_operation(true, true, Duration::from_millis(20));
        m.orphans(&[("image_blobs", 2, 12345)]);
        m.config_reload(false);
        m.set_node_counts(Box::new(|| NodeCounts {
            pods: vec![("ready", 2), ("notready", 0)],
            containers: vec![("running", 3)],
            monitors: 3,
            streaming_sessions: vec![("exec", 1)],
        }));
        let text = m.encode();
        for line in [
            "crust_image_pulls_total{result=\"success\"} 1",
            "crust_image_pulls_total{result=\"failure\"} 1",
            "crust_image_pull_bytes_total 1010",
            "crust_image_pull_duration_seconds_count{result=\"success\"} 1",
            "crust_cni_operation_duration_seconds_count{operation=\"add\",result=\"success\"} 1",
            "crust_config_reloads_total{result=\"success\"} 0",
            "crust_config_reloads_total{result=\"failure\"} 1",
            "crust_pod_sandboxes{state=\"ready\"} 2",
            "crust_pod_sandboxes{state=\"notready\"} 0",
            "crust_containers{state=\"running\"} 3",
            "crust_monitors 3",
            "crust_streaming_sessions{kind=\"exec\"} 1",
            "crust_orphaned_bytes{kind=\"image_blobs\"} 12345",
            "crust_orphans{kind=\"image_blobs\"} 2",
            "crust_build_info{version=\"",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "# EOF",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
