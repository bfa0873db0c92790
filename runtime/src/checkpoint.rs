//! Checkpointing (CRI CheckpointContainer) with CRIU: whether it works on
//! this node, decided once per daemon by running `criu check`.

use std::path::PathBuf;
use std::time::Duration;

pub use crate::config::CheckpointConfig;

/// `criu check` probes the kernel (it forks, maps, ptraces); it takes well
/// under a second on a host and a few in an emulated VM.
const CHECK_TIMEOUT: Duration = Duration::from_secs(120);

/// The most bytes of criu's output a reason quotes.
const MAX_REASON: usize = 256;

/// Whether checkpointing works here, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available { criu: PathBuf, version: String },
    Unavailable(String),
}

impl Availability {
    /// Status's `info["checkpoint"]` (and `crust status`).
    pub fn status_info(&self) -> serde_json::Value {
        match self {
            Availability::Available { criu, version } => serde_json::json!({
                "available": true,
                "criu": criu,
                "criuVersion": version,
            }),
            Availability::Unavailable(why) => {
                serde_json::json!({"available": false, "reason": why})
            }
        }
    }

    /// One line for `crust status`.
    pub fn summary(&self) -> String {
        match self {
            Availability::Available { criu, version } => {
                format!("available (criu {version}, {})", criu.display())
            }
            Availability::Unavailable(why) => format!("unavailable: {why}"),
        }
    }
}

/// The node's checkpointing: the config and the cached verdict.
pub struct Checkpointing {
    config: CheckpointConfig,
    verdict: tokio::sync::OnceCell<Availability>,
}

impl Checkpointing {
    pub fn new(config: CheckpointConfig) -> Self {
        Checkpointing {
            config,
            verdict: tokio::sync::OnceCell::new(),
        }
    }

    /// The verdict, found out on the first call (concurrent callers wait
    /// for that one check) and kept for the daemon's lifetime: criu and the
    /// kernel do not change under a running daemon.
    pub async fn availability(&self) -> &Availability {
        self.verdict.get_or_init(|| probe(&self.config)).await
    }
}

async fn probe(config: &CheckpointConfig) -> Availability {
    if !config.enable {
        return Availability::Unavailable(
            "disabled in the config ([checkpoint] enable = false)".into(),
        );
    }
    let Some(criu) = crate::handlers::find_in_path(&config.criu_path) else {
        return Availability::Unavailable(format!(
            "criu is not installed (checkpoint.criu_path {} not found)",
            crust_quote::quote_os(config.criu_path.as_os_str())
        ));
    };
    let version = match run(&criu, &["--version"]).await {
        Ok((true, out)) => out
            .lines()
            .find_map(|l| l.trim().strip_prefix("Version:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default(),
        Ok((false, out)) | Err(out) => {
            return Availability::Unavailable(format!(
                "{} --version failed: {}",
                criu.display(),
                first_line(&out)
            ));
        }
    };
    match run(&criu, &["check"]).await {
        Ok((true, _)) => Availability::Available { criu, version },
        Ok((false, out)) | Err(out) => {
            Availability::Unavailable(format!("`criu check` failed: {}", first_line(&out)))
        }
    }
}

/// Runs criu; (success, stderr then stdout) or why it could not run.
async fn run(criu: &std::path::Path, args: &[&str]) -> Result<(bool, String), String> {
    let child = tokio::process::Command::new(criu)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(CHECK_TIMEOUT, child).await {
        Err(_) => Err(format!("timed out after {}s", CHECK_TIMEOUT.as_secs())),
        Ok(Err(e)) => Err(format!("cannot run {}: {e}", criu.display())),
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stdout));
            Ok((out.status.success(), text))
        }
    }
}

/// The first non-empty line, clipped: criu's first error names the cause
/// (the rest of its output follows from it).
fn first_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty());
    crust_quote::truncate(line.unwrap_or("no output"), MAX_REASON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn disabled_and_missing_are_unavailable_with_a_reason() {
        let off = Checkpointing::new(CheckpointConfig {
            enable: false,
            ..Default::default()
        });
        let Availability::Unavailable(why) = off.availability().await else {
            panic!("disabled yet available");
        };
        assert!(why.contains("disabled"), "{why}");

        let missing = Checkpointing::new(CheckpointConfig {
            enable: true,
            criu_path: "/nonexistent/criu".into(),
        });
        let Availability::Unavailable(why) = missing.availability().await else {
            panic!("missing yet available");
        };
        assert!(
            why.contains("not installed") && why.contains("/nonexistent/criu"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_failing_check_quotes_its_first_line_bounded() {
        // `false` stands in for a criu whose every command fails.
        let c = Checkpointing::new(CheckpointConfig {
            enable: true,
            criu_path: "false".into(),
        });
        let Availability::Unavailable(why) = c.availability().await else {
            panic!("false yet available");
        };
        assert!(why.contains("false --version failed: "), "{why}");
        assert!(first_line(&"x".repeat(5000)).len() <= MAX_REASON + 32);
        assert_eq!(first_line("\n  Error (vdso)\nmore"), "Error (vdso)");
    }
}
