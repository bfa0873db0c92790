//! The container life-cycle rules, through the fake node (no root): states
//! and transitions, idempotence, name reuse, the undo of a failed create,
//! exits seen without asking, and what recovery decides.

use std::time::Duration;

use crust_api::v1::{LinuxContainerResources, NamespaceMode};
use crust_shim_protocol::ExecSyncOutput;

use super::{ContainerError, ContainerRecord, ContainerState};
use crate::events::EventKind;
use crate::fakes::{Effect, IMAGE_ID, Op, Rig, container_config};

fn kill(signal: i32, all: bool) -> impl Fn(&Effect) -> bool {
    move |e| matches!(e, Effect::Kill { signal: s, all: a, .. } if *s == signal && *a == all)
}

/// Waits (a little) until `f` holds of the container's listed record.
async fn eventually(rig: &Rig, id: &str, f: impl Fn(&ContainerRecord) -> bool) -> ContainerRecord {
    for _ in 0..200 {
        if let Some(r) = rig.containers.list().into_iter().find(|r| r.id == id)
            && f(&r)
        {
            return ContainerRecord::clone(&r);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "the container never got there: {:?}",
        rig.containers.get(id)
    );
}

#[tokio::test]
async fn a_container_walks_created_running_exited_removed() {
    let rig = Rig::new().await;
    let mut events = rig.containers.events().subscribe();
    let (pod, id) = rig.pod_and_container("app").await;
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Created);
    assert_eq!(
        (rec.pod_id.as_str(), rec.image_id.as_str()),
        (pod.as_str(), IMAGE_ID)
    );
    assert!(rec.pid > 0, "the init's pid comes from the launch");
    assert_eq!(rig.images.leases()[&id], IMAGE_ID);

    rig.lifecycle.start_container(&id).await.unwrap();
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Running);
    assert!(rec.started_at > 0);

    rig.lifecycle.stop_container(&id, 10).await.unwrap();
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Exited);
    assert_eq!(rec.exit_code, 128 + libc::SIGTERM);
    let stored: Vec<ContainerRecord> = rig.stored();
    assert_eq!(
        stored[0].state,
        ContainerState::Exited,
        "the exit is stored"
    );

    rig.lifecycle.remove_container(&id).await.unwrap();
    assert!(matches!(
        rig.containers.get(&id),
        Err(ContainerError::NotFound(_))
    ));
    assert!(rig.stored::<ContainerRecord>().is_empty());
    assert!(rig.images.leases().is_empty());
    assert!(
        rig.container_host.node().is_clean(),
        "{:?}",
        rig.container_host.node()
    );

    let mut kinds = Vec::new();
    while let Ok(ev) = events.try_recv() {
        assert_eq!(ev.container_id, id);
        kinds.push(ev.kind);
    }
    use EventKind::*;
    assert_eq!(kinds, [Created, Started, Stopped, Deleted]);
}

#[tokio::test]
async fn create_launches_one_bundle_with_the_logs_in_the_pod_log_dir() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    let launches = rig.container_host.launches();
    assert_eq!(launches.len(), 1);
    let l = &launches[0];
    assert_eq!(l.id, id);
    assert!(l.keep_spec, "a container keeps its spec for verbose status");
    assert_eq!(
        l.log_path.as_deref(),
        Some(std::path::Path::new("/var/log/pods/web/app/0.log"))
    );
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(l.bundle, rec.bundle);
    assert_eq!(
        l.spec.root().as_ref().map(|r| r.path().clone()),
        Some(rec.rootfs.clone())
    );
    // The rootfs was mounted before the monitor was launched.
    let j = &rig.journal;
    let mounted = j
        .position(|e| matches!(e, Effect::PrepareRootfs(_)))
        .unwrap();
    let launched = j.position(|e| matches!(e, Effect::Launch(_))).unwrap();
    assert!(j.position(|e| matches!(e, Effect::Lease(_))).unwrap() < mounted);
    assert!(mounted < launched);
}

#[tokio::test]
async fn a_name_and_attempt_is_taken_until_its_container_is_removed() {
    let rig = Rig::new().await;
    let (pod, first) = rig.pod_and_container("app").await;
    let again = || container_config("app", |_| {});
    match rig.lifecycle.create_container(&pod, Some(again())).await {
        Err(ContainerError::AlreadyExists(m)) => assert!(m.contains(&first), "{m}"),
        other => panic!("{other:?}"),
    }
    let retry = container_config("app", |c| c.metadata.as_mut().unwrap().attempt = 1);
    rig.lifecycle
        .create_container(&pod, Some(retry))
        .await
        .unwrap();
    // Exited is not removed: still taken.
    rig.lifecycle.stop_container(&first, 0).await.unwrap();
    assert!(matches!(
        rig.lifecycle.create_container(&pod, Some(again())).await,
        Err(ContainerError::AlreadyExists(_))
    ));
    rig.lifecycle.remove_container(&first).await.unwrap();
    rig.lifecycle
        .create_container(&pod, Some(again()))
        .await
        .unwrap();
}

/// Each step of CreateContainer failing: what was done is undone (mount,
/// dirs, monitor, lease, record) and the name is free again.
#[tokio::test]
async fn a_failed_create_undoes_what_it_did_and_frees_the_name() {
    for op in [Op::Lease, Op::PrepareRootfs, Op::Launch] {
        let rig = Rig::new().await;
        let pod = rig.run_pod("web").await.unwrap();
        if op == Op::Lease {
            rig.images.fail(op);
        } else {
            rig.container_host.fail(op);
        }
        let config = || Some(container_config("app", |_| {}));
        let err = rig
            .lifecycle
            .create_container(&pod, config())
            .await
            .unwrap_err();
        match op {
            Op::Lease => assert!(matches!(err, ContainerError::NotFound(_)), "{err:?}"),
            _ => assert!(
                matches!(err, ContainerError::Internal(_)),
                "{op:?}: {err:?}"
            ),
        }
        let node = rig.container_host.node();
        assert!(node.is_clean(), "{op:?} left {node:?}");
        assert!(rig.images.leases().is_empty(), "{op:?}");
        assert!(rig.stored::<ContainerRecord>().is_empty(), "{op:?}");
        assert!(rig.containers.list().is_empty(), "{op:?}");
        let j = &rig.journal;
        if op == Op::Lease {
            assert_eq!(j.count(|e| matches!(e, Effect::PrepareRootfs(_))), 0);
        } else {
            // The mount goes before the dirs under it.
            assert!(
                j.position(|e| matches!(e, Effect::UnmountRootfs(_)))
                    .is_some()
            );
        }
        rig.container_host.heal(op);
        if op != Op::Lease {
            rig.lifecycle
                .create_container(&pod, config())
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn a_failed_undo_keeps_the_record_for_the_next_start() {
    let rig = Rig::new().await;
    let pod = rig.run_pod("web").await.unwrap();
    rig.container_host.fail(Op::Launch);
    rig.container_host.fail(Op::UnmountRootfs);
    let config = || Some(container_config("app", |_| {}));
    assert!(
        rig.lifecycle
            .create_container(&pod, config())
            .await
            .is_err()
    );
    // Nothing visible, the name free, but the record says what to undo.
    assert!(rig.containers.list().is_empty());
    let stored: Vec<ContainerRecord> = rig.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].state, ContainerState::Creating);

    rig.container_host.heal(Op::Launch);
    rig.container_host.heal(Op::UnmountRootfs);
    let rig = rig.restart().await;
    assert!(rig.stored::<ContainerRecord>().is_empty());
    assert!(
        rig.container_host.node().is_clean(),
        "{:?}",
        rig.container_host.node()
    );
    assert!(rig.images.leases().is_empty());
}

#[tokio::test]
async fn create_needs_a_ready_pod_a_known_image_and_handler() {
    let rig = Rig::new().await;
    let pod = rig.run_pod("web").await.unwrap();
    let unknown_image =
        container_config("app", |c| c.image.as_mut().unwrap().image = "nope".into());
    match rig
        .lifecycle
        .create_container(&pod, Some(unknown_image))
        .await
    {
        Err(ContainerError::NotFound(m)) => assert!(m.contains("nope"), "{m}"),
        other => panic!("{other:?}"),
    }
    rig.lifecycle.stop_pod(&pod).await.unwrap();
    let err = rig
        .lifecycle
        .create_container(&pod, Some(container_config("app", |_| {})))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ContainerError::FailedPrecondition(_)),
        "{err:?}"
    );
    assert!(rig.container_host.node().is_clean());
    assert!(rig.images.leases().is_empty());
}

#[tokio::test]
async fn start_only_starts_a_created_container() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    rig.lifecycle.start_container(&id).await.unwrap();
    let again = rig.lifecycle.start_container(&id).await.unwrap_err();
    assert!(
        matches!(again, ContainerError::FailedPrecondition(_)),
        "{again:?}"
    );
    let unknown = rig.lifecycle.start_container(&"e".repeat(64)).await;
    assert!(matches!(unknown, Err(ContainerError::NotFound(_))));
    let empty = rig.lifecycle.start_container("").await;
    assert!(matches!(empty, Err(ContainerError::InvalidArgument(_))));
}

#[tokio::test]
async fn a_container_that_cannot_start_shows_as_exited() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    rig.container_host.fail(Op::Start);
    let err = rig.lifecycle.start_container(&id).await.unwrap_err();
    assert!(matches!(err, ContainerError::Internal(_)), "{err:?}");
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Exited);
    assert_eq!((rec.exit_code, rec.reason.as_str()), (128, "StartError"));
    assert_eq!(rig.stored::<ContainerRecord>()[0].reason, "StartError");
}

/// The daemon died after the monitor started the process but before the
/// record said so (issue 17: the container stayed CREATED while it ran,
/// and a retried start marked it EXITED while it kept running).
#[tokio::test]
async fn a_start_the_record_missed_is_found_at_the_monitor_after_a_restart() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    let rig = rig.restart_with(|node| node.run(&id)).await;
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Running);
    assert!(rec.started_at > 0);
    assert_eq!(
        rig.stored::<ContainerRecord>()[0].state,
        ContainerState::Running
    );
    let again = rig.lifecycle.start_container(&id).await.unwrap_err();
    assert!(
        matches!(again, ContainerError::FailedPrecondition(_)),
        "{again:?}"
    );
    assert_eq!(
        rig.containers.get(&id).unwrap().state,
        ContainerState::Running
    );
}

/// StartContainer writes no record before it asks the monitor (an fsync
/// less): a start the record missed takes its time from the monitor.
#[tokio::test]
async fn a_start_the_record_missed_takes_the_monitors_start_time() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    let at = 1_700_000_000_123_456_789;
    let rig = rig.restart_with(|node| node.run_since(&id, at)).await;
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!((rec.state, rec.started_at), (ContainerState::Running, at));
    assert_eq!(rig.stored::<ContainerRecord>()[0].started_at, at);
}

/// A start retried after one that reached the monitor (the record never
/// learnt of it) asks the monitor, and succeeds.
#[tokio::test]
async fn a_retried_start_of_a_running_process_succeeds() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    rig.container_host.run(&id);
    rig.lifecycle.start_container(&id).await.unwrap();
    let rec = rig.containers.get(&id).unwrap();
    assert_eq!(rec.state, ContainerState::Running, "{rec:?}");
    assert!(rec.reason.is_empty(), "{rec:?}");
    // A container still CREATED at the monitor after a restart stays so,
    // and starts.
    let (pod, _) = (rig.pods.list(&Default::default())[0].id.clone(), ());
    let other = rig
        .lifecycle
        .create_container(&pod, Some(container_config("other", |_| {})))
        .await
        .unwrap();
    let rig = rig.restart().await;
    assert_eq!(
        rig.containers.get(&other).unwrap().state,
        ContainerState::Created
    );
    rig.lifecycle.start_container(&other).await.unwrap();
    assert_eq!(
        rig.containers.get(&other).unwrap().state,
        ContainerState::Running
    );
}

#[tokio::test]
async fn stop_and_remove_are_idempotent_also_for_unknown_ids() {
    let rig = Rig::new().await;
    let unknown = "d".repeat(64);
    rig.lifecycle.stop_container(&unknown, 10).await.unwrap();
    rig.lifecycle.remove_container(&unknown).await.unwrap();
    let (_, id) = rig.pod_and_container("app").await;
    rig.lifecycle.start_container(&id).await.unwrap();
    rig.lifecycle.stop_container(&id, 0).await.unwrap();
    let kills = || rig.journal.count(|e| matches!(e, Effect::Kill { .. }));
    let after_first = kills();
    assert!(after_first > 0);
    rig.lifecycle.stop_container(&id, 0).await.unwrap();
    assert_eq!(kills(), after_first, "an exited container is not signalled");
    rig.lifecycle.remove_container(&id).await.unwrap();
    rig.lifecycle.remove_container(&id).await.unwrap();
    let j = &rig.journal;
    assert_eq!(j.count(|e| matches!(e, Effect::Release(_))), 1);
    assert_eq!(j.count(|e| matches!(e, Effect::UnmountRootfs(_))), 1);
}

#[tokio::test(start_paused = true)]
async fn stop_sends_the_stop_signal_then_sigkill_after_the_grace_period() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    rig.lifecycle.start_container(&id).await.unwrap();
    rig.container_host.ignore_stop_signal(&id);
    let started = tokio::time::Instant::now();
    rig.lifecycle.stop_container(&id, 30).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(30),
        "the grace period is waited"
    );
    let j = &rig.journal;
    let term = j.position(kill(libc::SIGTERM, false)).unwrap();
    let killed = j.position(kill(libc::SIGKILL, true)).unwrap();
    assert!(term < killed);
    assert_eq!(
        rig.containers.get(&id).unwrap().exit_code,
        128 + libc::SIGKILL
    );
}

#[tokio::test]
async fn stop_with_timeout_zero_or_of_a_created_container_is_sigkill_at_once() {
    let rig = Rig::new().await;
    let (pod, created) = rig.pod_and_container("created").await;
    rig.lifecycle.stop_container(&created, 30).await.unwrap();
    let running = rig
        .lifecycle
        .create_container(&pod, Some(container_config("running", |_| {})))
        .await
        .unwrap();
    rig.lifecycle.start_container(&running).await.unwrap();
    rig.lifecycle.stop_container(&running, 0).await.unwrap();
    let j = &rig.journal;
    assert_eq!(j.count(kill(libc::SIGTERM, false)), 0);
    assert_eq!(j.count(kill(libc::SIGKILL, false)), 2);
    for id in [created, running] {
        assert_eq!(
            rig.containers.get(&id).unwrap().state,
            ContainerState::Exited
        );
    }
}

#[tokio::test]
async fn an_exit_is_seen_without_anyone_asking() {
    let rig = Rig::new().await;
    let mut events = rig.containers.events().subscribe();
    let (_, id) = rig.pod_and_container("app").await;
    rig.lifecycle.start_container(&id).await.unwrap();
    rig.container_host.exit(&id, 3);
    // Listing reads no exit file: the watcher updated the record.
    let rec = eventually(&rig, &id, |r| r.state == ContainerState::Exited).await;
    assert_eq!((rec.exit_code, rec.reason.as_str()), (3, "Error"));
    let kinds: Vec<EventKind> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds.last(), Some(&EventKind::Stopped));
    assert_eq!(
        kinds.iter().filter(|k| **k == EventKind::Stopped).count(),
        1
    );
}

#[tokio::test]
async fn a_lost_monitor_ends_its_container_with_an_unknown_status() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    rig.lifecycle.start_container(&id).await.unwrap();
    rig.container_host.lose_monitor(&id);
    let rec = eventually(&rig, &id, |r| r.state == ContainerState::Exited).await;
    assert_eq!(rec.exit_code, 255);
    assert!(rec.message.contains("monitor is gone"), "{}", rec.message);
    // What is left in its cgroup is killed.
    assert_eq!(
        rig.journal.count(|e| *e == Effect::KillOrphan(id.clone())),
        1
    );
}

#[tokio::test]
async fn exec_sync_runs_only_in_a_running_container() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    let cmd = || vec!["true".to_string()];
    let created = rig.containers.exec_sync(&id, cmd(), 5).await.unwrap_err();
    assert!(
        matches!(created, ContainerError::FailedPrecondition(_)),
        "{created:?}"
    );
    rig.lifecycle.start_container(&id).await.unwrap();
    rig.container_host.set_exec_output(ExecSyncOutput {
        exit_code: 7,
        timed_out: false,
        stdout: b"out".to_vec(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
    });
    let out = rig.containers.exec_sync(&id, cmd(), 5).await.unwrap();
    assert_eq!((out.exit_code, out.stdout.as_slice()), (7, &b"out"[..]));
    let empty = rig.containers.exec_sync(&id, Vec::new(), 5).await;
    assert!(matches!(empty, Err(ContainerError::InvalidArgument(_))));
    rig.container_host.set_exec_output(ExecSyncOutput {
        exit_code: -1,
        timed_out: true,
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
    });
    let late = rig.containers.exec_sync(&id, cmd(), 5).await.unwrap_err();
    assert!(
        matches!(late, ContainerError::DeadlineExceeded(_)),
        "{late:?}"
    );
}

#[tokio::test]
async fn resource_updates_apply_live_and_are_recorded() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    rig.lifecycle.start_container(&id).await.unwrap();
    let res = LinuxContainerResources {
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    rig.lifecycle
        .update_container(&id, Some(res.clone()))
        .await
        .unwrap();
    assert_eq!(rig.journal.count(|e| *e == Effect::Update(id.clone())), 1);
    assert_eq!(
        rig.containers.get(&id).unwrap().resources(),
        Some(res.clone())
    );
    assert_eq!(
        rig.stored::<ContainerRecord>()[0].resources(),
        Some(res.clone())
    );
    // cgroup v2 only fields on this (v1) node: refused, nothing applied.
    let unified = LinuxContainerResources {
        unified: [("memory.high".to_string(), "1M".to_string())].into(),
        ..Default::default()
    };
    let err = rig
        .lifecycle
        .update_container(&id, Some(unified))
        .await
        .unwrap_err();
    assert!(matches!(err, ContainerError::InvalidArgument(m) if m.starts_with("linux.unified")));

    // A later update merges into what is set: the memory limit stays, the
    // CPU fields join it, and what goes to the runtime is the whole set.
    let cpu = LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 20_000,
        oom_score_adj: 700,
        ..Default::default()
    };
    rig.lifecycle
        .update_container(&id, Some(cpu))
        .await
        .unwrap();
    let now = rig.containers.get(&id).unwrap().resources().unwrap();
    assert_eq!(
        (
            now.memory_limit_in_bytes,
            now.cpu_quota,
            now.cpu_period,
            now.oom_score_adj
        ),
        (64 << 20, 20_000, 100_000, 700)
    );
    let (_, oci) = rig.container_host.updates().pop().unwrap();
    assert_eq!(oci["memory"]["limit"].as_i64(), Some(64 << 20), "{oci}");
    assert_eq!(oci["cpu"]["quota"].as_i64(), Some(20_000), "{oci}");
    // oom_score_adj is the daemon's to set (runtimes' update has none).
    assert_eq!(
        rig.journal.count(|e| *e
            == Effect::OomScoreAdj {
                id: id.clone(),
                value: 700
            }),
        1
    );

    // Bad values are refused naming the field; nothing is applied or kept.
    let updates = rig.container_host.updates().len();
    for (bad, field) in [
        (
            LinuxContainerResources {
                cpu_quota: -7,
                ..Default::default()
            },
            "linux.cpu_quota",
        ),
        (
            LinuxContainerResources {
                oom_score_adj: 2000,
                ..Default::default()
            },
            "linux.oom_score_adj",
        ),
        (
            LinuxContainerResources {
                memory_swap_limit_in_bytes: 1 << 20,
                ..Default::default()
            },
            "linux.memory_swap_limit_in_bytes",
        ),
    ] {
        let err = rig
            .lifecycle
            .update_container(&id, Some(bad))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ContainerError::InvalidArgument(m) if m.starts_with(field)),
            "{err}"
        );
    }
    assert_eq!(rig.container_host.updates().len(), updates);
    assert_eq!(rig.containers.get(&id).unwrap().resources().unwrap(), now);
    rig.lifecycle.stop_container(&id, 0).await.unwrap();
    let exited = rig
        .lifecycle
        .update_container(&id, Some(res))
        .await
        .unwrap_err();
    assert!(matches!(exited, ContainerError::FailedPrecondition(_)));
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::Update(_))), 2);
}

#[tokio::test]
async fn pid_mode_target_needs_a_running_container_of_the_same_pod() {
    let rig = Rig::new().await;
    let (pod, target) = rig.pod_and_container("target").await;
    let joining = |name: &str, target: &str| {
        let target = target.to_string();
        container_config(name, move |c| {
            let sc = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
            let ns = sc.namespace_options.as_mut().unwrap();
            ns.pid = NamespaceMode::Target as i32;
            ns.target_id = target;
        })
    };
    let not_running = rig
        .lifecycle
        .create_container(&pod, Some(joining("a", &target)))
        .await
        .unwrap_err();
    assert!(
        matches!(not_running, ContainerError::FailedPrecondition(_)),
        "{not_running:?}"
    );
    let unknown = rig
        .lifecycle
        .create_container(&pod, Some(joining("b", "nope")))
        .await
        .unwrap_err();
    assert!(
        matches!(&unknown, ContainerError::NotFound(m) if m.contains("target_id")),
        "{unknown:?}"
    );
    rig.lifecycle.start_container(&target).await.unwrap();
    let pid = rig.containers.get(&target).unwrap().pid;
    let id = rig
        .lifecycle
        .create_container(&pod, Some(joining("c", &target)))
        .await
        .unwrap();
    let launch = rig
        .container_host
        .launches()
        .into_iter()
        .find(|l| l.id == id)
        .unwrap();
    let namespaces = launch
        .spec
        .linux()
        .as_ref()
        .unwrap()
        .namespaces()
        .clone()
        .unwrap();
    let want = std::path::PathBuf::from(format!("/proc/{pid}/ns/pid"));
    assert!(
        namespaces.iter().any(|n| n.path().as_ref() == Some(&want)),
        "{namespaces:?}"
    );
}

#[tokio::test]
async fn recovery_undoes_a_creating_container_and_releases_its_lease() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    // As if the daemon died in the middle of CreateContainer.
    let mut rec = rig.containers.get(&id).unwrap();
    rec.state = ContainerState::Creating;
    rig.store.put(&rec).unwrap();
    let rig = rig.restart().await;
    assert!(matches!(
        rig.containers.get(&id),
        Err(ContainerError::NotFound(_))
    ));
    assert!(rig.stored::<ContainerRecord>().is_empty());
    assert!(rig.images.leases().is_empty());
    assert!(
        rig.container_host.node().is_clean(),
        "{:?}",
        rig.container_host.node()
    );
}

#[tokio::test]
async fn recovery_keeps_live_containers_and_reads_the_exits_it_missed() {
    let rig = Rig::new().await;
    let (pod, live) = rig.pod_and_container("live").await;
    let mut ids = vec![live.clone()];
    for name in ["exited", "lost"] {
        let id = rig
            .lifecycle
            .create_container(&pod, Some(container_config(name, |_| {})))
            .await
            .unwrap();
        ids.push(id);
    }
    for id in &ids {
        rig.lifecycle.start_container(id).await.unwrap();
    }
    let (exits, loses) = (ids[1].clone(), ids[2].clone());
    let rig = rig
        .restart_with(|node| {
            node.exit(&exits, 0);
            node.lose_monitor(&loses);
        })
        .await;
    let orphans = rig
        .journal
        .count(|e| *e == Effect::KillOrphan(loses.clone()));
    assert_eq!(orphans, 1, "what is left of the lost one is killed");
    rig.journal.clear();

    let live_rec = rig.containers.get(&ids[0]).unwrap();
    assert_eq!(
        live_rec.state,
        ContainerState::Running,
        "a live monitor is kept"
    );
    assert_eq!(
        rig.journal
            .count(|e| matches!(e, Effect::Kill { .. } | Effect::ReapMonitor(_))),
        0
    );
    let exited = rig.containers.get(&ids[1]).unwrap();
    assert_eq!(
        (exited.state, exited.exit_code),
        (ContainerState::Exited, 0)
    );
    assert_eq!(exited.reason, "Completed");
    let lost = rig.containers.get(&ids[2]).unwrap();
    assert_eq!((lost.state, lost.exit_code), (ContainerState::Exited, 255));
    // The recovered container is watched again.
    rig.container_host.exit(&ids[0], 9);
    eventually(&rig, &ids[0], |r| r.exit_code == 9).await;
}

#[tokio::test]
async fn leases_of_containers_the_daemon_does_not_know_are_released_at_start() {
    let rig = Rig::new().await;
    let (_, id) = rig.pod_and_container("app").await;
    let stray = "c".repeat(64);
    rig.images.add_lease(&stray, IMAGE_ID);
    let rig = rig.restart().await;
    let leases = rig.images.leases();
    assert!(!leases.contains_key(&stray), "{leases:?}");
    assert!(
        leases.contains_key(&id),
        "a known container keeps its lease"
    );
}

/// The record keeps what the container reports of its image; records of
/// older daemons (no `reported_image`, the ID under `image_ref`) still load
/// and report what those daemons reported.
#[tokio::test]
async fn the_reported_image_is_stored_and_old_records_fall_back() {
    let rig = Rig::new().await;
    let pod = rig.run_pod("web").await.unwrap();
    let config = container_config("app", |c| {
        c.image.as_mut().unwrap().user_specified_image = "example.com/app:1".into();
    });
    let id = rig
        .lifecycle
        .create_container(&pod, Some(config))
        .await
        .unwrap();
    let stored: Vec<ContainerRecord> = rig.stored();
    let rec = stored.into_iter().find(|r| r.id == id).unwrap();
    let reported = rec.reported_image.clone().expect("stored at creation");
    assert_eq!(reported.name, "example.com/app:1");
    // The fake image has no repo digest: the ID.
    assert_eq!(reported.image_ref, IMAGE_ID);

    let mut json = serde_json::to_value(&rec).unwrap();
    assert_eq!(json["image_ref"], IMAGE_ID, "the ID keeps its stored name");
    json.as_object_mut().unwrap().remove("reported_image");
    let old: ContainerRecord = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(old.reported_image, None);
    assert_eq!(old.reported_image(), reported);
    // Older still: no image_request either (the config is decoded).
    json.as_object_mut().unwrap().remove("image_request");
    let older: ContainerRecord = serde_json::from_value(json).unwrap();
    assert_eq!(older.reported_image(), reported);
}
