//! The density scenario: how long --density-pods pods with a running
//! container each take to start and to remove; meanwhile, the cost of
//! scraping the daemon's /metrics (when it has one).

use std::time::Instant;

use super::fleet::{remove_pods, start_pods};
use super::scrape::scrape;
use crate::cli::Args;
use crate::stats::Report;
use crate::target::Target;

/// Starts, then removes, --density-pods pods per target,
/// --density-parallel at a time.
pub async fn density(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    let n = args.density_pods;
    let par = args.density_parallel.max(1);
    for t in targets.iter_mut() {
        let start = Instant::now();
        let pods = start_pods(t, n, par, false, "density").await?;
        report.figure(
            &format!("density {n} pods running"),
            &t.name,
            start.elapsed().as_secs_f64() * 1e3,
            "ms",
        );
        if let Some(url) = t.metrics_url.clone() {
            scrape(report, t, &url, n, args.scrapes).await?;
        }
        let start = Instant::now();
        remove_pods(t, pods, par).await?;
        report.figure(
            &format!("density {n} pods removed"),
            &t.name,
            start.elapsed().as_secs_f64() * 1e3,
            "ms",
        );
    }
    Ok(())
}
