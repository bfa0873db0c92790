//! `crust-bench`: latency of CRI calls against any endpoint, and the ratio
//! against a second endpoint (`--vs`) measured in alternating rounds so
//! machine drift hits both alike.
//!
//! Scenarios so far cover the RPCs crust serves today; the pod, container,
//! image and footprint scenarios of the benchmarks issue come as those RPCs
//! land.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use crust_api::v1;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
#[command(name = "crust-bench", about = "Benchmark a CRI endpoint")]
struct Args {
    /// CRI endpoint under test (unix:///path or a path).
    #[arg(long, default_value = "unix:///run/crust/crust.sock")]
    endpoint: String,
    /// A second endpoint to compare against (e.g. containerd's socket).
    #[arg(long)]
    vs: Option<String>,
    /// Measured iterations per scenario and endpoint.
    #[arg(long, default_value_t = 1000)]
    iterations: usize,
    /// Unmeasured warm-up iterations.
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Rounds the iterations are split into, alternating endpoints.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Scenarios to run (default: all).
    #[arg(long, value_enum)]
    scenario: Vec<Scenario>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// RuntimeService.Version
    Version,
    /// RuntimeService.Status (verbose=false), what kubelet polls
    Status,
}

#[derive(Debug, Serialize)]
struct Summary {
    scenario: Scenario,
    endpoint: String,
    iterations: usize,
    median_us: f64,
    p90_us: f64,
    p99_us: f64,
    max_us: f64,
}

#[derive(Serialize)]
struct Report {
    results: Vec<Summary>,
    ratios: Vec<Ratio>,
}

#[derive(Serialize)]
struct Ratio {
    scenario: Scenario,
    median_a_over_b: f64,
    p99_a_over_b: f64,
}

struct Target {
    name: String,
    client: v1::runtime_service_client::RuntimeServiceClient<Channel>,
}

async fn connect(endpoint: &str) -> anyhow::Result<Target> {
    let uri = if endpoint.starts_with("unix:") {
        endpoint.to_string()
    } else {
        format!("unix://{endpoint}")
    };
    let channel = Endpoint::from_shared(uri.clone())?
        .connect()
        .await
        .with_context(|| format!("connecting to {uri}"))?;
    Ok(Target {
        name: endpoint.to_string(),
        client: v1::runtime_service_client::RuntimeServiceClient::new(channel),
    })
}

async fn once(target: &mut Target, scenario: Scenario) -> anyhow::Result<Duration> {
    let start = Instant::now();
    match scenario {
        Scenario::Version => {
            target.client.version(v1::VersionRequest::default()).await?;
        }
        Scenario::Status => {
            target
                .client
                .status(v1::StatusRequest { verbose: false })
                .await?;
        }
    }
    Ok(start.elapsed())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx].as_secs_f64() * 1e6
}

fn summarize(scenario: Scenario, endpoint: &str, mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    Summary {
        scenario,
        endpoint: endpoint.to_string(),
        iterations: samples.len(),
        median_us: percentile(&samples, 0.5),
        p90_us: percentile(&samples, 0.9),
        p99_us: percentile(&samples, 0.99),
        max_us: percentile(&samples, 1.0),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.iterations > 0 && args.rounds > 0,
        "iterations and rounds must be > 0"
    );
    let mut targets = vec![connect(&args.endpoint).await?];
    if let Some(vs) = &args.vs {
        targets.push(connect(vs).await?);
    }
    let scenarios = if args.scenario.is_empty() {
        Scenario::value_variants().to_vec()
    } else {
        args.scenario.clone()
    };
    let per_round = args.iterations.div_ceil(args.rounds);
    let mut report = Report {
        results: Vec::new(),
        ratios: Vec::new(),
    };
    println!(
        "{:<10} {:<40} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "scenario", "endpoint", "n", "median", "p90", "p99", "max"
    );
    for scenario in scenarios {
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); targets.len()];
        for t in targets.iter_mut() {
            for _ in 0..args.warmup {
                once(t, scenario).await?;
            }
        }
        for _ in 0..args.rounds {
            for (i, t) in targets.iter_mut().enumerate() {
                for _ in 0..per_round {
                    if samples[i].len() < args.iterations {
                        samples[i].push(once(t, scenario).await?);
                    }
                }
            }
        }
        let sums: Vec<Summary> = targets
            .iter()
            .zip(samples)
            .map(|(t, s)| summarize(scenario, &t.name, s))
            .collect();
        for s in &sums {
            println!(
                "{:<10} {:<40} {:>8} {:>8.1}us {:>8.1}us {:>8.1}us {:>8.1}us",
                format!("{scenario:?}").to_lowercase(),
                s.endpoint,
                s.iterations,
                s.median_us,
                s.p90_us,
                s.p99_us,
                s.max_us
            );
        }
        if let [a, b] = &sums[..] {
            let r = Ratio {
                scenario,
                median_a_over_b: a.median_us / b.median_us,
                p99_a_over_b: a.p99_us / b.p99_us,
            };
            println!(
                "{:<10} {:<40} median A/B {:.2}, p99 A/B {:.2}",
                "", "ratio", r.median_a_over_b, r.p99_a_over_b
            );
            report.ratios.push(r);
        }
        report.results.extend(sums);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
