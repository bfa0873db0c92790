//! `signedIdentity`: which image names a signature's
//! `critical.identity.docker-reference` may carry for the image pulled
//! (containers-policy.json's rules, compared on fully expanded names:
//! `busybox` is `docker.io/library/busybox`).

use crust_quote::quote;
use serde_json::Value;

use super::typed::{Res, Typed};
use crate::reference::Reference;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedIdentity {
    /// The signed reference is the pulled one, tag or digest included.
    MatchExact,
    /// Pulled by digest: the same repository; by tag: [`Self::MatchExact`].
    /// The default.
    MatchRepoDigestOrExact,
    /// The same repository, any tag or digest.
    MatchRepository,
    /// The signed reference is this one (tag or digest included).
    ExactReference(Reference),
    /// The signed reference is in this repository.
    ExactRepository(Reference),
    /// The pulled name with `prefix` replaced by `signed_prefix`, then as
    /// [`Self::MatchRepoDigestOrExact`] (images mirrored under another name).
    RemapIdentity {
        prefix: String,
        signed_prefix: String,
    },
}

impl SignedIdentity {
    pub fn parse(value: &Value) -> Res<SignedIdentity> {
        let typed = Typed::parse(value)?;
        let (obj, kind) = (typed.obj, typed.kind);
        let only = |allowed: &[&str]| typed.only(allowed);
        let text = |key: &str| -> Res<&str> {
            obj.get(key)
                .and_then(Value::as_str)
                .ok_or(format!("{kind} needs {key}"))
        };
        match kind {
            "matchExact" => only(&["type"]).map(|()| SignedIdentity::MatchExact),
            "matchRepoDigestOrExact" => {
                only(&["type"]).map(|()| SignedIdentity::MatchRepoDigestOrExact)
            }
            "matchRepository" => only(&["type"]).map(|()| SignedIdentity::MatchRepository),
            "exactReference" => {
                only(&["type", "dockerReference"])?;
                let r = parse_ref(text("dockerReference")?)?;
                if r.tag().is_none() && r.digest().is_none() {
                    return Err("exactReference: dockerReference needs a tag or digest".into());
                }
                Ok(SignedIdentity::ExactReference(r))
            }
            "exactRepository" => {
                only(&["type", "dockerRepository"])?;
                let r = parse_ref(text("dockerRepository")?)?;
                if r.tag().is_some() || r.digest().is_some() {
                    return Err("exactRepository: dockerRepository is a repository name".into());
                }
                Ok(SignedIdentity::ExactRepository(r))
            }
            "remapIdentity" => {
                only(&["type", "prefix", "signedPrefix"])?;
                let prefix = check_prefix(text("prefix")?)?;
                let signed_prefix = check_prefix(text("signedPrefix")?)?;
                Ok(SignedIdentity::RemapIdentity {
                    prefix,
                    signed_prefix,
                })
            }
            other => Err(format!(
                "unknown type {}",
                quote(&crust_quote::truncate(other, 64))
            )),
        }
    }

    /// The rule's name in the policy.
    pub fn type_name(&self) -> &'static str {
        match self {
            SignedIdentity::MatchExact => "matchExact",
            SignedIdentity::MatchRepoDigestOrExact => "matchRepoDigestOrExact",
            SignedIdentity::MatchRepository => "matchRepository",
            SignedIdentity::ExactReference(_) => "exactReference",
            SignedIdentity::ExactRepository(_) => "exactRepository",
            SignedIdentity::RemapIdentity { .. } => "remapIdentity",
        }
    }

    /// Whether a signature for `signed` is one for the image pulled as
    /// `pulled`.
    pub fn matches(&self, pulled: &Reference, signed: &Reference) -> bool {
        match self {
            SignedIdentity::MatchExact => exact(pulled, signed),
            SignedIdentity::MatchRepoDigestOrExact => repo_digest_or_exact(pulled, signed),
            SignedIdentity::MatchRepository => pulled.name() == signed.name(),
            SignedIdentity::ExactReference(r) => exact(r, signed),
            SignedIdentity::ExactRepository(r) => r.name() == signed.name(),
            SignedIdentity::RemapIdentity {
                prefix,
                signed_prefix,
            } => {
                let text = pulled.to_string();
                let remapped = match text.strip_prefix(prefix.as_str()) {
                    // Whole components only: `a/b` is no prefix of `a/bc`.
                    Some(rest) if rest.is_empty() || rest.starts_with(['/', ':', '@']) => {
                        match Reference::parse_name_or_ref(&format!("{signed_prefix}{rest}")) {
                            Ok(r) => r,
                            Err(_) => return false,
                        }
                    }
                    _ => pulled.clone(),
                };
                repo_digest_or_exact(&remapped, signed)
            }
        }
    }
}

fn exact(a: &Reference, b: &Reference) -> bool {
    let named_only = |r: &Reference| r.tag().is_none() && r.digest().is_none();
    !named_only(a) && !named_only(b) && a == b
}

fn repo_digest_or_exact(pulled: &Reference, signed: &Reference) -> bool {
    if pulled.digest().is_some() {
        pulled.name() == signed.name()
    } else {
        exact(pulled, signed)
    }
}

fn parse_ref(s: &str) -> Res<Reference> {
    let r = Reference::parse_name_or_ref(s).map_err(|e| e.to_string())?;
    if r.to_string() != s {
        return Err(format!(
            "{} is not written in full ({})",
            quote(s),
            quote(&r.to_string())
        ));
    }
    Ok(r)
}

/// A remapIdentity prefix: a host, or a repository or namespace in full.
fn check_prefix(s: &str) -> Res<String> {
    let probe = if s.contains('/') {
        s.to_string()
    } else {
        format!("{s}/x")
    };
    match Reference::parse_name_or_ref(&probe) {
        Ok(r) if r.tag().is_none() && r.digest().is_none() && r.name() == probe => {
            Ok(s.to_string())
        }
        _ => Err(format!(
            "prefix {} is not a host or a repository name in full",
            quote(s)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn r(s: &str) -> Reference {
        Reference::parse_name_or_ref(s).unwrap()
    }

    fn pulled(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    fn id(v: Value) -> SignedIdentity {
        SignedIdentity::parse(&v).unwrap()
    }

    #[test]
    fn identity_rules_as_containers_policy_json_defines_them() {
        use serde_json::json;
        let by_digest = pulled(&format!("reg.io/a/b@{D}"));
        let by_tag = pulled("reg.io/a/b:v1");
        let cases: Vec<(SignedIdentity, Reference, &str, bool)> = vec![
            (
                SignedIdentity::MatchExact,
                by_tag.clone(),
                "reg.io/a/b:v1",
                true,
            ),
            (
                SignedIdentity::MatchExact,
                by_tag.clone(),
                "reg.io/a/b:v2",
                false,
            ),
            (
                SignedIdentity::MatchExact,
                by_tag.clone(),
                "reg.io/a/b",
                false,
            ),
            (
                SignedIdentity::MatchRepoDigestOrExact,
                by_tag.clone(),
                "reg.io/a/b:v1",
                true,
            ),
            (
                SignedIdentity::MatchRepoDigestOrExact,
                by_tag.clone(),
                "reg.io/a/b",
                false,
            ),
            (
                SignedIdentity::MatchRepoDigestOrExact,
                by_digest.clone(),
                "reg.io/a/b",
                true,
            ),
            (
                SignedIdentity::MatchRepoDigestOrExact,
                by_digest.clone(),
                "reg.io/a/c",
                false,
            ),
            (
                SignedIdentity::MatchRepository,
                by_tag.clone(),
                "reg.io/a/b",
                true,
            ),
            (
                SignedIdentity::MatchRepository,
                by_tag.clone(),
                "reg.io/a/b:other",
                true,
            ),
            (
                SignedIdentity::MatchRepository,
                by_tag.clone(),
                "reg.io/a/bc",
                false,
            ),
            (
                SignedIdentity::MatchRepository,
                by_tag.clone(),
                "other.io/a/b",
                false,
            ),
            (
                id(json!({"type": "exactReference", "dockerReference": "reg.io/x/y:v9"})),
                by_tag.clone(),
                "reg.io/x/y:v9",
                true,
            ),
            (
                id(json!({"type": "exactReference", "dockerReference": "reg.io/x/y:v9"})),
                by_tag.clone(),
                "reg.io/a/b:v1",
                false,
            ),
            (
                id(json!({"type": "exactRepository", "dockerRepository": "reg.io/x/y"})),
                by_tag.clone(),
                "reg.io/x/y:anything",
                true,
            ),
            (
                id(json!({"type": "exactRepository", "dockerRepository": "reg.io/x/y"})),
                by_tag.clone(),
                "reg.io/a/b:v1",
                false,
            ),
            (
                id(json!({"type": "remapIdentity", "prefix": "mirror.local/up",
                    "signedPrefix": "reg.io/a"})),
                pulled("mirror.local/up/b:v1"),
                "reg.io/a/b:v1",
                true,
            ),
            (
                id(json!({"type": "remapIdentity", "prefix": "mirror.local/up",
                    "signedPrefix": "reg.io/a"})),
                pulled("mirror.local/upx/b:v1"),
                "reg.io/a/b:v1",
                false,
            ),
            (
                id(json!({"type": "remapIdentity", "prefix": "mirror.local",
                    "signedPrefix": "reg.io"})),
                pulled(&format!("mirror.local/a/b@{D}")),
                "reg.io/a/b",
                true,
            ),
            // Normalised names: docker.io/library.
            (
                SignedIdentity::MatchRepository,
                pulled("busybox"),
                "docker.io/library/busybox",
                true,
            ),
        ];
        for (rule, p, signed, want) in cases {
            assert_eq!(rule.matches(&p, &r(signed)), want, "{rule:?} {p} {signed}");
        }
    }

    #[test]
    fn bad_identities_are_errors() {
        use serde_json::json;
        for (v, want) in [
            (
                json!({"type": "exactReference", "dockerReference": "reg.io/x/y"}),
                "tag or digest",
            ),
            (
                json!({"type": "exactReference", "dockerReference": "busybox:1"}),
                "in full",
            ),
            (
                json!({"type": "exactRepository", "dockerRepository": "reg.io/x:1"}),
                "repository",
            ),
            (json!({"type": "exactRepository"}), "needs dockerRepository"),
            (
                json!({"type": "remapIdentity", "prefix": "Bad Prefix", "signedPrefix": "a.io"}),
                "prefix",
            ),
            (json!({"type": "matchExact", "extra": 1}), "unknown key"),
            (json!({"type": "matchSomething"}), "unknown type"),
            (json!("matchExact"), "not an object"),
        ] {
            let err = SignedIdentity::parse(&v).unwrap_err();
            assert!(err.contains(want), "{v}: {err}");
        }
    }

    proptest::proptest! {
        #![proptest_config(crust_quote::testing::config(512))]

        /// Any identity document: a rule or an error, never a panic; any
        /// signed reference text: matched or not, never a panic.
        #[test]
        fn any_identity_parses_or_errs(
            kind in proptest::prop_oneof![
                "matchExact", "matchRepository", "exactReference", "exactRepository",
                "remapIdentity", "[a-zA-Z]{0,12}",
            ],
            a in crust_quote::testing::hostile_string(),
            b in crust_quote::testing::hostile_string(),
            signed in proptest::prop_oneof![
                crust_quote::testing::hostile_string(),
                "[a-z.]{1,8}(:[0-9]{1,4})?/[a-z/]{1,12}(:[a-z0-9]{1,6})?",
            ],
        ) {
            let v = serde_json::json!({
                "type": kind, "dockerReference": a, "dockerRepository": a,
                "prefix": a, "signedPrefix": b,
            });
            let _ = SignedIdentity::parse(&v);
            for key in ["dockerReference", "dockerRepository"] {
                let v = serde_json::json!({"type": kind, key: a});
                if let Ok(rule) = SignedIdentity::parse(&v)
                    && let Ok(signed) = Reference::parse_name_or_ref(&signed)
                {
                    let _ = rule.matches(&pulled("reg.io/a/b:v1"), &signed);
                }
            }
            let v = serde_json::json!({"type": "remapIdentity", "prefix": "reg.io", "signedPrefix": b});
            if let Ok(rule) = SignedIdentity::parse(&v)
                && let Ok(signed) = Reference::parse_name_or_ref(&signed)
            {
                let _ = rule.matches(&pulled("reg.io/a/b:v1"), &signed);
            }
        }
    }
}
