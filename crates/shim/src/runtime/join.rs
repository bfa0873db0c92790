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
//!    while host paths still resolve; move into the container's cgroup;
//! 2. `setns` into each namespace that differs from ours (user first, mount
//!    last), then fork: only children enter a joined PID namespace;
//! 3. in the new process: own session, stdio or a pty (created in the
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
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::{Gid, Pid, Uid};
use oci_spec::runtime::{LinuxSeccomp, Process, Spec};

use crust_linux::process as sys;

/// The namespaces an exec process joins, in the order it joins them: the
/// user namespace first (it owns the others), the mount namespace last
/// (after it, host paths no longer resolve).
const NAMESPACES: [(&str, CloneFlags); 7] = [
    ("user", CloneFlags::CLONE_NEWUSER),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

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
    let namespaces = open_namespaces(req.init_pid)?;
    (req.join_cgroup)(Pid::this())?;
    for (name, flag, fd) in &namespaces {
        nix::sched::setns(fd.as_fd(), *flag)
            .map_err(|e| format!("joining the container's {name} namespace: {e}"))?;
    }
    drop(namespaces);
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    match sys::fork_single_threaded(&single).map_err(|e| format!("fork: {e}"))? {
        None => {
            drop(err_r);
            let res = become_process(process, args, seccomp, stdio);
            // Only reached on failure: tell the caller why, then go.
            let msg = match res {
                Ok(never) => match never {},
                Err(e) => e,
            };
            let _ = File::from(err_w).write_all(msg.as_bytes());
            sys::exit_now(127)
        }
        Some(pid) => {
            drop(err_w);
            drop(stdio);
            let mut msg = String::new();
            let _ = File::from(err_r).read_to_string(&mut msg);
            if msg.is_empty() {
                return Ok(pid.as_raw());
            }
            // It failed before exec: reap it here (it is our child).
            let _ = nix::sys::wait::waitpid(pid, None);
            Err(msg)
        }
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
    let dirfd: OwnedFd = File::open(dir).map_err(|e| err(&e))?.into();
    let short = Path::new("/proc/self/fd")
        .join(dirfd.as_raw_fd().to_string())
        .join(name);
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| err(&e))?;
    let addr = UnixAddr::new(&short).map_err(|e| err(&e))?;
    nix::sys::socket::connect(sock.as_raw_fd(), &addr).map_err(|e| err(&e))?;
    Ok(sock)
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

/// The init's namespaces that differ from ours, opened, in joining order.
fn open_namespaces(init_pid: i32) -> Result<Vec<(&'static str, CloneFlags, File)>, String> {
    let mut out = Vec::new();
    for (name, flag) in NAMESPACES {
        let theirs = format!("/proc/{init_pid}/ns/{name}");
        let ours = format!("/proc/self/ns/{name}");
        let their_meta = match std::fs::metadata(&theirs) {
            Ok(m) => m,
            // A kernel without this namespace type (cgroup before 4.6).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "mnt" => {
                if Path::new(&format!("/proc/{init_pid}")).exists() {
                    continue;
                }
                return Err("the container is not running (its init is gone)".into());
            }
            Err(e) => return Err(format!("the container's {name} namespace: {e}")),
        };
        let our_meta = std::fs::metadata(&ours).map_err(|e| format!("{ours}: {e}"))?;
        if (their_meta.dev(), their_meta.ino()) == (our_meta.dev(), our_meta.ino()) {
            continue;
        }
        let f =
            File::open(&theirs).map_err(|e| format!("the container's {name} namespace: {e}"))?;
        out.push((name, flag, f));
    }
    Ok(out)
}

/// In the new process: everything up to `execve`. Returns only on failure.
fn become_process(
    process: &Process,
    args: &[String],
    seccomp: Option<&LinuxSeccomp>,
    stdio: NewStdio,
) -> Result<std::convert::Infallible, String> {
    let syscall = libcontainer::syscall::syscall::create_syscall();
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    match stdio {
        NewStdio::Pty(sock) => open_pty(process, sock)?,
        NewStdio::Fds(fds) => {
            for (i, fd) in fds.iter().enumerate() {
                nix::unistd::dup2(fd.as_raw_fd(), i as i32).map_err(|e| format!("dup2: {e}"))?;
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
        nix::sys::stat::umask(Mode::from_bits_truncate(mask));
    }
    if let Some(caps) = process.capabilities() {
        libcontainer::capabilities::reset_effective(&*syscall)
            .map_err(|e| format!("capabilities: {e}"))?;
        libcontainer::capabilities::drop_privileges(caps, &*syscall)
            .map_err(|e| format!("capabilities: {e}"))?;
    }
    let cwd = process.cwd();
    nix::unistd::chdir(cwd).map_err(|e| format!("chdir to {}: {e}", cwd.display()))?;
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
        nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
        if let Some(s) = seccomp {
            load_seccomp(s)?;
        }
    }
    let e = nix::unistd::execve(&path, &argv, &envp).unwrap_err();
    Err(format!("exec {:?}: {e}", args[0]))
}

fn load_seccomp(s: &LinuxSeccomp) -> Result<(), String> {
    libcontainer::seccomp::initialize_seccomp(s)
        .map(drop)
        .map_err(|e| format!("loading the seccomp filter: {e}"))
}

/// A pty from the container's devpts, sized as the process asks before its
/// program runs; the master goes to the monitor, the slave becomes our
/// controlling terminal and stdio.
fn open_pty(process: &Process, sock: OwnedFd) -> Result<(), String> {
    let size = process.console_size().as_ref().map(|b| nix::pty::Winsize {
        ws_row: b.height() as u16,
        ws_col: b.width() as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    });
    let pty = nix::pty::openpty(size.as_ref(), None).map_err(|e| format!("openpty: {e}"))?;
    check_pty(&pty.master, &pty.slave)?;
    let fds = [pty.master.as_raw_fd()];
    sendmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &[std::io::IoSlice::new(b"/dev/ptmx")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("sending the pty to the monitor: {e}"))?;
    drop(pty.master);
    drop(sock);
    sys::set_controlling_terminal(pty.slave.as_fd()).map_err(|e| format!("TIOCSCTTY: {e}"))?;
    for i in 0..3 {
        nix::unistd::dup2(pty.slave.as_raw_fd(), i).map_err(|e| format!("dup2: {e}"))?;
    }
    Ok(())
}

/// The container controls its /dev: make sure what /dev/ptmx gave us is a
/// real pty pair on devpts before the monitor trusts the master
/// (CVE-2025-52565 is the init's variant of this).
fn check_pty(master: &OwnedFd, slave: &OwnedFd) -> Result<(), String> {
    const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;
    const UNIX98_PTY_SLAVE_MAJOR: u64 = 136;
    let fs = nix::sys::statfs::fstatfs(master).map_err(|e| format!("statfs of the pty: {e}"))?;
    if fs.filesystem_type().0 as i64 != DEVPTS_SUPER_MAGIC {
        return Err("the container's /dev/ptmx is not on a devpts filesystem".into());
    }
    let st =
        nix::sys::stat::fstat(slave.as_raw_fd()).map_err(|e| format!("stat of the pty: {e}"))?;
    let major = nix::sys::stat::major(st.st_rdev);
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFCHR
        || !(UNIX98_PTY_SLAVE_MAJOR..UNIX98_PTY_SLAVE_MAJOR + 8).contains(&major)
    {
        return Err("the container's pty slave is not a pty".into());
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
        std::fs::metadata(p).is_ok_and(|m| m.is_file())
            && nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok()
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

    #[test]
    fn namespaces_join_user_first_and_mount_last() {
        assert_eq!(NAMESPACES[0].0, "user");
        assert_eq!(NAMESPACES[NAMESPACES.len() - 1].0, "mnt");
    }
}
