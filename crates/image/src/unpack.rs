//! Layer unpack. Every layer is hostile input: no entry may create or change
//! anything outside the layer dir.
//!
//! All operations are fd-relative (`openat`, `mkdirat`, `linkat`, ...) from
//! the layer dir's fd, walking one component at a time with `O_NOFOLLOW`, so
//! a symlink is never followed, whatever the entry order: an entry whose path
//! (or hardlink target) goes through a symlink is refused, `..` is refused,
//! and a leading `/` is stripped as docker does. Whiteouts become overlayfs
//! whiteouts (char 0:0) and opaque markers `trusted.overlay.opaque=y`.

use std::ffi::{OsStr, OsString};
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use crust_linux::fs::{Dir, Errno, FileKind, NodeKind};
use crust_quote::{quote, quote_bytes};
use sha2::{Digest as _, Sha256};

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::tar_limit::{self, Counted};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// Linux PATH_MAX: a longer entry path could not be used in the container.
const MAX_PATH: usize = 4096;

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Whether unpack may do what only root can: keep owners, create device
/// nodes, whiteouts and opaque markers.
pub fn running_as_root() -> bool {
    crust_linux::fs::running_as_root()
}

/// Unpacks a gzip, zstd or plain tar layer into the existing, empty dir
/// `dest`; returns the layer's diff ID (digest of the uncompressed tar).
/// `label` names the layer in errors; setting `cancel` stops the unpack
/// at the next entry.
pub fn unpack_layer(
    blob: impl Read,
    dest: &Path,
    label: &str,
    privileged: bool,
    cancel: &AtomicBool,
) -> Result<Digest> {
    let root = Dir::open(dest).ctx(|| format!("opening layer dir {}", dest.display()))?;
    let mut tar_stream = HashingReader::new(decompress(blob, label)?);
    {
        let (counted, meter) = Counted::new(&mut tar_stream);
        let mut archive = tar::Archive::new(counted);
        let mut unpacker = Unpacker {
            root: Rc::new(root),
            privileged,
            label,
            dir_times: Vec::new(),
            cached_parent: None,
        };
        let entries = tar_limit::Entries::new(&mut archive, meter)
            .map_err(|e| Error::layer(label, format!("not a tar archive: {e}")))?;
        for entry in entries {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::layer(label, "unpack cancelled"));
            }
            let mut entry =
                entry.map_err(|e| Error::layer(label, format!("broken tar archive: {e}")))?;
            unpacker.entry(&mut entry)?;
        }
        unpacker.set_dir_times()?;
    }
    // The diff ID covers the whole stream, padding after the end-of-archive
    // blocks included.
    io::copy(&mut tar_stream, &mut io::sink())
        .map_err(|e| Error::layer(label, format!("reading the layer: {e}")))?;
    Ok(tar_stream.digest())
}

/// Picks the decompressor by magic number, as containerd does, so
/// mislabelled media types still unpack.
pub(crate) fn decompress<'a>(blob: impl Read + 'a, label: &str) -> Result<Box<dyn Read + 'a>> {
    let mut reader = BufReader::with_capacity(256 << 10, blob);
    let head = reader
        .fill_buf()
        .map_err(|e| Error::layer(label, format!("reading the layer: {e}")))?;
    Ok(if head.starts_with(GZIP_MAGIC) {
        Box::new(flate2::bufread::MultiGzDecoder::new(reader))
    } else if head.starts_with(ZSTD_MAGIC) {
        Box::new(
            zstd::stream::read::Decoder::with_buffer(reader)
                .map_err(|e| Error::layer(label, format!("zstd: {e}")))?,
        )
    } else {
        Box::new(reader)
    })
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
        }
    }

    fn digest(self) -> Digest {
        Digest::from_hasher(self.hasher)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Splits an entry path into its components: `.` and empty ones dropped (so
/// a leading `/` is stripped), `..` refused.
fn clean_path(raw: &[u8]) -> std::result::Result<Vec<OsString>, String> {
    if raw.len() > MAX_PATH {
        return Err(format!("path longer than {MAX_PATH} bytes"));
    }
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("path has a '..' component".to_string()),
            c if c.contains(&0) => return Err("path has a NUL byte".to_string()),
            c => out.push(OsStr::from_bytes(c).to_os_string()),
        }
    }
    Ok(out)
}

/// Owner, mode, time and xattrs of an entry (PAX records override the header).
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(OsString, Vec<u8>)>,
}

fn read_meta<R: Read>(entry: &mut tar::Entry<R>) -> std::result::Result<Meta, String> {
    let h = entry.header();
    let old = h.as_old();
    let mut uid = numeric(h.uid(), &old.uid, "uid")?;
    let mut gid = numeric(h.gid(), &old.gid, "gid")?;
    let mode = numeric(h.mode().map(u64::from), &old.mode, "mode")? as u32 & 0o7777;
    let mut mtime = i64::try_from(numeric(h.mtime(), &old.mtime, "mtime")?).unwrap_or(0);
    let mut xattrs = Vec::new();
    if let Some(exts) = entry
        .pax_extensions()
        .map_err(|e| format!("bad PAX header: {e}"))?
    {
        for ext in exts {
            let ext = ext.map_err(|e| format!("bad PAX header: {e}"))?;
            let Ok(key) = ext.key() else { continue };
            let value = ext.value_bytes();
            match key {
                "uid" => uid = parse_pax_int(value).ok_or("bad PAX uid")?,
                "gid" => gid = parse_pax_int(value).ok_or("bad PAX gid")?,
                "mtime" => mtime = parse_pax_time(value).ok_or("bad PAX mtime")?,
                k => {
                    if let Some(name) = k.strip_prefix("SCHILY.xattr.")
                        && xattr_allowed(name)
                    {
                        xattrs.push((OsString::from(name), value.to_vec()));
                    }
                }
            }
        }
    }
    // u32::MAX is "no change" to chown; no real owner has it.
    let id = |v: u64, what: &str| {
        u32::try_from(v)
            .ok()
            .filter(|&v| v != u32::MAX)
            .ok_or_else(|| format!("{what} {v} out of range"))
    };
    Ok(Meta {
        mode,
        uid: id(uid, "uid")?,
        gid: id(gid, "gid")?,
        mtime,
        xattrs,
    })
}

/// A header number; a blank field reads as 0, as Go's archive/tar (which
/// wrote most layers) does.
fn numeric(parsed: io::Result<u64>, raw: &[u8], what: &str) -> std::result::Result<u64, String> {
    match parsed {
        Ok(v) => Ok(v),
        Err(_) if raw.iter().all(|&b| b == 0 || b == b' ') => Ok(0),
        Err(e) => Err(format!("bad {what}: {e}")),
    }
}

fn parse_pax_int(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

fn parse_pax_time(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    s.split('.').next()?.parse().ok()
}

/// Layers may carry file capabilities, SELinux labels and user xattrs, but
/// not overlayfs' own: those would steer the overlay mount (redirects,
/// metacopy) from inside an image.
fn xattr_allowed(name: &str) -> bool {
    let known = ["user.", "security.", "trusted."]
        .iter()
        .any(|p| name.starts_with(p));
    known && !name.starts_with("trusted.overlay.")
}

struct Unpacker<'a> {
    root: Rc<Dir>,
    privileged: bool,
    label: &'a str,
    /// Directory mtimes (seconds), applied last: creating entries inside a
    /// dir changes it.
    dir_times: Vec<(Vec<OsString>, i64)>,
    /// The last parent dir walked to (entries come grouped by directory).
    cached_parent: Option<(Vec<OsString>, Rc<Dir>)>,
}

impl Unpacker<'_> {
    /// Unpacks one entry; every error names the layer and the entry.
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<()> {
        let raw = entry.path_bytes().into_owned();
        self.entry_inner(&raw, entry).map_err(|e| {
            let reason = match e {
                Error::Layer { reason, .. } => reason,
                other => other.to_string(),
            };
            Error::layer(self.label, format!("entry {}: {reason}", quote_bytes(&raw)))
        })
    }

    fn entry_inner<R: Read>(&mut self, raw: &[u8], entry: &mut tar::Entry<R>) -> Result<()> {
        let label = self.label;
        let fail = |reason: String| Error::layer(label, reason);
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
        ) {
            return Ok(());
        }
        let comps = clean_path(raw).map_err(fail)?;
        let meta = read_meta(entry).map_err(fail)?;
        let Some((name, parents)) = comps.split_last() else {
            return match kind {
                tar::EntryType::Directory => self.root_dir(&meta),
                _ => Err(fail("names the layer root".to_string())),
            };
        };
        let parent = self.parent(parents)?;
        if name.as_bytes().starts_with(WHITEOUT_PREFIX.as_bytes()) {
            return self.whiteout(&parent, name);
        }
        match kind {
            tar::EntryType::Directory => self.dir(&parent, name, &comps, &meta),
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                self.file(&parent, name, entry, &meta)
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().map(|t| t.into_owned());
                self.symlink(&parent, name, target.as_deref(), &meta)
            }
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().map(|t| t.into_owned());
                self.hardlink(&parent, name, &comps, target.as_deref())
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                self.node(&parent, name, entry.header(), kind, &meta)
            }
            other => {
                tracing::warn!(layer = label, ?other, "skipping unsupported tar entry type");
                Ok(())
            }
        }
    }

    /// Opens (creating missing dirs) the directory holding an entry, one
    /// component at a time, never following a symlink.
    fn parent(&mut self, comps: &[OsString]) -> Result<Rc<Dir>> {
        if let Some((path, fd)) = &self.cached_parent
            && path.as_slice() == comps
        {
            return Ok(fd.clone());
        }
        let fd = Rc::new(self.walk(comps, true)?);
        self.cached_parent = Some((comps.to_vec(), fd.clone()));
        Ok(fd)
    }

    fn walk(&self, comps: &[OsString], create: bool) -> Result<Dir> {
        let mut fd = self
            .root
            .reopen()
            .ctx(|| "reopening the layer dir".to_string())?;
        for (i, c) in comps.iter().enumerate() {
            let here = || {
                comps[..=i]
                    .iter()
                    .map(|c| c.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/")
            };
            fd = match fd.open_dir(c) {
                Ok(next) => next,
                Err(Errno::ENOENT) if create => {
                    fd.create_dir(c, 0o755)
                        .ctx(|| format!("creating {}", quote(&here())))?;
                    fd.open_dir(c)
                        .ctx(|| format!("opening {}", quote(&here())))?
                }
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    let what = match fd.kind(c) {
                        Ok(FileKind::Symlink) => "a symlink",
                        _ => "not a directory",
                    };
                    return Err(Error::layer(
                        self.label,
                        format!("path goes through {}, which is {what}", quote(&here())),
                    ));
                }
                Err(Errno::ENOENT) => {
                    return Err(Error::layer(
                        self.label,
                        format!("{} is not in this layer", quote(&here())),
                    ));
                }
                Err(e) => return Err(Error::io(format!("opening {}", quote(&here())), e.into())),
            };
        }
        Ok(fd)
    }

    /// Removes what is at `name` so a new entry can take its place; an
    /// existing dir is kept when the new entry is a dir too (tar semantics).
    /// Returns whether a dir was kept.
    fn clear(&mut self, parent: &Dir, name: &OsStr, keep_dir: bool) -> Result<bool> {
        let kind = match parent.kind(name) {
            Err(Errno::ENOENT) => return Ok(false),
            other => other.ctx(|| format!("inspecting {}", quote(&name.to_string_lossy())))?,
        };
        if kind == FileKind::Directory {
            if keep_dir {
                return Ok(true);
            }
            // Cached fds may point into the tree going away.
            self.cached_parent = None;
            remove_tree(parent, name)?;
        } else {
            parent
                .remove_file(name)
                .ctx(|| format!("replacing {}", quote(&name.to_string_lossy())))?;
        }
        Ok(false)
    }

    fn whiteout(&mut self, parent: &Dir, name: &OsStr) -> Result<()> {
        let name_bytes = name.as_bytes();
        if name_bytes == OPAQUE_MARKER.as_bytes() {
            self.require_root("an opaque directory")?;
            return crust_linux::fs::set_xattr(parent.as_fd(), OsStr::new(OPAQUE_XATTR), b"y")
                .ctx(|| "marking the directory opaque".to_string());
        }
        let hidden = &name_bytes[WHITEOUT_PREFIX.len()..];
        if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            // Other aufs metadata (.wh..wh.plnk, ...) has no overlay meaning.
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(Error::layer(self.label, "invalid whiteout"));
        }
        self.require_root("a whiteout")?;
        let hidden = OsStr::from_bytes(hidden);
        self.clear(parent, hidden, false)?;
        parent
            .make_node(hidden, NodeKind::CharDevice, 0, 0, 0)
            .ctx(|| "creating the whiteout".to_string())
    }

    fn require_root(&self, what: &str) -> Result<()> {
        if self.privileged {
            Ok(())
        } else {
            Err(Error::layer(
                self.label,
                format!("{what} can only be unpacked as root"),
            ))
        }
    }

    fn root_dir(&mut self, meta: &Meta) -> Result<()> {
        let root = self.root.clone();
        self.set_owner_mode_xattrs(&root, meta)?;
        self.dir_times.push((Vec::new(), meta.mtime));
        Ok(())
    }

    fn dir(&mut self, parent: &Dir, name: &OsStr, comps: &[OsString], meta: &Meta) -> Result<()> {
        if !self.clear(parent, name, true)? {
            parent
                .create_dir(name, 0o700)
                .ctx(|| "creating the directory".to_string())?;
        }
        let fd = parent
            .open_dir(name)
            .ctx(|| "opening the directory".to_string())?;
        self.set_owner_mode_xattrs(&fd, meta)?;
        self.dir_times.push((comps.to_vec(), meta.mtime));
        Ok(())
    }

    fn file<R: Read>(
        &mut self,
        parent: &Dir,
        name: &OsStr,
        data: &mut R,
        meta: &Meta,
    ) -> Result<()> {
        self.clear(parent, name, false)?;
        let mut file = parent
            .create_file(name, 0o600)
            .ctx(|| "creating the file".to_string())?;
        io::copy(data, &mut file).ctx(|| "writing the file".to_string())?;
        self.set_owner_mode_xattrs(&file, meta)?;
        crust_linux::fs::set_mtime(file.as_fd(), meta.mtime).ctx(|| "setting times".to_string())
    }

    /// Owner first (chown clears setuid bits and file capabilities), then
    /// mode, then xattrs.
    fn set_owner_mode_xattrs(&self, fd: impl AsFd, meta: &Meta) -> Result<()> {
        let fd = fd.as_fd();
        if self.privileged {
            crust_linux::fs::set_owner(fd, meta.uid, meta.gid)
                .ctx(|| "setting the owner".to_string())?;
        }
        crust_linux::fs::set_mode(fd, meta.mode).ctx(|| "setting the mode".to_string())?;
        for (name, value) in &meta.xattrs {
            if let Err(e) = crust_linux::fs::set_xattr(fd, name, value) {
                // As docker: a filesystem without xattr support does not
                // fail the pull.
                tracing::warn!(layer = self.label, xattr = ?name, error = %e, "cannot set xattr");
            }
        }
        Ok(())
    }

    fn symlink(
        &mut self,
        parent: &Dir,
        name: &OsStr,
        target: Option<&[u8]>,
        meta: &Meta,
    ) -> Result<()> {
        let target = target
            .filter(|t| !t.is_empty() && !t.contains(&0))
            .ok_or_else(|| Error::layer(self.label, "symlink without a valid target"))?;
        self.clear(parent, name, false)?;
        // The target is only text in the layer; it is never followed here.
        parent
            .symlink(name, OsStr::from_bytes(target))
            .ctx(|| "creating the symlink".to_string())?;
        self.set_link_owner_times(parent, name, meta)
    }

    fn set_link_owner_times(&self, parent: &Dir, name: &OsStr, meta: &Meta) -> Result<()> {
        if self.privileged {
            parent
                .set_owner_of(name, meta.uid, meta.gid)
                .ctx(|| "setting the owner".to_string())?;
        }
        parent
            .set_mtime_of(name, meta.mtime)
            .ctx(|| "setting times".to_string())
    }

    /// A hardlink's target must be a non-directory already in this layer,
    /// reached without symlinks.
    fn hardlink(
        &mut self,
        parent: &Dir,
        name: &OsStr,
        comps: &[OsString],
        target: Option<&[u8]>,
    ) -> Result<()> {
        let label = self.label;
        let bad = |reason: String| Error::layer(label, format!("hardlink {reason}"));
        let target = target.ok_or_else(|| bad("no target".to_string()))?;
        let shown_target = quote_bytes(target);
        let tcomps = clean_path(target).map_err(|r| bad(format!("target {shown_target}: {r}")))?;
        if tcomps.as_slice() == comps {
            return Ok(());
        }
        let (tname, tparents) = tcomps
            .split_last()
            .ok_or_else(|| bad("target is the layer root".to_string()))?;
        let tparent = self.walk(tparents, false).map_err(|e| match e {
            Error::Layer { reason, .. } => bad(format!("target {shown_target}: {reason}")),
            other => other,
        })?;
        match tparent.kind(tname) {
            Err(Errno::ENOENT) => {
                return Err(bad(format!("target {shown_target} is not in this layer")));
            }
            Err(e) => return Err(Error::io(format!("inspecting {shown_target}"), e.into())),
            Ok(FileKind::Directory) => {
                return Err(bad(format!("target {shown_target} is a directory")));
            }
            Ok(_) => {}
        }
        self.clear(parent, name, false)?;
        // A symlink target is linked as the symlink.
        parent
            .hard_link(name, &tparent, tname)
            .ctx(|| format!("linking to {shown_target}"))
    }

    fn node(
        &mut self,
        parent: &Dir,
        name: &OsStr,
        header: &tar::Header,
        kind: tar::EntryType,
        meta: &Meta,
    ) -> Result<()> {
        let node = match kind {
            tar::EntryType::Char => NodeKind::CharDevice,
            tar::EntryType::Block => NodeKind::BlockDevice,
            _ => NodeKind::Fifo,
        };
        if node != NodeKind::Fifo && !self.privileged {
            tracing::warn!(layer = self.label, entry = ?name, "skipping a device node: not root");
            return Ok(());
        }
        let num = |v: io::Result<Option<u32>>| v.ok().flatten().unwrap_or(0);
        let (major, minor) = (num(header.device_major()), num(header.device_minor()));
        self.clear(parent, name, false)?;
        parent
            .make_node(name, node, meta.mode, major, minor)
            .ctx(|| "creating the node".to_string())?;
        // mknod applies the umask; the node is ours alone, so no race here.
        parent
            .set_mode_of(name, meta.mode)
            .ctx(|| "setting the mode".to_string())?;
        self.set_link_owner_times(parent, name, meta)
    }

    fn set_dir_times(&mut self) -> Result<()> {
        let dirs = std::mem::take(&mut self.dir_times);
        for (comps, mtime) in dirs.iter().rev() {
            // A dir replaced by a later entry is simply gone.
            let Ok(fd) = self.walk(comps, false) else {
                continue;
            };
            crust_linux::fs::set_mtime(fd.as_fd(), *mtime)
                .ctx(|| "setting directory times".to_string())?;
        }
        Ok(())
    }
}

/// Removes a directory tree fd-relatively, never following symlinks.
///
/// Iterative, one dir fd open at a time: a layer may build a tree 2048
/// levels deep (PATH_MAX / "a/"), which a recursive walk turns into a stack
/// overflow (an abort of the whole daemon) on a blocking thread's stack.
fn remove_tree(parent: &Dir, name: &OsStr) -> Result<()> {
    let open = |at: &Dir, name: &OsStr| {
        at.open_dir(name)
            .ctx(|| format!("opening {} to replace it", quote(&name.to_string_lossy())))
    };
    // The names from `parent` down to `dir`.
    let mut names = vec![name.to_os_string()];
    let mut dir = open(parent, name)?;
    loop {
        match unlink_files_until_subdir(&dir)? {
            Some(child) => {
                dir = open(&dir, &child)?;
                names.push(child);
            }
            None => {
                let done = names.pop().expect("the tree's own name is last");
                let up = if names.is_empty() {
                    None
                } else {
                    // `..` of a dir reached without symlinks is its parent.
                    Some(open(&dir, OsStr::new(".."))?)
                };
                let at = up.as_ref().unwrap_or(parent);
                at.remove_dir(&done)
                    .ctx(|| format!("removing {}", quote(&done.to_string_lossy())))?;
                match up {
                    Some(up) => dir = up,
                    None => return Ok(()),
                }
            }
        }
    }
}

/// Unlinks the non-directories in `dir` until it meets a subdirectory,
/// whose name it returns; `None` when `dir` is now empty.
fn unlink_files_until_subdir(dir: &Dir) -> Result<Option<OsString>> {
    for (child, kind) in dir.entries().ctx(|| "listing a directory".to_string())? {
        if kind == FileKind::Directory {
            return Ok(Some(child));
        }
        dir.remove_file(&child)
            .ctx(|| format!("removing {}", quote(&child.to_string_lossy())))?;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_path_strips_root_and_refuses_dotdot() {
        let c = |s: &str| clean_path(s.as_bytes());
        assert_eq!(c("/etc/passwd").unwrap(), ["etc", "passwd"]);
        assert_eq!(c("./a//b/./c/").unwrap(), ["a", "b", "c"]);
        assert!(c("./").unwrap().is_empty());
        assert!(c("../x").is_err());
        assert!(c("a/../../x").is_err());
        assert!(c("a/..").is_err());
        assert!(c(&"a/".repeat(3000)).is_err());
        assert!(clean_path(b"a\0b").is_err());
    }

    #[test]
    fn xattr_filter_keeps_overlay_attrs_out() {
        assert!(xattr_allowed("security.capability"));
        assert!(xattr_allowed("user.foo"));
        assert!(xattr_allowed("trusted.foo"));
        assert!(!xattr_allowed("trusted.overlay.redirect"));
        assert!(!xattr_allowed("trusted.overlay.opaque"));
        assert!(!xattr_allowed("system.posix_acl_access"));
    }

    /// Builds tar bytes with raw (possibly hostile) names.
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Self {
            Layer(tar::Builder::new(Vec::new()))
        }

        fn header(kind: tar::EntryType, name: &str, mode: u32, size: u64) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            let slot = &mut h.as_old_mut().name;
            slot[..name.len()].copy_from_slice(name.as_bytes());
            h.set_mode(mode);
            h.set_uid(1000);
            h.set_gid(1001);
            h.set_mtime(1_600_000_000);
            h.set_size(size);
            h
        }

        fn add(mut self, mut h: tar::Header, data: &[u8]) -> Self {
            h.set_cksum();
            self.0.append(&h, data).unwrap();
            self
        }

        fn dir(self, name: &str) -> Self {
            let h = Self::header(tar::EntryType::Directory, name, 0o750, 0);
            self.add(h, b"")
        }

        fn file(self, name: &str, data: &[u8]) -> Self {
            let h = Self::header(tar::EntryType::Regular, name, 0o4755, data.len() as u64);
            self.add(h, data)
        }

        fn link(self, kind: tar::EntryType, name: &str, target: &str) -> Self {
            let mut h = Self::header(kind, name, 0o777, 0);
            h.set_link_name_literal(target).unwrap();
            self.add(h, b"")
        }

        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }
    }

    struct Fixture {
        _tmp: tempfile::TempDir,
        layer: std::path::PathBuf,
        outside: std::path::PathBuf,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let layer = tmp.path().join("layer");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&layer).unwrap();
        std::fs::create_dir(&outside).unwrap();
        Fixture {
            _tmp: tmp,
            layer,
            outside,
        }
    }

    fn unpack(f: &Fixture, tar: &[u8]) -> Result<Digest> {
        unpack_layer(
            tar,
            &f.layer,
            "test-layer",
            running_as_root(),
            &AtomicBool::new(false),
        )
    }

    fn outside_is_empty(f: &Fixture) -> bool {
        std::fs::read_dir(&f.outside).unwrap().next().is_none()
    }

    #[test]
    fn unpacks_files_dirs_links_with_metadata() {
        use std::os::unix::fs::MetadataExt;
        let f = fixture();
        let tar = Layer::new()
            .dir("./")
            .dir("etc/")
            .file("etc/passwd", b"root:x:0:0")
            .file("/abs/file", b"stripped")
            .file("deep/implicit/dir/f", b"x")
            .link(tar::EntryType::Symlink, "etc/link", "/etc/passwd")
            .link(tar::EntryType::Link, "etc/hard", "etc/passwd")
            .file("etc/replaced", b"old")
            .file("etc/replaced", b"new")
            .bytes();
        let diff_id = unpack(&f, &tar).unwrap();
        assert_eq!(diff_id, Digest::of(&tar));
        let l = &f.layer;
        assert_eq!(std::fs::read(l.join("etc/passwd")).unwrap(), b"root:x:0:0");
        assert_eq!(std::fs::read(l.join("abs/file")).unwrap(), b"stripped");
        assert_eq!(std::fs::read(l.join("etc/replaced")).unwrap(), b"new");
        assert_eq!(
            std::fs::read_link(l.join("etc/link")).unwrap(),
            Path::new("/etc/passwd")
        );
        let m = std::fs::metadata(l.join("etc/passwd")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o4755);
        assert_eq!(m.mtime(), 1_600_000_000);
        assert_eq!(m.nlink(), 2);
        let d = std::fs::metadata(l.join("etc")).unwrap();
        assert_eq!(d.mode() & 0o7777, 0o750);
        assert_eq!(d.mtime(), 1_600_000_000);
        if running_as_root() {
            assert_eq!((m.uid(), m.gid()), (1000, 1001));
        }
    }

    #[test]
    fn compressed_layers_give_the_uncompressed_diff_id() {
        use std::io::Write;
        let tar = Layer::new().file("a", b"hello").bytes();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::encode_all(tar.as_slice(), 3).unwrap();
        for blob in [gz, zst] {
            let f = fixture();
            let no = AtomicBool::new(false);
            let diff =
                unpack_layer(blob.as_slice(), &f.layer, "l", running_as_root(), &no).unwrap();
            assert_eq!(diff, Digest::of(&tar));
            assert_eq!(std::fs::read(f.layer.join("a")).unwrap(), b"hello");
        }
    }

    #[test]
    fn whiteouts_and_opaque_dirs() {
        if !running_as_root() {
            return;
        }
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let f = fixture();
        let tar = Layer::new()
            .dir("d/")
            .file("d/.wh..wh..opq", b"")
            .file(".wh.gone", b"")
            .file("d/.wh..wh.plnk", b"")
            .bytes();
        unpack(&f, &tar).unwrap();
        let wh = std::fs::symlink_metadata(f.layer.join("gone")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        let opaque = crust_linux::fs::get_xattr(
            &f.layer.join("d"),
            OsStr::new(OPAQUE_XATTR),
            &mut [0u8; 4][..],
        );
        assert_eq!(opaque.unwrap(), 1);
        assert!(!f.layer.join("d/.wh..wh..opq").exists());
        assert!(!f.layer.join("d/.wh..wh.plnk").exists());
    }

    #[test]
    fn hostile_entries_are_refused_and_nothing_escapes() {
        let out = |f: &Fixture| f.outside.to_str().unwrap().to_string();
        type Build = Box<dyn Fn(&Fixture) -> Vec<u8>>;
        let cases: Vec<(&str, Build, &str)> = vec![
            (
                "dotdot",
                Box::new(|_| Layer::new().file("../outside/evil", b"x").bytes()),
                "'..'",
            ),
            (
                "nested dotdot",
                Box::new(|_| Layer::new().file("a/../../outside/evil", b"x").bytes()),
                "'..'",
            ),
            (
                "write through escaping symlink",
                Box::new(move |f| {
                    Layer::new()
                        .link(tar::EntryType::Symlink, "esc", &out(f))
                        .file("esc/evil", b"x")
                        .bytes()
                }),
                "symlink",
            ),
            (
                "write through relative symlink",
                Box::new(|_| {
                    Layer::new()
                        .link(tar::EntryType::Symlink, "esc", "../outside")
                        .file("esc/evil", b"x")
                        .bytes()
                }),
                "symlink",
            ),
            (
                "dir through symlink",
                Box::new(move |f| {
                    Layer::new()
                        .link(tar::EntryType::Symlink, "esc", &out(f))
                        .dir("esc/sub/")
                        .bytes()
                }),
                "symlink",
            ),
            (
                "hardlink out by dotdot",
                Box::new(|_| {
                    Layer::new()
                        .link(tar::EntryType::Link, "evil", "../outside/x")
                        .bytes()
                }),
                "'..'",
            ),
            (
                "hardlink to absolute host file",
                Box::new(|_| {
                    Layer::new()
                        .link(tar::EntryType::Link, "evil", "/etc/passwd")
                        .bytes()
                }),
                "not in this layer",
            ),
            (
                "hardlink through symlink",
                Box::new(|_| {
                    Layer::new()
                        .link(tar::EntryType::Symlink, "etc", "/etc")
                        .link(tar::EntryType::Link, "evil", "etc/passwd")
                        .bytes()
                }),
                "symlink",
            ),
            (
                "bad whiteout",
                Box::new(|_| Layer::new().file(".wh...", b"").bytes()),
                "invalid",
            ),
            (
                "not a tar",
                Box::new(|_| b"definitely not a tar archive".repeat(40)),
                "layer",
            ),
        ];
        for (what, build, expect) in cases {
            let f = fixture();
            std::fs::write(f.outside.join("x"), b"keep").unwrap();
            let tar = build(&f);
            std::fs::remove_file(f.outside.join("x")).unwrap();
            let err = unpack(&f, &tar).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains(expect), "{what}: {err}");
            assert!(
                outside_is_empty(&f),
                "{what}: something was written outside"
            );
        }
    }

    #[test]
    fn cancel_stops_the_unpack() {
        let f = fixture();
        let tar = Layer::new().file("a", b"1").bytes();
        let err = unpack_layer(tar.as_slice(), &f.layer, "l", false, &AtomicBool::new(true));
        assert!(err.unwrap_err().to_string().contains("cancelled"));
    }

    #[test]
    fn symlink_replaced_by_file_is_not_followed() {
        let f = fixture();
        let target = f.outside.join("victim");
        std::fs::write(&target, b"original").unwrap();
        let tar = Layer::new()
            .link(tar::EntryType::Symlink, "x", target.to_str().unwrap())
            .file("x", b"replaced")
            .bytes();
        unpack(&f, &tar).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"original");
        assert_eq!(std::fs::read(f.layer.join("x")).unwrap(), b"replaced");
    }

    /// A tree as deep as a layer can make it (2048 levels), replaced by a
    /// file, on a small stack: removing it must not recurse per level.
    #[test]
    fn replacing_a_very_deep_tree_does_not_overflow_the_stack() {
        let f = fixture();
        let deep = "d/".repeat(2047);
        let mut layer = Layer::new();
        layer.0.mode(tar::HeaderMode::Deterministic);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        h.set_mode(0o644);
        layer
            .0
            .append_data(&mut h, format!("{deep}f"), &b"x"[..])
            .unwrap();
        let tar = layer.file("d", b"now a file").bytes();
        let dest = f.layer.clone();
        let result = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                unpack_layer(tar.as_slice(), &dest, "l", false, &AtomicBool::new(false))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .unwrap()
            .join()
            .unwrap();
        result.unwrap();
        assert_eq!(std::fs::read(f.layer.join("d")).unwrap(), b"now a file");
    }

    #[test]
    fn dir_replaced_by_file_and_back() {
        let f = fixture();
        let tar = Layer::new()
            .file("a/b/c", b"1")
            .file("a", b"file now")
            .dir("a/")
            .file("a/d", b"2")
            .bytes();
        unpack(&f, &tar).unwrap();
        assert_eq!(std::fs::read(f.layer.join("a/d")).unwrap(), b"2");
        assert!(!f.layer.join("a/b").exists());
    }

    #[test]
    fn pax_numbers() {
        assert_eq!(parse_pax_int(b"4294967294"), Some(4294967294));
        assert_eq!(parse_pax_time(b"1704067200.123456"), Some(1704067200));
        assert_eq!(parse_pax_time(b"x"), None);
    }
}
