//! Pod sandboxes against the real daemon, real namespaces, cgroups and mounts,
//! and Debian's real CNI plugins (/usr/lib/cni). Each test has its own
//! daemon, bridge, subnet, IPAM dir and cgroup parent; pods are removed
//! through the API by guards (TestNetwork, the harness' Daemon) also when a
//! test fails, and every test that creates something checks that nothing
//! is left: no mount in the run dir, no pinned namespace, no cgroup, no
//! veth, no IP lease, no iptables rule, no record.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crust_linux::ns::{self, NamespaceKind};
use crust_test_support::crust_api::{v1, v1alpha2};
use crust_test_support::tonic::{Code, Status, transport::Channel};
use crust_test_support::{Daemon, TestNetwork, iptables_save, mounts_under, pod_metadata};
use serde_json::Value;

type Runtime = v1::runtime_service_client::RuntimeServiceClient<Channel>;

/// A cgroup parent of the test's own, so that "no pod cgroup left" can be
/// checked without knowing the pod's ID; removed on drop. With the
/// cgroupfs driver a path (`/crust-test-<pid>-<tag>`, each pod's cgroup
/// `crust-<id>` in it); with the systemd driver, as kubelet does it, a
/// slice per pod (`crust_test_<pid>_<tag>-pod<n>.slice`, nested in
/// `crust_test_<pid>_<tag>.slice`): that driver takes slices only, and a
/// pod's slice is its cgroup.
struct CgroupParent(String, std::sync::atomic::AtomicUsize);

impl CgroupParent {
    fn new(tag: &str) -> CgroupParent {
        let name = if systemd_driver() {
            format!("crust_test_{}_{tag}", std::process::id())
        } else {
            format!("/crust-test-{}-{tag}", std::process::id())
        };
        CgroupParent(name, Default::default())
    }

    /// The cgroup_parent for the next pod.
    fn for_pod(&self) -> String {
        if systemd_driver() {
            let n = self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("{}-pod{n}.slice", self.0)
        } else {
            self.0.clone()
        }
    }

    /// The pod cgroup of pod `id` run with cgroup_parent `given`.
    fn pod_cgroup(&self, given: &str, id: &str) -> String {
        if systemd_driver() {
            format!("/{}.slice/{given}", self.0)
        } else {
            format!("{given}/crust-{id}")
        }
    }

    /// The parent's dir in every hierarchy (each v1 controller, cgroup2).
    fn dirs(&self) -> Vec<PathBuf> {
        if systemd_driver() {
            cgroup_dirs(&format!("/{}.slice", self.0))
        } else {
            cgroup_dirs(&self.0)
        }
    }

    /// Pod cgroups (`crust-*`; the pod slices) under the parent, in any
    /// hierarchy.
    fn pod_cgroups(&self) -> Vec<PathBuf> {
        self.dirs()
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("crust-") || name.ends_with(".slice")
            })
            .map(|e| e.path())
            .collect()
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        if systemd_driver() {
            // The slice and every pod slice left in it.
            let _ = std::process::Command::new("systemctl")
                .args(["stop", &format!("{}.slice", self.0)])
                .status();
            return;
        }
        for dir in self.dirs() {
            // Pod cgroups first (a failed test may have left one).
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

fn systemd_driver() -> bool {
    crust_test_support::cgroup_driver() == "systemd"
}

/// `rel` (a cgroupfs path) in every mounted hierarchy.
fn cgroup_dirs(rel: &str) -> Vec<PathBuf> {
    let rel = rel.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![root.join(rel)];
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path().join(rel));
            }
        }
    }
    dirs.into_iter().filter(|d| d.is_dir()).collect()
}

fn pod_config(name: &str, parent: &CgroupParent) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: pod_metadata(name, "crust-test"),
        labels: HashMap::from([("test".to_string(), name.to_string())]),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: parent.for_pod(),
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    pid: v1::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ns_options(c: &mut v1::PodSandboxConfig) -> &mut v1::NamespaceOption {
    c.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options
        .as_mut()
        .unwrap()
}

fn host_network(mut c: v1::PodSandboxConfig) -> v1::PodSandboxConfig {
    ns_options(&mut c).network = v1::NamespaceMode::Node as i32;
    c
}

async fn run(rt: &mut Runtime, config: v1::PodSandboxConfig) -> Result<String, Status> {
    rt.run_pod_sandbox(v1::RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .await
    .map(|r| r.into_inner().pod_sandbox_id)
}

async fn stop(rt: &mut Runtime, id: &str) -> Result<(), Status> {
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .map(|_| ())
}

async fn remove(rt: &mut Runtime, id: &str) -> Result<(), Status> {
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: id.into(),
    })
    .await
    .map(|_| ())
}

/// Status and the parsed verbose info.
async fn status(rt: &mut Runtime, id: &str) -> (v1::PodSandboxStatus, Value) {
    let resp = rt
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info = serde_json::from_str(&resp.info["info"]).unwrap();
    (resp.status.unwrap(), info)
}

async fn list(rt: &mut Runtime, filter: v1::PodSandboxFilter) -> Vec<v1::PodSandbox> {
    let mut items = rt
        .list_pod_sandbox(v1::ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    items.sort_by_key(|p| p.metadata.as_ref().unwrap().name.clone());
    items
}

fn names(pods: &[v1::PodSandbox]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.as_ref().unwrap().name.clone())
        .collect()
}

fn path_of(info: &Value, key: &str) -> PathBuf {
    PathBuf::from(
        info[key]
            .as_str()
            .unwrap_or_else(|| panic!("{key} in {info}")),
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn in_ns<T: Send>(kind: NamespaceKind, path: &Path, f: impl FnOnce() -> T + Send) -> T {
    ns::run_in_namespaces(&[(kind, path)], f).unwrap()
}

fn read_in_ns(kind: NamespaceKind, path: &Path, file: &'static str) -> String {
    in_ns(kind, path, move || std::fs::read_to_string(file).unwrap())
        .trim()
        .to_string()
}

/// Everything the daemon creates for pods is gone.
async fn assert_nothing_left(
    d: &Daemon,
    rt: &mut Runtime,
    parent: &CgroupParent,
    net: Option<&TestNetwork>,
) {
    let pods = list(rt, v1::PodSandboxFilter::default()).await;
    assert!(pods.is_empty(), "pods left: {pods:?}");
    assert!(
        mounts_under(&d.run_dir).is_empty(),
        "mounts left: {:?}",
        mounts_under(&d.run_dir)
    );
    for dir in [d.run_dir.join("pods"), d.root.join("pods")] {
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
    }
    assert!(
        parent.pod_cgroups().is_empty(),
        "cgroups left: {:?}",
        parent.pod_cgroups()
    );
    if let Ok(cache) = std::fs::read_dir(d.root.join("cni/cache")) {
        let left: Vec<_> = cache.flatten().collect();
        assert!(left.is_empty(), "CNI cache left: {left:?}");
    }
    if let Some(net) = net {
        assert!(net.veths().is_empty(), "veths left: {:?}", net.veths());
        assert!(net.leases().is_empty(), "leases left: {:?}", net.leases());
        let rules = iptables_save();
        assert!(!rules.contains(&net.name), "iptables rules left:\n{rules}");
    }
}

fn listen_in(netns: &Path, addr: SocketAddr) -> TcpListener {
    in_ns(NamespaceKind::Net, netns, move || {
        TcpListener::bind(addr).unwrap()
    })
}

fn accept_and_read(listener: &TcpListener, len: usize) -> Vec<u8> {
    listener.set_nonblocking(false).unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf).unwrap();
    buf
}

fn connect_from(netns: &Path, to: SocketAddr, msg: &'static [u8]) -> TcpStream {
    in_ns(NamespaceKind::Net, netns, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
        s.write_all(msg).unwrap();
        s
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn two_pods_on_the_bridge_reach_each_other_with_their_files_and_sysctls() {
    let d = Daemon::start().await;
    let parent = CgroupParent::new("bridge");
    let net = TestNetwork::install(&d, &[r#"{"type": "loopback"}"#]);
    let mut rt = d.runtime_v1().await;

    let mut a_config = pod_config("a", &parent);
    a_config.hostname = "pod-a".into();
    a_config.dns_config = Some(v1::DnsConfig {
        servers: vec!["10.96.0.10".into(), "fd00::10".into()],
        searches: vec!["ns1.svc.cluster.local".into(), "svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    a_config.annotations = HashMap::from([("note".to_string(), "kept as is".to_string())]);
    a_config.linux.as_mut().unwrap().sysctls = HashMap::from([
        ("net.core.somaxconn".to_string(), "777".to_string()),
        ("kernel.msgmax".to_string(), "12345".to_string()),
        // Exists only once CNI made eth0.
        (
            "net.ipv4.conf.eth0.accept_redirects".to_string(),
            "0".to_string(),
        ),
    ]);
    let a = run(&mut rt, a_config.clone()).await.unwrap();
    let b = run(&mut rt, pod_config("b", &parent)).await.unwrap();
    assert_eq!(a.len(), 64);
    assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");

    let (sa, info_a) = status(&mut rt, &a).await;
    let (sb, info_b) = status(&mut rt, &b).await;
    assert_eq!(sa.id, a);
    assert_eq!(sa.state, v1::PodSandboxState::SandboxReady as i32);
    assert_eq!(sa.metadata, a_config.metadata);
    assert_eq!(sa.labels, a_config.labels);
    assert_eq!(sa.annotations, a_config.annotations);
    assert_eq!(sa.runtime_handler, "");
    let age = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
        - sa.created_at;
    assert!(
        (0..60_000_000_000).contains(&age),
        "created_at {}",
        sa.created_at
    );
    let options = sa.linux.unwrap().namespaces.unwrap().options.unwrap();
    assert_eq!(options.pid, v1::NamespaceMode::Container as i32);
    assert_eq!(options.network, v1::NamespaceMode::Pod as i32);
    let ip_a: IpAddr = sa.network.as_ref().unwrap().ip.parse().unwrap();
    let ip_b: IpAddr = sb.network.as_ref().unwrap().ip.parse().unwrap();
    assert!(ip_a.to_string().starts_with(&net.subnet_prefix), "{ip_a}");
    assert!(ip_b.to_string().starts_with(&net.subnet_prefix), "{ip_b}");
    assert_ne!(ip_a, ip_b);
    assert!(sa.network.unwrap().additional_ips.is_empty());

    // Verbose info, as containerd's.
    assert_eq!(info_a["pid"], 0);
    assert_eq!(info_a["runtimeHandler"], "");
    assert_eq!(info_a["netNamespaceClosed"], false);
    assert_eq!(info_a["cniNetwork"], net.name.as_str());
    assert_eq!(info_a["config"]["hostname"], "pod-a");
    let cni_ips = info_a["cniResult"]["ips"].to_string();
    assert!(cni_ips.contains(&ip_a.to_string()), "{cni_ips}");
    let netns_a = path_of(&info_a, "netNamespacePath");
    let netns_b = path_of(&info_b, "netNamespacePath");
    assert!(ns::is_pinned(&netns_a) && ns::is_pinned(&netns_b));
    assert!(netns_a.starts_with(&d.run_dir), "{}", netns_a.display());
    let uts_a = PathBuf::from(info_a["namespaces"]["uts"].as_str().unwrap());
    let ipc_a = PathBuf::from(info_a["namespaces"]["ipc"].as_str().unwrap());
    let uts_b = PathBuf::from(info_b["namespaces"]["uts"].as_str().unwrap());

    // Files for containers to mount.
    let node_hostname = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert_eq!(read(&path_of(&info_a, "hostnamePath")), "pod-a\n");
    assert_eq!(
        read(&path_of(&info_b, "hostnamePath")),
        format!("{node_hostname}\n")
    );
    assert_eq!(
        read(&path_of(&info_a, "resolvConfPath")),
        "search ns1.svc.cluster.local svc.cluster.local\n\
         nameserver 10.96.0.10\nnameserver fd00::10\noptions ndots:5\n"
    );
    assert_eq!(
        read(&path_of(&info_b, "resolvConfPath")),
        std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default()
    );
    let hosts_a = read(&path_of(&info_a, "hostsPath"));
    assert!(hosts_a.contains("127.0.0.1\tlocalhost\n"), "{hosts_a}");
    assert!(hosts_a.contains(&format!("{ip_a}\tpod-a\n")), "{hosts_a}");

    // Hostnames and sysctls inside the pods' namespaces; the node's unchanged.
    assert_eq!(
        in_ns(NamespaceKind::Uts, &uts_a, || nix::unistd::gethostname()
            .unwrap()),
        "pod-a"
    );
    assert_eq!(
        in_ns(NamespaceKind::Uts, &uts_b, || nix::unistd::gethostname()
            .unwrap()),
        node_hostname.as_str()
    );
    assert_eq!(
        read_in_ns(NamespaceKind::Net, &netns_a, "/proc/sys/net/core/somaxconn"),
        "777"
    );
    assert_eq!(
        read_in_ns(
            NamespaceKind::Net,
            &netns_a,
            "/proc/sys/net/ipv4/conf/eth0/accept_redirects"
        ),
        "0"
    );
    assert_eq!(
        read_in_ns(NamespaceKind::Ipc, &ipc_a, "/proc/sys/kernel/msgmax"),
        "12345"
    );
    assert_ne!(
        read_in_ns(NamespaceKind::Net, &netns_b, "/proc/sys/net/core/somaxconn"),
        "777"
    );
    assert_ne!(read(Path::new("/proc/sys/kernel/msgmax")).trim(), "12345");

    // The pods' /dev/shm and cgroups.
    let shm_a = path_of(&info_a, "shmPath");
    assert!(mounts_under(&d.run_dir).contains(&shm_a));
    let cgroup_a = info_a["cgroupPath"].as_str().unwrap().to_string();
    let given_a = &a_config.linux.as_ref().unwrap().cgroup_parent;
    assert_eq!(cgroup_a, parent.pod_cgroup(given_a, &a));
    assert!(!cgroup_dirs(&cgroup_a).is_empty());
    assert!(!parent.pod_cgroups().is_empty());

    // B reaches A over the bridge.
    let listener = listen_in(&netns_a, SocketAddr::new(ip_a, 8080));
    let client = connect_from(&netns_b, SocketAddr::new(ip_a, 8080), b"ping");
    assert_eq!(accept_and_read(&listener, 4), b"ping");
    drop((client, listener));
    assert_eq!(net.veths().len(), 2);
    assert!(iptables_save().contains(&a), "ipMasq rules name the pod");

    // Stop: not ready, off the network, namespaces kept until removal.
    stop(&mut rt, &a).await.unwrap();
    let (sa, info_a) = status(&mut rt, &a).await;
    assert_eq!(sa.state, v1::PodSandboxState::SandboxNotready as i32);
    assert_eq!(sa.network.unwrap().ip, "");
    assert!(ns::is_pinned(&netns_a));
    assert_eq!(info_a["state"], "notready");
    assert_eq!(net.veths().len(), 1);
    assert_eq!(net.leases().len(), 1);
    assert!(!iptables_save().contains(&a));
    stop(&mut rt, &a).await.unwrap();

    remove(&mut rt, &a).await.unwrap();
    remove(&mut rt, &a).await.unwrap();
    stop(&mut rt, &a).await.unwrap();
    assert!(!netns_a.exists());
    assert!(cgroup_dirs(&cgroup_a).is_empty());
    let err = rt
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: a.clone(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(
        names(&list(&mut rt, v1::PodSandboxFilter::default()).await),
        ["b"]
    );

    // Remove without Stop does Stop's work.
    remove(&mut rt, &b).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_filters_id_prefixes_and_name_reuse() {
    let d = Daemon::start().await;
    let parent = CgroupParent::new("list");
    let mut rt = d.runtime_v1().await;
    // Host network: no CNI needed for this one.
    let with_labels = |name: &str, labels: &[(&str, &str)]| {
        let mut c = host_network(pod_config(name, &parent));
        c.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        c
    };
    let p1 = run(&mut rt, with_labels("p1", &[("app", "x"), ("tier", "web")]))
        .await
        .unwrap();
    let p2 = run(&mut rt, with_labels("p2", &[("app", "x")]))
        .await
        .unwrap();
    let p3 = run(&mut rt, with_labels("p3", &[("app", "y")]))
        .await
        .unwrap();
    stop(&mut rt, &p3).await.unwrap();

    let labels = |pairs: &[(&str, &str)]| v1::PodSandboxFilter {
        label_selector: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let state = |s: v1::PodSandboxState| v1::PodSandboxFilter {
        state: Some(v1::PodSandboxStateValue { state: s as i32 }),
        ..Default::default()
    };
    let id = |id: &str| v1::PodSandboxFilter {
        id: id.into(),
        ..Default::default()
    };
    let all = list(&mut rt, v1::PodSandboxFilter::default()).await;
    assert_eq!(names(&all), ["p1", "p2", "p3"]);
    assert_eq!(all[0].labels["tier"], "web");
    assert_eq!(
        names(&list(&mut rt, labels(&[("app", "x")])).await),
        ["p1", "p2"]
    );
    assert_eq!(
        names(&list(&mut rt, labels(&[("app", "x"), ("tier", "web")])).await),
        ["p1"]
    );
    assert!(list(&mut rt, labels(&[("app", "z")])).await.is_empty());
    assert_eq!(
        names(&list(&mut rt, state(v1::PodSandboxState::SandboxNotready)).await),
        ["p3"]
    );
    assert_eq!(
        names(&list(&mut rt, state(v1::PodSandboxState::SandboxReady)).await),
        ["p1", "p2"]
    );
    // An ID or a unique prefix of one, as crictl sends.
    assert_eq!(names(&list(&mut rt, id(&p2)).await), ["p2"]);
    assert_eq!(names(&list(&mut rt, id(&p2[..13])).await), ["p2"]);
    assert!(list(&mut rt, id("no-such-pod")).await.is_empty());
    let mut filter = id(&p1[..13]);
    filter.state = Some(v1::PodSandboxStateValue {
        state: v1::PodSandboxState::SandboxNotready as i32,
    });
    assert!(list(&mut rt, filter).await.is_empty());
    // Status, Stop and Remove take prefixes too.
    let (s, _) = status(&mut rt, &p1[..13]).await;
    assert_eq!(s.id, p1);

    // (name, namespace, uid, attempt) is unique until the pod is removed.
    let err = run(&mut rt, with_labels("p1", &[])).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert!(err.message().contains(&p1), "{}", err.message());
    let mut next_attempt = with_labels("p1", &[]);
    next_attempt.metadata.as_mut().unwrap().attempt = 1;
    let p1b = run(&mut rt, next_attempt).await.unwrap();
    stop(&mut rt, &p1[..13]).await.unwrap();
    remove(&mut rt, &p1[..13]).await.unwrap();
    let p1c = run(&mut rt, with_labels("p1", &[])).await.unwrap();

    // Unknown IDs: Stop and Remove succeed, Status is NotFound.
    let unknown = "0".repeat(64);
    stop(&mut rt, &unknown).await.unwrap();
    remove(&mut rt, &unknown).await.unwrap();
    let err = rt
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: unknown,
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = stop(&mut rt, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    for id in [p1b, p1c, p2, p3] {
        remove(&mut rt, &id).await.unwrap();
    }
    assert_nothing_left(&d, &mut rt, &parent, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_port_is_reachable_on_localhost() {
    let chains_before = iptables_save().contains(":CNI-HOSTPORT-DNAT");
    let d = Daemon::start().await;
    let parent = CgroupParent::new("hostport");
    let net = TestNetwork::install(
        &d,
        &[r#"{"type": "portmap", "capabilities": {"portMappings": true}}"#],
    );
    let mut rt = d.runtime_v1().await;
    let host_port = 31_000 + (std::process::id() % 20_000) as i32;
    let mut config = pod_config("hostport", &parent);
    config.port_mappings = vec![
        v1::PortMapping {
            protocol: v1::Protocol::Tcp as i32,
            container_port: 8080,
            host_port,
            host_ip: String::new(),
        },
        // No host port: informational, not for CNI.
        v1::PortMapping {
            protocol: v1::Protocol::Tcp as i32,
            container_port: 9090,
            host_port: 0,
            host_ip: String::new(),
        },
    ];
    let id = run(&mut rt, config).await.unwrap();
    let (_, info) = status(&mut rt, &id).await;
    let netns = path_of(&info, "netNamespacePath");

    let listener = listen_in(&netns, "0.0.0.0:8080".parse().unwrap());
    let target: SocketAddr = format!("127.0.0.1:{host_port}").parse().unwrap();
    let mut client = TcpStream::connect_timeout(&target, Duration::from_secs(5)).unwrap();
    client.write_all(b"hostport").unwrap();
    assert_eq!(accept_and_read(&listener, 8), b"hostport");
    drop((client, listener));
    let rules = iptables_save();
    assert!(rules.contains(&format!("--dport {host_port}")), "{rules}");

    // DEL on Stop takes the mapping away (portmap needs the same
    // capabilities as at ADD to find its rules).
    stop(&mut rt, &id).await.unwrap();
    let rules = iptables_save();
    assert!(!rules.contains(&format!("--dport {host_port}")), "{rules}");
    assert!(TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_err());
    remove(&mut rt, &id).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
    drop(net);
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
            let _ = std::process::Command::new("sh")
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
        for op in ["-F", "-X"] {
            let _ = std::process::Command::new("iptables")
                .args(["-t", "nat", op, chain])
                .output();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn host_network_pods_need_no_cni_and_have_no_netns_of_their_own() {
    // The conf dir is empty: the node has no pod network.
    let d = Daemon::start().await;
    let parent = CgroupParent::new("hostnet");
    let mut rt = d.runtime_v1().await;

    let err = run(&mut rt, pod_config("needs-cni", &parent))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("no network config"),
        "{}",
        err.message()
    );
    assert_nothing_left(&d, &mut rt, &parent, None).await;

    let mut config = host_network(pod_config("hostnet", &parent));
    config.hostname = "node-name".into();
    config.linux.as_mut().unwrap().sysctls =
        HashMap::from([("kernel.shm_rmid_forced".to_string(), "1".to_string())]);
    let id = run(&mut rt, config).await.unwrap();
    let (s, info) = status(&mut rt, &id).await;
    assert_eq!(s.state, v1::PodSandboxState::SandboxReady as i32);
    assert_eq!(s.network.unwrap().ip, "");
    let options = s.linux.unwrap().namespaces.unwrap().options.unwrap();
    assert_eq!(options.network, v1::NamespaceMode::Node as i32);
    assert_eq!(info["netNamespacePath"], "");
    assert_eq!(info["netNamespaceClosed"], true);
    // The node's UTS namespace goes with its network; IPC is the pod's.
    assert_eq!(info["namespaces"]["uts"], "");
    let ipc = PathBuf::from(info["namespaces"]["ipc"].as_str().unwrap());
    assert!(ns::is_pinned(&ipc));
    assert_eq!(
        read_in_ns(NamespaceKind::Ipc, &ipc, "/proc/sys/kernel/shm_rmid_forced"),
        "1"
    );
    assert_eq!(info["cniResult"], Value::Null);
    assert_eq!(read(&path_of(&info, "hostnamePath")), "node-name\n");
    assert_eq!(
        read(&path_of(&info, "hostsPath")),
        std::fs::read_to_string("/etc/hosts").unwrap()
    );
    assert!(mounts_under(&d.run_dir).contains(&path_of(&info, "shmPath")));

    // net.* sysctls would change the node's network: refused.
    let mut config = host_network(pod_config("hostnet-sysctl", &parent));
    config.linux.as_mut().unwrap().sysctls =
        HashMap::from([("net.core.somaxconn".to_string(), "1".to_string())]);
    let err = run(&mut rt, config).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("host network"), "{}", err.message());

    // Host IPC as well: nothing to pin, no shm of its own.
    let mut config = host_network(pod_config("hostall", &parent));
    ns_options(&mut config).ipc = v1::NamespaceMode::Node as i32;
    ns_options(&mut config).pid = v1::NamespaceMode::Node as i32;
    let all_host = run(&mut rt, config).await.unwrap();
    let (_, info) = status(&mut rt, &all_host).await;
    assert_eq!(info["namespaces"]["ipc"], "");
    assert_eq!(info["shmPath"], "");

    remove(&mut rt, &id).await.unwrap();
    remove(&mut rt, &all_host).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pid_namespace_pod_runs_a_pause_process_and_leaves_nothing() {
    let d = Daemon::start().await;
    let parent = CgroupParent::new("pidpod");
    let net = TestNetwork::install(&d, &[]);
    let mut rt = d.runtime_v1().await;
    let mut config = pod_config("pidpod", &parent);
    ns_options(&mut config).pid = v1::NamespaceMode::Pod as i32;
    // The default (no namespace options at all) is POD too, as critest's
    // default pod config and a bare crictl pod.json send.
    let mut bare = pod_config("pidpod-bare", &parent);
    bare.linux.as_mut().unwrap().security_context = None;
    for config in [config, bare] {
        let id = run(&mut rt, config).await.unwrap();
        let (_, info) = status(&mut rt, &id).await;
        let pid = info["pid"].as_i64().unwrap();
        assert!(pid > 0, "{info}");
        // PID 1 of its own PID namespace, running crust's static pause.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert_eq!(cmdline, b"/pause\0");
        let status_text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let nspid = status_text
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .unwrap()
            .to_string();
        assert!(nspid.trim_end().ends_with("\t1"), "{nspid}");
        remove(&mut rt, &id).await.unwrap();
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .is_empty()
            }
        );
    }
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_clear_errors_and_leave_nothing_behind() {
    let d = Daemon::start().await;
    let parent = CgroupParent::new("bad");
    let net = TestNetwork::install(&d, &[]);
    let mut rt = d.runtime_v1().await;

    let good = || pod_config("bad", &parent);
    type Case = (
        &'static str,
        Option<v1::PodSandboxConfig>,
        &'static str,
        Code,
        &'static str,
    );
    let edit = |f: &dyn Fn(&mut v1::PodSandboxConfig)| {
        let mut c = good();
        f(&mut c);
        Some(c)
    };
    let sysctl = |k: &'static str, v: &'static str| {
        edit(&|c| {
            c.linux.as_mut().unwrap().sysctls = HashMap::from([(k.to_string(), v.to_string())])
        })
    };
    let cases: Vec<Case> = vec![
        (
            "no config",
            None,
            "",
            Code::InvalidArgument,
            "config: required",
        ),
        (
            "no metadata",
            edit(&|c| c.metadata = None),
            "",
            Code::InvalidArgument,
            "config.metadata: required",
        ),
        (
            "no name",
            edit(&|c| c.metadata.as_mut().unwrap().name.clear()),
            "",
            Code::InvalidArgument,
            "config.metadata.name: required",
        ),
        (
            "no uid",
            edit(&|c| c.metadata.as_mut().unwrap().uid.clear()),
            "",
            Code::InvalidArgument,
            "config.metadata.uid: required",
        ),
        (
            "unknown handler",
            Some(good()),
            "no-such-handler",
            Code::InvalidArgument,
            "\"no-such-handler\"",
        ),
        (
            "node-wide sysctl",
            sysctl("kernel.panic", "1"),
            "",
            Code::InvalidArgument,
            "kernel.panic",
        ),
        (
            "sysctl injection",
            sysctl("net.core.somaxconn", "1\nkernel.core_pattern=|/tmp/x"),
            "",
            Code::InvalidArgument,
            "newline",
        ),
        (
            // Valid by name, refused by the kernel only after CNI ADD: the
            // whole pod, network included, is rolled back.
            "sysctl the kernel does not have",
            sysctl("net.ipv4.conf.eth0.crust_no_such_knob", "1"),
            "",
            Code::InvalidArgument,
            "crust_no_such_knob",
        ),
        (
            "bad hostname",
            edit(&|c| c.hostname = "a b".into()),
            "",
            Code::InvalidArgument,
            "config.hostname",
        ),
        (
            "bad DNS server",
            edit(&|c| {
                c.dns_config = Some(v1::DnsConfig {
                    servers: vec!["8.8.8.8\nnameserver 6.6.6.6".into()],
                    ..Default::default()
                })
            }),
            "",
            Code::InvalidArgument,
            "config.dns_config.servers[0]",
        ),
        (
            "bad host port",
            edit(&|c| {
                c.port_mappings = vec![v1::PortMapping {
                    protocol: 0,
                    container_port: 80,
                    host_port: 70000,
                    host_ip: String::new(),
                }]
            }),
            "",
            Code::InvalidArgument,
            "config.port_mappings[0].host_port",
        ),
        (
            "cgroup parent escape",
            edit(&|c| c.linux.as_mut().unwrap().cgroup_parent = "/../../x".into()),
            "",
            Code::InvalidArgument,
            "config.linux.cgroup_parent",
        ),
    ];
    for (what, config, handler, code, msg) in cases {
        let err = rt
            .run_pod_sandbox(v1::RunPodSandboxRequest {
                config,
                runtime_handler: handler.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err:?}");
        assert!(err.message().contains(msg), "{what}: {}", err.message());
        assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
    }

    // A duplicate name is refused and does not disturb the first pod.
    let first = run(&mut rt, good()).await.unwrap();
    let err = run(&mut rt, good()).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let pods = list(&mut rt, v1::PodSandboxFilter::default()).await;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].state, v1::PodSandboxState::SandboxReady as i32);
    assert_eq!(net.veths().len(), 1);
    remove(&mut rt, &first).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

/// A fake CNI plugin: a shell script in `dir`.
fn fake_plugin(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_cni_plugin_fails_cleanly() {
    let d = Daemon::start().await;
    let parent = CgroupParent::new("missing");
    let net = TestNetwork::install(&d, &[r#"{"type": "crust-no-such-plugin"}"#]);
    let mut rt = d.runtime_v1().await;
    let err = run(&mut rt, pod_config("missing", &parent))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message().contains("crust-no-such-plugin") && err.message().contains("not found"),
        "{}",
        err.message()
    );
    // Not even the bridge plugin ran.
    let bridge = std::process::Command::new("ip")
        .args(["link", "show", &net.bridge])
        .output()
        .unwrap();
    assert!(!bridge.status.success());
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_cni_plugin_rolls_the_whole_pod_back() {
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
    let d = Daemon::builder()
        .arg("--cni-bin-dir")
        .arg(format!("{}:/usr/lib/cni", bin.path().display()))
        .start()
        .await;
    let parent = CgroupParent::new("failing");
    let net = TestNetwork::install(&d, &[r#"{"type": "crust-fail"}"#]);
    let mut rt = d.runtime_v1().await;
    let err = run(&mut rt, pod_config("failing", &parent))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message().contains("refusing on purpose") && err.message().contains("crust-fail"),
        "{}",
        err.message()
    );
    // The bridge had attached the pod; DEL undid it.
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_cni_del_is_retried_by_the_next_stop_and_remove() {
    let bin = tempfile::tempdir().unwrap();
    let failed_once = bin.path().join("failed-once");
    let dels = bin.path().join("dels");
    // First in the list (DEL runs last); its DEL fails the first time.
    fake_plugin(
        bin.path(),
        "crust-flaky-del",
        &format!(
            r#"cat >/dev/null
[ "$CNI_COMMAND" = DEL ] && echo del >> {1}
if [ "$CNI_COMMAND" = DEL ] && [ ! -e {0} ]; then
  touch {0}
  echo '{{"cniVersion":"1.0.0","code":11,"msg":"try again later"}}'
  exit 1
fi
echo '{{"cniVersion":"1.0.0"}}'"#,
            failed_once.display(),
            dels.display()
        ),
    );
    let d = Daemon::builder()
        .arg("--cni-bin-dir")
        .arg(format!("{}:/usr/lib/cni", bin.path().display()))
        .start()
        .await;
    let parent = CgroupParent::new("flakydel");
    let net = TestNetwork::install(&d, &[]);
    // The flaky plugin goes in front of the bridge.
    let text = read(&net.conflist).replacen(
        r#""plugins": ["#,
        r#""plugins": [{"type": "crust-flaky-del"},"#,
        1,
    );
    std::fs::write(&net.conflist, text).unwrap();
    let mut rt = d.runtime_v1().await;
    let id = run(&mut rt, pod_config("flaky", &parent)).await.unwrap();

    let err = stop(&mut rt, &id).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message().contains("try again later"),
        "{}",
        err.message()
    );
    // Stopped all the same; the DEL is still owed.
    let (s, info) = status(&mut rt, &id).await;
    assert_eq!(s.state, v1::PodSandboxState::SandboxNotready as i32);
    assert!(ns::is_pinned(&path_of(&info, "netNamespacePath")));
    assert_eq!(read(&dels).lines().count(), 1);

    // The next Stop runs DEL again; once it succeeded, nothing more is owed.
    stop(&mut rt, &id).await.unwrap();
    assert_eq!(read(&dels).lines().count(), 2);
    stop(&mut rt, &id).await.unwrap();
    remove(&mut rt, &id).await.unwrap();
    assert_eq!(read(&dels).lines().count(), 2);
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn v1alpha2_clients_run_list_stop_and_remove_pods() {
    let d = Daemon::start().await;
    let parent = CgroupParent::new("alpha");
    let mut old = d.runtime_v1alpha2().await;
    let config = v1alpha2::PodSandboxConfig {
        metadata: Some(v1alpha2::PodSandboxMetadata {
            name: "old-client".into(),
            uid: "uid-old".into(),
            namespace: "crust-test".into(),
            attempt: 3,
        }),
        hostname: "old-client".into(),
        linux: Some(v1alpha2::LinuxPodSandboxConfig {
            cgroup_parent: parent.for_pod(),
            security_context: Some(v1alpha2::LinuxSandboxSecurityContext {
                namespace_options: Some(v1alpha2::NamespaceOption {
                    network: v1alpha2::NamespaceMode::Node as i32,
                    pid: v1alpha2::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = old
        .run_pod_sandbox(v1alpha2::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let pods = old
        .list_pod_sandbox(v1alpha2::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].id, id);
    assert_eq!(pods[0].metadata.as_ref().unwrap().attempt, 3);
    assert_eq!(
        pods[0].state,
        v1alpha2::PodSandboxState::SandboxReady as i32
    );
    let s = old
        .pod_sandbox_status(v1alpha2::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.status.unwrap().metadata.unwrap().name, "old-client");
    assert!(s.info["info"].contains("\"pid\":0"), "{:?}", s.info);
    old.stop_pod_sandbox(v1alpha2::StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    old.remove_pod_sandbox(v1alpha2::RemovePodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap();
    let mut rt = d.runtime_v1().await;
    assert_nothing_left(&d, &mut rt, &parent, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_daemon_keeps_a_ready_pod_and_its_network() {
    let mut d = Daemon::start().await;
    let parent = CgroupParent::new("restart");
    let net = TestNetwork::install(&d, &[]);
    let mut rt = d.runtime_v1().await;
    let id = run(&mut rt, pod_config("survivor", &parent)).await.unwrap();
    let (before, info) = status(&mut rt, &id).await;
    let netns = path_of(&info, "netNamespacePath");
    let inode = std::fs::metadata(&netns).unwrap().ino();
    drop(rt);

    d.restart().await;
    let mut rt = d.runtime_v1().await;
    let pods = list(&mut rt, v1::PodSandboxFilter::default()).await;
    assert_eq!(names(&pods), ["survivor"]);
    let (after, _) = status(&mut rt, &id).await;
    assert_eq!(after.state, v1::PodSandboxState::SandboxReady as i32);
    assert_eq!(after.network, before.network);
    assert_eq!(after.created_at, before.created_at);
    assert!(ns::is_pinned(&netns));
    assert_eq!(std::fs::metadata(&netns).unwrap().ino(), inode);
    // Still on the bridge: the host reaches the pod.
    let ip: IpAddr = after.network.unwrap().ip.parse().unwrap();
    let listener = listen_in(&netns, SocketAddr::new(ip, 8080));
    let mut client =
        TcpStream::connect_timeout(&SocketAddr::new(ip, 8080), Duration::from_secs(5)).unwrap();
    client.write_all(b"again").unwrap();
    assert_eq!(accept_and_read(&listener, 5), b"again");
    drop((client, listener));

    // The name is still taken, and teardown after the restart is complete.
    let err = run(&mut rt, pod_config("survivor", &parent))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    remove(&mut rt, &id).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_creation_cut_short_by_a_crash_is_undone_at_the_next_start() {
    let bin = tempfile::tempdir().unwrap();
    let pid_file = bin.path().join("slow.pid");
    fake_plugin(
        bin.path(),
        "crust-slow",
        &format!(
            r#"cat >/dev/null
if [ "$CNI_COMMAND" = ADD ]; then
  echo $$ > {}
  exec sleep 120
fi"#,
            pid_file.display()
        ),
    );
    let mut d = Daemon::builder()
        .arg("--cni-bin-dir")
        .arg(format!("{}:/usr/lib/cni", bin.path().display()))
        .start()
        .await;
    let parent = CgroupParent::new("crash");
    let net = TestNetwork::install(&d, &[r#"{"type": "crust-slow"}"#]);
    let mut rt = d.runtime_v1().await;
    let config = pod_config("crash", &parent);
    let pending = tokio::spawn(async move { run(&mut rt, config).await });

    // The bridge has attached the pod; the daemon dies during the next
    // plugin's ADD (the bridge takes longer on a slow machine).
    let deadline = Instant::now() + crust_test_support::patience(Duration::from_secs(30));
    while !pid_file.exists() {
        if pending.is_finished() {
            panic!(
                "RunPodSandbox ended before the slow plugin ran: {:?}",
                pending.await
            );
        }
        assert!(Instant::now() < deadline, "the slow plugin never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(net.veths().len(), 1);
    assert_eq!(net.leases().len(), 1);
    d.signal_and_wait(nix::sys::signal::Signal::SIGKILL, Duration::from_secs(5))
        .await;
    // The plugin dies with the daemon (its parent-death signal): nothing
    // runs on to race the recovery.
    let plugin_pid: i32 = read(&pid_file).trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while crust_test_support::process_alive(plugin_pid) {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(plugin_pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("the CNI plugin outlived the daemon");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pending.await.unwrap().is_err());
    assert!(
        !mounts_under(&d.run_dir).is_empty(),
        "the pins survive a crash"
    );

    d.start_again().await;
    let mut rt = d.runtime_v1().await;
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
    assert!(
        d.logs()
            .contains("undid a pod sandbox whose creation was interrupted"),
        "{}",
        d.logs()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_whose_namespaces_are_gone_after_a_reboot_are_not_ready() {
    let mut d = Daemon::start().await;
    let parent = CgroupParent::new("reboot");
    let mut rt = d.runtime_v1().await;
    // Host network, own IPC: pinned namespaces without needing CNI.
    let id = run(&mut rt, host_network(pod_config("rebooted", &parent)))
        .await
        .unwrap();
    drop(rt);
    let exit = d.stop().await;
    assert!(exit.success());
    // What a reboot does to the volatile run dir's mounts.
    for mount in mounts_under(&d.run_dir).into_iter().rev() {
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    d.start_again().await;
    let mut rt = d.runtime_v1().await;
    let (s, info) = status(&mut rt, &id).await;
    assert_eq!(s.state, v1::PodSandboxState::SandboxNotready as i32);
    assert_eq!(info["state"], "notready");
    remove(&mut rt, &id).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, None).await;
}

/// A CNI pod whose namespaces are gone (a reboot) leaves empty pin files
/// that are no namespaces: CNI DEL gets an empty CNI_NETNS, as for a
/// namespace that is gone, and releases the address, instead of failing
/// ("unknown FS magic") on every Stop and Remove, for good (issue 17; the
/// same state a crash between creating a pin and mounting it left, see
/// tests/crash.rs).
#[tokio::test(flavor = "multi_thread")]
async fn a_cni_pod_whose_namespaces_are_gone_is_removed_and_its_address_released() {
    let mut d = Daemon::start().await;
    let parent = CgroupParent::new("unpinned");
    let net = TestNetwork::install(&d, &[]);
    let mut rt = d.runtime_v1().await;
    let id = run(&mut rt, pod_config("unpinned", &parent)).await.unwrap();
    assert_eq!(net.leases().len(), 1);
    drop(rt);
    d.signal_and_wait(nix::sys::signal::Signal::SIGKILL, Duration::from_secs(10))
        .await;
    // What a reboot does: every mount of the run dir goes (the pin files
    // stay, empty), and so do the iptables rules.
    for mount in mounts_under(&d.run_dir).into_iter().rev() {
        nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    crust_test_support::remove_iptables_rules_mentioning(&net.name);
    let pin = d.run_dir.join("pods").join(&id).join("ns/net");
    assert!(pin.is_file() && !ns::is_pinned(&pin));
    d.start_again().await;
    let mut rt = d.runtime_v1().await;
    let (s, _) = status(&mut rt, &id).await;
    assert_eq!(s.state, v1::PodSandboxState::SandboxNotready as i32);
    stop(&mut rt, &id).await.unwrap();
    remove(&mut rt, &id).await.unwrap();
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

/// Latency of RunPodSandbox + StopPodSandbox + RemovePodSandbox over 100
/// pods, with CNI (bridge + host-local + portmap + loopback) and without
/// (host network), and the host memory a ready pod costs. A measurement,
/// not a test: `cargo test -p crust-tests --test pods -- --ignored
/// --nocapture measure_`.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn measure_pod_lifecycle_latency_and_memory() {
    const PODS: usize = 100;
    let d = Daemon::builder()
        .config("log_level = \"warn\"")
        .start()
        .await;
    let parent = CgroupParent::new("measure");
    let net = TestNetwork::install(
        &d,
        &[
            r#"{"type": "portmap", "capabilities": {"portMappings": true}}"#,
            r#"{"type": "loopback"}"#,
        ],
    );
    let mut rt = d.runtime_v1().await;
    for with_cni in [false, true] {
        let config = |i: usize| {
            let c = pod_config(&format!("m{i}"), &parent);
            if with_cni { c } else { host_network(c) }
        };
        // Warm up.
        let id = run(&mut rt, config(PODS)).await.unwrap();
        remove(&mut rt, &id).await.unwrap();

        let mut lat = Vec::with_capacity(PODS);
        let (mut runs, mut stops, mut removes) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..PODS {
            let t = Instant::now();
            let id = run(&mut rt, config(i)).await.unwrap();
            let t_run = t.elapsed();
            stop(&mut rt, &id).await.unwrap();
            let t_stop = t.elapsed();
            remove(&mut rt, &id).await.unwrap();
            lat.push(t.elapsed());
            runs.push(t_run);
            stops.push(t_stop - t_run);
            removes.push(t.elapsed() - t_stop);
        }
        for v in [&mut lat, &mut runs, &mut stops, &mut removes] {
            v.sort();
        }
        let label = if with_cni {
            "with CNI"
        } else {
            "host network, no CNI"
        };
        println!(
            "run+stop+remove, {label}: p50 {:?} p99 {:?} max {:?} \
             (p50 of run {:?}, stop {:?}, remove {:?})",
            lat[PODS / 2],
            lat[PODS * 99 / 100],
            lat[PODS - 1],
            runs[PODS / 2],
            stops[PODS / 2],
            removes[PODS / 2],
        );

        // Memory: 100 ready pods.
        let rss_before = daemon_rss_kib(&d);
        let before = meminfo();
        let mut ids = Vec::new();
        let t = Instant::now();
        for i in 0..PODS {
            ids.push(run(&mut rt, config(i)).await.unwrap());
        }
        let run_all = t.elapsed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = meminfo();
        let rss_after = daemon_rss_kib(&d);
        let grow = |k: &str| (after[k] as i64 - before[k] as i64) / PODS as i64;
        println!(
            "{PODS} ready pods, {label}: {run_all:?} to run them; change per pod (KiB): \
             MemAvailable {}, MemFree {}, Slab {} (SUnreclaim {}), Percpu {}, Shmem {}, \
             PageTables {}, KernelStack {}; daemon RSS {} -> {} KiB",
            grow("MemAvailable"),
            grow("MemFree"),
            grow("Slab"),
            grow("SUnreclaim"),
            grow("Percpu"),
            grow("Shmem"),
            grow("PageTables"),
            grow("KernelStack"),
            rss_before,
            rss_after,
        );
        let t = Instant::now();
        for id in &ids {
            remove(&mut rt, id).await.unwrap();
        }
        println!("removing them: {:?}", t.elapsed());
    }
    assert_nothing_left(&d, &mut rt, &parent, Some(&net)).await;
}

fn daemon_rss_kib(d: &Daemon) -> u64 {
    read(Path::new(&format!("/proc/{}/status", d.pid())))
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn meminfo() -> HashMap<String, u64> {
    read(Path::new("/proc/meminfo"))
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}
