//! The metrics and health endpoint: plain HTTP/1.1 on `[metrics] address`.
//!
//! - `GET /metrics`: every metric, OpenMetrics text (what Prometheus
//!   scrapes; its classic text parser reads it too);
//! - `GET /healthz`: 200 `ok` while the daemon serves the CRI socket, 503
//!   with the reason otherwise (starting, stopping, socket gone).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info};

use super::Metrics;
use super::health::Health;

/// The content type of the OpenMetrics text format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` (an error names it) and serves the endpoint on it from a
/// task of its own; answers the address bound (port 0 picks one).
pub async fn start(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding the metrics endpoint on {addr} ([metrics] address): {e}"),
        )
    })?;
    let local = listener.local_addr()?;
    info!(address = %local, "metrics and health endpoint listening (/metrics, /healthz)");
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and such: try again shortly.
                    debug!("metrics endpoint accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (metrics, health) = (metrics.clone(), health.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let answer = respond(&req, &metrics, &health);
                    async move { Ok::<_, Infallible>(answer) }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(%peer, "metrics endpoint connection: {e}");
                }
            });
        }
    });
    Ok(local)
}

fn respond(req: &Request<Incoming>, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => Response::builder()
            .header(header::CONTENT_TYPE, OPENMETRICS)
            .body(Full::new(Bytes::from(metrics.encode())))
            .expect("a valid response"),
        "/healthz" => match health.check() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics and /healthz are served here\n".into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}
