//! The scenarios, run in a fixed order: what each measures is in
//! [`Scenario`]'s documentation.

mod density;
mod fleet;
mod footprint;
mod images;
mod lifecycle;
mod metrics;
mod scrape;

use crate::cli::{Args, Scenario};
use crate::stats::Report;
use crate::target::Target;

/// Runs the scenarios `args` asks for on every target, then reads the
/// daemons' memory after all that work.
pub async fn run(args: &Args, targets: &mut [Target], report: &mut Report) -> anyhow::Result<()> {
    run_scenarios(args, targets, report).await?;
    if args.scenarios().contains(&Scenario::Footprint) {
        footprint::daemons_after(report, targets);
    }
    Ok(())
}

async fn run_scenarios(
    args: &Args,
    targets: &mut [Target],
    report: &mut Report,
) -> anyhow::Result<()> {
    let scenarios = args.scenarios();
    let has = |s: Scenario| scenarios.contains(&s);

    if has(Scenario::Footprint) {
        footprint::daemons_idle(report, targets, args.settle()).await;
    }
    let needs_image = [
        Scenario::Container,
        Scenario::ExecSync,
        Scenario::ContainerStatus,
        Scenario::List,
        Scenario::Footprint,
        Scenario::Density,
        Scenario::Metrics,
    ]
    .iter()
    .any(|s| has(*s));
    let image = match (&args.image, needs_image) {
        (Some(i), true) => Some(i.clone()),
        (None, true) => {
            report
                .skipped
                .push("container scenarios: need --image REF".into());
            None
        }
        _ => None,
    };
    if let Some(image) = &image {
        for t in targets.iter_mut() {
            t.image = Some(t.client.pull(image).await?);
        }
    }
    for image in &args.prepull {
        for t in targets.iter_mut() {
            t.client.pull(image).await?;
        }
    }

    lifecycle::fast_rpcs(report, targets, args, &scenarios).await?;
    lifecycle::pods(report, targets, args, &scenarios).await?;
    // The pull scenarios push images of their own (they need no --image).
    if has(Scenario::ImagePull) {
        images::image_pull(report, targets, args).await?;
    }
    if has(Scenario::ImagePullSigned) {
        images::signed_pull(report, targets, args).await?;
    }
    if image.is_none() {
        return Ok(());
    }
    if has(Scenario::Container) {
        lifecycle::containers(report, targets, args).await?;
    }
    if has(Scenario::ExecSync) || has(Scenario::ContainerStatus) {
        lifecycle::in_running_container(report, targets, args, &scenarios).await?;
    }
    if has(Scenario::List) && args.list_containers > 0 {
        lifecycle::lists(report, targets, args).await?;
    }
    if has(Scenario::Footprint) {
        footprint::monitors(report, targets, args).await?;
    }

    if has(Scenario::Density) {
        density::density(report, targets, args).await?;
    }
    if has(Scenario::Metrics) {
        metrics::metrics(report, targets, args).await?;
    }
    Ok(())
}
