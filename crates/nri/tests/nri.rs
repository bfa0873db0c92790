//! NRI over a real Unix socket: the runtime side (`Nri`) against test
//! plugins speaking the wire protocol (and a pre-installed plugin process).
//! The runtime backend is a seam here (an in-memory list of pods and
//! containers); the daemon's tests exercise the real one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crust_nri::api::*;
use crust_nri::testing::{Action, Behaviour, TestPlugin};
use crust_nri::{
    BoxFuture, Config, Nri, NriError, RuntimeBackend, RuntimeInfo, Snapshot, SnapshotPod,
};

#[derive(Default)]
struct Backend {
    pods: Mutex<Vec<SnapshotPod>>,
    containers: Mutex<Vec<Container>>,
    updates: Mutex<Vec<ContainerUpdate>>,
    evictions: Mutex<Vec<ContainerEviction>>,
}

impl RuntimeBackend for Backend {
    fn snapshot(&self) -> BoxFuture<'_, Snapshot> {
        Box::pin(async move {
            Snapshot {
                pods: self.pods.lock().unwrap().clone(),
                containers: self.containers.lock().unwrap().clone(),
            }
        })
    }
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Vec<ContainerUpdate>> {
        Box::pin(async move {
            let failed = updates
                .iter()
                .filter(|u| u.container_id.starts_with("missing"))
                .cloned()
                .collect();
            self.updates.lock().unwrap().extend(updates);
            failed
        })
    }
    fn evict_containers(
        &self,
        evictions: Vec<ContainerEviction>,
    ) -> BoxFuture<'_, Vec<ContainerEviction>> {
        Box::pin(async move {
            self.evictions.lock().unwrap().extend(evictions);
            Vec::new()
        })
    }
}

struct Env {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    backend: Arc<Backend>,
    nri: Nri,
}

fn config(dir: &Path) -> Config {
    Config {
        socket_path: dir.join("nri/nri.sock"),
        plugin_path: dir.join("plugins"),
        plugin_config_path: dir.join("conf.d"),
        plugin_registration_timeout: Duration::from_secs(5),
        plugin_request_timeout: Duration::from_millis(500),
        ..Config::default()
    }
}

async fn start_with(dir: tempfile::TempDir, cfg: Config, backend: Backend) -> Env {
    let backend = Arc::new(backend);
    let nri = Nri::start(
        cfg.clone(),
        RuntimeInfo {
            name: "crust".into(),
            version: "0.1.0".into(),
        },
        backend.clone(),
    )
    .await
    .expect("NRI starts");
    Env {
        _dir: dir,
        socket: cfg.socket_path,
        backend,
        nri,
    }
}

async fn start() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    start_with(dir, cfg, Backend::default()).await
}

const WAIT: Duration = Duration::from_secs(10);

async fn plugin(env: &Env, name: &str, idx: &str, b: Behaviour) -> TestPlugin {
    let p = TestPlugin::connect(&env.socket, name, idx, b)
        .await
        .expect("plugin registers");
    p.wait_synchronized(WAIT)
        .await
        .expect("plugin synchronized");
    // Registration completes on the runtime side right after Synchronize.
    let full = format!("{idx}-{name}");
    let deadline = Instant::now() + WAIT;
    while !env.nri.plugins().iter().any(|x| x.name == full) {
        assert!(Instant::now() < deadline, "{full} never listed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p
}

fn pod(id: &str) -> PodSandbox {
    PodSandbox {
        id: id.into(),
        name: format!("{id}-name"),
        uid: format!("{id}-uid"),
        namespace: "ns".into(),
        runtime_handler: "runc".into(),
        ..Default::default()
    }
}

fn ctr(id: &str, pod: &str) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: pod.into(),
        name: format!("{id}-name"),
        state: ContainerState::ContainerCreated as i32,
        env: vec!["PATH=/bin".into()],
        ..Default::default()
    }
}

async fn wait_gone(env: &Env, name: &str) {
    let deadline = Instant::now() + WAIT;
    while env.nri.plugins().iter().any(|x| x.name == name) {
        assert!(Instant::now() < deadline, "{name} still registered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// RunPodSandbox, CreateContainer and StartContainer of `c` in `pd`.
async fn run_and_start(env: &Env, pd: &PodSandbox, c: &Container) {
    env.nri.run_pod_sandbox(|| pd.clone()).await.unwrap();
    env.nri
        .create_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    env.nri
        .start_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
}

fn names(events: &[(String, String, String)]) -> Vec<&str> {
    events.iter().map(|e| e.0.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn registration_configure_and_synchronize() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let backend = Backend::default();
    backend.pods.lock().unwrap().push(SnapshotPod {
        pod: pod("p1"),
        ready: true,
    });
    backend.containers.lock().unwrap().push(ctr("c1", "p1"));
    let env = start_with(dir, cfg, backend).await;

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&env.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket is root-only");

    let p = TestPlugin::connect(&env.socket, "test", "10", Behaviour::default())
        .await
        .unwrap();
    let sync = p.wait_synchronized(WAIT).await.unwrap();
    assert_eq!(
        sync.pods.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["p1"]
    );
    assert_eq!(
        sync.containers
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        ["c1"]
    );
    let configure = p.received().into_iter().find_map(|r| r.configure).unwrap();
    assert_eq!(
        (
            configure.runtime_name.as_str(),
            configure.runtime_version.as_str()
        ),
        ("crust", "0.1.0")
    );
    assert_eq!(
        (configure.registration_timeout, configure.request_timeout),
        (5000, 500)
    );
    assert_eq!(configure.nri_version, NRI_VERSION);

    let _ = plugin(
        &env,
        "other",
        "05",
        Behaviour {
            events: vec![Event::CreateContainer],
            ..Default::default()
        },
    )
    .await;
    let listed = env.nri.plugins();
    assert_eq!(
        listed.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["05-other", "10-test"]
    );
    assert_eq!(listed[0].events, EventMask::of(&[Event::CreateContainer]));
    assert!(
        listed[1].events.is_set(Event::RemovePodSandbox)
            && !listed[1].events.is_set(Event::ValidateContainerAdjustment)
    );
    assert!(listed[1].external);
    env.nri.shutdown().await;
    assert!(!env.socket.exists());
    p.closed().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_names_duplicates_and_silent_plugins_are_refused() {
    let env = start().await;
    let e = TestPlugin::connect(&env.socket, "bad/name", "10", Behaviour::default())
        .await
        .err()
        .unwrap();
    assert!(e.contains("invalid plugin name"), "{e}");
    let e = TestPlugin::connect(&env.socket, "ok", "1", Behaviour::default())
        .await
        .err()
        .unwrap();
    assert!(e.contains("invalid plugin index"), "{e}");
    let _first = plugin(&env, "dup", "10", Behaviour::default()).await;
    let e = TestPlugin::connect(&env.socket, "dup", "10", Behaviour::default())
        .await
        .err()
        .unwrap();
    assert!(e.contains("already registered"), "{e}");
    // the same name at another index is another plugin
    let _other = plugin(&env, "dup", "11", Behaviour::default()).await;

    // A client that never registers is dropped after the registration timeout.
    let mut cfg = config(env._dir.path());
    cfg.socket_path = env._dir.path().join("short/nri.sock");
    cfg.plugin_registration_timeout = Duration::from_millis(200);
    let env2 = start_with(tempfile::tempdir().unwrap(), cfg, Backend::default()).await;
    let mut silent = tokio::net::UnixStream::connect(&env2.socket).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut silent, &mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "runtime closed the connection");
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_events_arrive_in_order_with_metadata() {
    let env = start().await;
    let p = plugin(&env, "test", "10", Behaviour::default()).await;
    let nri = &env.nri;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    let both = || (pd.clone(), c.clone());
    nri.run_pod_sandbox(|| pd.clone()).await.unwrap();
    nri.create_container(both).await.unwrap();
    nri.post_create_container(both).await.unwrap();
    nri.start_container(both).await.unwrap();
    nri.post_start_container(both).await.unwrap();
    let res = LinuxResources {
        cpu: Some(LinuxCpu {
            shares: Some(OptionalUInt64 { value: 512 }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let up = nri
        .update_container(|| (pd.clone(), c.clone(), res.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(up.resources.cpu.unwrap().shares.unwrap().value, 512);
    nri.post_update_container(both).await.unwrap();
    nri.update_pod_sandbox(|| (pd.clone(), None, Some(res.clone())))
        .await
        .unwrap();
    nri.post_update_pod_sandbox(|| pd.clone()).await.unwrap();
    nri.stop_container(both).await.unwrap();
    nri.stop_container(both).await.unwrap(); // once only
    nri.remove_container(both).await.unwrap();
    nri.remove_container(both).await.unwrap(); // once only
    nri.stop_pod_sandbox(|| pd.clone()).await.unwrap();
    nri.stop_pod_sandbox(|| pd.clone()).await.unwrap(); // idempotent: no second event
    nri.remove_pod_sandbox(|| pd.clone()).await.unwrap();
    nri.remove_pod_sandbox(|| pd.clone()).await.unwrap();

    let ev = p.events();
    assert_eq!(
        names(&ev),
        [
            "RunPodSandbox",
            "CreateContainer",
            "PostCreateContainer",
            "StartContainer",
            "PostStartContainer",
            "UpdateContainer",
            "PostUpdateContainer",
            "UpdatePodSandbox",
            "PostUpdatePodSandbox",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox",
        ]
    );
    let rx = p.received();
    let run = rx
        .iter()
        .find(|r| r.method == "RunPodSandbox")
        .unwrap()
        .pod
        .clone()
        .unwrap();
    assert_eq!(
        (run.name.as_str(), run.namespace.as_str(), run.uid.as_str()),
        ("p1-name", "ns", "p1-uid")
    );
    let create = rx.iter().find(|r| r.method == "CreateContainer").unwrap();
    assert_eq!(create.container.as_ref().unwrap().name, "c1-name");
    assert_eq!(create.pod_id(), "p1");
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_notification_stops_once() {
    let env = start().await;
    let p = plugin(&env, "test", "10", Behaviour::default()).await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    run_and_start(&env, &pd, &c).await;
    env.nri
        .notify_container_exit(|| (pd.clone(), c.clone()))
        .await;
    env.nri
        .stop_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    env.nri
        .remove_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    let ev = p.events();
    assert_eq!(
        names(&ev),
        [
            "RunPodSandbox",
            "CreateContainer",
            "StartContainer",
            "StopContainer",
            "RemoveContainer"
        ]
    );
}

/// The exit watcher and StopPodSandbox race to tell a container's stop:
/// the loser waits until the winner's StopContainer is answered, so that
/// StopPodSandbox never overtakes it (it did: a flaky order in the
/// daemon's NRI test).
#[tokio::test(flavor = "multi_thread")]
async fn a_stop_told_by_another_call_is_waited_for() {
    let env = start().await;
    // Below the request timeout (500 ms), or the plugin is dropped.
    const DELAY: Duration = Duration::from_millis(250);
    let behaviour = Behaviour {
        actions: [("StopContainer".to_string(), Action::Delay(DELAY))].into(),
        ..Behaviour::default()
    };
    let p = plugin(&env, "test", "10", behaviour).await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    run_and_start(&env, &pd, &c).await;
    let exit = {
        let (nri, pd, c) = (env.nri.clone(), pd.clone(), c.clone());
        tokio::spawn(async move { nri.notify_container_exit(|| (pd, c)).await })
    };
    // The exit watcher's StopContainer is at the plugin now.
    let received = Instant::now();
    while !names(&p.events()).contains(&"StopContainer") {
        assert!(received.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = Instant::now();
    env.nri
        .stop_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    let waited = seen.elapsed();
    assert!(
        exit.is_finished() || waited >= DELAY / 3,
        "returned after {waited:?}, while the other stop was still being told"
    );
    exit.await.unwrap();
    env.nri.stop_pod_sandbox(|| pd.clone()).await.unwrap();
    assert_eq!(
        names(&p.events()),
        [
            "RunPodSandbox",
            "CreateContainer",
            "StartContainer",
            "StopContainer",
            "StopPodSandbox"
        ]
    );
}

fn adjustment_a() -> ContainerAdjustment {
    ContainerAdjustment {
        env: vec![KeyValue::new("FROM_A", "1")],
        mounts: vec![Mount {
            destination: "/nri-data".into(),
            r#type: "bind".into(),
            source: "/tmp".into(),
            options: vec!["rbind".into(), "ro".into()],
        }],
        annotations: [("nri.test/a".to_string(), "yes".to_string())].into(),
        ..Default::default()
    }
}

fn adjustment_b() -> ContainerAdjustment {
    ContainerAdjustment {
        linux: Some(LinuxContainerAdjustment {
            resources: Some(LinuxResources {
                memory: Some(LinuxMemory {
                    limit: Some(OptionalInt64 { value: 64 << 20 }),
                    ..Default::default()
                }),
                cpu: Some(LinuxCpu {
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

#[tokio::test(flavor = "multi_thread")]
async fn plugins_run_in_index_order_and_adjustments_merge() {
    let env = start().await;
    // connect the later index first: order comes from the index
    let b = plugin(
        &env,
        "b",
        "20",
        Behaviour {
            adjust: Some(adjustment_b()),
            ..Default::default()
        },
    )
    .await;
    let a = plugin(
        &env,
        "a",
        "05",
        Behaviour {
            adjust: Some(adjustment_a()),
            ..Default::default()
        },
    )
    .await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    env.nri.run_pod_sandbox(|| pd.clone()).await.unwrap();
    let result = env
        .nri
        .create_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();

    let at = |p: &TestPlugin, m: &str| p.received().into_iter().find(|r| r.method == m).unwrap().at;
    assert!(at(&a, "RunPodSandbox") < at(&b, "RunPodSandbox"));
    assert!(at(&a, "CreateContainer") < at(&b, "CreateContainer"));
    // b sees the container as a adjusted it
    let seen = b
        .received()
        .into_iter()
        .find(|r| r.method == "CreateContainer")
        .unwrap()
        .container
        .unwrap();
    assert!(seen.env.contains(&"FROM_A=1".to_string()), "{:?}", seen.env);
    assert!(seen.mounts.iter().any(|m| m.destination == "/nri-data"));
    assert_eq!(
        seen.annotations.get("nri.test/a").map(String::as_str),
        Some("yes")
    );

    let adj = result.adjust.expect("adjusted");
    assert_eq!(adj.env, vec![KeyValue::new("FROM_A", "1")]);
    assert_eq!(adj.mounts.len(), 1);
    assert_eq!(
        adj.annotations.get("nri.test/a").map(String::as_str),
        Some("yes")
    );
    let res = adj.linux.as_ref().unwrap().resources.as_ref().unwrap();
    assert_eq!(res.memory.as_ref().unwrap().limit.unwrap().value, 64 << 20);
    assert_eq!(res.cpu.as_ref().unwrap().cpus, "0");

    // and it lands in an OCI spec
    let mut spec = oci_spec::runtime::Spec::default();
    crust_nri::apply_adjustment(&mut spec, &adj, Default::default()).unwrap();
    let env_vars = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env_vars.contains(&"FROM_A=1".to_string()));
    assert!(
        spec.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.destination() == Path::new("/nri-data"))
    );
    let r = spec.linux().as_ref().unwrap().resources().as_ref().unwrap();
    assert_eq!(r.memory().unwrap().limit(), Some(64 << 20));
    assert_eq!(r.cpu().as_ref().unwrap().cpus().as_deref(), Some("0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicting_plugins_fail_creation_and_undo_it() {
    let env = start().await;
    let a = plugin(
        &env,
        "a",
        "05",
        Behaviour {
            adjust: Some(adjustment_b()),
            ..Default::default()
        },
    )
    .await;
    let b = plugin(
        &env,
        "b",
        "20",
        Behaviour {
            adjust: Some(adjustment_b()),
            ..Default::default()
        },
    )
    .await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    let err = env
        .nri
        .create_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, NriError::Merge(_)), "{msg}");
    assert!(
        msg.contains(r#"plugins "20-b" and "05-a" both tried to set MemLimit"#),
        "{msg}"
    );
    for p in [&a, &b] {
        assert_eq!(
            names(&p.events()),
            ["CreateContainer", "StopContainer", "RemoveContainer"]
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_hook_fails_the_call_and_a_retry_works() {
    let env = start().await;
    let mut b = Behaviour::default();
    b.actions.insert(
        "RunPodSandbox".into(),
        Action::Fail("induced failure".into()),
    );
    let p = plugin(&env, "test", "10", b).await;
    let pd = pod("p1");
    let err = env.nri.run_pod_sandbox(|| pd.clone()).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("10-test") && msg.contains("RunPodSandbox") && msg.contains("induced failure"),
        "{msg}"
    );
    assert_eq!(
        names(&p.events()),
        ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]
    );
    assert_eq!(
        env.nri.plugins().len(),
        1,
        "an error answer does not disconnect the plugin"
    );

    p.set_behaviour(|b| b.actions.clear());
    p.clear();
    env.nri.run_pod_sandbox(|| pd.clone()).await.unwrap();
    assert_eq!(names(&p.events()), ["RunPodSandbox"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn hung_plugin_times_out_is_removed_and_does_not_wedge_later_calls() {
    let env = start().await;
    let mut b = Behaviour {
        adjust: Some(adjustment_a()),
        ..Default::default()
    };
    b.actions.insert("CreateContainer".into(), Action::Hang);
    let hung = plugin(&env, "hung", "05", b).await;
    let ok = plugin(
        &env,
        "ok",
        "10",
        Behaviour {
            adjust: Some(adjustment_b()),
            ..Default::default()
        },
    )
    .await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    let t = Instant::now();
    let result = env
        .nri
        .create_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // the hung plugin's adjustment is absent, the other's present
    let adj = result.adjust.unwrap();
    assert!(adj.env.is_empty());
    assert!(adj.linux.is_some());
    wait_gone(&env, "05-hung").await;
    tokio::time::timeout(WAIT, hung.closed())
        .await
        .expect("hung plugin disconnected");
    // later calls go straight to the healthy plugin
    let t = Instant::now();
    env.nri
        .start_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_millis(400));
    assert!(names(&ok.events()).contains(&"StartContainer"));
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_disconnecting_mid_call_is_dropped_and_the_call_goes_on() {
    let env = start().await;
    let mut b = Behaviour::default();
    b.actions
        .insert("StartContainer".into(), Action::Disconnect);
    let p = plugin(&env, "flaky", "10", b).await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    env.nri
        .create_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    let t = Instant::now();
    env.nri
        .start_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "no wait for the timeout: {:?}",
        t.elapsed()
    );
    wait_gone(&env, "10-flaky").await;
    assert!(p.is_closed());
    // and it may come back under the same name, synchronized with the
    // runtime's containers
    let mut running = c.clone();
    running.state = ContainerState::ContainerRunning as i32;
    env.backend.containers.lock().unwrap().push(running);
    let again = plugin(&env, "flaky", "10", Behaviour::default()).await;
    env.nri
        .stop_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    assert_eq!(names(&again.events()), ["StopContainer"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn unsolicited_updates_reach_the_runtime() {
    let env = start().await;
    let p = plugin(&env, "test", "10", Behaviour::default()).await;
    let update = |id: &str| ContainerUpdate {
        container_id: id.into(),
        linux: Some(LinuxContainerUpdate {
            resources: Some(LinuxResources {
                cpu: Some(LinuxCpu {
                    cpus: "1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ignore_failure: false,
    };
    let failed = p
        .update_containers(
            vec![update("c1"), update("missing-1")],
            vec![ContainerEviction {
                container_id: "c2".into(),
                reason: "test".into(),
            }],
        )
        .await
        .unwrap();
    assert_eq!(
        failed
            .iter()
            .map(|u| u.container_id.as_str())
            .collect::<Vec<_>>(),
        ["missing-1"]
    );
    let got = env.backend.updates.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0]
            .linux
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .cpu
            .as_ref()
            .unwrap()
            .cpus,
        "1"
    );
    assert_eq!(env.backend.evictions.lock().unwrap()[0].container_id, "c2");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_container_is_missed_while_a_plugin_synchronizes() {
    let env = start().await;
    let backend = env.backend.clone();
    backend.pods.lock().unwrap().push(SnapshotPod {
        pod: pod("p1"),
        ready: true,
    });
    // Synchronize takes 400 ms in this plugin; it is recorded on arrival.
    let b = Behaviour {
        sync_delay: Duration::from_millis(400),
        ..Default::default()
    };
    let late = TestPlugin::connect(&env.socket, "late", "10", b)
        .await
        .unwrap();
    late.wait_for(WAIT, |r| r.iter().any(|x| x.method == "Synchronize"))
        .await
        .unwrap();
    // A CreateContainer racing the synchronization: its block waits for it.
    let t = Instant::now();
    let block = env.nri.block_plugin_sync().await;
    let waited = t.elapsed();
    let c = ctr("c-during", "p1");
    env.nri
        .create_container(|| (pod("p1"), c.clone()))
        .await
        .unwrap();
    backend.containers.lock().unwrap().push(c);
    drop(block);
    let sync = late.wait_synchronized(WAIT).await.unwrap();
    let in_sync = sync.containers.iter().any(|c| c.id == "c-during");
    let as_event = late
        .events()
        .iter()
        .any(|e| e.0 == "CreateContainer" && e.2 == "c-during");
    assert!(in_sync || as_event, "container lost (waited {waited:?})");
    assert!(
        as_event,
        "the creation waited for the synchronization and was delivered as an event"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn large_state_is_synchronized_in_split_messages() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let backend = Backend::default();
    backend.pods.lock().unwrap().push(SnapshotPod {
        pod: pod("p1"),
        ready: true,
    });
    let big = "x".repeat(4096);
    for i in 0..1500 {
        let mut c = ctr(&format!("c{i}"), "p1");
        c.annotations.insert("big".into(), big.clone());
        backend.containers.lock().unwrap().push(c);
    }
    let env = start_with(dir, cfg, backend).await;
    let p = plugin(&env, "test", "10", Behaviour::default()).await;
    let messages = p
        .received()
        .iter()
        .filter(|r| r.method == "Synchronize")
        .count();
    assert!(messages >= 2, "{messages} messages");
    let all = p.wait_synchronized(WAIT).await.unwrap();
    assert_eq!(all.containers.len(), 1500);
    assert_eq!(all.pods.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn older_plugins_get_state_change_and_validators_can_reject() {
    let env = start().await;
    let mut b = Behaviour::default();
    b.actions
        .insert("StartContainer".into(), Action::Unimplemented);
    let old = plugin(&env, "old", "10", b).await;
    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    env.nri
        .create_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    env.nri
        .start_container(|| (pd.clone(), c.clone()))
        .await
        .unwrap();
    let sc = old
        .received()
        .into_iter()
        .find(|r| r.method == "StateChange")
        .expect("StateChange");
    assert_eq!(sc.state_change, Some(Event::StartContainer));
    assert_eq!(sc.container_id(), "c1");

    let _v = plugin(
        &env,
        "validator",
        "90",
        Behaviour {
            events: vec![Event::ValidateContainerAdjustment],
            reject: Some("no env for you".into()),
            ..Default::default()
        },
    )
    .await;
    old.set_behaviour(|b| b.adjust = Some(adjustment_a()));
    let err = env
        .nri
        .create_container(|| (pd.clone(), ctr("c2", "p1")))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("90-validator") && err.to_string().contains("no env for you"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_plugins_or_enabled_nri_calls_do_nothing() {
    let disabled = Nri::disabled();
    let never = || -> PodSandbox { panic!("request built without a plugin") };
    disabled.run_pod_sandbox(never).await.unwrap();
    let _block = disabled.block_plugin_sync().await;
    assert!(disabled.plugins().is_empty());

    let env = start().await;
    env.nri.run_pod_sandbox(never).await.unwrap();
    let r = env
        .nri
        .create_container(|| -> (PodSandbox, Container) { panic!("built") })
        .await
        .unwrap();
    assert_eq!(r, Default::default());
    // a plugin subscribed only to CreateContainer: other events build nothing
    let _p = plugin(
        &env,
        "narrow",
        "10",
        Behaviour {
            events: vec![Event::CreateContainer],
            ..Default::default()
        },
    )
    .await;
    env.nri
        .post_start_container(|| -> (PodSandbox, Container) { panic!("built") })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn socket_is_replaced_when_stale_and_refused_when_in_use() {
    let env = start().await;
    // a second server on the same live socket is refused
    let dir2 = tempfile::tempdir().unwrap();
    let mut cfg = config(dir2.path());
    cfg.socket_path = env.socket.clone();
    let err = Nri::start(
        cfg.clone(),
        RuntimeInfo {
            name: "x".into(),
            version: "y".into(),
        },
        Arc::new(Backend::default()),
    )
    .await
    .err()
    .expect("refused");
    assert!(matches!(err, NriError::SocketInUse { .. }), "{err}");
    // a stale socket (nobody listening) is replaced
    let stale_dir = tempfile::tempdir().unwrap();
    let stale = stale_dir.path().join("nri.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    cfg.socket_path = stale.clone();
    let nri = Nri::start(
        cfg,
        RuntimeInfo {
            name: "x".into(),
            version: "y".into(),
        },
        Arc::new(Backend::default()),
    )
    .await
    .unwrap();
    let p = TestPlugin::connect(&stale, "t", "10", Behaviour::default())
        .await
        .unwrap();
    p.wait_synchronized(WAIT).await.unwrap();
    nri.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn preinstalled_plugin_is_started_from_plugin_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.disable_connections = true;
    std::fs::create_dir_all(&cfg.plugin_path).unwrap();
    std::fs::create_dir_all(&cfg.plugin_config_path).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_nri-test-plugin"),
        cfg.plugin_path.join("30-pre"),
    )
    .unwrap();
    // not executable, and badly named: both ignored
    std::fs::write(cfg.plugin_path.join("README"), "x").unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_nri-test-plugin"),
        cfg.plugin_path.join("pre"),
    )
    .unwrap();
    let log = dir.path().join("pre.log");
    let conf = serde_json::json!({"log_file": log, "adjust_env": {"PREINSTALLED": "yes"}});
    std::fs::write(cfg.plugin_config_path.join("30-pre.conf"), conf.to_string()).unwrap();

    let env = start_with(dir, cfg.clone(), Backend::default()).await;
    assert!(!cfg.socket_path.exists(), "disable_connections: no socket");
    let listed = env.nri.plugins();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name, "30-pre");
    assert!(!listed[0].external);
    let pid = listed[0].pid.expect("peer pid");

    let (pd, c) = (pod("p1"), ctr("c1", "p1"));
    let r = env.nri.create_container(|| (pd, c)).await.unwrap();
    assert_eq!(
        r.adjust.unwrap().env,
        vec![KeyValue::new("PREINSTALLED", "yes")]
    );
    let lines = std::fs::read_to_string(&log).unwrap();
    let methods: Vec<&str> = lines
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(methods, ["Configure", "Synchronize", "CreateContainer"]);

    env.nri.shutdown().await;
    let deadline = Instant::now() + WAIT;
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            Instant::now() < deadline,
            "pre-installed plugin {pid} still running"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = HashMap::<(), ()>::new();
}
