//! Config reload in a running daemon (SIGHUP and `crust reload`), through
//! the real daemon: each reloadable key is changed in the file and its
//! effect seen through CRI or the admin API; an invalid file changes
//! nothing; keys that need a restart are named and kept. And a pull that
//! stops making progress is given up after `image.pull_progress_timeout`.

use std::path::Path;
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::Code;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, Need, Pod, WithImage, container_config, create_container, daemon_with_image, exec_sync,
    host_network_pod, run_container, run_crust, run_pod,
};
use nix::sys::signal::{Signal, kill};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

fn image() -> TestImage {
    let layer = busybox_with(&["sh", "sleep", "echo", "yes", "stat", "cat"])
        .dir("tmp/")
        .finish();
    one_layer_image(&layer, &["sleep", "1000"])
}

/// `crust <args> --socket <daemon's>`: (success, stdout, stderr).
fn crust(d: &Daemon, args: &[&str]) -> (bool, String, String) {
    let socket = d.socket.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--socket", &socket]);
    let out = run_crust(&all);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `crust reload` that must succeed: its answer.
fn reload(d: &Daemon) -> String {
    let (ok, out, err) = crust(d, &["reload"]);
    assert!(ok, "crust reload failed: {err}\n{}", d.logs());
    out
}

/// The answer's line starting with `prefix`, without it.
fn line<'a>(answer: &'a str, prefix: &str) -> &'a str {
    answer
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in\n{answer}"))
        .trim()
}

/// Sends SIGHUP and waits until the daemon logged the reload's outcome
/// (the `n`-th one of the log).
async fn sighup(d: &Daemon, n: usize) {
    let outcomes = |log: &str| {
        log.matches("config reloaded").count() + log.matches("config reload failed").count()
    };
    kill(d.pid(), Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while outcomes(&d.logs()) < n {
        assert!(
            Instant::now() < deadline,
            "no reload outcome logged:\n{}",
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn version(d: &Daemon) {
    d.runtime_v1()
        .await
        .version(v1::VersionRequest::default())
        .await
        .unwrap();
}

/// log_level and log_format change on SIGHUP and on `crust reload`; an
/// invalid file (bad value, unknown key, unreadable) changes nothing and
/// says why, and the daemon keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_and_crust_reload_change_the_log_level_and_format() {
    let mut d = Daemon::builder()
        .config("log_level = \"info\"\n")
        .start()
        .await;
    let debug_lines = |d: &Daemon| d.logs().lines().filter(|l| l.contains("DEBUG")).count();
    version(&d).await;
    assert_eq!(debug_lines(&d), 0, "{}", d.logs());

    d.write_config("log_level = \"debug\"\n");
    sighup(&d, 1).await;
    assert!(d.is_running(), "SIGHUP ended the daemon:\n{}", d.logs());
    assert_eq!(crust(&d, &["log-level"]).1.trim(), "debug");
    version(&d).await;
    assert!(debug_lines(&d) > 0, "no debug line:\n{}", d.logs());

    d.write_config("log_level = \"debug\"\nlog_format = \"json\"\n");
    let answer = reload(&d);
    assert_eq!(line(&answer, "applied:"), "log_format", "{answer}");
    let before = d.logs().len();
    version(&d).await;
    let after = d.logs()[before..].to_string();
    assert!(!after.trim().is_empty(), "nothing logged after the reload");
    for l in after.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v.get("level").is_some(), "{l}");
    }

    // An invalid file changes nothing: the answer and the log say why.
    for (bad, named) in [
        ("log_level = \"loud\"\n", "loud"),
        ("log_level = \"info\"\nsokcet = \"/x.sock\"\n", "sokcet"),
        (
            "log_level = \"info\"\n[image]\nmax_concurrent_downloads = 0\n",
            "image.max_concurrent_downloads",
        ),
    ] {
        d.write_config(bad);
        let (ok, _, err) = crust(&d, &["reload"]);
        assert!(!ok, "{bad}");
        assert!(
            err.contains(named) && err.contains("nothing was changed"),
            "{bad}: {err}"
        );
        assert!(err.len() < 4096, "{} bytes", err.len());
    }
    d.write_config("log_level = \"loud\"\n");
    sighup(&d, 3).await;
    assert!(d.is_running());
    assert!(
        d.logs().contains("config reload failed, nothing changed"),
        "{}",
        d.logs()
    );
    std::fs::remove_file(&d.config).unwrap();
    let (ok, _, err) = crust(&d, &["reload"]);
    assert!(!ok && err.contains("cannot read config file"), "{err}");
    // Still debug, still JSON, still serving.
    assert_eq!(crust(&d, &["log-level"]).1.trim(), "debug");
    let before = d.logs().len();
    version(&d).await;
    let after = d.logs()[before..].to_string();
    assert!(after.lines().all(|l| l.starts_with('{')), "{after}");
    assert!(d.stop().await.success());
}

/// A handler added by a reload is in Status and runs pods; one removed
/// while a pod uses it leaves that pod and its container running (exec,
/// stop, remove work), refuses new containers in it and new pods.
#[tokio::test(flavor = "multi_thread")]
async fn handlers_are_added_and_removed_by_a_reload() {
    let WithImage {
        daemon: d,
        registry: _reg,
        image,
    } = daemon_with_image(Daemon::builder(), "test/reload", &image()).await;
    let mut rt = d.runtime_v1().await;
    let handlers = |s: v1::StatusResponse| -> Vec<String> {
        s.runtime_handlers.into_iter().map(|h| h.name).collect()
    };
    let status = || async {
        d.runtime_v1()
            .await
            .status(v1::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner()
    };
    assert!(!handlers(status().await).contains(&"extra".to_string()));
    let err = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(host_network_pod("before", "crust-reload")),
            runtime_handler: "extra".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    // The CLI handler's half needs runc: without it, that half is a
    // counted skip, not a silent pass.
    let cli = match crust_test_support::require(Need::Runc) {
        None => true,
        Some(reason) => {
            crust_test_support::report_skip(&reason);
            false
        }
    };
    let mut toml = "[runtimes.extra]\ntype = \"embedded\"\n".to_string();
    if cli {
        toml.push_str("[runtimes.extra-cli]\ntype = \"cli\"\npath = \"runc\"\n");
    }
    d.write_config(&toml);
    let answer = reload(&d);
    assert!(
        line(&answer, "applied:").contains("runtimes.extra"),
        "{answer}"
    );
    let listed = handlers(status().await);
    assert!(listed.contains(&"extra".to_string()), "{listed:?}");
    if cli {
        assert!(listed.contains(&"extra-cli".to_string()), "{listed:?}");
    }

    let pod = run_pod(&mut rt, host_network_pod("extra", "crust-reload"), "extra").await;
    let id = run_container(&mut rt, &pod, container_config("app", &image)).await;
    assert_eq!(exec_sync(&mut rt, &id, &["echo", "hi"], 10).await.1, "hi\n");
    if cli {
        let pod = run_pod(
            &mut rt,
            host_network_pod("cli", "crust-reload"),
            "extra-cli",
        )
        .await;
        let id = run_container(&mut rt, &pod, container_config("app", &image)).await;
        assert_eq!(
            exec_sync(&mut rt, &id, &["echo", "cli"], 10).await.1,
            "cli\n"
        );
        remove_pod(&mut rt, &pod).await;
    }

    // Removed while the pod uses it.
    d.write_config("");
    let answer = reload(&d);
    assert!(
        line(&answer, "applied:").contains("runtimes.extra"),
        "{answer}"
    );
    assert!(
        answer.contains("warning: runtime handler \"extra\" was removed while 1 pod"),
        "{answer}"
    );
    assert!(!handlers(status().await).contains(&"extra".to_string()));
    assert_eq!(
        exec_sync(&mut rt, &id, &["echo", "still"], 10).await.1,
        "still\n"
    );
    let err = create_container(&mut rt, &pod, container_config("late", &image))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("no longer configured"), "{err}");
    let err = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(host_network_pod("after", "crust-reload")),
            runtime_handler: "extra".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("extra"), "{err}");
    remove_pod(&mut rt, &pod).await;
}

async fn remove_pod(rt: &mut Rt, pod: &Pod) {
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .unwrap();
}

async fn pull(d: &Daemon, image: &str) -> Result<String, crust_test_support::tonic::Status> {
    d.image_v1()
        .await
        .pull_image(v1::PullImageRequest {
            image: Some(v1::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

fn hosts_dir(dir: &Path, registry: &str, mirror: &str) {
    let d = dir.join(registry);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{mirror}\"]\n\
             capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();
}

/// A new `registry.config_dir` applies to the next pull: a mirror it
/// names serves an image its registry (down) cannot.
#[tokio::test(flavor = "multi_thread")]
async fn a_registry_mirror_takes_effect_after_a_reload() {
    let reg = Registry::start();
    let img = image();
    Pusher::new(&reg).image("test/mirrored", "v1", &img).await;
    let dirs = tempfile::tempdir().unwrap();
    let (none, mirrored) = (dirs.path().join("none"), dirs.path().join("mirrored"));
    std::fs::create_dir_all(&none).unwrap();
    // A registry nobody listens on, mirrored by the live one.
    let down = format!("127.0.0.1:{}", free_port());
    hosts_dir(&mirrored, &down, &reg.host);
    let d = Daemon::builder()
        .config(&format!(
            "[registry]\nconfig_dir = {:?}\n",
            none.display().to_string()
        ))
        .start()
        .await;
    let reference = format!("{down}/test/mirrored:v1");
    let err = pull(&d, &reference).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    d.write_config(&format!(
        "[registry]\nconfig_dir = {:?}\n",
        mirrored.display().to_string()
    ));
    let answer = reload(&d);
    assert_eq!(line(&answer, "applied:"), "registry.config_dir", "{answer}");
    pull(&d, &reference).await.unwrap();
    assert!(reg.count_gets(&img.id()) >= 1);
}

/// The daemon's content store's temp files (downloads in progress).
fn ingest(d: &Daemon) -> Vec<String> {
    std::fs::read_dir(d.root.join("content/ingest"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// PullImage from a registry that stalls mid-blob fails after
/// `image.pull_progress_timeout` with Unavailable naming the blob, the
/// registry and the timeout, and leaves no partial blob and no image; a
/// download that trickles but never stops that long is not given up.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_pull_is_given_up_after_the_progress_timeout() {
    let img = noise_image(1);
    let layer = img.layers[0].digest();
    let reg = SlowRegistry::start("test/stall", "v1", &img, BlobPace::StallAfter(1000));
    let d = Daemon::builder()
        .config("[image]\npull_progress_timeout = \"2s\"\n")
        .start()
        .await;
    let t = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(60), pull(&d, &reg.reference()))
        .await
        .expect("the stalled pull ends by itself")
        .unwrap_err();
    let took = t.elapsed();
    eprintln!("stalled pull: {took:?}: {err}");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    for part in [layer.as_str(), &reg.host, "2s", "pull_progress_timeout"] {
        assert!(err.message().contains(part), "{part:?} not in {err}");
    }
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(20),
        "{took:?}"
    );
    assert!(ingest(&d).is_empty(), "{:?}", ingest(&d));
    let images = d
        .image_v1()
        .await
        .list_images(v1::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(images.is_empty(), "{images:?}");

    // 4 s in all, but never 2 s without a byte.
    reg.set_pace(BlobPace::Trickle {
        chunks: 8,
        every: Duration::from_millis(500),
    });
    let t = Instant::now();
    pull(&d, &reg.reference()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(3500),
        "{:?}",
        t.elapsed()
    );
}

/// `image.pull_progress_timeout` and `image.max_concurrent_downloads` are
/// reloaded: the next pull waits as long and downloads as many layers at
/// once as the file now says.
#[tokio::test(flavor = "multi_thread")]
async fn image_pull_settings_are_reloaded() {
    let img = noise_image(3);
    let reg = SlowRegistry::start("test/limits", "v1", &img, BlobPace::StallAfter(1000));
    let d = Daemon::builder()
        .config("[image]\npull_progress_timeout = \"1s\"\nmax_concurrent_downloads = 1\n")
        .start()
        .await;
    let err = pull(&d, &reg.reference()).await.unwrap_err();
    assert!(err.message().contains("for 1s"), "{err}");
    assert_eq!(reg.max_blobs_in_flight(), 1);

    d.write_config("[image]\npull_progress_timeout = \"3s\"\nmax_concurrent_downloads = 3\n");
    let answer = reload(&d);
    assert_eq!(
        line(&answer, "applied:"),
        "image.max_concurrent_downloads, image.pull_progress_timeout",
        "{answer}"
    );
    let t = Instant::now();
    let err = pull(&d, &reg.reference()).await.unwrap_err();
    assert!(err.message().contains("for 3s"), "{err}");
    assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(reg.max_blobs_in_flight(), 3);
    assert!(ingest(&d).is_empty(), "{:?}", ingest(&d));
}

/// New `cdi_spec_dirs` apply to the next CreateContainer.
#[tokio::test(flavor = "multi_thread")]
async fn cdi_spec_dirs_are_reloaded() {
    let dirs = tempfile::tempdir().unwrap();
    let (empty, specs) = (dirs.path().join("empty"), dirs.path().join("specs"));
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::write(
        specs.join("dev.json"),
        r#"{"cdiVersion": "0.6.0", "kind": "crust.test/dev",
            "devices": [{"name": "null0", "containerEdits": {
                "env": ["CDI_DEVICE=null0"],
                "deviceNodes": [{"path": "/dev/cdi-null", "hostPath": "/dev/null"}]}}]}"#,
    )
    .unwrap();
    let cdi = |dir: &Path| format!("cdi_spec_dirs = [{:?}]\n", dir.display().to_string());
    let WithImage {
        daemon: d,
        registry: _reg,
        image,
    } = daemon_with_image(Daemon::builder().config(&cdi(&empty)), "test/cdi", &image()).await;
    let mut rt = d.runtime_v1().await;
    let pod = run_pod(&mut rt, host_network_pod("cdi", "crust-reload"), "").await;
    let with_device = |name: &str| {
        let mut c = container_config(name, &image);
        c.cdi_devices = vec![v1::CdiDevice {
            name: "crust.test/dev=null0".into(),
        }];
        c
    };
    let err = create_container(&mut rt, &pod, with_device("before"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    d.write_config(&cdi(&specs));
    assert_eq!(line(&reload(&d), "applied:"), "cdi_spec_dirs");
    let id = run_container(&mut rt, &pod, with_device("after")).await;
    let (code, out, err) = exec_sync(
        &mut rt,
        &id,
        &[
            "sh",
            "-c",
            "stat -c %t:%T /dev/cdi-null && echo $CDI_DEVICE",
        ],
        10,
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "1:3\nnull0\n"), "{err}");
    remove_pod(&mut rt, &pod).await;
}

/// A new `log_size_max` caps the logs of containers created after the
/// reload.
#[tokio::test(flavor = "multi_thread")]
async fn log_size_max_is_reloaded() {
    const CAP: u64 = 16384;
    let WithImage {
        daemon: d,
        registry: _reg,
        image,
    } = daemon_with_image(Daemon::builder(), "test/logcap", &image()).await;
    d.write_config(&format!("log_size_max = {CAP}\n"));
    assert_eq!(line(&reload(&d), "applied:"), "log_size_max");
    let logs = tempfile::tempdir().unwrap();
    let mut rt = d.runtime_v1().await;
    let config = v1::PodSandboxConfig {
        log_directory: logs.path().display().to_string(),
        ..host_network_pod("logcap", "crust-reload")
    };
    let pod = run_pod(&mut rt, config, "").await;
    let mut c = container_config("flood", &image);
    c.command = vec!["yes".into()];
    let id = run_container(&mut rt, &pod, c).await;
    let log = logs.path().join("flood.log");
    // The flood is capped: the file stops growing, just past the cap.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        if len > 0 && len == last {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the log keeps growing: {len} bytes"
        );
        last = len;
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.len() as u64 <= CAP + 512, "{} bytes", text.len());
    assert!(text.contains("(log_size_max)"), "no notice");
    rt.stop_container(v1::StopContainerRequest {
        container_id: id,
        timeout: 1,
    })
    .await
    .unwrap();
    remove_pod(&mut rt, &pod).await;
}

/// Keys a running daemon cannot change are named and keep their values;
/// keys a flag sets are named too; the metrics count reloads by result.
#[tokio::test(flavor = "multi_thread")]
async fn restart_only_keys_are_named_and_kept() {
    let d = Daemon::builder()
        .config("[metrics]\naddress = \"127.0.0.1:0\"\n")
        .start()
        .await;
    let status = |d: &Daemon| crust(d, &["status"]).1;
    let streaming = |s: &str| line(s, "streaming:").to_string();
    let before = status(&d);
    let port = free_port();
    d.write_config(&format!(
        "root = \"/elsewhere\"\nlog_level = \"warn\"\nlog_size_max = 65536\n\
         [metrics]\naddress = \"127.0.0.1:0\"\n[streaming]\nport = {port}\n\
         [nri]\ndisable_connections = true\n"
    ));
    let answer = reload(&d);
    assert_eq!(line(&answer, "applied:"), "log_size_max", "{answer}");
    assert_eq!(
        line(&answer, "restart required (kept as they are until then):"),
        "nri.disable_connections, streaming.port",
        "{answer}"
    );
    assert_eq!(
        line(
            &answer,
            "set by command-line flags (the file's values are not used):"
        ),
        "root, log_level",
        "{answer}"
    );
    assert_eq!(crust(&d, &["log-level"]).1.trim(), "debug");
    let after = status(&d);
    assert_eq!(streaming(&after), streaming(&before));
    let (_, config, _) = crust(&d, &["status", "--config"]);
    assert!(config.contains("log_size_max = 65536"), "{config}");
    assert!(!config.contains(&format!("port = {port}")), "{config}");
    assert!(
        d.logs().contains("take effect only at a restart"),
        "{}",
        d.logs()
    );
    // The NRI socket still serves.
    assert!(d.nri_socket().exists());

    d.write_config("log_level = \"loud\"\n");
    assert!(!crust(&d, &["reload"]).0);
    let addr = line(&after, "metrics:").to_string();
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for sample in [
        "crust_config_reloads_total{result=\"success\"} 1",
        "crust_config_reloads_total{result=\"failure\"} 1",
    ] {
        assert!(text.contains(sample), "{sample} not in\n{text}");
    }
}

/// Reloading is for root only, as changing the log level is (the
/// daemon decides by the caller's credentials on the socket).
#[tokio::test(flavor = "multi_thread")]
async fn only_root_may_reload() {
    let d = Daemon::start().await;
    let out = d.cli_as_nobody(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody reloaded the config");
    assert!(
        err.contains("reloading the config is for root only") && err.contains("uid 65534"),
        "{err}"
    );
    assert!(!d.logs().contains("config reloaded"), "{}", d.logs());
}
