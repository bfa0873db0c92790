//! Privileged tests (run as root) with Debian's real CNI plugins in
//! /usr/lib/cni. Each test has its own bridge, subnet (10.199.x.0/24), IPAM
//! dir and cache dir; traffic stays inside the test's namespaces and the
//! host's loopback. Drop guards run DEL, unpin namespaces, delete the
//! bridge and any leftover iptables rules, also when a test fails.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use crust_linux::ns::{self, NamespaceKind, PinOptions};
use crust_network::config::{self, NetworkConfigList};
use crust_network::{
    Attachment, Cni, DelAttempt, Error, PortMapping, Protocol, RuntimeCapabilities,
};

const REAL_PLUGINS: &str = "/usr/lib/cni";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The bridge plugin turns on the node's ip_forward for a gateway; put the
/// original value back when the last test using a bridge is done.
static FORWARDING: Mutex<(usize, Option<String>)> = Mutex::new((0, None));
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

struct ForwardingRestore;

impl ForwardingRestore {
    fn acquire() -> Self {
        let mut state = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 == 0 {
            state.1 = std::fs::read_to_string(IP_FORWARD).ok();
        }
        state.0 += 1;
        ForwardingRestore
    }
}

impl Drop for ForwardingRestore {
    fn drop(&mut self) {
        let mut state = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0
            && let Some(original) = state.1.take()
        {
            let _ = std::fs::write(IP_FORWARD, original.trim());
        }
    }
}

/// One test's network: bridge, subnet, dirs and config list.
struct TestNetwork {
    name: String,
    bridge: String,
    subnet_prefix: String,
    dir: tempfile::TempDir,
    cni: Cni,
    _forwarding: ForwardingRestore,
}

impl TestNetwork {
    /// `n` keeps concurrent tests apart; the pid keeps concurrent runs apart.
    fn new(n: u32, extra_bin_dir: Option<&Path>) -> TestNetwork {
        let pid = std::process::id();
        let octet = (pid % 40) * 6 + n;
        let dir = tempfile::tempdir().unwrap();
        let mut bin_dirs = Vec::new();
        bin_dirs.extend(extra_bin_dir.map(Path::to_path_buf));
        bin_dirs.push(PathBuf::from(REAL_PLUGINS));
        let cni = Cni::new(bin_dirs)
            .unwrap()
            .with_cache_dir(dir.path().join("cache"))
            .with_timeout(Duration::from_secs(20));
        TestNetwork {
            name: format!("crust-test-{pid}-{n}"),
            bridge: format!("crt{}b{n}", pid % 100_000),
            subnet_prefix: format!("10.199.{octet}"),
            dir,
            cni,
            _forwarding: ForwardingRestore::acquire(),
        }
    }

    fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam")
    }

    /// bridge + host-local (+ more plugins, as JSON objects).
    fn conflist(&self, more_plugins: &[&str]) -> NetworkConfigList {
        let mut plugins = vec![format!(
            r#"{{"type": "bridge", "bridge": "{}", "isGateway": true, "ipMasq": true, "hairpinMode": true,
                "ipam": {{"type": "host-local", "dataDir": "{}",
                          "ranges": [[{{"subnet": "{}.0/24"}}]], "routes": [{{"dst": "0.0.0.0/0"}}]}}}}"#,
            self.bridge,
            self.ipam_dir().display(),
            self.subnet_prefix
        )];
        plugins.extend(more_plugins.iter().map(|p| p.to_string()));
        let text = format!(
            r#"{{"cniVersion": "1.0.0", "name": "{}", "plugins": [{}]}}"#,
            self.name,
            plugins.join(",")
        );
        config::parse(Path::new("test.conflist"), text.as_bytes()).unwrap()
    }

    /// Host-side interfaces enslaved to the bridge (the pods' veths).
    fn veths(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-o", "link", "show", "master", &self.bridge])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Addresses host-local has handed out (one file per IP).
    fn leases(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.ipam_dir().join(&self.name)) else {
            return vec![];
        };
        dir.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .collect()
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        crust_test_support::remove_iptables_rules_mentioning(&self.name);
    }
}

fn iptables_save() -> String {
    let out = Command::new("iptables-save").output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A pod: a pinned network namespace and its attachment. Drop runs DEL and
/// unpins.
struct TestPod {
    cni: Cni,
    net: NetworkConfigList,
    att: Attachment,
    _dir: tempfile::TempDir,
}

impl TestPod {
    fn new(
        network: &TestNetwork,
        net: &NetworkConfigList,
        id: &str,
        caps: RuntimeCapabilities,
    ) -> TestPod {
        let dir = tempfile::tempdir().unwrap();
        let pinned = ns::pin_namespaces(
            &dir.path().join("ns"),
            &PinOptions {
                net: true,
                loopback_up: true,
                ..Default::default()
            },
        )
        .unwrap();
        TestPod {
            cni: network.cni.clone(),
            net: net.clone(),
            att: Attachment {
                container_id: id.to_string(),
                netns: pinned.net.unwrap(),
                ifname: "eth0".into(),
                pod_namespace: "default".into(),
                pod_name: format!("pod-{id}"),
                pod_uid: format!("uid-{id}"),
                capabilities: caps,
            },
            _dir: dir,
        }
    }

    fn netns(&self) -> &Path {
        &self.att.netns
    }

    fn ns_dir(&self) -> PathBuf {
        self.att.netns.parent().unwrap().to_path_buf()
    }
}

impl Drop for TestPod {
    fn drop(&mut self) {
        let (cni, net, att) = (self.cni.clone(), self.net.clone(), self.att.clone());
        // Own thread and runtime: Drop may run inside a runtime.
        let _ = std::thread::spawn(move || {
            runtime().block_on(cni.del(&net, &att, None, DelAttempt::Repeat))
        })
        .join();
        let _ = ns::unpin_namespaces(&self.ns_dir());
    }
}

fn unique_id(tag: &str) -> String {
    format!("{tag}{}", std::process::id())
}

/// Connects from inside `from` to `to` and sends `msg`; returns the stream.
fn connect_from(from: &Path, to: SocketAddr, msg: &'static [u8]) -> TcpStream {
    ns::run_in_namespaces(&[(NamespaceKind::Net, from)], move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
        s.write_all(msg).unwrap();
        s
    })
    .unwrap()
}

fn listen_in(netns: &Path, addr: SocketAddr) -> TcpListener {
    ns::run_in_namespaces(&[(NamespaceKind::Net, netns)], move || {
        TcpListener::bind(addr).unwrap()
    })
    .unwrap()
}

fn accept_and_read(listener: &TcpListener, len: usize) -> Vec<u8> {
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf).unwrap();
    buf
}

#[test]
fn two_pods_on_a_bridge_reach_each_other_and_del_cleans_up() {
    let rt = runtime();
    let network = TestNetwork::new(1, None);
    let net = network.conflist(&[r#"{"type": "loopback"}"#]);
    let a = TestPod::new(
        &network,
        &net,
        &unique_id("podA"),
        RuntimeCapabilities::default(),
    );
    let b = TestPod::new(
        &network,
        &net,
        &unique_id("podB"),
        RuntimeCapabilities::default(),
    );

    let added_a = rt.block_on(network.cni.add(&net, &a.att)).unwrap();
    let added_b = rt.block_on(network.cni.add(&net, &b.att)).unwrap();
    let ip_a = added_a.pod_ips("eth0");
    let ip_b = added_b.pod_ips("eth0");
    assert_eq!(ip_a.len(), 1, "{:?}", added_a.raw);
    assert!(
        ip_a[0].to_string().starts_with(&network.subnet_prefix),
        "{ip_a:?}"
    );
    assert!(
        ip_b[0].to_string().starts_with(&network.subnet_prefix),
        "{ip_b:?}"
    );
    assert_ne!(ip_a, ip_b);
    // The result names the sandbox's eth0, as PodSandboxStatus reports it.
    assert!(
        added_a
            .result
            .interfaces
            .iter()
            .any(|i| i.name == "eth0" && i.sandbox == a.netns().to_str().unwrap())
    );
    assert_eq!(network.veths().len(), 2, "{:?}", network.veths());
    assert_eq!(network.leases().len(), 2);
    let cached = network
        .cni
        .load_cached(&net.name, &a.att.container_id, "eth0")
        .unwrap()
        .unwrap();
    assert_eq!(cached.result, added_a.raw);
    rt.block_on(network.cni.check(&net, &a.att, None)).unwrap();

    // B connects to A over the bridge.
    let listener = listen_in(a.netns(), SocketAddr::new(ip_a[0], 8080));
    let client = connect_from(b.netns(), SocketAddr::new(ip_a[0], 8080), b"ping");
    assert_eq!(accept_and_read(&listener, 4), b"ping");
    // Sockets hold their namespace: close them so it can go away below.
    drop((client, listener));

    // ipMasq rules exist while attached, and DEL removes them with the veth.
    assert!(iptables_save().contains(&a.att.container_id));
    rt.block_on(network.cni.del(&net, &a.att, None, DelAttempt::First))
        .unwrap();
    assert_eq!(network.veths().len(), 1);
    assert_eq!(network.leases().len(), 1);
    assert!(!iptables_save().contains(&a.att.container_id));
    assert!(
        network
            .cni
            .load_cached(&net.name, &a.att.container_id, "eth0")
            .unwrap()
            .is_none()
    );
    // Again: already deleted is fine.
    rt.block_on(network.cni.del(&net, &a.att, None, DelAttempt::First))
        .unwrap();

    // DEL after the namespace is gone still releases the address. (The
    // bridge plugin finds its ipMasq rules through the addresses inside the
    // namespace, so those stay behind: the daemon must DEL before it
    // unpins. The network guard removes them here.)
    ns::unpin_namespaces(&b.ns_dir()).unwrap();
    rt.block_on(
        network
            .cni
            .del(&net, &b.att, Some(&added_b.raw), DelAttempt::First),
    )
    .unwrap();
    assert!(network.leases().is_empty());
    // The veth went with the namespace.
    for _ in 0..100 {
        if network.veths().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(network.veths().is_empty(), "{:?}", network.veths());
}

/// The nat lines that name `id` (rules, with their comment).
fn rules_naming(id: &str) -> usize {
    iptables_save()
        .lines()
        .filter(|l| l.contains(&format!("id: \\\"{id}\\\"\"")))
        .count()
}

/// A DEL cut short inside the bridge plugin, after it deleted the pod's
/// interface (the daemon killed mid-DEL), leaves the pod's masquerade
/// chain and its POSTROUTING jump: the plugin finds them through the
/// addresses on that interface, so it cannot on any later DEL.
/// [`DelAttempt::Repeat`] removes the rules tagged for that pod, and
/// only those: another pod's, whose ID starts with the first's, stay.
#[test]
fn a_del_after_one_cut_short_removes_the_masquerade_rules() {
    let rt = runtime();
    let network = TestNetwork::new(6, None);
    let net = network.conflist(&[]);
    let id = unique_id("podR");
    let cut = TestPod::new(&network, &net, &id, RuntimeCapabilities::default());
    let other = TestPod::new(
        &network,
        &net,
        &format!("{id}0"),
        RuntimeCapabilities::default(),
    );
    let added = rt.block_on(network.cni.add(&net, &cut.att)).unwrap();
    rt.block_on(network.cni.add(&net, &other.att)).unwrap();
    let other_rules = rules_naming(&other.att.container_id);
    assert_eq!(rules_naming(&id), 3, "jump, ACCEPT, MASQUERADE");
    assert_eq!(other_rules, 3);
    let chain = iptables_save()
        .lines()
        .find(|l| l.starts_with("-A POSTROUTING") && l.contains(&format!("id: \\\"{id}\\\"\"")))
        .and_then(|l| l.rsplit(" -j ").next())
        .unwrap()
        .to_string();
    assert!(chain.starts_with("CNI-"), "{chain}");

    // What the cut-short DEL did before the kill: the interface is gone.
    let deleted = Command::new("nsenter")
        .arg(format!("--net={}", cut.netns().display()))
        .args(["ip", "link", "del", "eth0"])
        .status()
        .unwrap();
    assert!(deleted.success());
    assert_eq!(rules_naming(&id), 3);

    rt.block_on(
        network
            .cni
            .del(&net, &cut.att, Some(&added.raw), DelAttempt::Repeat),
    )
    .unwrap();
    assert_eq!(rules_naming(&id), 0, "{}", iptables_save());
    assert_eq!(rules_naming(&other.att.container_id), other_rules);
    assert_eq!(network.leases().len(), 1, "the other pod's");
    assert!(
        !iptables_save().contains(&format!(":{chain} ")),
        "the pod's chain {chain} is gone"
    );
    // Again: nothing left to find, nothing else touched.
    rt.block_on(
        network
            .cni
            .del(&net, &cut.att, Some(&added.raw), DelAttempt::Repeat),
    )
    .unwrap();
    assert_eq!(rules_naming(&other.att.container_id), other_rules);
}

#[test]
fn host_port_is_reachable_on_localhost_until_del() {
    let rt = runtime();
    let chains_before = iptables_save().contains(":CNI-HOSTPORT-DNAT");
    let network = TestNetwork::new(2, None);
    let net = network.conflist(&[r#"{"type": "portmap", "capabilities": {"portMappings": true}}"#]);
    let host_port = 30_000 + (std::process::id() % 20_000) as i32;
    let caps = RuntimeCapabilities {
        port_mappings: vec![PortMapping {
            host_port,
            container_port: 8080,
            protocol: Protocol::Tcp,
            host_ip: String::new(),
        }],
        ..Default::default()
    };
    let pod = TestPod::new(&network, &net, &unique_id("podP"), caps);
    let added = rt.block_on(network.cni.add(&net, &pod.att)).unwrap();
    assert_eq!(added.pod_ips("eth0").len(), 1);

    let listener = listen_in(pod.netns(), "0.0.0.0:8080".parse().unwrap());
    let target: SocketAddr = format!("127.0.0.1:{host_port}").parse().unwrap();
    let mut client = TcpStream::connect_timeout(&target, Duration::from_secs(5)).unwrap();
    client.write_all(b"hostport").unwrap();
    assert_eq!(accept_and_read(&listener, 8), b"hostport");
    drop(client);
    let rules = iptables_save();
    assert!(
        rules.contains(&pod.att.container_id) && rules.contains(&format!("--dport {host_port}"))
    );

    rt.block_on(network.cni.del(&net, &pod.att, None, DelAttempt::First))
        .unwrap();
    let rules = iptables_save();
    assert!(!rules.contains(&pod.att.container_id), "{rules}");
    assert!(!rules.contains(&format!("--dport {host_port}")), "{rules}");
    assert!(TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_err());

    if !chains_before {
        remove_portmap_base_chains();
    }
}

/// portmap's shared chains and the jumps into them, for a host that had
/// none before the test.
fn remove_portmap_base_chains() {
    let text = iptables_save();
    let mut in_nat = false;
    for line in text.lines() {
        if line.starts_with('*') {
            in_nat = line == "*nat";
        }
        if in_nat
            && line.starts_with("-A ")
            && line.contains("-j CNI-HOSTPORT-")
            && !line.starts_with("-A CNI-")
        {
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("iptables -t nat -D {}", &line[3..]))
                .output();
        }
    }
    for chain in [
        "CNI-HOSTPORT-DNAT",
        "CNI-HOSTPORT-SETMARK",
        "CNI-HOSTPORT-MASQ",
    ] {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", chain])
            .output();
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", chain])
            .output();
    }
}

#[test]
fn a_missing_plugin_fails_before_anything_runs() {
    let rt = runtime();
    let network = TestNetwork::new(3, None);
    let net = network.conflist(&[r#"{"type": "crust-no-such-plugin"}"#]);
    let pod = TestPod::new(
        &network,
        &net,
        &unique_id("podM"),
        RuntimeCapabilities::default(),
    );
    let err = rt.block_on(network.cni.add(&net, &pod.att)).unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    assert!(err.to_string().contains("crust-no-such-plugin"), "{err}");
    // Not even the bridge ran.
    let bridge_exists = Command::new("ip")
        .args(["link", "show", &network.bridge])
        .output()
        .unwrap()
        .status
        .success();
    assert!(!bridge_exists);
    assert!(network.leases().is_empty());
}

/// A fake plugin: a shell script in a temp bin dir.
fn fake_plugin(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_failing_plugin_rolls_the_attachment_back() {
    let rt = runtime();
    let bin = tempfile::tempdir().unwrap();
    fake_plugin(
        bin.path(),
        "crust-fail",
        r#"cat >/dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo '{"cniVersion":"1.0.0","code":7,"msg":"refusing on purpose","details":"test plugin"}'
  exit 1
fi"#,
    );
    let network = TestNetwork::new(4, Some(bin.path()));
    let net = network.conflist(&[r#"{"type": "crust-fail"}"#]);
    let pod = TestPod::new(
        &network,
        &net,
        &unique_id("podF"),
        RuntimeCapabilities::default(),
    );
    let err = rt.block_on(network.cni.add(&net, &pod.att)).unwrap_err();
    match &err {
        Error::Plugin {
            plugin,
            code,
            msg,
            details,
            ..
        } => {
            assert_eq!((plugin.as_str(), *code), ("crust-fail", 7));
            assert_eq!(
                (msg.as_str(), details.as_str()),
                ("refusing on purpose", "test plugin")
            );
        }
        other => panic!("unexpected error: {other}"),
    }
    // The bridge plugin's part was undone: no veth, no lease, no rules.
    assert!(network.veths().is_empty(), "{:?}", network.veths());
    assert!(network.leases().is_empty(), "{:?}", network.leases());
    assert!(!iptables_save().contains(&pod.att.container_id));
    assert!(
        network
            .cni
            .load_cached(&net.name, &pod.att.container_id, "eth0")
            .unwrap()
            .is_none()
    );
    let pod_links = ns::run_in_namespaces(&[(NamespaceKind::Net, pod.netns())], || {
        std::fs::read_to_string("/proc/thread-self/net/dev").unwrap()
    })
    .unwrap();
    assert!(
        pod_links.contains("lo:") && !pod_links.contains("eth0:"),
        "{pod_links}"
    );
}

#[test]
fn plugin_misbehaviour_becomes_clear_errors() {
    let rt = runtime();
    let bin = tempfile::tempdir().unwrap();
    fake_plugin(bin.path(), "crust-slow", "exec sleep 30");
    fake_plugin(
        bin.path(),
        "crust-garbage",
        "cat >/dev/null; echo 'not json'",
    );
    fake_plugin(
        bin.path(),
        "crust-crash",
        "cat >/dev/null; echo 'it broke' >&2; exit 3",
    );
    fake_plugin(
        bin.path(),
        "crust-env",
        r#"cat >/dev/null
printf '{"cniVersion":"1.0.0","ips":[],"dns":{"options":["%s","%s","%s"]}}' "$CNI_ARGS" "$CNI_PATH" "$CNI_IFNAME""#,
    );
    let cni = Cni::new(vec![bin.path().into()])
        .unwrap()
        .with_timeout(Duration::from_millis(500));
    let att = Attachment {
        container_id: "fake1".into(),
        netns: "/nonexistent/netns".into(),
        ifname: "eth0".into(),
        pod_namespace: "ns1".into(),
        pod_name: "p1".into(),
        pod_uid: "u1".into(),
        capabilities: RuntimeCapabilities::default(),
    };
    let list = |plugin: &str| {
        let text =
            format!(r#"{{"cniVersion":"1.0.0","name":"fake","plugins":[{{"type":"{plugin}"}}]}}"#);
        config::parse(Path::new("fake.conflist"), text.as_bytes()).unwrap()
    };

    let started = std::time::Instant::now();
    let err = rt.block_on(cni.add(&list("crust-slow"), &att)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The ADD timed out, and so did the DEL that cleaned up after it.
    assert!(
        err.to_string().contains("crust-slow ADD timed out"),
        "{err}"
    );

    let err = rt
        .block_on(cni.add(&list("crust-garbage"), &att))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidResult { .. }), "{err}");

    let err = rt
        .block_on(cni.add(&list("crust-crash"), &att))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("crust-crash ADD failed") && msg.contains("it broke"),
        "{msg}"
    );

    let added = rt.block_on(cni.add(&list("crust-env"), &att)).unwrap();
    let seen = &added.result.dns.options;
    assert_eq!(
        seen[0],
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p1;K8S_POD_INFRA_CONTAINER_ID=fake1;K8S_POD_UID=u1"
    );
    assert_eq!(seen[1], bin.path().to_str().unwrap());
    assert_eq!(seen[2], "eth0");
}

#[test]
fn the_default_conflist_works_with_the_real_plugins() {
    let rt = runtime();
    let network = TestNetwork::new(5, None);
    let conf_dir = network.dir.path().join("net.d");
    let default = crust_network::DefaultNetwork {
        name: network.name.clone(),
        bridge: network.bridge.clone(),
        subnets: vec![format!("{}.0/24", network.subnet_prefix)],
        ipam_data_dir: Some(network.ipam_dir()),
    };
    crust_network::install_default_conflist(&conf_dir, &default)
        .unwrap()
        .unwrap();
    let net = config::load_default(&conf_dir).unwrap();
    let pod = TestPod::new(
        &network,
        &net,
        &unique_id("podD"),
        RuntimeCapabilities::default(),
    );
    let added = rt.block_on(network.cni.add(&net, &pod.att)).unwrap();
    // loopback, last in the chain, passed the bridge's result through.
    let ips = added.pod_ips("eth0");
    assert_eq!(ips.len(), 1, "{}", added.raw);
    assert!(ips[0].to_string().starts_with(&network.subnet_prefix));
    rt.block_on(network.cni.check(&net, &pod.att, Some(&added.raw)))
        .unwrap();
    rt.block_on(network.cni.del(&net, &pod.att, None, DelAttempt::First))
        .unwrap();
    assert!(network.veths().is_empty());
    assert!(network.leases().is_empty());
    assert!(!iptables_save().contains(&pod.att.container_id));
}
