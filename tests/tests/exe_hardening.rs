//! The monitor binary cannot be reached from inside a container
//! (CVE-2019-5736 class, issue 27 defect 2), through the real daemon on the
//! embedded and runc handlers.
//!
//! The attack: an image whose entrypoint is a script `#!/proc/self/exe`.
//! The kernel resolves the interpreter in the process that execs the
//! script, which is still a fork of the monitor (embedded) or the OCI
//! runtime (runc), so it runs that binary inside the container, with the
//! image's loader, libraries and `LD_PRELOAD`. The image carries what
//! `crust-shim` needs to load (the host's loader and libraries, per `ldd`)
//! and a preload library, built here with gcc, whose constructor opens
//! `/proc/self/exe` for writing and `fstat`s and `F_GET_SEALS` it; it
//! prints what it found. The same script is run through ExecSync.
//!
//! What must hold: the executable the container reaches is never the host
//! `crust-shim` file (another device/inode); on the embedded handler it is
//! the daemon's sealed memfd copy; it cannot be opened for writing; the
//! host file is unchanged; monitors themselves run from the sealed copy,
//! also after a daemon restart. (The write-open fails with ETXTBSY in
//! every design: the kernel refuses writers to a file being executed
//! before it looks at seals or mounts. What differs is what a descriptor
//! to it reaches once nothing executes it: sealed bytes, not the host
//! binary.)

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::{
    Daemon, Need, Pod, WithImage, container_config, crust_bin, daemon_with_image, exec_sync,
    host_network_pod, require, run_container, run_pod, skip,
};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;

/// The seals the daemon's copy carries: seal, shrink, grow, write.
const REQUIRED_SEALS: i64 = 0x1 | 0x2 | 0x4 | 0x8;

/// The preload library: reports what `/proc/self/exe` is, never writes.
const PRELOAD_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((constructor)) static void probe(void) {
    char link[256] = {0};
    if (readlink("/proc/self/exe", link, sizeof link - 1) < 0)
        strcpy(link, "?");
    for (char *p = link; *p; p++)
        if (*p == ' ') *p = '_';
    int w = open("/proc/self/exe", O_WRONLY | O_CLOEXEC);
    int werr = w < 0 ? errno : 0;
    if (w >= 0) close(w);
    int rw = open("/proc/self/exe", O_RDWR | O_CLOEXEC);
    int rwerr = rw < 0 ? errno : 0;
    if (rw >= 0) close(rw);
    struct stat st = {0};
    int r = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    long long seals = -1;
    if (r >= 0) {
        fstat(r, &st);
        seals = fcntl(r, F_GET_SEALS);
        if (seals < 0) seals = -errno;
        close(r);
    }
    char out[512];
    int n = snprintf(out, sizeof out,
        "EXE-PROBE link=%s dev=%llu ino=%llu wronly=%d rdwr=%d opened_wronly=%d opened_rdwr=%d seals=%lld\n",
        link, (unsigned long long) st.st_dev, (unsigned long long) st.st_ino,
        werr, rwerr, w >= 0, rw >= 0, seals);
    if (n > 0) write(1, out, (size_t) n);
}
"#;

/// What the preload library printed.
#[derive(Debug)]
struct Probe {
    link: String,
    dev: u64,
    ino: u64,
    wronly_errno: i32,
    rdwr_errno: i32,
    opened_for_writing: bool,
    seals: i64,
}

impl Probe {
    fn parse(text: &str) -> Option<Probe> {
        let line = text
            .lines()
            .find_map(|l| l.find("EXE-PROBE ").map(|i| &l[i + "EXE-PROBE ".len()..]))?;
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
        };
        let num = |k: &str| field(k)?.parse::<i64>().ok();
        Some(Probe {
            link: field("link")?.to_string(),
            dev: num("dev")? as u64,
            ino: num("ino")? as u64,
            wronly_errno: num("wronly")? as i32,
            rdwr_errno: num("rdwr")? as i32,
            opened_for_writing: num("opened_wronly")? != 0 || num("opened_rdwr")? != 0,
            seals: num("seals")?,
        })
    }
}

/// The host's `crust-shim`, the one the test daemons copy.
fn host_shim() -> PathBuf {
    crust_bin().parent().unwrap().join("crust-shim")
}

/// The host files `bin` loads (per `ldd`), as (path, bytes); none for a
/// static binary (runc), which ldd refuses.
fn libraries_of(bin: &Path) -> Vec<(String, Vec<u8>)> {
    let out = Command::new("ldd").arg(bin).output().expect("ldd");
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("not a dynamic executable"),
            "ldd {}: {out:?}",
            bin.display()
        );
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| path.to_string())
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
            (p, bytes)
        })
        .collect()
}

/// What the process that execs the script runs: crust-shim on the
/// embedded handler, the OCI runtime's binary (crun links libsystemd) on
/// a CLI handler, whose libraries the image needs as well for the probe
/// to load there.
fn libraries_for(handler: &str) -> Vec<(String, Vec<u8>)> {
    let mut libs = libraries_of(&host_shim());
    if handler != "embedded"
        && let Some(bin) = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(handler))
                .find(|p| p.is_file())
        })
    {
        for lib in libraries_of(&bin) {
            if !libs.iter().any(|(p, _)| *p == lib.0) {
                libs.push(lib);
            }
        }
    }
    libs
}

fn build_preload(dir: &Path) -> Option<Vec<u8>> {
    let src = dir.join("preload.c");
    let so = dir.join("preload.so");
    std::fs::write(&src, PRELOAD_C).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(std::fs::read(&so).unwrap())
}

/// busybox, the host loader and libraries of crust-shim (and of the
/// handler's binary), the preload library and the script.
fn attack_image(preload: &[u8], handler: &str) -> TestImage {
    let mut layer = busybox_with(&["sh", "sleep", "true", "cat"])
        .dir("tmp/")
        .dir("proc/")
        .file_mode("attack", b"#!/proc/self/exe\n", 0o755)
        .file_mode("preload.so", preload, 0o755);
    let mut dirs = std::collections::BTreeSet::new();
    let libs = libraries_for(handler);
    for (path, _) in &libs {
        let mut p = Path::new(path.trim_start_matches('/'));
        while let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(format!("{}/", parent.display()));
            p = parent;
        }
    }
    for d in dirs {
        layer = layer.dir(&d);
    }
    for (path, bytes) in &libs {
        layer = layer.file_mode(path.trim_start_matches('/'), bytes, 0o755);
    }
    one_layer_image(&layer.finish(), &["sleep", "1000"])
}

struct Env {
    // Field order = drop order: the daemon (which removes its pods) first.
    d: Daemon,
    _reg: Registry,
    image: String,
    rt: Rt,
    logs: tempfile::TempDir,
}

fn sha_of(path: &Path) -> String {
    sha(&std::fs::read(path).unwrap())
}

/// The monitor processes of this daemon's containers: (pid, cmdline).
fn monitors_of(d: &Daemon, id: &str) -> Vec<i32> {
    let dir = d.run_dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let c = std::fs::read(e.path().join("cmdline")).ok()?;
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            (c.contains("crust-shim") && c.contains(&dir) && c.contains(id)).then_some(pid)
        })
        .collect()
}

/// A monitor runs from the sealed copy: its executable is a sealed memfd,
/// not the host file, and it still calls itself crust-shim.
fn assert_monitor_sealed(pid: i32, host: &std::fs::Metadata) {
    let link = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let exe = std::fs::File::open(format!("/proc/{pid}/exe")).unwrap();
    let meta = exe.metadata().unwrap();
    assert!(
        (meta.dev(), meta.ino()) != (host.dev(), host.ino()),
        "monitor {pid} runs the host crust-shim ({})",
        link.display()
    );
    assert!(
        crust_linux::sealed::is_sealed(exe.as_fd()),
        "monitor {pid}'s executable {} is not sealed",
        link.display()
    );
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "crust-shim", "monitor {pid}'s name");
}

async fn wait_exited(rt: &mut Rt, id: &str) {
    let t = Instant::now();
    loop {
        let s = rt
            .container_status(v1::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        if s.state == v1::ContainerState::ContainerExited as i32 {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{id} did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks what one hijacked process saw.
fn check_probe(what: &str, handler: &str, text: &str, host: &std::fs::Metadata) {
    let p = Probe::parse(text)
        .unwrap_or_else(|| panic!("{what} on {handler}: no probe output in {text:?}"));
    eprintln!("{what} on {handler}: {p:?}");
    assert!(
        (p.dev, p.ino) != (host.dev(), host.ino()),
        "{what} on {handler}: the container reached the host crust-shim \
         ({} = dev {} ino {}) through /proc/self/exe",
        p.link,
        p.dev,
        p.ino
    );
    assert!(
        !p.opened_for_writing,
        "{what} on {handler}: /proc/self/exe opened for writing"
    );
    assert!(p.wronly_errno != 0 && p.rdwr_errno != 0, "{p:?}");
    if handler == "embedded" {
        // The monitor's own copy, sealed.
        assert!(p.link.starts_with("/memfd:crust-shim"), "{p:?}");
        assert_eq!(
            p.seals & REQUIRED_SEALS,
            REQUIRED_SEALS,
            "{what}: the executable is not sealed: {p:?}"
        );
    }
}

async fn attack(handler: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(preload) = build_preload(dir.path()) else {
        skip!("gcc is not installed");
    };
    let host_path = host_shim();
    let host = std::fs::metadata(&host_path).unwrap();
    let before = sha_of(&host_path);

    let WithImage {
        daemon: d,
        registry,
        image,
    } = daemon_with_image(
        Daemon::builder(),
        "test/exe",
        &attack_image(&preload, handler),
    )
    .await;
    let rt = d.runtime_v1().await;
    let mut e = Env {
        d,
        _reg: registry,
        image,
        rt,
        logs: tempfile::tempdir().unwrap(),
    };
    let config = v1::PodSandboxConfig {
        log_directory: e.logs.path().display().to_string(),
        ..host_network_pod("exe", "crust-test")
    };
    let pod: Pod = run_pod(&mut e.rt, config, handler).await;
    let preload_env = vec![v1::KeyValue {
        key: "LD_PRELOAD".into(),
        value: "/preload.so".into(),
    }];

    // 1. The entrypoint is the script.
    let entry = v1::ContainerConfig {
        command: vec!["/attack".into()],
        args: vec![],
        envs: preload_env.clone(),
        ..container_config("entry", &e.image)
    };
    let id = run_container(&mut e.rt, &pod, entry).await;
    wait_exited(&mut e.rt, &id).await;
    let log = std::fs::read_to_string(e.logs.path().join("entry.log")).unwrap_or_default();
    check_probe("the entrypoint", handler, &log, &host);

    // 2. ExecSync of the script in a running container.
    let sleeper = v1::ContainerConfig {
        envs: preload_env,
        ..container_config("sleeper", &e.image)
    };
    let sleeper = run_container(&mut e.rt, &pod, sleeper).await;
    let (_, out, err) = exec_sync(&mut e.rt, &sleeper, &["/attack"], 30).await;
    check_probe("ExecSync", handler, &format!("{out}{err}"), &host);

    // The monitors run from the sealed copy, whatever the handler.
    let monitors = monitors_of(&e.d, &sleeper);
    assert!(!monitors.is_empty(), "no monitor found for {sleeper}");
    for pid in &monitors {
        assert_monitor_sealed(*pid, &host);
    }

    // 3. After a daemon restart: the monitor is found again (ExecSync
    //    through it works and is still protected), and a new container's
    //    monitor runs from the new daemon's sealed copy.
    e.d.restart().await;
    e.rt = e.d.runtime_v1().await;
    let (_, out, err) = exec_sync(&mut e.rt, &sleeper, &["/attack"], 30).await;
    check_probe(
        "ExecSync after a restart",
        handler,
        &format!("{out}{err}"),
        &host,
    );
    let late = container_config("late", &e.image);
    let late = run_container(&mut e.rt, &pod, late).await;
    let (code, out, err) = exec_sync(&mut e.rt, &late, &["true"], 30).await;
    assert_eq!(code, 0, "{out}{err}");
    for pid in monitors_of(&e.d, &late) {
        assert_monitor_sealed(pid, &host);
    }

    assert_eq!(sha_of(&host_path), before, "the host crust-shim changed");
}

#[tokio::test(flavor = "multi_thread")]
async fn proc_self_exe_script_embedded() {
    attack("embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn proc_self_exe_script_runc() {
    require!(Need::Runc);
    attack("runc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn proc_self_exe_script_crun() {
    require!(Need::Crun);
    attack("crun").await;
}

/// Where the kernel will not execute a memfd (`vm.memfd_noexec = 2`, set
/// here in a PID namespace of the test's own: the setting is per PID
/// namespace), the daemon refuses to start and says why, instead of
/// running monitors from the host file.
#[tokio::test(flavor = "multi_thread")]
async fn daemon_refuses_to_start_without_sealed_memfds() {
    if !Path::new("/proc/sys/vm/memfd_noexec").exists() {
        skip!("this kernel has no vm.memfd_noexec (Linux 6.3+)");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--", "sh", "-c"])
        .arg(r#"echo 2 > /proc/sys/vm/memfd_noexec && exec "$@""#)
        .arg("sh")
        .arg(crust_bin())
        .arg("daemon")
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .arg("--socket")
        .arg(dir.path().join("crust.sock"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon started without executable memfds");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("crust-shim")
            && stderr.contains("sealed")
            && stderr.contains("vm.memfd_noexec"),
        "{stderr}"
    );
    // Refused before it touched anything.
    assert!(!dir.path().join("root").exists());
    assert!(!dir.path().join("run").exists());
}
