//! The pod life-cycle rules, through the fake node (no root): what run,
//! stop and remove do and undo, in which order, and what recovery decides.

use crust_api::v1::NamespaceMode;

use super::{ListFilter, PodError, PodRecord, PodState};
use crate::fakes::{Effect, Op, Rig, pod_spec};

fn is_cni_del(e: &Effect) -> bool {
    matches!(e, Effect::CniDel(_))
}

#[tokio::test]
async fn a_pod_is_set_up_in_order_then_ready() {
    let rig = Rig::new().await;
    let id = rig.run_pod("web").await.unwrap();
    let rec = rig.pods.get(&id).unwrap();
    assert_eq!(rec.state, PodState::Ready);
    assert_eq!(rec.ips(), ["10.88.0.7"]);

    let node = rig.pod_host.node();
    assert_eq!(node.pins.len(), 3, "net, ipc and uts: {:?}", node.pins);
    assert!(node.cgroups.contains(&rec.cgroup_path));
    assert!(node.shm.contains(rec.shm.as_ref().unwrap()));
    assert!(node.attached.contains(&id));
    // No hostname in the config: the node's.
    assert_eq!(node.files[&rec.hostname_path], "fake-node\n");
    assert_eq!(node.files[&rec.resolv_conf_path], "nameserver 192.0.2.53\n");
    // /etc/hosts is rewritten with the pod's IP once CNI gave it one.
    assert!(node.files[&rec.hosts_path].ends_with("10.88.0.7\tfake-node\n"));

    let j = &rig.journal;
    let pinned = j
        .position(|e| matches!(e, Effect::PinNamespaces(_)))
        .unwrap();
    let added = j.position(|e| matches!(e, Effect::CniAdd(_))).unwrap();
    let hosts_rewritten = j
        .effects()
        .iter()
        .rposition(|e| *e == Effect::WriteFile(rec.hosts_path.clone()))
        .unwrap();
    assert!(pinned < added, "CNI ADD needs the pinned netns");
    assert!(added < hosts_rewritten);
    // The stored record says ready, as the index does.
    let stored: Vec<PodRecord> = rig.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].state, PodState::Ready);
}

#[tokio::test]
async fn a_name_is_taken_until_its_pod_is_removed() {
    let rig = Rig::new().await;
    let first = rig.run_pod("web").await.unwrap();
    match rig.run_pod("web").await {
        Err(PodError::AlreadyExists(m)) => assert!(m.contains(&first), "{m}"),
        other => panic!("{other:?}"),
    }
    // Another attempt is another name.
    let retry = pod_spec("web", |c| c.metadata.as_mut().unwrap().attempt = 1);
    rig.lifecycle.run_pod(retry).await.unwrap();
    // Stopped is not removed: still taken.
    rig.lifecycle.stop_pod(&first).await.unwrap();
    assert!(matches!(
        rig.run_pod("web").await,
        Err(PodError::AlreadyExists(_))
    ));
    rig.lifecycle.remove_pod(&first).await.unwrap();
    rig.run_pod("web").await.unwrap();
}

/// Each step of RunPodSandbox failing: everything done is undone, the
/// record is gone and the name is free again.
#[tokio::test]
async fn a_failed_run_undoes_everything_and_frees_the_name() {
    for op in [
        Op::PinNamespaces,
        Op::CreateCgroup,
        Op::WriteFile,
        Op::StartPause,
        Op::CniAdd,
        Op::CniAddNoIp,
    ] {
        let rig = Rig::new().await;
        rig.pod_host.fail(op);
        // A shared PID namespace, so that the pause process is started.
        let spec = pod_spec("web", |c| {
            let opts = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
            opts.namespace_options.as_mut().unwrap().pid = NamespaceMode::Pod as i32;
        });
        let err = rig.lifecycle.run_pod(spec.clone()).await.unwrap_err();
        assert!(matches!(err, PodError::Internal(_)), "{op:?}: {err:?}");
        assert!(
            rig.pod_host.node().is_empty(),
            "{op:?} left {:?}",
            rig.pod_host.node()
        );
        assert!(rig.stored::<PodRecord>().is_empty(), "{op:?}");
        assert!(rig.pods.list(&ListFilter::default()).is_empty(), "{op:?}");
        // A DEL is owed only once ADD succeeded (a failed ADD undoes
        // itself); ADD runs alongside the cgroup, files and pause steps,
        // so it has succeeded when one of those fails.
        let dels = rig.journal.count(is_cni_del);
        let add_succeeded = !matches!(op, Op::PinNamespaces | Op::CniAdd);
        assert_eq!(dels, usize::from(add_succeeded), "{op:?}");
        rig.pod_host.heal(op);
        rig.lifecycle.run_pod(spec).await.unwrap();
    }
}

/// CNI ADD needs only the pinned netns: it runs while the cgroup, the
/// files and the pause process are made, not after them.
#[tokio::test]
async fn cni_add_runs_alongside_the_rest_of_the_set_up() {
    let rig = Rig::new().await;
    rig.pod_host.cgroup_awaits_add();
    let id = rig.run_pod("web").await.unwrap();
    assert_eq!(rig.pods.get(&id).unwrap().state, PodState::Ready);
    let j = &rig.journal;
    let pinned = j
        .position(|e| matches!(e, Effect::PinNamespaces(_)))
        .unwrap();
    let added = j.position(|e| matches!(e, Effect::CniAdd(_))).unwrap();
    assert!(pinned < added, "CNI ADD needs the pinned netns");
}

/// Both halves failing: everything is undone, and the set-up's error is
/// the one reported.
#[tokio::test]
async fn both_halves_of_a_run_failing_undo_everything() {
    let rig = Rig::new().await;
    rig.pod_host.fail(Op::CreateCgroup);
    rig.pod_host.fail(Op::CniAdd);
    let err = rig.run_pod("web").await.unwrap_err().to_string();
    assert!(err.contains("CreateCgroup"), "{err}");
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
    assert!(rig.stored::<PodRecord>().is_empty());
    assert_eq!(
        rig.journal.count(is_cni_del),
        0,
        "a failed ADD undid itself"
    );
}

#[tokio::test]
async fn a_failed_undo_leaves_the_pod_notready_for_remove_to_retry() {
    let rig = Rig::new().await;
    rig.pod_host.fail(Op::CniAddNoIp);
    rig.pod_host.fail(Op::DeleteCgroup);
    let err = rig.run_pod("web").await.unwrap_err().to_string();
    assert!(err.contains("left NOTREADY"), "{err}");
    let pods = rig.pods.list(&ListFilter::default());
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].state, PodState::NotReady);
    assert_eq!(rig.stored::<PodRecord>()[0].state, PodState::NotReady);

    rig.pod_host.heal(Op::DeleteCgroup);
    rig.lifecycle.remove_pod(&pods[0].id).await.unwrap();
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
    assert!(rig.stored::<PodRecord>().is_empty());
}

#[tokio::test]
async fn stop_and_remove_are_idempotent_also_for_unknown_pods() {
    let rig = Rig::new().await;
    let unknown = "f".repeat(64);
    rig.lifecycle.stop_pod(&unknown).await.unwrap();
    rig.lifecycle.remove_pod(&unknown).await.unwrap();
    assert!(rig.journal.effects().is_empty());

    let id = rig.run_pod("web").await.unwrap();
    rig.lifecycle.stop_pod(&id).await.unwrap();
    rig.lifecycle.stop_pod(&id).await.unwrap();
    assert_eq!(rig.pods.get(&id).unwrap().state, PodState::NotReady);
    assert_eq!(rig.journal.count(is_cni_del), 1, "one DEL is owed, once");
    assert!(rig.pods.get(&id).unwrap().ips().is_empty());

    rig.lifecycle.remove_pod(&id).await.unwrap();
    rig.lifecycle.remove_pod(&id).await.unwrap();
    assert!(matches!(rig.pods.get(&id), Err(PodError::NotFound(_))));
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
    assert!(rig.stored::<PodRecord>().is_empty());
}

#[tokio::test]
async fn a_failed_cni_del_is_retried_by_the_next_stop() {
    let rig = Rig::new().await;
    let id = rig.run_pod("web").await.unwrap();
    rig.pod_host.fail(Op::CniDel);
    assert!(rig.lifecycle.stop_pod(&id).await.is_err());
    let rec = rig.pods.get(&id).unwrap();
    assert_eq!(rec.state, PodState::NotReady);
    assert!(rec.network_attached(), "the DEL is still owed");
    assert!(rig.stored::<PodRecord>()[0].network_attached());

    rig.pod_host.heal(Op::CniDel);
    rig.lifecycle.stop_pod(&id).await.unwrap();
    assert!(!rig.pods.get(&id).unwrap().network_attached());
    assert_eq!(rig.journal.count(is_cni_del), 2);
    assert!(rig.pod_host.node().attached.is_empty());
}

/// Only the DEL of a ready pod's stop, or of the undo after a finished
/// ADD, is a first one; any other may follow a DEL cut short (the bridge
/// plugin, killed after deleting the pod's interface, leaves masquerade
/// rules that only a DEL told so removes).
#[tokio::test]
async fn a_del_that_may_follow_one_cut_short_says_so() {
    use crust_network::DelAttempt::{First, Repeat};
    let rig = Rig::new().await;
    let ready = rig.run_pod("ready").await.unwrap();
    rig.lifecycle.remove_pod(&ready).await.unwrap();

    let failed = rig.run_pod("failed-del").await.unwrap();
    rig.pod_host.fail(Op::CniDel);
    assert!(rig.lifecycle.stop_pod(&failed).await.is_err());
    rig.pod_host.heal(Op::CniDel);
    rig.lifecycle.remove_pod(&failed).await.unwrap();

    rig.pod_host.fail(Op::CniAddNoIp);
    rig.run_pod("no-ip").await.unwrap_err();
    rig.pod_host.heal(Op::CniAddNoIp);

    // Killed inside the DEL of a stop: NOTREADY, still attached.
    let killed = rig.run_pod("killed-in-del").await.unwrap();
    let mut rec = rig.pods.get(&killed).unwrap();
    rec.state = PodState::NotReady;
    rig.store.put(&rec).unwrap();
    // Killed while being created (or undone).
    let creating = rig.run_pod("creating").await.unwrap();
    let mut rec = rig.pods.get(&creating).unwrap();
    rec.state = PodState::Creating;
    rig.store.put(&rec).unwrap();
    let rig = rig.restart().await;
    rig.lifecycle.remove_pod(&killed).await.unwrap();

    let attempts = rig.pod_host.del_attempts();
    let of = |id: &str| -> Vec<_> {
        attempts
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, a)| *a)
            .collect()
    };
    assert_eq!(of(&ready), [First]);
    assert_eq!(of(&failed), [First, Repeat]);
    assert_eq!(of(&killed), [Repeat]);
    assert_eq!(of(&creating), [Repeat]);
    assert_eq!(attempts.len(), 6, "{attempts:?}");
    assert_eq!(attempts[3].1, First, "the undo after ADD: {attempts:?}");
    assert!(rig.pod_host.node().attached.is_empty());
}

#[tokio::test]
async fn remove_leaves_the_network_before_the_namespaces_go() {
    let rig = Rig::new().await;
    let id = rig.run_pod("web").await.unwrap();
    rig.journal.clear();
    rig.lifecycle.remove_pod(&id).await.unwrap();
    let j = &rig.journal;
    let del = j.position(is_cni_del).unwrap();
    let unpin = j
        .position(|e| matches!(e, Effect::UnpinNamespaces(_)))
        .unwrap();
    let run_dir = j
        .position(|e| matches!(e, Effect::RemoveEmptyDir(_)))
        .unwrap();
    assert!(del < unpin, "DEL finds the pod's rules through its netns");
    assert!(unpin < run_dir, "the run dir goes once nothing is in it");
}

#[tokio::test]
async fn ids_resolve_by_unique_prefix_and_bad_ones_are_named() {
    let rig = Rig::new().await;
    let id = rig.run_pod("web").await.unwrap();
    assert_eq!(rig.pods.get(&id[..8]).unwrap().id, id);
    assert!(matches!(
        rig.pods.get(""),
        Err(PodError::InvalidArgument(m)) if m.starts_with("pod_sandbox_id")
    ));
    assert!(matches!(
        rig.pods.get(&"0".repeat(64)),
        Err(PodError::NotFound(_))
    ));
    // A list filter by an unknown prefix selects nothing.
    let none = ListFilter {
        id: "nope".into(),
        ..Default::default()
    };
    assert!(rig.pods.list(&none).is_empty());
}

#[tokio::test]
async fn only_a_shared_pid_namespace_gets_a_pause_process() {
    let rig = Rig::new().await;
    let own = rig.run_pod("own-pid").await.unwrap();
    let rec = rig.pods.get(&own).unwrap();
    assert!(rig.container_facts_pid_ns(&rec).is_none());
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::StartPause(_))), 0);

    let shared = pod_spec("shared-pid", |c| {
        let opts = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
        opts.namespace_options.as_mut().unwrap().pid = NamespaceMode::Pod as i32;
    });
    let id = rig.lifecycle.run_pod(shared).await.unwrap();
    let rec = rig.pods.get(&id).unwrap();
    assert!(rig.pod_host.node().pauses.contains(&id));
    // Containers join the pause process's PID namespace.
    assert_eq!(
        rig.container_facts_pid_ns(&rec).as_deref(),
        Some(std::path::Path::new("/proc/4242/ns/pid"))
    );
    rig.lifecycle.stop_pod(&id).await.unwrap();
    assert!(!rig.pod_host.node().pauses.contains(&id));
}

#[tokio::test]
async fn host_network_pods_need_no_network_config_and_no_netns() {
    let rig = Rig::new().await;
    rig.pod_host.fail(Op::LoadNetwork);
    let err = rig.run_pod("web").await.unwrap_err();
    assert!(matches!(err, PodError::Unavailable(_)), "{err:?}");
    assert!(rig.journal.effects().is_empty(), "nothing was touched");

    let host = pod_spec("host", |c| {
        let opts = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
        opts.namespace_options.as_mut().unwrap().network = NamespaceMode::Node as i32;
    });
    let id = rig.lifecycle.run_pod(host).await.unwrap();
    let rec = rig.pods.get(&id).unwrap();
    assert!(rec.namespaces.net.is_none() && rec.namespaces.uts.is_none());
    assert!(rec.namespaces.ipc.is_some());
    assert_eq!(rig.journal.count(|e| matches!(e, Effect::CniAdd(_))), 0);
}

#[tokio::test]
async fn recovery_undoes_a_pod_whose_creation_was_cut_short() {
    let rig = Rig::new().await;
    let id = rig.run_pod("web").await.unwrap();
    // As if the daemon died before the record said ready.
    let mut rec = rig.pods.get(&id).unwrap();
    rec.state = PodState::Creating;
    rig.store.put(&rec).unwrap();

    let rig = rig.restart().await;
    assert!(matches!(rig.pods.get(&id), Err(PodError::NotFound(_))));
    assert!(rig.stored::<PodRecord>().is_empty());
    assert!(rig.pod_host.node().is_empty(), "{:?}", rig.pod_host.node());
    // The name is free again.
    rig.run_pod("web").await.unwrap();
}

#[tokio::test]
async fn recovery_marks_pods_whose_namespaces_are_gone_notready() {
    let rig = Rig::new().await;
    let id = rig.run_pod("web").await.unwrap();
    let rig = rig.restart().await;
    assert_eq!(rig.pods.get(&id).unwrap().state, PodState::Ready);

    rig.pod_host.lose_pins();
    let rig = rig.restart().await;
    let rec = rig.pods.get(&id).unwrap();
    assert_eq!(rec.state, PodState::NotReady);
    assert_eq!(rig.stored::<PodRecord>()[0].state, PodState::NotReady);
    // Its IP is still released by Stop/Remove.
    assert!(rec.network_attached());
    rig.lifecycle.remove_pod(&id).await.unwrap();
    assert!(rig.pod_host.node().attached.is_empty());
}

#[tokio::test]
async fn recovery_sweeps_pod_dirs_no_record_owns() {
    use super::PodHost;
    let rig = Rig::new().await;
    let kept = rig.run_pod("web").await.unwrap();
    let root = rig.dir.path().to_path_buf();
    let orphan = "a".repeat(64);
    for dir in [
        root.join("run/pods").join(&orphan),
        root.join("root/pods").join(&orphan),
        root.join("run/pods/not-an-id"),
    ] {
        rig.pod_host.create_dir(&dir).unwrap();
    }
    let rig = rig.restart().await;
    let dirs = rig.pod_host.node().dirs;
    assert!(!dirs.iter().any(|d| d.ends_with(&orphan)), "{dirs:?}");
    assert!(dirs.contains(&root.join("run/pods/not-an-id")));
    assert!(dirs.contains(&root.join("run/pods").join(&kept)));
    assert_eq!(rig.pods.get(&kept).unwrap().state, PodState::Ready);
}

impl Rig {
    fn container_facts_pid_ns(&self, rec: &PodRecord) -> Option<std::path::PathBuf> {
        self.pods.container_facts(rec).pid_ns
    }
}
