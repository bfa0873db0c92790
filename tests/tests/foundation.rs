//! The daemon itself: both CRI versions on one socket, Version, Status,
//! RuntimeConfig, UpdateRuntimeConfig, the socket's life cycle, config
//! handling and signals.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use crust_test_support::crust_api::{v1, v1alpha2};
use crust_test_support::tonic::Code;
use crust_test_support::{Daemon, Need, cgroup_driver, pod_metadata, require, run_crust};
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread")]
async fn version_over_v1_and_v1alpha2() {
    let d = Daemon::start().await;
    let v = d
        .runtime_v1()
        .await
        .version(v1::VersionRequest {
            version: "0.1.0".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.runtime_name, "crust");
    assert_eq!(v.runtime_api_version, "v1");
    assert_eq!(v.version, "0.1.0");
    let semver: Vec<u64> = v
        .runtime_version
        .split('.')
        .map(|p| p.parse().expect("numeric semver part"))
        .collect();
    assert_eq!(semver.len(), 3, "{}", v.runtime_version);

    let old = d
        .runtime_v1alpha2()
        .await
        .version(v1alpha2::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(old.runtime_name, "crust");
    assert_eq!(old.runtime_version, v.runtime_version);
    assert_eq!(old.runtime_api_version, "v1alpha2");
}

fn condition<'a>(conds: &'a [v1::RuntimeCondition], kind: &str) -> &'a v1::RuntimeCondition {
    conds
        .iter()
        .find(|c| c.r#type == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {conds:?}"))
}

async fn status(d: &Daemon, verbose: bool) -> v1::StatusResponse {
    d.runtime_v1()
        .await
        .status(v1::StatusRequest { verbose })
        .await
        .unwrap()
        .into_inner()
}

/// kubelet 1.36's `RuntimeFeatures`: without `mount_options` (3), which
/// crust's proto has from cri-api master.
#[derive(Clone, PartialEq, prost::Message)]
struct RuntimeFeatures136 {
    #[prost(bool, tag = "1")]
    supplemental_groups_policy: bool,
    #[prost(bool, tag = "2")]
    user_namespaces_host_network: bool,
}

/// kubelet 1.36's `StatusResponse` (its other messages are 1.36's as they
/// are: api/tests/wire_1_36.rs).
#[derive(Clone, PartialEq, prost::Message)]
struct StatusResponse136 {
    #[prost(message, optional, tag = "1")]
    status: Option<v1::RuntimeStatus>,
    #[prost(map = "string, string", tag = "2")]
    info: std::collections::HashMap<String, String>,
    #[prost(message, repeated, tag = "3")]
    runtime_handlers: Vec<v1::RuntimeHandler>,
    #[prost(message, optional, tag = "4")]
    features: Option<RuntimeFeatures136>,
}

/// A client built from cri-api 1.36 reads Status as the current one does:
/// the fields crust's proto added (RuntimeFeatures.mount_options) pass it
/// by as unknown ones.
#[tokio::test(flavor = "multi_thread")]
async fn a_cri_1_36_client_reads_status() {
    use crust_test_support::tonic;
    let d = Daemon::start().await;
    let mut grpc = tonic::client::Grpc::new(d.channel().await.unwrap());
    grpc.ready().await.unwrap();
    let old: StatusResponse136 = grpc
        .unary(
            tonic::Request::new(v1::StatusRequest { verbose: false }),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1.RuntimeService/Status",
            ),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("Status for a 1.36 client: {e}"))
        .into_inner();
    let new = status(&d, false).await;
    let features = new.features.unwrap();
    assert!(features.mount_options, "{features:?}");
    assert_eq!(
        old.features,
        Some(RuntimeFeatures136 {
            supplemental_groups_policy: features.supplemental_groups_policy,
            user_namespaces_host_network: features.user_namespaces_host_network,
        })
    );
    assert!(old.features.unwrap().supplemental_groups_policy);
    assert_eq!(old.runtime_handlers, new.runtime_handlers);
    let conds = &old.status.as_ref().unwrap().conditions;
    assert!(condition(conds, "RuntimeReady").status);
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reports_network_ready_once_a_cni_config_appears() {
    let d = Daemon::start().await;
    let s = status(&d, false).await;
    let conds = &s.status.as_ref().unwrap().conditions;
    assert!(condition(conds, "RuntimeReady").status);
    let net = condition(conds, "NetworkReady");
    assert!(!net.status);
    assert_eq!(net.reason, "NetworkPluginNotReady");
    assert!(net.message.contains("no network config"), "{}", net.message);
    assert!(s.info.is_empty(), "info only when verbose");

    // An invalid file keeps it not ready, with the file named.
    std::fs::write(d.cni_conf_dir.join("05-bad.conflist"), "{").unwrap();
    let s = status(&d, false).await;
    let net = condition(&s.status.as_ref().unwrap().conditions, "NetworkReady").clone();
    assert!(!net.status);
    assert!(net.message.contains("05-bad.conflist"), "{}", net.message);

    // A valid one is picked up without a restart.
    std::fs::write(
        d.cni_conf_dir.join("10-test.conflist"),
        r#"{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"loopback"}]}"#,
    )
    .unwrap();
    let s = status(&d, false).await;
    let net = condition(&s.status.as_ref().unwrap().conditions, "NetworkReady").clone();
    assert!(net.status, "{net:?}");
    assert!(net.reason.is_empty());

    // And the same answer reaches a v1alpha2 client.
    let old = d
        .runtime_v1alpha2()
        .await
        .status(v1alpha2::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    let conds = old.status.unwrap().conditions;
    assert!(conds.iter().all(|c| c.status), "{conds:?}");
    assert_eq!(conds.len(), 2);
}

/// Status keeps NetworkReady's verdict while the CNI config dir is
/// unchanged (it parsed the config on every call before): a config
/// rewritten in place, even to the same size, and one removed must still
/// show in the next call.
#[tokio::test(flavor = "multi_thread")]
async fn status_sees_a_cni_config_rewritten_in_place() {
    let d = Daemon::start().await;
    let file = d.cni_conf_dir.join("10-test.conflist");
    let valid = r#"{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"loopback"}]}"#;
    std::fs::write(&file, valid).unwrap();
    let ready = |s: &v1::StatusResponse| {
        condition(&s.status.as_ref().unwrap().conditions, "NetworkReady").clone()
    };
    assert!(ready(&status(&d, false).await).status);
    // A verdict is kept only for files older than a timestamp tick can
    // hide (2 s): let the file age, then ask twice (the second answer
    // comes from the kept verdict).
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(ready(&status(&d, false).await).status);
    assert!(ready(&status(&d, false).await).status);

    // Same size, same inode, no longer valid JSON.
    let broken = valid.replacen('{', "[", 1);
    assert_eq!(broken.len(), valid.len());
    std::fs::write(&file, &broken).unwrap();
    let net = ready(&status(&d, false).await);
    assert!(!net.status, "{net:?}");
    assert!(net.message.contains("10-test.conflist"), "{}", net.message);

    // Fixed again after aging, then removed.
    std::fs::write(&file, valid).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(ready(&status(&d, false).await).status);
    assert!(ready(&status(&d, false).await).status);
    std::fs::remove_file(&file).unwrap();
    let net = ready(&status(&d, false).await);
    assert!(!net.status, "{net:?}");
    assert_eq!(net.reason, "NetworkPluginNotReady");
}

#[tokio::test(flavor = "multi_thread")]
async fn verbose_status_holds_the_effective_config() {
    let d = Daemon::builder()
        .config("log_format = \"json\"\n[registry]\nconfig_dir = \"/etc/test-certs.d\"\n")
        .start()
        .await;
    let s = status(&d, true).await;
    let config: serde_json::Value = serde_json::from_str(&s.info["config"]).unwrap();
    // Flags win over the file, the file over the defaults.
    assert_eq!(config["socket"], d.socket.to_str().unwrap());
    assert_eq!(config["root"], d.root.to_str().unwrap());
    assert_eq!(config["log_level"], "debug");
    assert_eq!(config["log_format"], "json");
    assert_eq!(config["registry"]["config_dir"], "/etc/test-certs.d");
    assert_eq!(config["cgroup_driver"], cgroup_driver());
    let hierarchy: String = serde_json::from_str(&s.info["cgroupHierarchy"]).unwrap();
    assert!(["v1", "hybrid", "v2"].contains(&hierarchy.as_str()));
    // JSON logs were asked for: every line is a JSON object.
    let logs = d.logs();
    assert!(!logs.is_empty());
    for line in logs.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_config_reports_the_cgroup_driver() {
    let d = Daemon::start().await;
    let rc = d
        .runtime_v1()
        .await
        .runtime_config(v1::RuntimeConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    let want = match cgroup_driver() {
        "systemd" => v1::CgroupDriver::Systemd,
        _ => v1::CgroupDriver::Cgroupfs,
    };
    assert_eq!(rc.linux.unwrap().cgroup_driver, want as i32);
}

#[test]
fn systemd_driver_needs_systemd() {
    require!(Need::NoSystemd);
    let dir = tempfile::tempdir().unwrap();
    let out = run_crust(&[
        "daemon",
        "--cgroup-driver",
        "systemd",
        "--socket",
        dir.path().join("s.sock").to_str().unwrap(),
        "--root",
        dir.path().join("root").to_str().unwrap(),
        "--run-dir",
        dir.path().join("run").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("systemd is not the init system"), "{err}");
    assert!(!dir.path().join("s.sock").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn update_runtime_config_stores_the_pod_cidr_across_restarts() {
    let mut d = Daemon::start().await;
    let update = |cidr: &str| v1::UpdateRuntimeConfigRequest {
        runtime_config: Some(v1::RuntimeConfig {
            network_config: Some(v1::NetworkConfig {
                pod_cidr: cidr.into(),
            }),
        }),
    };
    let mut rt = d.runtime_v1().await;
    rt.update_runtime_config(update("10.244.1.0/24,fd00:10:244:1::/64"))
        .await
        .unwrap();
    let err = rt
        .update_runtime_config(update("10.244.1.0/99"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("pod_cidr"), "{}", err.message());
    // Empty means "no change".
    rt.update_runtime_config(update("")).await.unwrap();

    d.restart().await;
    let s = status(&d, true).await;
    let cidrs: Vec<String> = serde_json::from_str(&s.info["podCIDRs"]).unwrap();
    assert_eq!(cidrs, ["10.244.1.0/24", "fd00:10:244:1::/64"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn socket_is_0660_and_removed_on_sigterm() {
    let mut d = Daemon::start().await;
    let meta = std::fs::metadata(&d.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let status = d.stop().await;
    assert!(status.success(), "{status}");
    assert!(!d.socket.exists());
    assert!(d.logs().contains("SIGTERM"), "{}", d.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_also_exits_cleanly() {
    let mut d = Daemon::start().await;
    let status = d
        .signal_and_wait(Signal::SIGINT, Duration::from_secs(15))
        .await;
    assert!(status.success(), "{status}");
    assert!(!d.socket.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_socket_is_replaced_and_a_live_one_refused() {
    let mut d = Daemon::start().await;
    // Live: a second daemon on the same socket is refused and leaves it be.
    let other = tempfile::tempdir().unwrap();
    let out = run_crust(&[
        "daemon",
        "--socket",
        d.socket.to_str().unwrap(),
        "--root",
        other.path().join("root").to_str().unwrap(),
        "--run-dir",
        other.path().join("run").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    assert!(d.socket.exists());
    d.runtime_v1()
        .await
        .version(v1::VersionRequest::default())
        .await
        .unwrap();

    // Stale: SIGKILL leaves the socket file behind; the next start replaces it.
    d.signal_and_wait(Signal::SIGKILL, Duration::from_secs(5))
        .await;
    assert!(d.socket.exists(), "SIGKILL cannot remove the socket");
    d.start_again().await;
}

/// A second daemon on the run dir of a running one (with a socket and a
/// root of its own) is refused, as one on its root is
/// (`two_daemons_cannot_share_a_root`): its recovery would take the first
/// one's pods for orphans and unpin them (issue 17).
#[tokio::test(flavor = "multi_thread")]
async fn a_second_daemon_on_the_same_run_dir_is_refused() {
    let d = Daemon::start().await;
    let other = tempfile::tempdir().unwrap();
    let socket = other.path().join("other.sock");
    let out = run_crust(&[
        "daemon",
        "--socket",
        socket.to_str().unwrap(),
        "--root",
        other.path().join("root").to_str().unwrap(),
        "--run-dir",
        d.run_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the run dir {} is in use by another crust daemon (pid {})",
            d.run_dir.display(),
            d.pid()
        )),
        "{err}"
    );
    assert!(!socket.exists(), "the refused daemon served");
    d.runtime_v1()
        .await
        .version(v1::VersionRequest::default())
        .await
        .unwrap();
}

#[test]
fn a_file_at_the_socket_path_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crust.sock");
    std::fs::write(&path, "precious").unwrap();
    let out = run_crust(&[
        "daemon",
        "--socket",
        path.to_str().unwrap(),
        "--root",
        dir.path().join("root").to_str().unwrap(),
        "--run-dir",
        dir.path().join("run").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
}

#[test]
fn parent_dirs_of_the_socket_are_created() {
    // Covered by every daemon test's temp layout too; here the socket's
    // parent is several levels deep and does not exist yet.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a/b/c/crust.sock");
    let mut child = std::process::Command::new(crust_test_support::crust_bin())
        .args(["daemon", "--socket", socket.to_str().unwrap()])
        .args(["--root", dir.path().join("root").to_str().unwrap()])
        .args(["--run-dir", dir.path().join("run").to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline =
        std::time::Instant::now() + crust_test_support::patience(Duration::from_secs(10));
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let existed = socket.exists();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGTERM,
    );
    let status = child.wait().unwrap();
    assert!(existed, "socket never appeared");
    assert!(status.success());
}

fn daemon_with_config(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    run_crust(&[
        "daemon",
        "--config",
        path.to_str().unwrap(),
        "--socket",
        dir.path().join("s.sock").to_str().unwrap(),
    ])
}

#[test]
fn bad_config_is_a_clear_error_and_a_nonzero_exit() {
    let cases = [
        ("sokcet = \"/run/x.sock\"", "sokcet"),
        ("log_level = \"loud\"", "loud"),
        ("root = \"relative/dir\"", "root must be an absolute path"),
        ("[network]\ncni_bin_dirs = \"/opt/cni/bin\"", "cni_bin_dirs"),
        ("this is not toml", "config.toml"),
    ];
    for (config, expected) in cases {
        let out = daemon_with_config(config);
        assert!(!out.status.success(), "{config:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{config:?}: {err}");
    }
    // A config file named on the command line must exist.
    let out = run_crust(&["daemon", "--config", "/nonexistent/crust.toml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/crust.toml"));
    // Bad flag values are refused by the CLI parser.
    let out = run_crust(&["daemon", "--log-format", "xml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("xml"));
}

#[tokio::test(flavor = "multi_thread")]
async fn config_default_prints_a_config_the_daemon_accepts() {
    let out = run_crust(&["config", "default"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for key in [
        "socket",
        "root",
        "run_dir",
        "cgroup_driver",
        "cni_conf_dir",
        "config_dir",
    ] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
    // The printed config starts a daemon (flags move the paths into a temp dir).
    let d = Daemon::builder().config(&text).start().await;
    let s = status(&d, true).await;
    let config: serde_json::Value = serde_json::from_str(&s.info["config"]).unwrap();
    assert_eq!(config["run_dir"], d.run_dir.to_str().unwrap());
    assert_eq!(config["network"]["cni_bin_dirs"][1], "/usr/lib/cni");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_daemons_cannot_share_a_root() {
    let d = Daemon::start().await;
    let dir = tempfile::tempdir().unwrap();
    let out = run_crust(&[
        "daemon",
        "--socket",
        dir.path().join("other.sock").to_str().unwrap(),
        "--root",
        d.root.to_str().unwrap(),
        "--run-dir",
        dir.path().join("run").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("metadata store"), "{err}");
    assert!(!dir.path().join("other.sock").exists());
}

/// A tmpfs of `size` at a temp dir, unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(format!("size={size},mode=0711").as_str()),
        )
        .expect("mount a tmpfs (run as root)");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn runtime_ready(s: &v1::StatusResponse) -> v1::RuntimeCondition {
    s.status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.r#type == "RuntimeReady")
        .cloned()
        .unwrap()
}

/// A full disk under the root: the first failed metadata write used to
/// poison the store for good (every later write: "Previous I/O error
/// occurred") while Status kept saying RuntimeReady. Now Status says not
/// ready, with the reason, until writes work again, and then the daemon
/// works on without a restart (issue 17).
#[tokio::test(flavor = "multi_thread")]
async fn a_full_root_makes_the_runtime_not_ready_until_there_is_room() {
    let fs = Tmpfs::mount("16m");
    let d = Daemon::builder()
        .root(fs.0.path().join("root"))
        .start()
        .await;
    let mut rt = d.runtime_v1().await;
    let pod = |name: &str| v1::RunPodSandboxRequest {
        config: Some(v1::PodSandboxConfig {
            metadata: pod_metadata(name, "crust-test"),
            linux: Some(v1::LinuxPodSandboxConfig {
                security_context: Some(v1::LinuxSandboxSecurityContext {
                    namespace_options: Some(v1::NamespaceOption {
                        network: v1::NamespaceMode::Node as i32,
                        pid: v1::NamespaceMode::Container as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            // Big records: the store's file must grow to take them.
            annotations: (0..3)
                .map(|i| (format!("big-{i}"), "x".repeat(80 << 10)))
                .collect(),
            ..Default::default()
        }),
        runtime_handler: String::new(),
    };
    assert!(runtime_ready(&status(&d, false).await).status);

    // Fill the filesystem.
    let filler = fs.0.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        for _ in 0..64 {
            let _ = f.write_all(&[0u8; 512]);
        }
    }
    // Pods until a metadata write fails (a record may still fit a page).
    let mut failed = None;
    for i in 0..50 {
        if let Err(e) = rt.run_pod_sandbox(pod(&format!("full-{i}"))).await {
            failed = Some(e);
            break;
        }
    }
    let failed = failed.expect("RunPodSandbox fails on a full disk");
    assert!(
        failed.message().contains("metadata store") && failed.message().contains("No space left"),
        "{}",
        failed.message()
    );
    let cond = runtime_ready(&status(&d, false).await);
    assert!(!cond.status, "{cond:?}");
    assert_eq!(cond.reason, "MetadataStoreNotWritable");
    assert!(cond.message.contains("No space left"), "{cond:?}");

    // Room again: ready again, and pods run, without a restart.
    std::fs::remove_file(&filler).unwrap();
    let cond = runtime_ready(&status(&d, false).await);
    assert!(cond.status, "{cond:?}");
    let id = rt
        .run_pod_sandbox(pod("after"))
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest { pod_sandbox_id: id })
        .await
        .unwrap();
    d.remove_all_pods().await;
    drop(rt);
    drop(d);
}
