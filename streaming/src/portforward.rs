//! Port-forward sessions over SPDY (and SPDY tunnelled in a WebSocket) and
//! over the WebSocket channel protocol, plus the helper that does the
//! forwarding for real inside a pod's network namespace.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream as StdTcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_tungstenite::HyperWebsocketStream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::backend::{Backend, BoxDuplex};
use crate::remotecommand::Timeouts;
use crate::spdy::{Session, SpdyStream, frame::rst};
use crate::ws::{self, Channels};

/// The SPDY subprotocol (and, prefixed with `SPDY/3.1+`, the tunnel's
/// WebSocket subprotocol).
pub(crate) const SPDY_PROTOCOL: &str = "portforward.k8s.io";
pub(crate) const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// WebSocket channel subprotocols for port-forward.
pub(crate) const WS_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "v5.channel.k8s.io",
];

/// Pairs of streams waiting for their partner, at most.
const MAX_PENDING_PAIRS: usize = 128;

#[derive(Default)]
struct Pair {
    data: Option<SpdyStream>,
    error: Option<SpdyStream>,
}

/// What a port-forward stream's headers ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StreamRequest {
    /// 1-65535.
    port: u16,
    /// The data stream of the pair (else its error stream).
    data: bool,
    /// Pairs the two streams: at most 64 bytes.
    request_id: String,
}

impl StreamRequest {
    /// Reads the `port`, `streamType` and `requestID` headers of stream
    /// `stream_id`; `None` when they do not make a valid request.
    fn of(
        port: Option<&str>,
        stream_type: Option<&str>,
        request_id: Option<&str>,
        stream_id: u32,
    ) -> Option<StreamRequest> {
        let port = port?.parse::<u16>().ok().filter(|p| *p > 0)?;
        let data = match stream_type? {
            "data" => true,
            "error" => false,
            _ => return None,
        };
        let request_id = match request_id {
            Some(id) if !id.is_empty() => id.to_string(),
            // Clients from before request ids: pair by stream id (the error
            // stream comes first, its data stream two ids later).
            _ => (if data {
                stream_id.saturating_sub(2)
            } else {
                stream_id
            })
            .to_string(),
        };
        (request_id.len() <= 64).then_some(StreamRequest {
            port,
            data,
            request_id,
        })
    }
}

/// Serves a port-forward SPDY session: every forwarded connection is a pair
/// of streams (`streamType` error and data, same `requestID` and `port`).
pub(crate) async fn serve_spdy(
    mut session: Session,
    pod: String,
    backend: Arc<dyn Backend>,
    t: Timeouts,
) {
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut forwards = JoinSet::new();
    // Request ids whose pair did not complete in time.
    let (expire_tx, mut expire_rx) = mpsc::channel::<String>(MAX_PENDING_PAIRS);
    loop {
        let s = tokio::select! {
            s = session.accept() => match s {
                Some(s) => s,
                None => break,
            },
            Some(id) = expire_rx.recv() => {
                if let Some(p) = pairs.remove(&id) {
                    tracing::debug!(request = %id, "port-forward stream pair timed out");
                    if let Some(mut e) = p.error {
                        let _ = e.write_all(format!("timed out waiting for the streams of request {id}").as_bytes()).await;
                        let _ = e.shutdown().await;
                    }
                    if let Some(d) = p.data {
                        d.reset(rst::CANCEL);
                    }
                }
                continue;
            }
            Some(_) = forwards.join_next(), if !forwards.is_empty() => continue,
        };
        let Some(StreamRequest {
            port,
            data: is_data,
            request_id,
        }) = StreamRequest::of(
            s.header("port"),
            s.header("streamtype"),
            s.header("requestid"),
            s.id(),
        )
        else {
            tracing::debug!(
                "port-forward stream without valid port, streamType or requestID headers"
            );
            s.reset(rst::REFUSED_STREAM);
            continue;
        };
        if !pairs.contains_key(&request_id) && pairs.len() >= MAX_PENDING_PAIRS {
            s.reset(rst::REFUSED_STREAM);
            continue;
        }
        let pair = pairs.entry(request_id.clone()).or_insert_with(|| {
            let tx = expire_tx.clone();
            let id = request_id.clone();
            let timeout = t.stream_creation;
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                let _ = tx.send(id).await;
            });
            Pair::default()
        });
        let slot = if is_data {
            &mut pair.data
        } else {
            &mut pair.error
        };
        if slot.is_some() {
            s.reset(rst::PROTOCOL_ERROR);
            continue;
        }
        s.reply();
        *slot = Some(s);
        if pair.data.is_some() && pair.error.is_some() {
            let pair = pairs.remove(&request_id).expect("present");
            let (data, error) = (pair.data.expect("present"), pair.error.expect("present"));
            let backend = backend.clone();
            let pod = pod.clone();
            forwards.spawn(forward_pair(backend, pod, port, data, error));
        }
    }
    // The connection is gone: the forwards see it (reads fail) and end.
    drop(pairs);
    while forwards.join_next().await.is_some() {}
}

/// A data stream that also closes the pair's error stream when the pod side
/// is done sending: client-go waits for the error stream to end before it
/// closes the local connection.
struct DataStream {
    data: SpdyStream,
    error: Option<SpdyStream>,
}

impl AsyncRead for DataStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.data).poll_read(cx, buf)
    }
}

impl AsyncWrite for DataStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.data).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.data).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.data).poll_shutdown(cx);
        if let Some(mut e) = self.error.take() {
            let _ = std::pin::Pin::new(&mut e).poll_shutdown(cx);
        }
        r
    }
}

async fn forward_pair(
    backend: Arc<dyn Backend>,
    pod: String,
    port: u16,
    data: SpdyStream,
    mut error: SpdyStream,
) {
    let stream = DataStream {
        data: data.handle(),
        error: Some(error.handle()),
    };
    let result = backend
        .port_forward(pod.clone(), port, Box::new(stream) as BoxDuplex)
        .await;
    if let Err(e) = result {
        let msg = format!("error forwarding port {port} to pod {pod}: {e}");
        tracing::debug!("{msg}");
        let _ = error.write_all(msg.as_bytes()).await;
    }
    let _ = error.shutdown().await;
    let mut data = data;
    let _ = data.shutdown().await;
}

/// Serves a port-forward over the WebSocket channel protocol: for the i-th
/// port, channel 2i carries data both ways and 2i+1 errors; each starts with
/// the port, little-endian.
pub(crate) async fn serve_ws(
    ws: HyperWebsocketStream,
    protocol: Option<&str>,
    pod: String,
    ports: Vec<u16>,
    backend: Arc<dyn Backend>,
    t: Timeouts,
) {
    let proto = ws::protocol_of(protocol);
    let inputs: Vec<u8> = (0..ports.len()).map(|i| (2 * i) as u8).collect();
    let mut channels = Channels::start(ws, proto, &inputs, t.linger);
    let mut forwards = JoinSet::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (data_ch, err_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        channels.send(data_ch, &port.to_le_bytes()).await;
        channels.send(err_ch, &port.to_le_bytes()).await;
        let Some(reader) = channels.reader(data_ch) else {
            continue;
        };
        let duplex = ws::ChannelDuplex {
            reader,
            writer: channels.writer(data_ch),
        };
        let mut err_writer = channels.writer(err_ch);
        let backend = backend.clone();
        let pod = pod.clone();
        forwards.spawn(async move {
            if let Err(e) = backend
                .port_forward(pod.clone(), port, Box::new(duplex))
                .await
            {
                let msg = format!("error forwarding port {port} to pod {pod}: {e}");
                let _ = err_writer.write_all(msg.as_bytes()).await;
            }
        });
    }
    tokio::select! {
        _ = async { while forwards.join_next().await.is_some() {} } => {}
        _ = channels.closed() => {
            // The client is gone; the forwards' reads end, give them a moment.
            let _ = tokio::time::timeout(t.disconnect_grace, async { while forwards.join_next().await.is_some() {} }).await;
            forwards.abort_all();
        }
    }
    channels.close().await;
}

/// Connects to `port` on the loopback of the network namespace at `netns`
/// (a pinned namespace file) and forwards `stream` to it both ways, with
/// half-close: when one side finishes sending, the other side's write half
/// is shut down and the other direction carries on. Returns when both
/// directions are done.
///
/// The connect runs on a dedicated thread that enters the namespace and
/// exits afterwards (never a runtime worker); the connected socket then
/// works from any thread.
pub async fn forward_in_netns<S>(netns: &Path, port: u16, stream: S) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let tcp = connect_in_netns(netns.to_path_buf(), port, Duration::from_secs(10)).await?;
    pipe(stream, tcp).await
}

/// Connects to `127.0.0.1:port` (or, if nothing listens there, `[::1]:port`)
/// inside the network namespace at `netns`.
pub async fn connect_in_netns(
    netns: PathBuf,
    port: u16,
    timeout: Duration,
) -> io::Result<tokio::net::TcpStream> {
    let std_stream = tokio::task::spawn_blocking(move || {
        crust_linux::ns::run_in_namespaces(
            &[(crust_linux::ns::NamespaceKind::Net, netns.as_path())],
            || {
                let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                match StdTcpStream::connect_timeout(&v4, timeout) {
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
                        // No IPv6 loopback in the pod: report the v4 refusal.
                        StdTcpStream::connect_timeout(&v6, timeout).map_err(|_| e)
                    }
                    r => r,
                }
            },
        )
    })
    .await
    .map_err(io::Error::other)?
    .map_err(io::Error::other)??;
    std_stream.set_nonblocking(true)?;
    std_stream.set_nodelay(true)?;
    tokio::net::TcpStream::from_std(std_stream)
}

/// Copies both ways between `a` and `b` until both directions reach EOF,
/// shutting down the write half of the side whose peer finished. Returns
/// the bytes carried a→b and b→a. Fixed 64 KiB buffers, no allocation per
/// chunk.
pub async fn pipe<A, B>(mut a: A, mut b: B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, 64 * 1024, 64 * 1024).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stream_requests_from_headers() {
        assert_eq!(
            StreamRequest::of(Some("8080"), Some("data"), Some("3"), 5),
            Some(StreamRequest {
                port: 8080,
                data: true,
                request_id: "3".into()
            })
        );
        // No request id: the pair is found by stream id.
        let e = StreamRequest::of(Some("80"), Some("error"), None, 7).unwrap();
        let d = StreamRequest::of(Some("80"), Some("data"), Some(""), 9).unwrap();
        assert_eq!(e.request_id, d.request_id);
        for (port, kind) in [
            ("0", "data"),
            ("65536", "data"),
            ("x", "data"),
            ("80", "stdin"),
        ] {
            assert_eq!(StreamRequest::of(Some(port), Some(kind), None, 1), None);
        }
    }

    proptest! {
        #![proptest_config(crust_quote::testing::config(1024))]

        /// Any headers a client sends: a valid request or none.
        #[test]
        fn any_headers_give_a_valid_request_or_none(
            port in proptest::option::of(prop_oneof![
                "[0-9]{1,6}".boxed(),
                crust_quote::testing::hostile_string(),
            ]),
            kind in proptest::option::of(prop_oneof![
                Just("data".to_string()).boxed(),
                Just("error".to_string()).boxed(),
                crust_quote::testing::hostile_string(),
            ]),
            id in proptest::option::of(crust_quote::testing::hostile_string()),
            stream_id in any::<u32>(),
        ) {
            if let Some(r) = StreamRequest::of(port.as_deref(), kind.as_deref(), id.as_deref(), stream_id) {
                prop_assert!(r.port > 0);
                prop_assert!(!r.request_id.is_empty() && r.request_id.len() <= 64);
                prop_assert_eq!(port.as_deref().map(str::parse::<u16>), Some(Ok(r.port)));
            }
        }
    }
}
