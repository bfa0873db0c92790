//! Seccomp: crust's `RuntimeDefault` profile, `Unconfined`, `Localhost`
//! profiles, and the choice between them from the CRI request (the v1
//! `seccomp` message or the deprecated `seccomp_profile_path` string).
//!
//! The default profile is modelled on moby's and containerd's: default
//! action ERRNO(EPERM), an allowlist of syscalls, and capability- and
//! argument-conditional rules. It is stricter than moby's in two ways:
//! `ptrace`/`process_vm_*` need CAP_SYS_PTRACE on every kernel (moby allows
//! them on >= 4.8 without it), and the `io_uring_*` syscalls are not allowed
//! (as moby >= 25 and containerd >= 2.0). Everything not listed is denied,
//! e.g. `unshare`, `mount`, `setns`, `keyctl`, `add_key`, `request_key`,
//! `bpf`, `ptrace`, `kexec_load`, `init_module`, `reboot`, `swapon`,
//! `userfaultfd`, `open_by_handle_at`, `pivot_root`, `acct` and
//! `clone`/`clone3` with namespace flags, unless the container holds the
//! capability that the kernel would require anyway.

use std::collections::HashSet;
use std::path::Path;

use crust_api::v1::{
    LinuxContainerSecurityContext, SecurityProfile, security_profile::ProfileType,
};
use crust_quote::quote_os;
use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompOperator, LinuxSyscall,
};

use crate::validate::abs_path;
use crate::{Host, RuntimeFacts, SeccompArch, SpecError, UnsetSeccomp};

/// Largest seccomp profile file accepted.
pub const MAX_SECCOMP_PROFILE_BYTES: usize = 1 << 20;

/// The errno of denied syscalls.
const EPERM: u32 = 1;
/// The errno for `clone3` without CAP_SYS_ADMIN, so libc falls back to
/// `clone`, whose flags the filter can inspect.
const ENOSYS: u32 = 38;

/// CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
/// CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET.
pub const CLONE_NAMESPACE_FLAGS: u64 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;

/// Syscalls every container may make.
const BASE_ALLOW: &[&str] = &[
    "_llseek",
    "_newselect",
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "get_robust_list",
    "get_thread_area",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "io_setup",
    "io_submit",
    "ioctl",
    "ioprio_get",
    "ioprio_set",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "map_shadow_stack",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "set_robust_list",
    "set_thread_area",
    "set_tid_address",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "setsid",
    "setsockopt",
    "setuid",
    "setuid32",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socket",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
];

#[derive(Clone, Copy)]
enum When {
    Always,
    Arch(SeccompArch),
    Cap(Capability),
    NoCap(Capability),
}

#[derive(Clone, Copy)]
enum Act {
    Allow,
    Errno(u32),
}

struct Rule {
    names: &'static [&'static str],
    when: When,
    act: Act,
    /// (index, value, op); for MASKED_EQ `value` is the mask and the datum
    /// is 0 (runc's reading of `value`/`valueTwo`).
    args: &'static [(usize, u64, LinuxSeccompOperator)],
}

const fn allow(names: &'static [&'static str], when: When) -> Rule {
    Rule {
        names,
        when,
        act: Act::Allow,
        args: &[],
    }
}

macro_rules! personality {
    ($value:expr) => {
        Rule {
            names: &["personality"],
            when: When::Always,
            act: Act::Allow,
            args: &[(0, $value, LinuxSeccompOperator::ScmpCmpEq)],
        }
    };
}

/// The rules of the default profile, in order.
const RULES: &[Rule] = &[
    allow(BASE_ALLOW, When::Always),
    // PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32, and the query.
    personality!(0x0),
    personality!(0x0008),
    personality!(0x20000),
    personality!(0x20008),
    personality!(0xffff_ffff),
    allow(
        &["arch_prctl", "modify_ldt"],
        When::Arch(SeccompArch::X86_64),
    ),
    allow(
        &[
            "arm_fadvise64_64",
            "arm_sync_file_range",
            "breakpoint",
            "cacheflush",
            "set_tls",
            "sync_file_range2",
        ],
        When::Arch(SeccompArch::Aarch64),
    ),
    allow(&["open_by_handle_at"], When::Cap(Capability::DacReadSearch)),
    allow(
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "name_to_handle_at",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
        When::Cap(Capability::SysAdmin),
    ),
    Rule {
        names: &["clone"],
        when: When::NoCap(Capability::SysAdmin),
        act: Act::Allow,
        args: &[(
            0,
            CLONE_NAMESPACE_FLAGS,
            LinuxSeccompOperator::ScmpCmpMaskedEq,
        )],
    },
    Rule {
        names: &["clone3"],
        when: When::NoCap(Capability::SysAdmin),
        act: Act::Errno(ENOSYS),
        args: &[],
    },
    allow(&["reboot"], When::Cap(Capability::SysBoot)),
    allow(&["chroot"], When::Cap(Capability::SysChroot)),
    allow(
        &["delete_module", "finit_module", "init_module"],
        When::Cap(Capability::SysModule),
    ),
    allow(&["acct"], When::Cap(Capability::SysPacct)),
    allow(
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
        When::Cap(Capability::SysPtrace),
    ),
    allow(&["ioperm", "iopl"], When::Cap(Capability::SysRawio)),
    allow(
        &["clock_settime", "clock_settime64", "settimeofday", "stime"],
        When::Cap(Capability::SysTime),
    ),
    allow(&["vhangup"], When::Cap(Capability::SysTtyConfig)),
    allow(
        &[
            "get_mempolicy",
            "mbind",
            "set_mempolicy",
            "set_mempolicy_home_node",
        ],
        When::Cap(Capability::SysNice),
    ),
    allow(&["syslog"], When::Cap(Capability::Syslog)),
    allow(&["bpf"], When::Cap(Capability::Bpf)),
    allow(&["perf_event_open"], When::Cap(Capability::Perfmon)),
];

/// The `architectures` of the default profile for an arch family.
pub fn seccomp_architectures(arch: SeccompArch) -> Option<Vec<Arch>> {
    match arch {
        SeccompArch::X86_64 => Some(vec![
            Arch::ScmpArchX86_64,
            Arch::ScmpArchX86,
            Arch::ScmpArchX32,
        ]),
        SeccompArch::Aarch64 => Some(vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]),
        SeccompArch::Other => None,
    }
}

/// crust's `RuntimeDefault` profile for a container whose bounding set is
/// `caps`, on an `arch` node.
pub fn default_seccomp_profile(caps: &HashSet<Capability>, arch: SeccompArch) -> LinuxSeccomp {
    let mut syscalls = Vec::new();
    for rule in RULES {
        let applies = match rule.when {
            When::Always => true,
            When::Arch(a) => a == arch,
            When::Cap(c) => caps.contains(&c),
            When::NoCap(c) => !caps.contains(&c),
        };
        if !applies {
            continue;
        }
        let mut sc = LinuxSyscall::default();
        sc.set_names(rule.names.iter().map(|n| n.to_string()).collect());
        match rule.act {
            Act::Allow => {
                sc.set_action(LinuxSeccompAction::ScmpActAllow);
            }
            Act::Errno(e) => {
                sc.set_action(LinuxSeccompAction::ScmpActErrno);
                sc.set_errno_ret(Some(e));
            }
        }
        if !rule.args.is_empty() {
            let args = rule
                .args
                .iter()
                .map(|&(index, value, op)| {
                    LinuxSeccompArgBuilder::default()
                        .index(index)
                        .value(value)
                        .op(op)
                        .build()
                        .expect("all fields set")
                })
                .collect();
            sc.set_args(Some(args));
        }
        syscalls.push(sc);
    }
    let mut s = LinuxSeccomp::default();
    s.set_default_action(LinuxSeccompAction::ScmpActErrno);
    s.set_default_errno_ret(Some(EPERM));
    s.set_architectures(seccomp_architectures(arch));
    s.set_syscalls(Some(syscalls));
    s
}

/// Parses a `Localhost` profile: OCI `LinuxSeccomp` JSON (as containerd
/// reads it). Docker-only conditional keys (`includes`/`excludes` on a
/// syscall rule) are rejected rather than ignored, since ignoring them would
/// apply rules meant only for, say, CAP_SYS_ADMIN holders to everyone.
pub fn parse_seccomp_profile(field: &str, json: &str) -> Result<LinuxSeccomp, SpecError> {
    if json.len() > MAX_SECCOMP_PROFILE_BYTES {
        return Err(SpecError::invalid(
            field,
            format!("seccomp profile is larger than {MAX_SECCOMP_PROFILE_BYTES} bytes"),
        ));
    }
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| {
        SpecError::invalid(field, format!("seccomp profile is not valid JSON: {e}"))
    })?;
    let Some(obj) = value.as_object() else {
        return Err(SpecError::invalid(
            field,
            "seccomp profile is not a JSON object",
        ));
    };
    if let Some(serde_json::Value::Array(rules)) = obj.get("syscalls") {
        for (i, r) in rules.iter().enumerate() {
            for key in ["includes", "excludes"] {
                let set = r.get(key).is_some_and(|v| match v {
                    serde_json::Value::Null => false,
                    serde_json::Value::Object(o) => !o.is_empty(),
                    _ => true,
                });
                if set {
                    return Err(SpecError::invalid(
                        field,
                        format!(
                            "seccomp profile syscalls[{i}] has {key}, a Docker profile condition crust does not evaluate; use an OCI (runtime-spec) profile",
                            key = quote_os(&key)
                        ),
                    ));
                }
            }
        }
    }
    let profile: LinuxSeccomp = serde_json::from_value(value).map_err(|e| {
        SpecError::invalid(
            field,
            format!("seccomp profile is not a valid OCI seccomp profile: {e}"),
        )
    })?;
    if profile.default_action() == LinuxSeccompAction::ScmpActNotify {
        return Err(SpecError::invalid(
            field,
            "seccomp profile defaultAction SCMP_ACT_NOTIFY is not supported",
        ));
    }
    Ok(profile)
}

/// Which profile a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    Unconfined,
    RuntimeDefault,
    /// (field, clean absolute path)
    Localhost(String, String),
}

/// Reads the choice from the v1 `seccomp` message or, when that is absent,
/// the deprecated `seccomp_profile_path` (`runtime/default`,
/// `docker/default`, `unconfined`, `localhost/<absolute path>`).
#[allow(deprecated)]
pub(crate) fn choice(
    sc: Option<&LinuxContainerSecurityContext>,
    unset: UnsetSeccomp,
) -> Result<Choice, SpecError> {
    const F: &str = "config.linux.security_context";
    let unset = match unset {
        UnsetSeccomp::Unconfined => Choice::Unconfined,
        UnsetSeccomp::RuntimeDefault => Choice::RuntimeDefault,
    };
    let Some(sc) = sc else {
        return Ok(unset);
    };
    if let Some(p) = &sc.seccomp {
        return profile_choice(&format!("{F}.seccomp"), p);
    }
    let path = sc.seccomp_profile_path.as_str();
    let field = format!("{F}.seccomp_profile_path");
    match path {
        "" => Ok(unset),
        "runtime/default" | "docker/default" => Ok(Choice::RuntimeDefault),
        "unconfined" => Ok(Choice::Unconfined),
        _ => match path.strip_prefix("localhost/") {
            Some(p) => Ok(Choice::Localhost(field.clone(), abs_path(&field, p)?)),
            None => Err(SpecError::invalid(
                field,
                format!(
                    "unknown seccomp profile {path} (want runtime/default, docker/default, unconfined or localhost/<path>)",
                    path = quote_os(&path)
                ),
            )),
        },
    }
}

fn profile_choice(field: &str, p: &SecurityProfile) -> Result<Choice, SpecError> {
    let t = ProfileType::try_from(p.profile_type).map_err(|_| {
        SpecError::invalid(
            format!("{field}.profile_type"),
            format!("unknown profile type {}", p.profile_type),
        )
    })?;
    if t != ProfileType::Localhost && !p.localhost_ref.is_empty() {
        return Err(SpecError::invalid(
            format!("{field}.localhost_ref"),
            format!(
                "is only valid with profile_type Localhost, not {}",
                t.as_str_name()
            ),
        ));
    }
    Ok(match t {
        ProfileType::RuntimeDefault => Choice::RuntimeDefault,
        ProfileType::Unconfined => Choice::Unconfined,
        ProfileType::Localhost => {
            let f = format!("{field}.localhost_ref");
            let path = abs_path(&f, &p.localhost_ref)?;
            Choice::Localhost(f, path)
        }
    })
}

/// The container's seccomp filter: none for privileged containers (as
/// containerd), else what the request chose.
pub(crate) fn container_seccomp(
    sc: Option<&LinuxContainerSecurityContext>,
    bounding: &HashSet<Capability>,
    runtime: &RuntimeFacts,
    host: &dyn Host,
) -> Result<Option<LinuxSeccomp>, SpecError> {
    let c = choice(sc, runtime.unset_seccomp)?;
    if sc.is_some_and(|s| s.privileged) {
        return Ok(None);
    }
    Ok(match c {
        Choice::Unconfined => None,
        Choice::RuntimeDefault => Some(default_seccomp_profile(bounding, runtime.seccomp_arch)),
        Choice::Localhost(field, path) => {
            let text = host
                .read_seccomp_profile(Path::new(&path))
                .map_err(|e| SpecError::from_host_io(&field, &path, &e))?;
            Some(parse_seccomp_profile(&field, &text)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_CAPABILITIES;
    use crust_api::v1::LinuxContainerSecurityContext as Sc;

    fn default_caps() -> HashSet<Capability> {
        DEFAULT_CAPABILITIES.into_iter().collect()
    }

    fn rules_for<'a>(p: &'a LinuxSeccomp, name: &str) -> Vec<&'a LinuxSyscall> {
        p.syscalls()
            .as_ref()
            .unwrap()
            .iter()
            .filter(|r| r.names().iter().any(|n| n == name))
            .collect()
    }

    /// Allowed without any argument condition.
    fn allowed(p: &LinuxSeccomp, name: &str) -> bool {
        rules_for(p, name)
            .iter()
            .any(|r| r.action() == LinuxSeccompAction::ScmpActAllow && r.args().is_none())
    }

    /// Not allowed in any form (conditional or not): denied by the default action.
    fn denied(p: &LinuxSeccomp, name: &str) -> bool {
        rules_for(p, name)
            .iter()
            .all(|r| r.action() != LinuxSeccompAction::ScmpActAllow)
    }

    const DANGEROUS: &[&str] = &[
        "unshare",
        "mount",
        "umount",
        "umount2",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "kcmp",
        "pidfd_getfd",
        "bpf",
        "perf_event_open",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "reboot",
        "swapon",
        "swapoff",
        "userfaultfd",
        "open_by_handle_at",
        "name_to_handle_at",
        "pivot_root",
        "acct",
        "clock_settime",
        "settimeofday",
        "stime",
        "syslog",
        "lookup_dcookie",
        "quotactl",
        "fsopen",
        "fsmount",
        "fsconfig",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "vhangup",
        "iopl",
        "ioperm",
        "mbind",
        "set_mempolicy",
        "get_mempolicy",
        "move_pages",
        "nfsservctl",
        "uselib",
        "vm86",
        "vm86old",
        "sysfs",
        "_sysctl",
        "ustat",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "sethostname",
        "setdomainname",
        "fanotify_init",
        "clone3",
    ];

    #[test]
    fn shape_and_json() {
        let p = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(1));
        let j = serde_json::to_value(&p).unwrap();
        assert_eq!(j["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(j["defaultErrnoRet"], 1);
        assert_eq!(
            j["architectures"],
            serde_json::json!(["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"])
        );
        let syscalls = j["syscalls"].as_array().unwrap();
        assert!(syscalls.len() > 5);
        for r in syscalls {
            assert!(r["names"].as_array().is_some_and(|n| !n.is_empty()));
            assert!(r["action"].as_str().unwrap().starts_with("SCMP_ACT_"));
        }
        // Round-trips through the OCI JSON form.
        let back: LinuxSeccomp = serde_json::from_value(j).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn clone_rule_json_is_runc_shaped() {
        let p = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        let j = serde_json::to_value(&p).unwrap();
        let clone = j["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["names"] == serde_json::json!(["clone"]))
            .unwrap();
        assert_eq!(
            clone["args"],
            serde_json::json!([{"index": 0, "value": 2114060288u64, "op": "SCMP_CMP_MASKED_EQ"}])
        );
        assert_eq!(CLONE_NAMESPACE_FLAGS, 2114060288);
    }

    #[test]
    fn architectures() {
        assert_eq!(
            seccomp_architectures(SeccompArch::Aarch64),
            Some(vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm])
        );
        assert_eq!(seccomp_architectures(SeccompArch::Other), None);
        let p = default_seccomp_profile(&default_caps(), SeccompArch::Other);
        assert!(p.architectures().is_none());
        assert!(allowed(&p, "read"));
    }

    #[test]
    fn base_syscalls_allowed() {
        let p = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        for name in [
            "read",
            "write",
            "openat",
            "close",
            "execve",
            "exit_group",
            "mmap",
            "futex",
            "wait4",
            "rt_sigaction",
            "socket",
            "connect",
            "getpid",
            "fork",
            "vfork",
            "chroot",
            "rseq",
            "statx",
            "capset",
            "setuid",
            "setgroups",
            "prctl",
            "seccomp",
        ] {
            assert!(allowed(&p, name), "{name}");
        }
    }

    #[test]
    fn dangerous_syscalls_blocked_without_caps() {
        let p = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        for name in DANGEROUS {
            assert!(denied(&p, name), "{name} should be denied");
        }
        // Even with no capabilities at all.
        let p = default_seccomp_profile(&HashSet::new(), SeccompArch::Aarch64);
        for name in DANGEROUS {
            assert!(denied(&p, name), "{name} should be denied");
        }
        assert!(denied(&p, "chroot"));
    }

    #[test]
    fn clone_is_allowed_only_without_namespace_flags() {
        let p = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        let rules = rules_for(&p, "clone");
        assert_eq!(rules.len(), 1);
        let args = rules[0].args().as_ref().unwrap();
        assert_eq!(args.len(), 1);
        assert_eq!(args[0].index(), 0);
        assert_eq!(args[0].value(), CLONE_NAMESPACE_FLAGS);
        assert_eq!(args[0].value_two(), None);
        assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        let c3 = rules_for(&p, "clone3");
        assert_eq!(c3.len(), 1);
        assert_eq!(c3[0].action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(c3[0].errno_ret(), Some(38));
    }

    #[test]
    fn sys_admin_unlocks_its_syscalls() {
        let mut caps = default_caps();
        caps.insert(Capability::SysAdmin);
        let p = default_seccomp_profile(&caps, SeccompArch::X86_64);
        for name in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "clone",
            "clone3",
            "sethostname",
            "bpf",
        ] {
            assert!(allowed(&p, name), "{name}");
        }
        // No conditional clone / ENOSYS clone3 rules any more.
        assert!(rules_for(&p, "clone").iter().all(|r| r.args().is_none()));
        assert!(
            rules_for(&p, "clone3")
                .iter()
                .all(|r| r.action() == LinuxSeccompAction::ScmpActAllow)
        );
        assert!(denied(&p, "keyctl"));
        assert!(denied(&p, "ptrace"));
    }

    #[test]
    fn capability_conditional_rules() {
        for (cap, names) in [
            (
                Capability::SysPtrace,
                &["ptrace", "process_vm_readv", "kcmp"][..],
            ),
            (
                Capability::SysModule,
                &["init_module", "finit_module", "delete_module"],
            ),
            (Capability::SysBoot, &["reboot"]),
            (Capability::SysTime, &["settimeofday", "clock_settime"]),
            (Capability::SysRawio, &["iopl", "ioperm"]),
            (Capability::SysPacct, &["acct"]),
            (Capability::SysTtyConfig, &["vhangup"]),
            (Capability::SysNice, &["mbind", "set_mempolicy"]),
            (Capability::Syslog, &["syslog"]),
            (Capability::DacReadSearch, &["open_by_handle_at"]),
            (Capability::Bpf, &["bpf"]),
            (Capability::Perfmon, &["perf_event_open"]),
            (Capability::SysChroot, &["chroot"]),
        ] {
            let without = default_seccomp_profile(&HashSet::new(), SeccompArch::X86_64);
            let with = default_seccomp_profile(&[cap].into_iter().collect(), SeccompArch::X86_64);
            for n in names {
                assert!(denied(&without, n), "{n} without {cap:?}");
                assert!(allowed(&with, n), "{n} with {cap:?}");
            }
        }
    }

    #[test]
    fn personality_only_known_values() {
        let p = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        let rules = rules_for(&p, "personality");
        let mut values: Vec<u64> = rules
            .iter()
            .map(|r| {
                let a = r.args().as_ref().unwrap();
                assert_eq!(a.len(), 1);
                assert_eq!(a[0].op(), LinuxSeccompOperator::ScmpCmpEq);
                assert_eq!(a[0].index(), 0);
                a[0].value()
            })
            .collect();
        values.sort();
        assert_eq!(values, vec![0, 8, 0x20000, 0x20008, 0xffff_ffff]);
        assert!(!allowed(&p, "personality"));
    }

    #[test]
    fn arch_specific_syscalls() {
        let x86 = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        let arm = default_seccomp_profile(&default_caps(), SeccompArch::Aarch64);
        assert!(allowed(&x86, "arch_prctl") && allowed(&x86, "modify_ldt"));
        assert!(denied(&arm, "arch_prctl"));
        assert!(allowed(&arm, "set_tls") && allowed(&arm, "cacheflush"));
        assert!(denied(&x86, "set_tls"));
        assert_eq!(
            arm.architectures().clone().unwrap(),
            vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
        );
    }

    #[test]
    fn base_list_is_clean() {
        let set: HashSet<&str> = BASE_ALLOW.iter().copied().collect();
        assert_eq!(set.len(), BASE_ALLOW.len(), "duplicates in BASE_ALLOW");
        for n in BASE_ALLOW {
            assert!(
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{n}"
            );
        }
        for n in DANGEROUS {
            assert!(!set.contains(n), "{n} in BASE_ALLOW");
        }
    }

    #[test]
    fn parse_oci_profile() {
        let p = parse_seccomp_profile(
            "f",
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}"#,
        )
        .unwrap();
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActAllow);
        assert_eq!(
            p.syscalls().as_ref().unwrap()[0].names(),
            &["sethostname".to_string()]
        );
        // Docker's archMap is ignored (native arch only), unknown keys too.
        let p = parse_seccomp_profile(
            "f",
            r#"{"defaultAction":"SCMP_ACT_ERRNO","archMap":[],"comment":"x","syscalls":[{"names":["read"],"action":"SCMP_ACT_ALLOW","includes":{},"excludes":null}]}"#,
        )
        .unwrap();
        assert!(p.architectures().is_none());
        // Our own default profile is a valid localhost profile.
        let d = default_seccomp_profile(&default_caps(), SeccompArch::X86_64);
        let j = serde_json::to_string(&d).unwrap();
        assert_eq!(parse_seccomp_profile("f", &j).unwrap(), d);
    }

    #[test]
    fn parse_rejects_bad_profiles() {
        for (bad, why) in [
            ("", "not valid JSON"),
            ("{", "not valid JSON"),
            ("[]", "not a JSON object"),
            ("{}", "not a valid OCI seccomp profile"),
            (r#"{"defaultAction":"SCMP_ACT_NOPE"}"#, "not a valid OCI"),
            (
                r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":"read","action":"SCMP_ACT_ALLOW"}]}"#,
                "not a valid OCI",
            ),
            (r#"{"defaultAction":"SCMP_ACT_NOTIFY"}"#, "NOTIFY"),
            (
                r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["mount"],"action":"SCMP_ACT_ALLOW","includes":{"caps":["CAP_SYS_ADMIN"]}}]}"#,
                "includes",
            ),
            (
                r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["clone"],"action":"SCMP_ACT_ALLOW","excludes":{"arches":["s390"]}}]}"#,
                "excludes",
            ),
        ] {
            let e = parse_seccomp_profile("config.x", bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
            assert_eq!(e.field(), "config.x");
        }
        let huge = format!(
            r#"{{"defaultAction":"SCMP_ACT_ALLOW","comment":"{}"}}"#,
            "x".repeat(MAX_SECCOMP_PROFILE_BYTES)
        );
        assert!(
            parse_seccomp_profile("f", &huge)
                .unwrap_err()
                .to_string()
                .contains("larger")
        );
    }

    fn with_profile(t: ProfileType, r: &str) -> Sc {
        Sc {
            seccomp: Some(SecurityProfile {
                profile_type: t as i32,
                localhost_ref: r.into(),
            }),
            ..Default::default()
        }
    }

    #[allow(deprecated)]
    fn with_path(p: &str) -> Sc {
        Sc {
            seccomp_profile_path: p.into(),
            ..Default::default()
        }
    }

    #[test]
    fn choice_from_v1_message() {
        let u = UnsetSeccomp::Unconfined;
        assert_eq!(
            choice(Some(&with_profile(ProfileType::RuntimeDefault, "")), u).unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(Some(&with_profile(ProfileType::Unconfined, "")), u).unwrap(),
            Choice::Unconfined
        );
        assert_eq!(
            choice(
                Some(&with_profile(ProfileType::Localhost, "/etc/p//x.json")),
                u
            )
            .unwrap(),
            Choice::Localhost(
                "config.linux.security_context.seccomp.localhost_ref".into(),
                "/etc/p/x.json".into()
            )
        );
    }

    #[test]
    fn choice_errors() {
        let u = UnsetSeccomp::Unconfined;
        for (sc, field) in [
            (
                with_profile(ProfileType::Localhost, ""),
                "config.linux.security_context.seccomp.localhost_ref",
            ),
            (
                with_profile(ProfileType::Localhost, "rel.json"),
                "config.linux.security_context.seccomp.localhost_ref",
            ),
            (
                with_profile(ProfileType::Localhost, "/a/../b"),
                "config.linux.security_context.seccomp.localhost_ref",
            ),
            (
                with_profile(ProfileType::RuntimeDefault, "/x"),
                "config.linux.security_context.seccomp.localhost_ref",
            ),
            (
                with_path("localhost/rel"),
                "config.linux.security_context.seccomp_profile_path",
            ),
            (
                with_path("bogus"),
                "config.linux.security_context.seccomp_profile_path",
            ),
        ] {
            assert_eq!(choice(Some(&sc), u).unwrap_err().field(), field);
        }
        let mut sc = with_profile(ProfileType::Unconfined, "");
        sc.seccomp.as_mut().unwrap().profile_type = 7;
        assert_eq!(
            choice(Some(&sc), u).unwrap_err().field(),
            "config.linux.security_context.seccomp.profile_type"
        );
    }

    #[test]
    fn choice_from_deprecated_path() {
        let u = UnsetSeccomp::Unconfined;
        assert_eq!(
            choice(Some(&with_path("runtime/default")), u).unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(Some(&with_path("docker/default")), u).unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(Some(&with_path("unconfined")), u).unwrap(),
            Choice::Unconfined
        );
        assert_eq!(
            choice(
                Some(&with_path("localhost//var/lib/kubelet/seccomp/a.json")),
                u
            )
            .unwrap(),
            Choice::Localhost(
                "config.linux.security_context.seccomp_profile_path".into(),
                "/var/lib/kubelet/seccomp/a.json".into()
            )
        );
    }

    #[test]
    #[allow(deprecated)]
    fn message_wins_over_path_and_unset_default() {
        let mut sc = with_profile(ProfileType::Unconfined, "");
        sc.seccomp_profile_path = "runtime/default".into();
        assert_eq!(
            choice(Some(&sc), UnsetSeccomp::RuntimeDefault).unwrap(),
            Choice::Unconfined
        );
        assert_eq!(
            choice(None, UnsetSeccomp::Unconfined).unwrap(),
            Choice::Unconfined
        );
        assert_eq!(
            choice(None, UnsetSeccomp::RuntimeDefault).unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(Some(&Sc::default()), UnsetSeccomp::RuntimeDefault).unwrap(),
            Choice::RuntimeDefault
        );
        assert_eq!(
            choice(Some(&Sc::default()), UnsetSeccomp::Unconfined).unwrap(),
            Choice::Unconfined
        );
    }
}
