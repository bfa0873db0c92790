//! The HTTP side: listen, route `/<kind>/<token>`, upgrade to SPDY/3.1 or
//! WebSocket, and hand the connection to a session.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crust_quote::{clip, quote};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HeaderValue, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::backend::{AttachRequest, Backend, ExecRequest, PortForwardRequest};
use crate::config::StreamingConfig;
use crate::remotecommand::{self, Invocation, Timeouts};
use crate::spdy::{Session, SessionConfig};
use crate::token::{Pending, TokenCache};
use crate::{Error, portforward, tls, ws};

const HEADER_PROTOCOL_VERSION: &str = "x-stream-protocol-version";
const HEADER_ACCEPTED_PROTOCOL_VERSIONS: &str = "x-accepted-stream-protocol-versions";

struct Inner {
    cfg: StreamingConfig,
    base_url: String,
    tokens: TokenCache,
    backend: Arc<dyn Backend>,
}

/// The running streaming server. The daemon's Exec, Attach and PortForward
/// RPCs call the `get_*_url` methods after checking that the container or
/// pod exists and runs. Dropping it stops accepting connections; sessions
/// in progress run to their end.
pub struct StreamingServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl StreamingServer {
    /// Binds `config.addr` and starts serving on the current tokio runtime.
    pub async fn start(
        config: StreamingConfig,
        backend: Arc<dyn Backend>,
    ) -> Result<StreamingServer, Error> {
        let acceptor = match &config.tls {
            Some(tls) => Some(tls::acceptor(tls)?),
            None => None,
        };
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.addr,
            source,
        })?;
        let base_url = match &config.public_base_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let mut shown = addr;
                if shown.ip().is_unspecified() {
                    shown.set_ip(if addr.is_ipv4() {
                        std::net::Ipv4Addr::LOCALHOST.into()
                    } else {
                        std::net::Ipv6Addr::LOCALHOST.into()
                    });
                }
                format!(
                    "{}://{}",
                    if acceptor.is_some() { "https" } else { "http" },
                    shown
                )
            }
        };
        let inner = Arc::new(Inner {
            tokens: TokenCache::new(config.token_ttl, config.max_outstanding_tokens),
            base_url,
            backend,
            cfg: config,
        });
        let accept = tokio::spawn(accept_loop(listener, acceptor, inner.clone()));
        tracing::info!(%addr, "streaming server listening");
        Ok(StreamingServer {
            inner,
            addr,
            accept,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `scheme://host:port` of the URLs handed out.
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    /// Checks an exec request and returns its single-use URL.
    pub fn get_exec_url(&self, req: ExecRequest) -> Result<String, Error> {
        if req.container_id.is_empty() {
            return Err(Error::invalid("container_id", "must not be empty"));
        }
        if req.cmd.is_empty() || req.cmd[0].is_empty() {
            return Err(Error::invalid("cmd", "must not be empty"));
        }
        check_streams(req.stdin, req.stdout, req.stderr, req.tty)?;
        self.url(Pending::Command(Invocation::Exec(req)))
    }

    /// Checks an attach request and returns its single-use URL.
    pub fn get_attach_url(&self, req: AttachRequest) -> Result<String, Error> {
        if req.container_id.is_empty() {
            return Err(Error::invalid("container_id", "must not be empty"));
        }
        check_streams(req.stdin, req.stdout, req.stderr, req.tty)?;
        self.url(Pending::Command(Invocation::Attach(req)))
    }

    /// Checks a port-forward request and returns its single-use URL.
    pub fn get_port_forward_url(&self, req: PortForwardRequest) -> Result<String, Error> {
        if req.pod_sandbox_id.is_empty() {
            return Err(Error::invalid("pod_sandbox_id", "must not be empty"));
        }
        if req.ports.contains(&0) {
            return Err(Error::invalid("port", "ports must be between 1 and 65535"));
        }
        if req.ports.len() > 64 {
            return Err(Error::invalid("port", "at most 64 ports per request"));
        }
        self.url(Pending::PortForward(req))
    }

    fn url(&self, req: Pending) -> Result<String, Error> {
        let kind = req.kind();
        let token = self.inner.tokens.insert(req)?;
        Ok(format!("{}/{}/{}", self.inner.base_url, kind, token))
    }
}

impl Drop for StreamingServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn check_streams(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Result<(), Error> {
    if !stdin && !stdout && !stderr {
        return Err(Error::invalid(
            "stdin",
            "one of stdin, stdout, or stderr must be set",
        ));
    }
    if tty && stderr {
        return Err(Error::invalid(
            "stderr",
            "tty and stderr cannot both be true",
        ));
    }
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    inner: Arc<Inner>,
) {
    let permits = Arc::new(Semaphore::new(inner.cfg.max_connections.max(1)));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("streaming server accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let inner = inner.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let permit = Arc::new(permit);
            match acceptor {
                None => serve_connection(TokioIo::new(tcp), inner, permit).await,
                Some(acceptor) => {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    {
                        Ok(Ok(tls)) => serve_connection(TokioIo::new(tls), inner, permit).await,
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn serve_connection<T>(io: TokioIo<T>, inner: Arc<Inner>, permit: Arc<OwnedSemaphorePermit>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let service = service_fn(move |req| {
        let inner = inner.clone();
        let permit = permit.clone();
        async move { Ok::<_, Infallible>(route(inner, req, permit)) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .max_buf_size(64 * 1024)
        .serve_connection(io, service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!("streaming connection: {e}");
    }
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn not_found() -> Response<Full<Bytes>> {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

fn header_has(req: &Request<Incoming>, name: hyper::header::HeaderName, token: &str) -> bool {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case(token))
}

fn route(
    inner: Arc<Inner>,
    req: Request<Incoming>,
    permit: Arc<OwnedSemaphorePermit>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let path = req.uri().path().trim_start_matches('/');
    let Some((kind, token)) = path.split_once('/') else {
        return not_found();
    };
    if !matches!(kind, "exec" | "attach" | "portforward") || token.contains('/') {
        return not_found();
    }
    // Consumed before anything else is checked: a token is good for one
    // attempt, whatever its outcome.
    let Some(pending) = inner.tokens.consume(token) else {
        return not_found();
    };
    if pending.kind() != kind {
        return not_found();
    }
    let timeouts = Timeouts {
        stream_creation: inner.cfg.stream_creation_timeout,
        disconnect_grace: inner.cfg.disconnect_grace,
        linger: Duration::from_secs(5),
    };
    let session_cfg = SessionConfig {
        max_concurrent_streams: inner.cfg.max_streams_per_session,
        stream_buffer: inner.cfg.stream_buffer,
        idle_timeout: inner.cfg.idle_timeout,
        ..SessionConfig::default()
    };
    let backend = inner.backend.clone();

    if hyper_tungstenite::is_upgrade_request(&req) {
        return upgrade_websocket(req, pending, backend, timeouts, session_cfg, permit);
    }
    if header_has(&req, CONNECTION, "upgrade") && header_has(&req, UPGRADE, "spdy/3.1") {
        return upgrade_spdy(req, pending, backend, timeouts, session_cfg, permit);
    }
    text(
        StatusCode::BAD_REQUEST,
        "unable to upgrade: missing upgrade headers in request\n",
    )
}

fn upgrade_spdy(
    req: Request<Incoming>,
    pending: Pending,
    backend: Arc<dyn Backend>,
    timeouts: Timeouts,
    session_cfg: SessionConfig,
    permit: Arc<OwnedSemaphorePermit>,
) -> Response<Full<Bytes>> {
    let supported: &[&'static str] = match &pending {
        Pending::PortForward(_) => &[portforward::SPDY_PROTOCOL],
        _ => remotecommand::SPDY_PROTOCOLS,
    };
    let offered: Vec<&str> = req
        .headers()
        .get_all(HEADER_PROTOCOL_VERSION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    // No header at all: a client from before negotiation, which spoke the
    // oldest protocol.
    let negotiated: Option<&'static str> = if offered.is_empty() {
        None
    } else {
        match offered
            .iter()
            .find_map(|o| supported.iter().find(|s| *s == o))
        {
            Some(p) => Some(*p),
            None => {
                let mut r = text(
                    StatusCode::FORBIDDEN,
                    format!(
                        "unable to upgrade: unable to negotiate protocol: client supports {}, server accepts {supported:?}\n",
                        offered_list(&offered)
                    ),
                );
                for p in supported {
                    r.headers_mut().append(
                        HEADER_ACCEPTED_PROTOCOL_VERSIONS,
                        HeaderValue::from_static(p),
                    );
                }
                return r;
            }
        }
    };
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let _permit = permit;
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!("SPDY upgrade failed: {e}");
                return;
            }
        };
        let session = Session::start(TokioIo::new(upgraded), session_cfg);
        match pending {
            Pending::Command(invocation) => {
                remotecommand::serve_spdy(
                    session,
                    negotiated.unwrap_or("channel.k8s.io"),
                    invocation,
                    backend,
                    timeouts,
                )
                .await
            }
            Pending::PortForward(r) => {
                portforward::serve_spdy(session, r.pod_sandbox_id, backend, timeouts).await
            }
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    r.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Some(p) = negotiated {
        r.headers_mut()
            .insert(HEADER_PROTOCOL_VERSION, HeaderValue::from_static(p));
    }
    r
}

fn upgrade_websocket(
    mut req: Request<Incoming>,
    pending: Pending,
    backend: Arc<dyn Backend>,
    timeouts: Timeouts,
    session_cfg: SessionConfig,
    permit: Arc<OwnedSemaphorePermit>,
) -> Response<Full<Bytes>> {
    let supported: Vec<&'static str> = match &pending {
        Pending::PortForward(_) => {
            let mut v = vec![portforward::TUNNEL_PROTOCOL];
            v.extend_from_slice(portforward::WS_PROTOCOLS);
            v
        }
        _ => remotecommand::WS_PROTOCOLS.to_vec(),
    };
    let offered = ws::offered_protocols(req.headers());
    let negotiated: Option<&'static str> = match ws::negotiate(&offered, &supported) {
        Ok(p) => p.and_then(|p| supported.iter().copied().find(|s| *s == p)),
        Err(()) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "requested protocol(s) are not supported: {}; supports {supported:?}\n",
                    offered_list(&offered)
                ),
            );
        }
    };
    // The WebSocket port-forward names its ports: in the request, or in the
    // URL (`?port=80&port=8080` or `?ports=80,8080`).
    let mut pf_ports = Vec::new();
    if let Pending::PortForward(r) = &pending
        && negotiated != Some(portforward::TUNNEL_PROTOCOL)
    {
        pf_ports = r.ports.clone();
        if pf_ports.is_empty() {
            match ports_from_query(req.uri().query().unwrap_or("")) {
                Ok(p) if !p.is_empty() => pf_ports = p,
                Ok(_) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "query parameter \"port\" is required\n",
                    );
                }
                Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            }
        }
    }
    let (mut response, websocket) =
        match hyper_tungstenite::upgrade(&mut req, Some(ws::ws_config())) {
            Ok(x) => x,
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("bad WebSocket upgrade: {e}\n"),
                );
            }
        };
    if let Some(p) = negotiated {
        response
            .headers_mut()
            .insert("sec-websocket-protocol", HeaderValue::from_static(p));
    }
    tokio::spawn(async move {
        let _permit = permit;
        let ws = match websocket.await {
            Ok(ws) => ws,
            Err(e) => {
                tracing::debug!("WebSocket upgrade failed: {e}");
                return;
            }
        };
        match pending {
            Pending::Command(invocation) => {
                remotecommand::serve_ws(ws, negotiated, invocation, backend, timeouts).await
            }
            Pending::PortForward(r) if negotiated == Some(portforward::TUNNEL_PROTOCOL) => {
                let session = Session::start(ws::WsBytes::new(ws), session_cfg);
                portforward::serve_spdy(session, r.pod_sandbox_id, backend, timeouts).await
            }
            Pending::PortForward(r) => {
                portforward::serve_ws(
                    ws,
                    negotiated,
                    r.pod_sandbox_id,
                    pf_ports,
                    backend,
                    timeouts,
                )
                .await
            }
        }
    });
    response
}

/// The protocols a client offered, for an error it gets back: its header
/// may be any length.
fn offered_list(offered: &[&str]) -> String {
    clip(&format!("{offered:?}")).to_string()
}

/// Ports from `port=80&port=8080` or `ports=80,8080`.
fn ports_from_query(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "port" && k != "ports" {
            continue;
        }
        for p in v
            .split([',', ' '])
            .filter(|p| !p.is_empty())
            .flat_map(|p| p.split("%2C"))
        {
            let port: u16 = p
                .parse()
                .map_err(|_| format!("unable to parse {} as a port", quote(p)))?;
            if port == 0 {
                return Err(format!("port {} must be > 0", quote(p)));
            }
            ports.push(port);
            if ports.len() > 64 {
                return Err("at most 64 ports".into());
            }
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    #[test]
    fn ports_from_queries() {
        assert_eq!(ports_from_query("port=80&port=8080"), Ok(vec![80, 8080]));
        assert_eq!(ports_from_query("ports=80,8080"), Ok(vec![80, 8080]));
        assert_eq!(ports_from_query("ports=80%2C81&x=1"), Ok(vec![80, 81]));
        assert!(ports_from_query("port=0").is_err());
        assert!(ports_from_query("port=70000").is_err());
        assert_eq!(ports_from_query(""), Ok(vec![]));
    }

    proptest::proptest! {
        #![proptest_config(crust_quote::testing::config(1024))]

        /// Any query: ports (1-65535, at most 64) or a short error.
        #[test]
        fn any_query_gives_ports_or_a_short_error(
            query in proptest::prop_oneof![
                "((port|ports|x)=[0-9,% C]{0,12}&?){0,6}",
                crust_quote::testing::hostile_string().prop_map(|s| format!("port={s}")),
                proptest::prelude::any::<String>(),
            ]
        ) {
            match ports_from_query(&query) {
                Ok(ports) => {
                    proptest::prop_assert!(ports.len() <= 64);
                    proptest::prop_assert!(!ports.contains(&0));
                }
                Err(e) => crust_quote::testing::check_message("ports_from_query", &e)?,
            }
        }
    }

    #[test]
    fn offered_protocols_are_clipped() {
        let many: Vec<String> = (0..2000).map(|i| format!("proto-{i}")).collect();
        let offered: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(offered_list(&offered).len() < 300);
        assert_eq!(offered_list(&["a"]), "[\"a\"]");
    }

    #[test]
    fn stream_options_are_checked() {
        assert!(check_streams(false, false, false, false).is_err());
        assert!(check_streams(false, true, true, true).is_err());
        assert!(check_streams(true, false, false, true).is_ok());
    }
}
