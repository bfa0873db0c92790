//! What tests inspect on the host: processes, mounts, iptables.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether process `pid` runs (exists and is not a zombie waiting to be
/// reaped by its new parent).
pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Mount points at or below `dir`, outermost first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        // mountinfo escapes spaces and such as octal; test dirs have none.
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect()
}

pub fn iptables_save() -> String {
    let out = Command::new("iptables-save")
        .output()
        .expect("run iptables-save");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
