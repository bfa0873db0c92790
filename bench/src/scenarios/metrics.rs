//! The metrics scenario: the CRI stats and metrics lists with many pods
//! running.

use super::fleet::{remove_pods, start_pods};
use crate::cli::Args;
use crate::measure::{Op, measure, once};
use crate::stats::Report;
use crate::target::Target;

/// The metrics scenario: what a kubelet scraping /metrics/cadvisor and
/// /stats/summary from the runtime costs it, per call, with
/// --metrics-pods pods running.
pub async fn metrics(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    let n = args.metrics_pods;
    let par = args.density_parallel;
    let cni = targets.iter().all(|t| t.network_ready);
    let mut started = Vec::new();
    let mut r = Ok(());
    for t in targets.iter_mut() {
        match start_pods(t, n, par, cni, "metrics pods").await {
            Ok(p) => started.push(p),
            Err(e) => {
                r = Err(e);
                break;
            }
        }
    }
    if r.is_ok() {
        let (w, iters) = (args.lifecycle_warmup, args.lifecycle_iterations);
        for op in [Op::ListContainerStats, Op::ListPodSandboxStats] {
            if r.is_ok() {
                r = measure(report, targets, &op, "metrics", w, iters, args.rounds).await;
            }
        }
        if r.is_ok() {
            for t in targets.iter_mut() {
                // containerd 1.x has no metrics RPCs.
                if let Err(e) = once(t, &Op::ListPodSandboxMetrics).await {
                    t.not_applicable(report, "ListPodSandboxMetrics", &e);
                }
            }
            if targets.iter().any(|t| !t.skip) {
                r = measure(
                    report,
                    targets,
                    &Op::ListPodSandboxMetrics,
                    "metrics",
                    w,
                    iters,
                    args.rounds,
                )
                .await;
            }
            for t in targets.iter_mut() {
                t.skip = false;
            }
        }
    }
    for (t, pods) in targets.iter().zip(started) {
        remove_pods(t, pods, par).await?;
    }
    r
}
