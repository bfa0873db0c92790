//! An OCI runtime binary with runc's command line: runc, crun, youki.
//!
//! ```text
//! RUNTIME --root R --log L --log-format json [--systemd-cgroup] create --bundle B --pid-file P [--console-socket S] ID
//! RUNTIME ... start ID | kill [--all] ID SIG | delete --force ID | state ID
//! RUNTIME ... exec --process P.json --detach --pid-file F [--console-socket S] ID
//! RUNTIME ... update --resources R.json ID
//! ```
//!
//! The runtime's own messages go to `--log` as JSON lines; on failure the
//! last `error`/`fatal` message written during the call is the error. For
//! `create` and `exec` the runtime's stdio is the new process's stdio (as
//! with conmon), so the runtime's final error line also shows up there.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio as ProcStdio};

use crust_shim_protocol::DEFAULT_PATH;

use super::{
    CreateOptions, ExecOptions, OciRuntime, RestoreOptions, Result, RuntimeError, RuntimeState,
    Stdio,
};

pub struct CliRuntime {
    path: PathBuf,
    root: PathBuf,
    systemd_cgroup: bool,
    log: PathBuf,
    name: String,
}

impl CliRuntime {
    pub fn new(path: PathBuf, root: PathBuf, systemd_cgroup: bool, log: PathBuf) -> Self {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "oci-runtime".into());
        CliRuntime {
            path,
            root,
            systemd_cgroup,
            log,
            name,
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.path);
        c.env_clear()
            .env("PATH", DEFAULT_PATH)
            .arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&self.log)
            .arg("--log-format")
            .arg("json");
        if self.systemd_cgroup {
            c.arg("--systemd-cgroup");
        }
        c
    }

    fn log_len(&self) -> u64 {
        fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    /// The error the runtime logged since `from`, else `fallback`.
    fn error_since(
        &self,
        op: &str,
        from: u64,
        status: ExitStatus,
        fallback: &[u8],
    ) -> RuntimeError {
        let mut msg = None;
        if let Ok(mut f) = fs::File::open(&self.log)
            && f.seek(SeekFrom::Start(from)).is_ok()
        {
            let mut s = String::new();
            // Bounded: a runtime that floods its log does not flood us.
            let _ = f.take(1 << 20).read_to_string(&mut s);
            for line in s.lines() {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                    let level = v.get("level").and_then(|l| l.as_str()).unwrap_or("");
                    if matches!(level, "error" | "fatal" | "panic")
                        && let Some(m) = v.get("msg").and_then(|m| m.as_str())
                    {
                        msg = Some(m.to_string());
                    }
                }
            }
        }
        let msg = msg.unwrap_or_else(|| {
            let f = String::from_utf8_lossy(fallback).trim().to_string();
            if f.is_empty() { status.to_string() } else { f }
        });
        RuntimeError::new(format!("{} {op}: {msg}", self.name))
    }

    /// Runs a command whose stdio the monitor does not care about.
    fn run(&self, op: &str, args: &[&std::ffi::OsStr]) -> Result<Vec<u8>> {
        let from = self.log_len();
        let out = self
            .command()
            .args(args)
            .stdin(ProcStdio::null())
            .stdout(ProcStdio::piped())
            .stderr(ProcStdio::piped())
            .output()
            .map_err(|e| RuntimeError::new(format!("running {}: {e}", self.path.display())))?;
        if !out.status.success() {
            return Err(self.error_since(op, from, out.status, &out.stderr));
        }
        Ok(out.stdout)
    }

    /// Runs a command with the new process's stdio; `meanwhile` runs
    /// while it does.
    fn run_with_stdio(
        &self,
        op: &str,
        mut cmd: Command,
        stdio: Stdio,
        meanwhile: impl FnOnce(),
    ) -> Result<()> {
        let from = self.log_len();
        cmd.stdin(to_proc(stdio.stdin))
            .stdout(to_proc(stdio.stdout))
            .stderr(to_proc(stdio.stderr));
        let running =
            |e: std::io::Error| RuntimeError::new(format!("running {}: {e}", self.path.display()));
        let mut child = cmd.spawn().map_err(running)?;
        meanwhile();
        let status = child.wait().map_err(running)?;
        // `cmd` (and with it our copies of the child's stdio) is dropped here.
        drop(cmd);
        if !status.success() {
            return Err(self.error_since(op, from, status, b""));
        }
        Ok(())
    }
}

fn to_proc(fd: Option<std::os::fd::OwnedFd>) -> ProcStdio {
    match fd {
        Some(fd) => ProcStdio::from(fd),
        None => ProcStdio::null(),
    }
}

impl OciRuntime for CliRuntime {
    fn name(&self) -> &str {
        &self.name
    }

    fn create(&self, id: &str, opts: CreateOptions<'_>) -> Result<i32> {
        let mut cmd = self.command();
        cmd.arg("create")
            .arg("--bundle")
            .arg(opts.bundle)
            .arg("--pid-file")
            .arg(opts.pid_file);
        if let Some(s) = opts.console_socket {
            cmd.arg("--console-socket").arg(s);
        }
        cmd.arg(id);
        // The runtime moves its init into the container's cgroup: the
        // lock's grace period starts now, while it starts up (see
        // crust_linux::migration).
        self.run_with_stdio("create", cmd, opts.stdio, || {
            drop(crust_linux::migration::prime())
        })?;
        super::read_pid_file(opts.pid_file)
    }

    fn start(&self, id: &str) -> Result<()> {
        self.run("start", &["start".as_ref(), id.as_ref()])
            .map(drop)
    }

    fn kill(&self, id: &str, signal: i32, all: bool) -> Result<()> {
        let sig = signal.to_string();
        let mut args: Vec<&std::ffi::OsStr> = vec!["kill".as_ref()];
        if all {
            args.push("--all".as_ref());
        }
        args.push(id.as_ref());
        args.push(sig.as_ref());
        self.run("kill", &args).map(drop)
    }

    fn delete(&self, id: &str, force: bool) -> Result<()> {
        let mut args: Vec<&std::ffi::OsStr> = vec!["delete".as_ref()];
        if force {
            args.push("--force".as_ref());
        }
        args.push(id.as_ref());
        self.run("delete", &args).map(drop)
    }

    fn exec(&self, id: &str, opts: ExecOptions<'_>) -> Result<i32> {
        let mut cmd = self.command();
        cmd.arg("exec")
            .arg("--process")
            .arg(opts.process)
            .arg("--detach")
            .arg("--pid-file")
            .arg(opts.pid_file);
        if let Some(s) = opts.console_socket {
            cmd.arg("--console-socket").arg(s);
        }
        cmd.arg(id);
        self.run_with_stdio("exec", cmd, opts.stdio, || {})?;
        super::read_pid_file(opts.pid_file)
    }

    fn checkpoint(&self, id: &str, image_path: &Path, work_path: &Path) -> Result<()> {
        // runc tells criu itself which namespaces (the pod's pinned ones)
        // and bind mounts are external, and finds criu in PATH.
        self.run(
            "checkpoint",
            &[
                "checkpoint".as_ref(),
                "--leave-running".as_ref(),
                "--image-path".as_ref(),
                image_path.as_os_str(),
                "--work-path".as_ref(),
                work_path.as_os_str(),
                id.as_ref(),
            ],
        )
        .map(drop)
    }

    fn restore(&self, id: &str, opts: RestoreOptions<'_>) -> Result<i32> {
        // runc re-points the dumped stdio pipes to its own stdio (the
        // monitor's new pipes), joins the new spec's network namespace
        // (external to the images) and maps bind mounts by destination to
        // the new spec's sources. Soft cgroup mode: runc has made the new
        // pod's cgroup for the container and names it criu's cgroup root,
        // so the processes land there; the old node's cgroup tree is
        // neither recreated nor required.
        let mut cmd = self.command();
        cmd.arg("restore")
            .arg("--detach")
            .arg("--bundle")
            .arg(opts.bundle)
            .arg("--pid-file")
            .arg(opts.pid_file)
            .arg("--image-path")
            .arg(opts.image_path)
            .arg("--work-path")
            .arg(opts.work_path)
            .arg("--manage-cgroups-mode")
            .arg("soft")
            .arg(id);
        self.run_with_stdio("restore", cmd, opts.stdio, || {})?;
        super::read_pid_file(opts.pid_file)
    }

    fn update(&self, id: &str, resources: &Path) -> Result<()> {
        self.run(
            "update",
            &[
                "update".as_ref(),
                "--resources".as_ref(),
                resources.as_os_str(),
                id.as_ref(),
            ],
        )
        .map(drop)
    }

    fn state(&self, id: &str) -> Result<RuntimeState> {
        let out = self.run("state", &["state".as_ref(), id.as_ref()])?;
        let v: serde_json::Value = serde_json::from_slice(&out)
            .map_err(|e| RuntimeError::new(format!("{} state: bad JSON: {e}", self.name)))?;
        Ok(RuntimeState {
            status: v
                .get("status")
                .and_then(|s| s.as_str())
                .unwrap_or("unknown")
                .to_string(),
            pid: v.get("pid").and_then(|p| p.as_i64()).unwrap_or(0) as i32,
        })
    }
}
