//! What the runtime tells CNI plugins about a pod: the attachment
//! (container ID, netns, interface, pod identity), CNI_ARGS and the
//! runtimeConfig capabilities. All of it is client input, checked here.

use std::net::IpAddr;
use std::path::PathBuf;

use crust_quote::quote;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::Error;
use crate::result::parse_cidr;

/// The pod's interface name, as kubelet's runtimes use.
pub const DEFAULT_IFNAME: &str = "eth0";

/// Which pod a CNI operation is for, and how it is attached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The sandbox ID (CNI_CONTAINERID, K8S_POD_INFRA_CONTAINER_ID).
    pub container_id: String,
    /// The pinned network namespace (CNI_NETNS).
    pub netns: PathBuf,
    /// CNI_IFNAME, normally [`DEFAULT_IFNAME`].
    pub ifname: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// Handed to the plugins that declare the matching capability. DEL
    /// needs the same values as ADD (portmap finds its rules by them).
    pub capabilities: RuntimeCapabilities,
}

/// runtimeConfig values, each passed only to plugins whose `capabilities`
/// ask for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeCapabilities {
    /// `portMappings`; entries without a host port are not passed.
    pub port_mappings: Vec<PortMapping>,
    /// `bandwidth` (from kubelet's ingress/egress-bandwidth annotations).
    pub bandwidth: Option<Bandwidth>,
    /// `dns` (the pod's DNSConfig).
    pub dns: Option<DnsConfig>,
    /// `ipRanges`: range sets, each a list of subnets (CIDR).
    pub ip_ranges: Vec<Vec<String>>,
    /// `cgroupPath`: the pod cgroup.
    pub cgroup_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    /// 0: no host port, the mapping is not for CNI.
    pub host_port: i32,
    pub container_port: i32,
    pub protocol: Protocol,
    /// Empty: all host addresses.
    pub host_ip: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Rates in bits per second, bursts in bits, as the bandwidth plugin takes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bandwidth {
    pub ingress_rate: Option<u64>,
    pub ingress_burst: Option<u64>,
    pub egress_rate: Option<u64>,
    pub egress_burst: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// runtimeConfig for one plugin: the capabilities it declares `true` for
/// and the runtime has values for; None when that is nothing.
pub fn runtime_config(plugin: &Value, caps: &RuntimeCapabilities) -> Option<Map<String, Value>> {
    let declared = |name: &str| {
        plugin
            .get("capabilities")
            .and_then(|c| c.get(name))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let mut rc = Map::new();
    let ports: Vec<Value> = caps
        .port_mappings
        .iter()
        .filter(|p| p.host_port > 0)
        .map(|p| {
            let mut m = json!({
                "hostPort": p.host_port,
                "containerPort": p.container_port,
                "protocol": p.protocol.as_str(),
            });
            if !p.host_ip.is_empty() {
                m["hostIP"] = Value::String(p.host_ip.clone());
            }
            m
        })
        .collect();
    if declared("portMappings") && !ports.is_empty() {
        rc.insert("portMappings".into(), Value::Array(ports));
    }
    if let (true, Some(bw)) = (declared("bandwidth"), &caps.bandwidth) {
        let mut m = Map::new();
        for (key, value) in [
            ("ingressRate", bw.ingress_rate),
            ("ingressBurst", bw.ingress_burst),
            ("egressRate", bw.egress_rate),
            ("egressBurst", bw.egress_burst),
        ] {
            if let Some(v) = value {
                m.insert(key.into(), json!(v));
            }
        }
        if !m.is_empty() {
            rc.insert("bandwidth".into(), Value::Object(m));
        }
    }
    if let (true, Some(dns)) = (declared("dns"), &caps.dns) {
        rc.insert(
            "dns".into(),
            json!({"servers": dns.servers, "searches": dns.searches, "options": dns.options}),
        );
    }
    if declared("ipRanges") && !caps.ip_ranges.is_empty() {
        let ranges: Vec<Value> = caps
            .ip_ranges
            .iter()
            .map(|set| Value::Array(set.iter().map(|s| json!({ "subnet": s })).collect()))
            .collect();
        rc.insert("ipRanges".into(), Value::Array(ranges));
    }
    if let (true, Some(path)) = (declared("cgroupPath"), &caps.cgroup_path) {
        rc.insert("cgroupPath".into(), Value::String(path.clone()));
    }
    (!rc.is_empty()).then_some(rc)
}

/// CNI_ARGS as kubelet's runtimes pass it. Values cannot contain the
/// separators, or a pod name could smuggle in other arguments.
pub fn cni_args(att: &Attachment) -> Result<String, Error> {
    let pairs = [
        ("K8S_POD_NAMESPACE", &att.pod_namespace),
        ("K8S_POD_NAME", &att.pod_name),
        ("K8S_POD_INFRA_CONTAINER_ID", &att.container_id),
        ("K8S_POD_UID", &att.pod_uid),
    ];
    let mut args = String::from("IgnoreUnknown=1");
    for (key, value) in pairs {
        if value.len() > 253
            || value
                .chars()
                .any(|c| c == ';' || c == '=' || c.is_control())
        {
            return Err(Error::invalid(
                format!("{key} {}", quote(value)),
                "must be at most 253 characters without ';', '=' or control characters",
            ));
        }
        args.push_str(&format!(";{key}={value}"));
    }
    Ok(args)
}

pub(crate) fn validate_attachment(att: &Attachment) -> Result<(), Error> {
    validate_container_id(&att.container_id)?;
    validate_ifname(&att.ifname)?;
    let netns = att.netns.to_string_lossy();
    if !att.netns.is_absolute() || netns.contains('\0') {
        return Err(Error::invalid(
            format!("netns path {}", quote(&netns)),
            "must be absolute",
        ));
    }
    for p in &att.capabilities.port_mappings {
        if p.host_port == 0 {
            continue;
        }
        let in_range = |port: i32| (1..=65535).contains(&port);
        if !in_range(p.host_port) || !in_range(p.container_port) {
            return Err(Error::invalid(
                format!("port mapping {}:{}", p.host_port, p.container_port),
                "ports must be within 1-65535",
            ));
        }
        if !p.host_ip.is_empty() && p.host_ip.parse::<IpAddr>().is_err() {
            return Err(Error::invalid(
                format!("host IP {}", quote(&p.host_ip)),
                "not an IP address",
            ));
        }
    }
    for subnet in att.capabilities.ip_ranges.iter().flatten() {
        if parse_cidr(subnet).is_none() {
            return Err(Error::invalid(
                format!("IP range {}", quote(subnet)),
                "not a CIDR",
            ));
        }
    }
    if let Some(dns) = &att.capabilities.dns {
        for s in dns.servers.iter().chain(&dns.searches).chain(&dns.options) {
            if s.chars().any(char::is_control) {
                return Err(Error::invalid(
                    format!("DNS entry {}", quote(s)),
                    "contains control characters",
                ));
            }
        }
    }
    Ok(())
}

/// The CNI spec's container ID: alphanumerics, '_', '.', '-', starting with
/// an alphanumeric.
pub(crate) fn validate_container_id(id: &str) -> Result<(), Error> {
    let ok = id.len() <= 256
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("container ID {}", quote(id)),
            "must be alphanumerics, '_', '.' or '-', starting with an alphanumeric",
        ))
    }
}

/// A Linux interface name: 1-15 bytes, no '/', ':' or whitespace.
pub(crate) fn validate_ifname(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("interface name {}", quote(name)),
            "not a valid Linux interface name",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_quote::testing::{check_message, config, hostile_string};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(config(1024))]

        /// Whatever the request put in an attachment: accepted, or refused
        /// with a short error.
        #[test]
        fn attachments_are_checked_with_short_errors(
            id in hostile_string(),
            ifname in hostile_string(),
            netns in hostile_string(),
            host_ip in hostile_string(),
            ports in (any::<i32>(), any::<i32>()),
            range in hostile_string(),
            dns in hostile_string(),
        ) {
            let mut att = attachment();
            att.container_id = id;
            att.ifname = ifname;
            att.netns = netns.into();
            att.capabilities.port_mappings.push(PortMapping {
                host_port: ports.0,
                container_port: ports.1,
                protocol: Protocol::Tcp,
                host_ip,
            });
            att.capabilities.ip_ranges.push(vec![range]);
            att.capabilities.dns = Some(DnsConfig {
                servers: vec![dns],
                searches: vec![],
                options: vec![],
            });
            if let Err(e) = validate_attachment(&att) {
                check_message("validate_attachment", &e.to_string())?;
            }
        }
    }

    fn attachment() -> Attachment {
        Attachment {
            container_id: "abc123".into(),
            netns: "/run/crust/pods/abc123/ns/net".into(),
            ifname: DEFAULT_IFNAME.into(),
            pod_namespace: "default".into(),
            pod_name: "web-0".into(),
            pod_uid: "1f5c-44".into(),
            capabilities: RuntimeCapabilities::default(),
        }
    }

    #[test]
    fn cni_args_as_kubelet_runtimes_pass_them() {
        assert_eq!(
            cni_args(&attachment()).unwrap(),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;\
             K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=1f5c-44"
        );
        for bad in [
            "a;K8S_POD_NAMESPACE=kube-system",
            "a=b",
            "a\nb",
            &"x".repeat(254),
        ] {
            let mut att = attachment();
            att.pod_name = bad.to_string();
            let e = cni_args(&att).unwrap_err();
            assert!(
                e.is_invalid_argument() && e.to_string().contains("K8S_POD_NAME"),
                "{e}"
            );
        }
    }

    #[test]
    fn runtime_config_has_only_declared_capabilities() {
        let caps = RuntimeCapabilities {
            port_mappings: vec![
                PortMapping {
                    host_port: 8080,
                    container_port: 80,
                    protocol: Protocol::Tcp,
                    host_ip: "127.0.0.1".into(),
                },
                PortMapping {
                    host_port: 0,
                    container_port: 9090,
                    protocol: Protocol::Tcp,
                    host_ip: String::new(),
                },
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: String::new(),
                },
            ],
            bandwidth: Some(Bandwidth {
                ingress_rate: Some(1_000_000),
                ingress_burst: Some(2_000_000),
                ..Default::default()
            }),
            dns: Some(DnsConfig {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["default.svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            }),
            ip_ranges: vec![vec!["10.244.1.0/24".into()]],
            cgroup_path: Some("/kubepods/pod1/crust-abc".into()),
        };
        let portmap = json!({"type": "portmap", "capabilities": {"portMappings": true}});
        assert_eq!(
            Value::Object(runtime_config(&portmap, &caps).unwrap()),
            json!({"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"},
                {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}
            ]})
        );
        let everything = json!({"type": "x", "capabilities": {
            "bandwidth": true, "dns": true, "ipRanges": true, "cgroupPath": true, "portMappings": false
        }});
        assert_eq!(
            Value::Object(runtime_config(&everything, &caps).unwrap()),
            json!({
                "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 2_000_000},
                "dns": {"servers": ["10.96.0.10"], "searches": ["default.svc.cluster.local"], "options": ["ndots:5"]},
                "ipRanges": [[{"subnet": "10.244.1.0/24"}]],
                "cgroupPath": "/kubepods/pod1/crust-abc"
            })
        );
        assert_eq!(runtime_config(&json!({"type": "bridge"}), &caps), None);
        // Declared, but nothing to pass.
        assert_eq!(
            runtime_config(&portmap, &RuntimeCapabilities::default()),
            None
        );
    }

    #[test]
    fn attachments_are_validated() {
        validate_attachment(&attachment()).unwrap();
        let cases: Vec<fn(&mut Attachment)> = vec![
            |a| a.container_id = String::new(),
            |a| a.container_id = "../x".into(),
            |a| a.container_id = "-x".into(),
            |a| a.ifname = "eth0/../x".into(),
            |a| a.ifname = "averyveryverylongname".into(),
            |a| a.ifname = String::new(),
            |a| a.netns = "relative".into(),
            |a| {
                a.capabilities.port_mappings.push(PortMapping {
                    host_port: 70000,
                    container_port: 80,
                    protocol: Protocol::Tcp,
                    host_ip: String::new(),
                })
            },
            |a| {
                a.capabilities.port_mappings.push(PortMapping {
                    host_port: 80,
                    container_port: 80,
                    protocol: Protocol::Tcp,
                    host_ip: "localhost; rm".into(),
                })
            },
            |a| a.capabilities.ip_ranges = vec![vec!["10.0.0.0".into()]],
            |a| {
                a.capabilities.dns = Some(DnsConfig {
                    servers: vec!["1.1.1.1\nnameserver 6.6.6.6".into()],
                    ..Default::default()
                })
            },
        ];
        for (i, break_it) in cases.iter().enumerate() {
            let mut att = attachment();
            break_it(&mut att);
            assert!(
                validate_attachment(&att).unwrap_err().is_invalid_argument(),
                "case {i}"
            );
        }
    }
}
