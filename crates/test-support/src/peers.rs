//! Peers the streaming tests talk to or through: the node client
//! (spdy-transport + ws, the SPDY/3.1 and WebSocket stacks kubectl's
//! ecosystem uses), raw HTTP requests, and a TCP echo server inside a
//! pod's network namespace. Used by the daemon's streaming suite
//! (tests/tests/streaming.rs) and the streaming crate's own tests.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where the node client's sources live (package.json, client.js).
fn node_client_sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../streaming/tests/node")
}

/// The node client, installed once per test binary under the target
/// dir's tmp/ (as CARGO_TARGET_TMPDIR, which only test crates get).
/// `None` when node or npm is missing or the install fails (said on
/// stderr): the caller skips, counted.
pub fn node_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("node is not installed");
            return None;
        }
        let exe = std::env::current_exe().ok()?;
        let name = exe.file_stem()?.to_string_lossy().into_owned();
        // <target>/<profile>/deps/<test binary>
        let target = exe.parent()?.parent()?.parent()?;
        let dir = target.join("tmp").join(format!("node-{name}"));
        let src = node_client_sources();
        std::fs::create_dir_all(&dir).ok()?;
        for f in ["package.json", "client.js"] {
            if let Err(e) = std::fs::copy(src.join(f), dir.join(f)) {
                eprintln!("copying the node client's {f}: {e}");
                return None;
            }
        }
        if !dir.join("node_modules/spdy-transport").exists()
            || !dir.join("node_modules/ws").exists()
        {
            let out = std::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir)
                .output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => {
                    eprintln!("npm install failed: {}", String::from_utf8_lossy(&o.stderr));
                    return None;
                }
                Err(e) => {
                    eprintln!("npm could not run: {e}");
                    return None;
                }
            }
        }
        Some(dir)
    })
    .as_deref()
}

/// Runs the node client with `opts` (JSON) and returns its JSON answer
/// (the last line it prints). Panics when it gives none.
pub async fn node(opts: serde_json::Value) -> serde_json::Value {
    let dir = node_dir().expect("node client");
    let out = tokio::process::Command::new("node")
        .arg(dir.join("client.js"))
        .arg(opts.to_string())
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    if line.contains("\"fatal\"") {
        eprintln!(
            "node client failed; its stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "node client gave no JSON ({e}): stdout={stdout} stderr={}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A plain HTTP/1.1 GET with `Connection: close`; the status code and the
/// raw response, read to its end (10 s at most).
pub async fn http(url: &str, extra_headers: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = TcpStream::connect(host).await.unwrap();
    let req =
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra_headers}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// A GET whose connection may stay open (an upgrade): the status code of
/// the first response bytes.
pub async fn http_status(url: &str, headers: &str) -> u16 {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = TcpStream::connect(host).await.unwrap();
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A TCP echo server on 127.0.0.1 inside `netns` (the host's network
/// namespace when `None`): each connection gets back what it sends, and
/// on EOF its write side is shut. The listening socket is made on a thread
/// that enters the namespace, then served from the caller's runtime.
/// Returns its port.
pub async fn echo_server(netns: Option<&Path>) -> u16 {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0");
    let listener = match netns {
        Some(ns) => {
            crust_linux::ns::run_in_namespaces(&[(crust_linux::ns::NamespaceKind::Net, ns)], bind)
                .unwrap()
                .unwrap()
        }
        None => bind().unwrap(),
    };
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match r.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if w.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = w.shutdown().await;
            });
        }
    });
    port
}
