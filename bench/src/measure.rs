//! The timed operations of the latency scenarios, and how they are
//! measured: warm-up, then rounds that alternate the endpoints so that
//! machine drift hits both alike.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use crust_api::v1;

use crate::fixtures::handler_label;
use crate::progress::bar;
use crate::stats::{self, Report};
use crate::target::Target;

/// One timed operation of a scenario.
#[derive(Clone)]
pub enum Op {
    Version,
    Status,
    Pod {
        cni: bool,
    },
    /// Uses the fixture pod.
    Container {
        handler: String,
    },
    /// Uses the fixture container.
    ExecSync,
    ContainerStatus,
    ListContainers,
    ListPods,
    ListPodSandboxMetrics,
    ListContainerStats,
    ListPodSandboxStats,
}

type Phases = Vec<(String, Duration)>;

pub async fn once(t: &mut Target, op: &Op) -> anyhow::Result<Phases> {
    let start = Instant::now();
    let one = |name: &str, start: Instant| vec![(name.to_string(), start.elapsed())];
    match op {
        Op::Version => {
            t.client.rt.version(v1::VersionRequest::default()).await?;
            Ok(one("Version", start))
        }
        Op::Status => {
            t.client
                .rt
                .status(v1::StatusRequest { verbose: false })
                .await?;
            Ok(one("Status", start))
        }
        Op::Pod { cni } => {
            let net = if *cni { "cni" } else { "host" };
            let (id, _) = t.client.run_pod("", !cni).await?;
            let ran = start.elapsed();
            let s = Instant::now();
            t.client
                .rt
                .stop_pod_sandbox(v1::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .context("StopPodSandbox")?;
            let stopped = s.elapsed();
            let s = Instant::now();
            t.client
                .rt
                .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .context("RemovePodSandbox")?;
            let removed = s.elapsed();
            t.client.tracker.pod_removed(&id);
            Ok(vec![
                (format!("pod {net} run"), ran),
                (format!("pod {net} stop"), stopped),
                (format!("pod {net} remove"), removed),
                (format!("pod {net} total"), start.elapsed()),
            ])
        }
        Op::Container { handler } => {
            let h = handler_label(handler);
            let pod = t.pod.clone().context("no fixture pod")?;
            let image = t.image()?;
            let id = t.client.create_container(&pod, &image).await?;
            let created = start.elapsed();
            let s = Instant::now();
            t.client.start_container(&id).await?;
            let started = s.elapsed();
            let s = Instant::now();
            t.client
                .rt
                .stop_container(v1::StopContainerRequest {
                    container_id: id.clone(),
                    timeout: 0,
                })
                .await
                .context("StopContainer")?;
            let stopped = s.elapsed();
            let s = Instant::now();
            t.client
                .rt
                .remove_container(v1::RemoveContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .context("RemoveContainer")?;
            let removed = s.elapsed();
            Ok(vec![
                (format!("ctr[{h}] create"), created),
                (format!("ctr[{h}] start"), started),
                (format!("ctr[{h}] create+start"), created + started),
                (format!("ctr[{h}] stop"), stopped),
                (format!("ctr[{h}] remove"), removed),
            ])
        }
        Op::ExecSync => {
            let id = t.container.clone().context("no fixture container")?;
            let r = t
                .client
                .rt
                .exec_sync(v1::ExecSyncRequest {
                    container_id: id,
                    cmd: vec!["true".into()],
                    timeout: 10,
                })
                .await
                .context("ExecSync")?
                .into_inner();
            if r.exit_code != 0 {
                bail!(
                    "ExecSync true exited {}: {}",
                    r.exit_code,
                    String::from_utf8_lossy(&r.stderr)
                );
            }
            Ok(one("ExecSync true", start))
        }
        Op::ContainerStatus => {
            let id = t.container.clone().context("no fixture container")?;
            t.client
                .rt
                .container_status(v1::ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                })
                .await
                .context("ContainerStatus")?;
            Ok(one("ContainerStatus", start))
        }
        Op::ListContainers => {
            let n = t
                .client
                .rt
                .list_containers(v1::ListContainersRequest::default())
                .await
                .context("ListContainers")?
                .into_inner()
                .containers
                .len();
            Ok(one(&format!("ListContainers ({n})"), start))
        }
        Op::ListPods => {
            let n = t
                .client
                .rt
                .list_pod_sandbox(v1::ListPodSandboxRequest::default())
                .await
                .context("ListPodSandbox")?
                .into_inner()
                .items
                .len();
            Ok(one(&format!("ListPodSandbox ({n})"), start))
        }
        Op::ListPodSandboxMetrics => {
            let pods = t
                .client
                .rt
                .list_pod_sandbox_metrics(v1::ListPodSandboxMetricsRequest::default())
                .await
                .context("ListPodSandboxMetrics")?
                .into_inner()
                .pod_metrics;
            let series: usize = pods
                .iter()
                .map(|p| {
                    p.metrics.len()
                        + p.container_metrics
                            .iter()
                            .map(|c| c.metrics.len())
                            .sum::<usize>()
                })
                .sum();
            // The series count is in the name: it says what one call costs.
            Ok(one(
                &format!(
                    "ListPodSandboxMetrics ({} pods, {series} series)",
                    pods.len()
                ),
                start,
            ))
        }
        Op::ListContainerStats => {
            let n = t
                .client
                .rt
                .list_container_stats(v1::ListContainerStatsRequest::default())
                .await
                .context("ListContainerStats")?
                .into_inner()
                .stats
                .len();
            Ok(one(&format!("ListContainerStats ({n})"), start))
        }
        Op::ListPodSandboxStats => {
            let n = t
                .client
                .rt
                .list_pod_sandbox_stats(v1::ListPodSandboxStatsRequest::default())
                .await
                .context("ListPodSandboxStats")?
                .into_inner()
                .stats
                .len();
            Ok(one(&format!("ListPodSandboxStats ({n})"), start))
        }
    }
}

/// Warm-up, then `iterations` timed runs of `op` per target, split in
/// `rounds` rounds alternating the targets.
pub async fn measure(
    report: &mut Report,
    targets: &mut [Target],
    op: &Op,
    label: &str,
    warmup: usize,
    iterations: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    let active = targets.iter().filter(|t| !t.skip).count();
    let pb = bar(((warmup + iterations) * active) as u64, label);
    for t in targets.iter_mut().filter(|t| !t.skip) {
        for _ in 0..warmup {
            once(t, op).await?;
            pb.inc(1);
        }
    }
    let per_round = iterations.div_ceil(rounds.max(1));
    // Per target: phases in first-seen order with their samples.
    let mut samples: Vec<Vec<(String, Vec<Duration>)>> = vec![Vec::new(); targets.len()];
    let mut done: Vec<usize> = targets
        .iter()
        .map(|t| if t.skip { iterations } else { 0 })
        .collect();
    while done.iter().any(|&d| d < iterations) {
        for (i, t) in targets.iter_mut().enumerate() {
            for _ in 0..per_round {
                if done[i] >= iterations {
                    break;
                }
                for (phase, d) in once(t, op).await? {
                    match samples[i].iter_mut().find(|(p, _)| *p == phase) {
                        Some((_, v)) => v.push(d),
                        None => samples[i].push((phase, vec![d])),
                    }
                }
                done[i] += 1;
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    for (t, phases) in targets.iter().zip(samples) {
        for (phase, s) in phases {
            report.results.push(stats::summarize(&phase, &t.name, s));
        }
    }
    Ok(())
}
