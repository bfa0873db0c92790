//! The operator commands of the `crust` binary that talk to a running
//! daemon over its socket (the daemon holds the metadata store's lock, so
//! these never open the store themselves).

pub mod images;
pub mod log_level;
pub mod reload;
pub mod status;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Channel, Endpoint};

/// The running daemon's socket: the flag of every subcommand that talks
/// to it (global, so it may follow a subcommand's own subcommand).
#[derive(clap::Args)]
pub struct DaemonSocket {
    /// The daemon's socket.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "CRUST_SOCKET",
        default_value = "/run/crust/crust.sock"
    )]
    pub socket: PathBuf,
}

/// Connects to the daemon's socket.
pub async fn connect(socket: &Path) -> anyhow::Result<Channel> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .context("socket path")?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| {
            format!(
                "cannot connect to crust at {} (is the daemon running? --socket sets the path)",
                socket.display()
            )
        })
}

/// Runs a command's future on a small runtime of its own.
pub fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

/// A size as crictl prints it: decimal units, three significant digits.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes}B");
    }
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_like_crictl() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(999), "999B");
        assert_eq!(human_size(1_000), "1.00kB");
        assert_eq!(human_size(2_345_678), "2.35MB");
        assert_eq!(human_size(123_456_789), "123MB");
        assert_eq!(human_size(u64::MAX), "18.4EB");
    }
}
