//! Test fixture: a busybox rootfs, a hand-written OCI config, a state dir,
//! and a guard that removes every process, runtime state and cgroup a test
//! created, even when the test fails. The monitor is driven through the
//! daemon's client (`crust_shim_protocol::Shim`, on tokio).

#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crust_shim_protocol::{
    AttachEvent, AttachReader, AttachWriter, CONTAINER_PID_FILE, RuntimeConfig, SHIM_PID_FILE,
    Shim, ShimBinary, ShimConfig, SpawnOptions,
};
use serde_json::{Value, json};

pub const RUNC: &str = "/usr/sbin/runc";
pub const CRUN: &str = "/usr/bin/crun";
pub const BUSYBOX: &str = "/bin/busybox";

/// The monitor binary as the daemon runs it: one sealed in-memory copy
/// per test process (so the memory tests measure what a node runs).
pub fn shim_binary() -> ShimBinary {
    static BIN: std::sync::OnceLock<ShimBinary> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        ShimBinary::seal(Path::new(env!("CARGO_BIN_EXE_crust-shim")))
            .expect("sealing crust-shim")
            .0
    })
    .clone()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rt {
    Embedded,
    Runc,
    Crun,
}

/// Root, busybox and the runtime binary are needed (`make test` installs
/// them and CI runs as root): without them the test fails, saying what is
/// missing, rather than passing without having run.
pub fn require(rt: Rt) {
    assert!(
        crust_linux::fs::running_as_root(),
        "this test needs root (it runs containers)"
    );
    assert!(
        Path::new(BUSYBOX).exists(),
        "this test needs {BUSYBOX} (Debian's busybox-static)"
    );
    let bin = match rt {
        Rt::Embedded => return,
        Rt::Runc => RUNC,
        Rt::Crun => CRUN,
    };
    assert!(Path::new(bin).exists(), "this test needs {bin}");
}

static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct Fixture {
    pub rt: Rt,
    pub tmp: tempfile::TempDir,
    pub id: String,
    pub cgroup: String,
    pub bundle: PathBuf,
    pub state_dir: PathBuf,
    pub log_path: PathBuf,
    pub runtime_root: PathBuf,
    pub shim: Option<Shim>,
}

const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "printf", "yes", "head", "tr", "stty", "tty", "test", "true",
    "false", "ls", "id", "wc", "dd", "seq", "env", "kill", "ps",
];

impl Fixture {
    /// A bundle whose process runs `args`.
    pub fn new(rt: Rt, name: &str, args: &[&str], tty: bool) -> Fixture {
        let tmp = tempfile::Builder::new()
            .prefix("crust-shim-test-")
            .tempdir()
            .unwrap();
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let id = format!("crust-test-{}-{}-{name}", std::process::id(), n);
        let cgroup = format!("crust-shim-test-{}-{n}", std::process::id());
        let bundle = tmp.path().join("bundle");
        let rootfs = bundle.join("rootfs");
        for d in ["bin", "proc", "dev", "sys", "tmp", "etc"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
        for a in APPLETS {
            symlink("busybox", rootfs.join("bin").join(a)).unwrap();
        }
        fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
        let spec = spec(args, tty, &cgroup);
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&spec).unwrap(),
        )
        .unwrap();
        let state_dir = tmp.path().join("state");
        let log_path = tmp.path().join("logs").join("c.log");
        fs::create_dir_all(log_path.parent().unwrap()).unwrap();
        let runtime_root = tmp.path().join("runtime-root");
        Fixture {
            rt,
            tmp,
            id,
            cgroup,
            bundle,
            state_dir,
            log_path,
            runtime_root,
            shim: None,
        }
    }

    pub fn runtime_config(&self) -> RuntimeConfig {
        match self.rt {
            Rt::Embedded => RuntimeConfig::Embedded {
                root: self.runtime_root.clone(),
                systemd_cgroup: false,
            },
            Rt::Runc | Rt::Crun => RuntimeConfig::Cli {
                path: PathBuf::from(if self.rt == Rt::Runc { RUNC } else { CRUN }),
                root: self.runtime_root.clone(),
                systemd_cgroup: false,
            },
        }
    }

    pub fn config(&self, tty: bool, stdin: bool, stdin_once: bool) -> ShimConfig {
        ShimConfig {
            id: self.id.clone(),
            bundle: self.bundle.clone(),
            runtime: self.runtime_config(),
            log_path: Some(self.log_path.clone()),
            log_directory: None,
            log_size_max: 0,
            tty,
            stdin,
            stdin_once,
            restore: None,
        }
    }

    /// Edits config.json before the spawn.
    pub fn edit_spec(&self, f: impl FnOnce(&mut Value)) {
        let p = self.bundle.join("config.json");
        let mut v: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        f(&mut v);
        fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }

    pub async fn spawn_with(&mut self, cfg: ShimConfig) -> crust_shim_protocol::Result<Shim> {
        let r = Shim::spawn(SpawnOptions {
            shim_binary: shim_binary(),
            state_dir: self.state_dir.clone(),
            config: cfg,
            timeout: Duration::from_secs(60),
        })
        .await;
        if let Ok(s) = &r {
            self.shim = Some(s.clone());
        }
        r
    }

    /// Spawns the monitor (container created, not started).
    pub async fn spawn(&mut self, tty: bool, stdin: bool, stdin_once: bool) -> Shim {
        let cfg = self.config(tty, stdin, stdin_once);
        self.spawn_with(cfg).await.expect("spawn")
    }

    pub fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log_path).unwrap_or_default()).into_owned()
    }

    /// Waits until the log holds `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let t = Instant::now();
        loop {
            let l = self.log();
            if l.contains(needle) {
                return l;
            }
            if t.elapsed() > timeout {
                panic!("log never got {needle:?}; log:\n{l}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The v1 memory cgroup dir (or v2 dir) of the container.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Ok(rd) = fs::read_dir("/sys/fs/cgroup") {
            for e in rd.flatten() {
                let p = e.path().join(&self.cgroup);
                if p.exists() {
                    out.push(p);
                }
            }
        }
        let p = Path::new("/sys/fs/cgroup").join(&self.cgroup);
        if p.exists() && !out.contains(&p) {
            out.push(p);
        }
        out
    }
}

fn read_pid(p: &Path) -> Option<i32> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

pub fn alive(pid: i32) -> bool {
    pid > 0
        && !fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
}

/// SIGKILL, ignoring errors (the process may be gone).
fn kill9(pid: i32) {
    let _ = crust_linux::process::send_signal(pid, 9);
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The container's init (and exec processes), then the monitors.
        let mut pids = Vec::new();
        if let Some(p) = read_pid(&self.state_dir.join(CONTAINER_PID_FILE)) {
            pids.push(p);
        }
        if let Ok(rd) = fs::read_dir(self.state_dir.join("exec")) {
            for e in rd.flatten() {
                pids.extend(read_pid(&e.path().join(CONTAINER_PID_FILE)));
                pids.extend(read_pid(&e.path().join(SHIM_PID_FILE)));
            }
        }
        for p in &pids {
            if *p > 1 {
                kill9(*p);
            }
        }
        // Cgroup processes that might be left (runtime leftovers).
        for d in self.cgroup_dirs() {
            if let Ok(procs) = fs::read_to_string(d.join("cgroup.procs")) {
                for p in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    kill9(p);
                }
            }
        }
        let shim_pid = read_pid(&self.state_dir.join(SHIM_PID_FILE))
            .or(self.shim.as_ref().map(|s| s.shim_pid()));
        // Give the monitor a moment to exit by itself (it deletes the
        // container), then make sure.
        if let Some(sp) = shim_pid {
            let t = Instant::now();
            while alive(sp)
                && crust_shim_protocol::is_shim_of(sp, &self.state_dir)
                && t.elapsed() < Duration::from_secs(3)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            if crust_shim_protocol::is_shim_of(sp, &self.state_dir) {
                kill9(sp);
            }
        }
        match self.rt {
            Rt::Runc | Rt::Crun => {
                let bin = if self.rt == Rt::Runc { RUNC } else { CRUN };
                let _ = Command::new(bin)
                    .arg("--root")
                    .arg(&self.runtime_root)
                    .args(["delete", "--force", &self.id])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
            }
            Rt::Embedded => {}
        }
        for _ in 0..50 {
            let dirs = self.cgroup_dirs();
            if dirs.is_empty() {
                break;
            }
            for d in dirs {
                let _ = fs::remove_dir(&d);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A minimal OCI runtime spec for a busybox rootfs.
pub fn spec(args: &[&str], tty: bool, cgroup: &str) -> Value {
    let caps = json!([
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE"
    ]);
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": tty,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin", "TERM=xterm", "HOME=/"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": "crust-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777"]}
        ],
        "linux": {
            "cgroupsPath": format!("/{cgroup}"),
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [
                {"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                {"type": "uts"}, {"type": "mount"}
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

/// Polls `f` until it is true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < timeout {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

pub async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Both halves of an attach connection, used as one.
pub struct Attach {
    pub r: AttachReader,
    pub w: AttachWriter,
}

impl Attach {
    pub async fn to(shim: &Shim) -> crust_shim_protocol::Result<Attach> {
        let (r, w) = shim.attach().await?;
        Ok(Attach { r, w })
    }

    pub async fn next_event(&mut self) -> std::io::Result<Option<AttachEvent>> {
        self.r.next_event().await
    }

    pub async fn write_stdin(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.w.write_stdin(data).await
    }

    pub async fn declare_stdin(&mut self) -> std::io::Result<()> {
        self.w.declare_stdin().await
    }

    pub async fn close_stdin(&mut self) -> std::io::Result<()> {
        self.w.close_stdin().await
    }

    pub async fn resize(&mut self, width: u16, height: u16) -> std::io::Result<()> {
        self.w.resize(width, height).await
    }

    /// Stdout until it holds `want`; anything else is a failure.
    pub async fn read_until(&mut self, want: &str) -> Vec<u8> {
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains(want) {
            match self.next_event().await.unwrap() {
                Some(AttachEvent::Stdout(d)) => got.extend_from_slice(&d),
                other => panic!("unexpected {other:?} before {want:?}"),
            }
        }
        got
    }

    /// Events until the exit (stdout collected); the exit record.
    pub async fn until_exit(&mut self) -> (Vec<u8>, crust_shim_protocol::ExitInfo) {
        let mut out = Vec::new();
        loop {
            match self.next_event().await.unwrap() {
                Some(AttachEvent::Stdout(d)) => out.extend_from_slice(&d),
                Some(AttachEvent::Stderr(d)) => panic!("unexpected stderr {d:?}"),
                Some(AttachEvent::Exit(e)) => return (out, e),
                None => panic!("attach closed before the exit"),
            }
        }
    }
}

/// Rss and Pss (KiB) and the private parts from /proc/PID/smaps_rollup.
#[derive(Debug, Default, Clone, Copy)]
pub struct Mem {
    pub rss: u64,
    pub pss: u64,
    pub private_clean: u64,
    pub private_dirty: u64,
    pub anonymous: u64,
}

pub fn mem(pid: i32) -> Mem {
    let s = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let mut m = Mem::default();
    for l in s.lines() {
        let mut it = l.split_whitespace();
        let (k, v) = (
            it.next().unwrap_or(""),
            it.next().and_then(|v| v.parse().ok()).unwrap_or(0),
        );
        match k {
            "Rss:" => m.rss = v,
            "Pss:" => m.pss = v,
            "Private_Clean:" => m.private_clean = v,
            "Private_Dirty:" => m.private_dirty = v,
            "Anonymous:" => m.anonymous = v,
            _ => {}
        }
    }
    m
}

/// A started exec session: its process and its own monitor.
pub struct Session {
    pub pid: i32,
    pub shim: Shim,
}

pub async fn session(
    shim: &Shim,
    req: crust_shim_protocol::ExecRequest,
) -> crust_shim_protocol::Result<Session> {
    let (started, shim) = shim.exec(&req).await?;
    Ok(Session {
        pid: started.pid,
        shim,
    })
}

/// (parent pid, session id) of `pid`, from /proc/PID/stat (proc(5)).
pub fn ppid_and_session(pid: &str) -> (i32, i32) {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // After the command: state, ppid, pgrp, session.
    (fields[1].parse().unwrap(), fields[3].parse().unwrap())
}
