//! The real client-go, as shipped in kubectl: exec and port-forward through
//! a stand-in API server that plays kubelet's part (it answers discovery and
//! the pod GET, and proxies each exec/port-forward upgrade to a fresh
//! streaming URL, as kubelet proxies to the CRI streaming server). Both
//! transports kubectl has: WebSocket (its default since 1.31: v5 channels
//! for exec, SPDY tunnelled in WebSocket for port-forward) and SPDY.
//! Skipped where kubectl is not installed.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use crust_streaming::{ExecRequest, PortForwardRequest, StreamingConfig, StreamingServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

fn kubectl_present() -> bool {
    std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

const POD: &str = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"test","namespace":"default","uid":"u1"},
"spec":{"containers":[{"name":"c","image":"busybox"}]},"status":{"phase":"Running"}}"#;
const API: &str = r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1:1"}]}"#;
const APIS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#;
const V1: &str = r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[
{"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["get","list"],"shortNames":["po"]},
{"name":"pods/exec","singularName":"","namespaced":true,"kind":"PodExecOptions","verbs":["create","get"]},
{"name":"pods/portforward","singularName":"","namespaced":true,"kind":"PodPortForwardOptions","verbs":["create","get"]}]}"#;

/// The stand-in API server; returns its address.
async fn api_server(streaming: Arc<StreamingServer>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(serve_api(s, streaming.clone()));
        }
    });
    addr
}

async fn serve_api(mut s: TcpStream, streaming: Arc<StreamingServer>) {
    loop {
        // Read one request head (discovery and GETs have no body).
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut b).await {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
            if head.len() > 64 * 1024 {
                return;
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let target = head.split(' ').nth(1).unwrap_or("/").to_string();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let json = |body: &str| {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        let reply = match path {
            "/api" => json(API),
            "/apis" => json(APIS),
            "/api/v1" => json(V1),
            "/api/v1/namespaces/default/pods/test" => json(POD),
            "/api/v1/namespaces/default/pods/test/exec" => {
                let pairs: Vec<(&str, &str)> =
                    query.split('&').filter_map(|p| p.split_once('=')).collect();
                let flag = |k: &str| {
                    pairs
                        .iter()
                        .any(|(n, v)| *n == k && (*v == "true" || *v == "1"))
                };
                let cmd: Vec<String> = pairs
                    .iter()
                    .filter(|(n, _)| *n == "command")
                    .map(|(_, v)| v.replace("%20", " "))
                    .collect();
                let url = streaming
                    .get_exec_url(ExecRequest {
                        container_id: "c".into(),
                        cmd,
                        tty: flag("tty"),
                        stdin: flag("stdin"),
                        stdout: flag("stdout"),
                        stderr: flag("stderr"),
                    })
                    .unwrap();
                return proxy(s, &head, &url).await;
            }
            "/api/v1/namespaces/default/pods/test/portforward" => {
                let url = streaming
                    .get_port_forward_url(PortForwardRequest {
                        pod_sandbox_id: "pod1".into(),
                        ports: vec![],
                    })
                    .unwrap();
                return proxy(s, &head, &url).await;
            }
            _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string(),
        };
        if s.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Hands the upgrade request to the streaming URL and pipes the rest.
async fn proxy(mut client: TcpStream, head: &str, url: &str) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap();
    let method = first.split(' ').next().unwrap();
    let mut out = format!("{method} /{path} HTTP/1.1\r\n");
    for l in lines.filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("host:")) {
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str(&format!("Host: {host}\r\n\r\n"));
    let mut up = TcpStream::connect(host).await.unwrap();
    up.write_all(out.as_bytes()).await.unwrap();
    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
}

async fn kubectl_exec(
    api: &str,
    websockets: bool,
    args: &[&str],
    stdin: &[u8],
) -> (String, String, i32) {
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.args(["--server", &format!("http://{api}"), "--cache-dir"])
        .arg(cache.path())
        .args(["exec", "test", "-c", "c"])
        .args(args)
        .env(
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS",
            if websockets { "true" } else { "false" },
        )
        .env("HOME", cache.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut w = child.stdin.take().unwrap();
    w.write_all(stdin).await.unwrap();
    drop(w);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("kubectl exec ends")
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_both_transports() {
    if !kubectl_present() {
        skip!("kubectl is not installed");
    }
    let (server, _) = start(StreamingConfig::default()).await;
    let api = api_server(Arc::new(server)).await;
    for ws in [true, false] {
        let (out, err, code) = kubectl_exec(&api, ws, &["--", "echo", "hello"], b"").await;
        assert_eq!((out.as_str(), code), ("hello\n", 0), "ws={ws} stderr={err}");
        let (out, err, code) = kubectl_exec(&api, ws, &["--", "exit", "42"], b"").await;
        assert_eq!(code, 42, "ws={ws} out={out} stderr={err}");
        let input = "some input\n".repeat(5000);
        let (out, err, code) = kubectl_exec(&api, ws, &["-i", "--", "cat"], input.as_bytes()).await;
        assert_eq!(code, 0, "ws={ws} stderr={err}");
        assert_eq!(out, input, "ws={ws}");
        let (out, err, code) = kubectl_exec(&api, ws, &["--", "stderr", "to-stderr"], b"").await;
        assert_eq!((err.as_str(), code), ("to-stderr", 0), "ws={ws} out={out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_both_transports() {
    if !kubectl_present() {
        skip!("kubectl is not installed");
    }
    let Some(netns) = PodNetns::new() else {
        skip!("cannot create a network namespace here");
    };
    let port = echo_server(&netns.path).await;
    let (server, fake) = start(StreamingConfig::default()).await;
    fake.netns
        .lock()
        .unwrap()
        .insert("pod1".into(), netns.path.clone());
    let api = api_server(Arc::new(server)).await;
    for ws in [true, false] {
        let cache = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new("kubectl")
            .args(["--server", &format!("http://{api}"), "--cache-dir"])
            .arg(cache.path())
            .args([
                "port-forward",
                "-v=6",
                "pod/test",
                "--address",
                "127.0.0.1",
                &format!("0:{port}"),
            ])
            .env(
                "KUBECTL_PORT_FORWARD_WEBSOCKETS",
                if ws { "true" } else { "false" },
            )
            .env("HOME", cache.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // "Forwarding from 127.0.0.1:NNNNN -> PORT"
        let local: u16 = line
            .split("127.0.0.1:")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let mut jobs = Vec::new();
        for i in 0..10usize {
            jobs.push(tokio::spawn(async move {
                let payload: Vec<u8> = (0..(1 << 20) + i).map(|j| (j * 7 + i) as u8).collect();
                let s = TcpStream::connect(("127.0.0.1", local)).await.unwrap();
                let (mut r, mut w) = s.into_split();
                let send = payload.clone();
                let writer = tokio::spawn(async move {
                    w.write_all(&send).await.unwrap();
                    w.shutdown().await.unwrap();
                    w
                });
                let mut got = Vec::new();
                tokio::time::timeout(Duration::from_secs(60), r.read_to_end(&mut got))
                    .await
                    .unwrap()
                    .unwrap();
                let _w = writer.await.unwrap();
                assert!(
                    got == payload,
                    "connection {i}: {} of {} bytes came back",
                    got.len(),
                    payload.len()
                );
            }));
        }
        for j in jobs {
            j.await.unwrap();
        }
        child.kill().await.unwrap();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err).await;
        // klog error lines start with 'E'.
        assert!(
            !err.lines().any(|l| l.starts_with('E')),
            "ws={ws}: kubectl said {err}"
        );
        if ws {
            assert!(
                err.contains("101 Switching Protocols") && err.contains("GET"),
                "tunnel not used: {err}"
            );
        } else {
            assert!(
                err.contains("POST") && err.contains("101 Switching Protocols"),
                "SPDY not used: {err}"
            );
        }
    }
}
