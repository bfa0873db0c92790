//! The one way the daemon runs something under a monitor, for containers
//! and for a pod's pause process alike: write the OCI bundle (patched for
//! the runtime that reads it), spawn the monitor, which creates the
//! container, and later start it ([`Monitor::start`]).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crust_oci::Spec;
use crust_quote::quote_os;
use crust_shim_protocol::{RuntimeConfig, ShimBinary, ShimConfig, SpawnOptions};
use tracing::Instrument;

use crate::config::Config;
use crate::monitor::Monitor;
use crate::otel::step;
use crate::tasks::blocking;

/// What to run and where its monitor keeps its state.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The ID the OCI runtime knows it by.
    pub id: String,
    /// The monitor's state dir.
    pub state_dir: PathBuf,
    /// The OCI bundle dir (created if missing; `config.json` goes there).
    pub bundle: PathBuf,
    /// The spec as generated; [`embedded_compat`] is applied for the
    /// embedded runtime.
    pub spec: Spec,
    pub runtime: RuntimeConfig,
    /// The CRI log file (created, with its dir, never through a symlink
    /// below `log_directory`); None writes no log.
    pub log_path: Option<PathBuf>,
    /// The pod's log directory, which `log_path` lies below.
    pub log_directory: Option<PathBuf>,
    pub stdin: bool,
    pub stdin_once: bool,
    /// Also keep the unpatched spec as `<bundle>/spec.json` (what
    /// verbose ContainerStatus shows).
    pub keep_spec: bool,
    /// How long the monitor may take to create the container.
    pub timeout: Duration,
    /// Restore it from these CRIU images at start instead of creating it.
    pub restore: Option<crust_shim_protocol::RestoreConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Writing the bundle failed (the message names the path).
    #[error("{0}")]
    Bundle(String),
    /// Something in the pod's log directory is in the way of the log file
    /// (a symlink, not a regular file): the message names the path.
    #[error("{0}")]
    LogPath(String),
    /// The monitor or the runtime could not create the container.
    #[error("{0}")]
    Monitor(crust_shim_protocol::Error),
}

impl From<tokio::task::JoinError> for LaunchError {
    fn from(e: tokio::task::JoinError) -> Self {
        LaunchError::Bundle(format!("writing the bundle: {e}"))
    }
}

/// Spawns monitors from the sealed copy of the configured `crust-shim`
/// binary, made once when the daemon starts.
#[derive(Debug, Clone)]
pub struct Launcher {
    shim_binary: ShimBinary,
    /// `log_size_max`: a log file's cap, enforced by its monitor (0: none).
    /// Shared by every clone: a config reload changes it for the monitors
    /// started from then on.
    log_size_max: Arc<AtomicU64>,
}

impl Launcher {
    pub fn new(shim_binary: ShimBinary) -> Launcher {
        Launcher {
            shim_binary,
            log_size_max: Arc::default(),
        }
    }

    /// Monitors drop output beyond `bytes` of log until it is rotated
    /// (0: no cap).
    pub fn with_log_size_max(self, bytes: u64) -> Launcher {
        self.set_log_size_max(bytes);
        self
    }

    /// [`Self::with_log_size_max`] for this launcher and all its clones.
    pub fn set_log_size_max(&self, bytes: u64) {
        self.log_size_max.store(bytes, Ordering::Relaxed);
    }

    /// The `crust-shim` binary the config names, else the one next to
    /// this executable: copied into a sealed memfd that every monitor runs
    /// from (CVE-2019-5736: no container process is ever backed by the
    /// host file). Fails where the kernel cannot give one: running
    /// monitors from the host file instead would expose it, so there is no
    /// fallback.
    pub fn from_config(config: &Config) -> Result<Launcher, crust_shim_protocol::Error> {
        let path = config.shim_binary.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("crust-shim")))
                .unwrap_or_else(|| PathBuf::from("/usr/local/bin/crust-shim"))
        });
        let (shim_binary, version) = ShimBinary::seal(&path)?;
        tracing::info!(
            binary = %path.display(),
            %version,
            size = shim_binary.size(),
            exec_bits_sealed = shim_binary.exec_bits_sealed(),
            "monitors run from a sealed in-memory copy of the monitor binary"
        );
        Ok(Launcher::new(shim_binary).with_log_size_max(config.log_size_max))
    }

    /// Writes the bundle and spawns the monitor; returns once the
    /// container is created (not started).
    pub async fn create(&self, launch: Launch) -> Result<Monitor, LaunchError> {
        let tty = launch
            .spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false);
        let opts = SpawnOptions {
            shim_binary: self.shim_binary.clone(),
            state_dir: launch.state_dir.clone(),
            config: ShimConfig {
                id: launch.id.clone(),
                bundle: launch.bundle.clone(),
                runtime: launch.runtime.clone(),
                log_path: launch.log_path.clone(),
                log_directory: launch.log_directory.clone(),
                log_size_max: self.log_size_max.load(Ordering::Relaxed),
                tty,
                stdin: launch.stdin,
                stdin_once: launch.stdin_once,
                restore: launch.restore.clone(),
            },
            timeout: launch.timeout,
        };
        blocking(move || write_bundle(&launch))
            .instrument(step!("bundle.write"))
            .await?;
        Monitor::spawn(opts)
            .instrument(step!("monitor.start"))
            .await
            .map_err(LaunchError::Monitor)
    }
}

fn write_bundle(l: &Launch) -> Result<(), LaunchError> {
    let bundle_err = |what: &str, p: &Path, e: &dyn std::fmt::Display| {
        LaunchError::Bundle(format!("{what} {}: {e}", p.display()))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&l.bundle)
        .map_err(|e| bundle_err("creating", &l.bundle, &e))?;
    let encode = |e: serde_json::Error| LaunchError::Bundle(format!("encoding the spec: {e}"));
    if l.keep_spec {
        let path = l.bundle.join("spec.json");
        let json = serde_json::to_vec_pretty(&l.spec).map_err(encode)?;
        std::fs::write(&path, json).map_err(|e| bundle_err("writing", &path, &e))?;
    }
    let mut for_runtime = l.spec.clone();
    if matches!(l.runtime, RuntimeConfig::Embedded { .. }) {
        // youki reads SCMP_CMP_MASKED_EQ operands swapped (and not
        // rshared): without this the default seccomp profile's clone
        // rule would allow new namespaces.
        embedded_compat(&mut for_runtime);
    }
    let path = l.bundle.join("config.json");
    let json = serde_json::to_vec(&for_runtime).map_err(encode)?;
    std::fs::write(&path, json).map_err(|e| bundle_err("writing", &path, &e))?;
    if let Some(path) = &l.log_path {
        create_log(path, l.log_directory.as_deref())?;
    }
    Ok(())
}

/// Creates the log file (and its dirs) as its monitor will open it: never
/// through a symlink below the pod's log directory, so that one planted
/// there is refused here, naming the path, before any monitor runs.
fn create_log(path: &Path, directory: Option<&Path>) -> Result<(), LaunchError> {
    use crust_linux::log_file::{LogFileError, LogModes, open_log_file};
    let (directory, rel) = match directory {
        Some(d) => (d, path.strip_prefix(d).ok()),
        None => (
            path.parent().unwrap_or(path),
            path.file_name().map(Path::new),
        ),
    };
    let Some(rel) = rel else {
        return Err(LaunchError::LogPath(format!(
            "config.log_path: {} is not below the pod's log directory",
            quote_os(path)
        )));
    };
    match open_log_file(directory, rel, LogModes::default()) {
        Ok(_) => Ok(()),
        Err(LogFileError::Refused { path, why } | LogFileError::Invalid { path, why }) => Err(
            LaunchError::LogPath(format!("config.log_path: {} {why}", quote_os(&path))),
        ),
        Err(e) => Err(LaunchError::Bundle(format!("creating the log: {e}"))),
    }
}

/// What the embedded runtime (youki's libcontainer 0.7) needs besides
/// [`crust_oci::libcontainer_compat`]: it loads seccomp early (before
/// capabilities are dropped) only when `noNewPrivileges` is absent, and
/// late otherwise, so `Some(false)` makes a filter without no_new_privs
/// fail to load ("failed to load seccomp context"). Absent and false mean
/// the same to the OCI spec. (Belongs in `libcontainer_compat`.) And on
/// cgroup v1, in a pod's shared PID namespace, the `cgroup` mount spelled
/// out ([`crust_oci::emulate_cgroup_v1_mount`]): libcontainer's own looks
/// up the init's namespace pid in the host's /proc and fails the create.
pub fn embedded_compat(spec: &mut Spec) {
    crust_oci::libcontainer_compat(spec);
    crust_oci::emulate_cgroup_v1_mount(spec, &crate::node::cgroup_v1_hierarchies());
    if let Some(p) = spec.process_mut()
        && p.no_new_privileges() == Some(false)
    {
        p.set_no_new_privileges(None);
    }
}
