//! Exec, attach and port-forward over SPDY/3.1 against an independent
//! client (npm's spdy-transport driving the Kubernetes upgrade and streams),
//! plus token handling and hostile input on raw connections.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use crust_streaming::{AttachRequest, PortForwardRequest, StreamingConfig, TerminalSize};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn status_json(s: &serde_json::Value) -> serde_json::Value {
    serde_json::from_str(
        s["status"]
            .as_str()
            .unwrap_or_else(|| panic!("no status: {s}")),
    )
    .unwrap()
}

#[tokio::test]
async fn exec_exit_codes_in_the_v4_status() {
    for _ in 0..5 {
        exec_exit_codes_once().await;
    }
}

async fn exec_exit_codes_once() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let (server, _) = start(StreamingConfig::default()).await;
    let url = server
        .get_exec_url(exec_req(&["echo", "hello"], false, true, true, false))
        .unwrap();
    let r = node(
        json!({"mode": "exec", "url": url, "stdout": true, "stderr": true, "timeoutMs": 8000}),
    )
    .await;
    assert_eq!(r["protocol"], "v4.channel.k8s.io");
    assert_eq!(r["stdout"], "hello\n");
    assert_eq!(r["stderr"], "");
    assert_eq!(
        status_json(&r),
        json!({"metadata": {}, "status": "Success"})
    );

    let url = server
        .get_exec_url(exec_req(&["exit", "42"], false, true, true, false))
        .unwrap();
    let r = node(json!({"mode": "exec", "url": url, "stdout": true, "stderr": true})).await;
    let st = status_json(&r);
    assert_eq!(st["status"], "Failure");
    assert_eq!(st["reason"], "NonZeroExitCode");
    assert_eq!(
        st["details"]["causes"][0],
        json!({"reason": "ExitCode", "message": "42"})
    );

    let url = server
        .get_exec_url(exec_req(&["nonesuch"], false, true, false, false))
        .unwrap();
    let r = node(json!({"mode": "exec", "url": url, "stdout": true, "timeoutMs": 8000})).await;
    let st = status_json(&r);
    assert_eq!(st["reason"], "InternalError");
    assert!(st["message"].as_str().unwrap().contains("nonesuch"), "{st}");
}

#[tokio::test]
async fn exec_pipes_stdin_and_older_protocols_get_text_errors() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let (server, _) = start(StreamingConfig::default()).await;
    let input = "line one\nline two\n".repeat(2000);
    let url = server
        .get_exec_url(exec_req(&["cat"], true, true, false, false))
        .unwrap();
    let r =
        node(json!({"mode": "exec", "url": url, "stdin": true, "stdout": true, "input": input}))
            .await;
    assert_eq!(r["stdout"].as_str().unwrap(), input);

    let url = server
        .get_exec_url(exec_req(&["exit", "3"], false, true, false, false))
        .unwrap();
    let r = node(
        json!({"mode": "exec", "url": url, "stdout": true, "protocols": ["v3.channel.k8s.io"]}),
    )
    .await;
    assert_eq!(r["protocol"], "v3.channel.k8s.io");
    assert!(
        r["status"].as_str().unwrap().contains("non-zero exit code"),
        "{r}"
    );

    let url = server
        .get_exec_url(exec_req(&["echo", "hi"], false, true, false, false))
        .unwrap();
    let r = node(
        json!({"mode": "exec", "url": url, "stdout": true, "protocols": ["v2.channel.k8s.io"]}),
    )
    .await;
    assert_eq!(r["stdout"], "hi\n");
    assert_eq!(r["status"], "");
}

#[tokio::test]
async fn exec_with_tty_delivers_resizes() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let (server, fake) = start(StreamingConfig::default()).await;
    let url = server
        .get_exec_url(exec_req(&["resize", "2"], true, true, false, true))
        .unwrap();
    let r = node(
        json!({"mode": "exec", "url": url, "stdin": true, "stdout": true, "tty": true,
        "resize": [[80, 24], [132, 43]], "closeStdin": false}),
    )
    .await;
    assert_eq!(r["stdout"], "24 80\r\n43 132\r\n");
    assert_eq!(
        *fake.seen.resizes.lock().unwrap(),
        vec![
            TerminalSize {
                width: 80,
                height: 24
            },
            TerminalSize {
                width: 132,
                height: 43
            }
        ]
    );
    assert_eq!(status_json(&r)["status"], "Success");
}

#[tokio::test]
async fn attach_echoes_stdin() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let (server, _) = start(StreamingConfig::default()).await;
    let url = server
        .get_attach_url(AttachRequest {
            container_id: "c1".into(),
            tty: false,
            stdin: true,
            stdout: true,
            stderr: true,
        })
        .unwrap();
    let r = node(json!({"mode": "exec", "url": url, "stdin": true, "stdout": true, "stderr": true, "input": "echo hello\n"}))
        .await;
    assert_eq!(r["stdout"], "echo hello\n");
    assert_eq!(status_json(&r)["status"], "Success");
}

#[tokio::test]
async fn a_vanishing_client_ends_the_backend_call() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let (server, fake) = start(quick_grace()).await;
    let url = server
        .get_exec_url(exec_req(&["watch"], true, true, false, false))
        .unwrap();
    let r = node(
        json!({"mode": "exec", "url": url, "stdin": true, "stdout": true, "closeStdin": false,
        "input": "x", "vanishAfterMs": 300}),
    )
    .await;
    assert_eq!(r["vanished"], true, "{r}");
    wait_for(|| fake.seen.finished.load(Ordering::SeqCst)).await;
    assert!(fake.seen.stdin_closed.load(Ordering::SeqCst));
    assert!(fake.seen.stdout_failed.load(Ordering::SeqCst));

    // A call that ignores its streams is dropped after the grace period.
    let url = server
        .get_exec_url(exec_req(&["hang"], true, true, false, false))
        .unwrap();
    node(json!({"mode": "exec", "url": url, "stdin": true, "stdout": true, "closeStdin": false, "vanishAfterMs": 200}))
        .await;
    wait_for(|| fake.seen.dropped.load(Ordering::SeqCst)).await;
}

async fn wait_for(f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("condition not reached in 10s");
}

#[tokio::test]
async fn tokens_are_single_use_expire_and_must_exist() {
    let (server, fake) = start(fast_expiry()).await;
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    assert!(
        url.starts_with(&format!(
            "http://127.0.0.1:{}/exec/",
            server.local_addr().port()
        )),
        "{url}"
    );

    // Used once (even by a request that cannot upgrade), then gone.
    let (code, _) = http(&url, "").await;
    assert_eq!(code, 400);
    let (code, _) = http(&url, SPDY_EXEC_HEADERS).await;
    assert_eq!(code, 404);

    // A token for one kind does not open another.
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    let (code, _) = http(&url.replace("/exec/", "/attach/"), SPDY_EXEC_HEADERS).await;
    assert_eq!(code, 404);

    // Expired.
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (code, _) = http(&url, SPDY_EXEC_HEADERS).await;
    assert_eq!(code, 404);

    // Made up, malformed, or in the wrong place.
    let base = format!("http://{}", server.local_addr());
    for path in [
        "/exec/AAAAAAAAAAAAAAAAAAAAAA",
        "/exec/x",
        "/exec/",
        "/nothing/here",
        "/exec/../../etc/passwd",
        "/",
    ] {
        let (code, _) = http(&format!("{base}{path}"), SPDY_EXEC_HEADERS).await;
        assert_eq!(code, 404, "{path}");
    }
    assert_eq!(fake.seen.calls.load(Ordering::SeqCst), 0, "nothing ran");

    // Requests are validated before a URL is handed out.
    assert!(
        server
            .get_exec_url(exec_req(&[], false, true, false, false))
            .is_err()
    );
    assert!(
        server
            .get_exec_url(exec_req(&["x"], false, false, false, false))
            .is_err()
    );
    assert!(
        server
            .get_exec_url(exec_req(&["x"], false, true, true, true))
            .is_err()
    );
    assert!(
        server
            .get_port_forward_url(PortForwardRequest {
                pod_sandbox_id: "".into(),
                ports: vec![]
            })
            .is_err()
    );
}

#[tokio::test]
async fn outstanding_tokens_are_bounded() {
    let cfg = StreamingConfig {
        max_outstanding_tokens: 5,
        ..Default::default()
    };
    let (server, _) = start(cfg).await;
    for _ in 0..5 {
        server
            .get_exec_url(exec_req(&["x"], false, true, false, false))
            .unwrap();
    }
    let err = server
        .get_exec_url(exec_req(&["x"], false, true, false, false))
        .unwrap_err();
    assert!(matches!(err, crust_streaming::Error::ResourceExhausted(5)));
}

#[tokio::test]
async fn unknown_protocol_versions_are_refused() {
    let (server, fake) = start(StreamingConfig::default()).await;
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    let (code, text) =
        http(&url, "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v9.channel.k8s.io\r\n").await;
    assert_eq!(code, 403);
    assert!(
        text.to_ascii_lowercase()
            .contains("x-accepted-stream-protocol-versions: v4.channel.k8s.io"),
        "{text}"
    );
    assert_eq!(fake.seen.calls.load(Ordering::SeqCst), 0);
}

/// Upgrades a raw connection to SPDY for an exec and returns it.
async fn raw_spdy(server: &crust_streaming::StreamingServer) -> tokio::net::TcpStream {
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(
        format!("POST /{path} HTTP/1.1\r\nHost: {host}\r\n{SPDY_EXEC_HEADERS}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

/// Reads frames until the server hangs up; returns the GOAWAY status seen.
async fn goaway_status(s: &mut tokio::net::TcpStream) -> Option<u32> {
    use crust_streaming::spdy::{Frame, FrameDecoder};
    let mut dec = FrameDecoder::new(1 << 16);
    let mut buf = bytes::BytesMut::new();
    let mut status = None;
    loop {
        let mut chunk = [0u8; 4096];
        let n = match tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await {
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
            Err(_) => panic!("server did not hang up"),
        };
        if n == 0 {
            return status;
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Some(f)) = dec.decode(&mut buf) {
            if let Frame::GoAway { status: st, .. } = f {
                status = Some(st);
            }
        }
    }
}

#[tokio::test]
async fn malformed_frames_end_the_session_with_goaway() {
    let (server, fake) = start(StreamingConfig::default()).await;
    // A control frame of an unknown version.
    let mut s = raw_spdy(&server).await;
    s.write_all(&[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 4, 1, 2, 3, 4])
        .await
        .unwrap();
    assert_eq!(goaway_status(&mut s).await, Some(1));
    // A SYN_STREAM whose header block is not zlib.
    let mut s = raw_spdy(&server).await;
    let mut frame = vec![
        0x80, 0x03, 0x00, 0x01, 0x00, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
    ];
    frame.extend_from_slice(b"notzlibnot");
    s.write_all(&frame).await.unwrap();
    assert_eq!(goaway_status(&mut s).await, Some(1));
    // An oversized control frame (a 1 MiB header block) is refused from
    // its length alone.
    let mut s = raw_spdy(&server).await;
    s.write_all(&[0x80, 0x03, 0x00, 0x01, 0x00, 0x10, 0x00, 0x00])
        .await
        .unwrap();
    let _ = s.write_all(&vec![0u8; 64 * 1024]).await;
    assert_eq!(goaway_status(&mut s).await, Some(2));
    // Random garbage.
    let mut s = raw_spdy(&server).await;
    let _ = s.write_all(&[0xff; 300]).await;
    assert!(goaway_status(&mut s).await.is_some());
    assert_eq!(fake.seen.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_header_block_that_inflates_too_far_is_refused() {
    use crust_streaming::spdy::{Frame, HeaderEncoder};
    let (server, _) = start(StreamingConfig::default()).await;
    let mut s = raw_spdy(&server).await;
    // 1 MiB of 'a' compresses to about a kilobyte: a zlib bomb for headers.
    let big = "a".repeat(1 << 20);
    let mut block = Vec::new();
    HeaderEncoder::new().encode(&[("streamtype", "error"), ("x", &big)], &mut block);
    let mut wire = bytes::BytesMut::new();
    Frame::SynStream {
        stream_id: 1,
        associated_stream_id: 0,
        priority: 0,
        slot: 0,
        flags: 0,
        header_block: block.into(),
    }
    .encode(&mut wire);
    s.write_all(&wire).await.unwrap();
    assert_eq!(goaway_status(&mut s).await, Some(1));
}

#[tokio::test]
async fn spdy_port_forward_to_a_closed_port_reports_an_error() {
    if node_dir().is_none() {
        skip!("the node client (node, npm) is missing");
    }
    let Some(netns) = PodNetns::new() else {
        skip!("cannot create a network namespace here");
    };
    let (server, fake) = start(StreamingConfig::default()).await;
    fake.netns
        .lock()
        .unwrap()
        .insert("pod1".into(), netns.path.clone());
    let url = server
        .get_port_forward_url(PortForwardRequest {
            pod_sandbox_id: "pod1".into(),
            ports: vec![],
        })
        .unwrap();
    let r = node(json!({"mode": "portforward", "url": url, "port": 1, "bytes": 10})).await;
    let res = &r["results"][0];
    assert!(
        res["error"]
            .as_str()
            .unwrap()
            .contains("error forwarding port 1"),
        "{r}"
    );
}
