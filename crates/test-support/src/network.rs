//! CNI networks of a test's own (a bridge and a subnet no other test
//! uses), removed with their iptables rules on drop.

use std::path::PathBuf;
use std::process::Command;

use crate::daemon::{Daemon, remove_all_pods_blocking};

/// The bridge plugin turns on the node's ip_forward for a gateway; the value
/// from before the first test network is put back after the last one.
static FORWARDING: std::sync::Mutex<(usize, Option<String>)> = std::sync::Mutex::new((0, None));
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
static NETWORKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A CNI network of a test's own, written into a daemon's conf dir: a bridge
/// and a /24 (10.198.x.0/24) no other test (of this or a concurrent run)
/// uses, host-local IPAM state in the daemon's temp dir, and whatever
/// plugins the test adds. Drop removes the daemon's pods through the API,
/// then the bridge and any iptables rule naming the network.
pub struct TestNetwork {
    pub name: String,
    pub bridge: String,
    /// `10.198.x`; the subnet is `<prefix>.0/24`, the gateway `<prefix>.1`.
    pub subnet_prefix: String,
    pub ipam_dir: PathBuf,
    pub conflist: PathBuf,
    socket: PathBuf,
}

impl TestNetwork {
    /// bridge + host-local, then `more_plugins` (JSON objects).
    pub fn install(d: &Daemon, more_plugins: &[&str]) -> TestNetwork {
        let n = NETWORKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 10;
        let pid = std::process::id();
        let name = format!("crust-pods-{pid}-{n}");
        let bridge = format!("cpt{}n{n}", pid % 100_000);
        let subnet_prefix = format!("10.198.{}", (pid % 25) * 10 + n);
        let ipam_dir = d.temp_dir().join("ipam");
        let mut plugins = vec![format!(
            r#"{{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": true,
                "hairpinMode": true,
                "ipam": {{"type": "host-local", "dataDir": "{}",
                          "ranges": [[{{"subnet": "{subnet_prefix}.0/24"}}]],
                          "routes": [{{"dst": "0.0.0.0/0"}}]}}}}"#,
            ipam_dir.display()
        )];
        plugins.extend(more_plugins.iter().map(|p| p.to_string()));
        let text = format!(
            r#"{{"cniVersion": "1.0.0", "name": "{name}", "plugins": [{}]}}"#,
            plugins.join(",")
        );
        let conflist = d.cni_conf_dir.join("50-test.conflist");
        std::fs::write(&conflist, text).unwrap();
        {
            let mut state = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
            if state.0 == 0 {
                state.1 = std::fs::read_to_string(IP_FORWARD).ok();
            }
            state.0 += 1;
        }
        TestNetwork {
            name,
            bridge,
            subnet_prefix,
            ipam_dir,
            conflist,
            socket: d.socket.clone(),
        }
    }

    /// Host-side interfaces on the bridge (the pods' veths).
    pub fn veths(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-o", "link", "show", "master", &self.bridge])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Addresses host-local has handed out.
    pub fn leases(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.ipam_dir.join(&self.name)) else {
            return vec![];
        };
        dir.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        remove_all_pods_blocking(&self.socket);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        remove_iptables_rules_mentioning(&self.name);
        let mut state = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0
            && let Some(original) = state.1.take()
        {
            let _ = std::fs::write(IP_FORWARD, original.trim());
        }
    }
}

/// Deletes nat rules whose comment names `tag`, and the per-pod chains they
/// jump to (a fallback: CNI DEL removes them when all goes well).
pub fn remove_iptables_rules_mentioning(tag: &str) {
    let Ok(out) = Command::new("iptables-save").args(["-t", "nat"]).output() else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut chains = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("-A ") && l.contains(tag))
    {
        if let Some(target) = line
            .split(" -j ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            && target.starts_with("CNI-")
            && !target.starts_with("CNI-HOSTPORT-")
        {
            chains.push(target.to_string());
        }
        // iptables-save quotes as a shell does.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("iptables -t nat -D {}", &line[3..]))
            .output();
    }
    for chain in chains {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", &chain])
            .output();
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", &chain])
            .output();
    }
}
