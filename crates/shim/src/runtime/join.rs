//! Exec for the embedded runtime: a new process joins a running container.
//!
//! # Why not libcontainer's `TenantContainerBuilder`
//!
//! libcontainer 0.7 (and youki's main branch as of 2026-08) rebuilds the
//! `linux` section for an exec'd process from the namespaces, cgroup path,
//! personality and time offsets only (`adapt_spec_for_tenant`): the
//! container's seccomp filter is dropped, so a `crictl exec` or a probe ran
//! unconfined while the container itself was confined. runc and crun load
//! the container's filter for every exec. This module does what runc's
//! `setns` init does, with libcontainer's building blocks (seccomp filter
//! compiler, capability sets, rlimits, AppArmor) and nothing of its
//! container-creation machinery.
//!
//! # Order, in a child of the monitor (host namespaces, full privileges)
//!
//! 1. open the container init's namespaces and connect the console socket
//!    while host paths still resolve; on cgroup v1 or hybrid hosts, move
//!    into the container's cgroup;
//! 2. `setns` into each namespace that differs from ours (user first, mount
//!    last; on cgroup v2 all but the cgroup namespace), then fork: only
//!    children enter a joined PID namespace. On cgroup v2 the fork is
//!    `clone3(CLONE_INTO_CGROUP)` into the init's cgroup: the new process
//!    is there from its first instruction and nothing migrates (a
//!    migration takes the kernel's global cgroup lock); where the kernel
//!    refuses the flag, we move there and fork as on v1;
//! 3. in the new process: the cgroup namespace (joined only now: from
//!    inside it, the kernel would refuse to clone a child into it from our
//!    cgroup outside it), own session, stdio or a pty (created in the
//!    container's devpts, sized before the program runs), rlimits,
//!    oom_score_adj, AppArmor; seccomp now if `noNewPrivileges` is off
//!    (loading a filter then needs CAP_SYS_ADMIN, which is about to go);
//!    groups, uid/gid, capabilities, cwd; no_new_privs and seccomp last if
//!    on; `execve`. Any failure is written to a close-on-exec pipe, so the
//!    caller learns whether the program started (EOF) or why not.
//!
//! The caller exits right after, and the process is reparented to the
//! monitor (the child subreaper), which reaps it like any exec process.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crust_linux::cgroup_fork::{self, ForkIntoCgroupError};
use crust_linux::children;
use crust_linux::console::{self, Pty};
use crust_linux::ns::ProcessNamespaces;
use crust_linux::process::{self as sys, StdFd};
use nix::unistd::{Gid, Pid, Uid};
use oci_spec::runtime::{LinuxSeccomp, Process, Spec};

/// runc's PATH for an exec process whose environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the new process needs, gathered in the host's view.
pub(super) struct JoinRequest<'a> {
    /// The container's init (its namespaces are joined).
    pub init_pid: i32,
    /// The container's OCI spec (seccomp filter).
    pub spec: &'a Spec,
    /// The exec process.
    pub process: &'a Process,
    /// Joins the container's cgroup (called with our own pid).
    pub join_cgroup: &'a dyn Fn(Pid) -> Result<(), String>,
    /// Where the pty master goes when `process.terminal`.
    pub console_socket: Option<&'a Path>,
    /// Make the process a child subreaper (kept across execve): orphans of
    /// what it starts are reparented to it, not to the container's init,
    /// so its whole tree can be found and killed (exec-sync timeouts).
    pub subreaper: bool,
    /// stdin, stdout, stderr (`None`: /dev/null); unused with a pty.
    pub stdio: [Option<OwnedFd>; 3],
}

/// Starts the process; returns its pid (in our PID namespace) once it has
/// exec'd its program. Call only in a disposable single-threaded child: it
/// leaves this process inside the container's namespaces.
pub(super) fn exec_in_container(req: JoinRequest<'_>) -> Result<i32, String> {
    let process = req.process;
    let args = process
        .args()
        .as_ref()
        .filter(|a| !a.is_empty())
        .ok_or("the exec process has no args")?;
    let seccomp = req.spec.linux().as_ref().and_then(|l| l.seccomp().as_ref());
    if let Some(s) = seccomp
        && libcontainer::seccomp::is_notify(s)
    {
        return Err("seccomp notify actions (a listener) are not supported by the embedded runtime for exec; use the runc handler".into());
    }
    if process
        .selinux_label()
        .as_ref()
        .is_some_and(|l| !l.is_empty())
    {
        return Err("SELinux process labels are not supported by the embedded runtime".into());
    }
    let stdio = match req
        .console_socket
        .filter(|_| process.terminal().unwrap_or(false))
    {
        Some(path) => NewStdio::Pty(connect_console(path)?),
        None => NewStdio::Fds(open_stdio(req.stdio)?),
    };
    let single = sys::SingleThreaded::check().map_err(|e| format!("fork: {e}"))?;
    let mut namespaces = ProcessNamespaces::open_differing(req.init_pid).map_err(|e| match e {
        crust_linux::Error::ProcessGone { .. } => {
            "the container is not running (its init is gone)".to_string()
        }
        e => format!("the container's namespaces: {e}"),
    })?;
    // On cgroup v2 the new process is cloned into the init's cgroup; else
    // this process moves there first and its child inherits it.
    let into_cgroup = cgroup_fork::unified_cgroup_of(req.init_pid).ok().flatten();
    let cgroup_ns = match into_cgroup {
        Some(_) => namespaces.take_cgroup(),
        None => {
            (req.join_cgroup)(Pid::from_raw(std::process::id() as i32))?;
            ProcessNamespaces::none()
        }
    };
    namespaces
        .enter()
        .map_err(|e| format!("joining the container's namespaces: {e}"))?;
    let (mut err_r, mut err_w) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    let forked = match &into_cgroup {
        Some(cgroup) => fork_into(&single, cgroup.as_fd())?,
        None => sys::fork_single_threaded(&single).map_err(|e| format!("fork: {e}"))?,
    };
    drop(into_cgroup);
    match forked {
        None => {
            drop(err_r);
            let res = cgroup_ns
                .enter()
                .map_err(|e| format!("joining the container's cgroup namespace: {e}"))
                .and_then(|()| {
                    if req.subreaper {
                        sys::set_child_subreaper().map_err(|e| format!("subreaper: {e}"))?;
                    }
                    become_process(process, args, seccomp, stdio)
                });
            // Only reached on failure: tell the caller why, then go.
            let msg = match res {
                Ok(never) => match never {},
                Err(e) => e,
            };
            let _ = err_w.write_all(msg.as_bytes());
            drop(err_w);
            sys::exit_now(127)
        }
        Some(pid) => {
            drop(err_w);
            drop(stdio);
            let mut msg = String::new();
            let _ = err_r.read_to_string(&mut msg);
            if msg.is_empty() {
                return Ok(pid);
            }
            // It failed before exec: reap it here (it is our child).
            let _ = children::wait_for(pid);
            Err(msg)
        }
    }
}

/// Forks a child that starts in the cgroup v2 directory `cgroup`
/// (clone3(CLONE_INTO_CGROUP): no migration). Where the kernel refuses
/// that, this process moves there first (a write to its cgroup.procs) and
/// forks as before.
fn fork_into(single: &sys::SingleThreaded, cgroup: BorrowedFd<'_>) -> Result<Option<i32>, String> {
    match cgroup_fork::fork_into_cgroup(single, cgroup) {
        Ok(forked) => Ok(forked),
        Err(ForkIntoCgroupError::Refused(refused)) => {
            cgroup_fork::join_cgroup(cgroup)
                .map_err(|e| format!("joining the container's cgroup: {e} (and {refused})"))?;
            sys::fork_single_threaded(single).map_err(|e| format!("fork: {e}"))
        }
        Err(e @ ForkIntoCgroupError::Failed(_)) => Err(e.to_string()),
    }
}

/// The new process's stdio, in the caller's hands until it forks.
enum NewStdio {
    /// Connected to the monitor's console socket: a pty is made inside.
    Pty(OwnedFd),
    /// stdin, stdout, stderr, duplicated above 2.
    Fds([OwnedFd; 3]),
}

/// Connects to the monitor's console socket. Through /proc/self/fd: the
/// state dir's path may be longer than a socket address allows.
fn connect_console(path: &Path) -> Result<OwnedFd, String> {
    let err = |e: &dyn std::fmt::Display| format!("console socket {}: {e}", path.display());
    let dir = path.parent().ok_or_else(|| err(&"no parent directory"))?;
    let name = path.file_name().ok_or_else(|| err(&"no file name"))?;
    let dirfd = File::open(dir).map_err(|e| err(&e))?;
    let short = Path::new("/proc/self/fd")
        .join(dirfd.as_raw_fd().to_string())
        .join(name);
    let sock = UnixStream::connect(&short).map_err(|e| err(&e))?;
    Ok(sock.into())
}

/// The stdio descriptors, duplicated above 2 so that putting them in place
/// later never clobbers one with another; `None` becomes /dev/null (opened
/// here: the container's /dev is the container's).
fn open_stdio(stdio: [Option<OwnedFd>; 3]) -> Result<[OwnedFd; 3], String> {
    let mut out = Vec::with_capacity(3);
    for fd in stdio {
        let fd = match fd {
            Some(fd) => fd,
            None => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|e| format!("opening /dev/null: {e}"))?
                .into(),
        };
        out.push(dup_high(&fd)?);
    }
    out.try_into()
        .map_err(|_| "three stdio descriptors".to_string())
}

fn dup_high(fd: &OwnedFd) -> Result<OwnedFd, String> {
    // std duplicates with F_DUPFD_CLOEXEC at 3 or above.
    fd.try_clone().map_err(|e| format!("dup: {e}"))
}

/// In the new process: everything up to `execve`. Returns only on failure.
fn become_process(
    process: &Process,
    args: &[String],
    seccomp: Option<&LinuxSeccomp>,
    stdio: NewStdio,
) -> Result<std::convert::Infallible, String> {
    let syscall = libcontainer::syscall::syscall::create_syscall();
    sys::new_session().map_err(|e| format!("setsid: {e}"))?;
    match stdio {
        NewStdio::Pty(sock) => open_pty(process, sock)?,
        NewStdio::Fds(fds) => {
            for (target, fd) in [StdFd::Stdin, StdFd::Stdout, StdFd::Stderr]
                .into_iter()
                .zip(&fds)
            {
                sys::replace_std_fd(target, fd.as_fd()).map_err(|e| format!("dup2: {e}"))?;
            }
        }
    }
    // Nothing of the monitor's may reach the program (stdio aside).
    syscall
        .close_range(0)
        .map_err(|e| format!("marking descriptors close-on-exec: {e}"))?;
    for rl in process.rlimits().iter().flatten() {
        syscall
            .set_rlimit(rl)
            .map_err(|e| format!("setrlimit {:?}: {e}", rl.typ()))?;
    }
    if let Some(adj) = process.oom_score_adj() {
        // Best effort, like the init: lowering it below the monitor's own
        // needs CAP_SYS_RESOURCE, which a node's runtime may not have.
        let _ = std::fs::write("/proc/self/oom_score_adj", adj.to_string());
    }
    if let Some(profile) = process
        .apparmor_profile()
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        libcontainer::apparmor::apply_profile(profile)
            .map_err(|e| format!("AppArmor profile {profile}: {e}"))?;
    }
    let no_new_privs = process.no_new_privileges().unwrap_or(false);
    if !no_new_privs && let Some(s) = seccomp {
        load_seccomp(s)?;
    }
    let user = process.user();
    let groups: Vec<Gid> = user
        .additional_gids()
        .iter()
        .flatten()
        .map(|g| Gid::from_raw(*g))
        .collect();
    syscall
        .set_groups(&groups)
        .map_err(|e| format!("setgroups {groups:?}: {e}"))?;
    syscall
        .set_id(Uid::from_raw(user.uid()), Gid::from_raw(user.gid()))
        .map_err(|e| format!("setting uid {} gid {}: {e}", user.uid(), user.gid()))?;
    if let Some(mask) = user.umask() {
        sys::set_umask(mask);
    }
    if let Some(caps) = process.capabilities() {
        libcontainer::capabilities::reset_effective(&*syscall)
            .map_err(|e| format!("capabilities: {e}"))?;
        libcontainer::capabilities::drop_privileges(caps, &*syscall)
            .map_err(|e| format!("capabilities: {e}"))?;
    }
    let cwd = process.cwd();
    std::env::set_current_dir(cwd).map_err(|e| format!("chdir to {}: {e}", cwd.display()))?;
    let mut env: Vec<String> = process.env().clone().unwrap_or_default();
    if !env.iter().any(|e| e.starts_with("HOME=")) {
        env.push(format!("HOME={}", home_of(user.uid())));
    }
    let program = find_program(&args[0], &env)?;
    let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"));
    let argv = args.iter().map(|a| c(a)).collect::<Result<Vec<_>, _>>()?;
    let envp = env.iter().map(|e| c(e)).collect::<Result<Vec<_>, _>>()?;
    let path = CString::new(program.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{:?} contains a NUL byte", args[0]))?;
    if no_new_privs {
        sys::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
        if let Some(s) = seccomp {
            load_seccomp(s)?;
        }
    }
    let e = sys::exec(&path, &argv, &envp);
    Err(format!("exec {:?}: {e}", args[0]))
}

fn load_seccomp(s: &LinuxSeccomp) -> Result<(), String> {
    libcontainer::seccomp::initialize_seccomp(s)
        .map(drop)
        .map_err(|e| format!("loading the seccomp filter: {e}"))
}

/// A pty from the container's devpts (checked: the container controls its
/// /dev), sized as the process asks before its program runs; the master
/// goes to the monitor, the slave becomes our controlling terminal and
/// stdio.
fn open_pty(process: &Process, sock: OwnedFd) -> Result<(), String> {
    let size = process
        .console_size()
        .as_ref()
        .map(|b| (b.width() as u16, b.height() as u16));
    let Pty { master, slave } =
        console::open_pty(size).map_err(|e| format!("the container's pty: {e}"))?;
    console::send_fd(sock.as_fd(), master.as_fd())
        .map_err(|e| format!("sending the pty to the monitor: {e}"))?;
    drop(master);
    drop(sock);
    console::set_controlling_terminal(slave.as_fd()).map_err(|e| format!("TIOCSCTTY: {e}"))?;
    for target in [StdFd::Stdin, StdFd::Stdout, StdFd::Stderr] {
        sys::replace_std_fd(target, slave.as_fd()).map_err(|e| format!("dup2: {e}"))?;
    }
    Ok(())
}

/// `$HOME` for `uid` from the container's /etc/passwd, else `/` (runc's
/// rule for exec processes without HOME).
fn home_of(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| home_in_passwd(&p, uid))
        .unwrap_or_else(|| "/".into())
}

fn home_in_passwd(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && f[2].parse() == Ok(uid) && !f[5].is_empty()).then(|| f[5].to_string())
    })
}

/// `args[0]` as `execvp` would find it: as given when it has a slash, else
/// the first executable regular file of that name on the process's PATH.
fn find_program(arg0: &str, env: &[String]) -> Result<std::path::PathBuf, String> {
    if arg0.is_empty() {
        return Err("exec: the program name is empty".into());
    }
    if arg0.contains('/') {
        return Ok(arg0.into());
    }
    let path = env
        .iter()
        .rev()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH);
    search_path(arg0, path, |p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file()) && sys::is_executable(p)
    })
    .ok_or_else(|| format!("exec: {arg0:?}: executable file not found in $PATH"))
}

fn search_path(
    name: &str,
    path: &str,
    executable: impl Fn(&Path) -> bool,
) -> Option<std::path::PathBuf> {
    path.split(':')
        // An empty element is the current directory, as for execvp.
        .map(|d| Path::new(if d.is_empty() { "." } else { d }).join(name))
        .find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_lookup_follows_path_order() {
        let found = |p: &Path| p == Path::new("/bin/sh") || p == Path::new("/usr/bin/sh");
        assert_eq!(
            search_path("sh", "/usr/local/bin:/usr/bin:/bin", found),
            Some("/usr/bin/sh".into())
        );
        assert_eq!(search_path("sh", "/opt", found), None);
        assert_eq!(
            search_path("x", "::/b", |p| p == Path::new("./x")),
            Some("./x".into())
        );
    }

    #[test]
    fn program_with_a_slash_is_taken_as_is() {
        assert_eq!(find_program("./run", &[]).unwrap(), Path::new("./run"));
        assert!(find_program("", &[]).is_err());
    }

    #[test]
    fn home_comes_from_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/sh\nwww:x:33:33::/var/www:/bin/false\nbad:x\nnohome:x:7:7:::\n";
        assert_eq!(home_in_passwd(passwd, 0).as_deref(), Some("/root"));
        assert_eq!(home_in_passwd(passwd, 33).as_deref(), Some("/var/www"));
        assert_eq!(home_in_passwd(passwd, 7), None);
        assert_eq!(home_in_passwd(passwd, 1000), None);
    }
}
