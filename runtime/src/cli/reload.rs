//! `crust reload`: the running daemon reads its config file again (as on
//! SIGHUP) and says what it applied, what needs a restart, and why an
//! invalid file changed nothing (root only).

use clap::Args;
use crust_api::admin::v1::daemon_client::DaemonClient;
use crust_api::admin::v1::{ReloadRequest, ReloadResponse};

use super::{DaemonSocket, block_on, connect};

#[derive(Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    daemon: DaemonSocket,
}

pub fn run(args: ReloadArgs) -> anyhow::Result<()> {
    block_on(async move {
        let mut client = DaemonClient::new(connect(&args.daemon.socket).await?);
        let answer = client
            .reload(ReloadRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("reload failed: {}", s.message()))?;
        print!("{}", describe(&answer.into_inner()));
        Ok(())
    })
}

fn describe(r: &ReloadResponse) -> String {
    let mut out = format!("reloaded {}\n", r.path);
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    out.push_str(&format!("applied: {}\n", list(&r.applied)));
    if !r.restart_required.is_empty() {
        out.push_str(&format!(
            "restart required (kept as they are until then): {}\n",
            list(&r.restart_required)
        ));
    }
    if !r.overridden_by_flags.is_empty() {
        out.push_str(&format!(
            "set by command-line flags (the file's values are not used): {}\n",
            list(&r.overridden_by_flags)
        ));
    }
    for w in &r.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_as_lines() {
        let r = ReloadResponse {
            path: "/etc/crust/config.toml".into(),
            applied: vec!["log_level".into(), "runtimes.kata".into()],
            restart_required: vec!["streaming.port".into()],
            overridden_by_flags: vec![],
            warnings: vec!["runtimes.x: its binary was not found".into()],
        };
        assert_eq!(
            describe(&r),
            "reloaded /etc/crust/config.toml\napplied: log_level, runtimes.kata\n\
             restart required (kept as they are until then): streaming.port\n\
             warning: runtimes.x: its binary was not found\n"
        );
        assert!(describe(&ReloadResponse::default()).contains("applied: none"));
    }
}
