//! Port-forward for real: a pod network namespace (pinned like the daemon
//! pins pods'), an echo server inside it, and clients over SPDY (node's
//! spdy-transport), SPDY tunnelled in WebSocket (node's ws +
//! spdy-transport, what crictl and kubectl ≥ 1.30 use) and the WebSocket
//! channel protocol (tokio-tungstenite). All traffic stays on loopback and
//! inside the test's namespace.

mod common;

use std::time::Instant;

use common::*;
use crust_streaming::{PortForwardRequest, StreamingConfig};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const MIB: usize = 1024 * 1024;

struct Setup {
    _netns: PodNetns,
    server: crust_streaming::StreamingServer,
    port: u16,
}

async fn setup() -> Option<Setup> {
    let netns = PodNetns::new()?;
    let port = echo_server(&netns.path).await;
    let (server, fake) = start(StreamingConfig::default()).await;
    fake.netns
        .lock()
        .unwrap()
        .insert("pod1".into(), netns.path.clone());
    Some(Setup {
        _netns: netns,
        server,
        port,
    })
}

fn pf_url(s: &Setup, ports: Vec<u16>) -> String {
    s.server
        .get_port_forward_url(PortForwardRequest {
            pod_sandbox_id: "pod1".into(),
            ports,
        })
        .unwrap()
}

fn check(r: &serde_json::Value, bytes: usize) {
    for res in r["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {r}"))
    {
        assert_eq!(res["error"], "", "{res}");
        assert_eq!(res["bytes"].as_u64().unwrap() as usize, bytes, "{res}");
        assert_eq!(res["sent"], res["received"], "{res}");
    }
}

fn mib_per_s(bytes: usize, ms: u64) -> f64 {
    // Both ways: what was sent came back.
    (2 * bytes) as f64 / MIB as f64 / (ms.max(1) as f64 / 1000.0)
}

#[tokio::test]
async fn spdy_carries_100_mib_both_ways() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    let url = pf_url(&s, vec![]);
    let r = node(json!({"mode": "portforward", "url": url, "port": s.port, "bytes": 100 * MIB, "timeoutMs": 300000})).await;
    check(&r, 100 * MIB);
    eprintln!(
        "SPDY port-forward: {:.1} MiB/s (debug build)",
        mib_per_s(100 * MIB, r["ms"].as_u64().unwrap())
    );
}

#[tokio::test]
async fn spdy_carries_20_concurrent_streams() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    let url = pf_url(&s, vec![]);
    let r = node(json!({"mode": "portforward", "url": url, "port": s.port, "pairs": 20, "bytes": 2 * MIB, "timeoutMs": 300000}))
        .await;
    assert_eq!(r["results"].as_array().unwrap().len(), 20);
    check(&r, 2 * MIB);
}

#[tokio::test]
async fn websocket_tunnel_carries_100_mib_both_ways() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    let url = pf_url(&s, vec![]);
    let r = node(json!({"mode": "portforward", "url": url, "port": s.port, "bytes": 100 * MIB, "tunnel": true,
        "timeoutMs": 300000}))
    .await;
    check(&r, 100 * MIB);
    eprintln!(
        "SPDY-over-WebSocket port-forward: {:.1} MiB/s (debug build)",
        mib_per_s(100 * MIB, r["ms"].as_u64().unwrap())
    );
    // And concurrent streams in one tunnel.
    let url = pf_url(&s, vec![]);
    let r = node(json!({"mode": "portforward", "url": url, "port": s.port, "pairs": 20, "bytes": MIB, "tunnel": true,
        "timeoutMs": 300000}))
    .await;
    check(&r, MIB);
}

/// The v4 channel protocol: ports in the URL, channel 0 data, 1 errors,
/// each opened by the port in little-endian.
async fn ws_channel_forward(url: &str, protocol: &str, total: usize) -> (Vec<u8>, Vec<u8>, f64) {
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let (ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(resp.headers()["sec-websocket-protocol"], protocol);
    let (mut tx, mut rx) = ws.split();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        let mut sent = Sha256::new();
        let mut x: u32 = 12345;
        let mut left = total;
        while left > 0 {
            let n = left.min(32 * 1024);
            let mut msg = Vec::with_capacity(n + 1);
            msg.push(0u8);
            for _ in 0..n {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                msg.push(x as u8);
            }
            sent.update(&msg[1..]);
            tx.send(Message::binary(msg)).await.unwrap();
            left -= n;
        }
        (tx, sent.finalize().to_vec())
    });
    let mut got = Sha256::new();
    let mut received = 0;
    let mut prefixes = Vec::new();
    while received < total {
        let msg = rx.next().await.expect("connection open").unwrap();
        let Message::Binary(b) = msg else { continue };
        match b[0] {
            0 | 1
                if prefixes.len() < 2
                    && b.len() == 3
                    && prefixes.iter().all(|(c, _)| *c != b[0]) =>
            {
                prefixes.push((b[0], u16::from_le_bytes([b[1], b[2]])));
            }
            0 => {
                got.update(&b[1..]);
                received += b.len() - 1;
            }
            1 => panic!("error channel: {}", String::from_utf8_lossy(&b[1..])),
            c => panic!("unexpected channel {c}"),
        }
    }
    let rate = mib_per_s(total, started.elapsed().as_millis() as u64);
    let (mut tx, sent) = writer.await.unwrap();
    assert_eq!(prefixes.len(), 2, "both channels announce the port");
    let _ = tx.close().await;
    (sent, got.finalize().to_vec(), rate)
}

#[tokio::test]
async fn websocket_channels_carry_data_both_ways() {
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    let url = format!("{}?port={}", pf_url(&s, vec![]), s.port);
    let (sent, got, rate) = ws_channel_forward(&url, "v4.channel.k8s.io", 100 * MIB).await;
    assert_eq!(sent, got);
    eprintln!("WebSocket channel port-forward: {rate:.1} MiB/s (debug build)");
    // Ports can also come with the request.
    let url = pf_url(&s, vec![s.port]);
    let (sent, got, _) = ws_channel_forward(&url, "v4.channel.k8s.io", MIB).await;
    assert_eq!(sent, got);
}

/// Throughput, not a timed test:
/// `cargo test --release -p crust-streaming --test portforward -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run by hand in release mode"]
async fn throughput() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    for (name, tunnel, pairs) in [
        ("SPDY", false, 1),
        ("SPDY x4", false, 4),
        ("SPDY-over-WebSocket", true, 1),
    ] {
        let bytes = 512 * MIB / pairs;
        let url = pf_url(&s, vec![]);
        let r = node(json!({"mode": "portforward", "url": url, "port": s.port, "bytes": bytes, "pairs": pairs,
            "tunnel": tunnel, "timeoutMs": 600000}))
        .await;
        check(&r, bytes);
        let ms = r["ms"].as_u64().unwrap();
        eprintln!(
            "{name}: {} MiB each way in {ms} ms = {:.0} MiB/s each way",
            bytes * pairs / MIB,
            (bytes * pairs) as f64 / MIB as f64 / (ms as f64 / 1000.0)
        );
    }
    let url = format!("{}?port={}", pf_url(&s, vec![]), s.port);
    let (sent, got, rate) = ws_channel_forward(&url, "v4.channel.k8s.io", 256 * MIB).await;
    assert_eq!(sent, got);
    eprintln!(
        "WebSocket channels (Rust client): {:.0} MiB/s each way",
        rate / 2.0
    );
}

/// A bare SPDY port-forward client that behaves like client-go's spdystream
/// (no flow control, 32 KiB DATA frames) and does no per-byte work, so the
/// number is the server's. Returns (bytes echoed back, seconds).
async fn raw_spdy_forward(url: &str, port: u16, total: usize) -> (usize, f64) {
    use crust_streaming::spdy::frame::FLAG_FIN;
    use crust_streaming::spdy::{Frame, FrameDecoder, HeaderEncoder};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(
        format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
             X-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let (mut rd, mut wr) = s.into_split();
    let mut enc = HeaderEncoder::new();
    let mut wire = bytes::BytesMut::new();
    let port_s = port.to_string();
    for (id, kind, flags) in [(1u32, "error", FLAG_FIN), (3, "data", 0)] {
        let mut block = Vec::new();
        enc.encode(
            &[("streamtype", kind), ("port", &port_s), ("requestid", "0")],
            &mut block,
        );
        Frame::SynStream {
            stream_id: id,
            associated_stream_id: 0,
            priority: 0,
            slot: 0,
            flags,
            header_block: block.into(),
        }
        .encode(&mut wire);
    }
    wr.write_all(&wire).await.unwrap();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        let chunk = vec![0x5au8; 32 * 1024];
        let mut frame = bytes::BytesMut::with_capacity(chunk.len() + 8);
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len());
            frame.clear();
            crust_streaming::spdy::frame::encode_data_header(
                3,
                if n == left { FLAG_FIN } else { 0 },
                n,
                &mut frame,
            );
            frame.extend_from_slice(&chunk[..n]);
            wr.write_all(&frame).await.unwrap();
            left -= n;
        }
        wr
    });
    let mut dec = FrameDecoder::new(1 << 16);
    let mut buf = bytes::BytesMut::with_capacity(256 * 1024);
    let mut got = 0;
    'outer: loop {
        buf.reserve(64 * 1024);
        if rd.read_buf(&mut buf).await.unwrap() == 0 {
            break;
        }
        while let Some(f) = dec.decode(&mut buf).unwrap() {
            if let Frame::Data {
                stream_id: 3,
                flags,
                data,
            } = f
            {
                got += data.len();
                if flags & FLAG_FIN != 0 {
                    break 'outer;
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let _wr = writer.await.unwrap();
    (got, secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spdy_peer_without_flow_control_like_spdystream() {
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    let url = pf_url(&s, vec![]);
    let (got, secs) = raw_spdy_forward(&url, s.port, 32 * MIB).await;
    assert_eq!(got, 32 * MIB);
    eprintln!(
        "spdystream-like SPDY port-forward: {:.0} MiB/s each way (debug build)",
        got as f64 / MIB as f64 / secs
    );
}

/// Server-bound throughput with a client that does no per-byte work:
/// `cargo test --release -p crust-streaming --test portforward -- --ignored --nocapture raw`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run by hand in release mode"]
async fn raw_throughput() {
    let Some(s) = setup().await else {
        skip!("cannot create a network namespace here");
    };
    let url = pf_url(&s, vec![]);
    let (got, secs) = raw_spdy_forward(&url, s.port, 1024 * MIB).await;
    assert_eq!(got, 1024 * MIB);
    eprintln!(
        "SPDY port-forward, spdystream-like client: {:.0} MiB/s each way",
        got as f64 / MIB as f64 / secs
    );
}
