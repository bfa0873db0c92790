//! `/proc/<pid>/mountinfo`, parsed once for the whole project.
//!
//! Not the `procfs` crate's parser (already in the tree through
//! libcgroups): procfs 0.18 keeps the kernel's octal escapes in the paths
//! (`\040` for a space), so a mount point with a space would never match;
//! decoding them on top of it would take the same code as this parser.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// One line of mountinfo (proc(5)): the fields crust uses, paths decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_id: u32,
    pub parent_id: u32,
    /// The directory of the mounted filesystem that forms this mount's root
    /// (`/` unless a bind mount of a subdirectory).
    pub root: PathBuf,
    /// Where it is mounted, relative to the process's root.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `nosuid`, ...).
    pub mount_options: Vec<String>,
    /// Optional fields: `shared:N`, `master:N`, `propagate_from:N`,
    /// `unbindable`.
    pub optional_fields: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// Per-superblock options (for cgroup v1: the controllers).
    pub super_options: Vec<String>,
}

/// The mounts of this process's mount namespace.
pub fn read_self() -> io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    // id parent maj:min root mountpoint opts [optional...] - fstype source superopts
    let (pre, post) = line.split_once(" - ")?;
    let mut pre = pre.split(' ');
    let mount_id = pre.next()?.parse().ok()?;
    let parent_id = pre.next()?.parse().ok()?;
    let _dev = pre.next()?;
    let root = unescape(pre.next()?);
    let mount_point = unescape(pre.next()?);
    let mount_options = split_options(pre.next()?);
    let optional_fields = pre.filter(|f| !f.is_empty()).map(str::to_string).collect();
    let mut post = post.split(' ');
    let fs_type = post.next()?.to_string();
    let source = post.next()?.to_string();
    let super_options = split_options(post.next()?);
    Some(Mount {
        mount_id,
        parent_id,
        root,
        mount_point,
        mount_options,
        optional_fields,
        fs_type,
        source,
        super_options,
    })
}

fn split_options(s: &str) -> Vec<String> {
    s.split(',').map(str::to_string).collect()
}

/// The kernel writes space, tab, newline and backslash in paths as `\ooo`
/// (three octal digits, at most `\377`); anything else is taken as it is.
pub fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            // At most \377: a higher first digit would not fit a byte.
            && (b'0'..=b'3').contains(&b[i + 1])
            && b[i + 2..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn unescape_decodes_bytes_only() {
        assert_eq!(unescape("/a\\040b"), Path::new("/a b"));
        assert_eq!(unescape("/a\\134b"), Path::new("/a\\b"));
        assert_eq!(unescape("/plain"), Path::new("/plain"));
        // Cut short, or over a byte: taken as it is (and no overflow).
        assert_eq!(unescape("/x\\04"), Path::new("/x\\04"));
        assert_eq!(unescape("/x\\777"), Path::new("/x\\777"));
    }

    const HYBRID: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
31 23 0:28 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:14 - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
90 22 8:1 /srv/a\\040b /mnt/with\\040space rw master:3 propagate_from:1 - ext4 /dev/sda1 rw
garbage line
";

    #[test]
    fn fields_and_escapes() {
        let m = parse(HYBRID);
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(m[0].mount_point, Path::new("/"));
        assert_eq!(m[0].optional_fields, ["shared:1"]);
        assert_eq!((m[2].mount_id, m[2].parent_id), (35, 31));
        assert_eq!(m[2].fs_type, "cgroup");
        assert!(m[2].super_options.iter().any(|o| o == "memory"));
        assert_eq!(m[3].fs_type, "cgroup2");
        assert_eq!(m[4].root, Path::new("/srv/a b"));
        assert_eq!(m[4].mount_point, Path::new("/mnt/with space"));
        assert_eq!(m[4].optional_fields, ["master:3", "propagate_from:1"]);
        assert_eq!(m[4].mount_options, ["rw"]);
        assert_eq!(m[4].source, "/dev/sda1");
    }

    #[test]
    fn only_octal_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b"), Path::new("/a b"));
        assert_eq!(unescape(r"/tab\011x\134"), Path::new("/tab\tx\\"));
        assert_eq!(unescape(r"/plain"), Path::new("/plain"));
        assert_eq!(unescape(r"/end\04"), Path::new(r"/end\04"));
        assert_eq!(unescape(r"/not\089"), Path::new(r"/not\089"));
    }

    #[test]
    fn this_process_has_a_root_mount() {
        let m = read_self().unwrap();
        assert!(m.iter().any(|m| m.mount_point == Path::new("/")));
    }
}
