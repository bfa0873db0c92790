//! Re-reading the config in a running daemon (SIGHUP, `crust reload`).
//!
//! The file is read and checked whole first: an invalid one changes
//! nothing. Then what a running daemon can change safely is applied, and
//! what needs a restart is named and left as it is:
//!
//! - applied: `log_level`, `log_format`, `runtimes` (handlers added,
//!   changed, removed; runc / crun looked up again), `registry.config_dir`,
//!   `image.*` (the signature policy files themselves are read at each
//!   pull), `cdi_spec_dirs`, `log_size_max`,
//!   `nri.plugin_registration_timeout`, `nri.plugin_request_timeout`;
//! - restart: `socket`, `root`, `run_dir`, `cgroup_driver`, `shim_binary`,
//!   `network.*`, `streaming.*`, `metrics.*`, `tracing.*` (the exporter
//!   and the log's layers are made once), `checkpoint.*` (criu's check is
//!   run once at start) and the rest of `nri.*` (sockets, listeners and
//!   state already in use).
//!
//! Flags win over the file at a reload as at start. Pods and containers
//! keep what they were created with: a container's record holds its
//! runtime, so one whose handler was removed keeps running and can be
//! stopped, exec'd and removed; new containers in its pod are refused
//! (FailedPrecondition), as are new pods with that handler
//! (InvalidArgument), as CRI-O does once its runtime table is replaced.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use crate::config::{Config, ConfigError, ConfigSource, LoadedConfig, config_keys};
use crate::daemon::{Daemon, pull_progress_timeout};
use crate::handlers::Handlers;
use crate::logging::LogControl;
use crate::pods::ListFilter;

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// The config file read.
    pub path: String,
    /// Keys whose new values are in force (and `runtimes.<name>` of
    /// handlers that appeared, changed or went with their binary).
    pub applied: Vec<String>,
    /// Keys the file changed that need a restart: they keep their values.
    pub restart_required: Vec<String>,
    /// Keys the file changed (since the start or the last reload) that a
    /// command-line flag sets: the flag wins.
    pub overridden_by_flags: Vec<String>,
    /// What an operator should know (a handler removed while pods use it,
    /// a handler's binary not found).
    pub warnings: Vec<String>,
}

/// Reloads the daemon's config; one reload at a time.
pub struct Reloader {
    source: ConfigSource,
    log: LogControl,
    /// The file's own values (without the flags) as last read: which of
    /// them a reload changed.
    last_file: tokio::sync::Mutex<BTreeMap<String, String>>,
}

impl Reloader {
    /// `file`: the file's own values as the daemon read them at start.
    pub fn new(source: ConfigSource, file: &Config, log: LogControl) -> Reloader {
        Reloader {
            source,
            log,
            last_file: tokio::sync::Mutex::new(config_keys(file)),
        }
    }

    /// Reads the config again and applies it to `daemon`; an invalid file
    /// is the error and changes nothing. Counted in the metrics either way.
    pub async fn reload(&self, daemon: &Daemon) -> Result<ReloadReport, ConfigError> {
        // Held throughout: one reload at a time.
        let mut last_file = self.last_file.lock().await;
        let result = self.reload_locked(daemon, &mut last_file).await;
        daemon.metrics.config_reload(result.is_ok());
        match &result {
            Ok(r) => {
                info!(
                    path = %r.path,
                    applied = ?r.applied,
                    "config reloaded"
                );
                if !r.restart_required.is_empty() {
                    warn!(
                        keys = ?r.restart_required,
                        "config reload: these keys take effect only at a restart; \
                         they keep their values until then"
                    );
                }
                if !r.overridden_by_flags.is_empty() {
                    warn!(
                        keys = ?r.overridden_by_flags,
                        "config reload: command-line flags set these keys; the file's values \
                         are not used"
                    );
                }
                for w in &r.warnings {
                    warn!("config reload: {w}");
                }
            }
            Err(e) => warn!("config reload failed, nothing changed: {e}"),
        }
        result
    }

    async fn reload_locked(
        &self,
        d: &Daemon,
        last_file: &mut BTreeMap<String, String>,
    ) -> Result<ReloadReport, ConfigError> {
        // One read of the file: what it says, and with the flags over it.
        let LoadedConfig {
            file,
            config: wanted,
        } = self.source.load()?;
        let old = d.live_config();
        let mut next = wanted.clone();
        keep_restart_only(&mut next, &old);

        let (old_keys, wanted_keys) = (config_keys(&old), config_keys(&wanted));
        let mut applied = changed(&old_keys, &config_keys(&next));
        let restart_required: Vec<String> = changed(&old_keys, &wanted_keys)
            .into_iter()
            .filter(|k| !applied.contains(k))
            .collect();
        let file_keys = config_keys(&file);
        let overridden_by_flags = self
            .source
            .overrides
            .keys()
            .into_iter()
            .filter(|k| file_keys.get(*k) != last_file.get(*k))
            .map(String::from)
            .collect();
        *last_file = file_keys;
        let mut warnings = Vec::new();

        if next.log_level != old.log_level
            && let Err(e) = self.log.set_configured(next.log_level)
        {
            warnings.push(format!("log_level: not changed: {e}"));
        }
        if next.log_format != old.log_format {
            self.log.set_format(next.log_format);
        }
        self.reload_handlers(d, &next, &mut applied, &mut warnings)
            .await;
        d.images.set_pull_settings(crust_image::PullSettings {
            registry_config_dir: Some(next.registry.config_dir.clone()),
            max_concurrent_downloads: next.image.max_concurrent_downloads,
            progress_timeout: pull_progress_timeout(&next.image),
            signature_policy: next.image.signature_policy_files(),
        });
        d.containers.set_cdi_spec_dirs(next.cdi_spec_dirs.clone());
        d.launcher.set_log_size_max(next.log_size_max);
        d.lifecycle.nri().set_timeouts(
            next.nri.plugin_registration_timeout,
            next.nri.plugin_request_timeout,
        );
        d.set_live_config(next);
        Ok(ReloadReport {
            path: self.source.path.display().to_string(),
            applied,
            restart_required,
            overridden_by_flags,
            warnings,
        })
    }

    /// Detects the handlers again (the config's, and runc / crun in PATH)
    /// and puts them in place; says what changed and what it means for
    /// pods that use a handler that went away.
    async fn reload_handlers(
        &self,
        d: &Daemon,
        next: &Config,
        applied: &mut Vec<String>,
        warnings: &mut Vec<String>,
    ) {
        let changes = d.handlers.replace(Handlers::detect(next).await);
        for name in changes
            .added
            .iter()
            .chain(&changes.changed)
            .chain(&changes.removed)
        {
            let key = format!("runtimes.{name}");
            if !applied.contains(&key) {
                applied.push(key);
            }
        }
        applied.sort();
        let names = d.handlers.names();
        for name in next.runtimes.keys() {
            if !names.contains(name) {
                warnings.push(format!(
                    "runtimes.{name}: its binary was not found: the handler is disabled"
                ));
            }
        }
        if changes.removed.is_empty() {
            return;
        }
        let pods = d.pods.list(&ListFilter::default());
        for name in &changes.removed {
            let using = pods.iter().filter(|p| &p.runtime_handler == name).count();
            if using > 0 {
                warnings.push(format!(
                    "runtime handler {name:?} was removed while {using} pod sandbox(es) use it: \
                     their containers keep running and can be stopped and removed; new \
                     containers in them are refused"
                ));
            }
        }
    }
}

/// Keys whose values differ between `a` and `b` (present in one only too).
fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

/// Gives `next` the values of `old` for every key a running daemon cannot
/// change: the sockets and listeners it serves, the dirs its state is in,
/// how it makes cgroups, the monitor binary it sealed at start, the CNI
/// runner and NRI's socket and pre-installed plugins.
fn keep_restart_only(next: &mut Config, old: &Config) {
    next.socket = old.socket.clone();
    next.root = old.root.clone();
    next.run_dir = old.run_dir.clone();
    next.cgroup_driver = old.cgroup_driver;
    next.shim_binary = old.shim_binary.clone();
    next.network = old.network.clone();
    next.streaming = old.streaming.clone();
    next.metrics = old.metrics.clone();
    next.checkpoint = old.checkpoint.clone();
    next.tracing = old.tracing.clone();
    let timeouts = (
        next.nri.plugin_registration_timeout,
        next.nri.plugin_request_timeout,
    );
    next.nri = old.nri.clone();
    (
        next.nri.plugin_registration_timeout,
        next.nri.plugin_request_timeout,
    ) = timeouts;
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::config::LogLevel;

    fn parse(text: &str) -> Config {
        Config::parse(text).unwrap()
    }

    #[test]
    fn restart_only_keys_keep_their_values_and_the_rest_changes() {
        let old = Config::default();
        let wanted = parse(
            "log_level = \"debug\"\nsocket = \"/x.sock\"\ncdi_spec_dirs = [\"/cdi\"]\n\
             [streaming]\nport = 1234\n[nri]\nplugin_request_timeout = \"9s\"\n\
             socket_path = \"/n.sock\"\n[runtimes.extra]\ntype = \"embedded\"\n\
             [image]\npull_progress_timeout = \"1m\"\n\
             [tracing]\nendpoint = \"http://127.0.0.1:4317\"\n",
        );
        let mut next = wanted.clone();
        keep_restart_only(&mut next, &old);
        let old_keys = config_keys(&old);
        let applied = changed(&old_keys, &config_keys(&next));
        assert_eq!(
            applied,
            [
                "cdi_spec_dirs",
                "image.pull_progress_timeout",
                "log_level",
                "nri.plugin_request_timeout",
                "runtimes.extra",
            ]
        );
        let all = changed(&old_keys, &config_keys(&wanted));
        let restart: Vec<_> = all.iter().filter(|k| !applied.contains(k)).collect();
        assert_eq!(
            restart,
            [
                "nri.socket_path",
                "socket",
                "streaming.port",
                "tracing.endpoint"
            ]
        );
        assert_eq!(next.socket, PathBuf::from("/run/crust/crust.sock"));
        assert_eq!(next.log_level, LogLevel::Debug);
        assert_eq!(next.nri.plugin_request_timeout, Duration::from_secs(9));
        assert_eq!(next.nri.socket_path, old.nri.socket_path);
    }

    /// Every key of the config is either applied or kept (a new key is
    /// kept unless `keep_restart_only` lets it through, which it does
    /// unless listed there): a reload of the same config changes nothing.
    #[test]
    fn an_unchanged_file_changes_nothing() {
        let c = parse("[runtimes.extra]\ntype = \"embedded\"\n");
        let mut next = c.clone();
        keep_restart_only(&mut next, &c);
        assert_eq!(next, c);
        assert!(changed(&config_keys(&c), &config_keys(&next)).is_empty());
    }

    #[test]
    fn a_handlers_table_is_one_key() {
        let keys = config_keys(&parse(
            "[runtimes.a]\ntype = \"cli\"\npath = \"/bin/a\"\n[runtimes.b]\ntype = \"embedded\"\n",
        ));
        assert!(keys.contains_key("runtimes.a") && keys.contains_key("runtimes.b"));
        assert!(
            !keys.keys().any(|k| k.starts_with("runtimes.a.")),
            "{keys:?}"
        );
        assert!(keys.contains_key("nri.plugin_request_timeout"), "{keys:?}");
    }
}
