//! Harness for crust's integration tests: the real `crust daemon` binary on
//! a unique socket with a temporary root and run dir, gRPC clients for both
//! CRI versions, and cleanup that runs even when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crust_api::{v1, v1alpha2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::transport::{Channel, Endpoint};

pub use crust_api;
pub use tonic;

/// The `crust` binary under test: `$CRUST_BIN`, else the one cargo built next
/// to this test binary (`make test` builds it first).
pub fn crust_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CRUST_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>/crust
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("crust"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "{} not found: build it with `cargo build --bins` (make test does)",
        bin.display()
    );
    bin
}

/// How to start a daemon.
#[derive(Default)]
pub struct DaemonBuilder {
    config_toml: Option<String>,
    args: Vec<String>,
}

impl DaemonBuilder {
    /// Writes this TOML as the daemon's `--config` file.
    pub fn config(mut self, toml: &str) -> Self {
        self.config_toml = Some(toml.to_string());
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Starts the daemon and waits until it answers Version.
    pub async fn start(self) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("crust-test-")
            .tempdir()
            .expect("temp dir");
        let socket = dir.path().join("crust.sock");
        let root = dir.path().join("root");
        let run_dir = dir.path().join("run");
        let cni_conf_dir = dir.path().join("cni");
        std::fs::create_dir_all(&cni_conf_dir).unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(&config, self.config_toml.as_deref().unwrap_or("")).unwrap();
        let log = dir.path().join("daemon.log");
        let mut args: Vec<std::ffi::OsString> = vec!["daemon".into()];
        for (flag, value) in [
            ("--config", &config),
            ("--socket", &socket),
            ("--root", &root),
            ("--run-dir", &run_dir),
            ("--cni-conf-dir", &cni_conf_dir),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        args.extend(["--log-level".into(), "debug".into()]);
        args.extend(self.args.iter().map(Into::into));
        let mut daemon = Daemon {
            child: None,
            args,
            socket,
            root,
            run_dir,
            cni_conf_dir,
            log,
            dir: Some(dir),
        };
        daemon.spawn();
        daemon.wait_ready().await;
        daemon
    }
}

/// A running `crust daemon`; stopped and its directories removed on drop.
pub struct Daemon {
    child: Option<Child>,
    args: Vec<std::ffi::OsString>,
    pub socket: PathBuf,
    pub root: PathBuf,
    pub run_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub log: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Daemon {
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        // Appends, so the log of a restarted daemon keeps its predecessor's.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(crust_bin())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn crust daemon");
        self.child = Some(child);
    }

    /// Stops the daemon with SIGTERM and starts it again on the same dirs.
    pub async fn restart(&mut self) {
        let status = self.stop().await;
        assert!(status.success(), "daemon exited with {status}");
        self.spawn();
        self.wait_ready().await;
    }

    /// Starts the daemon again after it was stopped or killed.
    pub async fn start_again(&mut self) {
        self.spawn();
        self.wait_ready().await;
    }

    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::default()
    }

    pub async fn start() -> Daemon {
        Daemon::builder().start().await
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "crust daemon exited ({status}) during start:\n{}",
                    self.logs()
                );
            }
            if let Ok(ch) = self.channel().await {
                let mut c = v1::runtime_service_client::RuntimeServiceClient::new(ch);
                if c.version(v1::VersionRequest::default()).await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "crust daemon not ready:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn channel(&self) -> Result<Channel, tonic::transport::Error> {
        connect(&self.socket).await
    }

    pub async fn runtime_v1(&self) -> v1::runtime_service_client::RuntimeServiceClient<Channel> {
        v1::runtime_service_client::RuntimeServiceClient::new(self.channel().await.unwrap())
    }

    pub async fn image_v1(&self) -> v1::image_service_client::ImageServiceClient<Channel> {
        v1::image_service_client::ImageServiceClient::new(self.channel().await.unwrap())
    }

    pub async fn runtime_v1alpha2(
        &self,
    ) -> v1alpha2::runtime_service_client::RuntimeServiceClient<Channel> {
        v1alpha2::runtime_service_client::RuntimeServiceClient::new(self.channel().await.unwrap())
    }

    pub async fn image_v1alpha2(
        &self,
    ) -> v1alpha2::image_service_client::ImageServiceClient<Channel> {
        v1alpha2::image_service_client::ImageServiceClient::new(self.channel().await.unwrap())
    }

    /// The daemon's log so far, for assertion messages.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits for the daemon to exit. Async, so that the
    /// test's own client connections keep being served meanwhile (the
    /// daemon's graceful shutdown waits for their HTTP/2 GOAWAY handshake).
    pub async fn signal_and_wait(&mut self, signal: Signal, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        wait_timeout(&mut child, Duration::ZERO).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("crust daemon did not exit within {timeout:?} after {signal}")
        })
    }

    /// SIGTERM, as an init system stops it.
    pub async fn stop(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGTERM, Duration::from_secs(15))
            .await
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("--- crust daemon log ---\n{}", self.logs());
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .expect("valid endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `crust` with `args` to completion (for CLI tests).
pub fn run_crust(args: &[&str]) -> std::process::Output {
    Command::new(crust_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run crust")
}
