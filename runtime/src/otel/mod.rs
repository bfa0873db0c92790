//! OpenTelemetry tracing (`[tracing] endpoint`): the daemon's `tracing`
//! spans of target [`TARGET`] become OTel spans (tracing-opentelemetry)
//! and go to an OTLP/gRPC collector in batches. Every CRI call is a server
//! span named as containerd names it (`runtime.v1.RuntimeService/RunPodSandbox`)
//! that continues the caller's W3C trace context ([`call`]); the
//! life-cycle steps under it (CNI ADD/DEL, monitor start, container
//! create/start, image pull per layer) are child spans made where the
//! step is.
//!
//! Off (no endpoint): no exporter, no OTel layer, and the log filter turns
//! [`TARGET`] off, so those spans are never made.

mod call;
mod section;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

pub use call::CriTraceLayer;
pub use section::TracingSection;

/// The `tracing` target of every span that becomes an OTel span (crust-image's
/// pull spans use it too). The log filter turns it on with tracing and off
/// without (see `logging`).
pub const TARGET: &str = crust_image::TRACE_TARGET;

/// A life-cycle step's span: `step!("cni.add", network = %name)`. A child
/// of the current span (the CRI call's); never made with tracing off.
macro_rules! step {
    ($name:literal $(, $($fields:tt)*)?) => {
        tracing::info_span!(target: $crate::otel::TARGET, $name $(, $($fields)*)?)
    };
}
pub(crate) use step;

/// How long one export may take before it is given up (the spans of that
/// batch are lost; the daemon does not wait on a collector).
const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The exporting side: the tracer the OTel layer makes spans with, and the
/// provider that batches and exports them.
pub struct Pipeline {
    pub tracer: SdkTracer,
    pub provider: SdkTracerProvider,
}

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("invalid config: {0}")]
    Config(String),
    #[error("cannot set up the OTLP exporter to {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
}

/// The pipeline of `section`; None when tracing is off. Must run inside
/// the daemon's tokio runtime: the gRPC channel (connected lazily, at the
/// first export) lives there, while batches are exported from the SDK's
/// own thread.
pub fn pipeline(section: &TracingSection) -> Result<Option<Pipeline>, OtelError> {
    let Some(uri) = section.endpoint_uri().map_err(OtelError::Config)? else {
        return Ok(None);
    };
    let endpoint = uri.to_string();
    let exporter = {
        use opentelemetry_otlp::WithExportConfig;
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
    };
    let exporter = exporter.map_err(|e| OtelError::Exporter {
        endpoint,
        message: e.to_string(),
    })?;
    // As CRI-O and kubelet: a caller's decision wins, the rate decides
    // for calls that come without one.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(section.ratio())));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(
            Resource::builder_empty()
                .with_service_name(section.service_name.trim().to_string())
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let tracer = provider.tracer("crust");
    Ok(Some(Pipeline { tracer, provider }))
}
