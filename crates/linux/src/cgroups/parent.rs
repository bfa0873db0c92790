//! kubelet's `cgroup_parent`, in either driver's spelling, as a cgroupfs
//! path.

use std::path::PathBuf;

use crate::Error;

/// The parent used when a request names none (crictl without a pod config
/// field): all of crust's pods in one subtree of the node.
pub const DEFAULT_CGROUP_PARENT: &str = "/crust";

const MAX_DEPTH: usize = 32;
const MAX_NAME_LEN: usize = 255;

/// Parses a pod's `cgroup_parent` into a cgroupfs path relative to the
/// hierarchy root (always starting with `/`):
/// - cgroupfs driver: `/kubepods/burstable/pod<uid>` (kept as is);
/// - systemd driver: `kubepods-burstable-pod<uid>.slice`, expanded the way
///   systemd nests slices: `/kubepods.slice/kubepods-burstable.slice/
///   kubepods-burstable-pod<uid>.slice`;
/// - empty: [`DEFAULT_CGROUP_PARENT`].
///
/// Every component is checked, so no parent can climb out with `..`.
pub fn parse_cgroup_parent(parent: &str) -> Result<PathBuf, Error> {
    let bad = |why: &str| Err(Error::invalid(format!("cgroup_parent {parent:?}"), why));
    if parent.is_empty() {
        return Ok(PathBuf::from(DEFAULT_CGROUP_PARENT));
    }
    if parent.len() > 4096 {
        return bad("too long");
    }
    if parent.contains(':') {
        return bad("the systemd \"slice:prefix:name\" form is not a pod parent");
    }
    if !parent.contains('/') && parent.ends_with(".slice") {
        return expand_slice(parent)
            .map_err(|why| Error::invalid(format!("cgroup_parent {parent:?}"), why));
    }
    let components: Vec<&str> = parent.split('/').filter(|c| !c.is_empty()).collect();
    if components.len() > MAX_DEPTH {
        return bad("nested too deep");
    }
    let mut path = PathBuf::from("/");
    for component in components {
        if let Err(why) = check_name(component) {
            return bad(&why);
        }
        path.push(component);
    }
    Ok(path)
}

/// Checks one cgroup directory name (a path component): what crust creates
/// for a pod or container, or what a parent consists of.
pub fn validate_cgroup_name(name: &str) -> Result<(), Error> {
    check_name(name).map_err(|why| Error::invalid(format!("cgroup name {name:?}"), why))
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name == "." || name == ".." {
        return Err(format!("contains {name:?}"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err("a name is longer than 255 bytes".into());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@')))
    {
        Some(c) => Err(format!("contains {c:?}")),
        None => Ok(()),
    }
}

/// systemd's slice nesting: `a-b-c.slice` lives in `a.slice/a-b.slice/`.
fn expand_slice(slice: &str) -> Result<PathBuf, String> {
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    if name == "-" {
        return Ok(PathBuf::from("/"));
    }
    if name.is_empty() {
        return Err("empty slice name".into());
    }
    check_name(slice)?;
    let mut path = PathBuf::from("/");
    let mut prefix = String::new();
    for (i, component) in name.split('-').enumerate() {
        if component.is_empty() {
            return Err("a slice name has an empty '-'-separated part".into());
        }
        if i >= MAX_DEPTH {
            return Err("nested too deep".into());
        }
        path.push(format!("{prefix}{component}.slice"));
        prefix.push_str(component);
        prefix.push('-');
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_parents_are_kept() {
        for (input, want) in [
            (
                "/kubepods/burstable/pod1234-abcd",
                "/kubepods/burstable/pod1234-abcd",
            ),
            ("/kubepods/pod_x", "/kubepods/pod_x"),
            ("kubepods/besteffort", "/kubepods/besteffort"),
            ("/kubepods//burstable/", "/kubepods/burstable"),
            ("/", "/"),
            (
                "/kubepods.slice/kubepods-pod1.slice",
                "/kubepods.slice/kubepods-pod1.slice",
            ),
        ] {
            assert_eq!(
                parse_cgroup_parent(input).unwrap(),
                PathBuf::from(want),
                "{input}"
            );
        }
    }

    #[test]
    fn systemd_slices_are_expanded() {
        for (input, want) in [
            (
                "kubepods-burstable-pod1234_abcd.slice",
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice",
            ),
            ("kubepods.slice", "/kubepods.slice"),
            ("kubepods-pod1.slice", "/kubepods.slice/kubepods-pod1.slice"),
            ("-.slice", "/"),
        ] {
            assert_eq!(
                parse_cgroup_parent(input).unwrap(),
                PathBuf::from(want),
                "{input}"
            );
        }
    }

    #[test]
    fn empty_means_the_default() {
        assert_eq!(
            parse_cgroup_parent("").unwrap(),
            PathBuf::from(DEFAULT_CGROUP_PARENT)
        );
    }

    #[test]
    fn escapes_and_junk_are_refused() {
        for input in [
            "/kubepods/../../etc",
            "..",
            "/kubepods/./x",
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            ".slice",
            "system.slice:crust:abc",
            "/kube pods",
            "/kubepods\n",
            "/kubepods\0",
            "/kubepods/*",
        ] {
            let e = parse_cgroup_parent(input).unwrap_err();
            assert!(e.is_invalid_argument(), "{input:?}");
            assert!(e.to_string().contains("cgroup_parent"), "{e}");
        }
        let deep = "/a".repeat(MAX_DEPTH + 1);
        assert!(parse_cgroup_parent(&deep).is_err());
        let deep_slice = format!("{}.slice", vec!["a"; MAX_DEPTH + 1].join("-"));
        assert!(parse_cgroup_parent(&deep_slice).is_err());
    }

    #[test]
    fn cgroup_names() {
        validate_cgroup_name("crust-0123abcd").unwrap();
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(256)] {
            assert!(validate_cgroup_name(bad).is_err(), "{bad:?}");
        }
    }
}
