//! Timed scrapes of a daemon's Prometheus endpoint.

use std::time::Instant;

use anyhow::Context;

use crate::procfs::cpu_secs;
use crate::stats::{self, Report};
use crate::target::Target;

/// `scrapes` timed GETs of the target's /metrics while `pods` pods with a
/// running container each exist: latency, response size, and the daemon's
/// CPU time per scrape (from /proc, so it includes whatever else the daemon
/// did meanwhile: nothing, as the bench waits).
pub async fn scrape(
    report: &mut Report,
    t: &Target,
    url: &str,
    pods: usize,
    scrapes: usize,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let get = |http: reqwest::Client| async move {
        let r = http
            .get(url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        anyhow::ensure!(r.status().is_success(), "GET {url}: {}", r.status());
        anyhow::Ok(r.bytes().await?.len())
    };
    for _ in 0..5 {
        get(http.clone()).await?;
    }
    let cpu_before = t.pid.and_then(cpu_secs);
    let mut samples = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let start = Instant::now();
        bytes = get(http.clone()).await?;
        samples.push(start.elapsed());
    }
    let cpu_after = t.pid.and_then(cpu_secs);
    report.results.push(stats::summarize(
        &format!("metrics scrape, {pods} pods"),
        &t.name,
        samples,
    ));
    report.figure(
        &format!("metrics scrape size, {pods} pods"),
        &t.name,
        bytes as f64 / 1024.0,
        "KiB",
    );
    if let (Some(a), Some(b)) = (cpu_before, cpu_after) {
        report.figure(
            &format!("metrics scrape cpu, {pods} pods"),
            &t.name,
            (b - a) * 1e3 / scrapes as f64,
            "ms",
        );
    }
    Ok(())
}
