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

use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompArgBuilder, LinuxSeccompOperator, Spec};

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
