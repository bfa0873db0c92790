//! What a cgroup's processes hold: threads, open files and sockets,
//! from `/proc/<pid>/`, for the process metrics (container_threads,
//! container_file_descriptors, container_sockets) and ProcessUsage.
//! Plain reads of procfs; a process that exits meanwhile is skipped.

/// Totals over a set of processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessCounts {
    pub processes: u64,
    pub threads: u64,
    pub file_descriptors: u64,
    pub sockets: u64,
}

/// Counts threads (`/proc/<pid>/task` entries), open descriptors and the
/// descriptors that are sockets of each of `pids`. Blocking; costs one
/// readdir per process plus one readlink per descriptor.
pub fn count(pids: &[i32]) -> ProcessCounts {
    let mut c = ProcessCounts::default();
    for pid in pids {
        let base = format!("/proc/{pid}");
        let Ok(tasks) = std::fs::read_dir(format!("{base}/task")) else {
            continue;
        };
        c.processes += 1;
        c.threads += tasks.count() as u64;
        let Ok(fds) = std::fs::read_dir(format!("{base}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            c.file_descriptors += 1;
            if std::fs::read_link(fd.path())
                .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
            {
                c.sockets += 1;
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_this_process() {
        let me = std::process::id() as i32;
        let sock = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let c = count(&[me, -1]);
        assert_eq!(c.processes, 1);
        assert!(c.threads >= 1);
        assert!(c.file_descriptors >= 4, "{c:?}");
        assert!(c.sockets >= 1, "{c:?}");
        drop(sock);
    }
}
