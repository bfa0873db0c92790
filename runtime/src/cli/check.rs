//! `crust check [--repair]`: what the node holds that nothing references
//! (see `crate::check`), through the running daemon
//! (`crust.admin.v1.Orphans/Check`) or, when none answers on the socket,
//! by itself on the root and run dir of the daemon's config (refused while
//! a daemon runs there). Exit status: 0 when nothing is left, 3 when
//! orphans are left (found and not repaired), 1 when the check failed.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use crust_api::admin::v1::orphans_client::OrphansClient;
use crust_api::admin::v1::{CheckRequest, CheckResponse};
use serde_json::json;

use super::{DaemonSocket, connect, human_size};
use crate::config::{CgroupDriver, Config, DEFAULT_CONFIG_PATH};

/// The exit status when orphans are left (a cron job or health check
/// tells it from a failed check, 1).
pub const ORPHANS_LEFT: i32 = 3;

/// The largest report taken from the daemon: gRPC's default of 4 MiB is
/// some 10000 orphans, which a node full of leftover blobs can have.
const MAX_REPORT_BYTES: usize = 256 << 20;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Args)]
pub struct CheckArgs {
    #[command(flatten)]
    daemon: DaemonSocket,
    /// Remove what is found (root only). Without it nothing changes.
    #[arg(long)]
    repair: bool,
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
    /// Never ask the daemon: check the root and run dir directly (refused
    /// while a daemon runs on them). Without it, only when no daemon
    /// answers on the socket.
    #[arg(long)]
    offline: bool,
    /// Without the daemon: its config file (as `crust daemon --config`).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Without the daemon: its `--root`.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Without the daemon: its `--run-dir`.
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Without the daemon: its `--cgroup-driver`.
    #[arg(long, value_name = "DRIVER")]
    cgroup_driver: Option<CgroupDriver>,
}

impl CheckArgs {
    fn config(&self) -> anyhow::Result<Config> {
        let explicit = self.config.is_some();
        let path = self
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
        let mut c = Config::load(&path, explicit)?;
        if let Some(r) = &self.root {
            c.root = r.clone();
        }
        if let Some(r) = &self.run_dir {
            c.run_dir = r.clone();
        }
        if let Some(d) = self.cgroup_driver {
            c.cgroup_driver = d;
        }
        c.validate()?;
        Ok(c)
    }
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let mut left = 0;
    // Multi-threaded as the daemon's: without a daemon, the check stops
    // systemd units from blocking threads as the daemon does.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let (response, by) = check(&args).await?;
        left = response.orphans.iter().filter(|o| !o.repaired).count();
        match args.output {
            Output::Table => print!("{}", table(&response, by)),
            Output::Json => println!("{:#}", as_json(&response, by)),
        }
        Ok::<(), anyhow::Error>(())
    })?;
    if left > 0 {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::process::exit(ORPHANS_LEFT);
    }
    Ok(())
}

/// The report, and who made it ("daemon" or "offline").
async fn check(args: &CheckArgs) -> anyhow::Result<(CheckResponse, &'static str)> {
    if !args.offline {
        match connect(&args.daemon.socket).await {
            Ok(channel) => {
                let response = OrphansClient::new(channel)
                    .max_decoding_message_size(MAX_REPORT_BYTES)
                    .check(CheckRequest {
                        repair: args.repair,
                    })
                    .await
                    .context("crust check through the daemon")?
                    .into_inner();
                return Ok((response, "daemon"));
            }
            // Not running (or not here): the check goes on without it,
            // refused if a daemon holds the run dir after all.
            Err(e) => eprintln!(
                "crust: no daemon answers at {} ({}): checking without one",
                args.daemon.socket.display(),
                e.root_cause()
            ),
        }
    }
    let config = args.config()?;
    let report = crate::check::offline(&config, args.repair)
        .await
        .with_context(|| {
            format!(
                "checking {} and {}",
                config.root.display(),
                config.run_dir.display()
            )
        })?;
    Ok((crate::services::check_response(&report), "offline"))
}

/// An ID as a table shows it: IDs and digests cut as crictl cuts them.
fn short(id: &str) -> String {
    let (prefix, hex) = id.split_once(':').unwrap_or(("", id));
    let is_hex = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    match (is_hex, prefix.is_empty()) {
        (true, true) => hex[..13].to_string(),
        (true, false) => format!("{prefix}:{}", &hex[..12]),
        _ => id.to_string(),
    }
}

/// Count and bytes.
type Tally = (u64, u64);

/// Count and bytes by kind: (kind, found, left).
fn by_kind(r: &CheckResponse) -> Vec<(String, Tally, Tally)> {
    let mut out: Vec<(String, Tally, Tally)> = Vec::new();
    for o in &r.orphans {
        let i = match out.iter().position(|(k, ..)| *k == o.kind) {
            Some(i) => i,
            None => {
                out.push((o.kind.clone(), (0, 0), (0, 0)));
                out.len() - 1
            }
        };
        let (_, found, left) = &mut out[i];
        *found = (found.0 + 1, found.1 + o.bytes);
        if !o.repaired {
            *left = (left.0 + 1, left.1 + o.bytes);
        }
    }
    out
}

fn table(r: &CheckResponse, by: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let checked = match by {
        "daemon" => "checked by the daemon",
        _ => "checked without a daemon",
    };
    let _ = writeln!(out, "{} and {} ({checked})", r.root, r.run_dir);
    if r.orphans.is_empty() {
        let _ = writeln!(out, "no orphans");
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<18} {:<20} {:>9}  {:<9} WHERE; WHY",
        "KIND", "ID", "BYTES", "STATUS"
    );
    for o in &r.orphans {
        let status = if o.repaired {
            "removed".to_string()
        } else if r.repair {
            "FAILED".to_string()
        } else {
            "found".to_string()
        };
        let mut why = o.detail.clone();
        if !o.repair_error.is_empty() {
            why = format!("{why}; not removed: {}", o.repair_error);
        }
        let where_ = if o.paths.is_empty() {
            String::new()
        } else {
            format!("{}; ", o.paths.join(", "))
        };
        let _ = writeln!(
            out,
            "{:<18} {:<20} {:>9}  {:<9} {where_}{why}",
            o.kind,
            short(&o.id),
            human_size(o.bytes),
            status
        );
    }
    let _ = writeln!(
        out,
        "\n{:<18} {:>6} {:>9} {:>6} {:>9}",
        "KIND", "FOUND", "BYTES", "LEFT", "BYTES"
    );
    let (mut total_found, mut total_left) = ((0, 0), (0, 0));
    for (kind, found, left) in by_kind(r) {
        let _ = writeln!(
            out,
            "{kind:<18} {:>6} {:>9} {:>6} {:>9}",
            found.0,
            human_size(found.1),
            left.0,
            human_size(left.1)
        );
        total_found = (total_found.0 + found.0, total_found.1 + found.1);
        total_left = (total_left.0 + left.0, total_left.1 + left.1);
    }
    let _ = writeln!(
        out,
        "{:<18} {:>6} {:>9} {:>6} {:>9}",
        "total",
        total_found.0,
        human_size(total_found.1),
        total_left.0,
        human_size(total_left.1)
    );
    if !r.repair && total_left.0 > 0 {
        let _ = writeln!(out, "\n`crust check --repair` removes them.");
    }
    out
}

fn as_json(r: &CheckResponse, by: &str) -> serde_json::Value {
    let orphans: Vec<serde_json::Value> = r
        .orphans
        .iter()
        .map(|o| {
            json!({
                "kind": o.kind,
                "id": o.id,
                "paths": o.paths,
                "bytes": o.bytes,
                "detail": o.detail,
                "repaired": o.repaired,
                "repair_error": o.repair_error,
            })
        })
        .collect();
    let summary: serde_json::Map<String, serde_json::Value> = by_kind(r)
        .into_iter()
        .map(|(kind, found, left)| {
            (
                kind,
                json!({"count": found.0, "bytes": found.1, "left": left.0, "bytes_left": left.1}),
            )
        })
        .collect();
    json!({
        "root": r.root,
        "run_dir": r.run_dir,
        "checked_by": by,
        "repair": r.repair,
        "orphans": orphans,
        "summary": summary,
        "left": r.orphans.iter().filter(|o| !o.repaired).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::admin::v1::Orphan;

    fn response(repaired: bool) -> CheckResponse {
        let orphan = |kind: &str, id: &str, bytes| Orphan {
            kind: kind.into(),
            id: id.into(),
            paths: vec![format!("/x/{id}")],
            bytes,
            detail: "no record".into(),
            repaired,
            repair_error: String::new(),
        };
        CheckResponse {
            orphans: vec![
                orphan("container_dirs", &"a".repeat(64), 8192),
                orphan("image_blobs", &format!("sha256:{}", "b".repeat(64)), 2000),
                orphan("image_blobs", &format!("sha256:{}", "c".repeat(64)), 3000),
            ],
            repair: repaired,
            root: "/var/lib/crust".into(),
            run_dir: "/run/crust".into(),
        }
    }

    #[test]
    fn tables_and_json_count_by_kind_what_is_found_and_left() {
        let t = table(&response(false), "offline");
        assert!(t.contains("checked without a daemon"), "{t}");
        assert!(t.contains("aaaaaaaaaaaaa "), "{t}");
        assert!(t.contains("sha256:bbbbbbbbbbbb "), "{t}");
        assert!(
            t.contains("image_blobs             2    5.00kB      2    5.00kB"),
            "{t}"
        );
        assert!(t.contains("crust check --repair"), "{t}");
        let j = as_json(&response(false), "daemon");
        assert_eq!(j["left"], 3);
        assert_eq!(j["summary"]["image_blobs"]["bytes"], 5000);
        assert_eq!(j["orphans"][0]["id"], "a".repeat(64));

        let t = table(&response(true), "daemon");
        assert!(t.contains("removed"), "{t}");
        assert!(!t.contains("crust check --repair"), "{t}");
        let j = as_json(&response(true), "daemon");
        assert_eq!(j["left"], 0);
        assert_eq!(j["summary"]["image_blobs"]["left"], 0);

        let empty = CheckResponse {
            root: "/r".into(),
            run_dir: "/d".into(),
            ..Default::default()
        };
        assert!(table(&empty, "daemon").contains("no orphans"));
    }

    #[test]
    fn ids_are_cut_like_crictl() {
        assert_eq!(short(&"a".repeat(64)), "a".repeat(13));
        assert_eq!(
            short(&format!("sha256:{}", "b".repeat(64))),
            format!("sha256:{}", "b".repeat(12))
        );
        assert_eq!(short("ab/vol0"), "ab/vol0");
        assert_eq!(short(".tmp-x"), ".tmp-x");
    }
}
