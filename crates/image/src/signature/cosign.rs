//! Cosign signatures as cosign stores them: an OCI manifest tagged
//! `sha256-<hex of the signed manifest's digest>.sig` in the image's own
//! repository, one layer per signature. A layer's blob is a "simple
//! signing" payload (JSON naming the signed manifest digest and the image
//! name it was signed as); its annotation
//! `dev.cosignproject.cosign/signature` is the base64 signature over the
//! blob's bytes. The optional `dev.sigstore.cosign/bundle` annotation (a
//! Rekor inclusion promise) is not needed to verify with a public key and
//! is not read.

use base64::Engine as _;
use serde::Deserialize;
use sigstore::crypto::{CosignVerificationKey, Signature as RawSignature};

use super::typed::Res;
use crate::digest::Digest;
use crate::manifest::{Descriptor, Manifest};
use crate::reference::Reference;

pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a cosign image signature.
pub const COSIGN_TYPE: &str = "cosign container image signature";
/// Signatures of one image looked at, at most.
pub const MAX_SIGNATURES: usize = 32;
/// Largest payload blob fetched.
pub const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
/// Longest base64 signature accepted (an RSA-8192 signature is 1366).
const MAX_SIGNATURE_TEXT: usize = 4096;

/// The tag cosign gives the signatures of the manifest `digest`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// One signature of a signature manifest: where its payload is, and the
/// signature over it.
#[derive(Debug, Clone)]
pub struct Signed {
    pub payload: Descriptor,
    pub signature: String,
}

/// The signatures a signature manifest holds (layers of other types are
/// not signatures and are passed over).
pub fn signatures_in(manifest: &[u8]) -> Res<Vec<Signed>> {
    let m: Manifest = serde_json::from_slice(manifest)
        .map_err(|e| format!("the signature manifest is not an OCI manifest: {e}"))?;
    let mut out = Vec::new();
    for layer in m.layers {
        if layer.media_type != SIMPLE_SIGNING {
            continue;
        }
        let Some(signature) = layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            .cloned()
        else {
            continue;
        };
        if out.len() == MAX_SIGNATURES {
            break;
        }
        out.push(Signed {
            payload: layer,
            signature,
        });
    }
    Ok(out)
}

/// What a payload says was signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub manifest_digest: Digest,
    pub docker_reference: Reference,
}

#[derive(Deserialize)]
struct PayloadDoc {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    identity: Identity,
    image: ImageField,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Deserialize)]
struct ImageField {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// Parses a simple-signing payload (only after its signature verified:
/// until then it is anyone's text).
pub fn parse_payload(bytes: &[u8]) -> Res<Payload> {
    let doc: PayloadDoc = serde_json::from_slice(bytes)
        .map_err(|e| format!("the signed payload is not a simple signing document: {e}"))?;
    let c = doc.critical;
    if c.kind != COSIGN_TYPE {
        return Err(format!(
            "the signed payload's type is {}, not {COSIGN_TYPE:?}",
            crust_quote::quote(&c.kind)
        ));
    }
    let manifest_digest = Digest::parse(&c.image.docker_manifest_digest)
        .map_err(|e| format!("the signed manifest digest: {e}"))?;
    let docker_reference = Reference::parse_name_or_ref(&c.identity.docker_reference)
        .map_err(|e| format!("the signed identity: {e}"))?;
    Ok(Payload {
        manifest_digest,
        docker_reference,
    })
}

/// Whether one of `keys` made `signature` (base64) over `payload`.
pub fn verify(keys: &[CosignVerificationKey], signature: &str, payload: &[u8]) -> Res<()> {
    if signature.len() > MAX_SIGNATURE_TEXT {
        return Err("the signature annotation is too long".into());
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(signature.trim())
        .map_err(|_| "the signature annotation is not base64".to_string())?;
    if keys
        .iter()
        .any(|k| k.verify_signature(RawSignature::Raw(&raw), payload).is_ok())
    {
        Ok(())
    } else {
        Err("the signature was not made by any key of the policy".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigstore::crypto::SigningScheme;

    fn payload(digest: &str, reference: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {"docker-reference": reference},
                "image": {"docker-manifest-digest": digest},
                "type": COSIGN_TYPE,
            },
            "optional": null,
        }))
        .unwrap()
    }

    #[test]
    fn signatures_verify_with_their_key_only() {
        let d = Digest::of(b"m");
        let body = payload(&d.to_string(), "reg.io/a/b");
        for scheme in [
            SigningScheme::ECDSA_P256_SHA256_ASN1,
            SigningScheme::ECDSA_P384_SHA384_ASN1,
            SigningScheme::ED25519,
        ] {
            let signer = scheme.create_signer().unwrap();
            let other = scheme.create_signer().unwrap();
            let sig = base64::engine::general_purpose::STANDARD.encode(signer.sign(&body).unwrap());
            let key = signer.to_verification_key().unwrap();
            let wrong = other.to_verification_key().unwrap();
            verify(std::slice::from_ref(&key), &sig, &body).unwrap();
            verify(&[wrong.clone(), key.clone()], &sig, &body).unwrap();
            assert!(verify(std::slice::from_ref(&wrong), &sig, &body).is_err());
            let mut tampered = body.clone();
            tampered[5] ^= 1;
            assert!(verify(std::slice::from_ref(&key), &sig, &tampered).is_err());
            assert!(verify(std::slice::from_ref(&key), "%%%", &body).is_err());
        }
        let p = parse_payload(&body).unwrap();
        assert_eq!(p.manifest_digest, d);
        assert_eq!(p.docker_reference.to_string(), "reg.io/a/b");
        assert_eq!(signature_tag(&d), format!("sha256-{}.sig", d.hex()));
    }

    #[test]
    fn payloads_of_other_kinds_are_refused() {
        let d = Digest::of(b"m").to_string();
        let mut v: serde_json::Value = serde_json::from_slice(&payload(&d, "r.io/a")).unwrap();
        v["critical"]["type"] = "atomic container signature".into();
        let err = parse_payload(v.to_string().as_bytes()).unwrap_err();
        assert!(err.contains("type"), "{err}");
        assert!(parse_payload(&payload("sha256:short", "r.io/a")).is_err());
        assert!(parse_payload(&payload(&d, "Not A Ref")).is_err());
        assert!(parse_payload(b"{}").is_err());
    }

    proptest::proptest! {
        #![proptest_config(crust_quote::testing::config(512))]

        /// Whatever a registry serves as a signature manifest or payload:
        /// parsed or refused, never a panic; at most MAX_SIGNATURES kept.
        #[test]
        fn any_registry_answer_parses_or_is_refused(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
            kind in crust_quote::testing::hostile_string(),
            text in crust_quote::testing::hostile_string(),
            layers in 0usize..40,
        ) {
            let _ = signatures_in(&bytes);
            let _ = parse_payload(&bytes);
            let doc = serde_json::json!({"critical": {
                "identity": {"docker-reference": text},
                "image": {"docker-manifest-digest": text},
                "type": kind,
            }});
            proptest::prop_assert!(parse_payload(doc.to_string().as_bytes()).is_err());
            let layer = serde_json::json!({
                "mediaType": SIMPLE_SIGNING, "digest": Digest::of(b"p").to_string(),
                "size": 1, "annotations": {SIGNATURE_ANNOTATION: text},
            });
            let m = serde_json::json!({
                "schemaVersion": 2,
                "config": {"mediaType": kind, "digest": Digest::of(b"c").to_string(), "size": 2},
                "layers": vec![layer; layers],
            });
            let sigs = signatures_in(m.to_string().as_bytes()).unwrap();
            proptest::prop_assert_eq!(sigs.len(), layers.min(MAX_SIGNATURES));
            let _ = verify(&[], &text, &bytes);
        }
    }

    #[test]
    fn signature_manifests_list_their_signed_layers() {
        let layer = |media: &str, sig: Option<&str>| {
            let mut l = serde_json::json!({
                "mediaType": media, "digest": Digest::of(media.as_bytes()).to_string(), "size": 3,
            });
            if let Some(s) = sig {
                l["annotations"] = serde_json::json!({SIGNATURE_ANNOTATION: s});
            }
            l
        };
        let m = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": crate::manifest::OCI_MANIFEST,
            "config": {"mediaType": crate::manifest::OCI_CONFIG,
                "digest": Digest::of(b"{}").to_string(), "size": 2},
            "layers": [
                layer(SIMPLE_SIGNING, Some("c2ln")),
                layer(SIMPLE_SIGNING, None),
                layer("application/octet-stream", Some("c2ln")),
            ],
        });
        let sigs = signatures_in(m.to_string().as_bytes()).unwrap();
        assert_eq!(sigs.len(), 1);
        assert_eq!(sigs[0].signature, "c2ln");
        assert!(signatures_in(b"[]").is_err());
    }
}
