//! `make install` and contrib/systemd/crust.service under a real systemd
//! (the cgroup v2 + systemd VM of hack/vm): what `make install-files` puts
//! in a DESTDIR (binaries, unit, default config) runs as a unit; `systemctl
//! start` returns once the daemon said READY=1 (its socket and /healthz
//! serve at once); `systemctl restart` keeps a running container running
//! (KillMode=process) and the new daemon has recovered it when the restart
//! returns; `systemctl stop` ends the daemon cleanly and leaves the
//! container alone.
//!
//! The unit is the installed file with only its ExecStart pointed at the
//! installed binary and config plus the test's own paths (flags), loaded as
//! `crust-unit-test.service` from /run/systemd/system: the host's real
//! crust.service, /usr/local and /etc are never touched. Everything (pods,
//! unit, mounts, files) goes in Drop, also when the test fails.
//!
//! A host without systemd as PID 1 (or not root) reports the test as
//! ignored with a "SKIPPED: <test>: <reason>" line, never as passed.
//!
//!   flock /tmp/crust-integration.lock unshare -p -f --mount-proc \
//!     cargo test -p crust-tests --test systemd_unit

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::{connect, crust_bin, host_network_pod, mounts_under, process_alive};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

const UNIT: &str = "crust-unit-test.service";
/// The cgroup driver of the run, as the VM test bed sets it per pass.
const CGROUP_DRIVER_ENV: &str = "CRUST_TEST_CGROUP_DRIVER";
const TEST: &str = "make_install_then_the_unit_starts_restarts_with_containers_running_and_stops";

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let tests = vec![Trial::ignorable_test(TEST, || {
        if let Some(reason) = missing() {
            // One write, so the line stays whole beside other output (make
            // test's summaries count these lines).
            let line = format!("SKIPPED: {TEST}: {reason}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            return Ok(Completion::ignored_with(reason));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| Failed::from(format!("tokio: {e}")))?;
        rt.block_on(the_unit_starts_restarts_and_stops());
        Ok(Completion::Completed)
    })];
    libtest_mimic::run(&args, tests).exit_code()
}

/// What this host lacks for the test, if anything.
fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    // sd_booted(3): systemd is the init system iff this directory exists.
    if !Path::new("/run/systemd/system").is_dir() {
        return Some("needs systemd as PID 1 (the VM test bed, hack/vm)".into());
    }
    None
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

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

fn journal() -> String {
    let out = Command::new("journalctl")
        .args(["-u", UNIT, "--no-pager", "-n", "60", "-o", "cat"])
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("(journalctl: {e})"),
    }
}

/// `systemctl <verb> UNIT`, or panic with its output and the unit's log.
fn must(verb: &str) {
    let (ok, out) = systemctl(&[verb, UNIT]);
    assert!(
        ok,
        "systemctl {verb} {UNIT}: {out}\n--- journal:\n{}",
        journal()
    );
}

/// The installed `crust` (from DESTDIR) against the unit's socket.
fn installed_crust(bin: &Path, socket: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .expect("run the installed crust");
    assert!(
        out.status.success(),
        "crust {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// GET http://<metrics address>/healthz, by the address `crust status`
/// shows: the status code.
async fn healthz(bin: &Path, socket: &Path) -> u16 {
    let status = installed_crust(bin, socket, &["status"]);
    let addr = status
        .lines()
        .find_map(|l| l.strip_prefix("metrics:"))
        .unwrap_or_else(|| panic!("no metrics line in `crust status`:\n{status}"))
        .trim()
        .to_string();
    reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap_or_else(|e| panic!("GET /healthz: {e}"))
        .status()
        .as_u16()
}

/// The unit file, the pods and the daemon's leftovers go, even when the
/// test fails.
struct Installed {
    unit_path: PathBuf,
    dir: tempfile::TempDir,
    socket: PathBuf,
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
        for m in mounts_under(self.dir.path()).into_iter().rev() {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The installed unit with its ExecStart pointed at the installed binary
/// and config, plus the test's own state paths; every other line as
/// installed.
fn unit_for_test(installed: &str, exec_start: &str) -> String {
    let mut replaced = 0;
    let lines: Vec<&str> = installed
        .lines()
        .map(|l| {
            if l.starts_with("ExecStart=") {
                replaced += 1;
                exec_start
            } else {
                l
            }
        })
        .collect();
    assert_eq!(replaced, 1, "the installed unit has one ExecStart");
    lines.join("\n") + "\n"
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn test_image() -> TestImage {
    let layer = busybox_with(&["sleep"])
        // The image's WorkingDir.
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

async fn the_unit_starts_restarts_and_stops() {
    let dir = tempfile::Builder::new()
        .prefix("crust-unit-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let dest = dir.path().join("dest");
    let state = dir.path().join("state");
    let socket = state.join("crust.sock");
    std::fs::create_dir_all(state.join("cni")).unwrap();

    // make install, minus the release build: the binaries under test.
    let bin_dir = crust_bin().parent().unwrap().to_path_buf();
    let out = Command::new("make")
        .arg("-C")
        .arg(repo())
        .arg("--no-print-directory")
        .arg("install-files")
        .arg(format!("DESTDIR={}", dest.display()))
        .arg(format!("BIN_DIR={}", bin_dir.display()))
        .output()
        .expect("run make (build-essential)");
    assert!(
        out.status.success(),
        "make install-files: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let crust = dest.join("usr/local/bin/crust");
    for bin in [&crust, &dest.join("usr/local/bin/crust-shim")] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(bin)
            .unwrap_or_else(|e| panic!("{} not installed: {e}", bin.display()))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "{}", bin.display());
    }
    let config = dest.join("etc/crust/config.toml");
    let default_config = Command::new(&crust)
        .args(["config", "default"])
        .output()
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&config).expect("the default config is installed"),
        String::from_utf8_lossy(&default_config.stdout)
    );
    let installed_unit = std::fs::read_to_string(dest.join("etc/systemd/system/crust.service"))
        .expect("the unit is installed");
    assert!(
        installed_unit
            .contains("\nExecStart=/usr/local/bin/crust daemon --config /etc/crust/config.toml\n"),
        "{installed_unit}"
    );

    // The installed daemon with the installed config; only where its state
    // lives is the test's (the defaults are the host's real /run/crust ...),
    // and the cgroup driver of the run (the VM test bed runs once with
    // each; unset: the installed config's).
    let mut exec_start = format!(
        "ExecStart={} daemon --config {} --socket {} --root {} --run-dir {} \
         --cni-conf-dir {} --metrics-address 127.0.0.1:0",
        crust.display(),
        config.display(),
        socket.display(),
        state.join("root").display(),
        state.join("run").display(),
        state.join("cni").display(),
    );
    match std::env::var(CGROUP_DRIVER_ENV).as_deref() {
        Ok(driver @ ("cgroupfs" | "systemd")) => {
            exec_start.push_str(&format!(" --cgroup-driver {driver}"))
        }
        Ok("") | Err(_) => {}
        Ok(other) => panic!("{CGROUP_DRIVER_ENV}={other:?}: expected cgroupfs or systemd"),
    }
    let unit_path = PathBuf::from("/run/systemd/system").join(UNIT);
    std::fs::write(&unit_path, unit_for_test(&installed_unit, &exec_start)).unwrap();
    let _installed = Installed {
        unit_path,
        dir,
        socket: socket.clone(),
    };
    let (ok, out) = systemctl(&["daemon-reload"]);
    assert!(ok, "{out}");

    // Type=notify: start returns once the daemon said READY=1, so the
    // socket and /healthz serve right away, without retries.
    must("start");
    assert_eq!(show("ActiveState"), "active");
    assert_eq!(show("Type"), "notify");
    let first_pid: i32 = show("MainPID").parse().unwrap();
    assert!(first_pid > 0);
    let mut rt = v1::runtime_service_client::RuntimeServiceClient::new(
        connect(&socket)
            .await
            .expect("the socket serves once start returned"),
    );
    assert_eq!(healthz(&crust, &socket).await, 200);

    // A running container.
    let reg = Registry::start();
    Pusher::new(&reg)
        .image("test/unit", "v1", &test_image())
        .await;
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
        .expect("PullImage");
    let pod_config = host_network_pod("unit", "crust-unit-test");
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

    // Restart: a new daemon, the same container still running, and
    // recovered by the time restart returns (READY=1 after recovery).
    must("restart");
    assert_eq!(show("ActiveState"), "active");
    let second_pid: i32 = show("MainPID").parse().unwrap();
    assert_ne!(second_pid, first_pid);
    assert!(!process_alive(first_pid), "the first daemon is still there");
    assert!(
        process_alive(ctr_pid),
        "the container died with the restart"
    );
    let mut rt = v1::runtime_service_client::RuntimeServiceClient::new(
        connect(&socket)
            .await
            .expect("the socket serves once restart returned"),
    );
    let s = rt
        .container_status(v1::ContainerStatusRequest {
            container_id: ctr.clone(),
            verbose: false,
        })
        .await
        .expect("ContainerStatus after the restart")
        .into_inner()
        .status
        .unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
    assert_eq!(healthz(&crust, &socket).await, 200);
    drop(rt);

    // Stop: the daemon exits cleanly (SIGTERM, exit 0, socket removed);
    // the container is left running, as on a restart.
    must("stop");
    wait_for("the unit to be inactive", || {
        show("ActiveState") == "inactive"
    })
    .await;
    assert_eq!(show("Result"), "success", "{}", journal());
    assert!(!process_alive(second_pid), "the daemon outlived stop");
    assert!(!socket.exists(), "the socket was left behind");
    assert!(
        process_alive(ctr_pid),
        "systemctl stop killed the container"
    );
}
