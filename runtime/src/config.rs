//! The daemon's configuration: a TOML file (missing file = defaults),
//! overridden by command-line flags.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const DEFAULT_CONFIG_PATH: &str = "/etc/crust/config.toml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The CRI gRPC socket kubelet and crictl connect to.
    pub socket: PathBuf,
    /// Persistent state: content store, unpacked layers, metadata database.
    pub root: PathBuf,
    /// Volatile state (lost on reboot): sockets, pinned namespaces, bundles.
    pub run_dir: PathBuf,
    pub log_level: LogLevel,
    pub log_format: LogFormat,
    /// Which cgroup manager creates pod and container cgroups; reported to
    /// kubelet through the RuntimeConfig RPC so both agree.
    pub cgroup_driver: CgroupDriver,
    pub network: NetworkConfig,
    pub registry: RegistryConfig,
    /// Runtime handlers by name (RunPodSandbox's `runtime_handler`). Built
    /// in: `""` (the default) = embedded, and `runc` / `crun` = their CLI
    /// when found in PATH; entries here add to or replace those.
    pub runtimes: std::collections::BTreeMap<String, RuntimeHandlerConfig>,
    /// The `crust-shim` monitor binary; default: next to the `crust` binary.
    pub shim_binary: Option<PathBuf>,
    /// The exec / attach / port-forward streaming server.
    pub streaming: StreamingSection,
    /// The Prometheus metrics and health endpoint (off unless an address
    /// is given).
    pub metrics: MetricsSection,
    /// NRI (Node Resource Interface) plugins: the socket they connect to,
    /// the pre-installed ones crust starts itself, timeouts.
    pub nri: crust_nri::Config,
    /// CDI spec file dirs, lowest priority first (a device defined again in
    /// a later dir wins).
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// The most bytes a container's log file may grow to (CRI-O's
    /// `log_size_max`): beyond it the container's monitor drops output,
    /// whole lines, until kubelet rotates the file (ReopenContainerLog),
    /// and says so once in the log. 0 (the default): no cap; otherwise at
    /// least 8192. Set it well above kubelet's `containerLogMaxSize`
    /// (e.g. 4 times): kubelet checks sizes only every 10 s.
    pub log_size_max: u64,
    /// CheckpointContainer with CRIU.
    pub checkpoint: CheckpointConfig,
    /// Image pulls: how long a download may stall, how many layers at once.
    pub image: ImageSection,
    /// OpenTelemetry tracing of CRI calls (off unless an endpoint is given).
    pub tracing: crate::otel::TracingSection,
}

/// The `[checkpoint]` table (here, not in `checkpoint`: the config
/// depends on no module that depends on it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Off: CheckpointContainer answers FailedPrecondition without asking
    /// criu. On (the default): checkpointing works where `criu check`
    /// passes.
    pub enable: bool,
    /// The criu binary (absolute, or a name looked up in the usual
    /// sbin/bin dirs).
    pub criu_path: PathBuf,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            enable: true,
            criu_path: PathBuf::from("criu"),
        }
    }
}

/// The `[image]` table: how images are pulled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageSection {
    /// A registry request that receives nothing for this long (no answer
    /// yet, or no byte of a blob) is given up, as containerd's
    /// `image_pull_progress_timeout`; Go duration syntax, "0" = never.
    #[serde(with = "duration_text")]
    pub pull_progress_timeout: std::time::Duration,
    /// Layers downloaded at once per pull.
    pub max_concurrent_downloads: usize,
    /// The node's image signature policy (containers-policy.json format:
    /// `insecureAcceptAnything`, `reject`, `sigstoreSigned` with public
    /// keys), read at each pull; absent: images are not checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature_policy: Option<PathBuf>,
    /// Policies per pod namespace: `<dir>/<namespace>.json`, used instead
    /// of `signature_policy` for pulls of pods in that namespace (CRI-O's
    /// `signature_policy_dir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature_policy_dir: Option<PathBuf>,
}

impl ImageSection {
    /// The policy files as the image service takes them.
    pub fn signature_policy_files(&self) -> crust_image::signature::PolicyFiles {
        crust_image::signature::PolicyFiles {
            policy: self.signature_policy.clone(),
            dir: self.signature_policy_dir.clone(),
        }
    }
}

impl Default for ImageSection {
    fn default() -> Self {
        ImageSection {
            pull_progress_timeout: crust_image::DEFAULT_PULL_PROGRESS_TIMEOUT,
            max_concurrent_downloads: crust_image::DEFAULT_MAX_CONCURRENT_DOWNLOADS,
            signature_policy: None,
            signature_policy_dir: None,
        }
    }
}

/// The `[image]` keys that are absent by default, as `crust config
/// default` shows them.
const OPTIONAL_IMAGE_KEYS: &str = "\
# signature_policy = \"/etc/crust/policy.json\"   # containers-policy.json; absent: images are not checked
# signature_policy_dir = \"/etc/crust/policies\"  # <dir>/<pod namespace>.json, per namespace
";

/// The most `image.max_concurrent_downloads`: more connections per pull
/// than this only burden the registry.
pub const MAX_CONCURRENT_DOWNLOADS: usize = 64;

/// Durations in Go syntax ("5m", "1m30s", "500ms", "0"), as containerd's
/// config writes them; printed in the largest whole unit.
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        let secs = d.as_secs();
        let text = if d.subsec_nanos() != 0 || secs == 0 {
            crust_nri::config::format_go_duration(*d)
        } else if secs.is_multiple_of(3600) {
            format!("{}h", secs / 3600)
        } else if secs.is_multiple_of(60) {
            format!("{}m", secs / 60)
        } else {
            format!("{secs}s")
        };
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        crust_nri::config::parse_go_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// The smallest `log_size_max` (a few lines and the notice).
pub const MIN_LOG_SIZE_MAX: u64 = 8192;

/// The `[metrics]` table: where `GET /metrics` (Prometheus / OpenMetrics
/// text) and `GET /healthz` are served over plain HTTP.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// `IP:PORT` to listen on (port 0 = a free one); absent: no endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl MetricsSection {
    /// The listening address, checked; None when the endpoint is off.
    pub fn socket_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        let Some(text) = &self.address else {
            return Ok(None);
        };
        text.trim().parse().map(Some).map_err(|_| {
            ConfigError::Invalid(format!(
                "metrics.address must be IP:PORT (e.g. \"127.0.0.1:9090\"), got {:?}",
                text.chars().take(256).collect::<String>()
            ))
        })
    }
}

/// The `[streaming]` table: where the server behind the Exec, Attach and
/// PortForward URLs listens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamingSection {
    /// IP address to listen on (kubelet proxies to it; keep it loopback
    /// unless clients must reach it directly).
    pub address: String,
    /// TCP port; 0 picks a free one at start.
    pub port: u16,
    /// PEM certificate chain: serve https (needs `tls_key` too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
}

impl Default for StreamingSection {
    fn default() -> Self {
        StreamingSection {
            address: "127.0.0.1".into(),
            port: 0,
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl StreamingSection {
    /// The listening address, checked.
    pub fn socket_addr(&self) -> Result<std::net::SocketAddr, ConfigError> {
        let ip: std::net::IpAddr = self.address.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "streaming.address must be an IP address, got {:?}",
                self.address
            ))
        })?;
        Ok(std::net::SocketAddr::new(ip, self.port))
    }
}

/// One `[runtimes.<name>]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeHandlerConfig {
    /// `embedded` (youki's libcontainer inside the monitor) or `cli` (an OCI
    /// runtime binary with runc's command line).
    #[serde(rename = "type")]
    pub kind: RuntimeKind,
    /// The binary of a `cli` runtime (absolute, or a name looked up in PATH).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// The runtime's state root (`--root`); default `<run_dir>/runtimes/<name>`.
    #[serde(default)]
    pub root: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    Embedded,
    Cli,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// Where CNI network configs (`.conf`, `.conflist`, `.json`) are read.
    pub cni_conf_dir: PathBuf,
    /// Where CNI plugin binaries are looked up, in order.
    pub cni_bin_dirs: Vec<PathBuf>,
    /// At start, write a default bridge network (`10-crust.conflist`:
    /// bridge + host-local + portmap + loopback on 10.88.0.0/16, or the pod
    /// CIDR from UpdateRuntimeConfig) into `cni_conf_dir` when that dir
    /// holds no network config, so a fresh node has pod networking.
    pub install_default_conflist: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// containerd-style `hosts.toml` directory: `<host>/hosts.toml` per
    /// registry (mirrors, plain http, CA, skip_verify).
    pub config_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: PathBuf::from("/run/crust/crust.sock"),
            root: PathBuf::from("/var/lib/crust"),
            run_dir: PathBuf::from("/run/crust"),
            log_level: LogLevel::Info,
            log_format: LogFormat::Text,
            cgroup_driver: CgroupDriver::Cgroupfs,
            network: NetworkConfig::default(),
            registry: RegistryConfig::default(),
            runtimes: Default::default(),
            shim_binary: None,
            streaming: StreamingSection::default(),
            metrics: MetricsSection::default(),
            nri: crust_nri::Config::default(),
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
            log_size_max: 0,
            checkpoint: Default::default(),
            image: ImageSection::default(),
            tracing: crate::otel::TracingSection::default(),
        }
    }
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            cni_conf_dir: PathBuf::from("/etc/cni/net.d"),
            cni_bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            install_default_conflist: false,
        }
    }
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            config_dir: PathBuf::from("/etc/crust/certs.d"),
        }
    }
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// The daemon's command-line flags that set config keys. They win over
/// the file, at start and at every reload.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub socket: Option<PathBuf>,
    pub root: Option<PathBuf>,
    pub run_dir: Option<PathBuf>,
    pub log_level: Option<LogLevel>,
    pub log_format: Option<LogFormat>,
    pub cgroup_driver: Option<CgroupDriver>,
    pub cni_conf_dir: Option<PathBuf>,
    pub cni_bin_dirs: Option<Vec<PathBuf>>,
    /// Only ever turns it on.
    pub install_default_conflist: bool,
    pub registry_config_dir: Option<PathBuf>,
    pub metrics_address: Option<String>,
    pub nri_socket: Option<PathBuf>,
}

impl Overrides {
    /// Puts the flags over `c`.
    pub fn apply(&self, c: &mut Config) {
        fn set<T: Clone>(flag: &Option<T>, field: &mut T) {
            if let Some(v) = flag {
                *field = v.clone();
            }
        }
        set(&self.socket, &mut c.socket);
        set(&self.root, &mut c.root);
        set(&self.run_dir, &mut c.run_dir);
        set(&self.log_level, &mut c.log_level);
        set(&self.log_format, &mut c.log_format);
        set(&self.cgroup_driver, &mut c.cgroup_driver);
        set(&self.cni_conf_dir, &mut c.network.cni_conf_dir);
        set(&self.cni_bin_dirs, &mut c.network.cni_bin_dirs);
        set(&self.registry_config_dir, &mut c.registry.config_dir);
        if let Some(a) = &self.metrics_address {
            c.metrics.address = Some(a.clone());
        }
        set(&self.nri_socket, &mut c.nri.socket_path);
        if self.install_default_conflist {
            c.network.install_default_conflist = true;
        }
    }

    /// The config keys (as `config_keys` names them) these flags set.
    pub fn keys(&self) -> Vec<&'static str> {
        [
            (self.socket.is_some(), "socket"),
            (self.root.is_some(), "root"),
            (self.run_dir.is_some(), "run_dir"),
            (self.log_level.is_some(), "log_level"),
            (self.log_format.is_some(), "log_format"),
            (self.cgroup_driver.is_some(), "cgroup_driver"),
            (self.cni_conf_dir.is_some(), "network.cni_conf_dir"),
            (self.cni_bin_dirs.is_some(), "network.cni_bin_dirs"),
            (
                self.install_default_conflist,
                "network.install_default_conflist",
            ),
            (self.registry_config_dir.is_some(), "registry.config_dir"),
            (self.metrics_address.is_some(), "metrics.address"),
            (self.nri_socket.is_some(), "nri.socket_path"),
        ]
        .into_iter()
        .filter_map(|(set, key)| set.then_some(key))
        .collect()
    }
}

/// Where the daemon's config comes from: the file, and the flags over it.
/// Read at start and again at every reload.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    /// Named with `--config`: it must exist (the default path may not).
    pub explicit: bool,
    pub overrides: Overrides,
}

/// One read of the config file: the file's own values, and the config to
/// run with (the flags over them, checked).
pub struct LoadedConfig {
    pub file: Config,
    pub config: Config,
}

impl ConfigSource {
    /// Reads the file once, puts the flags over it and checks the result.
    pub fn load(&self) -> Result<LoadedConfig, ConfigError> {
        let file = Config::load(&self.path, self.explicit)?;
        let mut config = file.clone();
        self.overrides.apply(&mut config);
        config.validate()?;
        Ok(LoadedConfig { file, config })
    }
}

/// A config's values by key (`log_level`, `network.cni_conf_dir`,
/// `runtimes.<name>`: a handler's table is one value), as TOML text: what
/// a reload compares.
pub fn config_keys(c: &Config) -> std::collections::BTreeMap<String, String> {
    fn walk(
        prefix: &str,
        table: &toml::Table,
        out: &mut std::collections::BTreeMap<String, String>,
    ) {
        for (k, v) in table {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                // Nested tables, except a handler's own, are walked.
                toml::Value::Table(t) if prefix != "runtimes" => walk(&key, t, out),
                v => {
                    out.insert(key, v.to_string());
                }
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    if let Ok(toml::Value::Table(t)) = toml::Value::try_from(c) {
        walk("", &t, &mut out);
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads `path`. A missing file means the defaults only when `path` is
    /// the default location; a config file named explicitly must exist.
    pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text).map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// The full default config as TOML, for `crust config default`.
    pub fn default_toml() -> String {
        let text =
            toml::to_string_pretty(&Config::default()).expect("the default config serializes");
        // Keys that are off unless set have no default value to print:
        // shown commented out, with an example, in their table.
        let mut out = String::with_capacity(text.len() + 256);
        let mut in_image = false;
        for line in text.lines() {
            if line.starts_with('[') {
                in_image = line == "[image]";
            }
            out.push_str(line);
            out.push('\n');
            if in_image && line.starts_with("max_concurrent_downloads") {
                out.push_str(OPTIONAL_IMAGE_KEYS);
            }
        }
        out
    }

    /// Checks what serde cannot: paths must be absolute, because the daemon
    /// resolves nothing relative to its working directory.
    /// Where containers' writable layers (overlayfs upper and work dirs)
    /// live.
    pub fn containers_dir(&self) -> PathBuf {
        self.root.join("containers")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let paths = [
            ("socket", &self.socket),
            ("root", &self.root),
            ("run_dir", &self.run_dir),
            ("network.cni_conf_dir", &self.network.cni_conf_dir),
            ("registry.config_dir", &self.registry.config_dir),
            ("nri.socket_path", &self.nri.socket_path),
            ("nri.plugin_path", &self.nri.plugin_path),
            ("nri.plugin_config_path", &self.nri.plugin_config_path),
        ];
        let bin_dirs = self
            .network
            .cni_bin_dirs
            .iter()
            .map(|p| ("network.cni_bin_dirs", p));
        let cdi_dirs = self.cdi_spec_dirs.iter().map(|p| ("cdi_spec_dirs", p));
        let policies = [
            ("image.signature_policy", &self.image.signature_policy),
            (
                "image.signature_policy_dir",
                &self.image.signature_policy_dir,
            ),
        ]
        .into_iter()
        .filter_map(|(k, p)| Some((k, p.as_ref()?)));
        for (key, path) in paths
            .into_iter()
            .chain(bin_dirs)
            .chain(cdi_dirs)
            .chain(policies)
        {
            if !path.is_absolute() {
                return Err(ConfigError::Invalid(format!(
                    "{key} must be an absolute path, got {:?}",
                    path.display().to_string()
                )));
            }
        }
        self.streaming.socket_addr()?;
        self.metrics.socket_addr()?;
        self.nri.validate().map_err(ConfigError::Invalid)?;
        match (&self.streaming.tls_cert, &self.streaming.tls_key) {
            (Some(c), Some(k)) => {
                for (key, p) in [("streaming.tls_cert", c), ("streaming.tls_key", k)] {
                    if !p.is_absolute() {
                        return Err(ConfigError::Invalid(format!(
                            "{key} must be an absolute path, got {:?}",
                            p.display().to_string()
                        )));
                    }
                }
            }
            (None, None) => {}
            _ => {
                return Err(ConfigError::Invalid(
                    "streaming.tls_cert and streaming.tls_key must be set together".into(),
                ));
            }
        }
        if self.log_size_max != 0 && self.log_size_max < MIN_LOG_SIZE_MAX {
            return Err(ConfigError::Invalid(format!(
                "log_size_max must be 0 (no cap) or at least {MIN_LOG_SIZE_MAX}, got {}",
                self.log_size_max
            )));
        }
        let downloads = self.image.max_concurrent_downloads;
        if !(1..=MAX_CONCURRENT_DOWNLOADS).contains(&downloads) {
            return Err(ConfigError::Invalid(format!(
                "image.max_concurrent_downloads must be 1 to {MAX_CONCURRENT_DOWNLOADS}, got \
                 {downloads}"
            )));
        }
        self.tracing.validate().map_err(ConfigError::Invalid)?;
        if self.socket.file_name().is_none() {
            return Err(ConfigError::Invalid(format!(
                "socket {} has no file name",
                self.socket.display()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md shows the defaults exactly as `crust config
    /// default` prints them (`make docs` writes them there) and describes
    /// every key in its table.
    #[test]
    fn the_configuration_doc_shows_the_defaults_and_every_key() {
        let doc = include_str!("../../docs/configuration.md");
        let begin = "<!-- crust config default: begin -->\n```toml\n";
        let end = "```\n<!-- crust config default: end -->";
        let i = doc.find(begin).expect("the begin marker") + begin.len();
        let j = doc.find(end).expect("the end marker");
        let defaults = Config::default_toml();
        assert_eq!(
            doc[i..j].trim_end(),
            defaults.trim_end(),
            "docs/configuration.md is stale: run `make docs`"
        );
        let described = &doc[j..];
        let value: toml::Value = toml::from_str(&defaults).unwrap();
        let mut missing = Vec::new();
        for (key, v) in value.as_table().unwrap() {
            let keys: Vec<String> = match v {
                toml::Value::Table(t) if key != "runtimes" => {
                    t.keys().map(|sub| format!("{key}.{sub}")).collect()
                }
                // Handlers are tables named by the operator.
                toml::Value::Table(_) => vec![format!("{key}.<name>")],
                _ => vec![key.clone()],
            };
            missing.extend(
                keys.into_iter()
                    .filter(|k| !described.contains(&format!("`{k}`"))),
            );
        }
        assert!(
            missing.is_empty(),
            "keys without a row in docs/configuration.md: {missing:?}"
        );
    }

    #[test]
    fn default_toml_round_trips() {
        let text = Config::default_toml();
        assert_eq!(Config::parse(&text).unwrap(), Config::default());
        assert!(
            text.contains("socket = \"/run/crust/crust.sock\""),
            "{text}"
        );
        assert!(text.contains("[network]"), "{text}");
    }

    #[test]
    fn empty_file_is_all_defaults_and_partial_files_merge() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        let c = Config::parse("log_level = \"debug\"\n[network]\ncni_conf_dir = \"/x\"\n").unwrap();
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.network.cni_conf_dir, PathBuf::from("/x"));
        assert_eq!(
            c.network.cni_bin_dirs,
            NetworkConfig::default().cni_bin_dirs
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors_naming_them() {
        let err = Config::parse("sokcet = \"/x\"").unwrap_err();
        assert!(err.contains("sokcet"), "{err}");
        let err = Config::parse("log_level = \"loud\"").unwrap_err();
        assert!(err.contains("loud"), "{err}");
        let err = Config::parse("cgroup_driver = 3").unwrap_err();
        assert!(err.contains("cgroup_driver"), "{err}");
    }

    #[test]
    fn relative_paths_are_rejected() {
        let c = Config {
            root: PathBuf::from("var/lib/crust"),
            ..Config::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("root"), "{err}");
        let mut c = Config::default();
        c.network.cni_bin_dirs.push(PathBuf::from("bin"));
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("cni_bin_dirs")
        );
    }

    #[test]
    fn streaming_section_is_checked() {
        let c = Config::parse("[streaming]\naddress = \"0.0.0.0\"\nport = 10010\n").unwrap();
        assert_eq!(
            c.streaming.socket_addr().unwrap(),
            "0.0.0.0:10010".parse().unwrap()
        );
        c.validate().unwrap();
        let c = Config::parse("[streaming]\naddress = \"localhost\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("streaming.address"), "{err}");
        let c = Config::parse("[streaming]\ntls_cert = \"/a.pem\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("tls_key"), "{err}");
        let c = Config::parse("[streaming]\ntls_cert = \"a.pem\"\ntls_key = \"/k.pem\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("streaming.tls_cert"), "{err}");
        assert!(Config::parse("[streaming]\nport = 70000\n").is_err());
    }

    #[test]
    fn metrics_section_is_off_by_default_and_checked() {
        assert_eq!(Config::default().metrics.socket_addr().unwrap(), None);
        let c = Config::parse("[metrics]\naddress = \"127.0.0.1:9090\"\n").unwrap();
        assert_eq!(
            c.metrics.socket_addr().unwrap(),
            Some("127.0.0.1:9090".parse().unwrap())
        );
        c.validate().unwrap();
        let c = Config::parse("[metrics]\naddress = \"localhost:9090\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("metrics.address"), "{err}");
        assert!(Config::parse("[metrics]\nport = 1\n").is_err());
    }

    #[test]
    fn nri_section_uses_containerd_names_and_is_checked() {
        let c = Config::default();
        assert!(c.nri.enable);
        assert_eq!(c.nri.socket_path, PathBuf::from("/var/run/nri/nri.sock"));
        let text = Config::default_toml();
        assert!(text.contains("[nri]"), "{text}");
        assert!(text.contains("plugin_request_timeout = \"2s\""), "{text}");
        let c = Config::parse(
            "[nri]\nenable = false\nsocket_path = \"/tmp/x/nri.sock\"\n\
             plugin_registration_timeout = \"1m\"\n",
        )
        .unwrap();
        assert!(!c.nri.enable);
        assert_eq!(
            c.nri.plugin_registration_timeout,
            std::time::Duration::from_secs(60)
        );
        c.validate().unwrap();
        let err = Config::parse("[nri]\nplugin_request_timeout = \"soon\"\n").unwrap_err();
        assert!(err.contains("soon"), "{err}");
        let err = Config::parse("[nri]\nsokcet_path = \"/x\"\n").unwrap_err();
        assert!(err.contains("sokcet_path"), "{err}");
        let c = Config::parse("[nri]\nsocket_path = \"nri.sock\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("nri.socket_path"), "{err}");
        let c = Config::parse("[nri]\nplugin_request_timeout = \"0s\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("plugin_request_timeout"), "{err}");
    }

    #[test]
    fn log_size_max_is_off_by_default_and_checked() {
        assert_eq!(Config::default().log_size_max, 0);
        assert!(Config::default_toml().contains("log_size_max = 0"));
        let c = Config::parse("log_size_max = 104857600\n").unwrap();
        assert_eq!(c.log_size_max, 100 << 20);
        c.validate().unwrap();
        let err = Config::parse("log_size_max = 100\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("log_size_max"), "{err}");
        assert!(Config::parse("log_size_max = -1\n").is_err());
    }

    #[test]
    fn image_section_has_containerds_defaults_and_is_checked() {
        let text = Config::default_toml();
        assert!(text.contains("[image]"), "{text}");
        assert!(text.contains("pull_progress_timeout = \"5m\""), "{text}");
        assert!(text.contains("max_concurrent_downloads = 3"), "{text}");
        let c = Config::parse("[image]\npull_progress_timeout = \"0\"\n").unwrap();
        assert!(c.image.pull_progress_timeout.is_zero());
        c.validate().unwrap();
        let c = Config::parse("[image]\npull_progress_timeout = \"1m30s\"\n").unwrap();
        assert_eq!(
            c.image.pull_progress_timeout,
            std::time::Duration::from_secs(90)
        );
        assert!(toml::to_string(&c).unwrap().contains("\"90s\""));
        let err = Config::parse("[image]\npull_progress_timeout = \"soon\"\n").unwrap_err();
        assert!(err.contains("soon"), "{err}");
        assert!(text.contains("\n# signature_policy = "), "{text}");
        assert!(text.contains("\n# signature_policy_dir = "), "{text}");
        let c = Config::parse(
            "[image]\nsignature_policy = \"/etc/crust/policy.json\"\n\
             signature_policy_dir = \"/etc/crust/policies\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        let files = c.image.signature_policy_files();
        assert_eq!(files.policy, Some(PathBuf::from("/etc/crust/policy.json")));
        assert_eq!(files.dir, Some(PathBuf::from("/etc/crust/policies")));
        for key in ["signature_policy", "signature_policy_dir"] {
            let c = Config::parse(&format!("[image]\n{key} = \"rel.json\"\n")).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(&format!("image.{key}")), "{err}");
        }
        for bad in [0, MAX_CONCURRENT_DOWNLOADS + 1] {
            let c = Config::parse(&format!("[image]\nmax_concurrent_downloads = {bad}\n")).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("image.max_concurrent_downloads"), "{err}");
        }
    }

    #[test]
    fn tracing_section_is_off_by_default_shown_and_checked() {
        let text = Config::default_toml();
        assert!(text.contains("[tracing]"), "{text}");
        assert!(text.contains("endpoint = \"\""), "{text}");
        assert!(text.contains("sampling_rate_per_million = 0"), "{text}");
        assert!(text.contains("service_name = \"crust\""), "{text}");
        assert!(!Config::default().tracing.enabled());
        let c = Config::parse(
            "[tracing]\nendpoint = \"http://127.0.0.1:4317\"\nsampling_rate_per_million = 1000000\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c.tracing.enabled());
        let c = Config::parse("[tracing]\nendpoint = \"https://x:4317\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("tracing.endpoint"), "{err}");
        let err = Config::parse("[tracing]\nendpiont = \"http://x:1\"\n").unwrap_err();
        assert!(err.contains("endpiont"), "{err}");
    }

    #[test]
    fn flags_win_over_the_file_and_name_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "log_level = \"warn\"\nroot = \"/file-root\"\n").unwrap();
        let source = ConfigSource {
            path: path.clone(),
            explicit: true,
            overrides: Overrides {
                log_level: Some(LogLevel::Debug),
                ..Overrides::default()
            },
        };
        let loaded = source.load().unwrap();
        let c = &loaded.config;
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.root, PathBuf::from("/file-root"));
        assert_eq!(loaded.file.log_level, LogLevel::Warn);
        assert_eq!(source.overrides.keys(), ["log_level"]);
        std::fs::write(&path, "root = \"relative\"\n").unwrap();
        assert!(source.load().err().unwrap().to_string().contains("root"));
    }

    #[test]
    fn missing_default_file_is_defaults_but_missing_explicit_file_is_an_error() {
        let missing = Path::new("/nonexistent/crust.toml");
        assert_eq!(Config::load(missing, false).unwrap(), Config::default());
        let err = Config::load(missing, true).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/crust.toml"), "{err}");
    }
}
