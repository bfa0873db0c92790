//! CNI network configuration files (`.conf`, `.conflist`, `.json`), chosen
//! as libcni-based runtimes do: the first valid file in lexical order.

use std::path::{Path, PathBuf};

use crust_quote::{clip, quote};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The newest CNI version this runtime speaks; a CNI 1.1 list's
/// `cniVersions` is resolved against it.
const NEWEST_VERSION: (u32, u32, u32) = (1, 1, 0);

/// A network configuration list: what CNI ADD/DEL run through, plugin by
/// plugin. A single-plugin `.conf` is loaded as a list of one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkConfigList {
    pub cni_version: String,
    pub name: String,
    pub disable_check: bool,
    /// Each plugin's configuration, kept as JSON so that plugin-specific
    /// keys reach the plugin unchanged.
    pub plugins: Vec<Value>,
    /// The file it came from.
    pub source: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no network config found in {0}")]
    NotFound(PathBuf),
    #[error("cannot read CNI config dir {dir}: {source}")]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CNI config {path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawList {
    cni_version: Option<String>,
    cni_versions: Option<Vec<String>>,
    name: Option<String>,
    #[serde(default)]
    disable_check: bool,
    plugins: Option<Vec<Value>>,
}

/// Parses one config file's content. `.conflist` files must hold a list;
/// `.conf`/`.json` files a single plugin config (or, tolerated as libcni
/// does for `.json`, a list).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<NetworkConfigList, ConfigError> {
    let invalid = |why: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    // serde's messages quote the offending string whole.
    let json_err = |e: serde_json::Error| invalid(clip(&e.to_string()).to_string());
    let value: Value = serde_json::from_slice(bytes).map_err(json_err)?;
    let raw: RawList = serde_json::from_value(value.clone()).map_err(json_err)?;
    let is_list = path.extension().is_some_and(|e| e == "conflist") || raw.plugins.is_some();
    let plugins = if is_list {
        raw.plugins
            .ok_or_else(|| invalid("no \"plugins\" list".into()))?
    } else {
        vec![value]
    };
    if plugins.is_empty() {
        return Err(invalid("\"plugins\" is empty".into()));
    }
    for (i, p) in plugins.iter().enumerate() {
        match p.get("type").and_then(Value::as_str) {
            Some(t) if is_plugin_name(t) => {}
            Some(t) => {
                return Err(invalid(format!(
                    "plugin {i} has an invalid type {}",
                    quote(t)
                )));
            }
            None => return Err(invalid(format!("plugin {i} has no \"type\""))),
        }
    }
    let name = raw
        .name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| invalid("no \"name\"".into()))?;
    let cni_version = newest_supported(raw.cni_versions.as_deref().unwrap_or_default())
        .or(raw.cni_version)
        .or_else(|| {
            plugins[0]
                .get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| "0.1.0".to_string());
    Ok(NetworkConfigList {
        cni_version,
        name,
        disable_check: raw.disable_check,
        plugins,
        source: path.to_path_buf(),
    })
}

/// The highest of `versions` (CNI 1.1 `cniVersions`) this runtime speaks.
fn newest_supported(versions: &[String]) -> Option<String> {
    let parse = |v: &str| {
        let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
        Some((it.next()??, it.next()??, it.next().unwrap_or(Some(0))?))
    };
    versions
        .iter()
        .filter_map(|v| parse(v).map(|p| (p, v)))
        .filter(|(p, _)| *p <= NEWEST_VERSION)
        .max_by_key(|(p, _)| *p)
        .map(|(_, v)| v.clone())
}

/// A plugin type names a binary in the plugin dirs: no path separators, so a
/// config cannot make the runtime execute an arbitrary file, and no longer
/// than a file name can be (errors name the plugin).
fn is_plugin_name(t: &str) -> bool {
    !t.is_empty() && t.len() <= 255 && !t.contains('/') && t != "." && t != ".."
}

/// Loads the network to use from `dir`: the first file (lexical order) with
/// a `.conf`, `.conflist` or `.json` extension that is valid. Invalid files
/// are skipped, as kubelet's runtimes do, and reported only when no valid
/// file exists.
pub fn load_default(dir: &Path) -> Result<NetworkConfigList, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ConfigError::NotFound(dir.to_path_buf()));
        }
        Err(source) => {
            return Err(ConfigError::ReadDir {
                dir: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == "conf" || e == "conflist" || e == "json")
        })
        .collect();
    files.sort();
    let mut first_error = None;
    for path in files {
        let parsed = std::fs::read(&path)
            .map_err(|e| ConfigError::Invalid {
                path: path.clone(),
                why: e.to_string(),
            })
            .and_then(|bytes| parse(&path, &bytes));
        match parsed {
            Ok(list) => return Ok(list),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| ConfigError::NotFound(dir.to_path_buf())))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRIDGE_LIST: &str = r#"{
        "cniVersion": "1.0.0",
        "name": "crust",
        "plugins": [
            {"type": "bridge", "bridge": "crust0", "ipam": {"type": "host-local"}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    }"#;

    #[test]
    fn parses_a_conflist() {
        let l = parse(Path::new("/x/10-crust.conflist"), BRIDGE_LIST.as_bytes()).unwrap();
        assert_eq!(l.name, "crust");
        assert_eq!(l.cni_version, "1.0.0");
        assert_eq!(l.plugins.len(), 2);
        assert_eq!(l.plugins[1]["capabilities"]["portMappings"], true);
    }

    #[test]
    fn a_single_conf_becomes_a_list_of_one() {
        let conf = r#"{"cniVersion":"0.4.0","name":"lo","type":"loopback"}"#;
        let l = parse(Path::new("99-lo.conf"), conf.as_bytes()).unwrap();
        assert_eq!(l.plugins.len(), 1);
        assert_eq!(l.cni_version, "0.4.0");
        assert_eq!(l.plugins[0]["type"], "loopback");
    }

    #[test]
    fn rejects_invalid_configs_with_the_reason() {
        let cases = [
            (
                "a.conflist",
                r#"{"name":"n","cniVersion":"1.0.0"}"#,
                "plugins",
            ),
            ("a.conflist", r#"{"name":"n","plugins":[]}"#, "empty"),
            ("a.conf", r#"{"name":"n"}"#, "type"),
            (
                "a.conf",
                r#"{"name":"n","type":"../../bin/sh"}"#,
                "invalid type",
            ),
            ("a.conf", r#"{"type":"bridge"}"#, "name"),
            ("a.conf", "{not json", "key must be a string"),
        ];
        for (file, body, why) in cases {
            let err = parse(Path::new(file), body.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{file} {body}: {err}");
            assert!(err.contains(file), "{err}");
        }
    }

    #[test]
    fn load_default_takes_the_first_valid_file_in_lexical_order() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_default(dir.path()),
            Err(ConfigError::NotFound(_))
        ));
        std::fs::write(dir.path().join("05-broken.conflist"), "{").unwrap();
        std::fs::write(dir.path().join("README.md"), "not a config").unwrap();
        let err = load_default(dir.path()).unwrap_err().to_string();
        assert!(err.contains("05-broken"), "{err}");
        std::fs::write(
            dir.path().join("20-b.conflist"),
            BRIDGE_LIST.replace("crust", "b"),
        )
        .unwrap();
        std::fs::write(dir.path().join("10-a.conflist"), BRIDGE_LIST).unwrap();
        let l = load_default(dir.path()).unwrap();
        assert_eq!(l.name, "crust");
        assert!(l.source.ends_with("10-a.conflist"));
    }

    #[test]
    fn cni_versions_pick_the_newest_supported() {
        let conf = r#"{"cniVersion":"1.0.0","cniVersions":["0.4.0","1.1.0","9.0.0"],"name":"n",
            "plugins":[{"type":"bridge"}]}"#;
        let l = parse(Path::new("a.conflist"), conf.as_bytes()).unwrap();
        assert_eq!(l.cni_version, "1.1.0");
        let conf = r#"{"cniVersion":"1.0.0","cniVersions":["9.0.0"],"name":"n","plugins":[{"type":"bridge"}]}"#;
        assert_eq!(
            parse(Path::new("a.conflist"), conf.as_bytes())
                .unwrap()
                .cni_version,
            "1.0.0"
        );
    }

    #[test]
    fn missing_dir_is_not_found() {
        let err = load_default(Path::new("/nonexistent/cni")).unwrap_err();
        assert!(matches!(err, ConfigError::NotFound(_)));
    }
}
