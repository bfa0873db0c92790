//! Layers built to exhaust memory: a few KB of zstd that claim a huge GNU
//! long name, long link, PAX record block or sparse map. Unpack must refuse
//! them within a fixed memory budget.
//!
//! The test binary's allocator ([`cap::Cap`]) has a limit: around each
//! unpack it is set to what is allocated plus [`BUDGET`], so an unbounded
//! read aborts the binary (and fails the test) instead of eating the
//! machine. One test function only: the limit is process-wide.

use std::alloc::System;
use std::io::Write;
use std::sync::atomic::AtomicBool;

use cap::Cap;
use crust_image::unpack::unpack_layer;

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

/// What one unpack may allocate on top of what the test holds.
const BUDGET: usize = 48 << 20;
/// What each bomb claims.
const CLAIM: u64 = 256 << 20;

fn header(kind: u8, name: &str, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::new(kind));
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_mode(0o644);
    h.set_size(size);
    h.set_cksum();
    h
}

/// A zstd stream of `header`, then `size` bytes from `fill`, then a file
/// entry and the end of the archive -- written in pieces, so the test
/// itself never holds the bomb.
fn zstd_bomb(header: tar::Header, size: u64, fill: impl Fn(&mut [u8], u64)) -> Vec<u8> {
    let mut z = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    z.write_all(header.as_bytes()).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < size {
        let n = (size - done).min(chunk.len() as u64) as usize;
        fill(&mut chunk[..n], done);
        z.write_all(&chunk[..n]).unwrap();
        done += n as u64;
    }
    let pad = (512 - size % 512) % 512;
    z.write_all(&vec![0u8; pad as usize]).unwrap();
    z.write_all(header_after().as_bytes()).unwrap();
    z.write_all(&[0u8; 1024]).unwrap();
    z.finish().unwrap()
}

fn header_after() -> tar::Header {
    header(b'0', "after", 0)
}

/// A GNU sparse header whose map goes on in 32 MiB of extension blocks,
/// each of 21 empty regions: two list items each in the tar crate, so
/// ~110 MB of memory if the map is not bounded.
fn sparse_bomb() -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.as_old_mut().name[..6].copy_from_slice(b"sparse");
    h.set_mode(0o644);
    h.set_size(0);
    let gnu = h.as_gnu_mut().unwrap();
    gnu.isextended[0] = 1;
    h.set_cksum();
    let blocks = (32u64 << 20) / 512;
    let mut z = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    z.write_all(h.as_bytes()).unwrap();
    let mut offset = 0u64;
    for i in 0..blocks {
        let mut ext = [0u8; 512];
        for r in 0..21 {
            offset += 1;
            // offset and numbytes, 12-byte octal fields.
            let field = format!("{offset:011o}\0");
            ext[r * 24..r * 24 + 12].copy_from_slice(field.as_bytes());
            ext[r * 24 + 12..r * 24 + 24].copy_from_slice(b"00000000000\0");
        }
        ext[504] = u8::from(i + 1 < blocks);
        z.write_all(&ext).unwrap();
    }
    z.finish().unwrap()
}

fn unpack_within_budget(what: &str, blob: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let limit = ALLOC.allocated() + BUDGET;
    ALLOC.set_limit(limit).unwrap();
    let result = unpack_layer(blob, dir.path(), "bomb", false, &AtomicBool::new(false));
    ALLOC.set_limit(usize::MAX).unwrap();
    match result {
        Ok(d) => panic!("{what}: a bomb was accepted as {d}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn metadata_bombs_are_refused_within_a_fixed_memory_budget() {
    let letters = |buf: &mut [u8], _: u64| buf.fill(b'a');
    let pax = |buf: &mut [u8], at: u64| {
        // One endless record: "<len> path=aaaa...".
        buf.fill(b'a');
        if at == 0 {
            let head = format!("{CLAIM} path=");
            buf[..head.len()].copy_from_slice(head.as_bytes());
        }
    };
    let bombs = [
        (
            "GNU long name",
            zstd_bomb(header(b'L', "././@LongLink", CLAIM), CLAIM, letters),
        ),
        (
            "GNU long link",
            zstd_bomb(header(b'K', "././@LongLink", CLAIM), CLAIM, letters),
        ),
        (
            "PAX records",
            zstd_bomb(header(b'x', "././@PaxHeader", CLAIM), CLAIM, pax),
        ),
        ("sparse map", sparse_bomb()),
    ];
    for (what, blob) in bombs {
        let err = unpack_within_budget(what, &blob);
        assert!(err.len() <= 1024, "{what}: {err}");
        assert!(err.contains("over 4 MiB"), "{what}: {err}");
    }
}
