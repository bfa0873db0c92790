//! Image signature verification at pull time: the policy
//! (containers-policy.json, [`policy`]) says what an image needs; cosign
//! signatures ([`cosign`]) stored beside it in its registry are checked
//! against the policy's public keys and signed identity rules
//! ([`identity`]). Runs after the image's top manifest is fetched and
//! before anything of the image is stored or any layer fetched: a refused
//! image leaves nothing behind.
//!
//! Which policy: `<signature_policy_dir>/<namespace>.json` when the pull
//! names a pod namespace and that file exists, else `signature_policy`,
//! else none (no verification), as CRI-O chooses. The file is read at
//! each pull, so an edited policy applies to the next pull without a
//! reload.

pub mod cosign;
pub mod identity;
pub mod policy;
mod typed;

use std::path::{Path, PathBuf};

use crust_quote::quote;

pub use identity::SignedIdentity;
pub use policy::{Policy, Requirement};

use crate::digest::Digest;
use crate::error::{Error, ErrorKind, Result};
use crate::reference::Reference;
use crate::registry::Remote;
use policy::SigstoreSigned;

/// Where signature policies are (the `[image]` config keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyFiles {
    /// `signature_policy`: the node's policy; None: images are not checked
    /// (unless a namespace has a policy of its own).
    pub policy: Option<PathBuf>,
    /// `signature_policy_dir`: `<dir>/<namespace>.json` per pod namespace.
    pub dir: Option<PathBuf>,
}

/// What the policy decided for an image it let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No policy applies: not checked (as before policies existed).
    Unchecked,
    /// The policy accepts the image without a signature
    /// (`insecureAcceptAnything`).
    Accepted,
    /// Every `sigstoreSigned` requirement found a valid signature.
    Verified,
}

impl PolicyFiles {
    /// The policy file for a pull in `namespace` (`None` or `""`: not a
    /// pod's pull); None: no verification.
    pub fn select(&self, namespace: Option<&str>) -> Option<PathBuf> {
        if let (Some(dir), Some(ns)) = (&self.dir, namespace.filter(|n| !n.is_empty())) {
            // check_namespace ran first: `ns` is one path component.
            let path = dir.join(format!("{ns}.json"));
            if path.exists() {
                return Some(path);
            }
        }
        self.policy.clone()
    }
}

/// A Kubernetes namespace name (an RFC 1123 label): the only names that
/// may select a policy file, so none can point outside the dir.
pub fn check_namespace(ns: &str) -> Result<()> {
    let ok = ns.len() <= 63
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "namespace {} is not a Kubernetes namespace name (lowercase letters, digits and \
             '-', at most 63)",
            quote(ns)
        )))
    }
}

/// Checks the image `reference` (whose top manifest has `digest`) against
/// the policy at `path`.
pub(crate) async fn check(
    path: &Path,
    remote: &Remote,
    reference: &Reference,
    digest: &Digest,
) -> Result<Verdict> {
    let shown = path.display().to_string();
    let owned = path.to_path_buf();
    let policy = tokio::task::spawn_blocking(move || Policy::load(&owned))
        .await
        .map_err(|e| Error::Internal(format!("policy task: {e}")))?
        .map_err(|reason| Error::Policy {
            path: shown.clone(),
            reason,
        })?;
    let applicable = policy.for_reference(reference);
    let refuse = |i: usize, req: &Requirement, reason: String| Error::SignatureRefused {
        image: reference.to_string(),
        policy: shown.clone(),
        rule: format!(
            "{} requirement {} ({})",
            applicable.scope,
            i + 1,
            req.type_name()
        ),
        reason,
    };
    let mut signatures: Option<Signatures> = None;
    let mut verified = false;
    for (i, req) in applicable.requirements.iter().enumerate() {
        match req {
            Requirement::InsecureAcceptAnything => {}
            Requirement::Reject => {
                return Err(refuse(i, req, "the policy rejects these images".into()));
            }
            Requirement::Unsupported { kind, why } => {
                return Err(refuse(
                    i,
                    req,
                    format!("requirement type {} is not supported: {why}", quote(kind)),
                ));
            }
            Requirement::SigstoreSigned(rule) => {
                if signatures.is_none() {
                    signatures = Some(fetch_signatures(remote, digest).await?);
                }
                let sigs = match &signatures {
                    Some(Ok(sigs)) => sigs.as_slice(),
                    Some(Err(why)) => return Err(refuse(i, req, why.clone())),
                    None => &[],
                };
                accept_any(rule, sigs, reference, digest).map_err(|r| refuse(i, req, r))?;
                verified = true;
            }
        }
    }
    Ok(if verified {
        Verdict::Verified
    } else {
        Verdict::Accepted
    })
}

/// A signature and its payload's bytes (not yet trusted).
struct Fetched {
    signature: String,
    payload: std::result::Result<Vec<u8>, String>,
}

/// An image's signatures, or why its signature manifest is unusable.
type Signatures = std::result::Result<Vec<Fetched>, String>;

/// The cosign signatures of `digest` in the image's repository; none when
/// there is no signature tag. Err: the registry failed (the pull fails as
/// for any registry error); Ok(Err): the signature manifest is no such
/// thing, so the image has no signature the policy can take.
async fn fetch_signatures(remote: &Remote, digest: &Digest) -> Result<Signatures> {
    let Some(manifest) = remote.fetch_tagged(&cosign::signature_tag(digest)).await? else {
        return Ok(Ok(Vec::new()));
    };
    let signed = match cosign::signatures_in(&manifest) {
        Ok(signed) => signed,
        Err(why) => return Ok(Err(format!("{}: {why}", cosign::signature_tag(digest)))),
    };
    let mut out = Vec::with_capacity(signed.len());
    for s in signed {
        let payload = if s.payload.size > cosign::MAX_PAYLOAD_BYTES {
            Err(format!(
                "payload of {} bytes is over the {} byte limit",
                s.payload.size,
                cosign::MAX_PAYLOAD_BYTES
            ))
        } else {
            match remote
                .fetch_blob_bytes(&s.payload, cosign::MAX_PAYLOAD_BYTES)
                .await
            {
                Ok(bytes) => Ok(bytes),
                // A payload the registry lost or mangled: that signature
                // does not count.
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidContent) => {
                    Err(e.to_string())
                }
                Err(e) => return Err(e),
            }
        };
        out.push(Fetched {
            signature: s.signature,
            payload,
        });
    }
    Ok(Ok(out))
}

/// Ok if one signature satisfies `rule`; else why none did.
fn accept_any(
    rule: &SigstoreSigned,
    sigs: &[Fetched],
    reference: &Reference,
    digest: &Digest,
) -> std::result::Result<(), String> {
    if sigs.is_empty() {
        return Err(format!(
            "no cosign signature (tag {} in its repository)",
            cosign::signature_tag(digest)
        ));
    }
    let mut why = Vec::new();
    for s in sigs {
        match accept_one(rule, s, reference, digest) {
            Ok(()) => return Ok(()),
            Err(e) => why.push(e),
        }
    }
    Err(format!(
        "{} signature(s), none accepted: {}",
        sigs.len(),
        why.join("; ")
    ))
}

fn accept_one(
    rule: &SigstoreSigned,
    s: &Fetched,
    reference: &Reference,
    digest: &Digest,
) -> std::result::Result<(), String> {
    let payload = s.payload.as_deref().map_err(|e| e.clone())?;
    cosign::verify(&rule.keys, &s.signature, payload)?;
    let p = cosign::parse_payload(payload)?;
    if &p.manifest_digest != digest {
        return Err(format!(
            "it signs manifest {}, not the image's {digest}",
            p.manifest_digest
        ));
    }
    if !rule.identity.matches(reference, &p.docker_reference) {
        return Err(format!(
            "it signs the identity {}, which signedIdentity {} does not accept for {}",
            quote(&p.docker_reference.to_string()),
            rule.identity.type_name(),
            quote(&reference.to_string())
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_select_their_file_or_fall_back() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("strict.json"), "{}").unwrap();
        let files = PolicyFiles {
            policy: Some("/etc/node.json".into()),
            dir: Some(dir.path().to_path_buf()),
        };
        assert_eq!(
            files.select(Some("strict")),
            Some(dir.path().join("strict.json"))
        );
        assert_eq!(files.select(Some("other")), Some("/etc/node.json".into()));
        assert_eq!(files.select(None), Some("/etc/node.json".into()));
        assert_eq!(files.select(Some("")), Some("/etc/node.json".into()));
        let only_dir = PolicyFiles {
            policy: None,
            ..files
        };
        assert_eq!(only_dir.select(Some("other")), None);
        assert_eq!(PolicyFiles::default().select(Some("strict")), None);
    }

    #[test]
    fn only_namespace_names_select_files() {
        for ok in ["default", "kube-system", "a", &"a".repeat(63)] {
            check_namespace(ok).unwrap();
        }
        for bad in [
            "..",
            "../etc",
            "a/b",
            "A",
            "-a",
            "a-",
            &"a".repeat(64),
            "a.b",
        ] {
            let e = check_namespace(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
    }
}
