//! The latency scenarios: the fast RPCs, pod and container lifecycles,
//! ExecSync and ContainerStatus in a running container, and the lists.

use crate::cli::{Args, Scenario};
use crate::fixtures::handler_label;
use crate::measure::{Op, measure};
use crate::progress::bar;
use crate::stats::Report;
use crate::target::Target;

/// Version and Status.
pub async fn fast_rpcs(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
    scenarios: &[Scenario],
) -> anyhow::Result<()> {
    for (s, op) in [
        (Scenario::Version, Op::Version),
        (Scenario::Status, Op::Status),
    ] {
        if scenarios.contains(&s) {
            measure(
                report,
                targets,
                &op,
                &format!("{s:?}"),
                args.warmup,
                args.iterations,
                args.rounds,
            )
            .await?;
        }
    }
    Ok(())
}

/// Pod lifecycles, on the host network and (where every endpoint is
/// NetworkReady) on the CNI network.
pub async fn pods(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
    scenarios: &[Scenario],
) -> anyhow::Result<()> {
    let slow = (args.lifecycle_warmup, args.lifecycle_iterations);
    if scenarios.contains(&Scenario::PodHost) {
        let op = Op::Pod { cni: false };
        measure(
            report,
            targets,
            &op,
            "pod host",
            slow.0,
            slow.1,
            args.rounds,
        )
        .await?;
    }
    if scenarios.contains(&Scenario::PodCni) {
        if targets.iter().all(|t| t.network_ready) {
            let op = Op::Pod { cni: true };
            measure(report, targets, &op, "pod cni", slow.0, slow.1, args.rounds).await?;
        } else {
            report
                .skipped
                .push("pod-cni: an endpoint's Status is not NetworkReady".into());
        }
    }
    Ok(())
}

/// Container lifecycles per runtime handler, in a fixture pod of that
/// handler (n/a on an endpoint without it).
pub async fn containers(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    let slow = (args.lifecycle_warmup, args.lifecycle_iterations);
    for handler in &args.handler {
        let h = handler_label(handler);
        for t in targets.iter_mut() {
            match t.client.run_pod(handler, true).await {
                Ok(pod) => t.pod = Some(pod),
                Err(e) => t.not_applicable(report, &format!("ctr[{h}]"), &e),
            }
        }
        let op = Op::Container {
            handler: handler.clone(),
        };
        let label = format!("container [{h}]");
        let r = if targets.iter().any(|t| !t.skip) {
            measure(report, targets, &op, &label, slow.0, slow.1, args.rounds).await
        } else {
            Ok(())
        };
        for t in targets.iter_mut() {
            t.skip = false;
            t.remove_fixtures().await?;
        }
        r?;
    }
    Ok(())
}

/// ExecSync and ContainerStatus of a fixture container.
pub async fn in_running_container(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
    scenarios: &[Scenario],
) -> anyhow::Result<()> {
    let fast = (args.warmup, args.iterations);
    let slow = (args.lifecycle_warmup, args.lifecycle_iterations);
    for t in targets.iter_mut() {
        let image = t.image()?;
        let pod = t.client.run_pod("", true).await?;
        let id = t.client.create_container(&pod, &image).await?;
        t.client.start_container(&id).await?;
        t.pod = Some(pod);
        t.container = Some(id);
    }
    let mut r = Ok(());
    for (s, op) in [
        (Scenario::ExecSync, Op::ExecSync),
        (Scenario::ContainerStatus, Op::ContainerStatus),
    ] {
        if scenarios.contains(&s) && r.is_ok() {
            // ExecSync runs a process per call: lifecycle-sized counts.
            let (w, n) = if s == Scenario::ExecSync {
                (slow.0, (fast.1 / 5).max(slow.1))
            } else {
                fast
            };
            r = measure(report, targets, &op, &format!("{s:?}"), w, n, args.rounds).await;
        }
    }
    for t in targets.iter_mut() {
        t.remove_fixtures().await?;
    }
    r
}

/// ListContainers and ListPodSandbox with --list-containers containers
/// (created, not started) in a fixture pod.
pub async fn lists(report: &mut Report, targets: &mut [Target], args: &Args) -> anyhow::Result<()> {
    let slow = (args.lifecycle_warmup, args.lifecycle_iterations);
    for t in targets.iter_mut() {
        let image = t.image()?;
        let pod = t.client.run_pod("", true).await?;
        t.pod = Some(pod.clone());
        let pb = bar(
            args.list_containers as u64,
            &format!("creating containers ({})", t.name),
        );
        for _ in 0..args.list_containers {
            t.client.create_container(&pod, &image).await?;
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    let mut r = Ok(());
    for op in [Op::ListContainers, Op::ListPods] {
        if r.is_ok() {
            r = measure(report, targets, &op, "list", slow.0, slow.1, args.rounds).await;
        }
    }
    for t in targets.iter_mut() {
        t.remove_fixtures().await?;
    }
    r
}
