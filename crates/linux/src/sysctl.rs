//! Pod sysctls: which ones a pod may set, and writing them.
//!
//! Only sysctls that the kernel scopes to a namespace the pod owns are
//! allowed (kubelet's "namespaced" list): anything else would change the
//! node. Names and values are hostile input; they become a path under
//! `/proc/sys` and the content of a write, so both are checked strictly
//! (CRI-O's CVE-2022-0811 smuggled extra sysctls through a value).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use nix::sys::statfs::{PROC_SUPER_MAGIC, fstatfs};

use crate::Error;

/// Longest sysctl name accepted; real ones are far shorter.
const MAX_NAME_LEN: usize = 256;
/// Longest value accepted; the kernel reads at most a page.
const MAX_VALUE_LEN: usize = 4096;

/// Which namespaces the pod has of its own (a host-network pod may not set
/// `net.*`, a host-IPC pod no IPC sysctls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodNamespaces {
    pub net: bool,
    pub ipc: bool,
}

/// The namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlNamespace {
    Net,
    Ipc,
}

/// The namespace that scopes `name`, or None when setting it would change
/// the node.
pub fn namespace_of(name: &str) -> Option<SysctlNamespace> {
    if name.starts_with("net.") {
        return Some(SysctlNamespace::Net);
    }
    if name == "kernel.sem"
        || name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name.starts_with("fs.mqueue.")
    {
        return Some(SysctlNamespace::Ipc);
    }
    None
}

/// Checks one sysctl for a pod with namespaces `pod`. The error names the
/// sysctl and says why.
pub fn validate(name: &str, value: &str, pod: PodNamespaces) -> Result<(), Error> {
    validate_name(name)?;
    validate_value(name, value)?;
    let what = || format!("sysctl {name:?}");
    match namespace_of(name) {
        Some(SysctlNamespace::Net) if !pod.net => Err(Error::invalid(
            what(),
            "net.* sysctls need the pod's own network namespace (not host network)",
        )),
        Some(SysctlNamespace::Ipc) if !pod.ipc => Err(Error::invalid(
            what(),
            "IPC sysctls need the pod's own IPC namespace (not host IPC)",
        )),
        Some(_) => Ok(()),
        None if name == "kernel.hostname" || name == "kernel.domainname" => Err(Error::invalid(
            what(),
            "the hostname is set through the pod's hostname, not a sysctl",
        )),
        None => Err(Error::invalid(
            what(),
            "not a namespaced sysctl; it would change the node (allowed: net.*, \
             kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*)",
        )),
    }
}

/// Checks every sysctl; stops at the first bad one.
pub fn validate_all<'a>(
    sysctls: impl IntoIterator<Item = (&'a str, &'a str)>,
    pod: PodNamespaces,
) -> Result<(), Error> {
    sysctls
        .into_iter()
        .try_for_each(|(name, value)| validate(name, value, pod))
}

fn validate_name(name: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::invalid(format!("sysctl {name:?}"), why));
    if name.is_empty() {
        return bad("empty name");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("name too long");
    }
    if name.contains('/') {
        // kubelet converts the slash form to dots before calling the
        // runtime; a slash here could only be an attempt at a path.
        return bad("name contains '/'; use the dotted form");
    }
    if name.contains("..") {
        return bad("name contains '..'");
    }
    if name.starts_with('.') || name.ends_with('.') {
        return bad("name starts or ends with '.'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return bad(&format!("name contains {c:?}"));
    }
    Ok(())
}

fn validate_value(name: &str, value: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::invalid(format!("value of sysctl {name:?}"), why));
    if value.is_empty() {
        return bad("empty value");
    }
    if value.len() > MAX_VALUE_LEN {
        return bad("value too long");
    }
    if value.contains('\n') || value.contains('\r') {
        return bad("value contains a newline");
    }
    if value.contains('\0') {
        return bad("value contains NUL");
    }
    if value.contains('/') || value.contains("..") {
        return bad("value contains '/' or '..'");
    }
    // Spaces and tabs separate fields of vector sysctls (kernel.sem,
    // net.ipv4.ip_local_port_range); other control characters have no use.
    if let Some(c) = value
        .chars()
        .find(|c| c.is_control() && *c != ' ' && *c != '\t')
    {
        return bad(&format!("value contains control character {c:?}"));
    }
    Ok(())
}

/// `/proc/sys` path of a validated name.
fn proc_path(name: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(name.replace('.', "/"))
}

/// Writes a sysctl in the calling thread's namespaces: `/proc/sys/net` and
/// the IPC sysctls resolve against the namespaces of the thread that opens
/// them. Callers validate first.
pub(crate) fn write(name: &str, value: &str) -> Result<(), Error> {
    validate_name(name)?;
    validate_value(name, value)?;
    let err = |source| Error::Sysctl {
        name: name.to_string(),
        value: value.to_string(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(proc_path(name))
        .map_err(err)?;
    // Refuse anything but procfs, e.g. something mounted over /proc/sys.
    let fs = fstatfs(&file).map_err(|e| err(e.into()))?;
    if fs.filesystem_type() != PROC_SUPER_MAGIC {
        return Err(err(std::io::Error::other("not on procfs")));
    }
    file.write_all(value.as_bytes()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: PodNamespaces = PodNamespaces {
        net: true,
        ipc: true,
    };

    #[test]
    fn namespaced_sysctls_are_allowed() {
        for name in [
            "net.ipv4.ip_forward",
            "net.ipv4.conf.all.rp_filter",
            "net.core.somaxconn",
            "net.ipv4.ip_unprivileged_port_start",
            "kernel.shm_rmid_forced",
            "kernel.shmmax",
            "kernel.msgmax",
            "kernel.sem",
            "fs.mqueue.msg_max",
        ] {
            validate(name, "1", OWN).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        validate("kernel.sem", "250 32000 100\t128", OWN).unwrap();
        validate("net.ipv4.ip_local_port_range", "1024 65000", OWN).unwrap();
    }

    #[test]
    fn node_wide_sysctls_are_refused_by_name() {
        for name in [
            "kernel.panic",
            "vm.overcommit_memory",
            "fs.file-max",
            "kernel.core_pattern",
            "kernel.semmni",
            "user.max_user_namespaces",
        ] {
            let e = validate(name, "1", OWN).unwrap_err();
            assert!(e.is_invalid_argument());
            let msg = e.to_string();
            assert!(
                msg.contains(name) && msg.contains("not a namespaced sysctl"),
                "{msg}"
            );
        }
        for name in ["kernel.hostname", "kernel.domainname"] {
            let msg = validate(name, "x", OWN).unwrap_err().to_string();
            assert!(msg.contains("hostname"), "{msg}");
        }
    }

    #[test]
    fn host_namespaces_forbid_their_sysctls() {
        let host_net = PodNamespaces {
            net: false,
            ipc: true,
        };
        let msg = validate("net.core.somaxconn", "1", host_net)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("net.core.somaxconn") && msg.contains("host network"),
            "{msg}"
        );
        validate("kernel.shmmax", "1", host_net).unwrap();

        let host_ipc = PodNamespaces {
            net: true,
            ipc: false,
        };
        for name in [
            "kernel.shmmax",
            "kernel.msgmax",
            "kernel.sem",
            "fs.mqueue.msg_max",
        ] {
            let msg = validate(name, "1", host_ipc).unwrap_err().to_string();
            assert!(msg.contains("host IPC"), "{msg}");
        }
    }

    #[test]
    fn injection_attempts_are_refused() {
        let names = [
            "",
            "net/ipv4/ip_forward",
            "net.ipv4..ip_forward",
            "net.../../../etc/passwd",
            "net.ipv4.ip_forward\n",
            "net.ipv4.ip_forward\0",
            ".net.ipv4",
            "net.ipv4.",
            "net.ipv4.ip forward",
            "net.ipv4.ip_forward=1",
            "net.ipv4.ip_forward+kernel.core_pattern",
        ];
        for name in names {
            let e = validate(name, "1", OWN).unwrap_err();
            assert!(e.is_invalid_argument(), "{name:?}: {e}");
        }
        let long = format!("net.{}", "a".repeat(MAX_NAME_LEN));
        assert!(validate(&long, "1", OWN).is_err());

        let values = [
            "",
            "1\nkernel.core_pattern=|/tmp/x",
            "1\r",
            "1\0",
            "1+kernel.core_pattern=/tmp/x",
            "../../x",
            "a\u{7}",
        ];
        for value in values {
            let msg = validate("net.core.somaxconn", value, OWN)
                .unwrap_err()
                .to_string();
            assert!(msg.contains("net.core.somaxconn"), "{value:?}: {msg}");
        }
        assert!(validate("net.core.somaxconn", &"1".repeat(MAX_VALUE_LEN + 1), OWN).is_err());
    }

    #[test]
    fn validate_all_stops_at_the_first_bad_one() {
        let sysctls = [("net.core.somaxconn", "1024"), ("vm.swappiness", "0")];
        let msg = validate_all(sysctls, OWN).unwrap_err().to_string();
        assert!(msg.contains("vm.swappiness"), "{msg}");
        validate_all([("kernel.msgmax", "8192")], OWN).unwrap();
    }

    #[test]
    fn names_map_to_proc_sys_paths() {
        assert_eq!(
            proc_path("net.ipv4.conf.all.rp_filter"),
            PathBuf::from("/proc/sys/net/ipv4/conf/all/rp_filter")
        );
    }
}
