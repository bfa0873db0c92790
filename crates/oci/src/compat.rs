//! Adjustments for youki's `libcontainer` 0.7 (the embedded handler), which
//! reads two parts of a spec differently from runc and crun. The specs this
//! crate writes follow runc; the embedded `OciRuntime` applies
//! [`libcontainer_compat`] to its in-memory copy before handing it over.
//!
//! 1. Seccomp `SCMP_CMP_MASKED_EQ`: runc passes `value` as the mask and
//!    `valueTwo` as the datum to libseccomp; libcontainer 0.7 passes them
//!    the other way round. The default profile's `clone` rule
//!    (`{value: CLONE_NAMESPACE_FLAGS, op: MASKED_EQ}`) then becomes "mask 0"
//!    and libseccomp turns it into an unconditional ALLOW: clone with
//!    CLONE_NEWUSER etc. would pass. Swapping the operands fixes that.
//! 2. `linux.rootfsPropagation`: libcontainer accepts only `shared`,
//!    `private`, `slave`, `unbindable` (always applied recursively) and
//!    rejects the `rshared`/`rslave` containerd and this crate write.
//! 3. The `cgroup` mount on cgroup v1 (see [`emulate_cgroup_v1_mount`]).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxNamespaceType, LinuxSeccomp, LinuxSeccompArgBuilder, LinuxSeccompOperator, Mount, Spec,
};

/// Swaps `value`/`valueTwo` of every MASKED_EQ argument (see module docs).
pub fn swap_masked_eq(seccomp: &mut LinuxSeccomp) {
    let Some(mut syscalls) = seccomp.syscalls().clone() else {
        return;
    };
    for sc in &mut syscalls {
        let Some(mut args) = sc.args().clone() else {
            continue;
        };
        for a in &mut args {
            if a.op() == LinuxSeccompOperator::ScmpCmpMaskedEq {
                let (mask, datum) = (a.value(), a.value_two().unwrap_or(0));
                *a = LinuxSeccompArgBuilder::default()
                    .index(a.index())
                    .value(datum)
                    .value_two(mask)
                    .op(a.op())
                    .build()
                    .expect("all fields set");
            }
        }
        sc.set_args(Some(args));
    }
    seccomp.set_syscalls(Some(syscalls));
}

/// Rewrites a runc-style spec into what libcontainer 0.7 means by it.
pub fn libcontainer_compat(spec: &mut Spec) {
    let Some(linux) = spec.linux_mut() else {
        return;
    };
    if let Some(p) = linux.rootfs_propagation().clone() {
        let fixed = match p.as_str() {
            "rshared" => "shared",
            "rslave" => "slave",
            "rprivate" => "private",
            "runbindable" => "unbindable",
            other => other,
        };
        linux.set_rootfs_propagation(Some(fixed.to_string()));
    }
    if let Some(mut s) = linux.seccomp().clone() {
        swap_masked_eq(&mut s);
        linux.set_seccomp(Some(s));
    }
}

/// Replaces a `cgroup` mount with what libcontainer 0.7 mounts for it on
/// cgroup v1 (a tmpfs, and a bind of the container's own cgroup of every
/// hierarchy in `hierarchies`, the host mount points of the v1 controllers
/// libcontainer creates the container's cgroup in), when the spec joins an
/// existing PID namespace (a pod's shared one).
///
/// libcontainer's own v1 cgroup mount (`mount_cgroup_v1`) first reads the
/// cgroups of `/proc/<ppid>` to strip a "root" prefix. The init's parent is
/// outside its PID namespace, so ppid is 0 and it uses its own pid *in the
/// container's namespace*, looked up in the host's /proc (the container's
/// is not mounted yet). In a new PID namespace that is 1, the host's init;
/// in a shared one it is 2, 3, … — some unrelated host process, or none:
/// then the create fails with "failed to prepare rootfs", typically for
/// the second or a later container of a pid = POD pod. Spelling the mounts
/// out avoids that lookup; the binds keep the mount's `ro`, which
/// libcontainer drops. Comount symlinks (`cpu` -> `cpu,cpuacct`) are not
/// made. Without a v1 hierarchy, a cgroups path or a joined PID namespace
/// the spec is left alone.
pub fn emulate_cgroup_v1_mount(spec: &mut Spec, hierarchies: &[PathBuf]) {
    let Some(linux) = spec.linux() else {
        return;
    };
    let joins_pid_ns = linux.namespaces().as_ref().is_some_and(|ns| {
        ns.iter()
            .any(|n| n.typ() == LinuxNamespaceType::Pid && n.path().is_some())
    });
    let Some(cgroups_path) = linux.cgroups_path().clone() else {
        return;
    };
    if !joins_pid_ns || hierarchies.is_empty() {
        return;
    }
    let Some(mounts) = spec.mounts().clone() else {
        return;
    };
    let relative = cgroups_path.strip_prefix("/").unwrap_or(&cgroups_path);
    let mut out = Vec::with_capacity(mounts.len() + hierarchies.len());
    for m in mounts {
        if m.typ().as_deref() != Some("cgroup") {
            out.push(m);
            continue;
        }
        let dest = m.destination().clone();
        let ro = m
            .options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o == "ro"));
        out.push(compat_mount(
            &dest,
            "tmpfs",
            Path::new("tmpfs"),
            &["noexec", "nosuid", "nodev", "mode=755"],
        ));
        for h in hierarchies {
            let Some(name) = h.file_name() else {
                continue;
            };
            out.push(compat_mount(
                &dest.join(name),
                "bind",
                &h.join(relative),
                &[
                    "rbind",
                    "rprivate",
                    "nosuid",
                    "noexec",
                    "nodev",
                    if ro { "ro" } else { "rw" },
                ],
            ));
        }
    }
    spec.set_mounts(Some(out));
}

fn compat_mount(dest: &Path, typ: &str, source: &Path, options: &[&str]) -> Mount {
    let mut m = Mount::default();
    m.set_destination(dest.to_path_buf());
    m.set_typ(Some(typ.to_string()));
    m.set_source(Some(source.to_path_buf()));
    m.set_options(Some(options.iter().map(|o| o.to_string()).collect()));
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeccompArch;
    use crate::seccomp::{CLONE_NAMESPACE_FLAGS, default_seccomp_profile};
    use oci_spec::runtime::Linux;

    fn clone_arg(s: &LinuxSeccomp) -> (u64, Option<u64>) {
        let sc = s
            .syscalls()
            .as_ref()
            .unwrap()
            .iter()
            .find(|r| r.names() == &["clone".to_string()] && r.args().is_some())
            .unwrap();
        let a = sc.args().as_ref().unwrap()[0];
        (a.value(), a.value_two())
    }

    #[test]
    fn masked_eq_operands_swapped() {
        let mut s = default_seccomp_profile(&Default::default(), SeccompArch::X86_64);
        assert_eq!(clone_arg(&s), (CLONE_NAMESPACE_FLAGS, None));
        swap_masked_eq(&mut s);
        assert_eq!(clone_arg(&s), (0, Some(CLONE_NAMESPACE_FLAGS)));
        // Other operators are untouched.
        let p = s
            .syscalls()
            .as_ref()
            .unwrap()
            .iter()
            .find(|r| r.names() == &["personality".to_string()])
            .unwrap();
        assert_eq!(p.args().as_ref().unwrap()[0].value(), 0);
        assert_eq!(p.args().as_ref().unwrap()[0].value_two(), None);
    }

    #[test]
    fn cgroup_v1_mount_spelled_out_in_a_joined_pid_namespace() {
        let spec_with = |pid_path: Option<&str>| -> Spec {
            let ns = match pid_path {
                Some(p) => format!(r#"{{"type":"pid","path":"{p}"}}"#),
                None => r#"{"type":"pid"}"#.to_string(),
            };
            serde_json::from_str(&format!(
                r#"{{"ociVersion":"1.2.0","root":{{"path":"/r"}},
                  "mounts":[{{"destination":"/proc","type":"proc","source":"proc"}},
                            {{"destination":"/sys/fs/cgroup","type":"cgroup","source":"cgroup",
                              "options":["nosuid","noexec","nodev","relatime","ro"]}},
                            {{"destination":"/etc/hosts","type":"bind","source":"/h","options":["rbind"]}}],
                  "linux":{{"cgroupsPath":"/crust/pod/ctr","namespaces":[{ns}]}}}}"#
            ))
            .unwrap()
        };
        let h = [
            PathBuf::from("/sys/fs/cgroup/cpu"),
            PathBuf::from("/sys/fs/cgroup/memory"),
        ];
        let mut spec = spec_with(Some("/proc/42/ns/pid"));
        emulate_cgroup_v1_mount(&mut spec, &h);
        let mounts = spec.mounts().as_ref().unwrap();
        let view: Vec<(String, String, String)> = mounts
            .iter()
            .map(|m| {
                (
                    m.destination().display().to_string(),
                    m.typ().clone().unwrap(),
                    m.source().as_ref().unwrap().display().to_string(),
                )
            })
            .collect();
        let v = |d: &str, t: &str, s: &str| (d.to_string(), t.to_string(), s.to_string());
        assert_eq!(
            view,
            vec![
                v("/proc", "proc", "proc"),
                v("/sys/fs/cgroup", "tmpfs", "tmpfs"),
                v(
                    "/sys/fs/cgroup/cpu",
                    "bind",
                    "/sys/fs/cgroup/cpu/crust/pod/ctr"
                ),
                v(
                    "/sys/fs/cgroup/memory",
                    "bind",
                    "/sys/fs/cgroup/memory/crust/pod/ctr"
                ),
                v("/etc/hosts", "bind", "/h"),
            ]
        );
        assert!(mounts[2].options().as_ref().unwrap().contains(&"ro".into()));
        // A new PID namespace (pid 1) or cgroup v2: unchanged.
        for (pid, hs) in [(None, &h[..]), (Some("/proc/42/ns/pid"), &[][..])] {
            let mut spec = spec_with(pid);
            let before = spec.mounts().clone();
            emulate_cgroup_v1_mount(&mut spec, hs);
            assert_eq!(spec.mounts(), &before);
        }
    }

    #[test]
    fn propagation_names() {
        for (from, to) in [
            ("rshared", "shared"),
            ("rslave", "slave"),
            ("rprivate", "private"),
            ("shared", "shared"),
        ] {
            let mut linux: Linux = serde_json::from_str("{}").unwrap();
            linux.set_rootfs_propagation(Some(from.into()));
            let mut spec: Spec = serde_json::from_str("{}").unwrap();
            spec.set_linux(Some(linux));
            libcontainer_compat(&mut spec);
            assert_eq!(
                spec.linux()
                    .as_ref()
                    .unwrap()
                    .rootfs_propagation()
                    .as_deref(),
                Some(to)
            );
        }
        // Nothing to do without linux.
        let mut spec: Spec = serde_json::from_str("{}").unwrap();
        libcontainer_compat(&mut spec);
        assert!(spec.linux().is_none());
    }
}
