//! Devices: the request's host devices with their cgroup permissions, and
//! every host device for privileged containers.

use std::path::{Component, Path, PathBuf};

use crust_api::v1::ContainerConfig;
use crust_quote::quote_os;
use oci_spec::runtime::{LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType};

use crate::validate::abs_path;
use crate::{Host, HostDevice, SpecError};

/// Checks a cgroup device permission string: a non-empty combination of
/// `r`, `w` and `m`, each at most once.
fn permissions(field: &str, p: &str) -> Result<(), SpecError> {
    let ok = !p.is_empty()
        && p.len() <= 3
        && p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        && !p
            .chars()
            .enumerate()
            .any(|(i, c)| p.chars().skip(i + 1).any(|d| d == c));
    if !ok {
        return Err(SpecError::invalid(
            field,
            format!(
                "{p} must be a non-empty combination of r, w and m",
                p = quote_os(&p)
            ),
        ));
    }
    Ok(())
}

fn rule(
    allow: bool,
    typ: Option<LinuxDeviceType>,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> LinuxDeviceCgroup {
    let mut r = LinuxDeviceCgroup::default();
    r.set_allow(allow);
    r.set_typ(typ);
    r.set_major(major);
    r.set_minor(minor);
    r.set_access(Some(access.to_string()));
    r
}

/// The cgroup rule that denies every device (the start of every list).
pub(crate) fn deny_all() -> LinuxDeviceCgroup {
    rule(false, None, None, None, "rwm")
}

/// The cgroup rule that allows every device (privileged).
pub(crate) fn allow_all() -> LinuxDeviceCgroup {
    rule(true, None, None, None, "rwm")
}

/// `relative` must be a plain relative path (our Host implementation's
/// output, but cheap to check).
fn join_relative(field: &str, base: &str, relative: &Path) -> Result<String, SpecError> {
    if relative.as_os_str().is_empty() {
        return Ok(base.to_string());
    }
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(SpecError::invalid(
            field,
            format!(
                "host device below it has a bad relative path {relative}",
                relative = quote_os(&relative)
            ),
        ));
    }
    let joined = PathBuf::from(base).join(relative);
    abs_path(field, &joined.to_string_lossy())
}

fn linux_device(path: String, d: &HostDevice) -> LinuxDevice {
    let mut dev = LinuxDevice::default();
    dev.set_path(PathBuf::from(path));
    dev.set_typ(d.kind);
    dev.set_major(d.major);
    dev.set_minor(d.minor);
    dev.set_file_mode(Some(d.file_mode));
    dev.set_uid(Some(d.uid));
    dev.set_gid(Some(d.gid));
    dev
}

/// The device nodes to create and the cgroup rules after the initial
/// deny-all (or the single allow-all for privileged containers).
pub(crate) fn container_devices(
    config: &ContainerConfig,
    privileged: bool,
    host: &dyn Host,
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>), SpecError> {
    let mut devices: Vec<LinuxDevice> = Vec::new();
    let mut rules = Vec::new();

    if privileged {
        let all = host.all_devices().map_err(|e| SpecError::Host {
            field: "config.linux.security_context.privileged".into(),
            path: PathBuf::from("/dev"),
            message: e.to_string(),
        })?;
        for d in &all {
            let path = join_relative(
                "config.linux.security_context.privileged",
                "/dev",
                &d.relative,
            )?;
            devices.push(linux_device(path, d));
        }
        rules.push(allow_all());
    }

    for (i, d) in config.devices.iter().enumerate() {
        let f = |name: &str| format!("config.devices[{i}].{name}");
        let dest = abs_path(&f("container_path"), &d.container_path)?;
        if dest == "/" {
            return Err(SpecError::invalid(f("container_path"), "must not be /"));
        }
        let src = abs_path(&f("host_path"), &d.host_path)?;
        permissions(&f("permissions"), &d.permissions)?;
        let found = host
            .devices(Path::new(&src))
            .map_err(|e| SpecError::from_host_io(f("host_path"), &src, &e))?;
        if found.is_empty() {
            return Err(SpecError::invalid(
                f("host_path"),
                format!(
                    "{src} is not a device and has no devices below it",
                    src = quote_os(&src)
                ),
            ));
        }
        for hd in &found {
            let path = join_relative(&f("host_path"), &dest, &hd.relative)?;
            // A requested device replaces a same-path one from privileged.
            devices.retain(|x| x.path() != Path::new(&path));
            devices.push(linux_device(path, hd));
            if !privileged {
                rules.push(rule(
                    true,
                    Some(hd.kind),
                    Some(hd.major),
                    Some(hd.minor),
                    &d.permissions,
                ));
            }
        }
    }
    Ok((devices, rules))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_strings() {
        for ok in ["r", "w", "m", "rw", "rwm", "mrw", "wm"] {
            assert!(permissions("f", ok).is_ok(), "{ok}");
        }
        for bad in ["", "x", "rr", "rwmx", "rwmr", "R"] {
            assert!(permissions("f", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn relative_join() {
        assert_eq!(
            join_relative("f", "/dev/x", Path::new("")).unwrap(),
            "/dev/x"
        );
        assert_eq!(
            join_relative("f", "/dev/x", Path::new("a/b")).unwrap(),
            "/dev/x/a/b"
        );
        assert!(join_relative("f", "/dev/x", Path::new("../etc")).is_err());
        assert!(join_relative("f", "/dev/x", Path::new("/etc")).is_err());
    }
}
