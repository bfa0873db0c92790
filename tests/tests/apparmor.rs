//! AppArmor end to end: the real daemon, the embedded runtime and runc, a
//! real kernel's AppArmor (the VM test bed; this project's main host has it
//! off). Profiles are loaded with the real apparmor_parser; every check is
//! made from inside the container (`/proc/self/attr/current`, a denied
//! write, a denied mount) and from the host (`/proc/<pid>/attr/current`).
//!
//! A test whose node is not the one it is about (AppArmor on or off) prints
//! "SKIPPED: <test>: <reason>" and is counted as ignored, never as passed.
//!
//! Run under the machine-wide lock, in a PID namespace:
//!   flock /tmp/crust-integration.lock unshare -p -f --mount-proc \
//!     cargo test -p crust-tests --test apparmor

use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::Code;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, WithImage, container_config, container_status, daemon_with_image, exec_sync,
    pod_metadata, run_pod,
};
use libtest_mimic::{Arguments, Completion, Failed, Trial};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type TestResult = Result<(), Failed>;

const ENABLED: &str = "/sys/module/apparmor/parameters/enabled";
const PROFILES: &str = "/sys/kernel/security/apparmor/profiles";
const DEFAULT_PROFILE: &str = "crust-default";

/// None when the node enforces AppArmor (module on, securityfs mounted,
/// apparmor_parser there), else why not.
fn apparmor_missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    match std::fs::read_to_string(ENABLED) {
        Ok(v) if v.starts_with('Y') => {}
        Ok(_) => return Some("AppArmor is disabled on this host".into()),
        Err(_) => return Some("this kernel has no AppArmor".into()),
    }
    if !Path::new(PROFILES).exists() {
        return Some(format!(
            "AppArmor is on but {PROFILES} is missing (securityfs)"
        ));
    }
    if Command::new("apparmor_parser")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        return Some("apparmor_parser is not installed".into());
    }
    None
}

fn apparmor_present() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root".into());
    }
    apparmor_missing()
        .is_none()
        .then(|| "this host enforces AppArmor (the test is about hosts without it)".into())
}

fn trial(name: &'static str, needs: fn() -> Option<String>, test: fn() -> TestResult) -> Trial {
    Trial::ignorable_test(name, move || {
        if let Some(reason) = needs() {
            // One write, so the line stays whole beside other tests' output.
            let line = format!("SKIPPED: {name}: {reason}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            return Ok(Completion::ignored_with(reason));
        }
        test().map(|()| Completion::Completed)
    })
}

fn block_on(f: impl std::future::Future<Output = ()>) -> TestResult {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?
        .block_on(f);
    Ok(())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let on = apparmor_missing;
    let tests = vec![
        trial("localhost_profile_denies_writes_embedded", on, || {
            block_on(localhost_profile_denies_writes(""))
        }),
        trial("localhost_profile_denies_writes_runc", on, || {
            block_on(localhost_profile_denies_writes("runc"))
        }),
        trial("unloaded_localhost_profile_is_refused", on, || {
            block_on(unloaded_localhost_profile_is_refused())
        }),
        trial("runtime_default_is_enforced_embedded", on, || {
            block_on(runtime_default_is_enforced(""))
        }),
        trial("runtime_default_is_enforced_runc", on, || {
            block_on(runtime_default_is_enforced("runc"))
        }),
        trial(
            "unconfined_and_privileged_are_unconfined_embedded",
            on,
            || block_on(unconfined_and_privileged_are_unconfined("")),
        ),
        trial("unconfined_and_privileged_are_unconfined_runc", on, || {
            block_on(unconfined_and_privileged_are_unconfined("runc"))
        }),
        trial("status_reports_apparmor", on, || {
            block_on(status_reports_apparmor(true))
        }),
        trial(
            "without_apparmor_localhost_is_refused_and_default_dropped",
            apparmor_present,
            || block_on(without_apparmor()),
        ),
        trial("status_reports_no_apparmor", apparmor_present, || {
            block_on(status_reports_apparmor(false))
        }),
    ];
    libtest_mimic::run(&args, tests).exit_code()
}

// ---------------------------------------------------------------- harness

/// A profile loaded for one test and unloaded when dropped, also when the
/// test fails. `name` is unique per process and test.
struct TestProfile {
    name: String,
}

impl TestProfile {
    /// Everything allowed (like an unconfined process) except writes below
    /// `/data`, which are denied.
    fn deny_data_writes(tag: &str) -> TestProfile {
        let name = format!("crust-test-{tag}-{}", std::process::id());
        let text = format!(
            "profile {name} flags=(attach_disconnected,mediate_deleted) {{\n  file,\n  network,\n  capability,\n  signal,\n  ptrace,\n  unix,\n  mount,\n  umount,\n  pivot_root,\n  deny /data/** w,\n}}\n"
        );
        parser(&["--replace", "--skip-cache"], &text);
        TestProfile { name }
    }
}

impl Drop for TestProfile {
    fn drop(&mut self) {
        let text = format!("profile {} {{}}\n", self.name);
        parser(&["--remove"], &text);
    }
}

fn parser(args: &[&str], stdin: &str) {
    let mut child = Command::new("apparmor_parser")
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("apparmor_parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "apparmor_parser {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn loaded(name: &str) -> bool {
    std::fs::read_to_string(PROFILES)
        .unwrap_or_default()
        .lines()
        .any(|l| l.rsplit_once(" (").is_some_and(|(n, _)| n == name))
}

/// busybox with the applets the tests use.
fn test_image() -> TestImage {
    let layer = busybox_with(&["sh", "cat", "sleep", "touch", "mount", "mkdir", "echo"])
        .dir("etc/")
        .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        .file("etc/group", b"root:x:0:\n")
        .dir("tmp/")
        .dir("data/")
        .dir("mnt/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

struct Env {
    d: Daemon,
    _reg: Registry,
    image: String,
    rt: Rt,
    logs: tempfile::TempDir,
}

async fn env() -> Env {
    let WithImage {
        daemon: d,
        registry: reg,
        image,
    } = daemon_with_image(Daemon::builder(), "test/aa", &test_image()).await;
    let rt = d.runtime_v1().await;
    Env {
        rt,
        d,
        _reg: reg,
        image,
        logs: tempfile::tempdir().unwrap(),
    }
}

use crust_test_support::Pod;

impl Env {
    /// A pod on the node's network (no CNI needed).
    async fn pod(&mut self, name: &str, handler: &str, privileged: bool) -> Pod {
        let config = v1::PodSandboxConfig {
            metadata: pod_metadata(name, "crust-test"),
            log_directory: self.logs.path().join(name).display().to_string(),
            linux: Some(v1::LinuxPodSandboxConfig {
                security_context: Some(v1::LinuxSandboxSecurityContext {
                    namespace_options: Some(v1::NamespaceOption {
                        network: v1::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    privileged,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        run_pod(&mut self.rt, config, handler).await
    }

    fn container(&self, name: &str, sc: v1::LinuxContainerSecurityContext) -> v1::ContainerConfig {
        v1::ContainerConfig {
            linux: Some(v1::LinuxContainerConfig {
                security_context: Some(sc),
                ..Default::default()
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

    /// (exit code, stdout + stderr)
    async fn sh(&mut self, id: &str, script: &str) -> (i32, String) {
        let (code, out, err) = exec_sync(&mut self.rt, id, &["sh", "-c", script], 30).await;
        (code, format!("{out}{err}"))
    }

    async fn status(&mut self, id: &str) -> (v1::ContainerStatus, serde_json::Value) {
        let r = container_status(&mut self.rt, id).await;
        let info = r
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        (r.status.unwrap(), info)
    }

    async fn wait_exited(&mut self, id: &str) -> v1::ContainerStatus {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (s, _) = self.status(id).await;
            if s.state == v1::ContainerState::ContainerExited as i32 {
                return s;
            }
            assert!(Instant::now() < deadline, "{id} did not exit: {s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The container init's AppArmor label, read from the host.
    async fn host_label(&mut self, id: &str) -> String {
        let (_, info) = self.status(id).await;
        let pid = info["pid"].as_i64().expect("pid in the verbose status");
        std::fs::read_to_string(format!("/proc/{pid}/attr/current"))
            .unwrap()
            .trim_end_matches(['\n', '\0'])
            .to_string()
    }

    async fn exec_label(&mut self, id: &str) -> String {
        let (code, out) = self.sh(id, "cat /proc/self/attr/current").await;
        assert_eq!(code, 0, "{out}");
        out.trim_end_matches(['\n', '\0']).to_string()
    }

    async fn list_containers(&mut self) -> usize {
        crust_test_support::cri::list_containers(&mut self.rt)
            .await
            .len()
    }
}

fn localhost(name: &str) -> v1::LinuxContainerSecurityContext {
    v1::LinuxContainerSecurityContext {
        apparmor: Some(v1::SecurityProfile {
            profile_type: v1::security_profile::ProfileType::Localhost as i32,
            localhost_ref: name.into(),
        }),
        ..Default::default()
    }
}

fn of_type(t: v1::security_profile::ProfileType) -> v1::LinuxContainerSecurityContext {
    v1::LinuxContainerSecurityContext {
        apparmor: Some(v1::SecurityProfile {
            profile_type: t as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

// ---------------------------------------------------------------- tests

/// A Localhost profile that denies writes below /data: enforced on the
/// container's init (it exits non-zero) and on exec'd processes, which run
/// under the same profile; writes elsewhere work.
async fn localhost_profile_denies_writes(handler: &str) {
    let profile = TestProfile::deny_data_writes(&format!("deny-{handler}"));
    let mut e = env().await;
    let pod = e.pod("deny", handler, false).await;

    // The init itself: `touch /data/x` fails, as critest checks it.
    let mut c = e.container("init-write", localhost(&profile.name));
    c.command = vec!["touch".into(), "/data/from-init".into()];
    let id = e.run(&pod, c).await;
    let s = e.wait_exited(&id).await;
    assert_ne!(s.exit_code, 0, "the init wrote to /data: {s:?}");

    // The deprecated field, a long-running container, exec'd processes.
    #[allow(deprecated)]
    let sc = v1::LinuxContainerSecurityContext {
        apparmor_profile: format!("localhost/{}", profile.name),
        ..Default::default()
    };
    let id = e.run(&pod, e.container("sleeper", sc)).await;
    assert_eq!(
        e.host_label(&id).await,
        format!("{} (enforce)", profile.name)
    );
    assert_eq!(
        e.exec_label(&id).await,
        format!("{} (enforce)", profile.name)
    );
    let (code, out) = e.sh(&id, "touch /data/from-exec").await;
    assert_ne!(code, 0, "exec wrote to /data: {out}");
    assert!(out.contains("ermission denied"), "{out}");
    let (code, out) = e.sh(&id, "touch /tmp/fine && echo OK").await;
    assert_eq!((code, out.trim()), (0, "OK"));
    e.d.remove_all_pods().await;
    drop(e);
    drop(profile);
}

/// An unloaded Localhost profile: FailedPrecondition naming it, through
/// both fields, and nothing left behind.
async fn unloaded_localhost_profile_is_refused() {
    let mut e = env().await;
    let pod = e.pod("unloaded", "", false).await;
    let name = format!("crust-test-never-loaded-{}", std::process::id());
    assert!(!loaded(&name));
    let err = e
        .create(&pod, e.container("a", localhost(&name)))
        .await
        .expect_err("an unloaded profile");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(&name), "{err:?}");
    assert!(err.message().contains("apparmor.localhost_ref"), "{err:?}");
    #[allow(deprecated)]
    let sc = v1::LinuxContainerSecurityContext {
        apparmor_profile: format!("localhost/{name}"),
        ..Default::default()
    };
    let err = e
        .create(&pod, e.container("b", sc))
        .await
        .expect_err("an unloaded profile");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("apparmor_profile"), "{err:?}");
    assert_eq!(e.list_containers().await, 0);
    e.d.remove_all_pods().await;
}

/// RuntimeDefault, its deprecated spelling and no profile at all run under
/// crust's default profile, which the daemon loaded; exec'd processes too.
/// It denies mounts even to a container granted CAP_SYS_ADMIN (which could
/// mount otherwise: the unconfined control below does).
async fn runtime_default_is_enforced(handler: &str) {
    let mut e = env().await;
    assert!(
        loaded(DEFAULT_PROFILE),
        "the daemon did not load {DEFAULT_PROFILE}"
    );
    let pod = e.pod("default", handler, false).await;
    let enforced = format!("{DEFAULT_PROFILE} (enforce)");
    #[allow(deprecated)]
    let deprecated = v1::LinuxContainerSecurityContext {
        apparmor_profile: "runtime/default".into(),
        ..Default::default()
    };
    for (name, sc) in [
        (
            "typed",
            of_type(v1::security_profile::ProfileType::RuntimeDefault),
        ),
        ("deprecated", deprecated),
        ("unset", v1::LinuxContainerSecurityContext::default()),
    ] {
        let id = e.run(&pod, e.container(name, sc)).await;
        assert_eq!(e.host_label(&id).await, enforced, "{name}");
        assert_eq!(e.exec_label(&id).await, enforced, "{name}");
    }
    let with_sys_admin = |mut sc: v1::LinuxContainerSecurityContext| {
        sc.capabilities = Some(v1::Capability {
            add_capabilities: vec!["CAP_SYS_ADMIN".into()],
            ..Default::default()
        });
        sc
    };
    let confined = e
        .run(
            &pod,
            e.container(
                "mounter",
                with_sys_admin(of_type(v1::security_profile::ProfileType::RuntimeDefault)),
            ),
        )
        .await;
    let (code, out) = e
        .sh(&confined, "mount -t tmpfs none /mnt && echo MOUNTED")
        .await;
    assert!(
        code != 0 && !out.contains("MOUNTED"),
        "mount under {DEFAULT_PROFILE}: {out}"
    );
    let (code, out) = e.sh(&confined, "touch /tmp/fine && echo OK").await;
    assert_eq!((code, out.trim()), (0, "OK"));
    let control = e
        .run(
            &pod,
            e.container(
                "control",
                with_sys_admin(of_type(v1::security_profile::ProfileType::Unconfined)),
            ),
        )
        .await;
    let (code, out) = e
        .sh(&control, "mount -t tmpfs none /mnt && echo MOUNTED")
        .await;
    assert_eq!((code, out.trim()), (0, "MOUNTED"), "the unconfined control");
    e.d.remove_all_pods().await;
}

/// Unconfined means no profile; a privileged container with none or
/// RuntimeDefault runs unconfined, with a named Localhost profile under it.
async fn unconfined_and_privileged_are_unconfined(handler: &str) {
    let profile = TestProfile::deny_data_writes(&format!("priv-{handler}"));
    let mut e = env().await;
    let pod = e.pod("plain", handler, false).await;
    let id = e
        .run(
            &pod,
            e.container(
                "unconfined",
                of_type(v1::security_profile::ProfileType::Unconfined),
            ),
        )
        .await;
    assert_eq!(e.host_label(&id).await, "unconfined");
    assert_eq!(e.exec_label(&id).await, "unconfined");

    let pod = e.pod("privileged", handler, true).await;
    let privileged = |mut sc: v1::LinuxContainerSecurityContext| {
        sc.privileged = true;
        sc
    };
    for (name, sc) in [
        ("priv-unset", v1::LinuxContainerSecurityContext::default()),
        (
            "priv-default",
            of_type(v1::security_profile::ProfileType::RuntimeDefault),
        ),
    ] {
        let id = e.run(&pod, e.container(name, privileged(sc))).await;
        assert_eq!(e.host_label(&id).await, "unconfined", "{name}");
        assert_eq!(e.exec_label(&id).await, "unconfined", "{name}");
    }
    let id = e
        .run(
            &pod,
            e.container("priv-named", privileged(localhost(&profile.name))),
        )
        .await;
    assert_eq!(
        e.exec_label(&id).await,
        format!("{} (enforce)", profile.name)
    );
    e.d.remove_all_pods().await;
    drop(e);
    drop(profile);
}

/// Status (verbose) says whether AppArmor is used, and which default.
async fn status_reports_apparmor(enabled: bool) {
    let d = Daemon::start().await;
    let r = d
        .runtime_v1()
        .await
        .status(v1::StatusRequest { verbose: true })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&r.info["apparmor"]).unwrap();
    assert_eq!(info["enabled"], enabled, "{info}");
    if enabled {
        assert_eq!(info["defaultProfile"], DEFAULT_PROFILE, "{info}");
        assert_eq!(info["defaultProfileLoaded"], true, "{info}");
    } else {
        assert!(
            info["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{info}"
        );
    }
}

/// Without AppArmor, as before: Localhost refused (nothing could enforce
/// it), RuntimeDefault dropped, the process unconfined.
async fn without_apparmor() {
    let mut e = env().await;
    let pod = e.pod("noaa", "", false).await;
    let err = e
        .create(&pod, e.container("a", localhost("some-profile")))
        .await
        .expect_err("Localhost without AppArmor");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("no AppArmor"), "{err:?}");
    let id = e
        .run(
            &pod,
            e.container(
                "b",
                of_type(v1::security_profile::ProfileType::RuntimeDefault),
            ),
        )
        .await;
    let (code, out) = e.sh(&id, "touch /data/x && echo OK").await;
    assert_eq!((code, out.trim()), (0, "OK"));
    e.d.remove_all_pods().await;
}
