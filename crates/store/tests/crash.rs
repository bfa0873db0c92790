//! A write interrupted by SIGKILL leaves the old or the new record, never a
//! torn one.
//!
//! The test re-runs its own binary as a writer child (selected by an env var)
//! that rewrites large, self-checking records in a loop, kills it at varying
//! moments, and checks every record after reopening the database.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crust_store::{Kind, Record, Store};
use serde::{Deserialize, Serialize};

const WRITER_ENV: &str = "CRUST_STORE_CRASH_WRITER";
const RECORDS: u64 = 8;

#[derive(Serialize, Deserialize)]
struct Blob {
    id: String,
    generation: u64,
    /// `generation` repeated, so a record mixing two writes is detectable.
    payload: Vec<u64>,
}

impl Record for Blob {
    const KIND: Kind = Kind::Container;
    fn key(&self) -> &str {
        &self.id
    }
}

fn blob(id: u64, generation: u64) -> Blob {
    Blob {
        id: format!("c{id}"),
        generation,
        // ~40 KiB of JSON per record: spans several redb pages.
        payload: vec![generation; 4096],
    }
}

/// The child: rewrite every record, generation after generation, some in one
/// transaction together, until killed.
fn run_writer(path: &Path) -> ! {
    let store = Store::open(path).expect("writer opens store");
    let start = store
        .list::<Blob>()
        .unwrap()
        .iter()
        .map(|b| b.generation)
        .max()
        .unwrap_or(0);
    println!("ready");
    for generation in start + 1.. {
        if generation % 2 == 0 {
            store
                .write(|tx| {
                    for id in 0..RECORDS {
                        tx.put(&blob(id, generation))?;
                    }
                    Ok(())
                })
                .unwrap();
        } else {
            for id in 0..RECORDS {
                store.put(&blob(id, generation)).unwrap();
            }
        }
    }
    unreachable!()
}

#[test]
fn sigkill_mid_write_never_tears_a_record() {
    if let Ok(path) = std::env::var(WRITER_ENV) {
        run_writer(Path::new(&path));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let exe = std::env::current_exe().unwrap();
    let mut last_max = 0;
    for round in 0..12u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "sigkill_mid_write_never_tears_a_record",
                "--nocapture",
            ])
            .env(WRITER_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait for "ready" so the kill lands in the write loop, then let it
        // write for a varying time.
        use std::io::{BufRead, BufReader};
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        while !line.contains("ready") {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("writer exited before it was ready");
            }
        }
        std::thread::sleep(Duration::from_millis(20 + round * 17));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let store = Store::open(&path).expect("reopen after kill");
        let blobs = store.list::<Blob>().unwrap();
        for b in &blobs {
            assert!(
                b.payload.len() == 4096 && b.payload.iter().all(|g| *g == b.generation),
                "record {} is torn",
                b.id
            );
        }
        let max = blobs.iter().map(|b| b.generation).max().unwrap_or(0);
        let min = blobs.iter().map(|b| b.generation).min().unwrap_or(0);
        // Single puts commit one by one, so records differ by at most one
        // generation; committed data never goes backwards.
        assert!(max - min <= 1, "generations {min}..{max}");
        assert!(max >= last_max, "committed generation {last_max} was lost");
        last_max = max;
    }
    assert!(last_max > 0, "the writer never committed anything");
}
