//! The signature policy: the containers-policy.json format (as CRI-O,
//! podman and skopeo read it) for the parts that apply to a CRI runtime:
//! the `default` requirements and the `docker` transport's scopes, with
//! the requirement types `insecureAcceptAnything`, `reject` and
//! `sigstoreSigned` (public keys). Every other type (`signedBy`, GPG;
//! `sigstoreSigned` with `fulcio`, `pki` or Rekor keys) is kept as
//! [`Requirement::Unsupported`] and refuses the pulls it applies to, so
//! nothing a policy asks for is ever silently skipped.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use crust_quote::quote;
use serde_json::Value;
use sigstore::crypto::CosignVerificationKey;

use super::identity::SignedIdentity;
use super::typed::{Res, Typed};
use crate::reference::Reference;

/// Largest policy file read.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;
/// Largest public key file read.
const MAX_KEY_BYTES: u64 = 64 << 10;

/// A parsed policy.
#[derive(Debug)]
pub struct Policy {
    default: Vec<Requirement>,
    /// `transports.docker`: scope -> requirements; `""` is the
    /// transport's own default.
    docker: BTreeMap<String, Vec<Requirement>>,
}

#[derive(Debug)]
pub enum Requirement {
    InsecureAcceptAnything,
    Reject,
    SigstoreSigned(SigstoreSigned),
    /// A requirement crust cannot check: refuses what it applies to.
    Unsupported {
        kind: String,
        why: String,
    },
}

#[derive(Debug)]
pub struct SigstoreSigned {
    /// Any of them may have made the signature.
    pub keys: Vec<CosignVerificationKey>,
    pub identity: SignedIdentity,
}

/// The requirements that apply to an image, and where they come from
/// (`default`, or `transports.docker "<scope>"`).
pub struct Applicable<'a> {
    pub scope: String,
    pub requirements: &'a [Requirement],
}

impl Requirement {
    pub fn type_name(&self) -> &str {
        match self {
            Requirement::InsecureAcceptAnything => "insecureAcceptAnything",
            Requirement::Reject => "reject",
            Requirement::SigstoreSigned(_) => "sigstoreSigned",
            Requirement::Unsupported { kind, .. } => kind,
        }
    }
}

impl Policy {
    /// Reads and parses a policy file.
    pub fn load(path: &Path) -> Res<Policy> {
        let bytes = read_bounded(path, MAX_POLICY_BYTES)?;
        Policy::parse(&bytes)
    }

    /// Parses a policy document; key files it names are read now.
    pub fn parse(bytes: &[u8]) -> Res<Policy> {
        let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let obj = doc.as_object().ok_or("not a JSON object")?;
        for key in obj.keys() {
            if key != "default" && key != "transports" {
                return Err(format!("unknown key {}", quote(key)));
            }
        }
        let default = requirements(obj.get("default").ok_or("no \"default\" requirements")?)
            .map_err(|e| format!("default: {e}"))?;
        let mut docker = BTreeMap::new();
        if let Some(transports) = obj.get("transports") {
            let transports = transports
                .as_object()
                .ok_or("transports is not an object")?;
            for (name, scopes) in transports {
                let scopes = scopes
                    .as_object()
                    .ok_or_else(|| format!("transports.{name} is not an object"))?;
                // Other transports (atomic, oci, dir...) never apply to a
                // registry pull; their contents are not checked either.
                if name != "docker" {
                    continue;
                }
                for (scope, reqs) in scopes {
                    check_scope(scope)
                        .map_err(|e| format!("transports.docker {}: {e}", quote(scope)))?;
                    let reqs = requirements(reqs)
                        .map_err(|e| format!("transports.docker {}: {e}", quote(scope)))?;
                    docker.insert(scope.clone(), reqs);
                }
            }
        }
        Ok(Policy { default, docker })
    }

    /// The requirements for `reference`: the most specific
    /// `transports.docker` scope that matches (the reference itself, its
    /// repository, each enclosing namespace, its host, then `*.`
    /// wildcards of the host), else the transport's `""`, else `default`.
    pub fn for_reference(&self, reference: &Reference) -> Applicable<'_> {
        for scope in candidate_scopes(reference) {
            if let Some(reqs) = self.docker.get(&scope) {
                return Applicable {
                    scope: format!("transports.docker {}", quote(&scope)),
                    requirements: reqs,
                };
            }
        }
        if let Some(reqs) = self.docker.get("") {
            return Applicable {
                scope: "transports.docker \"\"".to_string(),
                requirements: reqs,
            };
        }
        Applicable {
            scope: "default".to_string(),
            requirements: &self.default,
        }
    }
}

/// Scopes that may apply to `reference`, most specific first.
pub fn candidate_scopes(reference: &Reference) -> Vec<String> {
    let name = reference.name();
    let mut out = Vec::new();
    if let Some(d) = reference.digest() {
        out.push(format!("{name}@{d}"));
    }
    if let Some(t) = reference.tag() {
        out.push(format!("{name}:{t}"));
    }
    let mut current = name.as_str();
    out.push(current.to_string());
    while let Some((parent, _)) = current.rsplit_once('/') {
        out.push(parent.to_string());
        current = parent;
    }
    // `*.example.com` matches hosts under example.com (never a port).
    let host = reference.domain();
    if !host.contains(':') {
        let mut rest = host;
        while let Some((_, parent)) = rest.split_once('.') {
            out.push(format!("*.{parent}"));
            rest = parent;
        }
    }
    out
}

/// A `transports.docker` scope must be written fully (as the matching
/// compares it): `host[:port]`, `host/ns/repo`, with a tag or digest, or
/// a `*.domain` wildcard.
fn check_scope(scope: &str) -> Res<()> {
    if scope.is_empty() {
        return Ok(());
    }
    if let Some(domain) = scope.strip_prefix("*.") {
        if domain.is_empty() || domain.contains(['/', ':', '*', '@']) {
            return Err("a wildcard scope is \"*.\" followed by a domain".into());
        }
        return Ok(());
    }
    if !scope.contains('/') {
        // A host alone: check it as the host of a reference.
        let probe = format!("{scope}/x");
        return match Reference::parse_name_or_ref(&probe) {
            Ok(r) if r.domain() == scope => Ok(()),
            _ => Err("not a registry host".into()),
        };
    }
    let parsed = Reference::parse_name_or_ref(scope).map_err(|e| e.to_string())?;
    if parsed.to_string() != scope {
        return Err(format!(
            "not written in full (the scope for it is {})",
            quote(&parsed.to_string())
        ));
    }
    Ok(())
}

fn requirements(value: &Value) -> Res<Vec<Requirement>> {
    let list = value.as_array().ok_or("requirements must be a list")?;
    if list.is_empty() {
        // containers/image refuses an empty list too: it would say nothing.
        return Err("an empty list of requirements".into());
    }
    list.iter()
        .enumerate()
        .map(|(i, r)| requirement(r).map_err(|e| format!("requirement {}: {e}", i + 1)))
        .collect()
}

fn requirement(value: &Value) -> Res<Requirement> {
    let typed = Typed::parse(value)?;
    let (obj, kind) = (typed.obj, typed.kind);
    let only = |allowed: &[&str]| typed.only(allowed);
    match kind {
        "insecureAcceptAnything" => {
            only(&["type"])?;
            Ok(Requirement::InsecureAcceptAnything)
        }
        "reject" => {
            only(&["type"])?;
            Ok(Requirement::Reject)
        }
        "sigstoreSigned" => {
            only(&[
                "type",
                "keyPath",
                "keyPaths",
                "keyData",
                "keyDatas",
                "fulcio",
                "pki",
                "rekorPublicKeyPath",
                "rekorPublicKeyPaths",
                "rekorPublicKeyData",
                "rekorPublicKeyDatas",
                "signedIdentity",
            ])?;
            sigstore_signed(obj)
        }
        "signedBy" => Ok(Requirement::Unsupported {
            kind: kind.to_string(),
            why: "GPG signatures are not supported by crust (use sigstoreSigned)".into(),
        }),
        "signedBaseLayer" => Ok(Requirement::Unsupported {
            kind: kind.to_string(),
            why: "base layer identities are not supported by crust".into(),
        }),
        other => Ok(Requirement::Unsupported {
            kind: crust_quote::truncate(other, 64),
            why: "not a requirement type crust knows".into(),
        }),
    }
}

fn sigstore_signed(obj: &serde_json::Map<String, Value>) -> Res<Requirement> {
    let unsupported = |why: &str| {
        Ok(Requirement::Unsupported {
            kind: "sigstoreSigned".into(),
            why: why.into(),
        })
    };
    if obj.contains_key("fulcio") {
        return unsupported(
            "keyless signatures (fulcio) are not supported: crust verifies signatures made \
             with the public keys a policy names (keyPath, keyPaths, keyData, keyDatas)",
        );
    }
    if obj.contains_key("pki") {
        return unsupported("pki (X.509 certificate roots) is not supported");
    }
    if obj.keys().any(|k| k.starts_with("rekorPublicKey")) {
        return unsupported(
            "Rekor transparency log checks (rekorPublicKey*) are not supported: crust \
             does not verify cosign bundles",
        );
    }
    let sources = ["keyPath", "keyPaths", "keyData", "keyDatas"];
    let given: Vec<&str> = sources
        .into_iter()
        .filter(|k| obj.contains_key(*k))
        .collect();
    let [source] = given[..] else {
        return Err(
            "sigstoreSigned needs exactly one of keyPath, keyPaths, keyData, keyDatas".into(),
        );
    };
    let value = &obj[source];
    let texts: Vec<&str> = match value {
        Value::String(s) if !source.ends_with('s') => vec![s.as_str()],
        Value::Array(list) if source.ends_with('s') && !list.is_empty() => list
            .iter()
            .map(|v| v.as_str().ok_or(format!("{source}: not a list of strings")))
            .collect::<Res<_>>()?,
        _ => return Err(format!("{source}: wrong type or empty")),
    };
    let keys = texts
        .iter()
        .map(|t| {
            let pem = if source.starts_with("keyPath") {
                let path = Path::new(t);
                if !path.is_absolute() {
                    return Err(format!("{source}: {} is not an absolute path", quote(t)));
                }
                read_bounded(path, MAX_KEY_BYTES).map_err(|e| format!("{source}: {e}"))?
            } else {
                base64::engine::general_purpose::STANDARD
                    .decode(t.trim())
                    .map_err(|_| format!("{source}: not base64"))?
            };
            CosignVerificationKey::try_from_pem(&pem)
                .map_err(|e| format!("{source}: not a public key crust can use: {e}"))
        })
        .collect::<Res<Vec<_>>>()?;
    let identity = match obj.get("signedIdentity") {
        None => SignedIdentity::MatchRepoDigestOrExact,
        Some(v) => SignedIdentity::parse(v).map_err(|e| format!("signedIdentity: {e}"))?,
    };
    Ok(Requirement::SigstoreSigned(SigstoreSigned {
        keys,
        identity,
    }))
}

/// Reads a small file whole, refusing larger ones.
fn read_bounded(path: &Path, max: u64) -> Res<Vec<u8>> {
    use std::io::Read as _;
    let shown = crust_quote::quote_os(path.as_os_str());
    let file = std::fs::File::open(path).map_err(|e| format!("reading {shown}: {e}"))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading {shown}: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("{shown} is larger than {max} bytes"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_pem() -> String {
        use sigstore::crypto::SigningScheme;
        let signer = SigningScheme::ECDSA_P256_SHA256_ASN1
            .create_signer()
            .unwrap();
        signer
            .to_sigstore_keypair()
            .unwrap()
            .public_key_to_pem()
            .unwrap()
    }

    fn key_data() -> String {
        base64::engine::general_purpose::STANDARD.encode(key_pem())
    }

    fn reference(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    fn scope_of(policy: &Policy, r: &str) -> (String, Vec<String>) {
        let a = policy.for_reference(&reference(r));
        let types = a
            .requirements
            .iter()
            .map(|r| r.type_name().to_string())
            .collect();
        (a.scope, types)
    }

    #[test]
    fn the_most_specific_scope_wins() {
        let policy = Policy::parse(
            serde_json::json!({
                "default": [{"type": "reject"}],
                "transports": {"docker": {
                    "": [{"type": "insecureAcceptAnything"}],
                    "example.com": [{"type": "reject"}],
                    "example.com/team": [{"type": "insecureAcceptAnything"}],
                    "example.com/team/app": [{"type": "reject"}],
                    "example.com/team/app:v1": [{"type": "insecureAcceptAnything"}],
                    "*.corp.example": [{"type": "reject"}],
                    "docker.io/library/busybox": [{"type": "reject"}],
                }, "atomic": {"whatever": [{"type": "anything"}]}},
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let cases = [
            ("example.com/team/app:v1", "example.com/team/app:v1"),
            ("example.com/team/app:v2", "example.com/team/app"),
            ("example.com/team/other:v1", "example.com/team"),
            ("example.com/x/y", "example.com"),
            ("a.b.corp.example/r", "*.corp.example"),
            ("busybox", "docker.io/library/busybox"),
            ("quay.io/x/y", ""),
        ];
        for (r, scope) in cases {
            assert_eq!(
                scope_of(&policy, r).0,
                format!("transports.docker {}", quote(scope)),
                "{r}"
            );
        }
        let digest = format!("example.com/team/app@sha256:{}", "a".repeat(64));
        assert_eq!(
            scope_of(&policy, &digest).0,
            "transports.docker \"example.com/team/app\""
        );
        let p = Policy::parse(br#"{"default":[{"type":"reject"}]}"#).unwrap();
        assert_eq!(scope_of(&p, "x/y").0, "default");
        assert_eq!(scope_of(&p, "x/y").1, ["reject"]);
    }

    #[test]
    fn candidates_go_from_the_reference_to_host_wildcards() {
        let r = reference("a.b.example.com:5000/ns/repo:t");
        assert_eq!(
            candidate_scopes(&r),
            [
                "a.b.example.com:5000/ns/repo:t",
                "a.b.example.com:5000/ns/repo",
                "a.b.example.com:5000/ns",
                "a.b.example.com:5000",
            ]
        );
        let r = reference("a.b.c/r");
        assert_eq!(
            candidate_scopes(&r),
            ["a.b.c/r:latest", "a.b.c/r", "a.b.c", "*.b.c", "*.c"]
        );
    }

    #[test]
    fn sigstore_requirements_read_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.pub");
        std::fs::write(&path, key_pem()).unwrap();
        for req in [
            serde_json::json!({"type": "sigstoreSigned", "keyPath": path}),
            serde_json::json!({"type": "sigstoreSigned", "keyPaths": [path, path]}),
            serde_json::json!({"type": "sigstoreSigned", "keyData": key_data()}),
            serde_json::json!({"type": "sigstoreSigned", "keyDatas": [key_data()],
                "signedIdentity": {"type": "matchRepository"}}),
        ] {
            let doc = serde_json::json!({"default": [req]}).to_string();
            let p = Policy::parse(doc.as_bytes()).unwrap_or_else(|e| panic!("{doc}: {e}"));
            let Requirement::SigstoreSigned(s) = &p.default[0] else {
                panic!("{doc}");
            };
            assert!(!s.keys.is_empty());
        }
    }

    #[test]
    fn bad_policies_are_errors_naming_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("[]", "not a JSON object"),
            ("{", "not JSON"),
            ("{}", "no \"default\""),
            (r#"{"default":[]}"#, "empty list"),
            (
                r#"{"default":[{"type":"reject","x":1}]}"#,
                "unknown key \"x\"",
            ),
            (r#"{"default":[{}]}"#, "requirement 1: no \"type\""),
            (
                r#"{"default":[{"type":"reject"}],"extra":1}"#,
                "unknown key",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned"}]}"#,
                "exactly one of keyPath",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"rel.pub"}]}"#,
                "not an absolute path",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyPath":"/nonexistent/k.pub"}]}"#,
                "/nonexistent/k.pub",
            ),
            (
                r#"{"default":[{"type":"sigstoreSigned","keyData":"bm90IGEga2V5"}]}"#,
                "not a public key",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"docker":{"docker.io/busybox":[{"type":"reject"}]}}}"#,
                "docker.io/library/busybox",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"docker":{"busybox":[{"type":"reject"}]}}}"#,
                "not a registry host",
            ),
            (
                r#"{"default":[{"type":"reject"}],"transports":{"docker":{"*.a/b":[{"type":"reject"}]}}}"#,
                "wildcard",
            ),
        ];
        for (doc, want) in cases {
            let err = Policy::parse(doc.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{doc}: {err}");
        }
    }

    #[test]
    fn unsupported_requirements_are_kept_to_refuse_with_their_name() {
        let doc = serde_json::json!({"default": [
            {"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k.gpg"},
            {"type": "sigstoreSigned", "fulcio": {}, "rekorPublicKeyPath": "/r.pub"},
            {"type": "sigstoreSigned", "keyData": key_data(), "rekorPublicKeyData": "x"},
            {"type": "teleport"},
        ]})
        .to_string();
        let p = Policy::parse(doc.as_bytes()).unwrap();
        let whys: Vec<(&str, &str)> = p
            .default
            .iter()
            .map(|r| match r {
                Requirement::Unsupported { kind, why } => (kind.as_str(), why.as_str()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(whys[0].0, "signedBy");
        assert!(whys[1].1.contains("fulcio"), "{whys:?}");
        assert!(whys[2].1.contains("Rekor"), "{whys:?}");
        assert_eq!(whys[3].0, "teleport");
    }
}
