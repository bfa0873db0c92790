//! `crust log-level [LEVEL] [--for DURATION]`: show or change the running
//! daemon's log level (changing it is for root only; a timed change
//! reverts by itself).

use anyhow::Context;
use clap::Args;
use crust_api::admin::v1::daemon_client::DaemonClient;
use crust_api::admin::v1::{GetLogLevelRequest, LogLevel, SetLogLevelRequest};

use super::{DaemonSocket, block_on, connect};

#[derive(Args)]
pub struct LogLevelArgs {
    #[command(flatten)]
    daemon: DaemonSocket,
    /// error, warn, info, debug or trace; none: show the current level.
    level: Option<String>,
    /// Go back to the configured level after this long (30s, 10m, 1h30m).
    #[arg(long = "for", value_name = "DURATION", requires = "level")]
    duration: Option<String>,
}

pub fn run(args: LogLevelArgs) -> anyhow::Result<()> {
    let duration = args
        .duration
        .as_deref()
        .map(crate::logging::parse_duration)
        .transpose()
        .map_err(anyhow::Error::msg)
        .context("--for")?;
    block_on(async move {
        let mut client = DaemonClient::new(connect(&args.daemon.socket).await?);
        let state = match args.level {
            None => client.get_log_level(GetLogLevelRequest {}).await?,
            Some(level) => {
                client
                    .set_log_level(SetLogLevelRequest {
                        level,
                        duration_seconds: duration.map_or(0, |d| d.as_secs()),
                    })
                    .await?
            }
        };
        println!("{}", describe(&state.into_inner()));
        Ok(())
    })
}

fn describe(l: &LogLevel) -> String {
    if l.seconds_left > 0 {
        format!(
            "{} (for {}s more, then {})",
            l.level, l.seconds_left, l.configured_level
        )
    } else {
        l.level.clone()
    }
}
