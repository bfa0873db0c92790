//! The real `crust daemon` binary as a test runs it: a unique socket,
//! a temporary root, run dir and CNI conf dir, NRI paths of its own, gRPC
//! clients for both CRI versions, and cleanup (pods through the API, then
//! the process, mounts and directories) that runs even when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crust_api::{v1, v1alpha2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tonic::transport::{Channel, Endpoint};

use crate::host::mounts_under;
use crate::run_env::{cgroup_driver_from_env, crust_bin, patience};

/// A test daemon's NRI socket, relative to its temp dir.
const NRI_SOCKET: &str = "nri/nri.sock";

/// How to start a daemon.
#[derive(Default)]
pub struct DaemonBuilder {
    config_toml: Option<String>,
    args: Vec<String>,
    root: Option<PathBuf>,
    env: Vec<(String, String)>,
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

    /// The daemon's `--root` (default: `root` in its temp dir), e.g. on a
    /// filesystem the test mounted.
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }

    /// An environment variable of the daemon (every start of it).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts the daemon and waits until it answers Version.
    pub async fn start(self) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("crust-test-")
            .tempdir()
            .expect("temp dir");
        let socket = dir.path().join("crust.sock");
        let root = self.root.unwrap_or_else(|| dir.path().join("root"));
        let run_dir = dir.path().join("run");
        let cni_conf_dir = dir.path().join("cni");
        std::fs::create_dir_all(&cni_conf_dir).unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            test_config(self.config_toml.as_deref().unwrap_or(""), dir.path()),
        )
        .unwrap();
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
        // Debug logs unless the test sets the level itself (a flag would
        // win over the config's `log_level`, at start and at reloads).
        let config_table = self
            .config_toml
            .as_deref()
            .and_then(|t| t.parse::<toml::Table>().ok());
        let config_sets = |key: &str| config_table.as_ref().is_some_and(|t| t.contains_key(key));
        if !self.args.iter().any(|a| a == "--log-level") && !config_sets("log_level") {
            args.extend(["--log-level".into(), "debug".into()]);
        }
        // The run's driver, unless this test picks one itself.
        let picks_driver = self.args.iter().any(|a| a.starts_with("--cgroup-driver"))
            || config_sets("cgroup_driver");
        if let (false, Some(driver)) = (picks_driver, cgroup_driver_from_env()) {
            args.extend(["--cgroup-driver".into(), driver.into()]);
        }
        args.extend(self.args.iter().map(Into::into));
        let mut daemon = Daemon {
            child: None,
            args,
            env: self.env,
            socket,
            root,
            run_dir,
            cni_conf_dir,
            log,
            config,
            dir: Some(dir),
            _noisy: crate::noisy::shared(),
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
    env: Vec<(String, String)>,
    pub socket: PathBuf,
    pub root: PathBuf,
    pub run_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub log: PathBuf,
    /// The `--config` file (a test rewrites it to try a reload).
    pub config: PathBuf,
    dir: Option<tempfile::TempDir>,
    /// The process's noisy neighbour runs while any daemon does (dropped
    /// last: after the daemon's teardown).
    _noisy: Option<crate::noisy::NoisyGuard>,
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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

    /// Writes `toml` as the daemon's config file, with the test daemon's
    /// own NRI paths and network default as at start (see [`test_config`]);
    /// the daemon reads it at its next reload or start.
    pub fn write_config(&self, toml: &str) {
        std::fs::write(&self.config, test_config(toml, self.temp_dir())).unwrap();
    }

    /// The daemon's private temp dir (socket, root, run dir, CNI conf dir);
    /// tests put their own scratch files (e.g. CNI IPAM state) here too.
    /// Runs the `crust` CLI with `args` and `--socket <this daemon's>` as
    /// user and group 65534 (nobody): the socket and the dirs above it are
    /// opened to everyone, and a copy of the CLI is made where nobody may
    /// run it, so that only the daemon's check of the caller says no.
    pub fn cli_as_nobody(&self, args: &[&str]) -> std::process::Output {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let mut dir = self.socket.parent();
        while let Some(p) = dir {
            if p == Path::new("/tmp") || p == Path::new("/") {
                break;
            }
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
            dir = p.parent();
        }
        std::fs::set_permissions(&self.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let cli = self.temp_dir().join("crust-cli");
        std::fs::copy(crust_bin(), &cli).unwrap();
        std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
        Command::new(&cli)
            .args(args)
            .args(["--socket", &self.socket.display().to_string()])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    }

    pub fn temp_dir(&self) -> &Path {
        self.dir.as_ref().expect("temp dir").path()
    }

    /// The daemon's NRI socket (unless the test's config names another).
    pub fn nri_socket(&self) -> PathBuf {
        self.temp_dir().join(NRI_SOCKET)
    }

    /// Where the daemon looks for pre-installed NRI plugins and their
    /// configuration (unless the test's config names others).
    pub fn nri_plugin_dirs(&self) -> (PathBuf, PathBuf) {
        (
            self.temp_dir().join("nri/plugins"),
            self.temp_dir().join("nri/conf.d"),
        )
    }

    /// Stops and removes every pod sandbox of the daemon through the API.
    pub async fn remove_all_pods(&self) {
        remove_all_pods(&self.socket).await;
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    async fn wait_ready(&mut self) {
        // An emulated VM (TCG) starts a debug daemon far slower than a host.
        let start = std::env::var("CRUST_TEST_DAEMON_START_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or_else(|| patience(Duration::from_secs(20)));
        let deadline = Instant::now() + start;
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

    /// Waits for the daemon to exit by itself (a crash point killed it);
    /// None if it still runs after `timeout` (it is left running).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("daemon running");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether the daemon process is running (not exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM, as an init system stops it.
    pub async fn stop(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGTERM, Duration::from_secs(15))
            .await
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Last resort for a test that failed before removing its pods:
        // through the API while the daemon runs, so CNI DEL and every other
        // teardown step run as in production.
        if self.child.is_some() {
            remove_all_pods_blocking(&self.socket);
        }
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
        // Whatever is still mounted in the run dir (pinned namespaces, shm)
        // would keep the temp dir from being removed.
        for mount in mounts_under(&self.run_dir).into_iter().rev() {
            let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
        remove_default_cgroup_parent();
    }
}

/// Pods created without a cgroup_parent live under the daemon's default
/// parent `/crust`, which outlives their removal. rmdir only succeeds on an
/// empty cgroup, so a parent still in use (another daemon, a parallel
/// test) is left alone.
fn remove_default_cgroup_parent() {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for entry in entries.flatten() {
        let _ = std::fs::remove_dir(entry.path().join("crust"));
    }
    let _ = std::fs::remove_dir("/sys/fs/cgroup/crust");
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

/// The test's config with `network.install_default_conflist = false` added
/// unless the test sets it: a test daemon gets a network only from the
/// test (see [`TestNetwork`]). Likewise NRI's socket and plugin dirs are
/// the daemon's own, under `dir` (parallel daemons on the default socket
/// would collide, and a test daemon must not start the host's plugins).
fn test_config(toml_text: &str, dir: &Path) -> String {
    let Ok(mut table) = toml_text.parse::<toml::Table>() else {
        // Invalid on purpose: the daemon reports it.
        return toml_text.to_string();
    };
    let network = table
        .entry("network")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(network) = network.as_table_mut() {
        network
            .entry("install_default_conflist")
            .or_insert(toml::Value::Boolean(false));
    }
    let nri = table
        .entry("nri")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(nri) = nri.as_table_mut() {
        for (key, rel) in [
            ("socket_path", NRI_SOCKET),
            ("plugin_path", "nri/plugins"),
            ("plugin_config_path", "nri/conf.d"),
        ] {
            // The node's own NRI paths (a printed default config) are never
            // a test daemon's: two tests would fight over the socket.
            let node_path = nri.get(key).and_then(|v| v.as_str()).is_none_or(|p| {
                ["/var/run/nri", "/run/nri", "/opt/nri", "/etc/nri"]
                    .iter()
                    .any(|d| p.starts_with(d))
            });
            if node_path {
                nri.insert(
                    key.to_string(),
                    toml::Value::String(dir.join(rel).display().to_string()),
                );
            }
        }
    }
    table.to_string()
}

async fn remove_all_pods(socket: &Path) {
    let Ok(channel) = connect(socket).await else {
        return;
    };
    let mut rt = v1::runtime_service_client::RuntimeServiceClient::new(channel);
    let Ok(list) = rt
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
    else {
        return;
    };
    for pod in list.into_inner().items {
        let id = pod.id;
        let _ = rt
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        if let Err(e) = rt
            .remove_pod_sandbox(v1::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
        {
            eprintln!("cleanup: RemovePodSandbox failed: {e}");
        }
    }
}

/// [`remove_all_pods`] from synchronous code (Drop), on a thread and
/// runtime of its own, bounded in time.
pub(crate) fn remove_all_pods_blocking(socket: &Path) {
    let socket = socket.to_path_buf();
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(60), remove_all_pods(&socket)).await;
        });
    })
    .join();
}
