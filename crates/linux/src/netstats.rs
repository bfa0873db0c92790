//! Interface counters of pod network namespaces, for PodSandboxStats and
//! the network metrics.
//!
//! One helper thread visits every namespace asked for in turn: it joins
//! the namespace with setns(CLONE_NEWNET) and reads
//! `/proc/thread-self/net/dev`, which the kernel renders for the reading
//! thread's network namespace (`/proc/self/net` would show the process's,
//! i.e. the main thread's). The thread exits afterwards, so no other code
//! ever runs in a pod's namespace. One thread for all pods keeps a
//! 100-pod scrape at one spawn plus one setns and one read per pod.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::Error;
use crate::ns::{NamespaceKind, on_helper_thread};

/// The counters of one interface (`/proc/net/dev`'s columns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// Parses `/proc/net/dev`: two header lines, then
/// `name: rx_bytes rx_packets rx_errs rx_drop fifo frame compressed
/// multicast tx_bytes tx_packets tx_errs tx_drop fifo colls carrier
/// compressed`. Lines that do not have that shape are skipped.
pub fn parse_proc_net_dev(text: &str) -> Vec<InterfaceStats> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        // The header lines have `|` and no colon; be strict anyway.
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '|') {
            continue;
        }
        let v: Vec<u64> = rest
            .split_ascii_whitespace()
            .map_while(|f| f.parse().ok())
            .collect();
        if v.len() < 16 {
            continue;
        }
        out.push(InterfaceStats {
            name: name.to_string(),
            rx_bytes: v[0],
            rx_packets: v[1],
            rx_errors: v[2],
            rx_dropped: v[3],
            tx_bytes: v[8],
            tx_packets: v[9],
            tx_errors: v[10],
            tx_dropped: v[11],
        });
    }
    out
}

/// The interface counters inside each network namespace file in
/// `netns_paths` (pinned namespaces or `/proc/<pid>/ns/net`), in order;
/// each entry fails on its own (a pod removed meanwhile). The outer error
/// is the helper thread's. Blocking: call from `spawn_blocking`.
pub fn interface_stats_in(
    netns_paths: &[&Path],
) -> Result<Vec<Result<Vec<InterfaceStats>, Error>>, Error> {
    if netns_paths.is_empty() {
        return Ok(Vec::new());
    }
    on_helper_thread(|| {
        let mut buf = String::with_capacity(4096);
        netns_paths
            .iter()
            .map(|path| read_in(path, &mut buf))
            .collect()
    })
}

/// On the helper thread: join `path`'s network namespace, read the table.
fn read_in(path: &Path, buf: &mut String) -> Result<Vec<InterfaceStats>, Error> {
    let ns = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io("open network namespace", path))?;
    // The flag makes setns refuse a file that is not a network namespace.
    nix::sched::setns(&ns, NamespaceKind::Net.clone_flag()).map_err(Error::sys("setns"))?;
    buf.clear();
    let dev = "/proc/thread-self/net/dev";
    std::fs::File::open(dev)
        .and_then(|mut f| f.read_to_string(buf))
        .map_err(Error::io("read", dev))?;
    Ok(parse_proc_net_dev(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     140       2    0    0    0     0          0         0      140       2    0    0    0     0       0          0
  eth0: 1048576     812    1    3    0     0          0         0    20480     150    2    4    0     0       0          0
";

    #[test]
    fn parses_the_table() {
        let v = parse_proc_net_dev(DEV);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].name, "lo");
        assert_eq!(
            v[1],
            InterfaceStats {
                name: "eth0".into(),
                rx_bytes: 1_048_576,
                rx_packets: 812,
                rx_errors: 1,
                rx_dropped: 3,
                tx_bytes: 20_480,
                tx_packets: 150,
                tx_errors: 2,
                tx_dropped: 4,
            }
        );
        // Short or garbled lines are skipped, not misread.
        assert!(
            parse_proc_net_dev("eth0: 1 2 3\nx y: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
                .is_empty()
        );
    }

    #[test]
    fn nothing_asked_nothing_read() {
        assert!(interface_stats_in(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_missing_namespace_fails_alone() {
        // Opening fails before setns, so this needs no privileges; reading
        // real namespaces is covered through the daemon (tests/).
        let missing = Path::new("/nonexistent/netns");
        let got = interface_stats_in(&[missing, missing]).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|r| r.is_err()));
    }
}
