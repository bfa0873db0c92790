//! CNI operations on a pod's network namespace (spec 1.0/1.1, and the
//! 0.3/0.4 versions older configs declare): ADD, CHECK and DEL over a
//! network configuration list, as libcni-based runtimes run them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crust_quote::{clip, quote};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Error;
use crate::attachment::{
    Attachment, cni_args, runtime_config, validate_attachment, validate_container_id,
    validate_ifname,
};
use crate::config::NetworkConfigList;
use crate::exec::{run_plugin, search_path};
use crate::result::{CniResult, IpConfig};
use crate::tagged_rules::{self, Family};

/// Where plugins are looked up unless configured otherwise: the upstream
/// location and Debian's.
pub const DEFAULT_BIN_DIRS: [&str; 2] = ["/opt/cni/bin", "/usr/lib/cni"];
/// Per plugin call; bridge + IPAM usually take well under a second.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The CNI versions this runtime speaks.
const MIN_VERSION: Version = Version(0, 1, 0);
const MAX_VERSION: Version = Version(1, 1, 0);

/// Runs CNI plugins from a set of bin dirs.
#[derive(Debug, Clone)]
pub struct Cni {
    bin_dirs: Vec<PathBuf>,
    cache_dir: Option<PathBuf>,
    timeout: Duration,
}

/// A successful ADD.
#[derive(Debug, Clone, PartialEq)]
pub struct AddResult {
    /// The last plugin's result, parsed.
    pub result: CniResult,
    /// The same, as the plugin printed it: persist it for DEL/CHECK
    /// (prevResult) and show it in verbose PodSandboxStatus.
    pub raw: Value,
}

impl AddResult {
    /// The pod's IPs on `ifname`, IPv4 first: the first is PodSandboxStatus'
    /// `ip`, the rest `additional_ips`.
    pub fn pod_ips(&self, ifname: &str) -> Vec<IpAddr> {
        self.result.pod_ips(ifname)
    }
}

/// Whether a DEL may follow one that was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelAttempt {
    /// The first DEL since ADD finished: the plugins find all they made.
    First,
    /// A DEL that may follow one cut short (the daemon killed mid-DEL, a
    /// DEL or an ADD's cleanup that failed, a recovery that cannot tell):
    /// a plugin may no longer find all it made, so the nat rules tagged
    /// for the attachment are removed afterwards. One `iptables-save` per
    /// IP family of the pod (both when the ADD result is unknown).
    Repeat,
}

/// What [`Cni::add`] records in the cache dir, so DEL and CHECK work with
/// the ADD's config, capabilities and result even after a daemon crash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedAttachment {
    pub network: NetworkConfigList,
    pub attachment: Attachment,
    pub result: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Version(u32, u32, u32);

impl Version {
    fn parse(s: &str) -> Option<Version> {
        let mut parts = s.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version(
            parts.next()??,
            parts.next()??,
            parts.next().unwrap_or(Some(0))?,
        );
        parts.next().is_none().then_some(v)
    }
}

impl Cni {
    /// A runner for plugins in `bin_dirs` (searched in order; the list
    /// also becomes CNI_PATH). Dirs must be absolute and free of ':'.
    pub fn new(bin_dirs: Vec<PathBuf>) -> Result<Cni, Error> {
        if bin_dirs.is_empty() {
            return Err(Error::invalid("CNI bin dirs", "none given"));
        }
        for dir in &bin_dirs {
            let s = dir.to_string_lossy();
            if !dir.is_absolute() || s.contains(':') || s.contains('\0') {
                return Err(Error::invalid(
                    format!("CNI bin dir {}", quote(&s)),
                    "must be an absolute path without ':'",
                ));
            }
        }
        Ok(Cni {
            bin_dirs,
            cache_dir: None,
            timeout: DEFAULT_PLUGIN_TIMEOUT,
        })
    }

    /// [`Cni::new`] with [`DEFAULT_BIN_DIRS`].
    pub fn with_default_dirs() -> Cni {
        Cni {
            bin_dirs: DEFAULT_BIN_DIRS.iter().map(PathBuf::from).collect(),
            cache_dir: None,
            timeout: DEFAULT_PLUGIN_TIMEOUT,
        }
    }

    /// Records each ADD in `dir` (see [`CachedAttachment`]).
    pub fn with_cache_dir(mut self, dir: PathBuf) -> Cni {
        self.cache_dir = Some(dir);
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Cni {
        self.timeout = timeout;
        self
    }

    pub fn bin_dirs(&self) -> &[PathBuf] {
        &self.bin_dirs
    }

    /// Attaches the pod to `net`: ADD through each plugin in order, each
    /// given the previous one's result. If any step fails, the attachment
    /// is torn down again (DEL through the whole list) before the error is
    /// returned, so a failed ADD leaves nothing behind; if that DEL fails
    /// too the error says so ([`Error::AddAndCleanup`]) and the caller
    /// should retry [`Cni::del`]. A plugin missing from the bin dirs is
    /// reported before anything runs.
    pub async fn add(&self, net: &NetworkConfigList, att: &Attachment) -> Result<AddResult, Error> {
        let version = check_version(net)?;
        validate_attachment(att)?;
        let plugins = self.resolve_plugins(net)?;
        let mut prev: Option<Value> = None;
        for (plugin, (name, path)) in net.plugins.iter().zip(&plugins) {
            let stdin = plugin_stdin(net, plugin, att, prev.as_ref())?;
            let step = async {
                let out = run_plugin(
                    name,
                    "ADD",
                    path,
                    &self.env("ADD", att, &att.netns)?,
                    &stdin,
                    self.timeout,
                )
                .await?;
                let value: Value =
                    serde_json::from_slice(&out).map_err(|e| Error::InvalidResult {
                        plugin: name.clone(),
                        why: format!("not JSON: {}", clip(&e.to_string())),
                    })?;
                CniResult::parse(&value).map_err(|why| Error::InvalidResult {
                    plugin: name.clone(),
                    why,
                })?;
                Ok::<Value, Error>(value)
            };
            match step.await {
                Ok(value) => prev = Some(value),
                Err(e) => return Err(self.undo_add(net, att, prev.as_ref(), version, e).await),
            }
        }
        let Some(raw) = prev else {
            return Err(Error::invalid("network config", "no plugins"));
        };
        let result = CniResult::parse(&raw).map_err(|why| Error::InvalidResult {
            plugin: net.name.clone(),
            why,
        })?;
        if let Err(e) = self.write_cache(net, att, &raw) {
            return Err(self.undo_add(net, att, Some(&raw), version, e).await);
        }
        Ok(AddResult { result, raw })
    }

    /// Checks that the attachment is still as ADD made it (CNI 0.4.0+;
    /// skipped when the config sets `disableCheck`). `prev_result` is the
    /// ADD's result; None takes it from the cache.
    pub async fn check(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        prev_result: Option<&Value>,
    ) -> Result<(), Error> {
        let version = check_version(net)?;
        if version < Version(0, 4, 0) {
            return Err(Error::Unsupported {
                what: "CHECK",
                version: net.cni_version.clone(),
            });
        }
        if net.disable_check {
            return Ok(());
        }
        validate_attachment(att)?;
        let cached;
        let prev = match prev_result {
            Some(p) => p,
            None => {
                cached = self
                    .load_cached(&net.name, &att.container_id, &att.ifname)?
                    .ok_or_else(|| Error::invalid("CHECK", "no result of a previous ADD"))?;
                &cached.result
            }
        };
        let plugins = self.resolve_plugins(net)?;
        for (plugin, (name, path)) in net.plugins.iter().zip(&plugins) {
            let stdin = plugin_stdin(net, plugin, att, Some(prev))?;
            run_plugin(
                name,
                "CHECK",
                path,
                &self.env("CHECK", att, &att.netns)?,
                &stdin,
                self.timeout,
            )
            .await?;
        }
        Ok(())
    }

    /// Detaches the pod: DEL through each plugin in reverse order, with the
    /// ADD's result as prevResult (CNI 0.4.0+; None takes it from the cache
    /// if there is one). Idempotent: plugins treat an attachment that is
    /// already gone as deleted, and a netns that no longer exists (or is
    /// no namespace: a file nothing is mounted on, see [`is_mount_point`])
    /// is passed as empty CNI_NETNS so IPAM still releases the address.
    /// Every plugin runs even if an earlier one fails; the first error is
    /// returned.
    ///
    /// Run DEL while the namespace is still pinned: the bridge plugin finds
    /// its ipMasq rules through the addresses inside it, so a DEL after
    /// unpinning leaves those rules behind. For the same reason a DEL
    /// after one cut short ([`DelAttempt::Repeat`]) ends by removing the
    /// nat rules the plugins tagged for this attachment (see
    /// `tagged_rules`).
    pub async fn del(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        prev_result: Option<&Value>,
        attempt: DelAttempt,
    ) -> Result<(), Error> {
        let version = check_version(net)?;
        validate_attachment(att)?;
        let cached = match prev_result {
            Some(_) => None,
            None => self.load_cached(&net.name, &att.container_id, &att.ifname)?,
        };
        let prev = prev_result.or(cached.as_ref().map(|c| &c.result));
        self.del_plugins(net, att, prev, version).await?;
        if attempt == DelAttempt::Repeat {
            for family in families(prev) {
                tagged_rules::remove(family, &net.name, &att.container_id, self.timeout).await?;
            }
        }
        self.remove_cache(&net.name, &att.container_id, &att.ifname)
    }

    /// Removes the temp files of cache writes a crash cut short (ADD
    /// writes `<name>.json.tmp` and renames it); call it at start, before
    /// any ADD. Returns how many there were.
    pub fn remove_cache_temp_files(&self) -> Result<usize, Error> {
        let Some(dir) = &self.cache_dir else {
            return Ok(0);
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(source) => {
                return Err(Error::Io {
                    op: "read CNI cache dir",
                    path: dir.clone(),
                    source,
                });
            }
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            if !entry
                .file_name()
                .to_string_lossy()
                .ends_with(CACHE_TEMP_SUFFIX)
            {
                continue;
            }
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::Io {
                        op: "remove CNI cache temp file",
                        path: entry.path(),
                        source,
                    });
                }
            }
        }
        Ok(removed)
    }

    /// The record [`Cni::add`] left for this attachment, if any.
    pub fn load_cached(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CachedAttachment>, Error> {
        let Some(path) = self.cache_path(network, container_id, ifname)? else {
            return Ok(None);
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::Io {
                    op: "read CNI cache",
                    path,
                    source,
                });
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                // A torn or foreign file must not block DEL forever.
                tracing::warn!("ignoring unreadable CNI cache {}: {e}", path.display());
                Ok(None)
            }
        }
    }

    async fn del_plugins(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        prev: Option<&Value>,
        version: Version,
    ) -> Result<(), Error> {
        // prevResult on DEL arrived with 0.4.0.
        let prev = prev.filter(|_| version >= Version(0, 4, 0));
        let netns = if is_mount_point(&att.netns) {
            att.netns.clone()
        } else {
            PathBuf::new()
        };
        let mut first_error = None;
        for plugin in net.plugins.iter().rev() {
            let name = plugin_type(plugin);
            let res = async {
                let path = self.find_plugin(name)?;
                let stdin = plugin_stdin(net, plugin, att, prev)?;
                run_plugin(
                    name,
                    "DEL",
                    &path,
                    &self.env("DEL", att, &netns)?,
                    &stdin,
                    self.timeout,
                )
                .await
            }
            .await;
            if let Err(e) = res {
                tracing::warn!(container_id = %att.container_id, "CNI DEL: {e}");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn undo_add(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        prev: Option<&Value>,
        version: Version,
        add_error: Error,
    ) -> Error {
        match self.del_plugins(net, att, prev, version).await {
            Ok(()) => {
                let _ = self.remove_cache(&net.name, &att.container_id, &att.ifname);
                add_error
            }
            Err(del) => Error::AddAndCleanup {
                add: Box::new(add_error),
                del: Box::new(del),
            },
        }
    }

    /// Finds every plugin of `net` up front, so a missing one fails the
    /// ADD before any plugin has changed anything.
    fn resolve_plugins(&self, net: &NetworkConfigList) -> Result<Vec<(String, PathBuf)>, Error> {
        net.plugins
            .iter()
            .map(|p| {
                let name = plugin_type(p);
                self.find_plugin(name).map(|path| (name.to_string(), path))
            })
            .collect()
    }

    /// A plugin is a file named exactly like its type in one of the bin
    /// dirs; a type can never be a path.
    fn find_plugin(&self, name: &str) -> Result<PathBuf, Error> {
        use std::os::unix::fs::PermissionsExt;
        let not_found = || Error::PluginNotFound {
            plugin: name.to_string(),
            dirs: self.cni_path(),
        };
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(not_found());
        }
        self.bin_dirs
            .iter()
            .map(|dir| dir.join(name))
            .find(|p| {
                std::fs::metadata(p)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .ok_or_else(not_found)
    }

    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn env(
        &self,
        command: &str,
        att: &Attachment,
        netns: &Path,
    ) -> Result<Vec<(&'static str, String)>, Error> {
        Ok(vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", att.container_id.clone()),
            ("CNI_NETNS", netns.to_string_lossy().into_owned()),
            ("CNI_IFNAME", att.ifname.clone()),
            ("CNI_ARGS", cni_args(att)?),
            ("CNI_PATH", self.cni_path()),
            ("PATH", search_path()),
        ])
    }

    fn cache_path(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<PathBuf>, Error> {
        let Some(dir) = &self.cache_dir else {
            return Ok(None);
        };
        // All three are checked names: the file stays inside the cache dir.
        validate_network_name(network)?;
        validate_container_id(container_id)?;
        validate_ifname(ifname)?;
        Ok(Some(
            dir.join(format!("{network}-{container_id}-{ifname}.json")),
        ))
    }

    fn write_cache(
        &self,
        net: &NetworkConfigList,
        att: &Attachment,
        result: &Value,
    ) -> Result<(), Error> {
        use std::io::Write;
        let Some(path) = self.cache_path(&net.name, &att.container_id, &att.ifname)? else {
            return Ok(());
        };
        let record = CachedAttachment {
            network: net.clone(),
            attachment: att.clone(),
            result: result.clone(),
        };
        let io = |op: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { op, path, source }
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(io("create CNI cache dir", dir))?;
        let tmp = path.with_extension(&CACHE_TEMP_SUFFIX[1..]);
        let bytes = serde_json::to_vec(&record).map_err(|e| Error::Io {
            op: "encode CNI cache",
            path: path.clone(),
            source: e.into(),
        })?;
        let mut file = std::fs::File::create(&tmp).map_err(io("write CNI cache", &tmp))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(io("write CNI cache", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("write CNI cache", &path))
    }

    fn remove_cache(&self, network: &str, container_id: &str, ifname: &str) -> Result<(), Error> {
        let Some(path) = self.cache_path(network, container_id, ifname)? else {
            return Ok(());
        };
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                op: "remove CNI cache",
                path,
                source,
            }),
        }
    }
}

/// The IP families of the pod's addresses in an ADD result; both when
/// there is none (an ADD cut short may have made rules in either).
fn families(prev: Option<&Value>) -> Vec<Family> {
    let Some(ips) = prev.and_then(|p| CniResult::parse(p).ok()).map(|r| r.ips) else {
        return vec![Family::V4, Family::V6];
    };
    let v6 = |ip: &IpConfig| ip.address.contains(':');
    let mut out = Vec::new();
    if ips.iter().any(|ip| !v6(ip)) {
        out.push(Family::V4);
    }
    if ips.iter().any(v6) {
        out.push(Family::V6);
    }
    out
}

fn plugin_type(plugin: &Value) -> &str {
    plugin.get("type").and_then(Value::as_str).unwrap_or("")
}

fn check_version(net: &NetworkConfigList) -> Result<Version, Error> {
    validate_network_name(&net.name)?;
    match Version::parse(&net.cni_version) {
        Some(v) if (MIN_VERSION..=MAX_VERSION).contains(&v) => Ok(v),
        _ => Err(Error::Unsupported {
            what: "this runtime",
            version: net.cni_version.clone(),
        }),
    }
}

/// The config a plugin reads on stdin: its own section of the list with
/// the list's name and version, the capabilities it declared, and the
/// previous plugin's result.
fn plugin_stdin(
    net: &NetworkConfigList,
    plugin: &Value,
    att: &Attachment,
    prev: Option<&Value>,
) -> Result<Vec<u8>, Error> {
    let Some(section) = plugin.as_object() else {
        return Err(Error::invalid(
            format!("network config {}", net.source.display()),
            "a plugin entry is not an object",
        ));
    };
    let mut conf = section.clone();
    conf.insert("name".into(), Value::String(net.name.clone()));
    conf.insert("cniVersion".into(), Value::String(net.cni_version.clone()));
    if let Some(runtime_config) = runtime_config(plugin, &att.capabilities) {
        conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
    }
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    serde_json::to_vec(&conf).map_err(|e| Error::invalid("network config", e.to_string()))
}

/// The CNI spec's network name charset (it names files in the cache dir).
/// How the temp file of a cache write ends (`<name>.json.tmp`).
const CACHE_TEMP_SUFFIX: &str = ".json.tmp";

/// Whether something is mounted on `path` (it sits on another device
/// than its dir): a pinned namespace is a bind mount of nsfs, and
/// `/proc/<pid>/ns/net` leads to nsfs too. A missing path is not, nor an
/// empty file left where a pin was to be mounted: plugins refuse such a
/// CNI_NETNS ("unknown FS magic") on every DEL, for good.
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = path.parent().map(std::fs::metadata);
    match (std::fs::metadata(path), parent) {
        (Ok(m), Some(Ok(p))) => m.dev() != p.dev(),
        _ => false,
    }
}

fn validate_network_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("network name {}", quote(name)),
            "must be alphanumerics, '_', '.' or '-', starting with an alphanumeric",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DEFAULT_IFNAME, PortMapping, Protocol, RuntimeCapabilities};
    use serde_json::json;

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

    fn list(plugins: Value) -> NetworkConfigList {
        NetworkConfigList {
            cni_version: "1.0.0".into(),
            name: "crust".into(),
            disable_check: false,
            plugins: plugins.as_array().unwrap().clone(),
            source: "/etc/cni/net.d/10-crust.conflist".into(),
        }
    }

    #[test]
    fn temp_files_of_cut_short_cache_writes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cni = Cni::with_default_dirs().with_cache_dir(dir.path().join("cache"));
        assert_eq!(cni.remove_cache_temp_files().unwrap(), 0, "no dir yet");
        std::fs::create_dir(dir.path().join("cache")).unwrap();
        let keep = dir.path().join("cache/crust-abc-eth0.json");
        std::fs::write(&keep, b"{}").unwrap();
        std::fs::write(dir.path().join("cache/crust-abc-eth0.json.tmp"), b"{").unwrap();
        assert_eq!(cni.remove_cache_temp_files().unwrap(), 1);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .collect();
        assert_eq!(left.len(), 1);
        assert!(keep.exists());
    }

    #[test]
    fn only_a_mounted_netns_is_passed_to_del() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("net");
        std::fs::write(&empty, b"").unwrap();
        assert!(!is_mount_point(&empty), "an empty pin file is no namespace");
        assert!(!is_mount_point(&dir.path().join("missing")));
        // Another filesystem than its dir's: /proc/self/ns/net leads to nsfs.
        assert!(is_mount_point(Path::new("/proc/self/ns/net")));
    }

    #[test]
    fn plugin_stdin_injects_name_version_runtime_config_and_prev_result() {
        let net = list(json!([
            {"type": "bridge", "bridge": "crust0", "name": "ignored", "cniVersion": "0.1.0"},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]));
        let mut att = attachment();
        att.capabilities.port_mappings.push(PortMapping {
            host_port: 80,
            container_port: 8080,
            protocol: Protocol::Sctp,
            host_ip: String::new(),
        });
        let first: Value =
            serde_json::from_slice(&plugin_stdin(&net, &net.plugins[0], &att, None).unwrap())
                .unwrap();
        assert_eq!(
            first,
            json!({"type": "bridge", "bridge": "crust0", "name": "crust", "cniVersion": "1.0.0"})
        );
        let prev = json!({"cniVersion": "1.0.0", "ips": []});
        let second: Value = serde_json::from_slice(
            &plugin_stdin(&net, &net.plugins[1], &att, Some(&prev)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            second,
            json!({
                "type": "portmap", "capabilities": {"portMappings": true}, "snat": true,
                "name": "crust", "cniVersion": "1.0.0",
                "runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "sctp"}]},
                "prevResult": prev
            })
        );
    }

    #[test]
    fn versions() {
        assert_eq!(Version::parse("1.0.0"), Some(Version(1, 0, 0)));
        assert_eq!(Version::parse("0.4"), Some(Version(0, 4, 0)));
        for bad in ["", "1", "1.x.0", "1.0.0.0", "v1.0.0"] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        let mut net = list(json!([{"type": "bridge"}]));
        for (v, ok) in [
            ("0.3.1", true),
            ("1.1.0", true),
            ("2.0.0", false),
            ("0.0.1", false),
            ("x", false),
        ] {
            net.cni_version = v.into();
            assert_eq!(check_version(&net).is_ok(), ok, "{v}");
        }
    }

    #[test]
    fn plugins_are_found_only_by_name_in_the_bin_dirs() {
        use std::os::unix::fs::PermissionsExt;
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let exe = |dir: &Path, name: &str| {
            let p = dir.join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        exe(b.path(), "bridge");
        let first = exe(a.path(), "bridge");
        std::fs::write(a.path().join("noexec"), "").unwrap();
        let cni = Cni::new(vec![a.path().into(), b.path().into()]).unwrap();
        assert_eq!(cni.find_plugin("bridge").unwrap(), first);
        for missing in ["noexec", "nothere", "../bridge", "/bin/sh", "", ".."] {
            let e = cni.find_plugin(missing).unwrap_err();
            assert!(matches!(e, Error::PluginNotFound { .. }), "{missing}");
        }
        let msg = cni.find_plugin("nothere").unwrap_err().to_string();
        assert!(
            msg.contains("nothere") && msg.contains(&a.path().display().to_string()),
            "{msg}"
        );
        assert!(Cni::new(vec!["relative".into()]).is_err());
        assert!(Cni::new(vec!["/a:b".into()]).is_err());
        assert!(Cni::new(vec![]).is_err());
    }

    #[test]
    fn cache_paths_stay_in_the_cache_dir() {
        let cni = Cni::with_default_dirs().with_cache_dir("/var/lib/crust/cni".into());
        assert_eq!(
            cni.cache_path("crust", "abc", "eth0").unwrap().unwrap(),
            PathBuf::from("/var/lib/crust/cni/crust-abc-eth0.json")
        );
        assert!(cni.cache_path("../etc", "abc", "eth0").is_err());
        assert!(cni.cache_path("crust", "a/b", "eth0").is_err());
        assert!(
            Cni::with_default_dirs()
                .cache_path("crust", "abc", "eth0")
                .unwrap()
                .is_none()
        );
    }
}
