//! The tower layer that counts every gRPC call on the CRI socket once, by
//! method and status code, and times it. It sits outermost, before the
//! v1alpha2 rewrite, so a v1alpha2 call is counted under its own name.
//!
//! The status code is where gRPC puts it: the response headers of a
//! "trailers-only" answer (errors), else the trailers at the end of the
//! body. A call whose response or body is dropped first is `Canceled`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

use super::{CallGuard, Metrics};

pub const CANCELLED: &str = "Canceled";

/// gRPC status codes by their number, named as grpc-go names them (and
/// so as Prometheus dashboards for gRPC servers expect them).
const CODE_NAMES: [&str; 17] = [
    "OK",
    CANCELLED,
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The name of a `grpc-status` value; anything else is `Unknown`.
pub fn code_name(value: &[u8]) -> &'static str {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .and_then(|n| CODE_NAMES.get(n).copied())
        .unwrap_or("Unknown")
}

#[derive(Debug, Clone)]
pub struct RpcMetricsLayer {
    metrics: Arc<Metrics>,
}

impl RpcMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> RpcMetricsLayer {
        RpcMetricsLayer { metrics }
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RpcMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, RB> Service<http::Request<B>> for RpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    RB: Body,
{
    type Response = http::Response<MeteredBody<RB>>;
    type Error = S::Error;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let call = self.metrics.start_call(req.uri().path());
        MeteredFuture {
            inner: self.inner.call(req),
            call: Some(call),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of a counted call.
    pub struct MeteredFuture<F> {
        #[pin]
        inner: F,
        call: Option<CallGuard>,
    }
}

impl<F, RB, E> Future for MeteredFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<MeteredBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx));
        let call = this.call.take();
        Poll::Ready(match res {
            Ok(resp) => {
                // Trailers-only: the status is in the headers already.
                let call = match (call, resp.headers().get("grpc-status")) {
                    (Some(call), Some(code)) => {
                        call.finish(code.as_bytes());
                        None
                    }
                    (call, _) => call,
                };
                Ok(resp.map(|inner| MeteredBody { inner, call }))
            }
            Err(e) => {
                if let Some(call) = call {
                    call.finish(b"2");
                }
                Err(e)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that records its call's status from its trailers.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        call: Option<CallGuard>,
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(code) = f.trailers_ref().and_then(|t| t.get("grpc-status"))
                    && let Some(call) = this.call.take()
                {
                    call.finish(code.as_bytes());
                }
            }
            // A body that breaks, or ends without a status.
            Some(Err(_)) | None => {
                if let Some(call) = this.call.take() {
                    call.finish(b"2");
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_by_number() {
        assert_eq!(code_name(b"0"), "OK");
        assert_eq!(code_name(b"1"), "Canceled");
        assert_eq!(code_name(b"12"), "Unimplemented");
        assert_eq!(code_name(b"16"), "Unauthenticated");
        assert_eq!(code_name(b"17"), "Unknown");
        assert_eq!(code_name(b"x"), "Unknown");
    }
}
