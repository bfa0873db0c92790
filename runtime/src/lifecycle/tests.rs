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

// ---- NRI: a real plugin (the wire protocol over a Unix socket in the
// ---- rig's dir) against the real life cycle on the fake node.

mod nri_plugins {
    use std::time::Duration;

    use crust_nri::api::{self, Event};
    use crust_nri::testing::{Action, Behaviour, TestPlugin};

    use super::*;
    use crate::pods::PodRecord;

    const WAIT: Duration = Duration::from_secs(10);

    /// A plugin subscribed to every event, registered and synchronized.
    async fn plugin(rig: &Rig, name: &str, b: Behaviour) -> TestPlugin {
        let p = TestPlugin::connect(&rig.nri_socket(), name, "10", b)
            .await
            .expect("plugin registers");
        p.wait_synchronized(WAIT).await.expect("synchronized");
        let full = format!("10-{name}");
        let deadline = std::time::Instant::now() + WAIT;
        while !rig.lifecycle.nri.plugins().iter().any(|x| x.name == full) {
            assert!(std::time::Instant::now() < deadline, "{full} never listed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        p
    }

    fn methods(p: &TestPlugin) -> Vec<String> {
        p.events().into_iter().map(|(m, _, _)| m).collect()
    }

    fn fail(method: &str, action: Action) -> Behaviour {
        Behaviour {
            actions: [(method.to_string(), action)].into(),
            ..Default::default()
        }
    }

    async fn wait_for_method(p: &TestPlugin, method: &str, container: &str) {
        p.wait_for(WAIT, |r| {
            r.iter()
                .any(|x| x.method == method && x.container_id() == container)
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn plugins_hear_every_event_once_in_order_with_metadata() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let p = plugin(&rig, "order", Behaviour::default()).await;
        let pod = rig.run_pod("web").await.unwrap();
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&id).await.unwrap();
        rig.lifecycle.stop_container(&id, 10).await.unwrap();
        rig.lifecycle.remove_container(&id).await.unwrap();
        rig.lifecycle.stop_pod(&pod).await.unwrap();
        rig.lifecycle.stop_pod(&pod).await.unwrap();
        rig.lifecycle.remove_pod(&pod).await.unwrap();
        rig.lifecycle.remove_pod(&pod).await.unwrap();
        // The exit watcher may tell of the stop too: give it time to (not)
        // send a second StopContainer.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            methods(&p),
            [
                "RunPodSandbox",
                "CreateContainer",
                "PostCreateContainer",
                "StartContainer",
                "PostStartContainer",
                "StopContainer",
                "RemoveContainer",
                "StopPodSandbox",
                "RemovePodSandbox",
            ]
        );
        let got = p.received();
        let run = got.iter().find(|r| r.method == "RunPodSandbox").unwrap();
        let shown = run.pod.as_ref().unwrap();
        assert_eq!(
            (
                shown.id.as_str(),
                shown.name.as_str(),
                shown.namespace.as_str()
            ),
            (pod.as_str(), "web", "ns")
        );
        assert_eq!(shown.uid, "uid-web");
        for r in got.iter().filter(|r| r.method.contains("Container")) {
            let c = r.container.as_ref().unwrap();
            assert_eq!(
                (c.id.as_str(), c.name.as_str()),
                (id.as_str(), "app"),
                "{}",
                r.method
            );
            assert_eq!(c.pod_sandbox_id, pod);
            assert_eq!(r.pod_id(), pod);
        }
        let create = got.iter().find(|r| r.method == "CreateContainer").unwrap();
        let c = create.container.as_ref().unwrap();
        assert_eq!(c.state(), api::ContainerState::ContainerCreated);
        assert!(
            !c.args.is_empty() && c.linux.is_some(),
            "shown as its spec: {c:?}"
        );
        let start = got
            .iter()
            .find(|r| r.method == "PostStartContainer")
            .unwrap();
        assert_eq!(
            start.container.as_ref().unwrap().state(),
            api::ContainerState::ContainerRunning
        );
    }

    #[tokio::test]
    async fn a_failing_run_pod_sandbox_hook_leaves_nothing_and_a_retry_works() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let p = plugin(
            &rig,
            "runfail",
            fail("RunPodSandbox", Action::Fail("induced".into())),
        )
        .await;
        let err = rig.run_pod("web").await.unwrap_err();
        assert!(err.to_string().contains("induced"), "{err}");
        assert!(rig.pods.list(&ListFilter::default()).is_empty());
        assert!(rig.stored::<PodRecord>().is_empty());
        assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
        assert_eq!(rig.journal.count(|e| matches!(e, Effect::CniDel(_))), 1);
        assert_eq!(
            methods(&p),
            ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]
        );
        p.set_behaviour(|b| b.actions.clear());
        let pod = rig.run_pod("web").await.unwrap();
        assert_eq!(rig.pods.get(&pod).unwrap().state, PodState::Ready);
    }

    #[tokio::test]
    async fn a_failing_create_container_hook_leaves_nothing_and_a_retry_works() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let p = plugin(
            &rig,
            "createfail",
            fail("CreateContainer", Action::Fail("induced".into())),
        )
        .await;
        let err = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("induced"), "{err}");
        assert!(rig.containers.list().is_empty());
        assert!(rig.stored::<ContainerRecord>().is_empty());
        assert!(rig.images.leases().is_empty());
        assert!(
            rig.container_host.node().is_clean(),
            "{:?}",
            rig.container_host.node()
        );
        assert!(rig.container_host.launches().is_empty(), "never created");
        assert_eq!(
            methods(&p),
            ["CreateContainer", "StopContainer", "RemoveContainer"]
        );
        p.set_behaviour(|b| b.actions.clear());
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&id).await.unwrap();
    }

    #[tokio::test]
    async fn a_stopped_pod_takes_no_container_and_plugins_hear_nothing_of_it() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        rig.lifecycle.stop_pod(&pod).await.unwrap();
        let p = plugin(&rig, "stopped", Behaviour::default()).await;
        let err = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ContainerError::FailedPrecondition(_)),
            "{err:?}"
        );
        // Synchronized as stopped: a second stop is not news either.
        rig.lifecycle.stop_pod(&pod).await.unwrap();
        assert!(methods(&p).is_empty(), "{:?}", methods(&p));
    }

    #[tokio::test]
    async fn a_hung_plugin_times_out_and_the_pod_is_invisible_until_its_hook_ends() {
        let rig = Rig::with_nri(Duration::from_millis(700)).await;
        let p = plugin(&rig, "hung", fail("RunPodSandbox", Action::Hang)).await;
        let run = rig.run_pod("web");
        let check = async {
            p.wait_for(WAIT, |r| r.iter().any(|x| x.method == "RunPodSandbox"))
                .await
                .unwrap();
            let hooked = p.received()[p.received().len() - 1].pod_id().to_string();
            assert!(rig.pods.list(&ListFilter::default()).is_empty());
            assert!(matches!(rig.pods.get(&hooked), Err(PodError::NotFound(_))));
            let err = rig
                .lifecycle
                .create_container(&hooked, Some(container_config("early", |_| {})))
                .await
                .unwrap_err();
            assert!(matches!(err, ContainerError::NotFound(_)), "{err:?}");
            hooked
        };
        let (ran, hooked) = tokio::join!(run, check);
        // The hung plugin was dropped; the pod went on without it.
        let pod = ran.unwrap();
        assert_eq!(pod, hooked);
        assert_eq!(rig.pods.get(&pod).unwrap().state, PodState::Ready);
        assert!(rig.lifecycle.nri.plugins().is_empty());
        tokio::time::timeout(WAIT, p.closed()).await.unwrap();
        rig.lifecycle
            .create_container(&pod, Some(container_config("later", |_| {})))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_plugin_that_disconnects_mid_call_is_dropped_and_the_call_goes_on() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let p = plugin(&rig, "gone", fail("CreateContainer", Action::Disconnect)).await;
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        assert!(p.is_closed());
        assert!(rig.lifecycle.nri.plugins().is_empty());
        rig.lifecycle.start_container(&id).await.unwrap();
    }

    fn adjustment() -> api::ContainerAdjustment {
        api::ContainerAdjustment {
            env: vec![api::KeyValue::new("NRI_ADDED", "yes")],
            annotations: [("nri.crust.test/adjusted".to_string(), "true".to_string())].into(),
            mounts: vec![api::Mount {
                destination: "/nri".into(),
                r#type: "tmpfs".into(),
                source: "tmpfs".into(),
                options: vec!["nosuid".into(), "size=1m".into()],
            }],
            linux: Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: 64 << 20 }),
                        ..Default::default()
                    }),
                    cpu: Some(api::LinuxCpu {
                        cpus: "0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn adjustments_reach_the_spec_the_container_is_created_with() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let _p = plugin(
            &rig,
            "adjuster",
            Behaviour {
                adjust: Some(adjustment()),
                ..Default::default()
            },
        )
        .await;
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        let spec = serde_json::to_value(&rig.container_host.launches()[0].spec).unwrap();
        let env: Vec<&str> = spec["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(env.contains(&"NRI_ADDED=yes"), "{env:?}");
        assert_eq!(spec["annotations"]["nri.crust.test/adjusted"], "true");
        let mount = spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/nri")
            .expect("the plugin's mount");
        assert_eq!(mount["type"], "tmpfs");
        assert_eq!(spec["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(spec["linux"]["resources"]["cpu"]["cpus"], "0");
        // ContainerStatus reports the resources the container has.
        let res = rig.containers.get(&id).unwrap().resources().unwrap();
        assert_eq!(res.memory_limit_in_bytes, 64 << 20);
        assert_eq!(res.cpuset_cpus, "0");
    }

    #[tokio::test]
    async fn a_container_that_exits_on_its_own_is_reported_stopped_once() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let p = plugin(&rig, "exits", Behaviour::default()).await;
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&id).await.unwrap();
        rig.container_host.exit(&id, 1);
        wait_for_method(&p, "StopContainer", &id).await;
        let stop = p
            .received()
            .into_iter()
            .find(|r| r.method == "StopContainer")
            .unwrap();
        let c = stop.container.unwrap();
        assert_eq!(c.state(), api::ContainerState::ContainerStopped);
        assert_eq!(c.exit_code, 1);
        rig.lifecycle.stop_container(&id, 0).await.unwrap();
        rig.lifecycle.remove_container(&id).await.unwrap();
        assert_eq!(
            methods(&p),
            [
                "CreateContainer",
                "PostCreateContainer",
                "StartContainer",
                "PostStartContainer",
                "StopContainer",
                "RemoveContainer",
            ]
        );
    }

    fn resources_update(id: &str, shares: u64, pids: bool) -> api::ContainerUpdate {
        api::ContainerUpdate {
            container_id: id.into(),
            linux: Some(api::LinuxContainerUpdate {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: shares }),
                        ..Default::default()
                    }),
                    pids: pids.then_some(api::LinuxPids { limit: 10 }),
                    ..Default::default()
                }),
            }),
            ignore_failure: false,
        }
    }

    #[tokio::test]
    async fn plugins_updates_take_the_update_path_and_unexpressible_ones_fail() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&id).await.unwrap();
        let p = plugin(&rig, "updater", Behaviour::default()).await;
        let failed = p
            .update_containers(vec![resources_update(&id, 256, false)], Vec::new())
            .await
            .unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        let (cid, oci) = rig.container_host.updates().pop().unwrap();
        assert_eq!(
            (cid.as_str(), oci["cpu"]["shares"].as_u64()),
            (id.as_str(), Some(256))
        );
        assert_eq!(
            rig.containers
                .get(&id)
                .unwrap()
                .resources()
                .unwrap()
                .cpu_shares,
            256
        );
        let failed = p
            .update_containers(vec![resources_update(&id, 128, true)], Vec::new())
            .await
            .unwrap();
        assert_eq!(failed.len(), 1, "pids cannot take the CRI update path");
        assert_eq!(rig.container_host.updates().len(), 1);
        // An eviction stops the container; plugins hear of the stop.
        let failed = p
            .update_containers(
                Vec::new(),
                vec![api::ContainerEviction {
                    container_id: id.clone(),
                    reason: "test".into(),
                }],
            )
            .await
            .unwrap();
        assert!(failed.is_empty());
        wait_for_method(&p, "StopContainer", &id).await;
        assert_eq!(
            rig.containers.get(&id).unwrap().state,
            ContainerState::Exited
        );
    }

    #[tokio::test]
    async fn update_container_resources_applies_what_plugins_return() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config("app", |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&id).await.unwrap();
        let p = plugin(
            &rig,
            "resizer",
            Behaviour {
                update_updates: vec![resources_update(&id, 999, false)],
                ..Default::default()
            },
        )
        .await;
        rig.lifecycle
            .update_container(
                &id,
                Some(crust_api::v1::LinuxContainerResources {
                    cpu_shares: 100,
                    memory_limit_in_bytes: 32 << 20,
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
        let (_, oci) = rig.container_host.updates().pop().unwrap();
        assert_eq!(oci["cpu"]["shares"], 999, "the plugin's value wins: {oci}");
        assert_eq!(oci["memory"]["limit"], 32 << 20);
        let asked = p
            .received()
            .into_iter()
            .find(|r| r.method == "UpdateContainer")
            .unwrap();
        let shares = asked.resources.unwrap().cpu.unwrap().shares.unwrap().value;
        assert_eq!(shares, 100, "plugins see what the CRI asked for");
        assert_eq!(methods(&p), ["UpdateContainer", "PostUpdateContainer"]);
    }

    #[tokio::test]
    async fn a_plugin_synchronizing_misses_no_container() {
        let rig = Rig::with_nri(Duration::from_secs(5)).await;
        let pod = rig.run_pod("web").await.unwrap();
        let before = rig
            .lifecycle
            .create_container(&pod, Some(container_config("before", |_| {})))
            .await
            .unwrap();
        rig.lifecycle.start_container(&before).await.unwrap();
        let slow = TestPlugin::connect(
            &rig.nri_socket(),
            "slow",
            "20",
            Behaviour {
                sync_delay: Duration::from_millis(500),
                events: vec![Event::CreateContainer],
                ..Default::default()
            },
        )
        .await
        .unwrap();
        // Synchronize is under way (or about to be): create meanwhile.
        let during = rig
            .lifecycle
            .create_container(&pod, Some(container_config("during", |_| {})))
            .await
            .unwrap();
        let synced = slow.wait_synchronized(WAIT).await.unwrap();
        assert!(synced.pods.iter().any(|p| p.id == pod));
        let synced_ids: Vec<&str> = synced.containers.iter().map(|c| c.id.as_str()).collect();
        assert!(synced_ids.contains(&before.as_str()), "{synced_ids:?}");
        let c = synced.containers.iter().find(|c| c.id == before).unwrap();
        assert_eq!(c.state(), api::ContainerState::ContainerRunning);
        assert_eq!(c.name, "before");
        let told = slow
            .received()
            .iter()
            .any(|r| r.method == "CreateContainer" && r.container_id() == during);
        assert!(
            synced_ids.contains(&during.as_str()) || told,
            "the container created while the plugin synchronized was missed"
        );
    }
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
