//! cgroup paths of containers under their pod's cgroup.

use crust_api::v1::PodSandboxConfig;
use crust_quote::quote_os;

use crate::validate::{abs_path, id};
use crate::{CgroupDriver, SpecError};

/// Parent used when the pod has none, cgroupfs driver.
pub const DEFAULT_CGROUPFS_PARENT: &str = "/crust";
/// Parent slice used when the pod has none, systemd driver.
pub const DEFAULT_SYSTEMD_PARENT: &str = "system.slice";

const FIELD: &str = "sandbox_config.linux.cgroup_parent";

/// A systemd slice name: `[A-Za-z0-9:_.\-]+\.slice`, no `/`.
fn slice(field: &str, s: &str) -> Result<(), SpecError> {
    let ok = s.len() > ".slice".len()
        && s.len() <= 255
        && s.ends_with(".slice")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'-' | b'\\'))
        && !s.contains("..");
    if !ok {
        return Err(SpecError::invalid(
            field,
            format!(
                "{s} is not a systemd slice name like kubepods-pod1234.slice",
                s = quote_os(&s)
            ),
        ));
    }
    Ok(())
}

/// The pod's cgroup parent from its sandbox config, checked for `driver`:
/// an absolute path without `..` (cgroupfs, returned clean) or a slice name,
/// possibly as the last component of a path (systemd, returned as the
/// slice). None when the config sets none.
pub fn pod_cgroup_parent(
    sandbox: &PodSandboxConfig,
    driver: CgroupDriver,
) -> Result<Option<String>, SpecError> {
    let parent = sandbox
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.as_str())
        .unwrap_or("");
    if parent.is_empty() {
        return Ok(None);
    }
    check_parent(parent, driver).map(Some)
}

fn check_parent(parent: &str, driver: CgroupDriver) -> Result<String, SpecError> {
    match driver {
        CgroupDriver::Cgroupfs => abs_path(FIELD, parent),
        CgroupDriver::Systemd => {
            if parent.contains('\0') {
                return Err(SpecError::invalid(FIELD, "must not contain NUL"));
            }
            let last = parent.rsplit('/').find(|p| !p.is_empty()).unwrap_or("");
            slice(FIELD, last)?;
            Ok(last.to_string())
        }
    }
}

/// The OCI `cgroupsPath` of a container (or pause process) with ID `id`
/// under the pod's `parent` (empty: the driver's default):
/// `<parent>/crust-<id>` for cgroupfs, `<slice>:crust:<id>` for systemd
/// (a `crust-<id>.scope` unit in the slice).
pub fn cgroups_path(
    driver: CgroupDriver,
    parent: &str,
    container_id: &str,
) -> Result<String, SpecError> {
    id("container_id", container_id)?;
    match driver {
        CgroupDriver::Cgroupfs => {
            let parent = if parent.is_empty() {
                DEFAULT_CGROUPFS_PARENT.to_string()
            } else {
                check_parent(parent, driver)?
            };
            let sep = if parent == "/" { "" } else { "/" };
            Ok(format!("{parent}{sep}crust-{container_id}"))
        }
        CgroupDriver::Systemd => {
            let slice = if parent.is_empty() {
                DEFAULT_SYSTEMD_PARENT.to_string()
            } else {
                check_parent(parent, driver)?
            };
            Ok(format!("{slice}:crust:{container_id}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::LinuxPodSandboxConfig;

    fn sb(parent: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: parent.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn cgroupfs_paths() {
        assert_eq!(
            cgroups_path(CgroupDriver::Cgroupfs, "/kubepods/besteffort/pod123", "abc").unwrap(),
            "/kubepods/besteffort/pod123/crust-abc"
        );
        assert_eq!(
            cgroups_path(CgroupDriver::Cgroupfs, "/kubepods//pod1/", "abc").unwrap(),
            "/kubepods/pod1/crust-abc"
        );
        assert_eq!(
            cgroups_path(CgroupDriver::Cgroupfs, "", "abc").unwrap(),
            "/crust/crust-abc"
        );
        assert_eq!(
            cgroups_path(CgroupDriver::Cgroupfs, "/", "abc").unwrap(),
            "/crust-abc"
        );
    }

    #[test]
    fn systemd_paths() {
        assert_eq!(
            cgroups_path(
                CgroupDriver::Systemd,
                "kubepods-besteffort-pod123.slice",
                "abc"
            )
            .unwrap(),
            "kubepods-besteffort-pod123.slice:crust:abc"
        );
        assert_eq!(
            cgroups_path(
                CgroupDriver::Systemd,
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
                "abc"
            )
            .unwrap(),
            "kubepods-burstable-pod1.slice:crust:abc"
        );
        assert_eq!(
            cgroups_path(CgroupDriver::Systemd, "", "abc").unwrap(),
            "system.slice:crust:abc"
        );
    }

    #[test]
    fn bad_parents() {
        for p in ["kubepods", "/a/../b", "rel/path", "/a\0"] {
            let e = cgroups_path(CgroupDriver::Cgroupfs, p, "abc").unwrap_err();
            assert_eq!(e.field(), "sandbox_config.linux.cgroup_parent", "{p:?}");
        }
        for p in [
            "/kubepods/pod1",
            "x.slice/../y",
            ".slice",
            "a b.slice",
            "a..slice",
        ] {
            let e = cgroups_path(CgroupDriver::Systemd, p, "abc").unwrap_err();
            assert_eq!(e.field(), "sandbox_config.linux.cgroup_parent", "{p:?}");
        }
    }

    #[test]
    fn bad_ids() {
        for id in ["", "../x", "a/b", "a:b"] {
            let e = cgroups_path(CgroupDriver::Cgroupfs, "/p", id).unwrap_err();
            assert_eq!(e.field(), "container_id");
        }
    }

    #[test]
    fn parent_from_sandbox_config() {
        assert_eq!(
            pod_cgroup_parent(&PodSandboxConfig::default(), CgroupDriver::Cgroupfs).unwrap(),
            None
        );
        assert_eq!(
            pod_cgroup_parent(&sb("/kubepods/pod1/"), CgroupDriver::Cgroupfs).unwrap(),
            Some("/kubepods/pod1".into())
        );
        assert_eq!(
            pod_cgroup_parent(&sb("kubepods-pod1.slice"), CgroupDriver::Systemd).unwrap(),
            Some("kubepods-pod1.slice".into())
        );
        assert!(pod_cgroup_parent(&sb("/x/../y"), CgroupDriver::Cgroupfs).is_err());
        assert!(pod_cgroup_parent(&sb("/kubepods/pod1"), CgroupDriver::Systemd).is_err());
    }
}
