//! Exec and attach over the WebSocket channel protocols (v5, v4, base64),
//! driven by a tokio-tungstenite client.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine;
use common::*;
use crust_streaming::{AttachRequest, StreamingConfig, TerminalSize};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

#[derive(Default, Debug)]
struct Got {
    protocol: Option<String>,
    channels: [Vec<u8>; 5],
}

impl Got {
    fn text(&self, ch: usize) -> String {
        String::from_utf8_lossy(&self.channels[ch]).into_owned()
    }
    fn status(&self) -> serde_json::Value {
        serde_json::from_slice(&self.channels[3])
            .unwrap_or_else(|e| panic!("status {:?}: {e}", self.text(3)))
    }
}

/// What the client sends, in order.
enum Send<'a> {
    Data(u8, &'a [u8]),
    Close(u8),
}

async fn ws_session(url: &str, protocols: &str, script: &[Send<'_>]) -> Got {
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
    let (mut ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    let protocol = resp
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_string());
    let base64 = protocol.as_deref().is_some_and(|p| p.contains("base64"));
    for s in script {
        let msg = match s {
            Send::Data(ch, d) if base64 => {
                let mut t = String::from(char::from(b'0' + ch));
                base64::engine::general_purpose::STANDARD.encode_string(d, &mut t);
                Message::text(t)
            }
            Send::Data(ch, d) => Message::binary([&[*ch][..], d].concat()),
            Send::Close(ch) => Message::binary(vec![255, *ch]),
        };
        ws.send(msg).await.unwrap();
    }
    let mut got = Got {
        protocol,
        ..Default::default()
    };
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("session ends in time");
        match msg {
            Some(Ok(Message::Binary(b))) => {
                assert!(!base64, "binary message on a base64 protocol");
                got.channels[b[0] as usize].extend_from_slice(&b[1..]);
            }
            Some(Ok(Message::Text(t))) => {
                let ch = (t.as_bytes()[0] - b'0') as usize;
                got.channels[ch].extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(&t.as_bytes()[1..])
                        .unwrap(),
                );
            }
            Some(Ok(Message::Close(f))) => {
                assert_eq!(f.map(|f| u16::from(f.code)), Some(1000), "a normal close");
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{e}"),
            None => break,
        }
    }
    got
}

#[tokio::test]
async fn v5_exec_with_stdin_close_signal_and_exit_codes() {
    let (server, _) = start(StreamingConfig::default()).await;
    let url = server
        .get_exec_url(exec_req(&["cat"], true, true, false, false))
        .unwrap();
    let got = ws_session(
        &url,
        "v5.channel.k8s.io, v4.channel.k8s.io",
        &[
            Send::Data(0, b"hello "),
            Send::Data(0, b"world\n"),
            Send::Close(0),
        ],
    )
    .await;
    assert_eq!(got.protocol.as_deref(), Some("v5.channel.k8s.io"));
    assert_eq!(got.text(1), "hello world\n");
    assert_eq!(
        got.status(),
        serde_json::json!({"metadata": {}, "status": "Success"})
    );

    let url = server
        .get_exec_url(exec_req(&["exit", "42"], false, true, true, false))
        .unwrap();
    let got = ws_session(&url, "v5.channel.k8s.io", &[]).await;
    let st = got.status();
    assert_eq!(st["reason"], "NonZeroExitCode");
    assert_eq!(st["details"]["causes"][0]["message"], "42");

    let url = server
        .get_exec_url(exec_req(&["stderr", "oops"], false, true, true, false))
        .unwrap();
    let got = ws_session(&url, "v4.channel.k8s.io", &[]).await;
    assert_eq!(got.protocol.as_deref(), Some("v4.channel.k8s.io"));
    assert_eq!(got.text(2), "oops");
    assert_eq!(got.status()["status"], "Success");
}

#[tokio::test]
async fn base64_and_legacy_protocols() {
    let (server, _) = start(StreamingConfig::default()).await;
    let url = server
        .get_exec_url(exec_req(
            &["echo", "hi", "there"],
            false,
            true,
            false,
            false,
        ))
        .unwrap();
    let got = ws_session(&url, "v4.base64.channel.k8s.io", &[]).await;
    assert_eq!(got.protocol.as_deref(), Some("v4.base64.channel.k8s.io"));
    assert_eq!(got.text(1), "hi there\n");
    assert_eq!(got.status()["status"], "Success");

    let url = server
        .get_exec_url(exec_req(&["exit", "7"], false, true, false, false))
        .unwrap();
    let got = ws_session(&url, "channel.k8s.io", &[]).await;
    assert!(
        got.text(3).contains("non-zero exit code"),
        "{:?}",
        got.text(3)
    );
}

#[tokio::test]
async fn tty_resize_over_websocket() {
    let (server, fake) = start(StreamingConfig::default()).await;
    let url = server
        .get_exec_url(exec_req(&["resize", "2"], true, true, false, true))
        .unwrap();
    let got = ws_session(
        &url,
        "v5.channel.k8s.io",
        &[
            Send::Data(4, br#"{"Width":100,"Height":30}"#),
            Send::Data(4, br#"{"Width":101,"Height":31}"#),
        ],
    )
    .await;
    assert_eq!(got.text(1), "30 100\r\n31 101\r\n");
    assert_eq!(
        fake.seen.resizes.lock().unwrap()[0],
        TerminalSize {
            width: 100,
            height: 30
        }
    );
}

#[tokio::test]
async fn attach_over_websocket_and_backend_errors() {
    let (server, _) = start(StreamingConfig::default()).await;
    let url = server
        .get_attach_url(AttachRequest {
            container_id: "c1".into(),
            tty: false,
            stdin: true,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    let got = ws_session(
        &url,
        "v5.channel.k8s.io",
        &[Send::Data(0, b"echo hello\n"), Send::Close(0)],
    )
    .await;
    assert_eq!(got.text(1), "echo hello\n");
    assert_eq!(got.status()["status"], "Success");

    let url = server
        .get_attach_url(AttachRequest {
            container_id: "missing".into(),
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
        })
        .unwrap();
    let got = ws_session(&url, "v5.channel.k8s.io", &[]).await;
    assert_eq!(got.status()["reason"], "InternalError");
    assert!(
        got.status()["message"]
            .as_str()
            .unwrap()
            .contains("container missing")
    );
}

#[tokio::test]
async fn websocket_client_vanishing_and_bad_requests() {
    let (server, fake) = start(quick_grace()).await;
    let url = server
        .get_exec_url(exec_req(&["watch"], true, true, false, false))
        .unwrap();
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(ws);
    for _ in 0..200 {
        if fake.seen.finished.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(fake.seen.stdin_closed.load(Ordering::SeqCst));
    assert!(fake.seen.stdout_failed.load(Ordering::SeqCst));

    // Unknown subprotocols are refused; the token is spent.
    let url = server
        .get_exec_url(exec_req(&["exit", "0"], false, true, false, false))
        .unwrap();
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v9.channel.k8s.io".parse().unwrap(),
    );
    assert!(tokio_tungstenite::connect_async(req).await.is_err());
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let err = tokio_tungstenite::connect_async(req).await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
}
