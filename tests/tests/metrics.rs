//! Stats values and CRI metrics end to end: a real daemon, a container
//! that allocates memory and burns CPU, bytes sent from the host to a pod
//! over its IP on a real CNI bridge. The figures are checked against what
//! the test made happen, not just for presence.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, TestNetwork, WithImage, container_config, daemon_with_image, pod_metadata,
    run_container, run_pod,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

const MIB: u64 = 1 << 20;

fn test_image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep", "head", "tr", "cat", "true"])
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

struct Env {
    // Field order = drop order: pods (and their containers) go first.
    net: TestNetwork,
    _d: Daemon,
    _reg: Registry,
    image: String,
    /// The image's ID, which kubelet puts in CreateContainer's image.
    image_id: String,
    rt: Rt,
}

async fn env() -> Env {
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(Daemon::builder(), "test/metrics", &test_image()).await;
    let image_id = test_image().id();
    let net = TestNetwork::install(&d, &[]);
    let rt = d.runtime_v1().await;
    Env {
        net,
        rt,
        _d: d,
        _reg: reg,
        image,
        image_id,
    }
}

impl Env {
    async fn pod(&mut self, name: &str, host_network: bool) -> (String, v1::PodSandboxConfig) {
        let mut linux = v1::LinuxPodSandboxConfig::default();
        if host_network {
            linux.security_context = Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let config = v1::PodSandboxConfig {
            metadata: pod_metadata(name, "crust-metrics"),
            linux: Some(linux),
            ..Default::default()
        };
        run_pod(&mut self.rt, config, "").await
    }

    async fn run(
        &mut self,
        pod: &(String, v1::PodSandboxConfig),
        name: &str,
        cmd: &[&str],
    ) -> String {
        // As kubelet asks: the ID, and the pod's image as written.
        let config = v1::ContainerConfig {
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: String::new(),
            linux: Some(v1::LinuxContainerConfig::default()),
            image: Some(v1::ImageSpec {
                image: self.image_id.clone(),
                user_specified_image: self.image.clone(),
                ..Default::default()
            }),
            ..container_config(name, &self.image)
        };
        run_container(&mut self.rt, pod, config).await
    }

    async fn container_stats(&mut self, id: &str) -> v1::ContainerStats {
        self.rt
            .container_stats(v1::ContainerStatsRequest {
                container_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .stats
            .unwrap()
    }

    async fn pod_stats(&mut self, id: &str) -> v1::PodSandboxStats {
        self.rt
            .pod_sandbox_stats(v1::PodSandboxStatsRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .stats
            .unwrap()
    }

    async fn descriptors(&mut self) -> HashMap<String, Vec<String>> {
        self.rt
            .list_metric_descriptors(v1::ListMetricDescriptorsRequest {})
            .await
            .unwrap()
            .into_inner()
            .descriptors
            .into_iter()
            .map(|d| (d.name, d.label_keys))
            .collect()
    }

    async fn metrics(&mut self) -> Vec<v1::PodSandboxMetrics> {
        self.rt
            .list_pod_sandbox_metrics(v1::ListPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner()
            .pod_metrics
    }
}

/// The samples of `name` in `metrics` as label maps and values.
fn samples(
    metrics: &[v1::Metric],
    descs: &HashMap<String, Vec<String>>,
    name: &str,
) -> Vec<(HashMap<String, String>, u64)> {
    metrics
        .iter()
        .filter(|m| m.name == name)
        .map(|m| {
            let keys = &descs[name];
            assert_eq!(keys.len(), m.label_values.len(), "{m:?}");
            (
                keys.iter()
                    .cloned()
                    .zip(m.label_values.iter().cloned())
                    .collect(),
                m.value.unwrap().value,
            )
        })
        .collect()
}

fn container_metrics<'a>(pods: &'a [v1::PodSandboxMetrics], id: &str) -> &'a [v1::Metric] {
    pods.iter()
        .flat_map(|p| &p.container_metrics)
        .find(|c| c.container_id == id)
        .map(|c| c.metrics.as_slice())
        .unwrap_or_else(|| panic!("no metrics of container {id}: {pods:?}"))
}

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A container that holds 64 MiB and spins shows a working set of at least
/// that and a CPU counter that grows, in ContainerStats, in its pod's
/// PodSandboxStats and in the metrics, whose every series has its
/// descriptor's labels.
#[tokio::test(flavor = "multi_thread")]
async fn memory_and_cpu_of_a_busy_container() {
    let mut e = env().await;
    let pod = e.pod("hog", false).await;
    // The shell keeps 64 MiB of 'a's in a variable, then spins.
    let hog = e
        .run(
            &pod,
            "hog",
            &[
                "sh",
                "-c",
                "x=$(head -c 67108864 /dev/zero | tr '\\0' a); while :; do :; done",
            ],
        )
        .await;
    let idle = e.run(&pod, "idle", &["sleep", "1000"]).await;

    let stats = wait_for(
        "a 64 MiB working set",
        Duration::from_secs(60),
        async || {
            let s = e.container_stats(&hog).await;
            let ws = s.memory.as_ref()?.working_set_bytes?.value;
            (ws >= 64 * MIB).then_some(s)
        },
    )
    .await;
    let cpu0 = stats.cpu.unwrap().usage_core_nano_seconds.unwrap().value;
    wait_for(
        "the CPU counter to grow",
        Duration::from_secs(30),
        async || {
            let s = e.container_stats(&hog).await;
            let cpu = s.cpu?.usage_core_nano_seconds?.value;
            (cpu > cpu0 + 100_000_000).then_some(())
        },
    )
    .await;
    // The idle container holds far less.
    let idle_ws = e
        .container_stats(&idle)
        .await
        .memory
        .unwrap()
        .working_set_bytes
        .unwrap()
        .value;
    assert!(idle_ws < 16 * MIB, "idle working set {idle_ws}");
    // The pod's cgroup holds both.
    let ps = e.pod_stats(&pod.0).await;
    let linux = ps.linux.unwrap();
    assert!(linux.memory.unwrap().working_set_bytes.unwrap().value >= 64 * MIB);
    assert_eq!(linux.containers.len(), 2);
    assert!(linux.process.unwrap().process_count.unwrap().value >= 2);

    // Metrics: the same figures, cadvisor's names and labels.
    let descs = e.descriptors().await;
    let pods = e.metrics().await;
    let m = container_metrics(&pods, &hog);
    let ws = samples(m, &descs, "container_memory_working_set_bytes");
    assert_eq!(ws.len(), 1, "{ws:?}");
    let (labels, value) = &ws[0];
    assert!(*value >= 64 * MIB, "{value}");
    assert_eq!(labels["container"], "hog");
    assert_eq!(labels["pod"], "hog");
    assert_eq!(labels["namespace"], "crust-metrics");
    assert_eq!(labels["name"], hog);
    assert_eq!(labels["image"], e.image);
    assert!(labels["id"].contains(&hog), "{labels:?}");
    let cpu = |pods: &[v1::PodSandboxMetrics]| {
        let s = samples(
            container_metrics(pods, &hog),
            &descs,
            "container_cpu_usage_seconds_total",
        );
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].0["cpu"], "total");
        s[0].1
    };
    let cpu0 = cpu(&pods);
    wait_for(
        "container_cpu_usage_seconds_total to grow",
        Duration::from_secs(30),
        async || (cpu(&e.metrics().await) > cpu0).then_some(()),
    )
    .await;
    for (name, at_least) in [
        ("container_memory_usage_bytes", 64 * MIB),
        ("container_memory_rss", 64 * MIB),
        // The shell alone once `x` is filled.
        ("container_processes", 1),
        ("container_threads", 1),
        ("container_file_descriptors", 3),
        ("container_start_time_seconds", 1_700_000_000),
        ("container_spec_cpu_shares", 2),
    ] {
        let s = samples(m, &descs, name);
        assert!(
            s.len() == 1 && s[0].1 >= at_least,
            "{name} should be >= {at_least}: {s:?}"
        );
    }
    // The writable layer: the container wrote nothing, its fs has room.
    let limit = samples(m, &descs, "container_fs_limit_bytes");
    assert!(limit.len() == 1 && limit[0].1 > 0, "{limit:?}");
    assert_eq!(samples(m, &descs, "container_fs_usage_bytes").len(), 1);

    // Every series of every pod carries its descriptor's labels, and every
    // container-level metric this host keeps is there.
    for p in &pods {
        for metric in p
            .metrics
            .iter()
            .chain(p.container_metrics.iter().flat_map(|c| &c.metrics))
        {
            let keys = descs
                .get(&metric.name)
                .unwrap_or_else(|| panic!("{} has no descriptor", metric.name));
            assert_eq!(keys.len(), metric.label_values.len(), "{metric:?}");
        }
    }
    let host_keeps_no = |name: &str| {
        // Figures a host may lack: PSI, block I/O on these devices, a CPU
        // quota (none set here).
        name.starts_with("container_pressure_")
            || name.starts_with("container_fs_reads")
            || name.starts_with("container_fs_writes")
            || name == "container_blkio_device_usage_total"
            || name == "container_spec_cpu_quota"
            || name.starts_with("container_network_")
    };
    for name in descs.keys().filter(|n| !host_keeps_no(n)) {
        assert!(
            !samples(m, &descs, name).is_empty(),
            "no {name} for the container"
        );
    }
    // The pod level: the pod cgroup, container="".
    let pod_level = &pods
        .iter()
        .find(|p| p.pod_sandbox_id == pod.0)
        .unwrap()
        .metrics;
    let pod_ws = samples(pod_level, &descs, "container_memory_working_set_bytes");
    assert!(pod_ws.len() == 1 && pod_ws[0].1 >= 64 * MIB, "{pod_ws:?}");
    assert_eq!(pod_ws[0].0["container"], "");
    assert_eq!(pod_ws[0].0["name"], pod.0);

    // StreamPodSandboxMetrics says the same of the same pods.
    let mut stream =
        e.rt.stream_pod_sandbox_metrics(v1::StreamPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner();
    let mut streamed = Vec::new();
    while let Some(msg) = stream.message().await.unwrap() {
        streamed.extend(
            msg.pod_sandbox_metrics
                .into_iter()
                .map(|p| p.pod_sandbox_id),
        );
    }
    assert_eq!(streamed, vec![pod.0.clone()]);

    // PSI: there exactly where the kernel keeps it for the cgroup.
    let cgroup = labels["id"].clone();
    let pressure_file = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(|root| format!("{root}{cgroup}/cpu.pressure"))
        .find(|f| std::fs::read_to_string(f).is_ok());
    let s = e.container_stats(&hog).await;
    let psi = s.cpu.unwrap().psi;
    match pressure_file {
        Some(f) => {
            let psi = psi.unwrap_or_else(|| panic!("{f} is readable but stats have no PSI"));
            assert!(psi.some.is_some());
            assert!(s.memory.unwrap().psi.is_some());
            assert!(!samples(m, &descs, "container_pressure_cpu_waiting_seconds_total").is_empty());
        }
        None => {
            // Absent, and said so: a counted skip of the PSI values.
            crust_test_support::skipped(&format!(
                "PSI values: the kernel keeps no cpu.pressure for {cgroup} (a cgroup v1 container: PSI needs its cgroup on cgroup2)"
            ));
            assert!(psi.is_none(), "{psi:?}");
            assert!(s.io.is_none());
            assert!(samples(m, &descs, "container_pressure_cpu_waiting_seconds_total").is_empty());
        }
    }
    drop(e.net);
}

/// Bytes the host sends to a pod's IP show in its network stats and in
/// container_network_receive_bytes_total; a host-network pod has neither.
#[tokio::test(flavor = "multi_thread")]
async fn network_bytes_received_by_a_pod() {
    let mut e = env().await;
    let pod = e.pod("net", false).await;
    let _c = e.run(&pod, "idle", &["sleep", "1000"]).await;
    let status =
        e.rt.pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.0.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip: std::net::IpAddr = status.network.unwrap().ip.parse().unwrap();

    let rx = async |e: &mut Env| {
        let net = e
            .pod_stats(&pod.0)
            .await
            .linux
            .unwrap()
            .network
            .expect("pod network stats");
        let eth0 = net.default_interface.expect("a default interface");
        assert_eq!(eth0.name, "eth0");
        assert!(net.interfaces.iter().all(|i| i.name != "lo"));
        eth0.rx_bytes.unwrap().value
    };
    let before = rx(&mut e).await;
    // 200 datagrams of 1000 bytes: nobody listens, but eth0 receives
    // them all (and answers ICMP port unreachable).
    const COUNT: u64 = 200;
    const SIZE: usize = 1000;
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    for _ in 0..COUNT {
        let _ = sock.send_to(&[0x5a; SIZE], (ip, 9));
        std::thread::sleep(Duration::from_millis(1));
    }
    let sent = COUNT * SIZE as u64;
    let after = wait_for("the bytes in rx", Duration::from_secs(20), async || {
        let now = rx(&mut e).await;
        (now >= before + sent).then_some(now)
    })
    .await;
    // Headers and neighbour discovery add some, nothing adds megabytes.
    assert!(after - before < sent + 200 * 1024, "{before} -> {after}");

    let descs = e.descriptors().await;
    let pods = e.metrics().await;
    let p = pods.iter().find(|p| p.pod_sandbox_id == pod.0).unwrap();
    let rx_metric = samples(&p.metrics, &descs, "container_network_receive_bytes_total");
    let eth0 = rx_metric
        .iter()
        .find(|(l, _)| l["interface"] == "eth0")
        .unwrap_or_else(|| panic!("{rx_metric:?}"));
    assert!(eth0.1 >= before + sent, "{eth0:?}");
    assert_eq!(eth0.0["pod"], "net");
    assert_eq!(eth0.0["namespace"], "crust-metrics");
    assert_eq!(eth0.0["container"], "");
    for name in descs.keys().filter(|n| n.starts_with("container_network_")) {
        assert!(!samples(&p.metrics, &descs, name).is_empty(), "no {name}");
    }
    let packets = samples(
        &p.metrics,
        &descs,
        "container_network_receive_packets_total",
    );
    assert!(
        packets
            .iter()
            .any(|(l, v)| l["interface"] == "eth0" && *v >= COUNT)
    );

    // A host-network pod: no pod network figures of its own.
    let host = e.pod("hostnet", true).await;
    let _h = e.run(&host, "idle", &["sleep", "1000"]).await;
    assert!(e.pod_stats(&host.0).await.linux.unwrap().network.is_none());
    let pods = e.metrics().await;
    let h = pods.iter().find(|p| p.pod_sandbox_id == host.0).unwrap();
    assert!(
        h.metrics
            .iter()
            .all(|m| !m.name.starts_with("container_network_"))
    );
    assert_eq!(h.container_metrics.len(), 1);
    drop(e.net);
}
