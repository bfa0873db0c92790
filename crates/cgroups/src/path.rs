//! Validated cgroup paths and kubelet's `cgroup_parent` formats: cgroupfs
//! paths (`/kubepods/burstable/pod<uid>`) and systemd slice names
//! (`kubepods-burstable-pod<uid>.slice`), and the unit names crust gives
//! systemd (`crust-<id>.scope`).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, quote};

/// The parent used when a request names none, cgroupfs driver: all of
/// crust's pods in one subtree of the node.
pub const DEFAULT_CGROUPFS_PARENT: &str = "/crust";
/// The parent slice used when a request names none, systemd driver (as
/// runc and containerd).
pub const DEFAULT_SYSTEMD_PARENT: &str = "system.slice";
/// Prefix of the cgroups and units crust names: `crust-<id>` (a pod's
/// cgroup under its parent, a container's cgroupfs cgroup) and
/// `crust-<id>.scope` (a container's or pause process's systemd scope).
pub const NAME_PREFIX: &str = "crust-";

/// How deep a cgroup path may nest.
pub const MAX_DEPTH: usize = 32;
/// The longest cgroup directory name (NAME_MAX).
pub const MAX_NAME_LEN: usize = 255;
/// The longest path (PATH_MAX less room for the mount point).
pub const MAX_PATH_LEN: usize = 4000;

/// A cgroup path relative to each hierarchy's root, always absolute in
/// form (`/`, `/kubepods/pod1/crust-abc`): every component is a plain name
/// (no `.`, `..`, empty part or separator), at most [`MAX_DEPTH`] deep. The
/// only way to make one is through a check, so code holding a `CgroupPath`
/// cannot climb out of a hierarchy.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CgroupPath(String);

impl CgroupPath {
    /// The root cgroup.
    pub fn root() -> Self {
        CgroupPath("/".into())
    }

    /// Checks a cgroupfs path (as kubelet's cgroupfs driver writes it, or as
    /// stored for recovery). Duplicate and trailing `/` are tolerated and
    /// removed; a relative path is taken from the root, as runc does.
    pub fn parse(path: &str) -> Result<Self> {
        let bad = |why: &str| Err(Error::invalid(format!("cgroup path {}", quote(path)), why));
        if path.len() > MAX_PATH_LEN {
            return bad("too long");
        }
        let mut out = String::with_capacity(path.len() + 1);
        let mut depth = 0;
        for component in path.split('/').filter(|c| !c.is_empty()) {
            if let Err(why) = check_name(component) {
                return bad(&why);
            }
            depth += 1;
            if depth > MAX_DEPTH {
                return bad("nested too deep");
            }
            out.push('/');
            out.push_str(component);
        }
        if out.is_empty() {
            out.push('/');
        }
        Ok(CgroupPath(out))
    }

    /// Like [`CgroupPath::parse`] for a stored `Path`.
    pub fn from_path(path: &Path) -> Result<Self> {
        let s = path
            .to_str()
            .ok_or_else(|| Error::invalid("cgroup path", "not UTF-8"))?;
        Self::parse(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The path without its leading `/`, to join below a mount point.
    pub fn relative(&self) -> &str {
        &self.0[1..]
    }

    /// The components, top down.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// The last component (None for the root).
    pub fn name(&self) -> Option<&str> {
        (!self.is_root()).then(|| self.0.rsplit('/').next().unwrap_or(""))
    }

    /// The parent cgroup (None for the root).
    pub fn parent(&self) -> Option<CgroupPath> {
        if self.is_root() {
            return None;
        }
        let cut = self.0.rfind('/').unwrap_or(0);
        Some(if cut == 0 {
            CgroupPath::root()
        } else {
            CgroupPath(self.0[..cut].to_string())
        })
    }

    /// A child cgroup: `name` must be one plain directory name.
    pub fn join(&self, name: &str) -> Result<CgroupPath> {
        check_name(name)
            .map_err(|why| Error::invalid(format!("cgroup name {}", quote(name)), why))?;
        if self.depth() >= MAX_DEPTH {
            return Err(Error::invalid(
                format!("cgroup path {}", quote(&self.0)),
                "nested too deep",
            ));
        }
        let sep = if self.is_root() { "" } else { "/" };
        Ok(CgroupPath(format!("{}{sep}{name}", self.0)))
    }

    /// Whether `self` is `other` or below it.
    pub fn starts_with(&self, other: &CgroupPath) -> bool {
        other.is_root()
            || self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.as_bytes().get(other.0.len()) == Some(&b'/'))
    }

    /// The path below `mount`.
    pub fn under(&self, mount: &Path) -> PathBuf {
        if self.is_root() {
            mount.to_path_buf()
        } else {
            mount.join(self.relative())
        }
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CgroupPath({:?})", self.0)
    }
}

/// Checks one cgroup directory name: ASCII letters, digits, `_ - . @ :`
/// (systemd's unit-name characters and kubelet's), not `.` or `..`, at
/// most [`MAX_NAME_LEN`] bytes. Also the rule for a file name below a
/// cgroup directory.
pub fn validate_name(name: &str) -> Result<()> {
    check_name(name).map_err(|why| Error::invalid(format!("cgroup name {}", quote(name)), why))
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name == "." || name == ".." {
        return Err(format!("contains {name:?}"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("a name is longer than {MAX_NAME_LEN} bytes"));
    }
    match name
        .bytes()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'@' | b':')))
    {
        Some(c) if c.is_ascii_graphic() || c == b' ' => Err(format!("contains {:?}", c as char)),
        Some(c) => Err(format!("contains byte 0x{c:02x}")),
        None => Ok(()),
    }
}

/// The two ways kubelet spells a pod's `cgroup_parent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// A pod's `cgroup_parent`, checked for `driver`, with its cgroupfs path:
/// - cgroupfs: `/kubepods/burstable/pod<uid>` (kept, cleaned);
/// - systemd: `kubepods-burstable-pod<uid>.slice`, or that slice as the
///   last component of its expanded path, giving the slice and
///   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`;
/// - empty: the driver's default ([`DEFAULT_CGROUPFS_PARENT`],
///   [`DEFAULT_SYSTEMD_PARENT`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupParent {
    /// The systemd slice (systemd driver only).
    pub slice: Option<String>,
    /// Where the parent is in every hierarchy.
    pub path: CgroupPath,
}

impl CgroupParent {
    pub fn parse(parent: &str, driver: Driver) -> Result<Self> {
        match driver {
            Driver::Cgroupfs => {
                let parent = if parent.is_empty() {
                    DEFAULT_CGROUPFS_PARENT
                } else {
                    parent
                };
                if !parent.starts_with('/') {
                    return Err(Error::invalid(
                        format!("cgroup_parent {}", quote(parent)),
                        "a cgroupfs parent is an absolute path like /kubepods/pod<uid>",
                    ));
                }
                if parent.contains(':') {
                    return Err(Error::invalid(
                        format!("cgroup_parent {}", quote(parent)),
                        "the systemd \"slice:prefix:name\" form is not a pod parent",
                    ));
                }
                Ok(CgroupParent {
                    slice: None,
                    path: CgroupPath::parse(parent)?,
                })
            }
            Driver::Systemd => {
                let given = if parent.is_empty() {
                    DEFAULT_SYSTEMD_PARENT
                } else {
                    parent
                };
                // kubelet passes the slice name; accept its expanded path
                // too, as containerd does, but it must be that expansion.
                let slice = given.rsplit('/').find(|c| !c.is_empty()).unwrap_or("");
                let path = expand_slice(slice)?;
                if given.contains('/') {
                    let as_path = CgroupPath::parse(given)?;
                    if as_path != path {
                        return Err(Error::invalid(
                            format!("cgroup_parent {}", quote(given)),
                            format!("not the path of slice {slice}, which is {path}"),
                        ));
                    }
                }
                Ok(CgroupParent {
                    slice: Some(slice.to_string()),
                    path,
                })
            }
        }
    }

    /// Parses a parent spelled in either driver's way, as the daemon did
    /// before it knew the driver: a slice name is expanded, a path kept.
    pub fn parse_any(parent: &str) -> Result<Self> {
        if !parent.contains('/') && parent.ends_with(".slice") {
            Self::parse(parent, Driver::Systemd)
        } else {
            Self::parse(parent, Driver::Cgroupfs)
        }
    }
}

/// systemd's slice nesting: `a-b-c.slice` lives in `/a.slice/a-b.slice/`;
/// `-.slice` is the root. Refuses what systemd refuses (`a--b.slice`,
/// `-a.slice`, `a-.slice`, separators, `..`).
pub fn expand_slice(slice: &str) -> Result<CgroupPath> {
    let bad = |why: &str| Err(Error::invalid(format!("slice {}", quote(slice)), why));
    let Some(name) = slice.strip_suffix(".slice") else {
        return bad("a slice name ends with .slice, like kubepods-burstable-pod<uid>.slice");
    };
    if name == "-" {
        return Ok(CgroupPath::root());
    }
    if name.is_empty() {
        return bad("empty slice name");
    }
    if let Err(why) = check_name(slice) {
        return bad(&why);
    }
    if name.contains(':') || name.contains('@') {
        return bad("a slice name has no ':' or '@'");
    }
    let mut path = String::with_capacity(slice.len() * 2);
    let mut depth = 0;
    for (end, _) in name
        .match_indices('-')
        .chain(std::iter::once((name.len(), "")))
    {
        let prefix = &name[..end];
        if prefix.is_empty() || prefix.ends_with('-') || end + 1 == name.len() {
            return bad("a slice name has an empty '-'-separated part");
        }
        depth += 1;
        if depth > MAX_DEPTH {
            return bad("nested too deep");
        }
        path.push('/');
        path.push_str(prefix);
        path.push_str(".slice");
    }
    if path.len() > MAX_PATH_LEN {
        return bad("too long");
    }
    Ok(CgroupPath(path))
}

/// The cgroup of a pod sandbox: `<parent>/crust-<sandbox id>` (a child of
/// the parent, so that sandboxes sharing a parent never remove each
/// other's cgroup, nor kubelet's).
pub fn pod_cgroup_path(parent: &CgroupParent, sandbox_id: &str) -> Result<CgroupPath> {
    parent.path.join(&format!("{NAME_PREFIX}{sandbox_id}"))
}

/// The systemd scope of a container or pause process: `crust-<id>.scope`
/// (the unit runc and libcontainer create for cgroupsPath
/// `<slice>:crust:<id>`).
pub fn scope_name(id: &str) -> Result<String> {
    let name = format!("{NAME_PREFIX}{id}.scope");
    check_name(&name).map_err(|why| Error::invalid(format!("container id {}", quote(id)), why))?;
    if id.contains(['@', ':']) {
        return Err(Error::invalid(
            format!("container id {}", quote(id)),
            "a unit name part has no '@' or ':'",
        ));
    }
    Ok(name)
}

/// The cgroupfs path of a scope in a slice.
pub fn scope_path(slice: &str, id: &str) -> Result<CgroupPath> {
    expand_slice(slice)?.join(&scope_name(id)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned() {
        for (input, want) in [
            ("/kubepods/burstable/pod1", "/kubepods/burstable/pod1"),
            ("kubepods/besteffort", "/kubepods/besteffort"),
            ("/kubepods//burstable/", "/kubepods/burstable"),
            ("/", "/"),
            ("", "/"),
            ("/system.slice/crust-a.scope", "/system.slice/crust-a.scope"),
        ] {
            assert_eq!(CgroupPath::parse(input).unwrap().as_str(), want, "{input}");
        }
    }

    #[test]
    fn escapes_are_refused() {
        for input in [
            "/kubepods/../../etc",
            "..",
            "/a/./b",
            "/kube pods",
            "/kubepods\n",
            "/kubepods\0",
            "/kubepods/*",
            "/a/b\\c",
        ] {
            let e = CgroupPath::parse(input).unwrap_err();
            assert!(e.is_invalid_argument(), "{input:?}");
        }
        assert!(CgroupPath::parse(&"/a".repeat(MAX_DEPTH + 1)).is_err());
        assert!(CgroupPath::parse(&"/a".repeat(MAX_DEPTH)).is_ok());
        assert!(CgroupPath::parse(&format!("/{}", "x".repeat(256))).is_err());
        assert!(CgroupPath::parse(&"/abcdefgh".repeat(600)).is_err());
    }

    #[test]
    fn navigation() {
        let p = CgroupPath::parse("/a/b/c").unwrap();
        assert_eq!(p.parent().unwrap().as_str(), "/a/b");
        assert_eq!(
            CgroupPath::parse("/a").unwrap().parent().unwrap(),
            CgroupPath::root()
        );
        assert_eq!(CgroupPath::root().parent(), None);
        assert_eq!(p.name(), Some("c"));
        assert_eq!(p.depth(), 3);
        assert_eq!(p.join("d").unwrap().as_str(), "/a/b/c/d");
        assert_eq!(CgroupPath::root().join("d").unwrap().as_str(), "/d");
        for bad in ["..", "a/b", "", "."] {
            assert!(p.join(bad).is_err(), "{bad:?}");
        }
        assert!(p.starts_with(&CgroupPath::parse("/a/b").unwrap()));
        assert!(!p.starts_with(&CgroupPath::parse("/a/bc").unwrap()));
        assert!(p.starts_with(&CgroupPath::root()));
        assert_eq!(
            p.under(Path::new("/sys/fs/cgroup")),
            Path::new("/sys/fs/cgroup/a/b/c")
        );
    }

    #[test]
    fn slices_are_expanded() {
        for (input, want) in [
            (
                "kubepods-burstable-pod1234_abcd.slice",
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice",
            ),
            ("kubepods.slice", "/kubepods.slice"),
            ("kubepods-pod1.slice", "/kubepods.slice/kubepods-pod1.slice"),
            ("-.slice", "/"),
            ("system.slice", "/system.slice"),
        ] {
            assert_eq!(expand_slice(input).unwrap().as_str(), want, "{input}");
        }
        for bad in [
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            ".slice",
            "a",
            "a.scope",
            "a/b.slice",
            "../x.slice",
            "a:b.slice",
            "a b.slice",
        ] {
            assert!(expand_slice(bad).is_err(), "{bad:?}");
        }
        let deep = format!("{}.slice", vec!["a"; MAX_DEPTH + 1].join("-"));
        assert!(expand_slice(&deep).is_err());
    }

    #[test]
    fn parents_for_each_driver() {
        let p = CgroupParent::parse("/kubepods/burstable/pod1/", Driver::Cgroupfs).unwrap();
        assert_eq!(p.path.as_str(), "/kubepods/burstable/pod1");
        assert_eq!(p.slice, None);
        let p = CgroupParent::parse("", Driver::Cgroupfs).unwrap();
        assert_eq!(p.path.as_str(), DEFAULT_CGROUPFS_PARENT);

        let p = CgroupParent::parse("kubepods-burstable-pod1.slice", Driver::Systemd).unwrap();
        assert_eq!(p.slice.as_deref(), Some("kubepods-burstable-pod1.slice"));
        assert_eq!(
            p.path.as_str(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
        );
        let p = CgroupParent::parse(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
            Driver::Systemd,
        )
        .unwrap();
        assert_eq!(p.slice.as_deref(), Some("kubepods-burstable-pod1.slice"));
        let p = CgroupParent::parse("", Driver::Systemd).unwrap();
        assert_eq!(p.slice.as_deref(), Some("system.slice"));
        assert_eq!(p.path.as_str(), "/system.slice");

        for (bad, driver) in [
            ("kubepods", Driver::Cgroupfs),
            ("/a/../b", Driver::Cgroupfs),
            ("system.slice:crust:abc", Driver::Cgroupfs),
            ("/kubepods/pod1", Driver::Systemd),
            ("/other/kubepods-pod1.slice", Driver::Systemd),
            ("x.slice/../y.slice", Driver::Systemd),
        ] {
            let e = CgroupParent::parse(bad, driver).unwrap_err();
            assert!(e.is_invalid_argument(), "{bad:?}");
        }
        assert_eq!(
            CgroupParent::parse_any("kubepods-pod1.slice")
                .unwrap()
                .path
                .as_str(),
            "/kubepods.slice/kubepods-pod1.slice"
        );
        assert_eq!(
            CgroupParent::parse_any("/kubepods/pod1")
                .unwrap()
                .path
                .as_str(),
            "/kubepods/pod1"
        );
    }

    #[test]
    fn pod_paths_and_scopes() {
        let parent =
            CgroupParent::parse("kubepods-besteffort-pod1.slice", Driver::Systemd).unwrap();
        assert_eq!(
            pod_cgroup_path(&parent, "abc").unwrap().as_str(),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/crust-abc"
        );
        assert!(pod_cgroup_path(&parent, "../x").is_err());
        assert!(pod_cgroup_path(&parent, "a/b").is_err());
        assert_eq!(scope_name("abc").unwrap(), "crust-abc.scope");
        assert!(scope_name("a/b").is_err());
        assert!(scope_name("a:b").is_err());
        assert!(scope_name(&"x".repeat(300)).is_err());
        assert_eq!(
            scope_path("kubepods-pod1.slice", "abc").unwrap().as_str(),
            "/kubepods.slice/kubepods-pod1.slice/crust-abc.scope"
        );
    }

    #[test]
    fn error_messages_quote_little() {
        let long = format!("/{}", "a\n".repeat(5000));
        let e = CgroupPath::parse(&long).unwrap_err().to_string();
        assert!(e.len() < 700, "{}", e.len());
    }
}
