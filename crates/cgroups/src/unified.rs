//! Validation of `unified` (cgroup v2 file name -> value) entries, for the
//! create and the update paths alike: only interface files of controllers
//! the cgroup has, never a core `cgroup.*` file, never a path.

use std::collections::HashMap;

use crate::error::{Error, Result, quote};
use crate::hierarchy::{Controller, Controllers};

/// The longest `unified` value accepted.
pub const MAX_UNIFIED_VALUE: usize = 4096;
/// The most `unified` entries in one request.
pub const MAX_UNIFIED_ENTRIES: usize = 128;
/// The longest key (a file name).
pub const MAX_UNIFIED_KEY: usize = 255;

/// Checks one entry for a cgroup whose enabled controllers are
/// `controllers` (see [`crate::CgroupFs::controllers`] for an existing
/// cgroup, [`crate::CgroupFs::subtree_controllers`] of the parent for one
/// about to be created). Returns the key's controller. The error names the
/// key, quoting at most 256 bytes of it.
pub fn validate_unified_entry(
    key: &str,
    value: &str,
    controllers: Controllers,
) -> Result<Controller> {
    let what = || format!("unified key {}", quote(key));
    if key.is_empty() || key.len() > MAX_UNIFIED_KEY {
        return Err(Error::invalid(
            what(),
            format!("a key is a file name of 1 to {MAX_UNIFIED_KEY} bytes"),
        ));
    }
    if key.contains('/') || key.contains('\0') {
        return Err(Error::invalid(what(), "a key is a file name, not a path"));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.'))
    {
        return Err(Error::invalid(
            what(),
            "not a cgroup v2 interface file name like memory.high (letters, digits, '_' and '.')",
        ));
    }
    let Some((prefix, rest)) = key.split_once('.') else {
        return Err(Error::invalid(
            what(),
            "not in the form <controller>.<name>, like memory.high",
        ));
    };
    if prefix.is_empty() || rest.is_empty() || key.contains("..") || key.ends_with('.') {
        return Err(Error::invalid(
            what(),
            "not in the form <controller>.<name>, like memory.high",
        ));
    }
    if prefix == "cgroup" {
        return Err(Error::invalid(
            what(),
            "cgroup core files (cgroup.procs, cgroup.subtree_control, ...) cannot be set",
        ));
    }
    let controller = Controller::from_name(prefix)
        .filter(|c| {
            !matches!(
                c,
                Controller::Blkio
                    | Controller::Cpuacct
                    | Controller::NetCls
                    | Controller::NetPrio
                    | Controller::Devices
                    | Controller::Freezer
            )
        })
        .ok_or_else(|| {
            Error::invalid(what(), format!("{prefix:?} is not a cgroup v2 controller"))
        })?;
    if !controllers.contains(controller) {
        return Err(Error::invalid(
            what(),
            format!(
                "the {controller} controller is not enabled in this cgroup (enabled: {controllers})"
            ),
        ));
    }
    validate_unified_value(key, value)?;
    Ok(controller)
}

/// A value: at most [`MAX_UNIFIED_VALUE`] bytes, no NUL and no newline (a
/// control file takes one value per write).
pub fn validate_unified_value(key: &str, value: &str) -> Result<()> {
    if value.len() > MAX_UNIFIED_VALUE {
        return Err(Error::invalid(
            format!("unified key {}", quote(key)),
            format!("the value is longer than {MAX_UNIFIED_VALUE} bytes"),
        ));
    }
    if value.contains(['\0', '\n', '\r']) {
        return Err(Error::invalid(
            format!("unified key {}", quote(key)),
            format!("the value {} holds a NUL or a newline", quote(value)),
        ));
    }
    Ok(())
}

/// Checks every entry (see [`validate_unified_entry`]); nothing is
/// written by anyone before all passed.
pub fn validate_unified(unified: &HashMap<String, String>, controllers: Controllers) -> Result<()> {
    if unified.len() > MAX_UNIFIED_ENTRIES {
        return Err(Error::invalid(
            "unified",
            format!("{} entries, at most {MAX_UNIFIED_ENTRIES}", unified.len()),
        ));
    }
    // Sorted, so that the same request always names the same bad key.
    let mut keys: Vec<&String> = unified.keys().collect();
    keys.sort();
    for key in keys {
        validate_unified_entry(key, &unified[key], controllers)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Controllers {
        Controllers::parse("cpuset cpu io memory hugetlb pids rdma misc")
    }

    #[test]
    fn plain_interface_files_pass() {
        for key in [
            "memory.high",
            "memory.oom.group",
            "memory.swap.max",
            "cpu.max.burst",
            "cpu.weight",
            "hugetlb.2MB.max",
            "hugetlb.1GB.rsvd.max",
            "io.bfq.weight",
            "pids.max",
            "cpuset.cpus.partition",
        ] {
            validate_unified_entry(key, "1", all()).unwrap_or_else(|e| panic!("{key}: {e}"));
        }
        assert_eq!(
            validate_unified_entry("memory.max", "max", all()).unwrap(),
            Controller::Memory
        );
    }

    #[test]
    fn every_escape_form_is_refused_naming_the_key() {
        for key in [
            "../x",
            "../../../../../../../tmp/crust-pwn-precreated",
            "/etc/x",
            "/etc/passwd",
            "memory.max/../../x",
            "memory.max/",
            "./memory.max",
            "..",
            ".",
            "",
            "memory..max",
            "memory.",
            ".max",
            "memory",
            "memory.max\0",
            "memory\\max",
            "memory max",
            "Memory.High\n",
        ] {
            let e = validate_unified_entry(key, "1", all()).unwrap_err();
            assert!(e.is_invalid_argument(), "{key:?}");
            let msg = e.to_string();
            assert!(msg.contains("unified key"), "{msg}");
            if !key.is_empty() {
                assert!(msg.contains(&quote(key)), "{key:?}: {msg}");
            }
        }
    }

    #[test]
    fn core_files_are_refused() {
        for key in [
            "cgroup.procs",
            "cgroup.subtree_control",
            "cgroup.kill",
            "cgroup.freeze",
            "cgroup.threads",
            "cgroup.type",
            "cgroup.max.depth",
        ] {
            let e = validate_unified_entry(key, "1", all()).unwrap_err();
            assert!(e.to_string().contains("core files"), "{key}: {e}");
        }
    }

    #[test]
    fn controllers_must_be_enabled_and_v2() {
        let some = Controllers::parse("memory pids");
        assert!(validate_unified_entry("memory.high", "1", some).is_ok());
        let e = validate_unified_entry("cpu.weight", "100", some).unwrap_err();
        assert!(e.to_string().contains("not enabled"), "{e}");
        assert!(e.to_string().contains("memory pids"), "{e}");
        for v1_only in [
            "blkio.weight",
            "cpuacct.usage",
            "devices.allow",
            "freezer.state",
        ] {
            assert!(
                validate_unified_entry(v1_only, "1", all()).is_err(),
                "{v1_only}"
            );
        }
        assert!(validate_unified_entry("nosuch.file", "1", all()).is_err());
    }

    #[test]
    fn values_are_bounded() {
        for value in ["1\nmax", "1\0", "\n", "a\r"] {
            let e = validate_unified_entry("memory.high", value, all()).unwrap_err();
            assert!(e.is_invalid_argument(), "{value:?}");
        }
        let long = "9".repeat(MAX_UNIFIED_VALUE + 1);
        let e = validate_unified_entry("memory.high", &long, all()).unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
        assert!(
            validate_unified_entry("memory.high", &"9".repeat(MAX_UNIFIED_VALUE), all()).is_ok()
        );
        let e = validate_unified_entry("memory.high", &"\n".repeat(10_000), all()).unwrap_err();
        assert!(e.to_string().len() < 700, "{}", e.to_string().len());
    }

    #[test]
    fn long_keys_are_quoted_briefly() {
        let key = format!("memory.{}", "a".repeat(100_000));
        let e = validate_unified_entry(&key, "1", all()).unwrap_err();
        assert!(e.to_string().len() < 700, "{}", e.to_string().len());
    }

    #[test]
    fn maps_are_checked_whole() {
        let mut m: HashMap<String, String> = [("memory.high".to_string(), "1".to_string())].into();
        validate_unified(&m, all()).unwrap();
        m.insert("cgroup.procs".into(), "1".into());
        assert!(validate_unified(&m, all()).is_err());
        let many: HashMap<String, String> = (0..=MAX_UNIFIED_ENTRIES)
            .map(|i| (format!("memory.x{i}"), "1".to_string()))
            .collect();
        assert!(validate_unified(&many, all()).is_err());
    }
}
