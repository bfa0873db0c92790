//! Shared pieces of the integration tests: a fake backend (the real one,
//! the daemon's containers, is tested through the daemon in
//! tests/tests/streaming.rs), a pod network namespace; the peers (node
//! client, raw HTTP, echo server) are crust-test-support's, shared with
//! the daemon's streaming suite.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crust_streaming::{
    AttachRequest, Backend, BackendError, BoxDuplex, BoxFuture, ExecRequest, StreamIo,
    StreamingConfig, StreamingServer, TerminalSize,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Ends a test that cannot run here, counted: see
/// `crust_test_support::skipped`.
#[macro_export]
macro_rules! skip {
    ($($reason:tt)*) => {{
        crust_test_support::skipped(&format!($($reason)*));
        return;
    }};
}

// Each test binary uses some of them.
#[allow(unused_imports)]
pub use crust_test_support::peers::{http, node, node_dir};

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

/// A TCP echo server on 127.0.0.1 inside `netns`: see
/// `crust_test_support::peers::echo_server`.
pub async fn echo_server(netns: &Path) -> u16 {
    crust_test_support::peers::echo_server(Some(netns)).await
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
