//! cgroups through the real daemon, with the cgroup driver of the run
//! (`CRUST_TEST_CGROUP_DRIVER`, default cgroupfs; the VM test bed runs the
//! suites once per driver): limits land in the cgroup files (and, with the
//! systemd driver, in the scope's unit properties), stats move, updates
//! and `unified` keys are checked, a killed monitor leaves no process,
//! cgroup or scope, a daemon restart keeps containers and their cgroups,
//! and removed pods leave no cgroup or slice.
//!
//! Tests that need what this machine lacks (systemd, cgroup v2, runc)
//! start with `require!` and are counted as skipped, with the reason, by
//! `make test`'s summary.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::Code;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, Need, WithImage, container_config, container_status, daemon_with_image, exec_sync,
    pod_metadata, process_alive, require, run_pod,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

fn systemd_driver() -> bool {
    crust_test_support::cgroup_driver() == "systemd"
}

fn cgroup_v2() -> bool {
    crust_test_support::require(Need::CgroupV2).is_none()
}

fn test_image() -> TestImage {
    let layer = busybox_with(&["sh", "cat", "sleep", "head", "true", "dd"])
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

struct Env {
    d: Daemon,
    _reg: Registry,
    image: String,
    rt: Rt,
    handler: &'static str,
}

async fn env(handler: &'static str) -> Env {
    let driver = if systemd_driver() {
        "systemd"
    } else {
        "cgroupfs"
    };
    let builder = Daemon::builder().config(&format!("cgroup_driver = \"{driver}\""));
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(builder, "test/cg", &test_image()).await;
    let rt = d.runtime_v1().await;
    Env {
        d,
        _reg: reg,
        image,
        rt,
        handler,
    }
}

/// A host-network pod sharing one PID namespace (so it has a pause
/// process, in the pod's cgroup or slice too).
fn pod_config(name: &str) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: pod_metadata(name, "crust-test-cgroups"),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Node as i32,
                    pid: v1::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

use crust_test_support::Pod;

impl Env {
    async fn pod(&mut self, name: &str) -> Pod {
        run_pod(&mut self.rt, pod_config(name), self.handler).await
    }

    fn container(&self, name: &str, resources: v1::LinuxContainerResources) -> v1::ContainerConfig {
        v1::ContainerConfig {
            log_path: String::new(),
            linux: Some(v1::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(v1::LinuxContainerSecurityContext::default()),
            }),
            ..container_config(name, &self.image)
        }
    }

    async fn create(
        &mut self,
        pod: &Pod,
        config: v1::ContainerConfig,
    ) -> Result<String, crust_test_support::tonic::Status> {
        crust_test_support::create_container(&mut self.rt, pod, config).await
    }

    async fn run(&mut self, pod: &Pod, config: v1::ContainerConfig) -> String {
        crust_test_support::run_container(&mut self.rt, pod, config).await
    }

    async fn sh(&mut self, id: &str, script: &str) -> i32 {
        exec_sync(&mut self.rt, id, &["sh", "-c", script], 60)
            .await
            .0
    }

    async fn status(&mut self, id: &str) -> (v1::ContainerStatus, serde_json::Value) {
        let r = container_status(&mut self.rt, id).await;
        let info = r
            .info
            .get("info")
            .map(|i| serde_json::from_str(i).unwrap())
            .unwrap_or_default();
        (r.status.unwrap(), info)
    }

    async fn pid_of(&mut self, id: &str) -> i32 {
        self.status(id).await.1["pid"].as_i64().unwrap() as i32
    }

    async fn stats(&mut self, id: &str) -> v1::ContainerStats {
        self.rt
            .container_stats(v1::ContainerStatsRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("ContainerStats: {e}"))
            .into_inner()
            .stats
            .unwrap()
    }

    async fn remove_container(&mut self, id: &str) {
        self.rt
            .stop_container(v1::StopContainerRequest {
                container_id: id.into(),
                timeout: 0,
            })
            .await
            .unwrap();
        self.rt
            .remove_container(v1::RemoveContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap();
    }

    async fn remove_pod(&mut self, id: &str) {
        self.rt
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap();
        self.rt
            .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .unwrap();
    }

    async fn update(
        &mut self,
        id: &str,
        resources: v1::LinuxContainerResources,
    ) -> Result<(), crust_test_support::tonic::Status> {
        self.rt
            .update_container_resources(v1::UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(resources),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// Messages the daemon should never log for an ordinary container
    /// life (the orphan cleanup crying wolf).
    fn assert_no_orphan_warnings(&self) {
        let logs = self.d.logs();
        for bad in [
            "is not a cgroupfs path",
            "processes are left running",
            "cannot kill its processes",
        ] {
            assert!(!logs.contains(bad), "the daemon logged {bad:?}:\n{logs}");
        }
    }
}

/// A process's cgroups: (hierarchy dir under /sys/fs/cgroup, path), the
/// unified one ("") and every v1 controller hierarchy.
fn cgroups_of(pid: i32) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, ctrls, path) = (p.next()?, p.next()?, p.next()?);
            let dir = if ctrls.is_empty() {
                if cgroup_v2() { "" } else { "unified" }.to_string()
            } else {
                ctrls.trim_start_matches("name=").to_string()
            };
            Some((dir, path.to_string()))
        })
        .collect()
}

/// The directory of a cgroup in hierarchy `dir`.
fn cgroup_dir(dir: &str, path: &str) -> PathBuf {
    Path::new("/sys/fs/cgroup")
        .join(dir)
        .join(path.trim_start_matches('/'))
}

/// The path of a process's cgroup in the hierarchy of controller `ctrl`
/// (v2: the unified one).
fn cgroup_path_of(pid: i32, ctrl: &str) -> Option<String> {
    cgroups_of(pid)
        .into_iter()
        .find(|(dir, _)| {
            if cgroup_v2() {
                dir.is_empty()
            } else {
                dir.split(',').any(|c| c == ctrl)
            }
        })
        .map(|(_, path)| path)
}

/// Whether `pid`'s own hugetlb cgroup has the 2 MB page files (systemd
/// does not delegate hugetlb to scopes).
fn has_hugetlb_files(pid: i32) -> bool {
    let Some(path) = cgroup_path_of(pid, "hugetlb") else {
        return false;
    };
    let dir = if cgroup_v2() {
        cgroup_dir("", &path)
    } else {
        cgroup_dir("hugetlb", &path)
    };
    dir.join("hugetlb.2MB.max").exists() || dir.join("hugetlb.2MB.limit_in_bytes").exists()
}

fn read_cgroup_file(pid: i32, ctrl: &str, file: &str) -> String {
    let path = cgroup_path_of(pid, ctrl).unwrap_or_else(|| panic!("{pid} has no {ctrl} cgroup"));
    let dir = if cgroup_v2() {
        cgroup_dir("", &path)
    } else {
        let mount = cgroups_of(pid)
            .into_iter()
            .find(|(d, _)| d.split(',').any(|c| c == ctrl))
            .unwrap()
            .0;
        cgroup_dir(&mount, &path)
    };
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

/// `systemctl show -p PROP --value UNIT`.
fn unit_property(unit: &str, prop: &str) -> String {
    let out = std::process::Command::new("systemctl")
        .args(["show", "-p", prop, "--value", unit])
        .output()
        .expect("systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn unit_gone(unit: &str) -> bool {
    let state = unit_property(unit, "ActiveState");
    state.is_empty() || state == "inactive"
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + crust_test_support::patience(Duration::from_secs(20));
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const MIB: i64 = 1 << 20;

fn unified(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Limits, stats, updates, `unified` keys and removal, for one handler.
async fn limits_stats_update_and_removal(handler: &'static str) {
    let mut e = env(handler).await;
    let pod = e.pod("limits").await;
    let v2 = cgroup_v2();
    let mut res = v1::LinuxContainerResources {
        memory_limit_in_bytes: 64 * MIB,
        cpu_period: 100_000,
        cpu_quota: 50_000,
        ..Default::default()
    };
    // Bad unified keys are refused by name before anything is made.
    for key in ["cgroup.procs", "../memory.max", "memory.max/x"] {
        let mut bad = res.clone();
        bad.unified = unified(&[(key, "1")]);
        let err = e.create(&pod, e.container("bad", bad)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains("unified"), "{err}");
        // Named on v1 too: the key's form is checked before the version.
        assert!(err.message().contains(key), "{err}");
    }
    // Keys kubelet sets on v2: memory.oom.group=1 for every container
    // (the OOM killer ends the whole container), memory.swap.max with
    // NodeSwap, memory.high with MemoryQoS. systemd has a property for
    // memory.high only; the others reach a scope only because the daemon
    // writes them (libcontainer's systemd manager drops them).
    if v2 {
        res.unified = unified(&[
            ("memory.high", "61440000"),
            ("memory.oom.group", "1"),
            ("memory.swap.max", "8388608"),
        ]);
    }
    let id = e.run(&pod, e.container("limits", res)).await;
    let pid = e.pid_of(&id).await;

    // The container's cgroup is where the driver puts it.
    let path = cgroup_path_of(pid, "memory").unwrap();
    let scope = format!("crust-{id}.scope");
    if systemd_driver() {
        assert!(
            path.ends_with(&format!("crust-pod{}.slice/{scope}", pod.0)),
            "{path}"
        );
        assert_eq!(unit_property(&scope, "Delegate"), "yes");
        assert_eq!(unit_property(&scope, "MemoryMax"), (64 * MIB).to_string());
        assert_eq!(unit_property(&scope, "CPUQuotaPerSecUSec"), "500ms");
    } else {
        assert!(
            path.ends_with(&format!("/crust-{}/crust-{id}", pod.0)),
            "{path}"
        );
    }
    if v2 {
        assert_eq!(
            read_cgroup_file(pid, "memory", "memory.max"),
            (64 * MIB).to_string()
        );
        assert_eq!(read_cgroup_file(pid, "cpu", "cpu.max"), "50000 100000");
        assert_eq!(read_cgroup_file(pid, "memory", "memory.high"), "61440000");
        assert_eq!(read_cgroup_file(pid, "memory", "memory.oom.group"), "1");
        assert_eq!(
            read_cgroup_file(pid, "memory", "memory.swap.max"),
            "8388608"
        );
    } else {
        assert_eq!(
            read_cgroup_file(pid, "memory", "memory.limit_in_bytes"),
            (64 * MIB).to_string()
        );
        assert_eq!(read_cgroup_file(pid, "cpu", "cpu.cfs_quota_us"), "50000");
    }

    // Stats come from that cgroup, and move.
    let first = e.stats(&id).await;
    let cpu = first.cpu.expect("cpu stats");
    assert!(cpu.timestamp > 0, "{first:?}");
    let mem = first.memory.expect("memory stats");
    assert!(mem.working_set_bytes.unwrap().value > 0, "{first:?}");
    let used = |s: &v1::ContainerStats| {
        s.cpu
            .as_ref()
            .and_then(|c| c.usage_core_nano_seconds)
            .unwrap()
            .value
    };
    let usage =
        |s: &v1::ContainerStats| s.memory.as_ref().and_then(|m| m.usage_bytes).unwrap().value;
    assert_eq!(
        e.sh(&id, "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done")
            .await,
        0
    );
    assert_eq!(
        e.sh(&id, "head -c 20000000 /dev/zero > /dev/shm/fill")
            .await,
        0
    );
    let second = e.stats(&id).await;
    assert!(used(&second) > used(&first), "{first:?}\n{second:?}");
    assert!(
        usage(&second) >= usage(&first) + 15_000_000,
        "{first:?}\n{second:?}"
    );
    let pod_stats =
        e.rt.pod_sandbox_stats(v1::PodSandboxStatsRequest {
            pod_sandbox_id: pod.0.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let linux = pod_stats.linux.unwrap();
    assert!(linux.cpu.unwrap().timestamp > 0);
    // The pod's cgroup holds the 20 MB the container wrote. (Not compared
    // with the container's own figure read earlier: usage moves by a few
    // pages between two reads, e.g. when per-CPU charge caches drain.)
    let pod_usage = linux.memory.unwrap().usage_bytes.unwrap().value;
    assert!(
        pod_usage >= usage(&first) + 15_000_000,
        "the pod's cgroup holds its containers: pod {pod_usage} bytes, container {} then {}",
        usage(&first),
        usage(&second)
    );

    // Updates land; bad unified keys are refused by name.
    let more = v1::LinuxContainerResources {
        memory_limit_in_bytes: 128 * MIB,
        ..Default::default()
    };
    e.update(&id, more).await.unwrap();
    let file = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    assert_eq!(
        read_cgroup_file(pid, "memory", file),
        (128 * MIB).to_string()
    );
    if v2 {
        // An update (here: a new MemoryMax, which makes systemd rewrite
        // the scope's memory files) keeps the keys of the create.
        assert_eq!(read_cgroup_file(pid, "memory", "memory.oom.group"), "1");
        assert_eq!(
            read_cgroup_file(pid, "memory", "memory.swap.max"),
            "8388608"
        );
    }
    let bad = v1::LinuxContainerResources {
        unified: unified(&[("cgroup.kill", "1")]),
        ..Default::default()
    };
    let err = e.update(&id, bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("cgroup.kill"), "{err}");
    assert!(process_alive(pid), "a refused update killed the container");
    let high = v1::LinuxContainerResources {
        unified: unified(&[("memory.high", "81920000")]),
        ..Default::default()
    };
    if v2 {
        e.update(&id, high).await.unwrap();
        assert_eq!(read_cgroup_file(pid, "memory", "memory.high"), "81920000");
    } else {
        // A well-formed key, but v1 has no unified files.
        let err = e.update(&id, high).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains("needs cgroup v2"), "{err}");
    }

    // Removal leaves no cgroup (and no scope); the pod's goes with it.
    let dirs: Vec<PathBuf> = cgroups_of(pid)
        .iter()
        .filter(|(_, p)| p.contains(&id))
        .map(|(d, p)| cgroup_dir(d, p))
        .collect();
    assert!(!dirs.is_empty());
    let pod_dirs: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.parent().unwrap().to_path_buf())
        .collect();
    e.remove_container(&id).await;
    for d in &dirs {
        assert!(!d.exists(), "{} is left", d.display());
    }
    if systemd_driver() {
        assert!(unit_gone(&scope), "{scope} is left");
    }
    e.remove_pod(&pod.0).await;
    for d in &pod_dirs {
        assert!(!d.exists(), "the pod's cgroup {} is left", d.display());
    }
    if systemd_driver() {
        let slice = format!("crust-pod{}.slice", pod.0);
        assert!(unit_gone(&slice), "{slice} is left");
    }
    e.assert_no_orphan_warnings();
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_stats_update_and_removal_embedded() {
    limits_stats_update_and_removal("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_stats_update_and_removal_runc() {
    require!(Need::Runc);
    limits_stats_update_and_removal("runc").await;
}

/// Whether the node has the hugetlb controller (v1 mount or v2 root).
fn hugetlb_controller() -> bool {
    if cgroup_v2() {
        std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "hugetlb"))
    } else {
        Path::new("/sys/fs/cgroup/hugetlb").is_dir()
    }
}

/// What the cgroup files of a container say of memory and CPU:
/// (memory limit, cpu quota, cpu period).
fn memory_and_cpu_files(pid: i32) -> (String, String, String) {
    if cgroup_v2() {
        let max = read_cgroup_file(pid, "cpu", "cpu.max");
        let (q, p) = max.split_once(' ').unwrap();
        (
            read_cgroup_file(pid, "memory", "memory.max"),
            q.to_string(),
            p.to_string(),
        )
    } else {
        (
            read_cgroup_file(pid, "memory", "memory.limit_in_bytes"),
            read_cgroup_file(pid, "cpu", "cpu.cfs_quota_us"),
            read_cgroup_file(pid, "cpu", "cpu.cfs_period_us"),
        )
    }
}

/// In-place resize as kubelet does it: several UpdateContainerResources
/// in a row, each landing in the cgroup files, ContainerStatus.resources
/// showing everything in force (what an update leaves out stays), bad
/// updates refused by field with nothing changed, the container running
/// throughout.
async fn resize_in_place(handler: &'static str) {
    let mut e = env(handler).await;
    let pod = e.pod("resize").await;
    let id = e
        .run(
            &pod,
            e.container(
                "resize",
                v1::LinuxContainerResources {
                    memory_limit_in_bytes: 64 * MIB,
                    cpu_period: 100_000,
                    cpu_quota: 50_000,
                    cpu_shares: 512,
                    ..Default::default()
                },
            ),
        )
        .await;
    let pid = e.pid_of(&id).await;
    let files =
        |limit: i64, quota: i64| (limit.to_string(), quota.to_string(), "100000".to_string());
    assert_eq!(memory_and_cpu_files(pid), files(64 * MIB, 50_000));

    async fn in_force(e: &mut Env, id: &str) -> v1::LinuxContainerResources {
        e.status(id)
            .await
            .0
            .resources
            .and_then(|r| r.linux)
            .expect("ContainerStatus.resources.linux")
    }

    // 1: memory only; the CPU limits stay, in the files and the status.
    e.update(
        &id,
        v1::LinuxContainerResources {
            memory_limit_in_bytes: 128 * MIB,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(memory_and_cpu_files(pid), files(128 * MIB, 50_000));
    let r = in_force(&mut e, &id).await;
    assert_eq!(
        (
            r.memory_limit_in_bytes,
            r.cpu_quota,
            r.cpu_period,
            r.cpu_shares
        ),
        (128 * MIB, 50_000, 100_000, 512)
    );

    // 2: CPU only; the memory limit set before stays.
    e.update(
        &id,
        v1::LinuxContainerResources {
            cpu_quota: 20_000,
            cpu_shares: 256,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(memory_and_cpu_files(pid), files(128 * MIB, 20_000));
    if !cgroup_v2() {
        assert_eq!(read_cgroup_file(pid, "cpu", "cpu.shares"), "256");
    }
    let r = in_force(&mut e, &id).await;
    assert_eq!(
        (r.memory_limit_in_bytes, r.cpu_quota, r.cpu_shares),
        (128 * MIB, 20_000, 256)
    );

    // 3: oom_score_adj lands on the container's processes (the daemon
    // cannot go below its own: ask above it).
    let own: i64 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = own.max(0) + 100;
    e.update(
        &id,
        v1::LinuxContainerResources {
            oom_score_adj: want,
            memory_limit_in_bytes: 96 * MIB,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let oom = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
    assert_eq!(oom.trim(), want.to_string());
    assert_eq!(memory_and_cpu_files(pid), files(96 * MIB, 20_000));
    let before = in_force(&mut e, &id).await;
    assert_eq!(
        (
            before.oom_score_adj,
            before.memory_limit_in_bytes,
            before.cpu_quota
        ),
        (want, 96 * MIB, 20_000)
    );

    // Bad updates: refused naming the field, nothing changes.
    let mut bad: Vec<(v1::LinuxContainerResources, &str)> = vec![
        (
            v1::LinuxContainerResources {
                cpu_quota: -5,
                ..Default::default()
            },
            "linux.cpu_quota",
        ),
        (
            v1::LinuxContainerResources {
                cpu_period: 500,
                memory_limit_in_bytes: 32 * MIB,
                ..Default::default()
            },
            "linux.cpu_period",
        ),
        (
            v1::LinuxContainerResources {
                memory_limit_in_bytes: -1,
                ..Default::default()
            },
            "linux.memory_limit_in_bytes",
        ),
        (
            v1::LinuxContainerResources {
                oom_score_adj: 5000,
                ..Default::default()
            },
            "linux.oom_score_adj",
        ),
        (
            v1::LinuxContainerResources {
                cpuset_cpus: "0-".into(),
                ..Default::default()
            },
            "linux.cpuset_cpus",
        ),
    ];
    let hugetlb = hugetlb_controller() && has_hugetlb_files(pid);
    if !hugetlb {
        // Not silently dropped: a limit this node (or, with the systemd
        // driver, the container's scope) cannot keep is refused.
        bad.push((
            v1::LinuxContainerResources {
                hugepage_limits: vec![v1::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 * MIB as u64,
                }],
                ..Default::default()
            },
            "linux.hugepage_limits[0]",
        ));
    }
    for (res, field) in bad {
        let err = e.update(&id, res).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err}");
        assert!(err.message().starts_with(field), "{field}: {err}");
        assert_eq!(
            memory_and_cpu_files(pid),
            files(96 * MIB, 20_000),
            "{field}"
        );
        assert_eq!(in_force(&mut e, &id).await, before, "{field}");
        assert!(process_alive(pid), "{field}: the container died");
    }
    if hugetlb {
        e.update(
            &id,
            v1::LinuxContainerResources {
                hugepage_limits: vec![v1::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 * MIB as u64,
                }],
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let file = if cgroup_v2() {
            "hugetlb.2MB.max"
        } else {
            "hugetlb.2MB.limit_in_bytes"
        };
        assert_eq!(
            read_cgroup_file(pid, "hugetlb", file),
            (4 * MIB).to_string()
        );
    } else {
        crust_test_support::skipped("the huge page part: the node has no hugetlb controller");
    }

    // Still the same process, still answering.
    assert_eq!(e.pid_of(&id).await, pid);
    assert_eq!(e.sh(&id, "true").await, 0);
    e.remove_container(&id).await;
    e.remove_pod(&pod.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resize_in_place_embedded() {
    resize_in_place("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resize_in_place_runc() {
    require!(Need::Runc);
    resize_in_place("runc").await;
}

/// UpdatePodSandboxResources: the pod cgroup (the parent of its
/// containers' cgroups or scopes) gets the pod's resources plus its
/// overhead; the containers' own limits stay; bad values are refused by
/// field with nothing changed.
#[tokio::test(flavor = "multi_thread")]
async fn pod_resize_sets_the_pod_cgroup() {
    let mut e = env("").await;
    let pod = e.pod("podresize").await;
    let id = e
        .run(
            &pod,
            e.container(
                "c",
                v1::LinuxContainerResources {
                    memory_limit_in_bytes: 64 * MIB,
                    cpu_period: 100_000,
                    cpu_quota: 50_000,
                    ..Default::default()
                },
            ),
        )
        .await;
    let pid = e.pid_of(&id).await;
    // The pod cgroup's file: the container cgroup's parent dir.
    let pod_file = |ctrl: &str, file: &str| {
        let (mount, path) = cgroups_of(pid)
            .into_iter()
            .find(|(d, _)| {
                if cgroup_v2() {
                    d.is_empty()
                } else {
                    d.split(',').any(|c| c == ctrl)
                }
            })
            .unwrap();
        let dir = cgroup_dir(&mount, &path);
        let f = dir.parent().unwrap().join(file);
        std::fs::read_to_string(&f)
            .unwrap_or_else(|err| panic!("{}: {err}", f.display()))
            .trim()
            .to_string()
    };
    let (mem_file, quota_of) = if cgroup_v2() {
        ("memory.max", "cpu.max")
    } else {
        ("memory.limit_in_bytes", "cpu.cfs_quota_us")
    };
    let quota = |v: String| v.split(' ').next().unwrap().to_string();
    let resize = |overhead: v1::LinuxContainerResources, resources: v1::LinuxContainerResources| {
        v1::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.0.clone(),
            overhead: Some(overhead),
            resources: Some(resources),
        }
    };
    let ok = resize(
        v1::LinuxContainerResources {
            memory_limit_in_bytes: 16 * MIB,
            cpu_period: 100_000,
            cpu_quota: 10_000,
            ..Default::default()
        },
        v1::LinuxContainerResources {
            memory_limit_in_bytes: 256 * MIB,
            cpu_period: 100_000,
            cpu_quota: 200_000,
            ..Default::default()
        },
    );
    e.rt.update_pod_sandbox_resources(ok).await.unwrap();
    assert_eq!(pod_file("memory", mem_file), (272 * MIB).to_string());
    assert_eq!(quota(pod_file("cpu", quota_of)), "210000");
    // The container keeps its own limits.
    assert_eq!(memory_and_cpu_files(pid).0, (64 * MIB).to_string());
    assert_eq!(memory_and_cpu_files(pid).1, "50000");

    // A second resize replaces the first.
    let smaller = resize(
        v1::LinuxContainerResources::default(),
        v1::LinuxContainerResources {
            memory_limit_in_bytes: 128 * MIB,
            cpu_period: 100_000,
            cpu_quota: 100_000,
            ..Default::default()
        },
    );
    e.rt.update_pod_sandbox_resources(smaller).await.unwrap();
    assert_eq!(pod_file("memory", mem_file), (128 * MIB).to_string());
    assert_eq!(quota(pod_file("cpu", quota_of)), "100000");

    for (req, field) in [
        (
            resize(
                v1::LinuxContainerResources {
                    memory_limit_in_bytes: -1,
                    ..Default::default()
                },
                Default::default(),
            ),
            "overhead.memory_limit_in_bytes",
        ),
        (
            resize(
                Default::default(),
                v1::LinuxContainerResources {
                    cpu_quota: -2,
                    memory_limit_in_bytes: 32 * MIB,
                    ..Default::default()
                },
            ),
            "resources.cpu_quota",
        ),
        (
            resize(
                Default::default(),
                v1::LinuxContainerResources {
                    oom_score_adj: 100,
                    ..Default::default()
                },
            ),
            "resources.oom_score_adj",
        ),
    ] {
        let err = e.rt.update_pod_sandbox_resources(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err}");
        assert!(err.message().starts_with(field), "{field}: {err}");
        assert_eq!(pod_file("memory", mem_file), (128 * MIB).to_string());
    }
    let mut unknown = resize(Default::default(), Default::default());
    unknown.pod_sandbox_id = "0123456789abcdef".into();
    let err =
        e.rt.update_pod_sandbox_resources(unknown)
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(process_alive(pid));
    e.remove_container(&id).await;
    e.remove_pod(&pod.0).await;
}

/// The pid of the monitor of container `id`.
fn monitor_pid(run_dir: &Path, id: &str) -> i32 {
    let dir = run_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains("crust-shim") && cmd.contains(&dir) && cmd.contains(id)).then_some(pid)
        })
        .next()
        .expect("the container's monitor")
}

/// A SIGKILLed monitor: the daemon ends the container, and its cgroup
/// (scope) goes; nothing is left running, nothing is warned.
async fn a_killed_monitor_leaves_nothing(handler: &'static str) {
    let mut e = env(handler).await;
    let pod = e.pod("orphan").await;
    let id = e.run(&pod, e.container("orphan", Default::default())).await;
    let pid = e.pid_of(&id).await;
    let dirs: Vec<PathBuf> = cgroups_of(pid)
        .iter()
        .filter(|(_, p)| p.contains(&id))
        .map(|(d, p)| cgroup_dir(d, p))
        .collect();
    assert!(!dirs.is_empty(), "{:?}", cgroups_of(pid));
    let monitor = monitor_pid(&e.d.run_dir, &id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(monitor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + crust_test_support::patience(Duration::from_secs(20));
    loop {
        let (st, _) = e.status(&id).await;
        if st.state == v1::ContainerState::ContainerExited as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for("the container's init to go", || !process_alive(pid)).await;
    wait_for("the container's cgroup to go", || {
        dirs.iter().all(|d| !d.exists())
    })
    .await;
    if systemd_driver() {
        let scope = format!("crust-{id}.scope");
        assert!(unit_gone(&scope), "{scope} is left");
    }
    assert!(
        e.d.logs().contains("killed what was left of the container"),
        "{}",
        e.d.logs()
    );
    e.rt.remove_container(v1::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    e.remove_pod(&pod.0).await;
    e.assert_no_orphan_warnings();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_monitor_leaves_nothing_embedded() {
    a_killed_monitor_leaves_nothing("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_monitor_leaves_nothing_runc() {
    require!(Need::Runc);
    a_killed_monitor_leaves_nothing("runc").await;
}

/// A daemon restart keeps the container running in its cgroup, and the
/// restarted daemon reads its stats and removes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_keeps_containers_and_their_cgroups() {
    let mut e = env("").await;
    let pod = e.pod("restart").await;
    let id = e
        .run(&pod, e.container("restart", Default::default()))
        .await;
    let pid = e.pid_of(&id).await;
    let before = cgroups_of(pid);
    e.d.restart().await;
    e.rt = e.d.runtime_v1().await;
    assert!(process_alive(pid));
    assert_eq!(cgroups_of(pid), before);
    let (st, _) = e.status(&id).await;
    assert_eq!(st.state, v1::ContainerState::ContainerRunning as i32);
    let stats = e.stats(&id).await;
    assert!(stats.cpu.unwrap().timestamp > 0);
    e.remove_container(&id).await;
    e.remove_pod(&pod.0).await;
    wait_for("the container's init to go", || !process_alive(pid)).await;
    e.assert_no_orphan_warnings();
}

/// The systemd driver cannot work from a PID namespace of its own (systemd
/// would be handed PIDs it does not know): the daemon says so at start,
/// instead of failing every pod with a D-Bus error.
#[test]
fn the_systemd_driver_refuses_a_pid_namespace_of_its_own() {
    require!(Need::Systemd);
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("unshare")
        .args(["-p", "-f", "--mount-proc", "--kill-child"])
        .arg(crust_test_support::crust_bin())
        .args(["daemon", "--cgroup-driver", "systemd", "--socket"])
        .arg(dir.path().join("s.sock"))
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    // A daemon that starts anyway serves until it is told to stop.
    let deadline = Instant::now() + crust_test_support::patience(Duration::from_secs(20));
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon started with the systemd driver in a PID namespace of its own");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PID namespace of its own"), "{err}");
    assert!(!dir.path().join("s.sock").exists());
}

/// An exec'd process is in the container's cgroup from its first
/// instruction: its first act (cat reading /proc/self/cgroup) sees what
/// the container's init saw at its start, never the monitor's cgroup. On
/// cgroup v2 the embedded handler clones it there (CLONE_INTO_CGROUP).
async fn exec_starts_in_the_containers_cgroup(handler: &'static str) {
    let mut e = env(handler).await;
    let pod = e.pod("execcg").await;
    let mut config = e.container("execcg", Default::default());
    config.command = vec!["sh".into(), "-c".into()];
    config.args = vec!["cat /proc/self/cgroup > /tmp/init.cgroup; exec sleep 1000".into()];
    let id = e.run(&pod, config).await;
    let pid = e.pid_of(&id).await;
    let exec = |cmd: &[&str]| {
        let req = v1::ExecSyncRequest {
            container_id: id.clone(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 60,
        };
        let mut rt = e.rt.clone();
        async move {
            let r = rt
                .exec_sync(req)
                .await
                .unwrap_or_else(|err| panic!("ExecSync: {err}"))
                .into_inner();
            assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
            String::from_utf8(r.stdout).unwrap()
        }
    };
    let mut init_view = String::new();
    for _ in 0..100 {
        init_view = exec(&["cat", "/tmp/init.cgroup"]).await;
        if !init_view.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!init_view.is_empty(), "the init wrote no /tmp/init.cgroup");
    for _ in 0..3 {
        assert_eq!(exec(&["cat", "/proc/self/cgroup"]).await, init_view);
    }
    // And that is the container's own cgroup, seen from the host.
    let path = cgroup_path_of(pid, "memory").unwrap();
    assert!(path.contains(&id), "{path}");
    if cgroup_v2() {
        // The container's own cgroup namespace: its root is the cgroup.
        assert_eq!(init_view, "0::/\n");
    }
    e.remove_container(&id).await;
    e.remove_pod(&pod.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_starts_in_the_containers_cgroup_embedded() {
    exec_starts_in_the_containers_cgroup("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_starts_in_the_containers_cgroup_runc() {
    require!(Need::Runc);
    exec_starts_in_the_containers_cgroup("runc").await;
}

/// A container killed by the OOM killer exits 137 with reason OOMKilled,
/// also where its cgroup goes with its last process (systemd scopes: with
/// systemd's default OOMPolicy=stop the scope is stopped on the kill).
async fn an_oom_kill_is_reported(handler: &'static str) {
    let mut e = env(handler).await;
    let pod = e.pod("oom").await;
    let mut config = e.container(
        "oom",
        v1::LinuxContainerResources {
            memory_limit_in_bytes: 16 * MIB,
            memory_swap_limit_in_bytes: 16 * MIB,
            ..Default::default()
        },
    );
    config.command = vec!["sh".into(), "-c".into()];
    config.args = vec!["dd if=/dev/zero of=/dev/null bs=40M".into()];
    let id = e.run(&pod, config).await;
    let deadline = Instant::now() + crust_test_support::patience(Duration::from_secs(30));
    let st = loop {
        let (st, _) = e.status(&id).await;
        if st.state == v1::ContainerState::ContainerExited as i32 {
            break st;
        }
        assert!(Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{st:?}"
    );
    e.rt.remove_container(v1::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap();
    e.remove_pod(&pod.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oom_kill_is_reported_embedded() {
    an_oom_kill_is_reported("").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oom_kill_is_reported_runc() {
    require!(Need::Runc);
    an_oom_kill_is_reported("runc").await;
}
