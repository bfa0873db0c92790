//! The exit record (`exit.json`) and OOM-kill detection.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::sys::wait::WaitStatus;

use crate::logfmt;
use crate::protocol::ExitInfo;

/// Exit code and signal from a wait status: a signal `s` is `128 + s`, as
/// containerd reports it.
pub fn exit_code(status: &WaitStatus) -> (i32, Option<i32>) {
    match *status {
        WaitStatus::Exited(_, code) => (code, None),
        WaitStatus::Signaled(_, sig, _) => (128 + sig as i32, Some(sig as i32)),
        _ => (255, None),
    }
}

/// Builds the record for `pid` ending with `status` at `at`.
pub fn exit_info(pid: i32, status: &WaitStatus, at: SystemTime, oom_killed: bool) -> ExitInfo {
    let (exit_code, signal) = exit_code(status);
    ExitInfo {
        pid,
        exit_code,
        signal,
        oom_killed,
        exited_at: logfmt::format_timestamp(at),
        exited_at_unix_nanos: logfmt::unix_nanos(at),
    }
}

/// Writes `data` to `dir/name` atomically: a temp file, fsync, rename, fsync
/// of the directory.
pub fn write_atomic(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))?;
    fs::File::open(dir)?.sync_all()
}

/// Reads an exit record, `Ok(None)` if there is none (yet).
pub fn read_exit_file(path: &Path) -> io::Result<Option<ExitInfo>> {
    match fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Watches a container's memory cgroup for OOM kills: the `oom_kill` count
/// of `memory.events` (v2) or `memory.oom_control` (v1) at create time is
/// compared with the count after the container exited.
#[derive(Debug, Clone)]
pub struct OomWatch {
    file: PathBuf,
    baseline: u64,
}

impl OomWatch {
    /// Finds `pid`'s memory cgroup (the container's, right after create).
    pub fn for_pid(pid: i32) -> Option<OomWatch> {
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let file = memory_events_file(&cgroup, &mountinfo)?;
        let baseline = read_oom_kill(&fs::read_to_string(&file).ok()?).unwrap_or(0);
        Some(OomWatch { file, baseline })
    }

    /// The count went up since create. False if the file is gone.
    pub fn oom_killed(&self) -> bool {
        fs::read_to_string(&self.file)
            .ok()
            .and_then(|s| read_oom_kill(&s))
            .is_some_and(|n| n > self.baseline)
    }

    pub fn file(&self) -> &Path {
        &self.file
    }
}

/// The `oom_kill N` line of memory.events / memory.oom_control.
pub fn read_oom_kill(s: &str) -> Option<u64> {
    s.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == "oom_kill").then(|| it.next()?.parse().ok())?
    })
}

/// From `/proc/PID/cgroup` and `/proc/self/mountinfo`, the file with the
/// memory controller's OOM-kill count: v1's `memory.oom_control` when a v1
/// memory hierarchy is mounted, else v2's `memory.events`.
pub fn memory_events_file(proc_cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
    let mut v1_path = None;
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        if ctrls.is_empty() {
            v2_path = Some(path);
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1_path = Some(path);
        }
    }
    let mut v1_mount = None;
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        // id parent maj:min root mountpoint opts [optional...] - fstype source superopts
        let (pre, post) = match line.split_once(" - ") {
            Some(x) => x,
            None => continue,
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let (root, mnt) = (pre[3], unescape(pre[4]));
        match post[0] {
            "cgroup" if post[2].split(',').any(|o| o == "memory") => {
                v1_mount = Some((root.to_string(), mnt))
            }
            "cgroup2" if v2_mount.is_none() => v2_mount = Some((root.to_string(), mnt)),
            _ => {}
        }
    }
    if let (Some(path), Some((root, mnt))) = (v1_path, v1_mount) {
        return Some(join_cgroup(&mnt, &root, path).join("memory.oom_control"));
    }
    if let (Some(path), Some((root, mnt))) = (v2_path, v2_mount) {
        return Some(join_cgroup(&mnt, &root, path).join("memory.events"));
    }
    None
}

fn join_cgroup(mnt: &str, root: &str, path: &str) -> PathBuf {
    let rel = if root != "/" {
        path.strip_prefix(root).unwrap_or(path)
    } else {
        path
    };
    Path::new(mnt).join(rel.trim_start_matches('/'))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;
    use nix::unistd::Pid;

    #[test]
    fn codes_like_containerd() {
        let p = Pid::from_raw(5);
        assert_eq!(exit_code(&WaitStatus::Exited(p, 42)), (42, None));
        assert_eq!(
            exit_code(&WaitStatus::Signaled(p, Signal::SIGKILL, false)),
            (137, Some(9))
        );
        assert_eq!(
            exit_code(&WaitStatus::Signaled(p, Signal::SIGTERM, true)),
            (143, Some(15))
        );
    }

    #[test]
    fn oom_kill_counts() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(read_oom_kill(v1), Some(3));
        let v2 = "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(read_oom_kill(v2), Some(1));
        assert_eq!(read_oom_kill("oom 1\n"), None);
    }

    const MOUNTINFO_HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_v1_memory_on_a_hybrid_host() {
        let cg = "12:pids:/crust/x\n5:memory:/crust/x\n0::/crust/x\n";
        assert_eq!(
            memory_events_file(cg, MOUNTINFO_HYBRID).unwrap(),
            Path::new("/sys/fs/cgroup/memory/crust/x/memory.oom_control")
        );
    }

    #[test]
    fn finds_v2_memory_events() {
        let mi = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            memory_events_file("0::/kubepods/pod1/c1\n", mi).unwrap(),
            Path::new("/sys/fs/cgroup/kubepods/pod1/c1/memory.events")
        );
        assert!(memory_events_file("0::/x\n", "").is_none());
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }

    #[test]
    fn atomic_write_and_read() {
        let d = tempfile::tempdir().unwrap();
        assert!(
            read_exit_file(&d.path().join("exit.json"))
                .unwrap()
                .is_none()
        );
        let info = exit_info(
            7,
            &WaitStatus::Exited(Pid::from_raw(7), 42),
            std::time::UNIX_EPOCH + std::time::Duration::new(1, 5),
            false,
        );
        write_atomic(d.path(), "exit.json", &serde_json::to_vec(&info).unwrap()).unwrap();
        let back = read_exit_file(&d.path().join("exit.json"))
            .unwrap()
            .unwrap();
        assert_eq!(back, info);
        assert_eq!(back.exited_at, "1970-01-01T00:00:01.000000005Z");
        assert_eq!(back.exited_at_unix_nanos, 1_000_000_005);
        assert!(!d.path().join(".exit.json.tmp").exists());
    }
}
