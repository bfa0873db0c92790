//! OpenTelemetry tracing through the real daemon (`[tracing] endpoint`):
//! spans go to the harness's OTLP receiver on 127.0.0.1; a CRI call
//! continues the W3C trace context its client sends (as kubelet's otelgrpc
//! client does, in the `traceparent` metadata); the life-cycle steps are
//! spans under the call's; a pull has a span per layer; the call's log
//! lines carry the trace id; without an endpoint nothing is sent.

use std::time::Duration;

use crust_test_support::crust_api::{v1, v1alpha2};
use crust_test_support::otlp::{ReceivedSpan, Receiver, SPAN_KIND_SERVER, descends_from, describe};
use crust_test_support::registry::*;
use crust_test_support::tonic;
use crust_test_support::{
    Daemon, DaemonBuilder, TestNetwork, WithImage, container_config, daemon_with_image,
    host_network_pod, pod_metadata,
};

/// The caller's trace (W3C example ids) and sampled flag.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// How long a batch of spans may take to arrive (the daemon exports every
/// 200 ms here: `OTEL_BSP_SCHEDULE_DELAY`; 5 s by default).
const ARRIVAL: Duration = Duration::from_secs(30);

fn traceparent(parent_span_id: &str) -> String {
    format!("00-{TRACE_ID}-{parent_span_id}-01")
}

/// `msg` with the caller's trace context as gRPC metadata.
fn traced<T>(msg: T, parent_span_id: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("traceparent", traceparent(parent_span_id).parse().unwrap());
    req.metadata_mut()
        .insert("tracestate", "crust=test".parse().unwrap());
    req
}

/// A daemon that exports to `receiver`, quickly.
fn traced_daemon(receiver: &Receiver, more: &str) -> DaemonBuilder {
    Daemon::builder()
        .config(&format!(
            "[tracing]\nendpoint = \"{}\"\n{more}",
            receiver.endpoint()
        ))
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
}

fn image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep"]).dir("tmp/").finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The one span named `name`; panics with all spans otherwise.
fn one<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "one span {name} expected, got:\n{}",
        describe(spans)
    );
    found[0]
}

fn has(spans: &[ReceivedSpan], names: &[&str]) -> bool {
    names.iter().all(|n| spans.iter().any(|s| s.name == *n))
}

/// RunPodSandbox (CNI network), CreateContainer and StartContainer, each
/// with the caller's context: each is a server span of the caller's trace
/// whose parent is the caller's span; CNI ADD, the monitor's start and the
/// container's create and start are spans under them; the text log's line
/// of the pod's start carries the trace id.
#[tokio::test(flavor = "multi_thread")]
async fn cri_calls_continue_the_callers_trace_with_their_steps_under_them() {
    let receiver = Receiver::start();
    let WithImage {
        daemon: d,
        registry: _registry,
        image,
    } = daemon_with_image(traced_daemon(&receiver, ""), "test/trace", &image()).await;
    let net = TestNetwork::install(&d, &[]);
    let mut rt = d.runtime_v1().await;
    let logs = tempfile::tempdir().unwrap();
    let config = v1::PodSandboxConfig {
        metadata: pod_metadata("traced", "crust-test"),
        hostname: "traced".into(),
        log_directory: logs.path().display().to_string(),
        linux: Some(v1::LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    let pod_id = rt
        .run_pod_sandbox(traced(
            v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            },
            "00f067aa0ba902b7",
        ))
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", d.logs()))
        .into_inner()
        .pod_sandbox_id;
    let id = rt
        .create_container(traced(
            v1::CreateContainerRequest {
                pod_sandbox_id: pod_id.clone(),
                config: Some(container_config("c", &image)),
                sandbox_config: Some(config),
            },
            "00f067aa0ba902b8",
        ))
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", d.logs()))
        .into_inner()
        .container_id;
    rt.start_container(traced(
        v1::StartContainerRequest { container_id: id },
        "00f067aa0ba902b9",
    ))
    .await
    .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", d.logs()));

    let run = "runtime.v1.RuntimeService/RunPodSandbox";
    let create = "runtime.v1.RuntimeService/CreateContainer";
    let start = "runtime.v1.RuntimeService/StartContainer";
    let steps = [
        "cni.add",
        "container.create",
        "monitor.start",
        "container.start",
    ];
    let spans = receiver
        .wait_for(ARRIVAL, |s| has(s, &[run, create, start]) && has(s, &steps))
        .await;
    for (name, parent) in [
        (run, "00f067aa0ba902b7"),
        (create, "00f067aa0ba902b8"),
        (start, "00f067aa0ba902b9"),
    ] {
        let s = one(&spans, name);
        assert_eq!(s.trace_id, TRACE_ID, "{name}:\n{}", describe(&spans));
        assert_eq!(s.parent_span_id, parent, "{name}:\n{}", describe(&spans));
        assert_eq!(s.kind, SPAN_KIND_SERVER, "{name}");
        assert_eq!(s.service_name, "crust");
        assert_eq!(s.attribute("rpc.system"), Some("grpc"), "{name}");
    }
    // monitor.start is also under RunPodSandbox when the pod has a pause
    // process (pause.start): the container's is under CreateContainer.
    for (step, call) in [
        ("cni.add", run),
        ("container.create", create),
        ("monitor.start", create),
        ("container.start", start),
    ] {
        let c = one(&spans, call);
        assert!(
            named(&spans, step)
                .into_iter()
                .any(|s| descends_from(&spans, s, c)),
            "no {step} under {call}:\n{}",
            describe(&spans)
        );
    }
    assert_eq!(
        one(&spans, "cni.add").attribute("network"),
        Some(net.name.as_str())
    );

    let log = d.logs();
    let ready = log
        .lines()
        .find(|l| l.contains("pod sandbox ready"))
        .unwrap_or_else(|| panic!("no \"pod sandbox ready\" line in\n{log}"));
    assert!(
        ready.contains(&format!("trace_id={TRACE_ID}")),
        "the call's log line has no trace id: {ready}"
    );
    d.remove_all_pods().await;
    drop(net);
}

/// A v1alpha2 PullImage of a 3-layer image: its server span (named as the
/// call came) has a span per layer under it, each with its fetch and its
/// unpack; the JSON log's line of the pull carries the trace id.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_has_a_span_per_layer_and_json_logs_carry_the_trace_id() {
    let receiver = Receiver::start();
    let registry = Registry::start();
    let img = noise_image(3);
    Pusher::new(&registry)
        .image("test/layers", "v1", &img)
        .await;
    let d = traced_daemon(&receiver, "")
        .arg("--log-format")
        .arg("json")
        .start()
        .await;
    let reference = format!("{}/test/layers:v1", registry.host);
    d.image_v1alpha2()
        .await
        .pull_image(traced(
            v1alpha2::PullImageRequest {
                image: Some(v1alpha2::ImageSpec {
                    image: reference.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            "00f067aa0ba902ba",
        ))
        .await
        .unwrap_or_else(|e| panic!("PullImage: {e}\n{}", d.logs()));

    let call = "runtime.v1alpha2.ImageService/PullImage";
    let spans = receiver
        .wait_for(ARRIVAL, |s| {
            has(s, &[call]) && named(s, "layer.unpack").len() == 3
        })
        .await;
    let server = one(&spans, call);
    assert_eq!(server.trace_id, TRACE_ID);
    assert_eq!(server.parent_span_id, "00f067aa0ba902ba");
    let pull = one(&spans, "image.pull");
    assert!(descends_from(&spans, pull, server), "{}", describe(&spans));
    let layers = named(&spans, "image.layer");
    assert_eq!(layers.len(), 3, "{}", describe(&spans));
    let mut digests: Vec<&str> = layers
        .iter()
        .filter_map(|l| l.attribute("digest"))
        .collect();
    digests.sort();
    let mut want: Vec<String> = img.layers.iter().map(|l| l.digest()).collect();
    want.sort();
    assert_eq!(digests, want, "{}", describe(&spans));
    for layer in &layers {
        assert!(descends_from(&spans, layer, pull), "{}", describe(&spans));
        for step in ["layer.fetch", "layer.unpack"] {
            let under: Vec<_> = named(&spans, step)
                .into_iter()
                .filter(|s| s.parent_span_id == layer.span_id)
                .collect();
            assert_eq!(under.len(), 1, "{step} of {layer:?}:\n{}", describe(&spans));
        }
    }

    let log = d.logs();
    let line = log
        .lines()
        .find(|l| l.contains("pulling image"))
        .unwrap_or_else(|| panic!("no \"pulling image\" line in\n{log}"));
    let json: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(
        json["span"]["trace_id"].as_str(),
        Some(TRACE_ID),
        "the call's JSON log line has no trace id: {line}"
    );
}

/// Without `[tracing] endpoint` (and with the OTLP environment variables an
/// SDK would honour pointing at the receiver) the daemon never connects to
/// it and logs no trace id, even for a sampled caller's calls. The same
/// calls with the endpoint set connect and export (so the receiver's count
/// is seen to work).
#[tokio::test(flavor = "multi_thread")]
async fn without_an_endpoint_nothing_is_sent() {
    let receiver = Receiver::start();
    let calls = |d: &Daemon| {
        let socket = d.socket.clone();
        async move {
            let mut rt = v1::runtime_service_client::RuntimeServiceClient::new(
                crust_test_support::connect(&socket).await.unwrap(),
            );
            rt.run_pod_sandbox(traced(
                v1::RunPodSandboxRequest {
                    config: Some(host_network_pod("untraced", "crust-test")),
                    runtime_handler: String::new(),
                },
                "00f067aa0ba902bb",
            ))
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"));
            rt.version(traced(v1::VersionRequest::default(), "00f067aa0ba902bc"))
                .await
                .unwrap();
        }
    };

    let mut off = Daemon::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .start()
        .await;
    calls(&off).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    off.remove_all_pods().await;
    off.stop().await;
    assert_eq!(receiver.connections(), 0, "{}", describe(&receiver.spans()));
    assert!(receiver.spans().is_empty());
    let log = off.logs();
    assert!(!log.contains(TRACE_ID), "a trace id in the log:\n{log}");

    let on = traced_daemon(&receiver, "").start().await;
    calls(&on).await;
    let spans = receiver
        .wait_for(ARRIVAL, |s| has(s, &["runtime.v1.RuntimeService/Version"]))
        .await;
    assert!(receiver.connections() > 0);
    assert!(
        has(&spans, &["runtime.v1.RuntimeService/RunPodSandbox"]),
        "{}",
        describe(&spans)
    );
    on.remove_all_pods().await;
}
