//! RunPodSandbox's request, checked: everything a client sends is hostile
//! until it passes here. Errors name the field (`config.metadata.name:
//! required`). Nothing on the host is touched.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::{Component, Path};

use crust_api::v1::{NamespaceMode, PodSandboxConfig, Protocol, RunPodSandboxRequest};
use crust_linux::{ns, sysctl};
use crust_network::{Bandwidth, PortMapping};

use super::error::PodError;
use super::record::PodMetadata;
use crust_quote::quote;

/// The default runtime handler only (unit tests).
#[cfg(test)]
pub const RUNTIME_HANDLERS: &[&str] = &[""];

/// Bounds on lists a client fills (kubelet's own limits are lower).
const MAX_SYSCTLS: usize = 128;
const MAX_DNS_SERVERS: usize = 16;
const MAX_DNS_SEARCHES: usize = 32;
const MAX_DNS_OPTIONS: usize = 32;
const MAX_DNS_ENTRY_LEN: usize = 253;
const MAX_PORT_MAPPINGS: usize = 1024;
/// Metadata values become CNI_ARGS, which allow at most this much.
const MAX_METADATA_LEN: usize = 253;
const MAX_PATH_LEN: usize = 4096;

const INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";

/// A pod's DNS settings for its resolv.conf (and the CNI `dns` capability).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsSpec {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// `userns_options`: NODE, or POD with exactly one uid and one gid mapping
/// of the same length that map container ID 0 (what kubelet sends and the
/// CRI allows), in a pod with its own IPC and PID namespaces. The node's
/// network is allowed (kubelet's UserNamespacesHostNetworkSupport): the
/// pod's user namespace then owns its IPC namespace only, and containers
/// get the node's /sys by bind mount (crates/oci), since a user namespace
/// cannot mount sysfs for a network namespace it does not own.
fn user_namespace(
    u: &crust_api::v1::UserNamespace,
    host_ipc: bool,
    host_pid: bool,
) -> Result<Option<ns::UserNsMappings>, PodError> {
    const F: &str = "config.linux.security_context.namespace_options.userns_options";
    match mode(u.mode, &format!("{F}.mode"))? {
        NamespaceMode::Node => return Ok(None),
        NamespaceMode::Pod => {}
        other => {
            return Err(PodError::invalid(
                &format!("{F}.mode"),
                format!(
                    "{} is not a pod user namespace mode (POD or NODE)",
                    other.as_str_name()
                ),
            ));
        }
    }
    for (name, host) in [("ipc", host_ipc), ("pid", host_pid)] {
        if host {
            return Err(PodError::invalid(
                &format!("{F}.mode"),
                format!("a pod in a user namespace cannot use the node's {name} namespace"),
            ));
        }
    }
    let one = |name: &str, maps: &[crust_api::v1::IdMapping]| -> Result<ns::IdMap, PodError> {
        let field = format!("{F}.{name}");
        let [m] = maps else {
            return Err(PodError::invalid(
                &field,
                format!("exactly one mapping is supported, got {}", maps.len()),
            ));
        };
        if m.container_id != 0 {
            return Err(PodError::invalid(
                &field,
                format!(
                    "container ID 0 must be mapped (the mapping starts at {})",
                    m.container_id
                ),
            ));
        }
        if m.length == 0 || m.host_id.checked_add(m.length - 1).is_none() {
            return Err(PodError::invalid(
                &field,
                format!("bad range: host ID {} length {}", m.host_id, m.length),
            ));
        }
        if m.host_id == 0 {
            return Err(PodError::invalid(
                &field,
                "must not map the node's root (host ID 0)",
            ));
        }
        Ok(ns::IdMap {
            container_id: m.container_id,
            host_id: m.host_id,
            length: m.length,
        })
    };
    let uids = one("uids", &u.uids)?;
    let gids = one("gids", &u.gids)?;
    // kubelet maps uids and gids alike; with lengths apart, ids that exist
    // as a uid have no gid (or the reverse), and the pause process failed
    // only later, as an Internal error.
    if gids.length != uids.length {
        return Err(PodError::invalid(
            &format!("{F}.gids"),
            format!(
                "the gid mapping's length {} differs from the uid mapping's {}",
                gids.length, uids.length
            ),
        ));
    }
    Ok(Some(ns::UserNsMappings {
        uids: vec![uids],
        gids: vec![gids],
    }))
}

/// A validated RunPodSandbox request.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSpec {
    pub metadata: PodMetadata,
    pub runtime_handler: String,
    /// As requested; empty means the node's hostname.
    pub hostname: String,
    pub log_directory: String,
    /// None: copy the node's resolv.conf.
    pub dns: Option<DnsSpec>,
    /// Only those with a host port (the others are informational).
    pub port_mappings: Vec<PortMapping>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub cgroup_parent: String,
    /// Sorted by name.
    pub sysctls: Vec<(String, String)>,
    pub host_network: bool,
    pub host_ipc: bool,
    pub host_pid: bool,
    /// userns_options mode POD: the pod's user namespace mappings.
    pub userns: Option<ns::UserNsMappings>,
    /// From the bandwidth annotations kubelet sets.
    pub bandwidth: Option<Bandwidth>,
    pub config: PodSandboxConfig,
}

impl PodSpec {
    #[cfg(test)]
    pub fn from_request(req: RunPodSandboxRequest) -> Result<PodSpec, PodError> {
        let handlers: Vec<String> = RUNTIME_HANDLERS.iter().map(|h| h.to_string()).collect();
        Self::from_request_with(req, &handlers)
    }

    /// Validates the request; `handlers` are the node's runtime handlers.
    pub fn from_request_with(
        req: RunPodSandboxRequest,
        handlers: &[String],
    ) -> Result<PodSpec, PodError> {
        let handler = req.runtime_handler;
        if !handlers.contains(&handler) {
            return Err(PodError::invalid(
                "runtime_handler",
                format!("unknown runtime handler {handler:?} (this node has {handlers:?})"),
            ));
        }
        let config = req
            .config
            .ok_or_else(|| PodError::invalid("config", "required"))?;
        let md = config
            .metadata
            .as_ref()
            .ok_or_else(|| PodError::invalid("config.metadata", "required"))?;
        let metadata = PodMetadata {
            name: check_metadata("config.metadata.name", &md.name)?,
            uid: check_metadata("config.metadata.uid", &md.uid)?,
            namespace: check_metadata("config.metadata.namespace", &md.namespace)?,
            attempt: md.attempt,
        };

        let linux = config.linux.clone().unwrap_or_default();
        let ns_opts = linux
            .security_context
            .as_ref()
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        const NS: &str = "config.linux.security_context.namespace_options";
        let host_network = match mode(ns_opts.network, &format!("{NS}.network"))? {
            NamespaceMode::Pod => false,
            NamespaceMode::Node => true,
            other => {
                return Err(PodError::invalid(
                    &format!("{NS}.network"),
                    format!(
                        "{} is not a pod network mode (POD or NODE)",
                        other.as_str_name()
                    ),
                ));
            }
        };
        let host_ipc = match mode(ns_opts.ipc, &format!("{NS}.ipc"))? {
            NamespaceMode::Pod => false,
            NamespaceMode::Node => true,
            other => {
                return Err(PodError::invalid(
                    &format!("{NS}.ipc"),
                    format!(
                        "{} is not a pod IPC mode (POD or NODE)",
                        other.as_str_name()
                    ),
                ));
            }
        };
        // POD: a pause process holds the shared PID namespace (pods::pause).
        let host_pid = match mode(ns_opts.pid, &format!("{NS}.pid"))? {
            NamespaceMode::Container | NamespaceMode::Pod => false,
            NamespaceMode::Node => true,
            NamespaceMode::Target => {
                return Err(PodError::invalid(
                    &format!("{NS}.pid"),
                    "TARGET is a container's mode, not a pod's",
                ));
            }
        };
        let userns = match &ns_opts.userns_options {
            Some(u) => user_namespace(u, host_ipc, host_pid)?,
            None => None,
        };

        if !config.hostname.is_empty() {
            ns::validate_hostname(&config.hostname)
                .map_err(|e| PodError::invalid("config.hostname", e))?;
        }

        // Either driver's spelling here; `Pods::plan` checks it for the
        // driver in use.
        crust_cgroups::CgroupParent::parse_any(&linux.cgroup_parent)
            .map_err(|e| PodError::cgroup("config.linux.cgroup_parent", e))?;

        if linux.sysctls.len() > MAX_SYSCTLS {
            return Err(PodError::invalid(
                "config.linux.sysctls",
                format!("more than {MAX_SYSCTLS} sysctls"),
            ));
        }
        let mut sysctls: Vec<(String, String)> = linux.sysctls.clone().into_iter().collect();
        sysctls.sort();
        let own = sysctl::PodNamespaces {
            net: !host_network,
            ipc: !host_ipc,
        };
        sysctl::validate_all(sysctls.iter().map(|(k, v)| (k.as_str(), v.as_str())), own)
            .map_err(|e| PodError::invalid("config.linux.sysctls", e))?;

        let dns = config.dns_config.as_ref().map(check_dns).transpose()?;
        let dns = dns.filter(|d| *d != DnsSpec::default());
        let port_mappings = check_port_mappings(&config.port_mappings)?;
        check_log_directory(&config.log_directory)?;
        let bandwidth = bandwidth(&config.annotations)?;

        Ok(PodSpec {
            metadata,
            runtime_handler: handler,
            hostname: config.hostname.clone(),
            log_directory: config.log_directory.clone(),
            dns,
            port_mappings,
            labels: config.labels.clone().into_iter().collect(),
            annotations: config.annotations.clone().into_iter().collect(),
            cgroup_parent: linux.cgroup_parent.clone(),
            sysctls,
            host_network,
            host_ipc,
            host_pid,
            userns,
            bandwidth,
            config,
        })
    }
}

fn mode(value: i32, field: &str) -> Result<NamespaceMode, PodError> {
    NamespaceMode::try_from(value)
        .map_err(|_| PodError::invalid(field, format!("unknown namespace mode {value}")))
}

/// Name, namespace and uid: required, and safe as CNI_ARGS values.
fn check_metadata(field: &str, value: &str) -> Result<String, PodError> {
    if value.is_empty() {
        return Err(PodError::invalid(field, "required"));
    }
    if value.len() > MAX_METADATA_LEN {
        return Err(PodError::invalid(
            field,
            format!("longer than {MAX_METADATA_LEN} bytes"),
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| c.is_control() || *c == ';' || *c == '=')
    {
        return Err(PodError::invalid(
            field,
            format!(
                "{} contains {c:?} (no control characters, ';' or '=')",
                quote(value)
            ),
        ));
    }
    Ok(value.to_string())
}

fn check_dns(dns: &crust_api::v1::DnsConfig) -> Result<DnsSpec, PodError> {
    let lists = [
        ("servers", &dns.servers, MAX_DNS_SERVERS),
        ("searches", &dns.searches, MAX_DNS_SEARCHES),
        ("options", &dns.options, MAX_DNS_OPTIONS),
    ];
    for (name, list, max) in lists {
        if list.len() > max {
            return Err(PodError::invalid(
                &format!("config.dns_config.{name}"),
                format!("more than {max} entries"),
            ));
        }
    }
    for (i, server) in dns.servers.iter().enumerate() {
        if server.parse::<IpAddr>().is_err() {
            return Err(PodError::invalid(
                &format!("config.dns_config.servers[{i}]"),
                format!("{} is not an IP address", quote(server)),
            ));
        }
    }
    for (name, list) in [("searches", &dns.searches), ("options", &dns.options)] {
        for (i, entry) in list.iter().enumerate() {
            let field = format!("config.dns_config.{name}[{i}]");
            if entry.is_empty() {
                return Err(PodError::invalid(&field, "empty"));
            }
            if entry.len() > MAX_DNS_ENTRY_LEN {
                return Err(PodError::invalid(
                    &field,
                    format!("longer than {MAX_DNS_ENTRY_LEN} bytes"),
                ));
            }
            // One resolv.conf token: printable ASCII, no whitespace.
            if let Some(c) = entry.chars().find(|c| !c.is_ascii_graphic()) {
                return Err(PodError::invalid(
                    &field,
                    format!(
                        "{} contains {c:?} (whitespace, control or non-ASCII)",
                        quote(entry)
                    ),
                ));
            }
        }
    }
    Ok(DnsSpec {
        servers: dns.servers.clone(),
        searches: dns.searches.clone(),
        options: dns.options.clone(),
    })
}

fn check_port_mappings(
    mappings: &[crust_api::v1::PortMapping],
) -> Result<Vec<PortMapping>, PodError> {
    if mappings.len() > MAX_PORT_MAPPINGS {
        return Err(PodError::invalid(
            "config.port_mappings",
            format!("more than {MAX_PORT_MAPPINGS} entries"),
        ));
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (i, p) in mappings.iter().enumerate() {
        let field = |f: &str| format!("config.port_mappings[{i}].{f}");
        let protocol = match Protocol::try_from(p.protocol) {
            Ok(Protocol::Tcp) => crust_network::Protocol::Tcp,
            Ok(Protocol::Udp) => crust_network::Protocol::Udp,
            Ok(Protocol::Sctp) => crust_network::Protocol::Sctp,
            Err(_) => {
                return Err(PodError::invalid(
                    &field("protocol"),
                    format!("unknown protocol {}", p.protocol),
                ));
            }
        };
        if !(0..=65535).contains(&p.host_port) {
            return Err(PodError::invalid(
                &field("host_port"),
                format!("{} is not a port (0-65535)", p.host_port),
            ));
        }
        let min_container_port = if p.host_port > 0 { 1 } else { 0 };
        if !(min_container_port..=65535).contains(&p.container_port) {
            return Err(PodError::invalid(
                &field("container_port"),
                format!("{} is not a port (1-65535)", p.container_port),
            ));
        }
        if !p.host_ip.is_empty() && p.host_ip.parse::<IpAddr>().is_err() {
            return Err(PodError::invalid(
                &field("host_ip"),
                format!("{:?} is not an IP address", p.host_ip),
            ));
        }
        if p.host_port == 0 {
            continue;
        }
        if !seen.insert((p.host_ip.clone(), p.host_port, p.protocol)) {
            return Err(PodError::invalid(
                &field("host_port"),
                format!(
                    "host port {}/{} on {:?} is mapped twice",
                    p.host_port,
                    protocol_name(protocol),
                    p.host_ip
                ),
            ));
        }
        out.push(PortMapping {
            host_port: p.host_port,
            container_port: p.container_port,
            protocol,
            host_ip: p.host_ip.clone(),
        });
    }
    Ok(out)
}

fn protocol_name(p: crust_network::Protocol) -> &'static str {
    match p {
        crust_network::Protocol::Tcp => "tcp",
        crust_network::Protocol::Udp => "udp",
        crust_network::Protocol::Sctp => "sctp",
    }
}

/// Containers' log files go below it: an absolute, plain path.
fn check_log_directory(dir: &str) -> Result<(), PodError> {
    const FIELD: &str = "config.log_directory";
    if dir.is_empty() {
        return Ok(());
    }
    if dir.len() > MAX_PATH_LEN {
        return Err(PodError::invalid(FIELD, "too long"));
    }
    if dir.chars().any(char::is_control) {
        return Err(PodError::invalid(
            FIELD,
            format!("{} contains control characters", quote(dir)),
        ));
    }
    let path = Path::new(dir);
    if !path.is_absolute() {
        return Err(PodError::invalid(
            FIELD,
            format!("{} is not an absolute path", quote(dir)),
        ));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(PodError::invalid(
            FIELD,
            format!("{} contains '..'", quote(dir)),
        ));
    }
    Ok(())
}

/// kubelet's bandwidth annotations (a Kubernetes quantity in bits per
/// second), as containerd passes them to the CNI `bandwidth` capability.
fn bandwidth(
    annotations: &std::collections::HashMap<String, String>,
) -> Result<Option<Bandwidth>, PodError> {
    let parse = |key: &str| -> Result<Option<u64>, PodError> {
        let Some(value) = annotations.get(key) else {
            return Ok(None);
        };
        let field = format!("config.annotations[{}]", quote(key));
        let bits = parse_quantity(value).ok_or_else(|| {
            PodError::invalid(&field, format!("{} is not a quantity", quote(value)))
        })?;
        // kubelet's own bounds: 1k to 1P bits per second.
        if !(1_000..=1_000_000_000_000_000).contains(&bits) {
            return Err(PodError::invalid(
                &field,
                format!("{} is outside 1k..1P bits per second", quote(value)),
            ));
        }
        Ok(Some(bits))
    };
    let ingress = parse(INGRESS_BANDWIDTH)?;
    let egress = parse(EGRESS_BANDWIDTH)?;
    if ingress.is_none() && egress.is_none() {
        return Ok(None);
    }
    // The burst containerd passes: effectively unlimited.
    let burst = u64::from(u32::MAX);
    Ok(Some(Bandwidth {
        ingress_rate: ingress,
        ingress_burst: ingress.map(|_| burst),
        egress_rate: egress,
        egress_burst: egress.map(|_| burst),
    }))
}

/// A Kubernetes quantity (`10M`, `1.5Gi`, `100000`) as an integer, rounded
/// up. None for anything else.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() || int.len() > 20 || frac.len() > 9 {
        return None;
    }
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let scale = 10u128.pow(frac.len() as u32);
    let digits: u128 = format!("{int}{frac}").parse().ok()?;
    let value = digits.checked_mul(multiplier)?.div_ceil(scale);
    u64::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::{
        DnsConfig, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceOption,
        PodSandboxMetadata, UserNamespace,
    };

    fn request() -> RunPodSandboxRequest {
        RunPodSandboxRequest {
            config: Some(PodSandboxConfig {
                metadata: Some(PodSandboxMetadata {
                    name: "web-0".into(),
                    uid: "8d1f".into(),
                    namespace: "default".into(),
                    attempt: 1,
                }),
                hostname: "web-0".into(),
                linux: Some(LinuxPodSandboxConfig {
                    security_context: Some(LinuxSandboxSecurityContext {
                        namespace_options: Some(NamespaceOption {
                            pid: NamespaceMode::Container as i32,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
        }
    }

    fn with(f: impl FnOnce(&mut PodSandboxConfig)) -> RunPodSandboxRequest {
        let mut req = request();
        f(req.config.as_mut().unwrap());
        req
    }

    fn ns_opts(c: &mut PodSandboxConfig) -> &mut NamespaceOption {
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

    fn invalid(req: RunPodSandboxRequest) -> String {
        match PodSpec::from_request(req) {
            Err(PodError::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn user_namespaces_need_one_mapping_of_container_id_0() {
        let map = |container_id, host_id, length| crust_api::v1::IdMapping {
            container_id,
            host_id,
            length,
        };
        let userns = |mode: NamespaceMode, uids: Vec<_>, gids: Vec<_>| {
            with(move |c| {
                ns_opts(c).userns_options = Some(UserNamespace {
                    mode: mode as i32,
                    uids,
                    gids,
                })
            })
        };
        let good = vec![map(0, 100000, 65536)];
        let spec =
            PodSpec::from_request(userns(NamespaceMode::Pod, good.clone(), good.clone())).unwrap();
        let m = spec.userns.unwrap();
        assert_eq!(
            (m.uids[0].container_id, m.uids[0].host_id, m.uids[0].length),
            (0, 100000, 65536)
        );
        const F: &str = "config.linux.security_context.namespace_options.userns_options";
        let field = |req| invalid(req).split(':').next().unwrap().to_string();
        let two = vec![map(0, 1000, 10), map(10, 2000, 10)];
        assert_eq!(
            field(userns(NamespaceMode::Pod, two, good.clone())),
            format!("{F}.uids")
        );
        let not0 = vec![map(1, 1000, 100000)];
        assert_eq!(
            field(userns(NamespaceMode::Pod, good.clone(), not0)),
            format!("{F}.gids")
        );
        let shorter = vec![map(0, 100000, 65535)];
        let err = invalid(userns(NamespaceMode::Pod, good.clone(), shorter));
        assert!(err.starts_with(&format!("{F}.gids:")), "{err}");
        assert!(err.contains("65535") && err.contains("65536"), "{err}");
        let overflow = vec![map(0, u32::MAX, 2)];
        assert_eq!(
            field(userns(NamespaceMode::Pod, overflow, good.clone())),
            format!("{F}.uids")
        );
        for mode in [NamespaceMode::Container, NamespaceMode::Target] {
            assert_eq!(field(userns(mode, vec![], vec![])), format!("{F}.mode"));
        }
        // The node's network is allowed with a user namespace; its IPC and
        // PID namespaces are not.
        let mut host_net = userns(NamespaceMode::Pod, good.clone(), good.clone());
        ns_opts(host_net.config.as_mut().unwrap()).network = NamespaceMode::Node as i32;
        let spec = PodSpec::from_request(host_net).unwrap();
        assert!(spec.host_network && spec.userns.is_some());
        for host in [
            |o: &mut crust_api::v1::NamespaceOption| o.ipc = NamespaceMode::Node as i32,
            |o: &mut crust_api::v1::NamespaceOption| o.pid = NamespaceMode::Node as i32,
        ] {
            let mut req = userns(NamespaceMode::Pod, good.clone(), good.clone());
            host(ns_opts(req.config.as_mut().unwrap()));
            assert_eq!(field(req), format!("{F}.mode"));
        }
        let node = PodSpec::from_request(userns(NamespaceMode::Node, vec![], vec![])).unwrap();
        assert_eq!(node.userns, None);
    }

    #[test]
    fn a_plain_pod_is_accepted() {
        let spec = PodSpec::from_request(request()).unwrap();
        assert_eq!(spec.metadata.name, "web-0");
        assert_eq!(spec.metadata.attempt, 1);
        assert!(!spec.host_network && !spec.host_ipc && !spec.host_pid);
        assert_eq!(spec.dns, None);
        assert!(spec.port_mappings.is_empty());
        assert_eq!(spec.bandwidth, None);
    }

    #[test]
    fn metadata_is_required_field_by_field() {
        let msg = invalid(RunPodSandboxRequest::default());
        assert_eq!(msg, "config: required");
        let msg = invalid(with(|c| c.metadata = None));
        assert_eq!(msg, "config.metadata: required");
        for (field, f) in [
            (
                "name",
                (|m: &mut PodSandboxMetadata| m.name.clear()) as fn(&mut _),
            ),
            ("uid", |m| m.uid.clear()),
            ("namespace", |m| m.namespace.clear()),
        ] {
            let msg = invalid(with(|c| f(c.metadata.as_mut().unwrap())));
            assert_eq!(msg, format!("config.metadata.{field}: required"));
        }
        for bad in ["a;K8S_POD_NAMESPACE=x", "a\nb", &"x".repeat(254)] {
            let msg = invalid(with(|c| c.metadata.as_mut().unwrap().name = bad.into()));
            assert!(msg.starts_with("config.metadata.name: "), "{msg}");
        }
    }

    #[test]
    fn unknown_runtime_handlers_are_named() {
        let mut req = request();
        req.runtime_handler = "kata".into();
        let msg = invalid(req);
        assert!(
            msg.starts_with("runtime_handler: ") && msg.contains("\"kata\""),
            "{msg}"
        );
    }

    #[test]
    fn namespace_modes() {
        let spec = PodSpec::from_request(with(|c| {
            let o = ns_opts(c);
            o.network = NamespaceMode::Node as i32;
            o.ipc = NamespaceMode::Node as i32;
            o.pid = NamespaceMode::Node as i32;
            o.userns_options = Some(UserNamespace {
                mode: NamespaceMode::Node as i32,
                ..Default::default()
            });
        }))
        .unwrap();
        assert!(spec.host_network && spec.host_ipc && spec.host_pid);

        let spec =
            PodSpec::from_request(with(|c| ns_opts(c).pid = NamespaceMode::Pod as i32)).unwrap();
        assert!(!spec.host_pid);
        // No security context at all means pid POD, as in proto3.
        let mut req = request();
        req.config.as_mut().unwrap().linux = None;
        assert!(!PodSpec::from_request(req).unwrap().host_pid);
        // userns POD (the default mode) needs its mappings.
        let msg = invalid(with(|c| {
            ns_opts(c).userns_options = Some(UserNamespace::default())
        }));
        assert!(
            msg.starts_with("config.linux.security_context.namespace_options.userns_options.uids:"),
            "{msg}"
        );
        let msg = invalid(with(|c| {
            ns_opts(c).network = NamespaceMode::Container as i32
        }));
        assert!(msg.contains("namespace_options.network"), "{msg}");
        let msg = invalid(with(|c| ns_opts(c).ipc = 17));
        assert!(msg.contains("unknown namespace mode 17"), "{msg}");
        let msg = invalid(with(|c| ns_opts(c).pid = NamespaceMode::Target as i32));
        assert!(msg.contains("namespace_options.pid"), "{msg}");
    }

    #[test]
    fn hostnames_and_cgroup_parents_are_checked() {
        let msg = invalid(with(|c| c.hostname = "bad host\n127.0.0.1 evil".into()));
        assert!(msg.starts_with("config.hostname: "), "{msg}");
        let msg = invalid(with(|c| {
            c.linux.as_mut().unwrap().cgroup_parent = "/kubepods/../../etc".into()
        }));
        assert!(msg.starts_with("config.linux.cgroup_parent: "), "{msg}");
    }

    #[test]
    fn sysctls_must_be_namespaced_and_clean() {
        let set = |name: &str, value: &str| {
            let (name, value) = (name.to_string(), value.to_string());
            with(move |c| {
                c.linux.as_mut().unwrap().sysctls.insert(name, value);
            })
        };
        let spec = PodSpec::from_request(set("net.core.somaxconn", "1024")).unwrap();
        assert_eq!(spec.sysctls, [("net.core.somaxconn".into(), "1024".into())]);
        for (name, value, why) in [
            ("kernel.panic", "1", "not a namespaced sysctl"),
            (
                "net.core.somaxconn",
                "1\nkernel.core_pattern=|/x",
                "newline",
            ),
            ("net/../../x", "1", "'/'"),
        ] {
            let msg = invalid(set(name, value));
            assert!(
                msg.starts_with("config.linux.sysctls: ") && msg.contains(why),
                "{msg}"
            );
        }
        // net.* needs the pod's own network namespace.
        let msg = invalid(with(|c| {
            ns_opts(c).network = NamespaceMode::Node as i32;
            c.linux
                .as_mut()
                .unwrap()
                .sysctls
                .insert("net.core.somaxconn".into(), "1".into());
        }));
        assert!(msg.contains("host network"), "{msg}");
    }

    #[test]
    fn dns_config_is_checked_entry_by_entry() {
        let dns = |servers: &[&str], searches: &[&str], options: &[&str]| {
            let d = DnsConfig {
                servers: servers.iter().map(|s| s.to_string()).collect(),
                searches: searches.iter().map(|s| s.to_string()).collect(),
                options: options.iter().map(|s| s.to_string()).collect(),
            };
            with(move |c| c.dns_config = Some(d))
        };
        let spec = PodSpec::from_request(dns(
            &["10.96.0.10", "fd00::a"],
            &["default.svc.cluster.local"],
            &["ndots:5"],
        ))
        .unwrap();
        assert_eq!(spec.dns.unwrap().servers, ["10.96.0.10", "fd00::a"]);
        // All empty: the node's resolv.conf.
        assert_eq!(PodSpec::from_request(dns(&[], &[], &[])).unwrap().dns, None);
        for (req, field) in [
            (dns(&["dns.example"], &[], &[]), "servers[0]"),
            (
                dns(&["1.1.1.1", "1.1.1.1\nnameserver 6.6.6.6"], &[], &[]),
                "servers[1]",
            ),
            (dns(&[], &["a b"], &[]), "searches[0]"),
            (dns(&[], &["ok", "x\ny"], &[]), "searches[1]"),
            (dns(&[], &[""], &[]), "searches[0]"),
            (
                dns(&[], &[], &["ndots:5\nnameserver 6.6.6.6"]),
                "options[0]",
            ),
            (dns(&[], &[], &["ü"]), "options[0]"),
            (dns(&[], &[&"a".repeat(254)], &[]), "searches[0]"),
        ] {
            let msg = invalid(req);
            assert!(
                msg.starts_with(&format!("config.dns_config.{field}: ")),
                "{msg}"
            );
        }
        let many: Vec<&str> = vec!["a"; MAX_DNS_SEARCHES + 1];
        assert!(invalid(dns(&[], &many, &[])).contains("more than"));
    }

    #[test]
    fn port_mappings_are_checked() {
        let pm = |host_port: i32, container_port: i32, protocol: i32, host_ip: &str| {
            crust_api::v1::PortMapping {
                protocol,
                container_port,
                host_port,
                host_ip: host_ip.into(),
            }
        };
        let req = |maps: Vec<crust_api::v1::PortMapping>| with(move |c| c.port_mappings = maps);
        let spec = PodSpec::from_request(req(vec![
            pm(8080, 80, Protocol::Tcp as i32, ""),
            pm(0, 9090, 0, ""),
            pm(5353, 53, Protocol::Udp as i32, "127.0.0.1"),
        ]))
        .unwrap();
        // Mappings without a host port are informational only.
        assert_eq!(spec.port_mappings.len(), 2);
        assert_eq!(spec.port_mappings[1].protocol, crust_network::Protocol::Udp);
        for (maps, field) in [
            (vec![pm(70000, 80, 0, "")], "[0].host_port"),
            (vec![pm(-1, 80, 0, "")], "[0].host_port"),
            (vec![pm(80, 0, 0, "")], "[0].container_port"),
            (vec![pm(80, 80, 9, "")], "[0].protocol"),
            (vec![pm(80, 80, 0, "localhost; rm -rf")], "[0].host_ip"),
            (vec![pm(80, 80, 0, ""), pm(80, 81, 0, "")], "[1].host_port"),
        ] {
            let msg = invalid(req(maps));
            assert!(
                msg.starts_with(&format!("config.port_mappings{field}: ")),
                "{msg}"
            );
        }
        // The same port over two protocols is fine.
        PodSpec::from_request(req(vec![
            pm(53, 53, Protocol::Tcp as i32, ""),
            pm(53, 53, Protocol::Udp as i32, ""),
        ]))
        .unwrap();
    }

    #[test]
    fn log_directories_must_be_plain_absolute_paths() {
        PodSpec::from_request(with(|c| c.log_directory = "/var/log/pods/x".into())).unwrap();
        for bad in ["relative/dir", "/var/log/../../etc", "/var/log\n"] {
            let msg = invalid(with(|c| c.log_directory = bad.into()));
            assert!(msg.starts_with("config.log_directory: "), "{msg}");
        }
    }

    #[test]
    fn bandwidth_annotations_become_the_capability() {
        let spec = PodSpec::from_request(with(|c| {
            c.annotations.insert(INGRESS_BANDWIDTH.into(), "10M".into());
        }))
        .unwrap();
        let bw = spec.bandwidth.unwrap();
        assert_eq!(bw.ingress_rate, Some(10_000_000));
        assert_eq!(bw.ingress_burst, Some(u64::from(u32::MAX)));
        assert_eq!(bw.egress_rate, None);
        for bad in ["fast", "10X", "1", "2P"] {
            let msg = invalid(with(|c| {
                c.annotations.insert(EGRESS_BANDWIDTH.into(), bad.into());
            }));
            assert!(msg.contains(EGRESS_BANDWIDTH), "{msg}");
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("100000"), Some(100_000));
        assert_eq!(parse_quantity("10M"), Some(10_000_000));
        assert_eq!(parse_quantity("1.5k"), Some(1_500));
        assert_eq!(parse_quantity("1Mi"), Some(1 << 20));
        assert_eq!(parse_quantity("0.0001k"), Some(1));
        for bad in [
            "",
            "k",
            "1.2.3",
            "-1",
            "1 k",
            "1e3",
            "1m",
            "99999999999999999999E",
            "99999999999999999999.999999999E",
        ] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
    }
}
