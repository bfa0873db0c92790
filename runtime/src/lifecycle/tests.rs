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

fn with_parent(name: &str, parent: &str) -> crate::pods::PodSpec {
    crate::fakes::pod_spec(name, |c| {
        c.linux.as_mut().unwrap().cgroup_parent = parent.into();
    })
}

#[tokio::test]
async fn systemd_pods_are_slices_and_their_containers_scopes() {
    let rig = Rig::with(true, None).await;
    let slice = "kubepods-burstable-poduid1.slice";
    let slice_path = std::path::Path::new(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poduid1.slice",
    );
    rig.pod_host.add_kubelet_cgroup(slice_path);
    let pod = rig
        .lifecycle
        .run_pod(with_parent("web", slice))
        .await
        .unwrap();
    let rec = rig.pods.get(&pod).unwrap();
    // The pod is kubelet's slice itself, not a directory inside it.
    assert_eq!(rec.cgroup_path, slice_path);
    let s = rec.slice.clone().unwrap();
    assert_eq!((s.name.as_str(), s.owned), (slice, false));
    assert_eq!(rig.pods.oci_facts(&rec).cgroup_parent, slice);

    let id = rig
        .lifecycle
        .create_container(&pod, Some(container_config("a", |_| {})))
        .await
        .unwrap();
    let c = rig.containers.get(&id).unwrap();
    assert_eq!(
        c.cgroups_path.as_deref(),
        Some(format!("{slice}:crust:{id}").as_str())
    );
    // Stats and the orphan cleanup look in the scope.
    let cg = rig.containers.cgroup_of(&c).unwrap();
    assert_eq!(
        cg,
        crate::cgroups::ContainerCgroup::Scope {
            unit: format!("crust-{id}.scope"),
            path: crust_cgroups::CgroupPath::from_path(slice_path)
                .unwrap()
                .join(&format!("crust-{id}.scope"))
                .unwrap(),
        }
    );

    rig.lifecycle.remove_pod(&pod).await.unwrap();
    assert!(
        rig.journal
            .effects()
            .contains(&Effect::DeleteCgroup(slice_path.into()))
    );
    // kubelet's slice is kubelet's to remove.
    assert!(rig.pod_host.kubelet_cgroups().contains(slice_path));
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
}

#[tokio::test]
async fn a_systemd_pod_without_a_parent_gets_a_slice_of_its_own() {
    let rig = Rig::with(true, None).await;
    let pod = rig.run_pod("web").await.unwrap();
    let rec = rig.pods.get(&pod).unwrap();
    let name = format!("crust-pod{pod}.slice");
    assert_eq!(
        rec.cgroup_path,
        std::path::PathBuf::from(format!("/crust.slice/{name}"))
    );
    assert_eq!(rec.slice.clone().unwrap().name, name);
    assert!(rec.slice.clone().unwrap().owned);
    assert!(rig.pod_host.node().cgroups.contains(&rec.cgroup_path));
    // A restart keeps the slice in the record.
    let rig = rig.restart().await;
    assert_eq!(rig.pods.get(&pod).unwrap().slice, rec.slice);
    rig.lifecycle.remove_pod(&pod).await.unwrap();
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
}

#[tokio::test]
async fn a_parent_in_the_other_drivers_spelling_is_refused() {
    for (systemd, parent) in [(false, "kubepods-pod1.slice"), (true, "/kubepods/pod1")] {
        let rig = Rig::with(systemd, None).await;
        let err = rig
            .lifecycle
            .run_pod(with_parent("web", parent))
            .await
            .unwrap_err();
        let crate::pods::PodError::InvalidArgument(m) = err else {
            panic!("{err:?}");
        };
        assert!(m.starts_with("config.linux.cgroup_parent: "), "{m}");
        // It names the parent (or its last part, the slice it would be).
        assert!(m.contains("pod1"), "{m}");
        assert!(
            rig.journal.effects().is_empty(),
            "{:?}",
            rig.journal.effects()
        );
        // The name is free again.
        rig.run_pod("web").await.unwrap();
    }
}

fn unified(key: &str) -> crust_api::v1::LinuxContainerResources {
    crust_api::v1::LinuxContainerResources {
        unified: [(key.to_string(), "1000000".to_string())].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn unified_keys_of_a_pod_are_checked_before_anything_is_made() {
    let controllers = crust_cgroups::Controllers::parse("cpu memory pids");
    let rig = Rig::with(false, Some(controllers)).await;
    for (key, field) in [
        ("cgroup.procs", "config.linux.resources.unified"),
        ("io.max", "config.linux.resources.unified"),
        ("../memory.max", "config.linux.overhead.unified"),
    ] {
        let spec = crate::fakes::pod_spec("web", |c| {
            let linux = c.linux.as_mut().unwrap();
            if field.contains("overhead") {
                linux.overhead = Some(unified(key));
            } else {
                linux.resources = Some(unified(key));
            }
        });
        let err = rig.lifecycle.run_pod(spec).await.unwrap_err();
        let crate::pods::PodError::InvalidArgument(m) = err else {
            panic!("{err:?}");
        };
        assert!(m.starts_with(field), "{m}");
        assert!(m.contains(key), "{m}");
    }
    assert!(
        rig.journal.effects().is_empty(),
        "{:?}",
        rig.journal.effects()
    );
    let ok = crate::fakes::pod_spec("web", |c| {
        c.linux.as_mut().unwrap().resources = Some(unified("memory.high"));
    });
    rig.lifecycle.run_pod(ok).await.unwrap();

    // A v1 node has no unified keys at all.
    let rig = Rig::new().await;
    let spec = crate::fakes::pod_spec("web", |c| {
        c.linux.as_mut().unwrap().resources = Some(unified("memory.high"));
    });
    let err = rig.lifecycle.run_pod(spec).await.unwrap_err();
    assert!(err.to_string().contains("needs cgroup v2"), "{err}");
}

#[tokio::test]
async fn unified_keys_of_a_container_are_checked_at_create_and_update() {
    let controllers = crust_cgroups::Controllers::parse("cpu memory pids");
    let rig = Rig::with(false, Some(controllers)).await;
    let pod = rig.run_pod("web").await.unwrap();
    let pod_cgroup = rig.pods.get(&pod).unwrap().cgroup_path;
    for key in ["cgroup.procs", "io.max", "memory/../../x", "memory.max/x"] {
        let config = container_config("a", |c| {
            c.linux.as_mut().unwrap().resources = Some(unified(key));
        });
        let err = rig
            .lifecycle
            .create_container(&pod, Some(config))
            .await
            .unwrap_err();
        let crate::containers::ContainerError::InvalidArgument(m) = err else {
            panic!("{err:?}");
        };
        assert!(m.starts_with("config.linux.resources.unified: "), "{m}");
        assert!(m.contains(key), "{m}");
    }
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::Launch(_))), 0);
    // Checked against what the pod's cgroup gives its children.
    let asked = rig.container_host.controllers_asked();
    assert!(
        asked
            .iter()
            .all(|p| p.as_str() == pod_cgroup.to_str().unwrap())
    );

    let config = container_config("a", |c| {
        c.linux.as_mut().unwrap().resources = Some(unified("memory.high"));
    });
    let id = rig
        .lifecycle
        .create_container(&pod, Some(config))
        .await
        .unwrap();
    rig.lifecycle.start_container(&id).await.unwrap();
    let err = rig
        .lifecycle
        .update_container(&id, Some(unified("cgroup.kill")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, crate::containers::ContainerError::InvalidArgument(m)
            if m.starts_with("linux.unified: ") && m.contains("cgroup.kill")),
        "{err:?}"
    );
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::Update(_))), 0);
    rig.lifecycle
        .update_container(&id, Some(unified("memory.oom.group")))
        .await
        .unwrap();
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::Update(_))), 1);
    // The update is checked against the container's own cgroup.
    let last = rig.container_host.controllers_asked().pop().unwrap();
    assert_eq!(
        last.as_str(),
        format!("{}/crust-{id}", pod_cgroup.display())
    );
}
