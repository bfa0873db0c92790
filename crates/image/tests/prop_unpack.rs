//! Property tests of layer unpack, the most hostile input crust reads:
//! random sequences of tar entries built from a small alphabet of names
//! (so entries collide: a symlink, then a file through it; a dir, then a
//! whiteout of it) with escaping symlink and hardlink targets, whiteouts,
//! opaque markers, device nodes, GNU long names, PAX records and bogus
//! sizes; the same archives mangled; and random bytes.
//!
//! Properties, after every case:
//! - unpack returns a digest or a clean error of at most 1024 bytes;
//! - nothing outside the layer dir changed: the fixture's tree around it
//!   (a victim file, a dir, the parents up to the temp dir) is byte for
//!   byte and inode for inode what it was -- so no write, chmod, chown,
//!   utimes or hardlink went through a symlink or `..`.
//!
//! Run longer by hand: `PROPTEST_CASES=20000 cargo test -p crust-image
//! --test prop_unpack` (as root to cover whiteouts and device nodes).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crust_image::unpack::{running_as_root, unpack_layer};
use crust_quote::testing::{check_message, config};
use proptest::prelude::*;

/// Where `@OUT@` in a generated link target points: the victim dir.
const OUT: &str = "@OUT@";

#[derive(Debug, Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    Hardlink(String),
    Fifo,
    CharDev(u32, u32),
    /// A regular-file header whose size field is a lie (bigger than the
    /// data that follows).
    LyingSize(u64),
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    kind: Kind,
    mode: u32,
    /// Name and link name through GNU `L`/`K` entries instead of the header.
    gnu_long: bool,
    /// Extra PAX records (key, value) before the entry.
    pax: Vec<(String, Vec<u8>)>,
}

fn component() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(str::to_string),
        1 => prop::sample::select(vec![
            ".", "..", "", ".wh.a", ".wh.b", ".wh..", ".wh...", ".wh..wh..opq", ".wh..wh.plnk",
            "a\0b", "é", "dev",
        ])
        .prop_map(str::to_string),
        1 => (1usize..300).prop_map(|n| "n".repeat(n)),
    ]
    .boxed()
}

fn entry_path() -> BoxedStrategy<String> {
    let short = (
        prop_oneof![8 => Just(""), 1 => Just("/"), 1 => Just("./")],
        proptest::collection::vec(component(), 1..4),
        any::<bool>(),
    )
        .prop_map(|(prefix, comps, trailing)| {
            let mut p = format!("{prefix}{}", comps.join("/"));
            if trailing {
                p.push('/');
            }
            p
        });
    // Over NAME_MAX, over PATH_MAX, deep: through GNU long names.
    let long = prop_oneof![
        (256usize..5000).prop_map(|n| "n".repeat(n)),
        (100usize..2100).prop_map(|n| "d/".repeat(n)),
        (2usize..20).prop_map(|n| format!("a/{}", "../".repeat(n))),
    ];
    prop_oneof![40 => short, 1 => long].boxed()
}

/// Link targets that escape in every way, at most three `..` deep so that
/// a bug stays inside the test's temp dir.
fn link_target() -> BoxedStrategy<String> {
    prop_oneof![
        3 => entry_path(),
        2 => prop::sample::select(vec![
            "..", "../..", "../../..", "../victim", "../../victim", "../../outer/victim",
            "a/../../victim", "/", "@OUT@", "@OUT@/victim", "@OUT@/dir", "/victim",
            "a/../..", "",
        ])
        .prop_map(str::to_string),
    ]
    .boxed()
}

fn pax_record() -> BoxedStrategy<(String, Vec<u8>)> {
    prop_oneof![
        (
            Just("path".to_string()),
            entry_path().prop_map(String::into_bytes)
        ),
        (
            Just("linkpath".to_string()),
            link_target().prop_map(String::into_bytes)
        ),
        (
            prop::sample::select(vec!["uid", "gid", "mtime", "size"]).prop_map(str::to_string),
            prop_oneof![
                Just(b"0".to_vec()),
                Just(b"-1".to_vec()),
                Just(b"4294967295".to_vec()),
                Just(b"99999999999999999999".to_vec()),
                Just(b"1.5".to_vec()),
                Just(b"x".to_vec()),
            ]
        ),
        (
            prop::sample::select(vec![
                "SCHILY.xattr.user.a",
                "SCHILY.xattr.trusted.overlay.redirect",
                "SCHILY.xattr.trusted.overlay.opaque",
                "SCHILY.xattr.security.capability",
                "SCHILY.xattr.system.posix_acl_access",
            ])
            .prop_map(str::to_string),
            proptest::collection::vec(any::<u8>(), 0..16)
        ),
    ]
    .boxed()
}

fn entry() -> BoxedStrategy<Entry> {
    let kind = prop_oneof![
        3 => Just(Kind::Dir),
        4 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Kind::File),
        3 => link_target().prop_map(Kind::Symlink),
        2 => link_target().prop_map(Kind::Hardlink),
        1 => Just(Kind::Fifo),
        1 => (0u32..300, 0u32..300).prop_map(|(a, b)| Kind::CharDev(a, b)),
        1 => (1u64..1 << 20).prop_map(Kind::LyingSize),
    ];
    (
        entry_path(),
        kind,
        prop_oneof![
            Just(0o755u32),
            Just(0o644),
            Just(0o4777),
            Just(0),
            any::<u32>()
        ],
        prop::bool::weighted(0.15),
        proptest::collection::vec(pax_record(), 0..2),
    )
        .prop_map(|(name, kind, mode, gnu_long, pax)| Entry {
            name,
            kind,
            mode,
            gnu_long,
            pax,
        })
        .boxed()
}

/// Writes `entries` as a tar, with raw (unchecked) names.
fn build_tar(entries: &[Entry], out_dir: &str) -> Vec<u8> {
    let mut tar = Vec::new();
    for e in entries {
        let fix = |t: &str| t.replace(OUT, out_dir);
        let link = match &e.kind {
            Kind::Symlink(t) | Kind::Hardlink(t) => Some(fix(t)),
            _ => None,
        };
        if !e.pax.is_empty() {
            let mut body = Vec::new();
            for (k, v) in &e.pax {
                let v = if k == "linkpath" {
                    fix(&String::from_utf8_lossy(v)).into_bytes()
                } else {
                    v.clone()
                };
                body.extend_from_slice(&pax_line(k, &v));
            }
            append(&mut tar, b'x', b"././@PaxHeader", None, 0o644, &body, None);
        }
        let name = e.name.as_bytes();
        let long_name = e.gnu_long || name.len() > 100;
        if long_name {
            let mut body = name.to_vec();
            body.push(0);
            append(&mut tar, b'L', b"././@LongLink", None, 0o644, &body, None);
        }
        if let Some(l) = &link
            && (e.gnu_long || l.len() > 100)
        {
            let mut body = l.as_bytes().to_vec();
            body.push(0);
            append(&mut tar, b'K', b"././@LongLink", None, 0o644, &body, None);
        }
        let hname = if long_name {
            &name[..name.len().min(100)]
        } else {
            name
        };
        let hlink = link.as_deref().map(|l| &l.as_bytes()[..l.len().min(100)]);
        match &e.kind {
            Kind::Dir => append(&mut tar, b'5', hname, None, e.mode, b"", None),
            Kind::File(data) => append(&mut tar, b'0', hname, None, e.mode, data, None),
            Kind::Symlink(_) => append(&mut tar, b'2', hname, hlink, e.mode, b"", None),
            Kind::Hardlink(_) => append(&mut tar, b'1', hname, hlink, e.mode, b"", None),
            Kind::Fifo => append(&mut tar, b'6', hname, None, e.mode, b"", None),
            Kind::CharDev(ma, mi) => {
                append(&mut tar, b'3', hname, None, e.mode, b"", Some((*ma, *mi)))
            }
            Kind::LyingSize(size) => {
                let mut h = header(b'0', hname, None, e.mode, *size, None);
                h.set_cksum();
                tar.extend_from_slice(h.as_bytes());
                tar.extend_from_slice(&[7u8; 512]);
            }
        }
    }
    tar.extend_from_slice(&[0u8; 1024]);
    tar
}

fn pax_line(key: &str, value: &[u8]) -> Vec<u8> {
    // "<len> key=value\n", where len counts itself.
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while len.to_string().len() + rest != len {
        len += 1;
    }
    let mut line = format!("{len} {key}=").into_bytes();
    line.extend_from_slice(value);
    line.push(b'\n');
    line
}

fn header(
    kind: u8,
    name: &[u8],
    link: Option<&[u8]>,
    mode: u32,
    size: u64,
    dev: Option<(u32, u32)>,
) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::new(kind));
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
    }
    h.set_mode(mode & 0o7777777);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_mtime(1_600_000_000);
    h.set_size(size);
    if let Some((ma, mi)) = dev {
        h.set_device_major(ma).unwrap();
        h.set_device_minor(mi).unwrap();
    }
    h
}

fn append(
    tar: &mut Vec<u8>,
    kind: u8,
    name: &[u8],
    link: Option<&[u8]>,
    mode: u32,
    data: &[u8],
    dev: Option<(u32, u32)>,
) {
    let mut h = header(kind, name, link, mode, data.len() as u64, dev);
    h.set_cksum();
    tar.extend_from_slice(h.as_bytes());
    tar.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    tar.extend(std::iter::repeat_n(0u8, pad));
}

#[derive(Debug, Clone, Copy)]
enum Compression {
    Plain,
    Gzip,
    Zstd,
}

fn compress(tar: &[u8], c: Compression) -> Vec<u8> {
    match c {
        Compression::Plain => tar.to_vec(),
        Compression::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(tar).unwrap();
            gz.finish().unwrap()
        }
        Compression::Zstd => zstd::encode_all(tar, 1).unwrap(),
    }
}

/// tmp/outer/{victim, dir/, mid/layer/}: the layer is two levels below
/// anything a `..` could reach, and the outer tree is what must not change.
struct Fixture {
    tmp: tempfile::TempDir,
    layer: PathBuf,
    outer: PathBuf,
}

fn fixture() -> Fixture {
    // tmpfs when there is one: ext4's mkdir after many deletions (each
    // case makes and removes a tree) is what made this test slow.
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let outer = tmp.path().join("outer");
    let layer = outer.join("mid/layer");
    std::fs::create_dir_all(&layer).unwrap();
    std::fs::create_dir(outer.join("dir")).unwrap();
    std::fs::write(outer.join("victim"), b"keep me").unwrap();
    Fixture { tmp, layer, outer }
}

/// Everything under `root` except `skip`: type, mode, owner, size, mtime,
/// links, inode and content.
fn snapshot(root: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let content = if m.file_type().is_file() {
            format!("{:?}", std::fs::read(&p).unwrap())
        } else if m.file_type().is_symlink() {
            format!("{:?}", std::fs::read_link(&p).unwrap())
        } else {
            String::new()
        };
        out.insert(
            p.clone(),
            format!(
                "{:o} {}:{} {} {} {} {} {content}",
                m.mode(),
                m.uid(),
                m.gid(),
                m.size(),
                m.mtime(),
                m.nlink(),
                m.ino()
            ),
        );
        if m.is_dir() && p != skip {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    // The layer dir itself changes (mode, times, links): only its
    // contents are the layer's.
    out.remove(skip);
    out
}

/// `privileged` is honoured as root only (root covers both paths: owners,
/// device nodes and whiteouts, or a daemon that may not make them).
fn check_unpack(blob: &[u8], f: &Fixture, privileged: bool) -> Result<(), TestCaseError> {
    let before = snapshot(f.tmp.path(), &f.layer);
    let result = unpack_layer(
        blob,
        &f.layer,
        "sha256:layer",
        privileged && running_as_root(),
        &AtomicBool::new(false),
    );
    if let Err(e) = &result {
        check_message("unpack_layer", &e.to_string())?;
    }
    let after = snapshot(f.tmp.path(), &f.layer);
    prop_assert_eq!(
        before,
        after,
        "unpack changed something outside the layer dir (result: {:?})",
        result.map(|d| d.to_string()).map_err(|e| e.to_string())
    );
    Ok(())
}

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        4 => Just(Compression::Plain),
        1 => Just(Compression::Gzip),
        1 => Just(Compression::Zstd)
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn hostile_layers_never_escape(
        entries in proptest::collection::vec(entry(), 1..14),
        c in compression(),
        privileged in prop::bool::weighted(0.8),
    ) {
        let f = fixture();
        let tar = build_tar(&entries, f.outer.to_str().unwrap());
        check_unpack(&compress(&tar, c), &f, privileged)?;
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn mangled_layers_never_escape(
        entries in proptest::collection::vec(entry(), 1..8),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        privileged in any::<bool>(),
    ) {
        let f = fixture();
        let mut tar = build_tar(&entries, f.outer.to_str().unwrap());
        for (i, b) in flips {
            let i = i.index(tar.len());
            tar[i] = b;
        }
        if truncate {
            let n = cut.index(tar.len());
            tar.truncate(n);
        }
        check_unpack(&tar, &f, privileged)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn random_bytes_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let f = fixture();
        check_unpack(&bytes, &f, true)?;
    }
}
