//! The network crust installs when the node has none: a bridge with
//! host-local IPAM, portmap for hostPorts and loopback.

use std::io::Write;
use std::path::{Path, PathBuf};

use crust_quote::quote;
use serde_json::{Value, json};

use crate::Error;
use crate::result::parse_cidr;

/// The file [`install_default_conflist`] writes.
pub const DEFAULT_CONFLIST_FILE: &str = "10-crust.conflist";

/// What the default network looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultNetwork {
    pub name: String,
    pub bridge: String,
    /// Pod subnets in CIDR notation; one per IP family for dual stack.
    pub subnets: Vec<String>,
    /// host-local's lease dir; None uses the plugin's default
    /// (`/var/lib/cni/networks/<name>`).
    pub ipam_data_dir: Option<PathBuf>,
}

impl Default for DefaultNetwork {
    fn default() -> Self {
        DefaultNetwork {
            name: "crust".into(),
            bridge: "crust0".into(),
            subnets: vec!["10.88.0.0/16".into()],
            ipam_data_dir: None,
        }
    }
}

impl DefaultNetwork {
    /// The default network on `pod_cidr` (UpdateRuntimeConfig's, possibly a
    /// comma-separated dual-stack pair).
    pub fn with_pod_cidr(pod_cidr: &str) -> DefaultNetwork {
        DefaultNetwork {
            subnets: pod_cidr
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            ..Default::default()
        }
    }
}

/// The conflist of `net`, after checking every value that ends up in it.
pub fn default_conflist(net: &DefaultNetwork) -> Result<Value, Error> {
    let name_ok = !net.name.is_empty()
        && net.name.len() <= 128
        && net
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !name_ok {
        return Err(Error::invalid(
            format!("network name {}", quote(&net.name)),
            "not a valid CNI network name",
        ));
    }
    let bridge_ok = !net.bridge.is_empty()
        && net.bridge.len() <= 15
        && net
            .bridge
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !bridge_ok {
        return Err(Error::invalid(
            format!("bridge name {}", quote(&net.bridge)),
            "not a valid interface name",
        ));
    }
    if net.subnets.is_empty() {
        return Err(Error::invalid("pod CIDR", "no subnet"));
    }
    let mut ranges = Vec::new();
    let mut routes = Vec::new();
    for subnet in &net.subnets {
        let Some((addr, _)) = parse_cidr(subnet) else {
            return Err(Error::invalid(
                format!("pod CIDR {}", quote(subnet)),
                "not a CIDR",
            ));
        };
        ranges.push(json!([{ "subnet": subnet }]));
        routes.push(json!({ "dst": if addr.is_ipv4() { "0.0.0.0/0" } else { "::/0" } }));
    }
    let mut ipam = json!({ "type": "host-local", "ranges": ranges, "routes": routes });
    if let Some(dir) = &net.ipam_data_dir {
        ipam["dataDir"] = Value::String(dir.to_string_lossy().into_owned());
    }
    Ok(json!({
        "cniVersion": "1.0.0",
        "name": net.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": ipam
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
            // Last: in a chain it brings `lo` up and passes the bridge's
            // result through.
            { "type": "loopback" }
        ]
    }))
}

/// Writes the default conflist into `dir` (created if missing) unless the
/// dir already holds a network config (any `.conf`, `.conflist` or `.json`,
/// valid or not: an admin's broken file is not ours to shadow). Returns the
/// path written, or None when a config was already there.
pub fn install_default_conflist(
    dir: &Path,
    net: &DefaultNetwork,
) -> Result<Option<PathBuf>, Error> {
    let conflist = default_conflist(net)?;
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { op, path, source }
    };
    std::fs::create_dir_all(dir).map_err(io("create CNI conf dir", dir))?;
    let has_config = std::fs::read_dir(dir)
        .map_err(io("read CNI conf dir", dir))?
        .filter_map(Result::ok)
        .any(|e| {
            let p = e.path();
            p.extension()
                .is_some_and(|x| x == "conf" || x == "conflist" || x == "json")
        });
    if has_config {
        return Ok(None);
    }
    let path = dir.join(DEFAULT_CONFLIST_FILE);
    // Written aside and renamed, so a watcher never loads half a file (the
    // temp name's extension is not one it loads).
    let tmp = dir.join(format!(".{DEFAULT_CONFLIST_FILE}.tmp"));
    let mut bytes = serde_json::to_vec_pretty(&conflist)
        .map_err(|e| Error::invalid("default conflist", e.to_string()))?;
    bytes.push(b'\n');
    let mut file = std::fs::File::create(&tmp).map_err(io("write", &tmp))?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_all())
        .map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io("rename to", &path))?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    #[test]
    fn installs_into_an_empty_dir_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        let written = install_default_conflist(&conf_dir, &DefaultNetwork::default())
            .unwrap()
            .unwrap();
        assert!(written.ends_with(DEFAULT_CONFLIST_FILE));
        let list = config::load_default(&conf_dir).unwrap();
        assert_eq!(list.name, "crust");
        let types: Vec<&str> = list
            .plugins
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["bridge", "portmap", "loopback"]);
        let bridge = &list.plugins[0];
        assert_eq!(bridge["bridge"], "crust0");
        assert_eq!(bridge["isGateway"], true);
        assert_eq!(bridge["ipMasq"], true);
        assert_eq!(bridge["hairpinMode"], true);
        assert_eq!(
            bridge["ipam"]["ranges"],
            json!([[{"subnet": "10.88.0.0/16"}]])
        );
        assert_eq!(list.plugins[1]["capabilities"]["portMappings"], true);
        // Never twice, never over someone else's config.
        assert_eq!(
            install_default_conflist(&conf_dir, &DefaultNetwork::default()).unwrap(),
            None
        );
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("99-mine.conf"), "{broken").unwrap();
        assert_eq!(
            install_default_conflist(other.path(), &DefaultNetwork::default()).unwrap(),
            None
        );
    }

    #[test]
    fn pod_cidrs_become_ranges_and_routes() {
        let net = DefaultNetwork::with_pod_cidr("10.244.1.0/24, fd00:10:244:1::/64");
        let v = default_conflist(&net).unwrap();
        assert_eq!(
            v["plugins"][0]["ipam"]["ranges"],
            json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]])
        );
        assert_eq!(
            v["plugins"][0]["ipam"]["routes"],
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
    }

    #[test]
    fn bad_values_are_refused() {
        let bad = [
            DefaultNetwork::with_pod_cidr("10.0.0.0"),
            DefaultNetwork::with_pod_cidr(""),
            DefaultNetwork::with_pod_cidr("10.0.0.0/8\", \"x"),
            DefaultNetwork {
                bridge: "a-very-long-bridge-name".into(),
                ..Default::default()
            },
            DefaultNetwork {
                name: "../x".into(),
                ..Default::default()
            },
        ];
        for net in bad {
            assert!(
                default_conflist(&net).unwrap_err().is_invalid_argument(),
                "{net:?}"
            );
        }
    }
}
