//! From `crust-shim container|exec DIR` to a running loop: descriptor and
//! process hygiene (nothing inherited, a session of its own, detached from
//! the daemon, the children's subreaper), then the container (or exec
//! process) created through the runtime, and the one-line start-up report
//! on stdout that the client waits for.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_linux::children::ChildSignals;
use crust_linux::process::{self as sys, StdFd};
use crust_shim_protocol::exit_file::write_replace_volatile;
use crust_shim_protocol::{
    ATTACH_SOCKET, CONFIG_FILE, CONSOLE_SOCKET, CONTAINER_PID_FILE, CONTROL_SOCKET,
    EXEC_CONFIG_FILE, ExecConfig, PROCESS_FILE, RUNTIME_LOG, SHIM_LOG, SHIM_PID_FILE, ShimConfig,
    StartupResult, Status,
};

use super::attach::Attachers;
use super::conn::bind_socket;
use super::container_io::{ContainerIo, Plumbing, console_arg};
use super::container_log::{LogFile, LogTarget};
use super::control::Controls;
use super::oom::OomWatch;
use super::{Error, Ids, Mode, Monitor};
use crate::runtime::{self, CreateOptions, ExecOptions, OciRuntime};

/// Default wait of an exec session for its first client.
const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a monitor in `mode` for the state dir `dir`; returns the process's
/// exit code.
pub fn run(mode: Mode, dir: &Path) -> i32 {
    sys::close_inherited_fds();
    if !dir.is_absolute() {
        return fail(Error::Config(format!(
            "state dir {} is not absolute",
            dir.display()
        )));
    }
    if let Err(e) = std::env::set_current_dir(dir) {
        return fail(Error::io(format!("state dir {}", dir.display()))(e));
    }
    // Our own diagnostics go to shim.log; stdin is /dev/null; stdout stays
    // the start-up pipe until `report`.
    match OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.join(SHIM_LOG))
    {
        Ok(f) => {
            let _ = sys::replace_std_fd(StdFd::Stderr, f.as_fd());
        }
        Err(e) => return fail(Error::io(format!("opening {SHIM_LOG}"))(e)),
    }
    if let Ok(null) = File::open("/dev/null") {
        let _ = sys::replace_std_fd(StdFd::Stdin, null.as_fd());
    }
    // A new session: no terminal, no signals meant for the daemon's group.
    let _ = sys::new_session();
    if mode == Mode::Container {
        // The second fork: the process the daemon started exits now (the
        // daemon reaps it), the monitor is reparented to init, outliving the
        // daemon; it is not a session leader, so it can never get a
        // controlling terminal.
        match sys::fork() {
            Ok(Some(_)) => sys::exit_now(0),
            Ok(None) => {}
            Err(e) => return fail(Error::io("fork")(e)),
        }
    }
    if let Err(e) = sys::set_child_subreaper() {
        return fail(Error::io("PR_SET_CHILD_SUBREAPER")(e));
    }
    let children = match ChildSignals::new() {
        Ok(s) => s,
        Err(e) => return fail(Error::io("watching children")(e)),
    };
    let shim_pid = std::process::id() as i32;
    // No fsync: it names a live process (see `write_replace_volatile`).
    if let Err(e) = write_replace_volatile(dir, SHIM_PID_FILE, shim_pid.to_string().as_bytes()) {
        return fail(Error::io(format!("writing {SHIM_PID_FILE}"))(e));
    }
    let mut m = match Monitor::setup(mode, dir, shim_pid, children) {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_file(dir.join(SHIM_PID_FILE));
            return fail(e);
        }
    };
    report(&StartupResult::Ok {
        shim_pid,
        pid: m.pid,
    });
    m.run();
    m.cleanup_files();
    0
}

/// Writes the start-up result on fd 1 and points fd 1 at /dev/null.
fn report(result: &StartupResult) {
    let mut line = serde_json::to_vec(result).unwrap_or_default();
    line.push(b'\n');
    let mut out = io::stdout().lock();
    let _ = out.write_all(&line);
    let _ = out.flush();
    drop(out);
    if let Ok(null) = OpenOptions::new().write(true).open("/dev/null") {
        let _ = sys::replace_std_fd(StdFd::Stdout, null.as_fd());
    }
}

fn fail(e: Error) -> i32 {
    let message = e.to_string();
    eprintln!("crust-shim: {message}");
    report(&StartupResult::Err { message });
    1
}

/// Reads a JSON file of the state dir or the bundle.
pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let data = fs::read(path).map_err(Error::io(format!("reading {}", path.display())))?;
    serde_json::from_slice(&data)
        .map_err(|e| Error::Config(format!("parsing {}: {e}", path.display())))
}

fn valid_container_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'-' | b'.'))
}

/// `consoleSize` (width, height) of an OCI process.
fn console_size(process: &serde_json::Value) -> Option<(u16, u16)> {
    let cs = process.get("consoleSize")?;
    let w = u16::try_from(cs.get("width")?.as_u64()?).ok()?;
    let h = u16::try_from(cs.get("height")?.as_u64()?).ok()?;
    Some((w, h))
}

/// What a monitor is to run, from its state dir.
struct Settings {
    id: String,
    bundle: PathBuf,
    runtime: crust_shim_protocol::RuntimeConfig,
    tty: bool,
    stdin: bool,
    stdin_once: bool,
    /// The CRI log and its size cap.
    log: Option<(LogTarget, u64)>,
    attach_timeout: Option<Duration>,
    restore: Option<crust_shim_protocol::RestoreConfig>,
}

impl Settings {
    fn read(mode: Mode, dir: &Path) -> Result<Settings, Error> {
        let s = match mode {
            Mode::Container => {
                let cfg: ShimConfig = read_json(&dir.join(CONFIG_FILE))?;
                if !cfg.bundle.is_absolute() {
                    return Err(Error::Config(format!(
                        "bundle {} is not absolute",
                        cfg.bundle.display()
                    )));
                }
                let log = match &cfg.log_path {
                    Some(l) if !l.is_absolute() => {
                        return Err(Error::Config(format!(
                            "log path {} is not absolute",
                            l.display()
                        )));
                    }
                    Some(l) => Some((
                        LogTarget::new(l, cfg.log_directory.as_deref()).map_err(Error::Config)?,
                        cfg.log_size_max,
                    )),
                    None => None,
                };
                Settings {
                    id: cfg.id,
                    bundle: cfg.bundle,
                    runtime: cfg.runtime,
                    tty: cfg.tty,
                    stdin: cfg.stdin,
                    stdin_once: cfg.stdin_once,
                    log,
                    attach_timeout: None,
                    restore: cfg.restore,
                }
            }
            Mode::Exec => {
                let cfg: ExecConfig = read_json(&dir.join(EXEC_CONFIG_FILE))?;
                Settings {
                    id: cfg.container_id,
                    bundle: PathBuf::new(),
                    runtime: cfg.runtime,
                    tty: cfg.tty,
                    stdin: cfg.stdin,
                    // An exec's stdin ends when its client's does.
                    stdin_once: true,
                    log: None,
                    attach_timeout: Some(match cfg.attach_timeout_ms {
                        0 => DEFAULT_ATTACH_TIMEOUT,
                        ms => Duration::from_millis(ms),
                    }),
                    restore: None,
                }
            }
        };
        if !valid_container_id(&s.id) {
            return Err(Error::Config(format!("invalid container id {:?}", s.id)));
        }
        Ok(s)
    }
}

impl Monitor {
    /// Creates the container (or exec process) and everything the loop
    /// watches.
    fn setup(
        mode: Mode,
        dir: &Path,
        shim_pid: i32,
        children: ChildSignals,
    ) -> Result<Monitor, Error> {
        let s = Settings::read(mode, dir)?;
        let runtime = runtime::from_config(&s.runtime, dir.join(RUNTIME_LOG));
        let log = match s.log {
            Some((target, size_max)) => {
                Some(LogFile::open(target, size_max).map_err(super::container_log::open_error)?)
            }
            None => None,
        };
        if s.restore.is_some() && s.tty {
            // The dumped pty cannot be handed to a new console socket.
            return Err(Error::Config(
                "restoring a container with a tty is not supported".into(),
            ));
        }
        let ctl_listener = bind_socket(dir, CONTROL_SOCKET)?;
        let attach_listener = bind_socket(dir, ATTACH_SOCKET)?;
        let (mut plumbing, child_stdio) = Plumbing::new(s.tty, s.stdin, dir)?;
        let console = if plumbing.wants_console() {
            Some(console_arg(dir, &s.runtime)?)
        } else {
            None
        };
        let (console, _console_link) = match console {
            Some((p, l)) => (Some(p), l),
            None => (None, None),
        };
        let pid_file = dir.join(CONTAINER_PID_FILE);
        let _ = fs::remove_file(&pid_file);
        if let Some(restore) = s.restore {
            // Nothing to create yet: `Start` restores (control::start).
            return Ok(Monitor {
                mode,
                dir: dir.to_path_buf(),
                id: s.id,
                bundle: s.bundle,
                runtime_cfg: s.runtime,
                runtime,
                shim_pid,
                pid: 0,
                status: Status::Created,
                children,
                io: ContainerIo::new(plumbing, log, s.stdin_once),
                attach: Attachers::new(attach_listener, None),
                ctl: Controls::new(ctl_listener),
                jobs: Default::default(),
                ids: Ids::default(),
                oom: None,
                reaped: None,
                exit: None,
                linger_until: None,
                trim_at: None,
                pending_restore: Some((restore, child_stdio)),
                started_at: 0,
            });
        }
        let created = match mode {
            Mode::Container => runtime.create(
                &s.id,
                CreateOptions {
                    bundle: &s.bundle,
                    pid_file: &pid_file,
                    console_socket: console.as_deref(),
                    stdio: child_stdio,
                },
            ),
            Mode::Exec => runtime.exec(
                &s.id,
                ExecOptions {
                    process: &dir.join(PROCESS_FILE),
                    pid_file: &pid_file,
                    console_socket: console.as_deref(),
                    own_orphans: false,
                    stdio: child_stdio,
                },
            ),
        };
        let cleanup = |rt: &dyn OciRuntime| {
            for name in [CONTROL_SOCKET, ATTACH_SOCKET, CONSOLE_SOCKET] {
                let _ = fs::remove_file(dir.join(name));
            }
            if mode == Mode::Container {
                let _ = rt.delete(&s.id, true);
            }
        };
        let pid = match created {
            Ok(pid) => pid,
            Err(e) => {
                cleanup(&*runtime);
                return Err(e.into());
            }
        };
        if let Err(e) = plumbing.receive_console(dir, s.stdin) {
            let _ = sys::send_signal(pid, libc::SIGKILL);
            cleanup(&*runtime);
            return Err(e);
        }
        // runc and the embedded exec (runtime::join) size the pty from
        // `consoleSize` before the program runs; libcontainer's create does
        // not, so set it here too (before `start`, so before the container's
        // program runs). For an exec process this repeats what is set.
        if plumbing.has_pty() {
            let process_json = match mode {
                Mode::Container => read_json::<serde_json::Value>(&s.bundle.join("config.json"))
                    .ok()
                    .and_then(|spec| spec.get("process").cloned()),
                Mode::Exec => read_json::<serde_json::Value>(&dir.join(PROCESS_FILE)).ok(),
            };
            plumbing.size_pty(process_json.as_ref().and_then(console_size));
        }
        let oom = match mode {
            Mode::Container => OomWatch::for_pid(pid),
            Mode::Exec => None,
        };
        let attach_deadline = s.attach_timeout.map(|t| Instant::now() + t);
        Ok(Monitor {
            mode,
            dir: dir.to_path_buf(),
            id: s.id,
            bundle: s.bundle,
            runtime_cfg: s.runtime,
            runtime,
            shim_pid,
            pid,
            status: match mode {
                Mode::Container => Status::Created,
                Mode::Exec => Status::Running,
            },
            children,
            io: ContainerIo::new(plumbing, log, s.stdin_once),
            attach: Attachers::new(attach_listener, attach_deadline),
            ctl: Controls::new(ctl_listener),
            jobs: Default::default(),
            ids: Ids::default(),
            oom,
            reaped: None,
            exit: None,
            linger_until: None,
            trim_at: None,
            pending_restore: None,
            started_at: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_single_safe_components() {
        assert!(valid_container_id("abc-1_2.x+y"));
        assert!(!valid_container_id(""));
        assert!(!valid_container_id(".."));
        assert!(!valid_container_id("a/b"));
        assert!(!valid_container_id(&"a".repeat(1025)));
    }

    #[test]
    fn console_size_of_a_process() {
        let p = serde_json::json!({"consoleSize": {"width": 80, "height": 24}});
        assert_eq!(console_size(&p), Some((80, 24)));
        let big = serde_json::json!({"consoleSize": {"width": 70000, "height": 24}});
        assert_eq!(console_size(&big), None);
        assert_eq!(console_size(&serde_json::json!({})), None);
    }
}
