//! youki's `libcontainer` as the OCI runtime, without a runtime binary.
//!
//! # Why every call runs in a forked child
//!
//! The monitor lives as long as its container and must stay small (under
//! 1 MiB PSS idle). libcontainer is large: creating a container touches
//! hundreds of KiB of its code and data, allocates (spec parsing, procfs,
//! regexes, seccomp filters), sets process attributes (`dumpable`,
//! `oom_score_adj`, current directory) and leaves heap fragments behind. So
//! the monitor *forks* (it is single-threaded, so forking is safe) and the
//! child runs the libcontainer call, sends back one line (`ok <pid>` or
//! `err <message>`) on a pipe and `_exit`s. libcontainer's pages are touched
//! only in that short-lived child; the monitor's address space is never
//! dirtied by it (copy-on-write), so its idle footprint is the same as with
//! the CLI runtime — measured in the tests (`idle_memory::{embedded,runc}`):
//! about 0.7 MiB PSS and 1.1 MiB RSS idle either way (release build).
//!
//! The alternative, re-executing `/proc/self/exe` in a "runtime" mode that
//! mimics runc's command line, costs an exec and a dynamic load per call
//! (milliseconds) for the same isolation; forking costs a fraction of that
//! and needs no argument encoding.
//!
//! The container's init is created by libcontainer's intermediate process
//! (a grandchild of the monitor). When the intermediate and then our child
//! exit, the init is reparented to the nearest child subreaper: the monitor
//! (`PR_SET_CHILD_SUBREAPER` is not inherited across fork, so the child is
//! not one). Exec processes (see [`super::join`]) end up the same way.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use libcontainer::container::Container;
use libcontainer::container::ContainerStatus;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;
use std::os::fd::{AsFd, OwnedFd};

use super::{CreateOptions, ExecOptions, OciRuntime, Result, RuntimeError, RuntimeState};
use crust_linux::children;
use crust_linux::process as sys;

pub struct EmbeddedRuntime {
    root: PathBuf,
    systemd_cgroup: bool,
}

type ChildResult = std::result::Result<i64, String>;

impl EmbeddedRuntime {
    pub fn new(root: PathBuf, systemd_cgroup: bool) -> Self {
        EmbeddedRuntime {
            root,
            systemd_cgroup,
        }
    }

    fn load(&self, id: &str) -> std::result::Result<Container, String> {
        if !valid_id(id) {
            return Err(format!("invalid container id {id:?}"));
        }
        Container::load(self.root.join(id)).map_err(|e| e.to_string())
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'))
}

/// Runs `f` in a forked child and returns what it returned. `f` (and what
/// it owns, such as the new process's stdio) is dropped unrun in the monitor.
fn in_child<F: FnOnce() -> ChildResult>(op: &str, f: F) -> Result<i64> {
    in_child_meanwhile(op, f, || {})
}

/// [`in_child`], running `meanwhile` in the monitor while the child works.
fn in_child_meanwhile<F: FnOnce() -> ChildResult>(
    op: &str,
    f: F,
    meanwhile: impl FnOnce(),
) -> Result<i64> {
    // Non-blocking both ways: the answer (at most 60 KiB) fits in the pipe,
    // and the parent reads it after the child has exited. It must not read
    // to EOF: the container's init inherits the write end and keeps it
    // until it execs (after `start`).
    let (r, w) = std::io::pipe()?;
    let (r, w) = (OwnedFd::from(r), OwnedFd::from(w));
    sys::set_nonblocking(r.as_fd())?;
    sys::set_nonblocking(w.as_fd())?;
    match sys::fork()? {
        None => {
            drop(r);
            sys::reset_signals();
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err("libcontainer panicked".into()));
            let mut line = match res {
                Ok(n) => format!("ok {n}"),
                Err(e) => format!("err {e}"),
            };
            if line.len() > 60 * 1024 {
                let mut cut = 60 * 1024;
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.truncate(cut);
            }
            let mut w = File::from(w);
            let _ = w.write_all(line.as_bytes());
            drop(w);
            sys::exit_now(0)
        }
        Some(child) => {
            drop(w);
            drop(f);
            meanwhile();
            let _ = children::wait_for(child);
            let mut out = Vec::new();
            let mut r = File::from(r);
            let mut buf = [0u8; 8192];
            loop {
                match r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // WouldBlock: all the child wrote has been read.
                    Err(_) => break,
                }
            }
            let out = String::from_utf8_lossy(&out);
            if let Some(n) = out.strip_prefix("ok ") {
                return n
                    .trim()
                    .parse()
                    .map_err(|_| RuntimeError::new(format!("embedded {op}: bad answer {out:?}")));
            }
            if let Some(e) = out.strip_prefix("err ") {
                return Err(RuntimeError::new(format!("embedded {op}: {e}")));
            }
            Err(RuntimeError::new(format!(
                "embedded {op}: the runtime process died without an answer"
            )))
        }
    }
}

impl OciRuntime for EmbeddedRuntime {
    fn name(&self) -> &str {
        "embedded"
    }

    fn create(&self, id: &str, opts: CreateOptions<'_>) -> Result<i32> {
        let root = self.root.clone();
        let systemd = self.systemd_cgroup;
        let id = id.to_string();
        let bundle = opts.bundle.to_path_buf();
        let pid_file = opts.pid_file.to_path_buf();
        let console = opts.console_socket.map(Path::to_path_buf);
        let stdio = opts.stdio;
        let pid = in_child_meanwhile(
            "create",
            move || {
                std::fs::create_dir_all(&root)
                    .map_err(|e| format!("creating {}: {e}", root.display()))?;
                let mut b = ContainerBuilder::new(id, SyscallType::default())
                    .validate_id()
                    .map_err(|e| e.to_string())?
                    .with_root_path(&root)
                    .map_err(|e| e.to_string())?
                    .with_pid_file(Some(&pid_file))
                    .map_err(|e| e.to_string())?
                    .with_console_socket(console.as_ref());
                if console.is_none() {
                    // With a tty the pty is the init's stdio.
                    b = b
                        .with_stdin(stdio.stdin.map_or_else(devnull, Ok)?)
                        .with_stdout(stdio.stdout.map_or_else(devnull, Ok)?)
                        .with_stderr(stdio.stderr.map_or_else(devnull, Ok)?);
                }
                let c = b
                    .as_init(&bundle)
                    .with_systemd(systemd)
                    .with_detach(true)
                    .build()
                    .map_err(|e| format!("{e:#}"))?;
                c.pid()
                    .map(|p| p.as_raw() as i64)
                    .ok_or_else(|| "no init pid after create".to_string())
            },
            // libcontainer moves its intermediate process into the
            // container's cgroup: the lock's grace period starts now, while
            // the child gets there (see crust_linux::migration).
            || drop(crust_linux::migration::prime()),
        )?;
        Ok(pid as i32)
    }

    fn start(&self, id: &str) -> Result<()> {
        in_child("start", || {
            let mut c = self.load(id)?;
            c.start().map_err(|e| e.to_string())?;
            Ok(0)
        })
        .map(drop)
    }

    fn kill(&self, id: &str, signal: i32, all: bool) -> Result<()> {
        in_child("kill", || {
            let sig = Signal::try_from(signal).map_err(|e| e.to_string())?;
            let mut c = self.load(id)?;
            c.kill(sig, all).map_err(|e| e.to_string())?;
            Ok(0)
        })
        .map(drop)
    }

    fn delete(&self, id: &str, force: bool) -> Result<()> {
        in_child("delete", || {
            let mut c = match self.load(id) {
                Ok(c) => c,
                // Nothing left to delete.
                Err(_) if !self.root.join(id).exists() => return Ok(0),
                Err(e) => return Err(e),
            };
            c.delete(force).map_err(|e| e.to_string())?;
            Ok(0)
        })
        .map(drop)
    }

    /// Not libcontainer's tenant builder, which drops the container's
    /// seccomp filter for the new process: see [`super::join`].
    fn exec(&self, id: &str, opts: ExecOptions<'_>) -> Result<i32> {
        use libcgroups::common::{CgroupConfig, CgroupManager, create_cgroup_manager};
        let stdio = opts.stdio;
        let pid = in_child("exec", move || {
            let mut c = self.load(id)?;
            c.refresh_status().map_err(|e| e.to_string())?;
            if !c.can_exec() {
                return Err(format!("container {id} is not running ({:?})", c.status()));
            }
            let init_pid = c.pid().ok_or("the container has no init pid")?.as_raw();
            let config = c.bundle().join("config.json");
            let spec = oci_spec::runtime::Spec::load(&config)
                .map_err(|e| format!("reading {}: {e}", config.display()))?;
            let data = std::fs::read(opts.process)
                .map_err(|e| format!("reading {}: {e}", opts.process.display()))?;
            let process: oci_spec::runtime::Process = serde_json::from_slice(&data)
                .map_err(|e| format!("bad process {}: {e}", opts.process.display()))?;
            let cgroup_path = c.spec().map_err(|e| e.to_string())?.cgroup_path;
            let join_cgroup = |pid: nix::unistd::Pid| {
                create_cgroup_manager(CgroupConfig {
                    cgroup_path: cgroup_path.clone(),
                    systemd_cgroup: c.systemd(),
                    container_name: id.to_string(),
                })
                .map_err(|e| e.to_string())?
                .add_task(pid)
                .map_err(|e| format!("joining the container's cgroup: {e}"))
            };
            let pid = super::join::exec_in_container(super::join::JoinRequest {
                init_pid,
                spec: &spec,
                process: &process,
                join_cgroup: &join_cgroup,
                console_socket: opts.console_socket,
                subreaper: opts.own_orphans,
                stdio: [stdio.stdin, stdio.stdout, stdio.stderr],
            })?;
            Ok(pid as i64)
        })?;
        // Written here, in the monitor: the child that ran the exec is in
        // the container's namespaces, where the state dir does not resolve.
        // Nobody reads it before exec returns, so a plain write will do.
        std::fs::write(opts.pid_file, pid.to_string())
            .map_err(|e| RuntimeError::new(format!("writing the pid file: {e}")))?;
        Ok(pid as i32)
    }

    fn checkpoint(&self, _id: &str, _image_path: &Path, _work_path: &Path) -> Result<()> {
        // libcontainer 0.7's Container::checkpoint exists but runs
        // `criu` from PATH only and has not been tried here yet.
        Err(RuntimeError::new(
            "the embedded handler cannot checkpoint yet (the runc handler can)",
        ))
    }

    fn restore(&self, _id: &str, _opts: super::RestoreOptions<'_>) -> Result<i32> {
        // The daemon refuses such a restore before it gets here.
        Err(RuntimeError::new(
            "the embedded handler cannot restore a checkpoint (the runc handler can)",
        ))
    }

    fn update(&self, id: &str, resources: &Path) -> Result<()> {
        use libcgroups::common::{
            CgroupConfig, CgroupManager, ControllerOpt, create_cgroup_manager,
        };
        in_child("update", || {
            let data = std::fs::read(resources).map_err(|e| e.to_string())?;
            let res: oci_spec::runtime::LinuxResources =
                serde_json::from_slice(&data).map_err(|e| format!("bad resources: {e}"))?;
            let c = self.load(id)?;
            let cfg = c.spec().map_err(|e| e.to_string())?;
            let mgr = create_cgroup_manager(CgroupConfig {
                cgroup_path: cfg.cgroup_path.clone(),
                systemd_cgroup: c.systemd(),
                container_name: id.to_string(),
            })
            .map_err(|e| e.to_string())?;
            mgr.apply(&ControllerOpt {
                resources: &res,
                disable_oom_killer: false,
                oom_score_adj: None,
                freezer_state: None,
            })
            .map_err(|e| e.to_string())?;
            Ok(0)
        })
        .map(drop)
    }

    fn state(&self, id: &str) -> Result<RuntimeState> {
        // Status and pid packed in one number: status * 2^32 + pid.
        let v = in_child("state", || {
            let mut c = self.load(id)?;
            c.refresh_status().map_err(|e| e.to_string())?;
            let s = match c.status() {
                ContainerStatus::Creating => 0,
                ContainerStatus::Created => 1,
                ContainerStatus::Running => 2,
                ContainerStatus::Stopped => 3,
                ContainerStatus::Paused => 4,
            };
            Ok((s << 32) | c.pid().map_or(0, |p| p.as_raw() as i64))
        })?;
        let status = ["creating", "created", "running", "stopped", "paused"]
            .get((v >> 32) as usize)
            .unwrap_or(&"unknown");
        Ok(RuntimeState {
            status: status.to_string(),
            pid: (v & 0xffff_ffff) as i32,
        })
    }
}

fn devnull() -> std::result::Result<std::os::fd::OwnedFd, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(Into::into)
        .map_err(|e| format!("opening /dev/null: {e}"))
}
