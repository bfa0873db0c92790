//! NRI end to end: the real daemon, real runtimes (embedded and runc), real
//! CNI, and NRI plugins speaking the wire protocol over the daemon's NRI
//! socket (crust_nri's test plugin, in-process, and its `nri-test-plugin`
//! program as a pre-installed plugin the daemon starts itself). Adjustments
//! are checked from inside the container.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_nri::api;
use crust_nri::testing::{Action, Behaviour, TestPlugin};
use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, DaemonBuilder, TestNetwork, WithImage, container_config, crust_bin, daemon_with_image,
    mounts_under, pod_metadata,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

const WAIT: Duration = Duration::from_secs(20);

fn test_image() -> TestImage {
    let layer = busybox_with(&["sh"])
        .dir("etc/")
        .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        .file("etc/group", b"root:x:0:\n")
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["busybox", "sleep", "1000"])
}

struct Env {
    // Field order = drop order: pods (and their containers) go first.
    net: TestNetwork,
    d: Daemon,
    _reg: Registry,
    image: String,
    rt: Rt,
}

async fn env_with(builder: DaemonBuilder) -> Env {
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(builder, "test/nri", &test_image()).await;
    let net = TestNetwork::install(&d, &[]);
    let rt = d.runtime_v1().await;
    Env {
        net,
        d,
        _reg: reg,
        image,
        rt,
    }
}

async fn env() -> Env {
    env_with(Daemon::builder()).await
}

fn pod_config(name: &str) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: pod_metadata(name, "crust-nri-test"),
        linux: Some(v1::LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

impl Env {
    async fn try_pod(
        &mut self,
        name: &str,
        handler: &str,
    ) -> Result<String, crust_test_support::tonic::Status> {
        self.rt
            .run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(pod_config(name)),
                runtime_handler: handler.into(),
            })
            .await
            .map(|r| r.into_inner().pod_sandbox_id)
    }

    async fn pod(&mut self, name: &str, handler: &str) -> String {
        self.try_pod(name, handler)
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
    }

    fn container(&self, name: &str) -> v1::ContainerConfig {
        v1::ContainerConfig {
            log_path: String::new(),
            linux: Some(v1::LinuxContainerConfig::default()),
            ..container_config(name, &self.image)
        }
    }

    async fn create(
        &mut self,
        pod: &str,
        name: &str,
    ) -> Result<String, crust_test_support::tonic::Status> {
        let config = self.container(name);
        self.rt
            .create_container(v1::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(pod_config("unused")),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    async fn start(&mut self, id: &str) {
        self.rt
            .start_container(v1::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    }

    async fn run(&mut self, pod: &str, name: &str) -> String {
        let id = self
            .create(pod, name)
            .await
            .unwrap_or_else(|e| panic!("CreateContainer: {e}"));
        self.start(&id).await;
        id
    }

    async fn cat(&mut self, id: &str, file: &str) -> String {
        let r = self
            .rt
            .exec_sync(v1::ExecSyncRequest {
                container_id: id.into(),
                cmd: vec!["busybox".into(), "cat".into(), file.into()],
                timeout: 20,
            })
            .await
            .unwrap_or_else(|e| panic!("ExecSync cat {file}: {e}"))
            .into_inner();
        assert_eq!(
            r.exit_code,
            0,
            "cat {file}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        String::from_utf8_lossy(&r.stdout).into_owned()
    }

    async fn container_ids(&mut self) -> Vec<String> {
        crust_test_support::cri::list_containers(&mut self.rt)
            .await
            .into_iter()
            .map(|c| c.id)
            .collect()
    }

    async fn pod_ids(&mut self) -> Vec<String> {
        self.rt
            .list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items
            .into_iter()
            .map(|p| p.id)
            .collect()
    }

    async fn stop_and_remove_pod(&mut self, pod: &str) {
        self.rt
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: pod.into(),
            })
            .await
            .unwrap();
        self.rt
            .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: pod.into(),
            })
            .await
            .unwrap();
    }
}

/// A plugin on the daemon's NRI socket, registered and synchronized (the
/// daemon adds it to the plugins it calls before any later CRI call's NRI
/// step: those wait for the synchronization to finish).
async fn plugin(d: &Daemon, name: &str, b: Behaviour) -> TestPlugin {
    let p = TestPlugin::connect(&d.nri_socket(), name, "10", b)
        .await
        .unwrap_or_else(|e| panic!("plugin {name}: {e}\n{}", d.logs()));
    p.wait_synchronized(WAIT).await.expect("synchronized");
    p
}

fn methods(p: &TestPlugin) -> Vec<String> {
    p.events().into_iter().map(|(m, _, _)| m).collect()
}

fn fail_on(method: &str, action: Action) -> Behaviour {
    Behaviour {
        actions: [(method.to_string(), action)].into(),
        ..Default::default()
    }
}

/// What the test plugin asks of every container it sees created.
fn adjustment(hook_out: &Path) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        env: vec![api::KeyValue::new("NRI_ADDED", "yes")],
        annotations: [("nri.crust.test/adjusted".to_string(), "true".to_string())].into(),
        mounts: vec![api::Mount {
            destination: "/nri".into(),
            r#type: "tmpfs".into(),
            source: "tmpfs".into(),
            options: vec!["nosuid".into(), "size=1m".into()],
        }],
        hooks: Some(api::Hooks {
            create_runtime: vec![api::Hook {
                path: "/bin/sh".into(),
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    format!("cat > {}", hook_out.display()),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }),
        rlimits: vec![api::PosixRlimit {
            r#type: "RLIMIT_NOFILE".into(),
            hard: 4242,
            soft: 4242,
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
            // Below what the daemon may set: raised to its own.
            oom_score_adj: Some(api::OptionalInt { value: -1000 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The memory limit as the container sees its cgroup (v1 or v2).
async fn memory_limit_inside(e: &mut Env, id: &str) -> String {
    let v1 =
        e.rt.exec_sync(v1::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec![
                "busybox".into(),
                "sh".into(),
                "-c".into(),
                "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || \
                 cat /sys/fs/cgroup/memory.max"
                    .into(),
            ],
            timeout: 20,
        })
        .await
        .unwrap()
        .into_inner();
    String::from_utf8_lossy(&v1.stdout).trim().to_string()
}

async fn adjustments_take_effect_inside_the_container(handler: &str) {
    let mut e = env().await;
    let hook_out = e.d.temp_dir().join("hook-ran");
    let p = plugin(
        &e.d,
        "adjuster",
        Behaviour {
            adjust: Some(adjustment(&hook_out)),
            ..Default::default()
        },
    )
    .await;
    let pod = e.pod("adjusted", handler).await;
    let id = e.run(&pod, "app").await;

    let env = e.cat(&id, "/proc/self/environ").await;
    assert!(env.split('\0').any(|v| v == "NRI_ADDED=yes"), "{env:?}");
    let mounts = e.cat(&id, "/proc/self/mounts").await;
    assert!(
        mounts.lines().any(|l| l.contains(" /nri tmpfs ")),
        "{mounts}"
    );
    assert_eq!(
        memory_limit_inside(&mut e, &id).await,
        (64u64 << 20).to_string()
    );
    let status = e.cat(&id, "/proc/self/status").await;
    assert!(status.contains("Cpus_allowed_list:\t0\n"), "{status}");
    let limits = e.cat(&id, "/proc/self/limits").await;
    assert!(
        limits.lines().any(|l| l.starts_with("Max open files")
            && l.split_whitespace().filter(|w| *w == "4242").count() == 2),
        "{limits}"
    );
    // The daemon cannot go below its own oom_score_adj: raised to it.
    let own = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", e.d.pid())).unwrap();
    assert_eq!(e.cat(&id, "/proc/1/oom_score_adj").await.trim(), own.trim());
    // The hook ran, with the container's state on its stdin.
    let state = std::fs::read_to_string(&hook_out).expect("the createRuntime hook ran");
    assert!(state.contains(&id), "{state}");
    // The annotation is in the spec the runtime got; status reports the
    // adjusted resources.
    let st =
        e.rt.container_status(v1::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&st.info["info"]).unwrap();
    assert_eq!(
        info["runtimeSpec"]["annotations"]["nri.crust.test/adjusted"],
        "true"
    );
    let res = st.status.unwrap().resources.unwrap().linux.unwrap();
    assert_eq!(res.memory_limit_in_bytes, 64 << 20);
    assert_eq!(res.cpuset_cpus, "0");

    e.stop_and_remove_pod(&pod).await;
    assert_eq!(
        methods(&p),
        [
            "RunPodSandbox",
            "CreateContainer",
            "PostCreateContainer",
            "StartContainer",
            "PostStartContainer",
            "StopContainer",
            "StopPodSandbox",
            "RemoveContainer",
            "RemovePodSandbox",
        ]
    );
    let created = p
        .received()
        .into_iter()
        .find(|r| r.method == "CreateContainer")
        .unwrap();
    let (shown_pod, shown) = (created.pod.unwrap(), created.container.unwrap());
    assert_eq!(
        (
            shown_pod.id.as_str(),
            shown_pod.name.as_str(),
            shown_pod.uid.as_str()
        ),
        (pod.as_str(), "adjusted", "uid-adjusted")
    );
    assert_eq!(
        (shown.id.as_str(), shown.name.as_str()),
        (id.as_str(), "app")
    );
    assert_eq!(shown.args, ["busybox", "sleep", "1000"]);
    assert_eq!(mounts_under(&e.d.run_dir), Vec::<PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn adjustments_take_effect_inside_the_container_embedded() {
    adjustments_take_effect_inside_the_container("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn adjustments_take_effect_inside_the_container_runc() {
    adjustments_take_effect_inside_the_container("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_hook_fails_the_call_leaves_nothing_and_a_retry_works() {
    let mut e = env().await;
    let p = plugin(
        &e.d,
        "failer",
        fail_on("RunPodSandbox", Action::Fail("induced pod failure".into())),
    )
    .await;
    let err = e.try_pod("failing", "").await.unwrap_err();
    assert!(err.message().contains("induced pod failure"), "{err}");
    assert!(e.pod_ids().await.is_empty());
    assert!(e.net.veths().is_empty(), "{:?}", e.net.veths());
    assert_eq!(mounts_under(&e.d.run_dir), Vec::<PathBuf>::new());
    assert_eq!(
        methods(&p),
        ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]
    );

    p.set_behaviour(|b| {
        b.actions = [(
            "CreateContainer".to_string(),
            Action::Fail("induced container failure".into()),
        )]
        .into()
    });
    let pod = e.pod("failing", "").await;
    let err = e.create(&pod, "app").await.unwrap_err();
    assert!(err.message().contains("induced container failure"), "{err}");
    assert!(e.container_ids().await.is_empty());
    assert_eq!(
        mounts_under(&e.d.run_dir.join("containers")),
        Vec::<PathBuf>::new()
    );
    let left: Vec<_> = std::fs::read_dir(e.d.run_dir.join("containers"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");

    p.set_behaviour(|b| b.actions.clear());
    let id = e.run(&pod, "app").await;
    assert_eq!(e.container_ids().await, [id]);
    e.stop_and_remove_pod(&pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_plugin_times_out_without_wedging_the_daemon() {
    let mut e =
        env_with(Daemon::builder().config("[nri]\nplugin_request_timeout = \"2s\"\n")).await;
    let p = plugin(&e.d, "hung", fail_on("CreateContainer", Action::Hang)).await;
    let pod = e.pod("hung", "").await;
    let mut rt = e.rt.clone();
    let config = e.container("app");
    let pod_id = pod.clone();
    let create = tokio::spawn(async move {
        let t = Instant::now();
        let r = rt
            .create_container(v1::CreateContainerRequest {
                pod_sandbox_id: pod_id,
                config: Some(config),
                sandbox_config: None,
            })
            .await;
        (r, t.elapsed())
    });
    p.wait_for(WAIT, |r| r.iter().any(|x| x.method == "CreateContainer"))
        .await
        .unwrap();
    // While the plugin hangs, the daemon answers everything else.
    for _ in 0..3 {
        let t = Instant::now();
        e.rt.version(v1::VersionRequest::default()).await.unwrap();
        assert_eq!(e.pod_ids().await, std::slice::from_ref(&pod));
        assert!(e.container_ids().await.is_empty(), "not visible yet");
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
    let (created, took) = create.await.unwrap();
    let id = created
        .expect("the call goes on without the hung plugin")
        .into_inner()
        .container_id;
    assert!(took >= Duration::from_secs(1), "{took:?}");
    tokio::time::timeout(WAIT, p.closed())
        .await
        .expect("the hung plugin is disconnected");
    e.start(&id).await;
    e.stop_and_remove_pod(&pod).await;
}

/// `nri.plugin_request_timeout` is reloaded (`crust reload`): a plugin
/// that hangs is given up after the new timeout, not the start's.
#[tokio::test(flavor = "multi_thread")]
async fn a_reloaded_request_timeout_applies_to_the_next_call() {
    let mut e =
        env_with(Daemon::builder().config("[nri]\nplugin_request_timeout = \"300s\"\n")).await;
    e.d.write_config("[nri]\nplugin_request_timeout = \"2s\"\n");
    let socket = e.d.socket.display().to_string();
    let out = crust_test_support::run_crust(&["reload", "--socket", &socket]);
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        answer.contains("applied: nri.plugin_request_timeout"),
        "{answer}"
    );
    let p = plugin(&e.d, "hung", fail_on("CreateContainer", Action::Hang)).await;
    let pod = e.pod("hung", "").await;
    let t = Instant::now();
    let id = tokio::time::timeout(Duration::from_secs(60), e.create(&pod, "app"))
        .await
        .expect("given up after the reloaded timeout, not 300 s")
        .expect("the call goes on without the hung plugin");
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    tokio::time::timeout(WAIT, p.closed())
        .await
        .expect("the hung plugin is disconnected");
    e.start(&id).await;
    e.stop_and_remove_pod(&pod).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_that_disconnects_mid_call_does_not_fail_the_call() {
    let mut e = env().await;
    let p = plugin(
        &e.d,
        "leaver",
        fail_on("StartContainer", Action::Disconnect),
    )
    .await;
    let pod = e.pod("leaver", "").await;
    let id = e.run(&pod, "app").await;
    assert!(p.is_closed());
    let st =
        e.rt.container_status(v1::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(st.state, v1::ContainerState::ContainerRunning as i32);
    // A new plugin can connect and is synchronized with what exists.
    let again = plugin(&e.d, "again", Behaviour::default()).await;
    let synced = again.wait_synchronized(WAIT).await.unwrap();
    assert!(
        synced
            .containers
            .iter()
            .any(|c| c.id == st.id && c.name == "app")
    );
    e.stop_and_remove_pod(&pod).await;
}

/// The daemon starts a pre-installed plugin (`plugin_path`, socket on its
/// stdin) with its configuration drop-in, before serving, and stops it at
/// shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn pre_installed_plugins_are_started_configured_and_stopped() {
    let dirs = tempfile::tempdir().unwrap();
    let (plugins, confs) = (dirs.path().join("plugins"), dirs.path().join("conf.d"));
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&confs).unwrap();
    let bin = crust_bin().with_file_name("nri-test-plugin");
    assert!(bin.exists(), "{} (cargo build --bins)", bin.display());
    let installed = plugins.join("05-preinstalled");
    std::fs::copy(&bin, &installed).unwrap();
    let log = dirs.path().join("events.log");
    std::fs::write(
        confs.join("05-preinstalled.conf"),
        serde_json::json!({"log_file": log, "adjust_env": {"PRE": "installed"}}).to_string(),
    )
    .unwrap();
    let mut e = env_with(Daemon::builder().config(&format!(
        "[nri]\nplugin_path = \"{}\"\nplugin_config_path = \"{}\"\n",
        plugins.display(),
        confs.display()
    )))
    .await;
    let running = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|p| std::fs::read_link(p.path().join("exe")).ok())
            .filter(|exe| exe == &installed)
            .count()
    };
    assert_eq!(running(), 1, "{}", e.d.logs());
    let pod = e.pod("pre", "").await;
    let id = e.run(&pod, "app").await;
    let env = e.cat(&id, "/proc/self/environ").await;
    assert!(env.split('\0').any(|v| v == "PRE=installed"), "{env:?}");
    let events = std::fs::read_to_string(&log).unwrap();
    assert!(
        events.contains(&format!("CreateContainer {pod} {id}")),
        "{events}"
    );
    e.stop_and_remove_pod(&pod).await;
    e.d.signal_and_wait(nix::sys::signal::Signal::SIGTERM, WAIT)
        .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while running() > 0 {
        assert!(Instant::now() < deadline, "the plugin outlived the daemon");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The socket is the daemon's, root-only.
#[tokio::test(flavor = "multi_thread")]
async fn the_nri_socket_is_root_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = Daemon::start().await;
    let meta = std::fs::metadata(d.nri_socket()).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), 0);
}

/// A plugin connecting to a daemon that already runs a pod is synchronized
/// with it; its unsolicited updates reach the container's cgroup, CRI
/// updates reach it as UpdateContainer/PostUpdateContainer, and its
/// evictions stop the container (which it then hears of).
#[tokio::test(flavor = "multi_thread")]
async fn a_late_plugin_is_synchronized_and_its_updates_and_evictions_apply() {
    let mut e = env().await;
    let pod = e.pod("late", "").await;
    let id = e.run(&pod, "app").await;

    let p = TestPlugin::connect(&e.d.nri_socket(), "late", "20", Behaviour::default())
        .await
        .unwrap_or_else(|err| panic!("plugin: {err}\n{}", e.d.logs()));
    let synced = p.wait_synchronized(WAIT).await.expect("synchronized");
    assert!(synced.pods.iter().any(|x| x.id == pod && x.name == "late"));
    let shown = synced
        .containers
        .iter()
        .find(|c| c.id == id)
        .expect("the running container is in the synchronization");
    assert_eq!(
        (shown.name.as_str(), shown.pod_sandbox_id.as_str()),
        ("app", pod.as_str())
    );
    assert_eq!(shown.state, api::ContainerState::ContainerRunning as i32);

    // Unsolicited UpdateContainers: applied to the running container.
    let failed = p
        .update_containers(
            vec![api::ContainerUpdate {
                container_id: id.clone(),
                linux: Some(api::LinuxContainerUpdate {
                    resources: Some(api::LinuxResources {
                        memory: Some(api::LinuxMemory {
                            limit: Some(api::OptionalInt64 { value: 40 << 20 }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }),
                ignore_failure: false,
            }],
            Vec::new(),
        )
        .await
        .expect("UpdateContainers");
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        memory_limit_inside(&mut e, &id).await,
        (40u64 << 20).to_string()
    );
    // An update of a container that does not exist comes back failed.
    let failed = p
        .update_containers(
            vec![api::ContainerUpdate {
                container_id: "no-such-container".into(),
                linux: Some(api::LinuxContainerUpdate {
                    resources: Some(api::LinuxResources::default()),
                }),
                ignore_failure: false,
            }],
            Vec::new(),
        )
        .await
        .expect("UpdateContainers");
    assert_eq!(failed.len(), 1, "{failed:?}");

    // A CRI update goes through the plugin (UpdateContainer, then
    // PostUpdateContainer once applied).
    e.rt.update_container_resources(v1::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(v1::LinuxContainerResources {
            memory_limit_in_bytes: 48 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    assert_eq!(
        memory_limit_inside(&mut e, &id).await,
        (48u64 << 20).to_string()
    );
    assert_eq!(methods(&p), ["UpdateContainer", "PostUpdateContainer"]);
    let update = p
        .received()
        .into_iter()
        .find(|r| r.method == "UpdateContainer")
        .unwrap();
    assert_eq!(update.container_id(), id);

    // Eviction: the container is stopped, and plugins hear of it.
    let failed = p
        .update_containers(
            Vec::new(),
            vec![api::ContainerEviction {
                container_id: id.clone(),
                reason: "test eviction".into(),
            }],
        )
        .await
        .expect("UpdateContainers (evict)");
    assert!(failed.is_empty(), "{failed:?}");
    let st =
        e.rt.container_status(v1::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(st.state, v1::ContainerState::ContainerExited as i32);
    p.wait_for(WAIT, |r| {
        r.iter()
            .any(|x| x.method == "StopContainer" && x.container_id() == id)
    })
    .await
    .expect("the plugin hears of the evicted container's stop");
    e.stop_and_remove_pod(&pod).await;
    assert_eq!(mounts_under(&e.d.run_dir), Vec::<PathBuf>::new());
}
