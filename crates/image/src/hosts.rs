//! Registry host configuration in containerd's `hosts.toml` format: a
//! directory holding `<host>/hosts.toml` (or `_default/hosts.toml`) with a
//! `server` and ordered `[host."URL"]` mirrors. The file is read on every
//! pull, so edits apply without a restart, as with containerd.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use reqwest::Url;
use toml::{Table, Value};

use crust_quote::{clip, quote};

use crate::error::{Error, Result};
use crate::reference::DEFAULT_DOMAIN;

const DOCKER_HUB_SERVER: &str = "registry-1.docker.io";
const DEFAULT_DIR: &str = "_default";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// What a host may be used for (containerd's capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Fetch blobs and manifests by digest.
    pub pull: bool,
    /// Resolve a tag to a digest.
    pub resolve: bool,
    pub push: bool,
}

impl Capabilities {
    pub const ALL: Capabilities = Capabilities {
        pull: true,
        resolve: true,
        push: true,
    };
}

/// One registry endpoint to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: Scheme,
    /// `host[:port]`.
    pub host: String,
    /// Path before `/v2`, empty or starting with `/` (from a mirror URL).
    pub path_prefix: String,
    pub capabilities: Capabilities,
    pub skip_verify: bool,
    /// PEM CA bundles to trust in addition to the system roots.
    pub ca: Vec<PathBuf>,
}

impl Endpoint {
    /// What oci-client calls the registry: host plus any path prefix.
    pub fn registry(&self) -> String {
        format!("{}{}", self.host, self.path_prefix)
    }

    pub fn url(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!("{scheme}://{}{}", self.host, self.path_prefix)
    }

    /// The default server for a registry when no config says otherwise.
    fn default_for(registry: &str) -> Endpoint {
        let (scheme, host) = if registry == DEFAULT_DOMAIN {
            (Scheme::Https, DOCKER_HUB_SERVER.to_string())
        } else if is_loopback(registry) {
            (Scheme::Http, registry.to_string())
        } else {
            (Scheme::Https, registry.to_string())
        };
        Endpoint {
            scheme,
            host,
            path_prefix: String::new(),
            capabilities: Capabilities::ALL,
            skip_verify: false,
            ca: Vec::new(),
        }
    }
}

/// Whether `host[:port]` names the local machine; such registries may be
/// plain http without config, as Docker and containerd allow.
pub fn is_loopback(registry: &str) -> bool {
    let host = strip_port(registry);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn strip_port(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match registry.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => registry,
    }
}

/// The hosts.toml directory (e.g. `/etc/crust/certs.d`); absent = defaults.
#[derive(Debug, Clone, Default)]
pub struct RegistryHosts {
    dir: Option<PathBuf>,
}

impl RegistryHosts {
    pub fn new(dir: Option<PathBuf>) -> Self {
        RegistryHosts { dir }
    }

    /// The endpoints to try for `registry`, mirrors in file order then the
    /// server.
    pub fn endpoints(&self, registry: &str) -> Result<Vec<Endpoint>> {
        let Some(file) = self.config_file(registry) else {
            return Ok(vec![Endpoint::default_for(registry)]);
        };
        let text = std::fs::read_to_string(&file).map_err(|e| Error::HostsConfig {
            path: file.display().to_string(),
            reason: e.to_string(),
        })?;
        parse_hosts_toml(&text, registry, file.parent().unwrap_or(Path::new("/"))).map_err(
            |reason| Error::HostsConfig {
                path: file.display().to_string(),
                reason,
            },
        )
    }

    fn config_file(&self, registry: &str) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let mut candidates = Vec::new();
        // A hostile registry name must not pick a file outside the dir.
        if !registry.contains('/') && !registry.starts_with('.') {
            candidates.push(dir.join(registry).join("hosts.toml"));
            // containerd's alternative spelling for host:port on filesystems
            // that dislike `:`.
            if let Some((h, p)) = registry.rsplit_once(':') {
                candidates.push(dir.join(format!("{h}_{p}_")).join("hosts.toml"));
            }
        }
        candidates.push(dir.join(DEFAULT_DIR).join("hosts.toml"));
        candidates.into_iter().find(|p| p.is_file())
    }
}

/// Parses one hosts.toml; `base` resolves relative `ca` paths.
pub fn parse_hosts_toml(
    text: &str,
    registry: &str,
    base: &Path,
) -> std::result::Result<Vec<Endpoint>, String> {
    // toml errors show the offending line, which may be any length.
    let table: Table = toml::from_str(text).map_err(|e| clip(&e.to_string()).to_string())?;
    let mut out = Vec::new();
    if let Some(hosts) = table.get("host") {
        let hosts = hosts.as_table().ok_or("`host` must be a table")?;
        for (url, settings) in hosts {
            let settings = settings
                .as_table()
                .ok_or_else(|| format!("host {} must be a table", quote(url)))?;
            if let Some(ep) = endpoint_from(url, settings, base)? {
                out.push(ep);
            }
        }
    }
    match table.get("server") {
        Some(server) => {
            let url = server.as_str().ok_or("`server` must be a string")?;
            if let Some(ep) = endpoint_from(url, &table, base)? {
                out.push(ep);
            }
        }
        None => out.push(server_defaults(registry, &table, base)?),
    }
    Ok(out)
}

/// The default server, with any top-level settings the file gives it.
fn server_defaults(
    registry: &str,
    table: &Table,
    base: &Path,
) -> std::result::Result<Endpoint, String> {
    let mut ep = Endpoint::default_for(registry);
    apply_settings(&mut ep, table, base)?;
    Ok(ep)
}

fn endpoint_from(
    url: &str,
    settings: &Table,
    base: &Path,
) -> std::result::Result<Option<Endpoint>, String> {
    let parsed = Url::parse(url).map_err(|e| format!("host URL {}: {e}", quote(url)))?;
    let scheme = match parsed.scheme() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => {
            return Err(format!(
                "host URL {}: unsupported scheme {}",
                quote(url),
                quote(other)
            ));
        }
    };
    let host = match (parsed.host_str(), parsed.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        (None, _) => return Err(format!("host URL {} has no host", quote(url))),
    };
    let override_path = bool_setting(settings, "override_path")?.unwrap_or(false);
    let path = parsed.path().trim_end_matches('/');
    let path_prefix = match (override_path, path.strip_suffix("/v2")) {
        (_, Some(prefix)) => prefix.to_string(),
        (false, None) => path.to_string(),
        (true, None) => {
            // oci-client always appends /v2; a path replacing it cannot be
            // expressed, so this host is skipped rather than misused.
            tracing::warn!(
                url,
                "override_path without a trailing /v2 is not supported; host skipped"
            );
            return Ok(None);
        }
    };
    let mut ep = Endpoint {
        scheme,
        host,
        path_prefix,
        capabilities: Capabilities::ALL,
        skip_verify: false,
        ca: Vec::new(),
    };
    apply_settings(&mut ep, settings, base)?;
    Ok(Some(ep))
}

fn apply_settings(
    ep: &mut Endpoint,
    settings: &Table,
    base: &Path,
) -> std::result::Result<(), String> {
    if let Some(caps) = settings.get("capabilities") {
        ep.capabilities = parse_capabilities(caps)?;
    }
    if let Some(skip) = bool_setting(settings, "skip_verify")? {
        ep.skip_verify = skip;
    }
    if let Some(ca) = settings.get("ca") {
        ep.ca = string_list(ca, "ca")?
            .into_iter()
            .map(|p| base.join(p))
            .collect();
    }
    if settings.contains_key("client") {
        tracing::warn!(host = %ep.host, "client certificates in hosts.toml are not supported; ignored");
    }
    if settings.contains_key("header") {
        tracing::warn!(host = %ep.host, "custom headers in hosts.toml are not supported; ignored");
    }
    Ok(())
}

fn parse_capabilities(v: &Value) -> std::result::Result<Capabilities, String> {
    let mut caps = Capabilities {
        pull: false,
        resolve: false,
        push: false,
    };
    for c in string_list(v, "capabilities")? {
        match c.as_str() {
            "pull" => caps.pull = true,
            "resolve" => caps.resolve = true,
            "push" => caps.push = true,
            other => return Err(format!("unknown capability {}", quote(other))),
        }
    }
    Ok(caps)
}

fn bool_setting(t: &Table, key: &str) -> std::result::Result<Option<bool>, String> {
    match t.get(key) {
        None => Ok(None),
        Some(Value::Boolean(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("`{key}` must be a boolean")),
    }
}

fn string_list(v: &Value, key: &str) -> std::result::Result<Vec<String>, String> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("`{key}` must hold strings"))
            })
            .collect(),
        _ => Err(format!("`{key}` must be a string or a list of strings")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, registry: &str) -> Vec<Endpoint> {
        parse_hosts_toml(text, registry, Path::new("/etc/crust/certs.d/x")).unwrap()
    }

    #[test]
    fn defaults_without_config() {
        let hosts = RegistryHosts::new(None);
        let eps = hosts.endpoints("docker.io").unwrap();
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].url(), "https://registry-1.docker.io");
        let eps = hosts.endpoints("quay.io").unwrap();
        assert_eq!(eps[0].url(), "https://quay.io");
        for local in [
            "127.0.0.1:5000",
            "localhost",
            "localhost:80",
            "[::1]:5000",
            "127.1.2.3",
        ] {
            let eps = hosts.endpoints(local).unwrap();
            assert_eq!(eps[0].scheme, Scheme::Http, "{local}");
        }
        assert_eq!(
            hosts.endpoints("10.0.0.1:5000").unwrap()[0].scheme,
            Scheme::Https
        );
    }

    #[test]
    fn mirrors_in_file_order_then_server() {
        let eps = parse(
            r#"
server = "https://registry.example.com"

[host."https://mirror-b.example.com"]
  capabilities = ["pull"]
[host."http://127.0.0.1:5000/prefix"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
  ca = ["ca.pem", "/abs/ca.pem"]
[host."https://mirror-a.example.com/v2"]
  override_path = true
"#,
            "example.com",
        );
        let urls: Vec<_> = eps.iter().map(Endpoint::url).collect();
        assert_eq!(
            urls,
            [
                "https://mirror-b.example.com",
                "http://127.0.0.1:5000/prefix",
                "https://mirror-a.example.com",
                "https://registry.example.com",
            ]
        );
        assert!(eps[0].capabilities.pull && !eps[0].capabilities.resolve);
        assert!(eps[1].skip_verify);
        assert_eq!(
            eps[1].ca,
            [
                PathBuf::from("/etc/crust/certs.d/x/ca.pem"),
                PathBuf::from("/abs/ca.pem")
            ]
        );
        assert_eq!(eps[1].registry(), "127.0.0.1:5000/prefix");
        assert_eq!(eps[3].capabilities, Capabilities::ALL);
    }

    #[test]
    fn default_server_when_file_names_none() {
        let eps = parse(
            "[host.\"https://m.example.com\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
            "docker.io",
        );
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[1].url(), "https://registry-1.docker.io");
    }

    #[test]
    fn top_level_settings_apply_to_server() {
        let eps = parse(
            "server = \"https://r.example.com\"\nskip_verify = true\n",
            "r",
        );
        assert!(eps[0].skip_verify);
    }

    #[test]
    fn override_path_without_v2_is_skipped() {
        let eps = parse(
            "[host.\"https://m.example.com/custom\"]\noverride_path = true\n",
            "r.example.com",
        );
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].url(), "https://r.example.com");
    }

    #[test]
    fn rejects_bad_files() {
        for bad in [
            "server = 1",
            "server = \"ftp://x\"",
            "[host.\"https://m\"]\ncapabilities = [\"fly\"]",
            "[host.\"https://m\"]\nskip_verify = \"yes\"",
            "host = 3",
            "not toml [",
        ] {
            assert!(parse_hosts_toml(bad, "r", Path::new("/")).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_the_shared_certs_d_layout() {
        let dir = tempfile::tempdir().unwrap();
        let k8s = dir.path().join("registry.k8s.io");
        std::fs::create_dir(&k8s).unwrap();
        std::fs::write(
            k8s.join("hosts.toml"),
            "# comment\nserver = \"http://127.0.0.1:5000\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        )
        .unwrap();
        let dflt = dir.path().join("_default");
        std::fs::create_dir(&dflt).unwrap();
        std::fs::write(
            dflt.join("hosts.toml"),
            "server = \"http://127.0.0.1:6000\"\n",
        )
        .unwrap();
        let local = dir.path().join("localhost:5000");
        std::fs::create_dir(&local).unwrap();
        std::fs::write(
            local.join("hosts.toml"),
            "server = \"http://localhost:5000\"\n",
        )
        .unwrap();

        let hosts = RegistryHosts::new(Some(dir.path().to_path_buf()));
        let eps = hosts.endpoints("registry.k8s.io").unwrap();
        assert_eq!(eps.len(), 2);
        assert!(eps.iter().all(|e| e.url() == "http://127.0.0.1:5000"));
        assert!(!eps[0].capabilities.push && eps[1].capabilities.push);
        assert_eq!(
            hosts.endpoints("quay.io").unwrap()[0].url(),
            "http://127.0.0.1:6000"
        );
        assert_eq!(
            hosts.endpoints("localhost:5000").unwrap()[0].url(),
            "http://localhost:5000"
        );
        // A name that would leave the dir falls back to _default, never reads elsewhere.
        assert_eq!(
            hosts.endpoints("../etc").unwrap()[0].url(),
            "http://127.0.0.1:6000"
        );
    }
}
