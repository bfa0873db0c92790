//! Capabilities: containerd's default set, the request's add/drop (with
//! `ALL`), ambient capabilities, and privileged.

use std::collections::HashSet;

use crust_api::v1::LinuxContainerSecurityContext;
use crust_quote::quote_os;
use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities};

use crate::SpecError;

const FIELD: &str = "config.linux.security_context.capabilities";

/// containerd's (and Docker's) default capability set.
pub const DEFAULT_CAPABILITIES: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// Every capability oci-spec knows (Linux 5.9+: up to CAP_CHECKPOINT_RESTORE).
pub const ALL_CAPABILITIES: [Capability; 41] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::DacReadSearch,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::LinuxImmutable,
    Capability::NetBindService,
    Capability::NetBroadcast,
    Capability::NetAdmin,
    Capability::NetRaw,
    Capability::IpcLock,
    Capability::IpcOwner,
    Capability::SysModule,
    Capability::SysRawio,
    Capability::SysChroot,
    Capability::SysPtrace,
    Capability::SysPacct,
    Capability::SysAdmin,
    Capability::SysBoot,
    Capability::SysNice,
    Capability::SysResource,
    Capability::SysTime,
    Capability::SysTtyConfig,
    Capability::Mknod,
    Capability::Lease,
    Capability::AuditWrite,
    Capability::AuditControl,
    Capability::Setfcap,
    Capability::MacOverride,
    Capability::MacAdmin,
    Capability::Syslog,
    Capability::WakeAlarm,
    Capability::BlockSuspend,
    Capability::AuditRead,
    Capability::Perfmon,
    Capability::Bpf,
    Capability::CheckpointRestore,
];

/// Parses a capability name as Kubernetes writes it: `NET_ADMIN`, with or
/// without `CAP_`, any case. `None` for `ALL`.
fn parse(field: &str, name: &str) -> Result<Option<Capability>, SpecError> {
    let upper = name.trim().to_ascii_uppercase();
    if upper == "ALL" {
        return Ok(None);
    }
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    bare.parse::<Capability>().map(Some).map_err(|_| {
        SpecError::invalid(
            field,
            format!("unknown capability {name}", name = quote_os(&name)),
        )
    })
}

/// The capability sets of the container process.
///
/// Bounding, effective and permitted are the same set: containerd's default
/// set, then `add_capabilities` (`ALL` = every capability), then
/// `drop_capabilities` (`ALL` = none), with an `ALL` applied before the
/// individual names on either side, so `add: [ALL], drop: [CHOWN]` is
/// everything but CHOWN and `drop: [ALL], add: [CHOWN]` is only CHOWN.
/// Inheritable is empty (containerd, since CVE-2022-24769) except for the
/// ambient capabilities, which are put in all five sets (ambient needs them
/// permitted and inheritable). Privileged containers get every capability,
/// whatever add/drop say.
pub fn capabilities(
    sc: Option<&LinuxContainerSecurityContext>,
    all: &[Capability],
) -> Result<LinuxCapabilities, SpecError> {
    let privileged = sc.is_some_and(|s| s.privileged);
    let req = sc.and_then(|s| s.capabilities.as_ref());

    let mut set: HashSet<Capability> = DEFAULT_CAPABILITIES.into_iter().collect();
    let mut add = Vec::new();
    let mut drop = Vec::new();
    let mut ambient: HashSet<Capability> = HashSet::new();
    if let Some(req) = req {
        let mut add_all = false;
        let mut drop_all = false;
        for (i, n) in req.add_capabilities.iter().enumerate() {
            match parse(&format!("{FIELD}.add_capabilities[{i}]"), n)? {
                Some(c) => add.push(c),
                None => add_all = true,
            }
        }
        for (i, n) in req.drop_capabilities.iter().enumerate() {
            match parse(&format!("{FIELD}.drop_capabilities[{i}]"), n)? {
                Some(c) => drop.push(c),
                None => drop_all = true,
            }
        }
        for (i, n) in req.add_ambient_capabilities.iter().enumerate() {
            match parse(&format!("{FIELD}.add_ambient_capabilities[{i}]"), n)? {
                Some(c) => {
                    ambient.insert(c);
                }
                None => ambient.extend(all.iter().copied()),
            }
        }
        if add_all {
            set.extend(all.iter().copied());
        }
        if drop_all {
            set.clear();
        }
    }
    if privileged {
        set = all.iter().copied().collect();
    } else {
        set.extend(add);
        for c in &drop {
            set.remove(c);
        }
    }
    set.extend(ambient.iter().copied());

    let set: Capabilities = set;
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(set.clone()));
    caps.set_effective(Some(set.clone()));
    caps.set_permitted(Some(set));
    caps.set_inheritable(Some(ambient.clone()));
    caps.set_ambient(Some(ambient));
    Ok(caps)
}

/// An empty capability set for every field (the pause process).
pub(crate) fn no_capabilities() -> LinuxCapabilities {
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(Capabilities::new()));
    caps.set_effective(Some(Capabilities::new()));
    caps.set_permitted(Some(Capabilities::new()));
    caps.set_inheritable(Some(Capabilities::new()));
    caps.set_ambient(Some(Capabilities::new()));
    caps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::Capability as CriCaps;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn sc(add: &[&str], drop: &[&str], ambient: &[&str]) -> LinuxContainerSecurityContext {
        LinuxContainerSecurityContext {
            capabilities: Some(CriCaps {
                add_capabilities: s(add),
                drop_capabilities: s(drop),
                add_ambient_capabilities: s(ambient),
            }),
            ..Default::default()
        }
    }

    fn set(v: &[Capability]) -> HashSet<Capability> {
        v.iter().copied().collect()
    }

    fn bounding(c: &LinuxCapabilities) -> HashSet<Capability> {
        c.bounding().clone().unwrap()
    }

    #[test]
    fn default_set_when_nothing_requested() {
        let c = capabilities(None, &ALL_CAPABILITIES).unwrap();
        assert_eq!(bounding(&c), set(&DEFAULT_CAPABILITIES));
        assert_eq!(c.effective().clone().unwrap(), set(&DEFAULT_CAPABILITIES));
        assert_eq!(c.permitted().clone().unwrap(), set(&DEFAULT_CAPABILITIES));
        assert!(c.inheritable().clone().unwrap().is_empty());
        assert!(c.ambient().clone().unwrap().is_empty());
        assert!(!bounding(&c).contains(&Capability::SysAdmin));
        assert!(!bounding(&c).contains(&Capability::NetAdmin));
        assert!(!bounding(&c).contains(&Capability::SysPtrace));
    }

    #[test]
    fn all_capabilities_list_is_complete_and_unique() {
        assert_eq!(set(&ALL_CAPABILITIES).len(), ALL_CAPABILITIES.len());
        // Each name round-trips through the JSON form oci-spec uses.
        for c in ALL_CAPABILITIES {
            let j = serde_json::to_string(&c).unwrap();
            assert!(j.starts_with("\"CAP_"), "{j}");
            assert_eq!(parse("f", &j[1..j.len() - 1]).unwrap(), Some(c));
        }
    }

    #[test]
    fn add_and_drop_with_and_without_prefix() {
        let c = capabilities(
            Some(&sc(
                &["NET_ADMIN", "CAP_SYS_TIME", "sys_ptrace"],
                &["CHOWN", "cap_kill"],
                &[],
            )),
            &ALL_CAPABILITIES,
        )
        .unwrap();
        let b = bounding(&c);
        assert!(b.contains(&Capability::NetAdmin));
        assert!(b.contains(&Capability::SysTime));
        assert!(b.contains(&Capability::SysPtrace));
        assert!(!b.contains(&Capability::Chown));
        assert!(!b.contains(&Capability::Kill));
        assert_eq!(b.len(), DEFAULT_CAPABILITIES.len() + 3 - 2);
    }

    #[test]
    fn add_all() {
        let c = capabilities(Some(&sc(&["ALL"], &[], &[])), &ALL_CAPABILITIES).unwrap();
        assert_eq!(bounding(&c), set(&ALL_CAPABILITIES));
    }

    #[test]
    fn add_all_uses_the_given_all_set() {
        let all = [Capability::Chown, Capability::SysAdmin];
        let c = capabilities(Some(&sc(&["all"], &[], &[])), &all).unwrap();
        let mut want = set(&DEFAULT_CAPABILITIES);
        want.insert(Capability::SysAdmin);
        assert_eq!(bounding(&c), want);
    }

    #[test]
    fn add_all_drop_some() {
        let c = capabilities(Some(&sc(&["ALL"], &["SYS_ADMIN"], &[])), &ALL_CAPABILITIES).unwrap();
        let b = bounding(&c);
        assert_eq!(b.len(), ALL_CAPABILITIES.len() - 1);
        assert!(!b.contains(&Capability::SysAdmin));
    }

    #[test]
    fn drop_all_add_some() {
        let c = capabilities(
            Some(&sc(&["NET_BIND_SERVICE"], &["ALL"], &[])),
            &ALL_CAPABILITIES,
        )
        .unwrap();
        assert_eq!(bounding(&c), set(&[Capability::NetBindService]));
    }

    #[test]
    fn drop_all() {
        let c = capabilities(Some(&sc(&[], &["ALL"], &[])), &ALL_CAPABILITIES).unwrap();
        assert!(bounding(&c).is_empty());
        assert!(c.effective().clone().unwrap().is_empty());
    }

    #[test]
    fn ambient_is_in_every_set() {
        let c = capabilities(
            Some(&sc(&[], &["ALL"], &["NET_BIND_SERVICE"])),
            &ALL_CAPABILITIES,
        )
        .unwrap();
        let one = set(&[Capability::NetBindService]);
        assert_eq!(bounding(&c), one);
        assert_eq!(c.permitted().clone().unwrap(), one);
        assert_eq!(c.effective().clone().unwrap(), one);
        assert_eq!(c.inheritable().clone().unwrap(), one);
        assert_eq!(c.ambient().clone().unwrap(), one);
    }

    #[test]
    fn privileged_gets_all_ignoring_drop() {
        let mut s = sc(&[], &["ALL", "CHOWN"], &[]);
        s.privileged = true;
        let c = capabilities(Some(&s), &ALL_CAPABILITIES).unwrap();
        assert_eq!(bounding(&c), set(&ALL_CAPABILITIES));
        assert!(c.ambient().clone().unwrap().is_empty());
    }

    #[test]
    fn unknown_names_rejected_with_field() {
        let e = capabilities(
            Some(&sc(&["CHOWN", "NOT_A_CAP"], &[], &[])),
            &ALL_CAPABILITIES,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "config.linux.security_context.capabilities.add_capabilities[1]: unknown capability \"NOT_A_CAP\""
        );
        let e = capabilities(Some(&sc(&[], &["CAP_"], &[])), &ALL_CAPABILITIES).unwrap_err();
        assert_eq!(
            e.field(),
            "config.linux.security_context.capabilities.drop_capabilities[0]"
        );
        let e = capabilities(Some(&sc(&[], &[], &["\0"])), &ALL_CAPABILITIES).unwrap_err();
        assert_eq!(
            e.field(),
            "config.linux.security_context.capabilities.add_ambient_capabilities[0]"
        );
    }

    #[test]
    fn pause_has_none() {
        let c = no_capabilities();
        assert!(c.bounding().clone().unwrap().is_empty());
        assert!(c.ambient().clone().unwrap().is_empty());
    }
}
