//! What the daemon holds, for operators: counts by state (metrics, `crust
//! status`) and the state dump SIGUSR1 writes to the log (as containerd
//! dumps its state on SIGUSR1): pods, containers, open streaming
//! sessions, monitors and the calls being served.

use std::fmt::Write;
use std::time::Instant;

use crate::containers::ContainerState;
use crate::daemon::Daemon;
use crate::metrics::NodeCounts;
use crate::pods::{ListFilter, PodState};

const POD_STATES: [(PodState, &str); 2] =
    [(PodState::Ready, "ready"), (PodState::NotReady, "notready")];
const CONTAINER_STATES: [(ContainerState, &str); 3] = [
    (ContainerState::Created, "created"),
    (ContainerState::Running, "running"),
    (ContainerState::Exited, "exited"),
];
const SESSION_KINDS: [&str; 3] = ["exec", "attach", "port-forward"];

fn pod_state_name(s: PodState) -> &'static str {
    POD_STATES
        .iter()
        .find(|(k, _)| *k == s)
        .map_or("creating", |(_, n)| *n)
}

fn container_state_name(s: ContainerState) -> &'static str {
    CONTAINER_STATES
        .iter()
        .find(|(k, _)| *k == s)
        .map_or("creating", |(_, n)| *n)
}

/// Pods, containers, monitors and sessions by state: in-memory reads only.
pub fn counts(daemon: &Daemon) -> NodeCounts {
    let pods = daemon.pods.list(&ListFilter::default());
    let containers = daemon.containers.list();
    let sessions = daemon.sessions.list();
    NodeCounts {
        pods: POD_STATES
            .iter()
            .map(|(s, name)| (*name, pods.iter().filter(|p| p.state == *s).count() as u64))
            .collect(),
        containers: CONTAINER_STATES
            .iter()
            .map(|(s, name)| {
                (
                    *name,
                    containers.iter().filter(|c| c.state == *s).count() as u64,
                )
            })
            .collect(),
        monitors: containers.iter().filter(|c| c.state.is_live()).count() as u64,
        streaming_sessions: SESSION_KINDS
            .iter()
            .map(|k| (*k, sessions.iter().filter(|s| s.kind == *k).count() as u64))
            .collect(),
    }
}

/// The state dump: a human-readable text of everything the daemon holds.
pub fn dump(daemon: &Daemon) -> String {
    let now = Instant::now();
    let mut out = String::new();
    let pods = daemon.pods.list(&ListFilter::default());
    let _ = writeln!(out, "pod sandboxes: {}", pods.len());
    for p in &pods {
        let _ = writeln!(
            out,
            "  pod {} {}/{} attempt {} state {} handler {:?}{}",
            p.id,
            p.metadata.namespace,
            p.metadata.name,
            p.metadata.attempt,
            pod_state_name(p.state),
            p.runtime_handler,
            if p.host_network { " host-network" } else { "" },
        );
    }
    let containers = daemon.containers.list();
    let _ = writeln!(out, "containers: {}", containers.len());
    for c in &containers {
        let _ = write!(
            out,
            "  container {} {:?} attempt {} pod {} state {} image {:?} handler {:?}",
            c.id,
            c.name,
            c.attempt,
            c.pod_id,
            container_state_name(c.state),
            c.image,
            c.handler,
        );
        if c.state == ContainerState::Exited {
            let _ = write!(out, " exit {} {:?}", c.exit_code, c.reason);
        }
        if c.state.is_live() {
            let _ = write!(out, " monitor {}", c.state_dir.display());
        }
        out.push('\n');
    }
    let monitors = containers.iter().filter(|c| c.state.is_live()).count();
    let _ = writeln!(out, "monitors watched: {monitors}");
    let sessions = daemon.sessions.list();
    let _ = writeln!(out, "streaming sessions: {}", sessions.len());
    for s in &sessions {
        let _ = writeln!(
            out,
            "  {} {} for {:.1}s",
            s.kind,
            s.target,
            now.duration_since(s.started).as_secs_f64()
        );
    }
    let calls = daemon.metrics.in_flight();
    let _ = writeln!(out, "calls in flight: {}", calls.len());
    for c in &calls {
        let _ = writeln!(
            out,
            "  /{}/{} for {:.3}s",
            c.labels.service,
            c.labels.method,
            now.duration_since(c.started).as_secs_f64()
        );
    }
    out
}
