//! `crust status`: what the running daemon runs with and holds, through
//! crust's admin API (`crust.admin.v1.Daemon/Status`).

use clap::Args;
use crust_api::admin::v1::StatusRequest;
use crust_api::admin::v1::daemon_client::DaemonClient;

use super::{DaemonSocket, block_on, connect};

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    daemon: DaemonSocket,
    /// Print the effective configuration (TOML) too.
    #[arg(long)]
    config: bool,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    block_on(async move {
        let mut client = DaemonClient::new(connect(&args.daemon.socket).await?);
        let s = client.status(StatusRequest {}).await?.into_inner();
        print!("{}", render(&s, args.config));
        Ok(())
    })
}

fn counts(m: &std::collections::HashMap<String, u64>, order: &[&str]) -> String {
    let total: u64 = m.values().sum();
    let parts: Vec<String> = order
        .iter()
        .map(|k| format!("{} {k}", m.get(*k).copied().unwrap_or(0)))
        .collect();
    format!("{total} ({})", parts.join(", "))
}

fn render(s: &crust_api::admin::v1::StatusResponse, with_config: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let na = |v: &str| {
        if v.is_empty() {
            "off".to_string()
        } else {
            v.to_string()
        }
    };
    let _ = writeln!(out, "version:        {}", s.version);
    let _ = writeln!(out, "pid:            {}", s.pid);
    let _ = writeln!(out, "health:         {}", s.health);
    let _ = writeln!(out, "socket:         {}", s.socket);
    let _ = writeln!(out, "streaming:      {}", s.streaming_url);
    let _ = writeln!(out, "metrics:        {}", na(&s.metrics_address));
    let _ = writeln!(
        out,
        "cgroups:        {} driver, {}",
        s.cgroup_driver, s.cgroup_version
    );
    if let Some(l) = &s.log_level {
        let _ = write!(out, "log level:      {}", l.level);
        if l.seconds_left > 0 {
            let _ = write!(
                out,
                " for {}s more, then {}",
                l.seconds_left, l.configured_level
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "pod sandboxes:  {}",
        counts(&s.pods, &["ready", "notready"])
    );
    let _ = writeln!(
        out,
        "containers:     {}",
        counts(&s.containers, &["running", "created", "exited"])
    );
    if !s.checkpoint.is_empty() {
        let _ = writeln!(out, "checkpoint:     {}", s.checkpoint);
    }
    let _ = writeln!(out, "handlers:");
    for h in &s.handlers {
        let name = if h.name.is_empty() {
            "\"\" (default)"
        } else {
            &h.name
        };
        let _ = write!(out, "  {name}: {}", h.kind);
        if !h.path.is_empty() {
            let _ = write!(out, " {}", h.path);
        }
        if !h.features.is_empty() {
            let _ = write!(out, " [{}]", h.features.join(", "));
        }
        out.push('\n');
    }
    if with_config {
        let _ = writeln!(out, "config:");
        for line in s.config_toml.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}
