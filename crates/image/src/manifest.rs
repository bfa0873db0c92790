//! Manifests, indexes and image configs (Docker schema2 and OCI), parsed
//! leniently where the formats differ and strictly where safety depends on
//! it (digests, sizes).

use std::collections::BTreeMap;

use crust_quote::{clip, quote};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{Error, Result};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// Media types accepted when asking a registry for a manifest.
pub const MANIFEST_TYPES: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// Largest manifest or index accepted (containerd uses the same bound).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Largest image config accepted.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// Nested indexes followed at most this deep.
pub const MAX_INDEX_DEPTH: usize = 4;

const LAYER_TYPES: &[&str] = &[
    OCI_LAYER_TAR,
    OCI_LAYER_GZIP,
    OCI_LAYER_ZSTD,
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    DOCKER_LAYER_GZIP,
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: i64,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Index {
    #[serde(rename = "schemaVersion")]
    pub schema_version: i64,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A fetched manifest document: one image or an index of them.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    Manifest(Manifest),
    Index(Index),
}

/// Parses manifest bytes, telling image manifests from indexes by
/// `mediaType` or, when absent (allowed by OCI), by shape.
pub fn parse_document(bytes: &[u8]) -> Result<Document> {
    let bad = |e: String| Error::verification("manifest", e);
    // serde's messages quote the offending string whole.
    let json_err = |e: serde_json::Error| bad(clip(&e.to_string()).to_string());
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| bad(format!("not JSON: {}", clip(&e.to_string()))))?;
    match value
        .get("schemaVersion")
        .and_then(serde_json::Value::as_i64)
    {
        Some(2) => {}
        Some(1) => {
            return Err(Error::Unsupported(
                "Docker schema 1 manifests are not supported".to_string(),
            ));
        }
        other => return Err(bad(format!("unsupported schemaVersion {other:?}"))),
    }
    let media_type = value.get("mediaType").and_then(serde_json::Value::as_str);
    let is_index = match media_type {
        Some(OCI_INDEX | DOCKER_LIST) => true,
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => false,
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "manifest media type {} is not a container image",
                quote(other)
            )));
        }
        None => value.get("manifests").is_some(),
    };
    if is_index {
        let index: Index = serde_json::from_value(value).map_err(json_err)?;
        Ok(Document::Index(index))
    } else {
        let manifest: Manifest = serde_json::from_value(value).map_err(json_err)?;
        check_image_manifest(&manifest)?;
        Ok(Document::Manifest(manifest))
    }
}

/// Refuses artifacts that are not runnable images (helm charts, wasm, ...).
fn check_image_manifest(m: &Manifest) -> Result<()> {
    let config_type = m.config.media_type.as_str();
    if config_type != OCI_CONFIG && config_type != DOCKER_CONFIG {
        return Err(Error::Unsupported(format!(
            "config media type {} is not a container image",
            quote(config_type)
        )));
    }
    if m.config.size > MAX_CONFIG_BYTES {
        return Err(Error::verification(
            m.config.digest.to_string(),
            format!(
                "config is {} bytes, over the {MAX_CONFIG_BYTES} limit",
                m.config.size
            ),
        ));
    }
    for layer in &m.layers {
        if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
            return Err(Error::Unsupported(format!(
                "layer media type {} is not supported",
                quote(&layer.media_type)
            )));
        }
    }
    Ok(())
}

/// The host platform in OCI terms (GOARCH names).
pub fn host_platform() -> Platform {
    let (architecture, variant) = match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "x86" => ("386", None),
        "aarch64" => ("arm64", Some("v8")),
        "arm" => ("arm", Some("v7")),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
        "powerpc64" => ("ppc64", None),
        "loongarch64" => ("loong64", None),
        "mips64" if cfg!(target_endian = "little") => ("mips64le", None),
        other => (other, None),
    };
    Platform {
        architecture: architecture.to_string(),
        os: "linux".to_string(),
        variant: variant.map(str::to_string),
    }
}

/// Picks the index entry to run on `host`: matching os and architecture,
/// preferring the host's variant (or none), accepting only variants known
/// to run on it.
pub fn select_manifest<'a>(index: &'a Index, host: &Platform) -> Result<&'a Descriptor> {
    index
        .manifests
        .iter()
        .filter_map(|d| {
            let p = d.platform.as_ref()?;
            let score = variant_score(p, host)?;
            (p.os == host.os && normalize_arch(&p.architecture) == host.architecture)
                .then_some((score, d))
        })
        .max_by_key(|(score, _)| *score)
        .map(|(_, d)| d)
        .ok_or_else(|| {
            let available: Vec<String> = index
                .manifests
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect();
            Error::NotFound(format!(
                "manifest for {}/{} (index has: {})",
                host.os,
                host.architecture,
                clip(&available.join(", "))
            ))
        })
}

fn normalize_arch(a: &str) -> &str {
    match a {
        "x86_64" | "x86-64" => "amd64",
        "aarch64" => "arm64",
        "i386" => "386",
        other => other,
    }
}

/// Higher is better; None means the variant cannot run on the host.
fn variant_score(p: &Platform, host: &Platform) -> Option<u8> {
    let v = p.variant.as_deref().unwrap_or("");
    let host_v = host.variant.as_deref().unwrap_or("");
    if v == host_v {
        return Some(3);
    }
    match (host.architecture.as_str(), v) {
        (_, "") => Some(2),
        ("amd64", "v1") => Some(1),
        ("arm64", "v8") => Some(2),
        ("arm", "v6") => Some(1),
        ("arm", "v5") => Some(0),
        _ => None,
    }
}

/// The parts of an image config crust needs (Docker's `config` object).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    #[serde(default)]
    pub working_dir: String,
    #[serde(default)]
    pub stop_signal: String,
    #[serde(default)]
    pub volumes: Vec<String>,
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// An image config blob (OCI image spec `application/vnd.oci.image.config.v1+json`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    pub platform: Platform,
    pub created: Option<String>,
    pub config: ImageConfig,
    pub diff_ids: Vec<Digest>,
}

#[derive(Deserialize)]
struct RawConfigFile {
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    created: Option<String>,
    #[serde(default)]
    config: Option<RawRunConfig>,
    rootfs: RawRootFs,
}

#[derive(Deserialize)]
struct RawRootFs {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    diff_ids: Vec<Digest>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RawRunConfig {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    stop_signal: Option<String>,
    #[serde(default)]
    volumes: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

/// Parses a config blob; `null` anywhere Docker writes it reads as empty.
pub fn parse_config(bytes: &[u8]) -> Result<ConfigFile> {
    let raw: RawConfigFile = serde_json::from_slice(bytes)
        .map_err(|e| Error::verification("image config", clip(&e.to_string()).to_string()))?;
    if raw.rootfs.kind != "layers" {
        return Err(Error::Unsupported(format!(
            "image config rootfs type {} (want \"layers\")",
            quote(&raw.rootfs.kind)
        )));
    }
    let rc = raw.config.unwrap_or_default();
    let keys = |m: Option<BTreeMap<String, serde_json::Value>>| {
        m.map(|m| m.into_keys().collect()).unwrap_or_default()
    };
    Ok(ConfigFile {
        platform: Platform {
            architecture: raw.architecture.unwrap_or_default(),
            os: raw.os.unwrap_or_default(),
            variant: raw.variant,
        },
        created: raw.created,
        config: ImageConfig {
            user: rc.user.unwrap_or_default(),
            env: rc.env.unwrap_or_default(),
            entrypoint: rc.entrypoint.unwrap_or_default(),
            cmd: rc.cmd.unwrap_or_default(),
            working_dir: rc.working_dir.unwrap_or_default(),
            stop_signal: rc.stop_signal.unwrap_or_default(),
            volumes: keys(rc.volumes),
            exposed_ports: keys(rc.exposed_ports),
            labels: rc.labels.unwrap_or_default(),
        },
        diff_ids: raw.rootfs.diff_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(n: u8) -> String {
        format!("sha256:{}", hex::encode([n; 32]))
    }

    fn entry(arch: &str, variant: Option<&str>, n: u8) -> serde_json::Value {
        let mut p = json!({"os": "linux", "architecture": arch});
        if let Some(v) = variant {
            p["variant"] = json!(v);
        }
        json!({"mediaType": OCI_MANIFEST, "digest": d(n), "size": 10, "platform": p})
    }

    fn index(entries: Vec<serde_json::Value>) -> Index {
        let doc = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries});
        match parse_document(doc.to_string().as_bytes()).unwrap() {
            Document::Index(i) => i,
            other => panic!("{other:?}"),
        }
    }

    fn plat(arch: &str, variant: Option<&str>) -> Platform {
        Platform {
            architecture: arch.into(),
            os: "linux".into(),
            variant: variant.map(Into::into),
        }
    }

    #[test]
    fn selects_host_platform() {
        let attestation = json!({"mediaType": OCI_MANIFEST, "digest": d(9), "size": 1,
            "platform": {"os": "unknown", "architecture": "unknown"}});
        let idx = index(vec![
            entry("arm64", Some("v8"), 1),
            attestation,
            entry("amd64", None, 2),
            entry("arm", Some("v7"), 3),
            entry("arm", Some("v6"), 4),
        ]);
        assert_eq!(
            select_manifest(&idx, &plat("amd64", None))
                .unwrap()
                .digest
                .to_string(),
            d(2)
        );
        assert_eq!(
            select_manifest(&idx, &plat("arm64", Some("v8")))
                .unwrap()
                .digest
                .to_string(),
            d(1)
        );
        assert_eq!(
            select_manifest(&idx, &plat("arm", Some("v7")))
                .unwrap()
                .digest
                .to_string(),
            d(3)
        );
        let err = select_manifest(&idx, &plat("s390x", None)).unwrap_err();
        assert!(err.to_string().contains("linux/amd64"), "{err}");
        assert_eq!(host_platform().os, "linux");
    }

    #[test]
    fn never_selects_a_variant_the_host_cannot_run() {
        let idx = index(vec![entry("amd64", Some("v3"), 1)]);
        assert!(select_manifest(&idx, &plat("amd64", None)).is_err());
        let idx = index(vec![entry("amd64", Some("v3"), 1), entry("amd64", None, 2)]);
        assert_eq!(
            select_manifest(&idx, &plat("amd64", None))
                .unwrap()
                .digest
                .to_string(),
            d(2)
        );
    }

    #[test]
    fn tells_manifests_from_indexes() {
        let m = json!({"schemaVersion": 2,
            "config": {"mediaType": OCI_CONFIG, "digest": d(1), "size": 5},
            "layers": [{"mediaType": OCI_LAYER_ZSTD, "digest": d(2), "size": 7}]});
        assert!(matches!(
            parse_document(m.to_string().as_bytes()).unwrap(),
            Document::Manifest(_)
        ));
        let i = json!({"schemaVersion": 2, "manifests": []});
        assert!(matches!(
            parse_document(i.to_string().as_bytes()).unwrap(),
            Document::Index(_)
        ));
    }

    #[test]
    fn rejects_unsupported_and_broken_manifests() {
        let cases = [
            json!({"schemaVersion": 1, "fsLayers": []}),
            json!({"schemaVersion": 2, "mediaType": "application/vnd.cncf.helm.chart"}),
            json!({"schemaVersion": 2, "config": {"mediaType": "application/vnd.cncf.helm.config.v1+json", "digest": d(1), "size": 1}, "layers": []}),
            json!({"schemaVersion": 2, "config": {"mediaType": OCI_CONFIG, "digest": d(1), "size": 1}, "layers": [{"mediaType": "application/wasm", "digest": d(2), "size": 1}]}),
            json!({"schemaVersion": 2, "config": {"mediaType": OCI_CONFIG, "digest": "sha256:../x", "size": 1}}),
            json!({"schemaVersion": 2, "config": {"mediaType": OCI_CONFIG, "digest": d(1), "size": -1}}),
            json!({"schemaVersion": 2, "config": {"mediaType": OCI_CONFIG, "digest": d(1), "size": 1u64 << 40}}),
        ];
        for c in cases {
            assert!(parse_document(c.to_string().as_bytes()).is_err(), "{c}");
        }
        assert!(parse_document(b"\xff\xfe").is_err());
    }

    #[test]
    fn parses_docker_config_with_nulls() {
        let cfg = json!({
            "architecture": "amd64", "os": "linux",
            "config": {"User": "1002:1002", "Env": ["PATH=/bin"], "Entrypoint": null,
                "Cmd": ["sh"], "WorkingDir": "/w", "StopSignal": "SIGQUIT",
                "Volumes": {"/data": {}}, "ExposedPorts": {"80/tcp": {}},
                "Labels": {"a": "b"}},
            "rootfs": {"type": "layers", "diff_ids": [d(1), d(2)]},
            "container_config": {"Hostname": "x"}
        });
        let c = parse_config(cfg.to_string().as_bytes()).unwrap();
        assert_eq!(c.config.user, "1002:1002");
        assert!(c.config.entrypoint.is_empty());
        assert_eq!(c.config.cmd, ["sh"]);
        assert_eq!(c.config.volumes, ["/data"]);
        assert_eq!(c.config.exposed_ports, ["80/tcp"]);
        assert_eq!(c.config.labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(c.diff_ids.len(), 2);
        let bare = json!({"rootfs": {"type": "layers", "diff_ids": []}, "config": null});
        assert_eq!(
            parse_config(bare.to_string().as_bytes()).unwrap().config,
            ImageConfig::default()
        );
        assert!(parse_config(b"{}").is_err());
    }
}
