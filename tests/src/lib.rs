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

pub mod registry;

/// Ends a test that cannot run here (a tool is missing, the kernel lacks a
/// feature): see [`skipped`]. `skip!("kubectl is not installed")`.
#[macro_export]
macro_rules! skip {
    ($($reason:tt)*) => {{
        $crate::skipped(&format!($($reason)*));
        return;
    }};
}

/// Says that the running test was skipped: one `SKIPPED: <test>: <reason>`
/// line on stderr, written past the test harness's capture so that it is
/// seen (and counted: `grep -c '^SKIPPED'`) in every run, passed or not.
/// A skip is never silent: a test that returns early without this reads
/// as passed.
pub fn skipped(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    let line = format!("SKIPPED: {test}: {reason}\n");
    // One write, so that lines of parallel tests do not mix.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

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

/// The environment variable that picks the cgroup driver of every test
/// daemon (`--cgroup-driver`): `cgroupfs` or `systemd`. Unset: the daemon's
/// default (cgroupfs). The VM test bed (hack/vm) runs the suites once with
/// each.
pub const CGROUP_DRIVER_ENV: &str = "CRUST_TEST_CGROUP_DRIVER";

fn cgroup_driver_from_env() -> Option<&'static str> {
    let value = std::env::var(CGROUP_DRIVER_ENV).ok()?;
    match value.as_str() {
        "cgroupfs" => Some("cgroupfs"),
        "systemd" => Some("systemd"),
        "" => None,
        other => panic!("{CGROUP_DRIVER_ENV}={other:?}: expected cgroupfs or systemd"),
    }
}

/// The cgroup driver the test daemons run with (see [`CGROUP_DRIVER_ENV`]),
/// for assertions that depend on it.
pub fn cgroup_driver() -> &'static str {
    cgroup_driver_from_env().unwrap_or("cgroupfs")
}

/// The environment variable that says how many times slower than this
/// host the machine under test is (a float, default 1): the VM test bed
/// (hack/vm, TCG emulation) sets it. Deadlines that wait for real work
/// (a daemon to start, a CNI plugin to run) scale with it through
/// [`patience`]; a test never measures performance (that is `make bench`).
pub const SLOWDOWN_ENV: &str = "CRUST_TEST_SLOWDOWN";

/// `deadline` scaled by [`SLOWDOWN_ENV`]: how long to wait here for what
/// takes at most `deadline` on the development host.
pub fn patience(deadline: Duration) -> Duration {
    let factor = std::env::var(SLOWDOWN_ENV)
        .ok()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite() && *f >= 1.0)
                .unwrap_or_else(|| panic!("{SLOWDOWN_ENV}={s:?}: expected a number >= 1"))
        })
        .unwrap_or(1.0);
    deadline.mul_f64(factor)
}

/// What a test may need of the machine it runs on. `make test` runs the
/// suites on the host (cgroup v1 hybrid, no systemd, no AppArmor) and in the
/// VM test bed (cgroup v2 alone, systemd, AppArmor; once per cgroup driver);
/// a test that needs one of these starts with [`require!`] and is counted
/// as skipped, with the reason, where it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The unified cgroup v2 hierarchy alone at /sys/fs/cgroup.
    CgroupV2,
    /// cgroup v1 controllers at /sys/fs/cgroup (legacy or hybrid layout).
    CgroupV1,
    /// systemd is the init system (`/run/systemd/system` exists).
    Systemd,
    /// systemd is not the init system.
    NoSystemd,
    /// The test daemons use the systemd cgroup driver.
    SystemdDriver,
    /// The test daemons use the cgroupfs driver.
    CgroupfsDriver,
    /// AppArmor is enabled in the kernel and `apparmor_parser` is installed.
    AppArmor,
    /// AppArmor is not enabled.
    NoAppArmor,
    /// `runc` is in PATH.
    Runc,
    /// `crun` is in PATH.
    Crun,
}

/// Why a test cannot run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipReason(pub String);

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `None` when this machine (and run) offers `need`, else why not.
pub fn require(need: Need) -> Option<SkipReason> {
    let v2 = cgroup_v2_alone();
    let apparmor = apparmor_enabled();
    let systemd = Path::new("/run/systemd/system").is_dir();
    let (ok, why) = match need {
        Need::CgroupV2 => (v2, "needs cgroup v2 alone (this machine mounts cgroup v1)"),
        Need::CgroupV1 => (!v2, "needs cgroup v1 (this machine has cgroup v2 alone)"),
        Need::Systemd => (systemd, "needs systemd as the init system"),
        Need::NoSystemd => (!systemd, "needs a machine without systemd as init"),
        Need::SystemdDriver => (
            cgroup_driver() == "systemd",
            "needs the systemd cgroup driver (CRUST_TEST_CGROUP_DRIVER=systemd)",
        ),
        Need::CgroupfsDriver => (
            cgroup_driver() == "cgroupfs",
            "needs the cgroupfs cgroup driver (this run uses systemd)",
        ),
        Need::AppArmor => (apparmor, "needs AppArmor (kernel and apparmor_parser)"),
        Need::NoAppArmor => (!apparmor, "needs a machine without AppArmor"),
        Need::Runc => (in_path("runc"), "needs runc in PATH"),
        // crun refuses hybrid hosts (v1 controllers with cgroup2 beside
        // them: "cgroups in hybrid mode not supported").
        Need::Crun => (
            in_path("crun") && !Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists(),
            "needs crun in PATH and a cgroup layout crun supports (not hybrid v1+v2)",
        ),
    };
    (!ok).then(|| SkipReason(why.to_string()))
}

/// Reports the running test as skipped for a missing [`Need`]: the same
/// counted `SKIPPED: <test>: <reason>` line as [`skipped`]. `make test`'s
/// summaries list such tests as skipped, not passed.
pub fn report_skip(reason: &SkipReason) {
    skipped(&reason.0);
}

/// `require!(Need::A, Need::B, ...)` at the start of a test (or a helper it
/// calls): returns from it, reported as a counted skip ([`report_skip`]),
/// unless the machine offers every one of them.
#[macro_export]
macro_rules! require {
    ($($env:expr),+ $(,)?) => {
        $(
            if let Some(reason) = $crate::require($env) {
                $crate::report_skip(&reason);
                return;
            }
        )+
    };
}

fn cgroup_v2_alone() -> bool {
    nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y")
        && Path::new("/sys/kernel/security/apparmor").is_dir()
        && in_path("apparmor_parser")
}

fn in_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

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
        // Debug logs unless the test sets the level itself.
        if !self.args.iter().any(|a| a == "--log-level") {
            args.extend(["--log-level".into(), "debug".into()]);
        }
        // The run's driver, unless this test picks one itself.
        let picks_driver = self.args.iter().any(|a| a.starts_with("--cgroup-driver"))
            || self
                .config_toml
                .as_deref()
                .and_then(|t| t.parse::<toml::Table>().ok())
                .is_some_and(|t| t.contains_key("cgroup_driver"));
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
    env: Vec<(String, String)>,
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

    /// The daemon's private temp dir (socket, root, run dir, CNI conf dir);
    /// tests put their own scratch files (e.g. CNI IPAM state) here too.
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

/// A pod as the tests hold it: its id and the config it was run with
/// (CreateContainer repeats the config).
pub type Pod = (String, v1::PodSandboxConfig);

/// CreateContainer of `config` in `pod`.
pub async fn create_container(
    rt: &mut v1::runtime_service_client::RuntimeServiceClient<Channel>,
    pod: &Pod,
    config: v1::ContainerConfig,
) -> Result<String, tonic::Status> {
    rt.create_container(v1::CreateContainerRequest {
        pod_sandbox_id: pod.0.clone(),
        config: Some(config),
        sandbox_config: Some(pod.1.clone()),
    })
    .await
    .map(|r| r.into_inner().container_id)
}

/// CreateContainer and StartContainer; panics with the failing RPC.
pub async fn run_container(
    rt: &mut v1::runtime_service_client::RuntimeServiceClient<Channel>,
    pod: &Pod,
    config: v1::ContainerConfig,
) -> String {
    let id = create_container(rt, pod, config)
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"));
    rt.start_container(v1::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    id
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
fn remove_all_pods_blocking(socket: &Path) {
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

/// Whether process `pid` runs (exists and is not a zombie waiting to be
/// reaped by its new parent).
pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Mount points at or below `dir`, outermost first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        // mountinfo escapes spaces and such as octal; test dirs have none.
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}

pub fn iptables_save() -> String {
    let out = Command::new("iptables-save")
        .output()
        .expect("run iptables-save");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bridge plugin turns on the node's ip_forward for a gateway; the value
/// from before the first test network is put back after the last one.
static FORWARDING: std::sync::Mutex<(usize, Option<String>)> = std::sync::Mutex::new((0, None));
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
static NETWORKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A CNI network of a test's own, written into a daemon's conf dir: a bridge
/// and a /24 (10.198.x.0/24) no other test (of this or a concurrent run)
/// uses, host-local IPAM state in the daemon's temp dir, and whatever
/// plugins the test adds. Drop removes the daemon's pods through the API,
/// then the bridge and any iptables rule naming the network.
pub struct TestNetwork {
    pub name: String,
    pub bridge: String,
    /// `10.198.x`; the subnet is `<prefix>.0/24`, the gateway `<prefix>.1`.
    pub subnet_prefix: String,
    pub ipam_dir: PathBuf,
    pub conflist: PathBuf,
    socket: PathBuf,
}

impl TestNetwork {
    /// bridge + host-local, then `more_plugins` (JSON objects).
    pub fn install(d: &Daemon, more_plugins: &[&str]) -> TestNetwork {
        let n = NETWORKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 10;
        let pid = std::process::id();
        let name = format!("crust-pods-{pid}-{n}");
        let bridge = format!("cpt{}n{n}", pid % 100_000);
        let subnet_prefix = format!("10.198.{}", (pid % 25) * 10 + n);
        let ipam_dir = d.temp_dir().join("ipam");
        let mut plugins = vec![format!(
            r#"{{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": true,
                "hairpinMode": true,
                "ipam": {{"type": "host-local", "dataDir": "{}",
                          "ranges": [[{{"subnet": "{subnet_prefix}.0/24"}}]],
                          "routes": [{{"dst": "0.0.0.0/0"}}]}}}}"#,
            ipam_dir.display()
        )];
        plugins.extend(more_plugins.iter().map(|p| p.to_string()));
        let text = format!(
            r#"{{"cniVersion": "1.0.0", "name": "{name}", "plugins": [{}]}}"#,
            plugins.join(",")
        );
        let conflist = d.cni_conf_dir.join("50-test.conflist");
        std::fs::write(&conflist, text).unwrap();
        {
            let mut state = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
            if state.0 == 0 {
                state.1 = std::fs::read_to_string(IP_FORWARD).ok();
            }
            state.0 += 1;
        }
        TestNetwork {
            name,
            bridge,
            subnet_prefix,
            ipam_dir,
            conflist,
            socket: d.socket.clone(),
        }
    }

    /// Host-side interfaces on the bridge (the pods' veths).
    pub fn veths(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-o", "link", "show", "master", &self.bridge])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Addresses host-local has handed out.
    pub fn leases(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.ipam_dir.join(&self.name)) else {
            return vec![];
        };
        dir.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        remove_all_pods_blocking(&self.socket);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        remove_iptables_rules_mentioning(&self.name);
        let mut state = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0
            && let Some(original) = state.1.take()
        {
            let _ = std::fs::write(IP_FORWARD, original.trim());
        }
    }
}

/// Deletes nat rules whose comment names `tag`, and the per-pod chains they
/// jump to (a fallback: CNI DEL removes them when all goes well).
pub fn remove_iptables_rules_mentioning(tag: &str) {
    let Ok(out) = Command::new("iptables-save").args(["-t", "nat"]).output() else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut chains = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("-A ") && l.contains(tag))
    {
        if let Some(target) = line
            .split(" -j ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            && target.starts_with("CNI-")
            && !target.starts_with("CNI-HOSTPORT-")
        {
            chains.push(target.to_string());
        }
        // iptables-save quotes as a shell does.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("iptables -t nat -D {}", &line[3..]))
            .output();
    }
    for chain in chains {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", &chain])
            .output();
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", &chain])
            .output();
    }
}
