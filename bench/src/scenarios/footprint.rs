//! The footprint scenario: the daemons' RSS (idle, after the run, peak)
//! and, per runtime handler, what a container's monitor and the pod's
//! helper processes take, idle and during an exec.

use std::time::Duration;

use anyhow::Context;
use crust_api::v1;

use crate::cli::Args;
use crate::fixtures::handler_label;
use crate::procfs::{comm, in_cgroup_below, monitor_of, monitor_tree, proc_rss, rss_pss};
use crate::stats::Report;
use crate::target::Target;

/// The daemons' RSS when idle as the monitors are: no request for
/// `settle` (crust's daemon trims itself after 2 s of quiet).
pub async fn daemons_idle(report: &mut Report, targets: &[Target], settle: Duration) {
    tokio::time::sleep(settle).await;
    for t in targets {
        if let Some((rss, _)) = t.pid.and_then(proc_rss) {
            report.figure("daemon rss idle", &t.name, rss, "KiB");
        }
    }
}

/// The daemons' RSS after the run, and their peak.
pub fn daemons_after(report: &mut Report, targets: &[Target]) {
    for t in targets {
        if let Some((rss, hwm)) = t.pid.and_then(proc_rss) {
            report.figure("daemon rss after", &t.name, rss, "KiB");
            report.figure("daemon rss peak", &t.name, hwm, "KiB");
        }
    }
}

/// The monitor footprint of every --handler on every target.
pub async fn monitors(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    for t in targets.iter_mut() {
        for handler in &args.handler {
            monitor(report, t, handler, args.settle()).await?;
        }
    }
    Ok(())
}

async fn monitor(
    report: &mut Report,
    t: &mut Target,
    handler: &str,
    settle: Duration,
) -> anyhow::Result<()> {
    let h = handler_label(handler);
    let image = t.image()?;
    let pod = match t.client.run_pod(handler, true).await {
        Ok(pod) => pod,
        Err(e) => {
            report.not_applicable(&format!("monitor[{h}]"), &t.name, &e);
            return Ok(());
        }
    };
    let result = async {
        let id = t.client.create_container(&pod, &image).await?;
        t.client.start_container(&id).await?;
        // Idle: no request for `settle` (a monitor may trim itself then).
        tokio::time::sleep(settle).await;
        let Some(monitor) = monitor_of(&id) else {
            report.skipped.push(format!(
                "monitor footprint [{h}] on {}: no monitor process found",
                t.name
            ));
            return Ok(());
        };
        let name = comm(monitor);
        if let Some((rss, pss)) = rss_pss(monitor) {
            report.figure(&format!("monitor[{h}] rss"), &t.name, rss, "KiB");
            report.figure(&format!("monitor[{h}] pss"), &t.name, pss, "KiB");
        }
        let mut rt = t.client.rt.clone();
        let exec_id = id.clone();
        // An exec that outlives the measurement by a safe margin.
        let exec_secs = settle.as_secs() + 3;
        let exec = tokio::spawn(async move {
            rt.exec_sync(v1::ExecSyncRequest {
                container_id: exec_id,
                cmd: vec!["sleep".into(), exec_secs.to_string()],
                timeout: exec_secs as i64 + 10,
            })
            .await
        });
        tokio::time::sleep(settle).await;
        if let Some((rss, pss)) = rss_pss(monitor) {
            report.figure(&format!("monitor[{h}] rss, exec"), &t.name, rss, "KiB");
            report.figure(&format!("monitor[{h}] pss, exec"), &t.name, pss, "KiB");
        }
        // Monitor processes (the monitor, helpers it forked or ran, exec
        // sessions), and the pod's sandbox processes (a pause container)
        // the monitor also parents: together, the per-pod overhead.
        let all = monitor_tree(monitor, &id);
        let (mut mon, mut pod) = ((0.0, 0.0), (0.0, 0.0));
        let (mut mon_names, mut sandbox_names) = (Vec::new(), Vec::new());
        for (p, n) in &all {
            let Some((r, s)) = rss_pss(*p) else { continue };
            if in_cgroup_below(*p, &t.client.fixtures.cgroup_parent) {
                sandbox_names.push(n.as_str());
            } else {
                mon = (mon.0 + r, mon.1 + s);
                mon_names.push(n.as_str());
            }
            pod = (pod.0 + r, pod.1 + s);
        }
        report.notes.push(format!(
            "monitor[{h}] on {}: {name} (pid {monitor}); with an exec, monitors: {}; sandbox: {}",
            t.name,
            mon_names.join(" + "),
            if sandbox_names.is_empty() {
                "none".to_string()
            } else {
                sandbox_names.join(" + ")
            }
        ));
        for (what, (rss, pss)) in [("monitors", mon), ("pod overhead", pod)] {
            report.figure(&format!("{what}[{h}] rss, exec"), &t.name, rss, "KiB");
            report.figure(&format!("{what}[{h}] pss, exec"), &t.name, pss, "KiB");
        }
        exec.await?.context("ExecSync sleep")?;
        anyhow::Ok(())
    }
    .await;
    let removed = t.client.remove_pod(&pod.0).await;
    result.and(removed)
}
