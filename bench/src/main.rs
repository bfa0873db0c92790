//! `crust-bench`: latency, throughput and footprint of a CRI endpoint, and
//! the ratio against a second endpoint (`--vs`), measured in alternating
//! rounds so machine drift hits both alike.
//!
//! Everything the bench creates (pods, their containers, images it pulled)
//! is removed through the CRI API at the end, also after an error or
//! Ctrl-C / SIGTERM.
//!
//! Modules: `cli` (flags), `fixtures` (pod and container configs, names),
//! `client` (the CRI calls, tracked in `tracker`), `target` (an endpoint
//! under test), `measure` (timed operations, alternating rounds),
//! `scenarios` (one module per scenario), `procfs` (memory, CPU, process
//! tree), `stats` (the report), `cleanup`, `push` (the bench's images).

mod cleanup;
mod cli;
mod client;
mod fixtures;
mod measure;
mod procfs;
mod progress;
mod push;
mod scenarios;
mod stats;
mod target;
mod tracker;

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use cli::{Cli, Command};
use fixtures::Fixtures;
use stats::Report;
use target::Target;

async fn push_test_image(registry: &str) -> anyhow::Result<()> {
    let img = push::busybox_image()?;
    push::pusher(registry)
        .try_image("crust-bench/busybox", "latest", &img)
        .await?;
    println!("{registry}/crust-bench/busybox:latest");
    Ok(())
}

/// `crust-bench otlp-receiver`: the endpoint on the first line of stdout,
/// then, at SIGTERM or SIGINT, the count of spans received.
async fn otlp_receiver() -> anyhow::Result<()> {
    use std::io::Write;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let receiver = crust_test_support::otlp::Receiver::start();
    println!("{}", receiver.endpoint());
    std::io::stdout().flush()?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    println!("spans received: {}", receiver.spans().len());
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Some(Command::PushTestImage { registry }) => return push_test_image(registry).await,
        Some(Command::PushPauseImage { registry, binary }) => {
            let img = push::pause_image(binary)?;
            push::pusher(registry)
                .try_image("crust-bench/pause", "3.9", &img)
                .await?;
            println!("{registry}/crust-bench/pause:3.9");
            return Ok(());
        }
        Some(Command::OtlpReceiver) => return otlp_receiver().await,
        None => {}
    }
    let args = cli.args;
    let cgroup_parent = args
        .cgroup_parent
        .clone()
        .unwrap_or_else(|| format!("/crust-bench-{}", std::process::id()));
    let fixtures = Arc::new(Fixtures::new(cgroup_parent));
    anyhow::ensure!(
        args.iterations > 0 && args.rounds > 0 && args.lifecycle_iterations > 0,
        "iterations and rounds must be > 0"
    );
    let mut targets = vec![
        Target::connect(
            &args.endpoint,
            args.label.as_ref(),
            0,
            args.daemon_pid,
            fixtures.clone(),
        )
        .await?,
    ];
    targets[0].metrics_url = args.metrics_url.clone();
    if let Some(vs) = &args.vs {
        targets.push(
            Target::connect(
                vs,
                args.vs_label.as_ref(),
                1,
                args.vs_daemon_pid,
                fixtures.clone(),
            )
            .await?,
        );
        targets[1].metrics_url = args.vs_metrics_url.clone();
    }
    std::fs::create_dir_all(&fixtures.log_root)?;
    let mut report = Report::default();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        r = scenarios::run(&args, &mut targets, &mut report) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    cleanup::cleanup(&mut targets, &fixtures).await;
    if let [a, b] = &targets[..] {
        report.compute_ratios(&a.name, &b.name);
    }
    report.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    result
}
