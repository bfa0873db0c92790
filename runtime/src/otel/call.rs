//! The tower layer that makes every CRI call a server span: named by its
//! full method as it came (`runtime.v1alpha2.ImageService/PullImage` for a
//! v1alpha2 call), child of the caller's W3C trace context (the
//! `traceparent` / `tracestate` gRPC metadata kubelet's otelgrpc client
//! sends), with the trace id as a field so that the call's log lines carry
//! it. With tracing off it makes no span and passes every call through.

use std::task::{Context, Poll};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tower::{Layer, Service};
use tracing::Span;
use tracing::instrument::{Instrument, Instrumented};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The CRI services (v1 and v1alpha2); crust's admin API is not traced.
const CRI_PREFIXES: [&str; 4] = [
    "/runtime.v1.RuntimeService/",
    "/runtime.v1.ImageService/",
    "/runtime.v1alpha2.RuntimeService/",
    "/runtime.v1alpha2.ImageService/",
];

/// A span name is a method name; anything longer is not a CRI method
/// (tonic answers Unimplemented) and is clipped.
const MAX_NAME: usize = 96;

#[derive(Debug, Clone, Copy)]
pub struct CriTraceLayer {
    on: bool,
}

impl CriTraceLayer {
    /// `on`: tracing is configured (an OTel layer is installed).
    pub fn new(on: bool) -> CriTraceLayer {
        CriTraceLayer { on }
    }
}

impl<S> Layer<S> for CriTraceLayer {
    type Service = CriTrace<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CriTrace { inner, on: self.on }
    }
}

#[derive(Debug, Clone)]
pub struct CriTrace<S> {
    inner: S,
    on: bool,
}

impl<S, B, RB> Service<http::Request<B>> for CriTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<StatusFuture<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let span = if self.on {
            call_span(&req)
        } else {
            Span::none()
        };
        let inner = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        StatusFuture {
            inner,
            span: span.clone(),
        }
        .instrument(span)
    }
}

/// The server span of a CRI call (`Span::none()` for anything else).
fn call_span<B>(req: &http::Request<B>) -> Span {
    let path = req.uri().path();
    if !CRI_PREFIXES.iter().any(|p| path.starts_with(p)) {
        return Span::none();
    }
    let name = crust_quote::truncate(&path[1..], MAX_NAME);
    let span = tracing::info_span!(
        target: super::TARGET,
        "cri",
        otel.name = %name,
        otel.kind = "server",
        trace_id = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&Metadata(req.headers()));
    // Fails only when the span is disabled (tracing off after all).
    let _ = span.set_parent(parent);
    let (service, method) = name.rsplit_once('/').unwrap_or((name.as_str(), ""));
    span.set_attribute("rpc.system", "grpc");
    span.set_attribute("rpc.service", service.to_string());
    span.set_attribute("rpc.method", method.to_string());
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        span.record("trace_id", tracing::field::display(span_context.trace_id()));
    }
    span
}

/// gRPC metadata as the W3C propagator reads it (lower-case keys, as
/// HTTP/2 carries them).
struct Metadata<'a>(&'a http::HeaderMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

pin_project_lite::pin_project! {
    /// A call's response future that puts a trailers-only answer's status
    /// (every error of a unary call) on its span, as otelgrpc does.
    pub struct StatusFuture<F> {
        #[pin]
        inner: F,
        span: Span,
    }
}

impl<F, RB, E> std::future::Future for StatusFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx));
        if !this.span.is_none()
            && let Ok(resp) = &res
            && let Some(code) = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i64>().ok())
        {
            this.span.set_attribute("rpc.grpc.status_code", code);
            if server_fault(code) {
                let message = resp
                    .headers()
                    .get("grpc-message")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                this.span
                    .set_status(Status::error(crust_quote::truncate(message, 256)));
            }
        }
        Poll::Ready(res)
    }
}

/// The codes otelgrpc marks a server span as failed for: the server's
/// fault, not the client's (Unknown, DeadlineExceeded, Unimplemented,
/// Internal, Unavailable, DataLoss).
fn server_fault(code: i64) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_w3c_metadata() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        let cx = TraceContextPropagator::new().extract(&Metadata(&headers));
        let sc = cx.span().span_context().clone();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
    }

    #[test]
    fn only_cri_calls_get_spans_and_faults_are_the_servers() {
        let req = |p: &str| http::Request::builder().uri(p).body(()).unwrap();
        // No subscriber here: every span is disabled; what matters is
        // that other services are not even asked for one.
        assert!(call_span(&req("/crust.admin.v1.Daemon/Status")).is_none());
        assert!(call_span(&req("/grpc.health.v1.Health/Check")).is_none());
        assert!(server_fault(13) && server_fault(14) && !server_fault(3) && !server_fault(5));
    }
}
