//! Containers end to end: a real daemon, real runtimes (embedded and runc),
//! an image built from busybox-static and pulled from the local registry
//! harness, real CNI. Every check is made from inside the container.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_test_support::crust_api::{v1, v1alpha2};
use crust_test_support::registry::*;
use crust_test_support::tonic::Code;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, DaemonBuilder, Need, Pod, TestNetwork, WithImage, container_config, container_status,
    create_container, daemon_with_image, exec_sync, mounts_under, pod_metadata, pull_image,
    require, run_container, run_pod,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type OldRt = v1alpha2::runtime_service_client::RuntimeServiceClient<Channel>;

/// busybox with the applets the tests use, a user and groups.
fn test_image() -> TestImage {
    let layer = busybox_with(&[
        "sh", "cat", "id", "sleep", "echo", "touch", "unshare", "head", "wc", "grep", "hostname",
        "env", "pwd", "true", "tr", "ls", "printf", "mkdir", "pidof",
    ])
    .dir("etc/")
    .file(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/sh\n",
    )
    .file(
        "etc/group",
        b"root:x:0:\nwww-data:x:33:\ngroup:x:1004:www-data\n",
    )
    .dir("tmp/")
    .dir("data/")
    .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

struct Env {
    // Field order = drop order: pods (and their containers) go first.
    net: TestNetwork,
    d: Daemon,
    reg: Registry,
    image: String,
    rt: Rt,
    logs: tempfile::TempDir,
}

async fn env() -> Env {
    env_with(Daemon::builder()).await
}

async fn env_with(builder: DaemonBuilder) -> Env {
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(builder, "test/ctr", &test_image()).await;
    let net = TestNetwork::install(&d, &[]);
    let rt = d.runtime_v1().await;
    Env {
        net,
        rt,
        d,
        reg,
        image,
        logs: tempfile::tempdir().unwrap(),
    }
}

fn pod_config(name: &str, logs: &Path) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: pod_metadata(name, "crust-test"),
        hostname: format!("host-{name}"),
        log_directory: logs.join(name).display().to_string(),
        dns_config: Some(v1::DnsConfig {
            servers: vec!["10.9.8.7".into()],
            searches: vec!["crust.test".into()],
            options: vec![],
        }),
        linux: Some(v1::LinuxPodSandboxConfig::default()),
        ..Default::default()
    }
}

impl Env {
    async fn pod(&mut self, name: &str, handler: &str) -> Pod {
        run_pod(&mut self.rt, pod_config(name, self.logs.path()), handler).await
    }

    fn container(&self, name: &str) -> v1::ContainerConfig {
        container_config(name, &self.image)
    }

    async fn create(
        &mut self,
        pod: &Pod,
        config: v1::ContainerConfig,
    ) -> Result<String, crust_test_support::tonic::Status> {
        create_container(&mut self.rt, pod, config).await
    }

    async fn run(&mut self, pod: &Pod, config: v1::ContainerConfig) -> String {
        run_container(&mut self.rt, pod, config).await
    }

    async fn exec(&mut self, id: &str, cmd: &[&str]) -> (i32, String, String) {
        exec_sync(&mut self.rt, id, cmd, 20).await
    }

    async fn sh(&mut self, id: &str, script: &str) -> (i32, String) {
        let (code, out, err) = self.exec(id, &["sh", "-c", script]).await;
        (code, format!("{out}{err}"))
    }

    async fn status(&mut self, id: &str) -> (v1::ContainerStatus, HashMap<String, String>) {
        let r = container_status(&mut self.rt, id).await;
        (r.status.unwrap(), r.info)
    }

    async fn wait_exited(&mut self, id: &str) -> v1::ContainerStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (s, _) = self.status(id).await;
            if s.state == v1::ContainerState::ContainerExited as i32 {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "container {id} did not exit: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn pid_of(&mut self, id: &str) -> i32 {
        let (_, info) = self.status(id).await;
        let v: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
        v["pid"].as_i64().unwrap() as i32
    }
}

/// The host path of a process's cgroup in controller `ctrl` (v1) or the
/// unified hierarchy.
fn cgroup_file(pid: i32, ctrl: &str, file: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let candidates: Vec<PathBuf> = if ctrls.is_empty() {
            vec![PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/'))]
        } else if ctrls.split(',').any(|c| c == ctrl) {
            vec![
                PathBuf::from("/sys/fs/cgroup")
                    .join(ctrls)
                    .join(path.trim_start_matches('/')),
                PathBuf::from("/sys/fs/cgroup")
                    .join(ctrl)
                    .join(path.trim_start_matches('/')),
            ]
        } else {
            continue;
        };
        for c in candidates {
            if let Ok(s) = std::fs::read_to_string(c.join(file)) {
                return Some(s.trim().to_string());
            }
        }
    }
    None
}

fn shim_cmdlines(d: &Daemon) -> Vec<String> {
    let dir = d.run_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("crust-shim") && c.contains(&dir))
        .collect()
}

fn shim_processes_of(d: &Daemon) -> usize {
    shim_cmdlines(d).len()
}

async fn fields_take_effect(handler: &str) {
    let mut e = env().await;
    let pod = e.pod("fields", handler).await;
    let host_dir = tempfile::tempdir().unwrap();
    std::fs::write(host_dir.path().join("hello"), "from the host\n").unwrap();

    // A root container with most fields set.
    let mut c = e.container("main");
    c.command = vec!["sh".into(), "-c".into()];
    c.args = vec![
        "echo args:$0:$1:$FOO; unshare -U true && echo ESCAPED || echo BLOCKED; exec sleep 1000"
            .into(),
        "a0".into(),
        "a1".into(),
    ];
    c.working_dir = "/etc".into();
    c.envs = vec![v1::KeyValue {
        key: "FOO".into(),
        value: "bar baz".into(),
    }];
    c.mounts = vec![v1::Mount {
        container_path: "/mnt/ro".into(),
        host_path: host_dir.path().display().to_string(),
        readonly: true,
        ..Default::default()
    }];
    {
        let linux = c.linux.as_mut().unwrap();
        linux.resources = Some(v1::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            ..Default::default()
        });
        let sc = linux.security_context.as_mut().unwrap();
        sc.readonly_rootfs = true;
        sc.no_new_privs = true;
        sc.seccomp = Some(v1::SecurityProfile {
            profile_type: v1::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        });
    }
    let main = e.run(&pod, c).await;

    let (_, env_out, _) = e.exec(&main, &["env"]).await;
    assert!(env_out.contains("FOO=bar baz"), "{env_out}");
    assert!(env_out.contains("PATH=/bin"), "{env_out}");
    let (_, pwd, _) = e.exec(&main, &["pwd"]).await;
    assert_eq!(pwd.trim(), "/etc");
    let (_, out) = e
        .sh(&main, "cat /mnt/ro/hello; touch /mnt/ro/x && echo WROTE")
        .await;
    assert!(
        out.contains("from the host") && !out.contains("WROTE"),
        "{out}"
    );
    let (code, out) = e.sh(&main, "touch /newfile && echo WROTE").await;
    assert!(
        code != 0 && !out.contains("WROTE"),
        "read-only rootfs: {out}"
    );
    let pid = e.pid_of(&main).await;
    assert!(pid > 0);
    // The container's own process, seen from the host.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .unwrap_or_default()
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    // containerd's default set: chown dac_override fowner fsetid kill
    // setgid setuid setpcap net_bind_service net_raw sys_chroot mknod
    // audit_write setfcap.
    assert_eq!(line("CapEff:"), "00000000a80425fb", "{status}");
    assert_eq!(line("NoNewPrivs:"), "1", "{status}");
    assert_eq!(line("Seccomp:"), "2", "{status}");
    for masked in ["/proc/keys", "/proc/timer_list", "/proc/kcore"] {
        if Path::new(masked).exists() {
            let (_, out) = e.sh(&main, &format!("cat {masked} | wc -c")).await;
            assert_eq!(out.trim(), "0", "{masked} is masked");
        }
    }
    let (_, out, _) = e.exec(&main, &["hostname"]).await;
    assert_eq!(out.trim(), "host-fields");
    let (_, out, _) = e.exec(&main, &["cat", "/etc/resolv.conf"]).await;
    assert!(
        out.contains("nameserver 10.9.8.7") && out.contains("crust.test"),
        "{out}"
    );
    let quota = cgroup_file(pid, "cpu", "cpu.cfs_quota_us")
        .or_else(|| cgroup_file(pid, "cpu", "cpu.max"))
        .expect("the container's cpu cgroup");
    assert!(quota.starts_with("50000"), "cpu quota {quota}");

    // The log has the args line.
    let log = e.logs.path().join("fields/main.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains(" stdout F args:a0:a1:bar baz"), "{text}");
    assert!(
        text.contains(" stdout F BLOCKED") && !text.contains("ESCAPED"),
        "the default seccomp profile lets unshare(CLONE_NEWUSER) through: {text}"
    );

    // A user from the image, with its supplementary group.
    let mut c = e.container("user");
    {
        let sc = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
        sc.run_as_username = "www-data".into();
        // A seccomp filter without no_new_privs.
        sc.seccomp = Some(v1::SecurityProfile {
            profile_type: v1::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        });
    }
    let user = e.run(&pod, c).await;
    let upid = e.pid_of(&user).await;
    let ustatus = std::fs::read_to_string(format!("/proc/{upid}/status")).unwrap();
    assert!(ustatus.contains("Seccomp:\t2"), "{ustatus}");
    assert!(ustatus.contains("NoNewPrivs:\t0"), "{ustatus}");
    let (_, out, _) = e.exec(&user, &["id"]).await;
    assert!(
        out.contains("uid=33(www-data) gid=33(www-data)") && out.contains("1004"),
        "{out}"
    );
    let (st, _) = e.status(&user).await;
    let u = st.user.unwrap().linux.unwrap();
    assert_eq!((u.uid, u.gid), (33, 33));
    assert!(u.supplemental_groups.contains(&1004), "{u:?}");

    // Memory limit: OOMKilled.
    let mut c = e.container("oom");
    c.command = vec![
        "sh".into(),
        "-c".into(),
        "x=aaaaaaaa; while true; do x=$x$x; done".into(),
    ];
    c.linux.as_mut().unwrap().resources = Some(v1::LinuxContainerResources {
        memory_limit_in_bytes: 32 << 20,
        ..Default::default()
    });
    let oom = e.run(&pod, c).await;
    let st = e.wait_exited(&oom).await;
    assert_eq!(st.reason, "OOMKilled", "{st:?}");
    assert_eq!(st.exit_code, 137);

    // Stop with a timeout: the stop signal ends sleep at once.
    let t = Instant::now();
    e.rt.stop_container(v1::StopContainerRequest {
        container_id: main.clone(),
        timeout: 10,
    })
    .await
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(9));
    let st = e.wait_exited(&main).await;
    assert_ne!(st.finished_at, 0);

    // StopPodSandbox stops the rest; RemovePodSandbox removes them.
    e.rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
    let (st, _) = e.status(&user).await;
    assert_eq!(st.state, v1::ContainerState::ContainerExited as i32);
    e.rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
    let list = crust_test_support::cri::list_containers(&mut e.rt).await;
    assert!(list.is_empty(), "{list:?}");
    assert!(log.exists(), "the log file is kept");
    assert_eq!(mounts_under(&e.d.run_dir), Vec::<PathBuf>::new());
    assert_eq!(shim_processes_of(&e.d), 0);
    drop(e.net);
}

#[tokio::test(flavor = "multi_thread")]
async fn fields_take_effect_embedded() {
    fields_take_effect("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fields_take_effect_runc() {
    fields_take_effect("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_lines_partial_lines_and_reopen() {
    let mut e = env().await;
    let pod = e.pod("logs", "").await;
    let mut c = e.container("log");
    c.command = vec![
        "sh".into(),
        "-c".into(),
        "echo out1; echo err1 >&2; printf part; sleep 0.3; echo ial; head -c 1048576 /dev/zero | tr '\\0' x; echo; exec sleep 1000"
            .into(),
    ];
    let id = e.run(&pod, c).await;
    let log = e.logs.path().join("logs/log.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.len() > 1 << 20 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.iter().any(|l| l.ends_with(" stdout F out1")),
        "{:?}",
        &lines[..2.min(lines.len())]
    );
    assert!(lines.iter().any(|l| l.ends_with(" stderr F err1")));
    // The partial line, then its end.
    let joined: String = lines
        .iter()
        .filter(|l| l.contains(" stdout ") && !l.contains("xxxx"))
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    // Either one line, or a `P` chunk and its end.
    assert!(
        joined.contains("partial"),
        "{:?}",
        &lines[..3.min(lines.len())]
    );
    // The 1 MiB line arrives whole, split into P chunks and an F.
    let big: usize = lines
        .iter()
        .filter(|l| l.contains("xxxx"))
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or("").len())
        .sum();
    assert_eq!(big, 1 << 20);

    // Reopen after rename.
    std::fs::rename(&log, log.with_extension("log.1")).unwrap();
    e.rt.reopen_container_log(v1::ReopenContainerLogRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    // The container's init (pid 1 of the pod is the pause process).
    e.sh(&id, "echo after-reopen > /proc/$(pidof sleep)/fd/1")
        .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("stdout F after-reopen") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no line in the reopened log: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Not running: FailedPrecondition; unknown: NotFound.
    e.rt.stop_container(v1::StopContainerRequest {
        container_id: id.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let err =
        e.rt.reopen_container_log(v1::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let err =
        e.rt.reopen_container_log(v1::ReopenContainerLogRequest {
            container_id: "f".repeat(64),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    drop(e.net);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_crash_loses_no_exit_code_and_stops_nothing() {
    let mut e = env().await;
    let pod = e.pod("restart", "").await;
    let long = e.run(&pod, e.container("long")).await;
    let mut c = e.container("short");
    c.command = vec!["sh".into(), "-c".into(), "sleep 2; exit 3".into()];
    let short = e.run(&pod, c).await;
    let pid = e.pid_of(&long).await;

    e.d.signal_and_wait(nix::sys::signal::Signal::SIGKILL, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    e.d.start_again().await;
    e.rt = e.d.runtime_v1().await;

    let (st, _) = e.status(&short).await;
    assert_eq!(
        st.state,
        v1::ContainerState::ContainerExited as i32,
        "{st:?}"
    );
    assert_eq!(st.exit_code, 3);
    assert_eq!(st.reason, "Error");
    let (st, _) = e.status(&long).await;
    assert_eq!(st.state, v1::ContainerState::ContainerRunning as i32);
    assert_eq!(
        e.pid_of(&long).await,
        pid,
        "the running container was untouched"
    );
    let (code, out, _) = e.exec(&long, &["echo", "alive"]).await;
    assert_eq!((code, out.trim()), (0, "alive"));
    drop(e.net);
}

/// The Stream* list RPCs answer what their List counterparts answer.
#[tokio::test(flavor = "multi_thread")]
async fn stream_rpcs_answer_what_list_rpcs_answer() {
    use futures_util::StreamExt;
    let mut e = env().await;
    let pod = e.pod("streamed", "").await;
    let a = e.run(&pod, e.container("a")).await;
    let mut cb = e.container("b");
    {
        let image = cb.image.as_mut().unwrap();
        image.user_specified_image = "ctr:v1".into();
        image
            .annotations
            .insert("io.example/kind".into(), "test".into());
    }
    let b = e.create(&pod, cb).await.unwrap();
    let ids = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let listed = crust_test_support::cri::list_containers(&mut e.rt).await;
    let mut stream =
        e.rt.stream_containers(v1::StreamContainersRequest::default())
            .await
            .unwrap()
            .into_inner();
    let mut streamed = Vec::new();
    while let Some(m) = stream.next().await {
        streamed.extend(m.unwrap().containers);
    }
    assert_eq!(
        ids(streamed.iter().map(|c| c.id.clone()).collect()),
        ids(listed.iter().map(|c| c.id.clone()).collect())
    );
    // The request's image spec comes back as it was given.
    let spec = listed
        .iter()
        .find(|c| c.id == b)
        .and_then(|c| c.image.clone())
        .unwrap();
    assert_eq!(spec.user_specified_image, "ctr:v1");
    assert_eq!(
        spec.annotations.get("io.example/kind").map(String::as_str),
        Some("test")
    );
    assert_eq!(
        ids(streamed.iter().map(|c| c.id.clone()).collect()),
        ids(vec![a.clone(), b])
    );
    // A filter is honoured.
    let mut stream =
        e.rt.stream_containers(v1::StreamContainersRequest {
            filter: Some(v1::ContainerFilter {
                state: Some(v1::ContainerStateValue {
                    state: v1::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let mut running = Vec::new();
    while let Some(m) = stream.next().await {
        running.extend(m.unwrap().containers.into_iter().map(|c| c.id));
    }
    assert_eq!(running, vec![a.clone()]);
    let mut stream =
        e.rt.stream_pod_sandboxes(v1::StreamPodSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner();
    let mut pods = Vec::new();
    while let Some(m) = stream.next().await {
        pods.extend(m.unwrap().pod_sandboxes.into_iter().map(|p| p.id));
    }
    assert_eq!(pods, vec![pod.0.clone()]);
    let mut stream =
        e.rt.stream_container_stats(v1::StreamContainerStatsRequest::default())
            .await
            .unwrap()
            .into_inner();
    let mut stats = Vec::new();
    while let Some(m) = stream.next().await {
        stats.extend(m.unwrap().container_stats);
    }
    assert!(
        stats
            .iter()
            .any(|s| s.attributes.as_ref().is_some_and(|at| at.id == a)),
        "{stats:?}"
    );
    let mut stream =
        e.rt.stream_pod_sandbox_stats(v1::StreamPodSandboxStatsRequest::default())
            .await
            .unwrap()
            .into_inner();
    let mut pod_stats = Vec::new();
    while let Some(m) = stream.next().await {
        pod_stats.extend(m.unwrap().pod_sandbox_stats);
    }
    assert_eq!(pod_stats.len(), 1, "{pod_stats:?}");
    drop(e.net);
}

/// The pid of the monitor of container `id` of the daemon with `run_dir`.
fn monitor_pid(run_dir: &str, id: &str) -> i32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("crust-shim") && c.contains(run_dir) && c.contains(id)
            })
        })
        .and_then(|p| p.file_name().to_str()?.parse().ok())
        .expect("the container's monitor")
}

/// ListContainers answers from memory: a created container whose process
/// dies (nobody started it) must still show up as exited there, through
/// the watcher that waits on its monitor.
#[tokio::test(flavor = "multi_thread")]
async fn list_sees_a_created_container_die() {
    let mut e = env().await;
    let pod = e.pod("listed", "").await;
    let id = e.create(&pod, e.container("doomed")).await.unwrap();
    // The created (not yet started) init: the monitor's only child.
    let monitor = monitor_pid(&e.d.run_dir.to_string_lossy(), &id);
    let children =
        std::fs::read_to_string(format!("/proc/{monitor}/task/{monitor}/children")).unwrap();
    let pid: i32 = children
        .split_whitespace()
        .next()
        .expect("the created init")
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let state = loop {
        let listed = crust_test_support::cri::list_containers(&mut e.rt).await;
        let state = listed.iter().find(|c| c.id == id).map(|c| c.state);
        if state != Some(v1::ContainerState::ContainerCreated as i32) || Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(state, Some(v1::ContainerState::ContainerExited as i32));
    drop(e.net);
}

/// Unmounts a test's submount even when the test fails.
struct Submount(PathBuf);

impl Drop for Submount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Status reports `rro` per handler (kernel >= 5.12 and a runtime that
/// knows it), and a recursive read-only mount makes submounts read-only
/// too, where a plain read-only bind leaves them writable.
async fn recursive_read_only_mounts(handler: &str) {
    let release = nix::sys::utsname::uname().unwrap();
    let release = release.release().to_string_lossy().into_owned();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let kernel: (u32, u32) = (
        v.next().unwrap().parse().unwrap(),
        v.next().unwrap().parse().unwrap(),
    );
    let mut e = env().await;
    let status =
        e.rt.status(v1::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    let rro_of = |name: &str| {
        status
            .runtime_handlers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.features.as_ref())
            .map(|f| (f.recursive_read_only_mounts, f.user_namespaces))
    };
    // Both need id-mapped mounts (5.12): user namespaces are the
    // daemon's own id-mapping, whatever the handler.
    assert_eq!(
        rro_of(handler),
        Some((kernel >= (5, 12), kernel >= (5, 12))),
        "{status:?}"
    );
    if kernel < (5, 12) {
        drop(e.net);
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let inner = host.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &inner,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    let _submount = Submount(inner);
    let pod = e.pod("rro", handler).await;
    let mut c = e.container("rro");
    let mount = |path: &str, rro: bool| v1::Mount {
        container_path: path.into(),
        host_path: host.path().display().to_string(),
        readonly: true,
        recursive_read_only: rro,
        propagation: v1::MountPropagation::PropagationPrivate as i32,
        ..Default::default()
    };
    c.mounts = vec![mount("/plain", false), mount("/rro", true)];
    let id = e.run(&pod, c).await;
    let (code, out) = e
        .sh(
            &id,
            "touch /plain/inner/a && echo plain-writable; touch /rro/inner/b || echo rro-refused",
        )
        .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("plain-writable"), "{out}");
    assert!(out.contains("rro-refused"), "{out}");
    drop(e.net);
}

#[tokio::test(flavor = "multi_thread")]
async fn recursive_read_only_mounts_embedded() {
    recursive_read_only_mounts("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recursive_read_only_mounts_runc() {
    recursive_read_only_mounts("runc").await;
}

/// A monitor that dies without recording an exit (SIGKILL, OOM) leaves a
/// container nobody watches: the daemon reports it exited and ends it, as
/// containerd does when a shim dies.
async fn a_killed_monitor_ends_its_container(handler: &str) {
    let mut e = env().await;
    let pod = e.pod("orphan", handler).await;
    let id = e.run(&pod, e.container("orphan")).await;
    let pid = e.pid_of(&id).await;
    let dir = e.d.run_dir.to_string_lossy().into_owned();
    let monitor = monitor_pid(&dir, &id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let st = loop {
        let (st, _) = e.status(&id).await;
        if st.state != v1::ContainerState::ContainerRunning as i32 || Instant::now() > deadline {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        st.state,
        v1::ContainerState::ContainerExited as i32,
        "{st:?}"
    );
    assert_eq!((st.exit_code, st.reason.as_str()), (255, "Error"), "{st:?}");
    assert!(st.message.contains("monitor"), "{st:?}");
    // The container's init is gone (or a zombie waiting for its new parent).
    let gone = || !crust_test_support::process_alive(pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone(), "the container's init {pid} still runs");
    e.rt.remove_container(v1::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    drop(e.net);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_monitor_ends_its_container_embedded() {
    a_killed_monitor_ends_its_container("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_monitor_ends_its_container_runc() {
    a_killed_monitor_ends_its_container("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_inputs_are_clear_errors_and_leave_nothing() {
    let mut e = env().await;
    let pod = e.pod("bad", "").await;
    let good = e.run(&pod, e.container("good")).await;
    let snapshot = |d: &Daemon| {
        let ls = |p: PathBuf| {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        (
            ls(d.root.join("containers")),
            ls(d.run_dir.join("containers")),
            mounts_under(&d.run_dir),
            shim_processes_of(d),
        )
    };
    let before = snapshot(&e.d);

    let err = e
        .create(&("0".repeat(64), pod.1.clone()), e.container("x"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");

    let mut c = e.container("x");
    c.image.as_mut().unwrap().image = "nosuch/image:v9".into();
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("nosuch/image:v9"), "{err}");

    let mut c = e.container("x");
    c.mounts = vec![v1::Mount {
        container_path: "/m".into(),
        host_path: "/nonexistent/crust-test".into(),
        ..Default::default()
    }];
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("/nonexistent/crust-test"), "{err}");

    let mut c = e.container("x");
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .run_as_username = "nobody-here".into();
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("nobody-here"), "{err}");

    let mut c = e.container("x");
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .run_as_group = Some(v1::Int64Value { value: 5 });
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("run_as_group"), "{err}");

    let mut c = e.container("x");
    c.log_path = "../../etc/evil".into();
    let err = e.create(&pod, c).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    let err = e.create(&pod, e.container("good")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.message().contains(&good), "{err}");

    assert_eq!(
        snapshot(&e.d),
        before,
        "a failed create left something behind"
    );

    // Idempotent stop and remove, also of unknown IDs.
    for _ in 0..2 {
        e.rt.stop_container(v1::StopContainerRequest {
            container_id: good.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
        e.rt.remove_container(v1::RemoveContainerRequest {
            container_id: good.clone(),
        })
        .await
        .unwrap();
    }
    e.rt.remove_container(v1::RemoveContainerRequest {
        container_id: "e".repeat(64),
    })
    .await
    .unwrap();
    let err =
        e.rt.container_status(v1::ContainerStatusRequest {
            container_id: good.clone(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let (ctrs, run_ctrs, _, shims) = snapshot(&e.d);
    assert!(
        ctrs.is_empty() && run_ctrs.is_empty(),
        "{ctrs:?} {run_ctrs:?}"
    );
    // The pod's pause process is the only monitor left.
    assert_eq!(shims, 1, "{}", shim_cmdlines(&e.d).join("\n"));
    drop(e.net);
}

/// UpdateContainerResources cannot write outside the container's cgroup
/// (issue 17: `{"../../tmp/x": "1"}` overwrote a host file and
/// `{"cgroup.procs": "1"}` moved PID 1 into the container's cgroup, on
/// cgroup v2): every escape form of a `unified` key is refused with
/// InvalidArgument naming the key, before anything is written, on any
/// host; the host file, PID 1's cgroup and the container's processes are
/// untouched, and the container runs on.
#[tokio::test(flavor = "multi_thread")]
async fn update_resources_never_writes_outside_the_cgroup() {
    let mut e = env().await;
    let pod = e.pod("unified", "").await;
    let id = e.run(&pod, e.container("c")).await;
    let pid = e.pid_of(&id).await;
    // Removed on drop, also when an assertion fails.
    let victim = tempfile::Builder::new()
        .prefix("crust-pwn-")
        .tempfile_in("/tmp")
        .unwrap();
    std::fs::write(victim.path(), b"untouched").unwrap();
    let up = format!("{}{}", "../".repeat(16), victim.path().display());
    let init_cgroup = std::fs::read_to_string("/proc/1/cgroup").unwrap();
    let procs = cgroup_file(pid, "memory", "cgroup.procs");
    let long = format!("{}/x", "a".repeat(10_000));
    for key in [
        up.as_str(),
        "cgroup.procs",
        "cgroup.subtree_control",
        "cgroup.kill",
        "cgroup.freeze",
        "memory.max/../../cgroup.procs",
        "../memory.max",
        "/etc/passwd",
        "..",
        ".",
        "memory..max",
        "memory.",
        ".max",
        "memory.max\0",
        "memory.max\n",
        "nosuch.file",
        "devices.allow",
        "",
        long.as_str(),
    ] {
        let key = key.to_string();
        let err =
            e.rt.update_container_resources(v1::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(v1::LinuxContainerResources {
                    unified: [(key.clone(), "1".to_string())].into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect_err(&format!("{key:?} accepted"));
        let m = err.message();
        assert_eq!(err.code(), Code::InvalidArgument, "{key:?}: {err}");
        assert!(m.starts_with("linux.unified"), "{key:?}: {m}");
        let shown: String = format!("{key:?}").chars().take(100).collect();
        let shown = shown.trim_end_matches('"');
        assert!(m.contains(shown), "{key:?}: the key is not named: {m}");
        assert!(m.len() <= 1024, "{key:?}: a {}-byte message", m.len());
    }
    assert_eq!(std::fs::read(victim.path()).unwrap(), b"untouched");
    assert_eq!(
        std::fs::read_to_string("/proc/1/cgroup").unwrap(),
        init_cgroup
    );
    assert_eq!(cgroup_file(pid, "memory", "cgroup.procs"), procs);
    let (s, _) = e.status(&id).await;
    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
    assert_eq!(e.sh(&id, "echo ok").await, (0, "ok\n".into()));
}

/// Processes ExecSync starts are confined like the container's own
/// (seccomp, capabilities, no_new_privs).
async fn exec_is_confined(handler: &str) {
    let mut e = env().await;
    let pod = e.pod("exec", handler).await;
    let mut c = e.container("confined");
    {
        let sc = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
        sc.no_new_privs = true;
        sc.seccomp = Some(v1::SecurityProfile {
            profile_type: v1::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        });
    }
    let id = e.run(&pod, c).await;
    let (_, status, _) = e.exec(&id, &["cat", "/proc/self/status"]).await;
    assert!(status.contains("Seccomp:\t2"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("CapEff:\t00000000a80425fb"), "{status}");
    let (code, out) = e.sh(&id, "unshare -U true && echo ESCAPED").await;
    assert!(
        code != 0 && !out.contains("ESCAPED"),
        "exec escaped seccomp: {out}"
    );
    // Kubernetes' default (allowPrivilegeEscalation): no no_new_privs, so
    // the filter must be loaded while the process may still do so.
    let mut c = e.container("escalating");
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .seccomp = Some(v1::SecurityProfile {
        profile_type: v1::security_profile::ProfileType::RuntimeDefault as i32,
        ..Default::default()
    });
    let escalating = e.run(&pod, c).await;
    let (_, status, _) = e.exec(&escalating, &["cat", "/proc/self/status"]).await;
    assert!(status.contains("Seccomp:\t2"), "{status}");
    assert!(status.contains("NoNewPrivs:\t0"), "{status}");
    assert!(status.contains("CapEff:\t00000000a80425fb"), "{status}");
    let (code, out) = e.sh(&escalating, "unshare -U true && echo ESCAPED").await;
    assert!(
        code != 0 && !out.contains("ESCAPED"),
        "exec escaped seccomp: {out}"
    );
    // A program that is not there: an error naming it, nothing left running.
    let err =
        e.rt.exec_sync(v1::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["no-such-program".into()],
            timeout: 10,
        })
        .await;
    // As containerd: the exec fails (no exit code), naming the program.
    let err = err.expect_err("ExecSync of a missing program");
    assert!(err.message().contains("no-such-program"), "{err:?}");
    // ExecSync: exit codes, stderr, timeout.
    let (code, _, err) = e.exec(&id, &["sh", "-c", "echo oops >&2; exit 7"]).await;
    assert_eq!((code, err.trim()), (7, "oops"));
    let t = Instant::now();
    let err =
        e.rt.exec_sync(v1::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["sleep".into(), "30".into()],
            timeout: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    drop(e.net);
}

/// libcontainer's own exec (tenant builder) dropped the filter; crust's
/// embedded exec must not.
#[tokio::test(flavor = "multi_thread")]
async fn exec_is_confined_embedded() {
    exec_is_confined("embedded").await;
}

/// The default handler ("") must confine exec'd processes.
#[tokio::test(flavor = "multi_thread")]
async fn exec_is_confined_default_handler() {
    exec_is_confined("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_is_confined_runc() {
    exec_is_confined("runc").await;
}

/// Two containers side by side in one pod (pid = POD, so with the pause
/// process): both start and see the pod's files (/etc/hosts,
/// /etc/resolv.conf, /dev/shm). The second one's init gets a pid in the
/// pod's PID namespace that no host process has: libcontainer 0.7's cgroup
/// v1 mount looked that pid up in the host's /proc and failed the create
/// ("failed to prepare rootfs") whenever it was missing there.
async fn two_containers_in_one_pod(handler: &str) {
    let mut e = env().await;
    let pod = e.pod("two", handler).await;
    let first = e.run(&pod, e.container("first")).await;
    let first_pid = e.pid_of(&first).await;
    // A pid no host process or thread has, below the host's last one (not
    // handed out again before pid_max wraps).
    let host_last: i32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let free = (100..host_last)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid below the host's last one");
    let st = std::process::Command::new(BUSYBOX)
        .args(["nsenter", "-t", &first_pid.to_string(), "-p", "--"])
        .args(["sh", "-c"])
        .arg(format!("echo {} > /proc/sys/kernel/ns_last_pid", free - 1))
        .status()
        .unwrap();
    assert!(st.success(), "setting the pod's ns_last_pid: {st}");
    let second = e.run(&pod, e.container("second")).await;
    let second_pid = e.pid_of(&second).await;
    let status = std::fs::read_to_string(format!("/proc/{second_pid}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.ends_with(&format!("\t{free}")),
        "the second init has pid {free} in the pod: {nspid}"
    );
    let (code, _) = e.sh(&first, "echo shared > /dev/shm/x").await;
    assert_eq!(code, 0);
    for id in [&first, &second] {
        let (code, out) = e.sh(id, "cat /etc/resolv.conf /etc/hosts /dev/shm/x").await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("nameserver 10.9.8.7") && out.contains("shared"),
            "{out}"
        );
    }
    for id in [&first, &second] {
        e.rt.stop_container(v1::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    }
    e.rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
    e.rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
    assert_eq!(mounts_under(&e.d.run_dir), Vec::<PathBuf>::new());
    assert_eq!(shim_processes_of(&e.d), 0);
    drop(e.net);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_containers_in_one_pod_embedded() {
    two_containers_in_one_pod("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_containers_in_one_pod_runc() {
    two_containers_in_one_pod("runc").await;
}

/// What a container must report of its image: the name the user gave, the
/// repo digest of the image it runs, the image ID.
#[derive(Debug, Clone, PartialEq)]
struct ImageReport {
    name: String,
    image_ref: String,
    image_id: String,
}

impl ImageReport {
    fn check_status(&self, st: &v1::ContainerStatus, what: &str) {
        let spec = st.image.clone().unwrap_or_default();
        let got = ImageReport {
            name: spec.image.clone(),
            image_ref: st.image_ref.clone(),
            image_id: st.image_id.clone(),
        };
        assert_eq!(&got, self, "{what}: ContainerStatus {st:?}");
        assert_eq!(spec.user_specified_image, self.name, "{what}: {st:?}");
        assert_eq!(spec.image_ref, self.image_ref, "{what}: {st:?}");
    }

    fn check_listed(&self, c: &v1::Container, what: &str) {
        let spec = c.image.clone().unwrap_or_default();
        let got = ImageReport {
            name: spec.image.clone(),
            image_ref: c.image_ref.clone(),
            image_id: c.image_id.clone(),
        };
        assert_eq!(&got, self, "{what}: ListContainers {c:?}");
        assert_eq!(spec.user_specified_image, self.name, "{what}: {c:?}");
    }
}

impl Env {
    /// ContainerStatus and ListContainers of each container report what
    /// `want` says (and v1alpha2's ListContainers the ID as image_ref).
    async fn check_images(&mut self, want: &[(&str, &ImageReport)], when: &str) {
        let listed = crust_test_support::cri::list_containers(&mut self.rt).await;
        let old = self
            .d
            .runtime_v1alpha2()
            .await
            .list_containers(
                crust_test_support::crust_api::v1alpha2::ListContainersRequest::default(),
            )
            .await
            .unwrap()
            .into_inner()
            .containers;
        for (id, report) in want {
            let (st, _) = self.status(id).await;
            report.check_status(&st, when);
            let c = listed.iter().find(|c| c.id == *id).expect("listed");
            report.check_listed(c, when);
            let c = old.iter().find(|c| c.id == *id).expect("listed (v1alpha2)");
            assert_eq!(c.image_ref, report.image_id, "{when}: v1alpha2 {c:?}");
        }
    }

    async fn events(&self) -> crust_test_support::tonic::Streaming<v1::ContainerEventResponse> {
        self.d
            .runtime_v1()
            .await
            .get_container_events(v1::GetEventsRequest {})
            .await
            .expect("GetContainerEvents")
            .into_inner()
    }
}

/// The next event of `kind` about container `id`.
async fn event_of(
    s: &mut crust_test_support::tonic::Streaming<v1::ContainerEventResponse>,
    kind: v1::ContainerEventType,
    id: &str,
) -> v1::ContainerEventResponse {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, s.message())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} event of {id} in time"))
            .expect("event stream broke")
            .expect("event stream ended");
        if ev.container_id == id && ev.container_event_type == kind as i32 {
            return ev;
        }
    }
}

/// The status of container `id` in an event.
fn status_in(ev: &v1::ContainerEventResponse, id: &str) -> v1::ContainerStatus {
    ev.containers_statuses
        .iter()
        .find(|s| s.id == id)
        .cloned()
        .unwrap_or_else(|| panic!("no status of {id} in {ev:?}"))
}

/// kubelet creates a container with the image ID in `image` and the pod's
/// image in `user_specified_image`, and shows ContainerStatus.image.image
/// as the pod's `containerStatuses[].image` and image_ref as its
/// `imageID`: the container reports the name the user gave, the repo digest
/// of the image it runs and the image ID, in ContainerStatus, ListContainers
/// and events; after a daemon restart; and after the tag moved on to
/// another image, which new containers then report.
#[tokio::test(flavor = "multi_thread")]
async fn containers_report_the_users_image_name_and_its_repo_digest() {
    let mut e = env().await;
    let host = e.reg.host.clone();
    let first = test_image();
    let id1 = first.id();
    let digest1 = format!("{host}/test/ctr@{}", first.manifest_digest());
    // The same image from a second repository: its repo digests are
    // test/ctr's, then other/ctr's.
    let other = format!("{host}/other/ctr:v1");
    let other_digest1 = format!("{host}/other/ctr@{}", first.manifest_digest());
    Pusher::new(&e.reg).image("other/ctr", "v1", &first).await;
    assert_eq!(pull_image(&mut e.d.image_v1().await, &other).await, id1);
    let pulled = e.image.clone();
    let mut events = e.events().await;
    let pod = e.pod("images", "").await;

    let kubelet_config = |name: &str, image_id: &str, user: &str| {
        let mut c = container_config(name, image_id);
        c.image.as_mut().unwrap().user_specified_image = user.into();
        c
    };
    // kubelet: the ID, and the pod's image as written.
    let by_kubelet = e.run(&pod, kubelet_config("kubelet", &id1, &pulled)).await;
    let kubelet1 = ImageReport {
        name: pulled.clone(),
        image_ref: digest1.clone(),
        image_id: id1.clone(),
    };
    // Of the image's repo digests, the one of the repository the user named.
    let from_other = e.run(&pod, kubelet_config("other", &id1, &other)).await;
    let other1 = ImageReport {
        name: other.clone(),
        image_ref: other_digest1,
        image_id: id1.clone(),
    };
    // crictl: a name in `image`, no user_specified_image.
    let by_crictl = e.run(&pod, e.container("crictl")).await;
    // An older kubelet: the ID alone; the image's first tag, as containerd
    // and CRI-O report it.
    let by_id = e.run(&pod, kubelet_config("by-id", &id1, "")).await;
    let all = [
        (by_kubelet.as_str(), &kubelet1),
        (from_other.as_str(), &other1),
        (by_crictl.as_str(), &kubelet1),
        (by_id.as_str(), &kubelet1),
    ];
    e.check_images(&all, "created").await;
    // The spec's image-name annotation names it as the user did (containerd).
    let (_, info) = e.status(&by_kubelet).await;
    let v: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
    assert_eq!(
        v["runtimeSpec"]["annotations"]["io.kubernetes.cri.image-name"],
        pulled.as_str(),
        "{v}"
    );
    for (id, report) in all {
        let ev = event_of(
            &mut events,
            v1::ContainerEventType::ContainerStartedEvent,
            id,
        )
        .await;
        report.check_status(&status_in(&ev, id), "started event");
    }
    drop(events);

    e.d.restart().await;
    e.rt = e.d.runtime_v1().await;
    e.check_images(&all, "after a restart").await;

    // The tag moves on to another image: the containers keep the name
    // they were given and the digest of the image they run.
    let second = build(ImageSpec {
        layers: first.layers.clone(),
        cmd: &["sleep", "2000"],
        ..ImageSpec::default()
    });
    let id2 = second.id();
    assert_ne!(id2, id1);
    let digest2 = format!("{host}/test/ctr@{}", second.manifest_digest());
    Pusher::new(&e.reg).image("test/ctr", "v1", &second).await;
    assert_eq!(pull_image(&mut e.d.image_v1().await, &pulled).await, id2);
    e.check_images(&all, "after the tag moved").await;
    let by_kubelet2 = e
        .run(&pod, kubelet_config("kubelet-2", &id2, &pulled))
        .await;
    let kubelet2 = ImageReport {
        name: pulled.clone(),
        image_ref: digest2,
        image_id: id2,
    };
    e.check_images(&[(by_kubelet2.as_str(), &kubelet2)], "the new image")
        .await;

    // Events after the restart say the same.
    let mut events = e.events().await;
    e.rt.stop_container(v1::StopContainerRequest {
        container_id: by_kubelet.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let ev = event_of(
        &mut events,
        v1::ContainerEventType::ContainerStoppedEvent,
        &by_kubelet,
    )
    .await;
    for (id, r) in all.iter().chain([&(by_kubelet2.as_str(), &kubelet2)]) {
        r.check_status(&status_in(&ev, id), "stopped event after the restart");
    }
    drop(e.net);
}

/// The node e2e suite's RuntimeClass specs run pods with the handler
/// `test-handler` (runc in containerd's node e2e config): with
/// contrib/node-e2e/runtimes.toml in its config, the daemon lists it in
/// Status and runs a pod and its containers with it, through runc.
#[tokio::test(flavor = "multi_thread")]
async fn the_node_e2e_test_handler_runs_pods_with_runc() {
    require!(Need::Runc);
    let config = include_str!("../../contrib/node-e2e/runtimes.toml");
    let mut e = env_with(Daemon::builder().config(config)).await;
    let status =
        e.rt.status(v1::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    let handler = |name: &str| {
        status
            .runtime_handlers
            .iter()
            .find(|h| h.name == name)
            .cloned()
    };
    let test_handler = handler("test-handler").unwrap_or_else(|| panic!("{status:?}"));
    // runc's features, and the built-in handlers stay.
    assert_eq!(test_handler.features, handler("runc").unwrap().features);
    for name in ["", "embedded", "runc"] {
        assert!(handler(name).is_some(), "{name:?}: {status:?}");
    }

    let pod = e.pod("rtclass", "test-handler").await;
    let st =
        e.rt.pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.0.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(st.runtime_handler, "test-handler");
    let id = e.run(&pod, e.container("app")).await;
    let (code, out, err) = e.exec(&id, &["echo", "hello"]).await;
    assert_eq!((code, out.as_str()), (0, "hello\n"), "{err}");
    let (st, _) = e.status(&id).await;
    assert_eq!(st.state, v1::ContainerState::ContainerRunning as i32);
    assert_eq!(st.image.unwrap().runtime_handler, "test-handler");
    // runc keeps the container's state under the handler's own root.
    let state =
        e.d.run_dir
            .join("runtimes/test-handler")
            .join(&id)
            .join("state.json");
    assert!(state.exists(), "{} is missing", state.display());
    drop(e.net);
}

/// An image with nothing but its binaries (no /tmp, /etc, /dev, /proc,
/// /sys: images built FROM scratch look like this) and a WORKDIR it lacks
/// runs on every handler: the runtime makes the working dir, as runc and
/// CRI-O do (the embedded handler failed with "failed to unix syscall").
async fn a_bare_image_runs(handler: &str) {
    if handler == "runc" {
        require!(Need::Runc);
    }
    let mut env = env().await;
    let bare = one_layer_image(
        &busybox_with(&["sh", "sleep", "ls"]).finish(),
        &["sleep", "1000"],
    );
    Pusher::new(&env.reg).image("test/bare", "v1", &bare).await;
    let image = format!("{}/test/bare:v1", env.reg.host);
    pull_image(&mut env.d.image_v1().await, &image).await;
    let pod = env.pod("bare", handler).await;
    let id = env.run(&pod, container_config("bare", &image)).await;
    // The image's WORKDIR (/tmp) was made for it, and it is the cwd.
    let (code, out) = env.sh(&id, "pwd; ls -d /tmp /etc /dev /proc /sys").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("/tmp\n"), "{out}");
    // A working dir under a file of the image is the client's mistake.
    let mut under_file = container_config("under-file", &image);
    under_file.working_dir = "/bin/sh/sub".into();
    let err = env.create(&pod, under_file).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("config.working_dir"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bare_image_runs_embedded() {
    a_bare_image_runs("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bare_image_runs_runc() {
    a_bare_image_runs("runc").await;
}

/// ListContainers answers from entries encoded once per version of a
/// container's record: every step (create, start, stop, remove) must show
/// in the very next list, for v1 and
/// v1alpha2 clients alike, and each entry must say what ContainerStatus
/// says.
#[tokio::test(flavor = "multi_thread")]
async fn list_containers_follows_every_step() {
    let mut e = env().await;
    let pod = e.pod("steps", "").await;
    let mut config = e.container("stepper");
    config.labels.insert("step".into(), "one".into());
    config.annotations.insert("note".into(), "kept".into());
    let id = e.create(&pod, config).await.unwrap();
    let mut old = e.d.runtime_v1alpha2().await;
    let listed = |rt: &mut Rt| {
        let mut rt = rt.clone();
        async move { crust_test_support::cri::list_containers(&mut rt).await }
    };
    let state_in = |list: &[v1::Container]| list.iter().find(|c| c.id == id).map(|c| c.state);

    // Listed twice: the second list is served from the kept entry.
    for _ in 0..2 {
        let list = listed(&mut e.rt).await;
        assert_eq!(
            state_in(&list),
            Some(v1::ContainerState::ContainerCreated as i32)
        );
    }
    let alpha = |old: &mut OldRt| {
        let mut old = old.clone();
        async move {
            old.list_containers(v1alpha2::ListContainersRequest::default())
                .await
                .unwrap()
                .into_inner()
                .containers
        }
    };
    let before = alpha(&mut old).await;
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].state, v1::ContainerState::ContainerCreated as i32);

    // Started.
    e.rt.start_container(v1::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    let list = listed(&mut e.rt).await;
    assert_eq!(
        state_in(&list),
        Some(v1::ContainerState::ContainerRunning as i32)
    );
    let after = alpha(&mut old).await;
    assert_eq!(after[0].state, v1::ContainerState::ContainerRunning as i32);
    // v1alpha2 kubelets match image_ref against ListImages' IDs.
    let (st, _) = e.status(&id).await;
    assert_eq!(after[0].image_ref, list[0].image_id);
    assert_eq!(list[0].image_ref, st.image_ref);
    assert_eq!(list[0].labels, st.labels);
    assert_eq!(list[0].annotations, st.annotations);
    assert_eq!(list[0].image, st.image);
    assert_eq!(list[0].metadata, st.metadata);
    assert_eq!(list[0].created_at, st.created_at);

    // Filters see the current state too.
    let running =
        e.rt.list_containers(v1::ListContainersRequest {
            filter: Some(v1::ContainerFilter {
                state: Some(v1::ContainerStateValue {
                    state: v1::ContainerState::ContainerRunning as i32,
                }),
                label_selector: [("step".to_string(), "one".to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert_eq!(running.len(), 1);

    // Stopped.
    e.rt.stop_container(v1::StopContainerRequest {
        container_id: id.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let list = listed(&mut e.rt).await;
    assert_eq!(
        state_in(&list),
        Some(v1::ContainerState::ContainerExited as i32)
    );
    assert_eq!(
        alpha(&mut old).await[0].state,
        v1::ContainerState::ContainerExited as i32
    );

    // Removed: gone from both.
    e.rt.remove_container(v1::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    assert!(listed(&mut e.rt).await.is_empty());
    assert!(alpha(&mut old).await.is_empty());
    drop(e.net);
}
