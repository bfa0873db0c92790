//! What the bench reads of processes in /proc: memory (RSS, PSS, peak),
//! CPU time, the process tree and cgroups, to find a container's monitor.

/// (VmRSS, VmHWM) of a process in KiB.
pub fn proc_rss(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// (Rss, Pss) of a process in KiB, from smaps_rollup.
pub fn rss_pss(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((field("Rss:")?, field("Pss:")?))
}

/// (utime + stime) of a process, in seconds.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // USER_HZ, which /proc reports in, is 100 on every Linux ABI.
    Some(ticks / 100.0)
}

fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    pids.sort();
    pids
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: fields follow the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether `pid` is in the container's cgroup: with the cgroupfs driver
/// every runtime names it after the container ID (crust `crust-<id>`,
/// containerd `<id>`).
fn in_container_cgroup(pid: u32, container_id: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
        s.lines().any(|l| {
            l.rsplit('/')
                .next()
                .is_some_and(|last| last.ends_with(container_id))
        })
    })
}

/// The monitor of a running container: the parent of the container's init
/// (the first process of its cgroup whose parent is outside it). That is
/// crust-shim for crust and containerd-shim-runc-v2 for containerd (there
/// one shim serves the whole pod). Falls back to a `*shim*` process whose
/// command line names the container.
pub fn monitor_of(container_id: &str) -> Option<u32> {
    let all = pids();
    let inside: Vec<u32> = all
        .iter()
        .copied()
        .filter(|&p| in_container_cgroup(p, container_id))
        .collect();
    let from_cgroup = inside
        .iter()
        .filter_map(|&p| ppid(p))
        .find(|pp| !inside.contains(pp) && *pp > 1);
    from_cgroup.or_else(|| {
        all.into_iter().find(|&pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
            (String::from_utf8_lossy(argv0).contains("shim") || comm(pid).contains("shim"))
                && String::from_utf8_lossy(&cmdline).contains(container_id)
        })
    })
}

/// Whether `pid` runs in a cgroup below `parent` (the bench's cgroup
/// parent: a pod's container or sandbox / pause process, not a monitor).
/// Never for an empty `parent` (the runtime's default).
pub fn in_cgroup_below(pid: u32, parent: &str) -> bool {
    let parent = parent.trim_end_matches('/');
    !parent.is_empty()
        && std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
            s.lines().any(|l| {
                l.split(':')
                    .nth(2)
                    .is_some_and(|path| path.starts_with(&format!("{parent}/")))
            })
        })
}

/// The monitor and the helper processes it has running for the container:
/// its descendants outside the container's cgroup (a forked child, a
/// runtime binary, an exec session, a sandbox's pause process), and any
/// other `*shim*` process whose command line names the container.
pub fn monitor_tree(monitor: u32, container_id: &str) -> Vec<(u32, String)> {
    let all = pids();
    let parent: Vec<(u32, Option<u32>)> = all.iter().map(|&p| (p, ppid(p))).collect();
    let mut tree = vec![monitor];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        for (c, pp) in &parent {
            if *pp == Some(p) && !tree.contains(c) && !in_container_cgroup(*c, container_id) {
                tree.push(*c);
            }
        }
        i += 1;
    }
    for &pid in &all {
        if tree.contains(&pid) || !comm(pid).contains("shim") {
            continue;
        }
        if std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(container_id))
        {
            tree.push(pid);
        }
    }
    tree.into_iter().map(|p| (p, comm(p))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let (rss, hwm) = proc_rss(me).expect("VmRSS and VmHWM");
        assert!(rss > 0.0 && hwm >= rss);
        assert!(cpu_secs(me).is_some());
        assert!(!comm(me).is_empty());
        assert!(proc_rss(u32::MAX).is_none(), "no such process");
    }

    #[test]
    fn no_cgroup_parent_holds_no_pod() {
        assert!(!in_cgroup_below(std::process::id(), ""));
        assert!(!in_cgroup_below(std::process::id(), "/"));
    }
}
