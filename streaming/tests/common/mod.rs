//! Shared pieces of the integration tests: a fake backend (the real one,
//! the daemon's containers, does not exist yet), a pod network namespace
//! with a TCP echo server in it, the node client harness, raw HTTP helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crust_streaming::{
    AttachRequest, Backend, BackendError, BoxDuplex, BoxFuture, ExecRequest, StreamIo,
    StreamingConfig, StreamingServer, TerminalSize,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Ends a test that cannot run here: see [`skipped`].
#[macro_export]
macro_rules! skip {
    ($($reason:tt)*) => {{
        $crate::common::skipped(&format!($($reason)*));
        return;
    }};
}

/// One `SKIPPED: <test>: <reason>` line on stderr, past the harness's
/// capture, so that a test that could not run is seen and counted
/// (`grep -c '^SKIPPED'`), never read as passed. The same convention as
/// `crust_test_support::skipped`.
pub fn skipped(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    let line = format!("SKIPPED: {test}: {reason}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// What the fake saw, for assertions.
#[derive(Default)]
pub struct Seen {
    pub calls: AtomicUsize,
    pub stdin_closed: AtomicBool,
    pub stdout_failed: AtomicBool,
    pub dropped: AtomicBool,
    pub finished: AtomicBool,
    pub resizes: Mutex<Vec<TerminalSize>>,
}

/// A backend that plays commands instead of running them:
/// `exit N`, `echo WORDS..`, `cat` (stdin to stdout), `stderr TEXT`,
/// `resize N` (reports N sizes), `hang` (never returns; records its drop),
/// `watch` (reads stdin to its end, then writes until that fails).
/// Port-forward goes for real into the network namespace registered for
/// the pod.
#[derive(Default)]
pub struct Fake {
    pub seen: Arc<Seen>,
    pub netns: Mutex<HashMap<String, PathBuf>>,
}

struct DropFlag(Arc<Seen>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::SeqCst);
    }
}

impl Fake {
    async fn play(&self, cmd: Vec<String>, mut io: StreamIo) -> Result<i32, BackendError> {
        self.seen.calls.fetch_add(1, Ordering::SeqCst);
        let arg = |i: usize| cmd.get(i).cloned().unwrap_or_default();
        match cmd[0].as_str() {
            "exit" => Ok(arg(1).parse().unwrap_or(1)),
            "echo" => {
                let out = io.stdout.as_mut().expect("stdout");
                out.write_all(format!("{}\n", cmd[1..].join(" ")).as_bytes())
                    .await
                    .ok();
                Ok(0)
            }
            "stderr" => {
                let err = io.stderr.as_mut().expect("stderr");
                err.write_all(arg(1).as_bytes()).await.ok();
                Ok(0)
            }
            "cat" => {
                let mut stdin = io.stdin.take().expect("stdin");
                let out = io.stdout.as_mut().expect("stdout");
                tokio::io::copy(&mut stdin, out)
                    .await
                    .map_err(|e| BackendError::Failed(e.to_string()))?;
                Ok(0)
            }
            "resize" => {
                let n: usize = arg(1).parse().unwrap_or(1);
                let mut rx = io.resize.take().expect("resize channel");
                let out = io.stdout.as_mut().expect("stdout");
                for _ in 0..n {
                    let Some(s) = rx.recv().await else { break };
                    self.seen.resizes.lock().unwrap().push(s);
                    out.write_all(format!("{} {}\r\n", s.height, s.width).as_bytes())
                        .await
                        .ok();
                }
                Ok(0)
            }
            "hang" => {
                let _flag = DropFlag(self.seen.clone());
                std::future::pending::<()>().await;
                unreachable!()
            }
            "watch" => {
                let _flag = DropFlag(self.seen.clone());
                let mut buf = [0u8; 1024];
                if let Some(stdin) = io.stdin.as_mut() {
                    loop {
                        match stdin.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                    self.seen.stdin_closed.store(true, Ordering::SeqCst);
                }
                if let Some(out) = io.stdout.as_mut() {
                    for _ in 0..200 {
                        if out.write_all(b"tick\n").await.is_err() {
                            self.seen.stdout_failed.store(true, Ordering::SeqCst);
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                self.seen.finished.store(true, Ordering::SeqCst);
                Ok(0)
            }
            other => Err(BackendError::Failed(format!(
                "executable file not found: {other}"
            ))),
        }
    }
}

impl Backend for Fake {
    fn exec(&self, req: ExecRequest, io: StreamIo) -> BoxFuture<'_, Result<i32, BackendError>> {
        Box::pin(self.play(req.cmd, io))
    }

    fn attach(&self, req: AttachRequest, io: StreamIo) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            if req.container_id == "missing" {
                return Err(BackendError::NotFound("container missing".into()));
            }
            self.play(vec!["cat".into()], io).await.map(|_| ())
        })
    }

    fn port_forward(
        &self,
        pod: String,
        port: u16,
        stream: BoxDuplex,
    ) -> BoxFuture<'_, Result<(), BackendError>> {
        let netns = self.netns.lock().unwrap().get(&pod).cloned();
        Box::pin(async move {
            let netns =
                netns.ok_or_else(|| BackendError::NotFound(format!("pod sandbox {pod}")))?;
            crust_streaming::forward_in_netns(&netns, port, stream)
                .await
                .map(|_| ())
                .map_err(|e| BackendError::Failed(e.to_string()))
        })
    }
}

pub async fn start(cfg: StreamingConfig) -> (StreamingServer, Arc<Fake>) {
    let fake = Arc::new(Fake::default());
    let server = StreamingServer::start(cfg, fake.clone())
        .await
        .expect("start streaming server");
    (server, fake)
}

pub fn exec_req(cmd: &[&str], stdin: bool, stdout: bool, stderr: bool, tty: bool) -> ExecRequest {
    ExecRequest {
        container_id: "c1".into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        tty,
        stdin,
        stdout,
        stderr,
    }
}

/// A plain HTTP/1.1 request; returns the status code and the raw response.
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

/// The SPDY upgrade headers of a remotecommand client.
pub const SPDY_EXEC_HEADERS: &str =
    "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n";

/// A pod network namespace, pinned the way the daemon pins pods' (through
/// crust-linux), and removed on drop.
pub struct PodNetns {
    dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl PodNetns {
    pub fn new() -> Option<PodNetns> {
        let dir = tempfile::Builder::new()
            .prefix("crust-stream-test-")
            .tempdir()
            .unwrap();
        let opts = crust_linux::ns::PinOptions {
            net: true,
            loopback_up: true,
            ..Default::default()
        };
        match crust_linux::ns::pin_namespaces(dir.path(), &opts) {
            Ok(p) => {
                let path = p.net.expect("net pinned");
                Some(PodNetns { dir, path })
            }
            Err(e) => {
                eprintln!("cannot create a network namespace here: {e}");
                None
            }
        }
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        let _ = crust_linux::ns::unpin_namespaces(self.dir.path());
    }
}

/// Starts a TCP echo server on 127.0.0.1:`port` inside `netns`: each
/// connection gets back what it sends; on EOF it shuts its write side.
/// The listening socket is created on a thread inside the namespace and
/// then served from the test's runtime.
pub async fn echo_server(netns: &Path) -> u16 {
    let listener =
        crust_linux::ns::run_in_namespaces(&[(crust_linux::ns::NamespaceKind::Net, netns)], || {
            std::net::TcpListener::bind("127.0.0.1:0")
        })
        .unwrap()
        .unwrap();
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

/// The node test client (spdy-transport + ws), installed once per test
/// binary under the target dir. `None` when node or npm is missing.
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
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("node-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(src.join("package.json"), dir.join("package.json")).unwrap();
        std::fs::copy(src.join("client.js"), dir.join("client.js")).unwrap();
        if !dir.join("node_modules/spdy-transport").exists()
            || !dir.join("node_modules/ws").exists()
        {
            let out = std::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir)
                .output()
                .expect("run npm");
            assert!(
                out.status.success(),
                "npm install failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Some(dir)
    })
    .as_deref()
}

/// Runs the node client with `opts` (JSON) and returns its JSON answer.
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

pub fn fast_expiry() -> StreamingConfig {
    StreamingConfig {
        token_ttl: Duration::from_millis(300),
        disconnect_grace: Duration::from_millis(500),
        ..Default::default()
    }
}

/// Default tokens, but a short grace for backend calls of vanished clients.
pub fn quick_grace() -> StreamingConfig {
    StreamingConfig {
        disconnect_grace: Duration::from_millis(500),
        ..Default::default()
    }
}
