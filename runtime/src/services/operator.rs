//! crust's admin service for operators (`crust.admin.v1.Daemon`): `crust
//! status`, `crust log-level` and `crust reload`. Changing the log level
//! and reloading the config are for root only, by the caller's SO_PEERCRED
//! credentials (the socket is 0660, so a group may reach it).

use std::time::{Duration, Instant, UNIX_EPOCH};

use crust_api::admin::v1::daemon_server::Daemon as DaemonService;
use crust_api::admin::v1::*;
use crust_shim_protocol::RuntimeConfig;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use super::admin::Admin;
use crate::config::{CgroupDriver, LogLevel as Level};
use crate::logging::LevelState;

/// The longest timed log level change (a week): a typo such as `10000h`
/// should not keep debug logs on for a year.
const MAX_LOG_LEVEL_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

#[tonic::async_trait]
impl DaemonService for Admin {
    async fn status(
        &self,
        _req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let d = &self.daemon;
        let ops = &self.ops;
        let counts = crate::introspect::counts(d);
        let config_toml = toml::to_string_pretty(&*d.live_config())
            .map_err(|e| Status::internal(format!("the effective config as TOML: {e}")))?;
        let handlers = d
            .handlers
            .names()
            .into_iter()
            .map(|name| {
                let (kind, path) = match d.handlers.get(&name) {
                    Some(RuntimeConfig::Cli { path, .. }) => ("cli", path.display().to_string()),
                    _ => ("embedded", String::new()),
                };
                // The same list as CRI Status's (HandlerFeatures::named).
                let features = d.handlers.features(&name).enabled();
                Handler {
                    name,
                    kind: kind.into(),
                    path,
                    features,
                }
            })
            .collect();
        let by_state =
            |v: &[(&'static str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        Ok(Response::new(StatusResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            config_toml,
            cgroup_driver: match d.config.cgroup_driver {
                CgroupDriver::Cgroupfs => "cgroupfs",
                CgroupDriver::Systemd => "systemd",
            }
            .into(),
            cgroup_version: match d.cgroup_hierarchy {
                crust_cgroups::Hierarchy::V1 => "v1",
                crust_cgroups::Hierarchy::Hybrid => "hybrid",
                crust_cgroups::Hierarchy::V2 => "v2",
            }
            .into(),
            handlers,
            checkpoint: d.checkpoint.availability().await.summary(),
            pods: by_state(&counts.pods),
            containers: by_state(&counts.containers),
            socket: d.config.socket.display().to_string(),
            streaming_url: d
                .streaming
                .get()
                .map(|s| s.base_url().to_string())
                .unwrap_or_default(),
            metrics_address: ops
                .metrics_address
                .map(|a| a.to_string())
                .unwrap_or_default(),
            health: match ops.health.check() {
                Ok(()) => ops.health.phase().as_str().to_string(),
                Err(why) => format!("unhealthy: {why}"),
            },
            log_level: Some(level_message(ops.log.state())),
            pid: std::process::id(),
            started_at: ops
                .started_at
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or_default(),
        }))
    }

    async fn get_log_level(
        &self,
        _req: Request<GetLogLevelRequest>,
    ) -> Result<Response<LogLevel>, Status> {
        Ok(Response::new(level_message(self.ops.log.state())))
    }

    async fn set_log_level(
        &self,
        req: Request<SetLogLevelRequest>,
    ) -> Result<Response<LogLevel>, Status> {
        require_root(&req, "changing the log level")?;
        let req = req.into_inner();
        let level = parse_level(&req.level)?;
        let duration = match req.duration_seconds {
            0 => None,
            s if Duration::from_secs(s) > MAX_LOG_LEVEL_DURATION => {
                return Err(Status::invalid_argument(format!(
                    "duration_seconds: {s} is more than a week ({} s)",
                    MAX_LOG_LEVEL_DURATION.as_secs()
                )));
            }
            s => Some(Duration::from_secs(s)),
        };
        let state = self
            .ops
            .log
            .set(level, duration)
            .map_err(|e| Status::internal(format!("changing the log level: {e}")))?;
        Ok(Response::new(level_message(state)))
    }

    async fn reload(
        &self,
        req: Request<ReloadRequest>,
    ) -> Result<Response<ReloadResponse>, Status> {
        require_root(&req, "reloading the config")?;
        let report = self.ops.reloader.reload(&self.daemon).await.map_err(|e| {
            // The parser's message quotes the file's line: bounded.
            Status::failed_precondition(format!(
                "{}; nothing was changed (the daemon keeps its config)",
                crust_quote::truncate(&e.to_string(), 2048)
            ))
        })?;
        Ok(Response::new(ReloadResponse {
            path: report.path,
            applied: report.applied,
            restart_required: report.restart_required,
            overridden_by_flags: report.overridden_by_flags,
            warnings: report.warnings,
        }))
    }
}

/// Only uid 0 (by the kernel's word on the connection) may do `what`.
fn require_root<T>(req: &Request<T>, what: &str) -> Result<(), Status> {
    let uid = req
        .extensions()
        .get::<UdsConnectInfo>()
        .and_then(|i| i.peer_cred)
        .map(|c| c.uid());
    match uid {
        Some(0) => Ok(()),
        Some(uid) => Err(Status::permission_denied(format!(
            "{what} is for root only (the caller is uid {uid})"
        ))),
        None => Err(Status::permission_denied(format!(
            "{what} is for root only (the caller's credentials are unknown)"
        ))),
    }
}

fn parse_level(text: &str) -> Result<Level, Status> {
    Ok(match text.trim().to_ascii_lowercase().as_str() {
        "error" => Level::Error,
        "warn" | "warning" => Level::Warn,
        "info" => Level::Info,
        "debug" => Level::Debug,
        "trace" => Level::Trace,
        _ => {
            return Err(Status::invalid_argument(format!(
                "level: {:?} is not one of error, warn, info, debug, trace",
                text.chars().take(256).collect::<String>()
            )));
        }
    })
}

fn level_message(s: LevelState) -> LogLevel {
    LogLevel {
        level: s.level.as_str().into(),
        configured_level: s.configured.as_str().into(),
        seconds_left: s
            .left(Instant::now())
            // Rounded up: "1 s left" until it is gone.
            .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_checked_and_named_in_errors() {
        assert_eq!(parse_level("DEBUG").unwrap(), Level::Debug);
        assert_eq!(parse_level(" warning ").unwrap(), Level::Warn);
        let e = parse_level("loud").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("level") && e.message().contains("loud"));
    }

    #[test]
    fn only_root_peers_may_change_the_level() {
        let req = Request::new(());
        assert_eq!(
            require_root(&req, "reloading").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
    }
}
