//! `crust-shim`: the per-container monitor (see `crust_shim::monitor`).
//!
//! ```text
//! crust-shim container <state-dir>   monitor a new container
//! crust-shim exec <state-dir>        monitor an exec session
//! ```

use std::ffi::OsString;
use std::path::PathBuf;

use crust_shim::monitor::{self, Mode};
use crust_shim_protocol::NOFILE_ENV;

fn main() {
    // Run from the daemon's sealed copy (`/proc/self/fd/N`), or re-run
    // through `/proc/self/exe`, the kernel names us "N" or "exe".
    let _ = crust_linux::process::set_name(c"crust-shim");
    if let Some(n) = std::env::var(NOFILE_ENV).ok().and_then(|v| v.parse().ok()) {
        let _ = crust_linux::process::set_open_files_soft_limit(n);
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    let mode = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let dir = args.get(2).map(PathBuf::from);
    let code = match (mode, dir) {
        ("container", Some(dir)) => monitor::run(Mode::Container, &dir),
        ("exec", Some(dir)) => monitor::run(Mode::Exec, &dir),
        ("--version", _) => {
            println!("crust-shim {}", env!("CARGO_PKG_VERSION"));
            0
        }
        _ => {
            eprintln!("usage: crust-shim container|exec <state-dir>");
            2
        }
    };
    std::process::exit(code);
}
