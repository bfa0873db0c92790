//! contrib/systemd/crust.service under a real systemd (the VM test bed,
//! hack/vm: cgroup v2, systemd as PID 1): it starts (Type=notify: `systemctl
//! start` returns once crust is ready), `systemctl restart` keeps a running
//! container running (KillMode=process) and the new daemon recovers it, and
//! `systemctl stop` stops the daemon cleanly.
//!
//! The unit under test is the shipped file with only its ExecStart pointed
//! at the binary under test and a config of the test's own, installed as a
//! transient unit in /run/systemd/system (the VM's / is the host's,
//! read-only). Where systemd is not the init system the test is reported as
//! skipped (a `SKIPPED:` line the test summary counts).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crust_tests::crust_api::v1;
use crust_tests::registry::*;
use crust_tests::{connect, crust_bin, process_alive};

const UNIT: &str = "crust-unit-test.service";

fn systemctl(args: &[&str]) -> (bool, String) {
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .expect("run systemctl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn show(property: &str) -> String {
    let (_, out) = systemctl(&["show", "-p", property, "--value", UNIT]);
    out.trim().to_string()
}

/// Stops and removes the test unit, and everything its daemon left, even
/// when the test fails.
struct Installed {
    unit_path: PathBuf,
    dir: tempfile::TempDir,
    socket: PathBuf,
    config: PathBuf,
}

impl Drop for Installed {
    fn drop(&mut self) {
        // Remove the pods through a daemon (the unit's, started again if
        // needed), so monitors, mounts and cgroups go as in production.
        let _ = systemctl(&["start", UNIT]);
        let socket = self.socket.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok(ch) = connect(&socket).await else {
                    return;
                };
                let mut c = v1::runtime_service_client::RuntimeServiceClient::new(ch);
                let Ok(list) = c
                    .list_pod_sandbox(v1::ListPodSandboxRequest::default())
                    .await
                else {
                    return;
                };
                for p in list.into_inner().items {
                    let _ = c
                        .stop_pod_sandbox(v1::StopPodSandboxRequest {
                            pod_sandbox_id: p.id.clone(),
                        })
                        .await;
                    let _ = c
                        .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                            pod_sandbox_id: p.id,
                        })
                        .await;
                }
            });
        })
        .join();
        let _ = systemctl(&["stop", UNIT]);
        let _ = systemctl(&["reset-failed", UNIT]);
        let _ = std::fs::remove_file(&self.unit_path);
        let _ = systemctl(&["daemon-reload"]);
        for m in crust_tests::mounts_under(self.dir.path()).into_iter().rev() {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = &self.config;
    }
}

/// The shipped unit, pointed at the binary under test and `config`.
fn unit_text(config: &Path) -> String {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/systemd/crust.service"),
    )
    .expect("contrib/systemd/crust.service");
    let exec = format!(
        "ExecStart={} daemon --config {}",
        crust_bin().display(),
        config.display()
    );
    let mut replaced = false;
    let text: Vec<String> = shipped
        .lines()
        .map(|l| {
            if l.starts_with("ExecStart=") {
                replaced = true;
                exec.clone()
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(replaced, "the shipped unit has no ExecStart");
    text.join("\n") + "\n"
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_unit_starts_restarts_with_containers_running_and_stops() {
    if !Path::new("/run/systemd/system").is_dir() {
        // Straight to stderr, past libtest's capture, as the harness's
        // counted skips are reported.
        use std::io::Write;
        let _ = std::io::stderr().lock().write_all(
            b"SKIPPED: the_unit_starts_restarts_with_containers_running_and_stops: \
              needs systemd as the init system\n",
        );
        return;
    }
    // The VM has a /tmp of its own, which its systemd and this test share.
    let dir = tempfile::Builder::new()
        .prefix("crust-unit-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let socket = dir.path().join("crust.sock");
    let config = dir.path().join("config.toml");
    let driver = std::env::var("CRUST_TEST_CGROUP_DRIVER").unwrap_or_else(|_| "cgroupfs".into());
    std::fs::create_dir_all(dir.path().join("cni")).unwrap();
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nroot = \"{}\"\nrun_dir = \"{}\"\ncgroup_driver = \"{driver}\"\n\
             [network]\ncni_conf_dir = \"{}\"\n",
            socket.display(),
            dir.path().join("root").display(),
            dir.path().join("run").display(),
            dir.path().join("cni").display(),
        ),
    )
    .unwrap();
    let unit_path = PathBuf::from("/run/systemd/system").join(UNIT);
    std::fs::write(&unit_path, unit_text(&config)).unwrap();
    let _installed = Installed {
        unit_path,
        dir,
        socket: socket.clone(),
        config,
    };
    let (ok, out) = systemctl(&["daemon-reload"]);
    assert!(ok, "{out}");

    // Type=notify: start returns once the daemon said READY=1.
    let (ok, out) = systemctl(&["start", UNIT]);
    assert!(ok, "systemctl start: {out}");
    assert_eq!(show("ActiveState"), "active");
    assert_eq!(show("Type"), "notify");
    let first_pid: i32 = show("MainPID").parse().unwrap();
    assert!(first_pid > 0);
    let mut rt = v1::runtime_service_client::RuntimeServiceClient::new(
        connect(&socket)
            .await
            .expect("the socket serves once started"),
    );

    // A running container.
    let reg = Registry::start();
    let busybox = std::fs::read(BUSYBOX).expect("busybox-static must be installed");
    let tar = LayerTar::new()
        .dir("bin/")
        .file_mode("bin/busybox", &busybox, 0o755)
        .symlink("bin/sleep", "busybox")
        .finish();
    let image = build(ImageSpec {
        layers: vec![gzip(&tar)],
        cmd: &["sleep", "1000"],
        ..ImageSpec::default()
    });
    Pusher::new(&reg).image("test/unit", "v1", &image).await;
    let image_ref = format!("{}/test/unit:v1", reg.host);
    v1::image_service_client::ImageServiceClient::new(connect(&socket).await.unwrap())
        .pull_image(v1::PullImageRequest {
            image: Some(v1::ImageSpec {
                image: image_ref.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("pull");
    let pod_config = v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "unit".into(),
            uid: "uid-unit".into(),
            namespace: "crust-unit-test".into(),
            attempt: 0,
        }),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let ctr = rt
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(v1::ContainerConfig {
                metadata: Some(v1::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(v1::ImageSpec {
                    image: image_ref,
                    ..Default::default()
                }),
                linux: Some(v1::LinuxContainerConfig::default()),
                ..Default::default()
            }),
            sandbox_config: Some(pod_config),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    rt.start_container(v1::StartContainerRequest {
        container_id: ctr.clone(),
    })
    .await
    .expect("StartContainer");
    let status = rt
        .container_status(v1::ContainerStatusRequest {
            container_id: ctr.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let ctr_pid = info["pid"].as_i64().unwrap() as i32;
    assert!(process_alive(ctr_pid));
    drop(rt);

    // Restart: a new daemon, the same container, still running.
    let (ok, out) = systemctl(&["restart", UNIT]);
    assert!(ok, "systemctl restart: {out}");
    assert_eq!(show("ActiveState"), "active");
    let second_pid: i32 = show("MainPID").parse().unwrap();
    assert_ne!(second_pid, first_pid);
    assert!(!process_alive(first_pid));
    assert!(
        process_alive(ctr_pid),
        "the container died with the restart"
    );
    let mut rt =
        v1::runtime_service_client::RuntimeServiceClient::new(connect(&socket).await.unwrap());
    let s = rt
        .container_status(v1::ContainerStatusRequest {
            container_id: ctr.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
    drop(rt);

    // Stop: the daemon exits cleanly (SIGTERM, exit 0, socket removed);
    // the container is left running, as on a restart.
    let (ok, out) = systemctl(&["stop", UNIT]);
    assert!(ok, "systemctl stop: {out}");
    wait_for("the unit to be inactive", || {
        show("ActiveState") == "inactive"
    })
    .await;
    assert_eq!(show("Result"), "success");
    assert!(!process_alive(second_pid));
    assert!(!socket.exists(), "the socket was left behind");
    assert!(
        process_alive(ctr_pid),
        "systemctl stop killed the container"
    );
}
