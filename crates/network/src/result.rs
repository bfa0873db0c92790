//! CNI results (spec 0.1.0 through 1.1.0) and the pod IPs in them.

use std::net::IpAddr;

use crust_quote::{clip, quote};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A CNI result, normalized to the 0.3.0+ shape (0.1/0.2 results, with
/// `ip4`/`ip6` objects, are converted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    #[serde(default)]
    pub cni_version: String,
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: String,
    /// The netns path for interfaces inside the sandbox; empty on the host.
    #[serde(default)]
    pub sandbox: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR notation, e.g. `10.88.0.5/16`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default)]
    pub nameservers: Vec<String>,
    #[serde(default)]
    pub domain: String,
    #[serde(default)]
    pub search: Vec<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

/// The 0.1.0/0.2.0 result shape.
#[derive(Deserialize)]
struct LegacyResult {
    #[serde(default, rename = "cniVersion")]
    cni_version: String,
    ip4: Option<LegacyIp>,
    ip6: Option<LegacyIp>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Deserialize)]
struct LegacyIp {
    ip: String,
    gateway: Option<String>,
    #[serde(default)]
    routes: Vec<Route>,
}

impl CniResult {
    /// Parses a plugin's result. Every address must be valid CIDR and every
    /// interface index in range, so later users can rely on both.
    pub fn parse(value: &Value) -> Result<CniResult, String> {
        // serde's messages quote the offending string whole.
        let json_err = |e: serde_json::Error| clip(&e.to_string()).to_string();
        let legacy = value.get("ips").is_none()
            && (value.get("ip4").is_some() || value.get("ip6").is_some());
        let result = if legacy {
            let old: LegacyResult = serde_json::from_value(value.clone()).map_err(json_err)?;
            let mut result = CniResult {
                cni_version: old.cni_version,
                dns: old.dns,
                ..Default::default()
            };
            for ip in [old.ip4, old.ip6].into_iter().flatten() {
                result.ips.push(IpConfig {
                    address: ip.ip,
                    gateway: ip.gateway,
                    interface: None,
                });
                result.routes.extend(ip.routes);
            }
            result
        } else {
            serde_json::from_value(value.clone()).map_err(json_err)?
        };
        for ip in &result.ips {
            parse_cidr(&ip.address)
                .ok_or_else(|| format!("invalid address {}", quote(&ip.address)))?;
            if let Some(gw) = &ip.gateway {
                gw.parse::<IpAddr>()
                    .map_err(|_| format!("invalid gateway {}", quote(gw)))?;
            }
            if let Some(i) = ip.interface
                && usize::try_from(i).map_or(true, |i| i >= result.interfaces.len())
            {
                return Err(format!(
                    "address {} names interface {i}, which does not exist",
                    ip.address
                ));
            }
        }
        Ok(result)
    }

    /// The pod's IPs: addresses on the sandbox interface `ifname` (IPv4
    /// first, as kubelet expects the primary to be, then IPv6), falling back
    /// to addresses with no interface when the plugin gives none for it.
    pub fn pod_ips(&self, ifname: &str) -> Vec<IpAddr> {
        let on_ifname = |ip: &&IpConfig| {
            ip.interface
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| self.interfaces.get(i))
                .is_some_and(|iface| iface.name == ifname && !iface.sandbox.is_empty())
        };
        let mut chosen: Vec<&IpConfig> = self.ips.iter().filter(on_ifname).collect();
        if chosen.is_empty() {
            chosen = self
                .ips
                .iter()
                .filter(|ip| ip.interface.is_none())
                .collect();
        }
        let mut ips: Vec<IpAddr> = Vec::new();
        for addr in chosen
            .iter()
            .filter_map(|ip| parse_cidr(&ip.address))
            .map(|(a, _)| a)
        {
            if !ips.contains(&addr) {
                ips.push(addr);
            }
        }
        // Stable: keeps the plugin's order within each family.
        ips.sort_by_key(|ip| ip.is_ipv6());
        ips
    }
}

/// Parses `addr/prefix`.
pub(crate) fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((addr, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bridge_result_1_0_gives_the_eth0_address() {
        let v = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "crust0", "mac": "aa:bb:cc:dd:ee:01"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/run/crust/ns/x/net"}
            ],
            "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 2}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        });
        let r = CniResult::parse(&v).unwrap();
        assert_eq!(
            r.pod_ips("eth0"),
            vec!["10.88.0.5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(r.interfaces[2].sandbox, "/run/crust/ns/x/net");
        assert_eq!(r.routes[0].dst, "0.0.0.0/0");
    }

    #[test]
    fn result_0_3_and_0_4_with_version_fields() {
        for version in ["0.3.0", "0.3.1", "0.4.0"] {
            let v = json!({
                "cniVersion": version,
                "interfaces": [{"name": "eth0", "sandbox": "/ns"}],
                "ips": [{"version": "4", "address": "10.1.2.3/24", "gateway": "10.1.2.1", "interface": 0}]
            });
            let r = CniResult::parse(&v).unwrap();
            assert_eq!(
                r.pod_ips("eth0"),
                vec!["10.1.2.3".parse::<IpAddr>().unwrap()],
                "{version}"
            );
        }
    }

    #[test]
    fn dual_stack_puts_ipv4_first_and_keeps_additional_ips() {
        let v = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0"},
                {"name": "eth0", "sandbox": "/ns"},
                {"name": "net1", "sandbox": "/ns"}
            ],
            "ips": [
                {"address": "fd00::5/64", "interface": 1},
                {"address": "10.0.0.5/24", "interface": 1},
                {"address": "10.0.0.6/24", "interface": 1},
                {"address": "10.0.0.1/24", "interface": 0},
                {"address": "192.168.9.9/24", "interface": 2}
            ]
        });
        let r = CniResult::parse(&v).unwrap();
        let want: Vec<IpAddr> = ["10.0.0.5", "10.0.0.6", "fd00::5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(r.pod_ips("eth0"), want);
    }

    #[test]
    fn addresses_without_interface_are_the_fallback() {
        let v = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.9.0.2/16"}]});
        let r = CniResult::parse(&v).unwrap();
        assert_eq!(
            r.pod_ips("eth0"),
            vec!["10.9.0.2".parse::<IpAddr>().unwrap()]
        );
        // Host-side addresses are never pod IPs.
        let v = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.9.0.1/16", "interface": 0}]
        });
        assert!(CniResult::parse(&v).unwrap().pod_ips("eth0").is_empty());
    }

    #[test]
    fn legacy_0_2_results_are_converted() {
        let v = json!({
            "cniVersion": "0.2.0",
            "ip4": {"ip": "10.5.0.2/16", "gateway": "10.5.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
            "ip6": {"ip": "fd00::2/64"},
            "dns": {"nameservers": ["10.5.0.10"]}
        });
        let r = CniResult::parse(&v).unwrap();
        let want: Vec<IpAddr> = ["10.5.0.2", "fd00::2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(r.pod_ips("eth0"), want);
        assert_eq!(r.dns.nameservers, ["10.5.0.10"]);
    }

    #[test]
    fn invalid_results_are_refused() {
        let cases = [
            json!({"ips": [{"address": "10.0.0.1"}]}),
            json!({"ips": [{"address": "10.0.0.1/33"}]}),
            json!({"ips": [{"address": "nonsense/8"}]}),
            json!({"ips": [{"address": "10.0.0.1/8", "gateway": "x"}]}),
            json!({"ips": [{"address": "10.0.0.1/8", "interface": 3}], "interfaces": []}),
            json!({"ips": [{"address": "10.0.0.1/8", "interface": -1}]}),
            json!({"ips": "no"}),
            json!("just a string"),
        ];
        for v in cases {
            assert!(CniResult::parse(&v).is_err(), "{v}");
        }
    }

    #[test]
    fn cidrs() {
        assert_eq!(
            parse_cidr("10.88.0.0/16"),
            Some(("10.88.0.0".parse().unwrap(), 16))
        );
        assert_eq!(
            parse_cidr("fd00::/64"),
            Some(("fd00::".parse().unwrap(), 64))
        );
        for bad in [
            "10.88.0.0",
            "10.88.0.0/",
            "10.88.0.0/33",
            "fd00::/129",
            "/8",
            "a/8",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }
}
