//! The ordering rules between pods and their containers, through the fake
//! node (no root).

use super::*;
use crate::containers::{ContainerRecord, ContainerState};
use crate::fakes::{Effect, Op, Rig, container_config};
use crate::pods::ListFilter;

/// A ready pod with two running containers.
async fn pod_with_two_running(rig: &Rig) -> (String, Vec<String>) {
    let pod = rig.run_pod("web").await.unwrap();
    let mut ids = Vec::new();
    for name in ["a", "b"] {
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config(name, |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&id).await.unwrap();
        ids.push(id);
    }
    (pod, ids)
}

#[tokio::test]
async fn stopping_a_pod_stops_its_containers_before_its_network() {
    let rig = Rig::new().await;
    let (pod, ids) = pod_with_two_running(&rig).await;
    rig.journal.clear();
    rig.lifecycle.stop_pod(&pod).await.unwrap();
    for id in &ids {
        let rec = rig.containers.get(id).unwrap();
        assert_eq!(rec.state, ContainerState::Exited, "{id}");
    }
    let j = &rig.journal;
    let last_kill = j
        .effects()
        .iter()
        .rposition(|e| matches!(e, Effect::Kill { .. }))
        .unwrap();
    let del = j.position(|e| matches!(e, Effect::CniDel(_))).unwrap();
    let pause = j.position(|e| matches!(e, Effect::StopPause(_))).unwrap();
    assert!(last_kill < pause && pause < del, "{:?}", j.effects());
    // Stopping leaves the containers in place.
    assert_eq!(rig.containers.list().len(), 2);
}

#[tokio::test]
async fn removing_a_pod_removes_its_containers_first() {
    let rig = Rig::new().await;
    let (pod, _) = pod_with_two_running(&rig).await;
    let other = rig.run_pod("other").await.unwrap();
    let stays = rig
        .lifecycle
        .create_container(&other, Some(container_config("c", |_| {})))
        .await
        .unwrap();
    rig.journal.clear();
    rig.lifecycle.remove_pod(&pod).await.unwrap();

    let left: Vec<String> = rig.containers.list().iter().map(|r| r.id.clone()).collect();
    assert_eq!(
        left,
        std::slice::from_ref(&stays),
        "only the other pod's container is left"
    );
    assert_eq!(rig.images.leases().len(), 1);
    assert_eq!(rig.stored::<ContainerRecord>().len(), 1);
    let j = &rig.journal;
    let last_unmount = j
        .effects()
        .iter()
        .rposition(|e| matches!(e, Effect::UnmountRootfs(_)))
        .unwrap();
    let del = j.position(|e| matches!(e, Effect::CniDel(_))).unwrap();
    let unpin = j
        .position(|e| matches!(e, Effect::UnpinNamespaces(_)))
        .unwrap();
    assert!(last_unmount < del && del < unpin, "{:?}", j.effects());
    assert_eq!(rig.pods.list(&ListFilter::default()).len(), 1);
}

#[tokio::test]
async fn a_container_that_cannot_be_removed_keeps_its_pod() {
    let rig = Rig::new().await;
    let (pod, _) = pod_with_two_running(&rig).await;
    rig.container_host.fail(Op::UnmountRootfs);
    let err = rig.lifecycle.remove_pod(&pod).await.unwrap_err();
    assert!(
        err.to_string().starts_with("removing the pod's containers"),
        "{err}"
    );
    // The pod is untouched: still listed, still on its network.
    let rec = rig.pods.get(&pod).unwrap();
    assert!(rec.network_attached());
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::CniDel(_))), 0);

    rig.container_host.heal(Op::UnmountRootfs);
    rig.lifecycle.remove_pod(&pod).await.unwrap();
    assert!(rig.containers.list().is_empty());
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
    assert!(rig.container_host.node().is_clean());
}

#[tokio::test]
async fn create_container_checks_the_request_then_the_pod() {
    let rig = Rig::new().await;
    let unknown = "b".repeat(64);
    // A bad request is named even for an unknown pod.
    let bad = container_config("a/b", |_| {});
    let err = rig
        .lifecycle
        .create_container(&unknown, Some(bad))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ContainerError::InvalidArgument(m) if m.starts_with("config.metadata.name"))
    );
    let err = rig
        .lifecycle
        .create_container(&unknown, Some(container_config("a", |_| {})))
        .await
        .unwrap_err();
    assert!(matches!(err, ContainerError::NotFound(_)), "{err:?}");
    let err = rig
        .lifecycle
        .create_container("", Some(container_config("a", |_| {})))
        .await
        .unwrap_err();
    assert!(matches!(err, ContainerError::InvalidArgument(m) if m.starts_with("pod_sandbox_id")));
    assert!(rig.journal.effects().is_empty());
}

#[tokio::test]
async fn a_container_joins_its_pods_namespaces_and_cgroup() {
    let rig = Rig::new().await;
    let pod = rig.run_pod("web").await.unwrap();
    let rec = rig.pods.get(&pod).unwrap();
    rig.lifecycle
        .create_container(&pod, Some(container_config("a", |_| {})))
        .await
        .unwrap();
    let launch = &rig.container_host.launches()[0];
    let linux = launch.spec.linux().as_ref().unwrap();
    let paths: Vec<_> = linux
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .filter_map(|n| n.path().clone())
        .collect();
    for ns in [
        &rec.namespaces.net,
        &rec.namespaces.ipc,
        &rec.namespaces.uts,
    ] {
        assert!(paths.contains(ns.as_ref().unwrap()), "{paths:?}");
    }
    let cgroup = linux.cgroups_path().as_ref().unwrap();
    assert!(cgroup.starts_with(&rec.cgroup_path), "{cgroup:?}");
}

#[tokio::test]
async fn a_removed_containers_stats_sample_is_dropped() {
    let rig = Rig::new().await;
    let (pod, ids) = pod_with_two_running(&rig).await;
    // No cgroup to read here: the sampler is fed by hand.
    let stats = &rig.lifecycle.stats;
    stats.record_sample(&ids[0], 1, 10);
    stats.record_sample(&pod, 1, 10);
    rig.lifecycle.remove_container(&ids[0]).await.unwrap();
    assert!(!stats.has_sample(&ids[0]));
    assert!(stats.has_sample(&pod));
    rig.lifecycle.remove_pod(&pod).await.unwrap();
    assert!(!stats.has_sample(&pod));
}
