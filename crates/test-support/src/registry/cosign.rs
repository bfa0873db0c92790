//! A small `cosign sign` for tests: a generated key pair, simple-signing
//! payloads, and signature manifests pushed where cosign puts them (the
//! tag `sha256-<hex>.sig` in the image's repository, one layer per
//! signature with the signature in its annotation).

use base64::Engine as _;
use serde_json::json;
use sigstore::crypto::{SigStoreSigner, SigningScheme};

use super::image::{OCI_CONFIG, OCI_MANIFEST, sha};
use super::push::{PushError, Pusher};

pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";

/// A signing key of the test's own.
pub struct CosignKey {
    signer: SigStoreSigner,
    /// The public key, PEM (SubjectPublicKeyInfo), as `cosign.pub` holds it.
    pub public_pem: String,
}

impl CosignKey {
    /// A new ECDSA P-256 key, cosign's default.
    pub fn generate() -> CosignKey {
        CosignKey::generate_with(SigningScheme::ECDSA_P256_SHA256_ASN1)
    }

    pub fn generate_with(scheme: SigningScheme) -> CosignKey {
        let signer = scheme.create_signer().expect("key generation");
        let public_pem = signer
            .to_sigstore_keypair()
            .and_then(|k| k.public_key_to_pem())
            .expect("public key PEM");
        CosignKey { signer, public_pem }
    }

    /// The base64 signature over `payload`, as the annotation holds it.
    pub fn sign(&self, payload: &[u8]) -> String {
        let raw = self.signer.sign(payload).expect("signing");
        base64::engine::general_purpose::STANDARD.encode(raw)
    }

    /// The public key as a policy's `keyData` (base64 of the PEM).
    pub fn key_data(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.public_pem)
    }
}

/// The simple-signing payload cosign signs for `manifest_digest` signed as
/// `docker_reference` (cosign writes the repository name, no tag).
pub fn simple_signing_payload(docker_reference: &str, manifest_digest: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": manifest_digest},
            "type": "cosign container image signature",
        },
        "optional": null,
    }))
    .unwrap()
}

/// One signature layer: a payload and the base64 signature over it.
pub struct SignatureLayer {
    pub payload: Vec<u8>,
    pub signature: String,
}

impl SignatureLayer {
    /// `key`'s signature of `manifest_digest` as `docker_reference`.
    pub fn new(key: &CosignKey, docker_reference: &str, manifest_digest: &str) -> SignatureLayer {
        let payload = simple_signing_payload(docker_reference, manifest_digest);
        let signature = key.sign(&payload);
        SignatureLayer { payload, signature }
    }
}

/// The tag cosign stores the signatures of `manifest_digest` under.
pub fn signature_tag(manifest_digest: &str) -> String {
    manifest_digest.replacen(':', "-", 1) + ".sig"
}

impl Pusher {
    /// `cosign sign --key`: signs the manifest `manifest_digest` of `repo`
    /// as `docker_reference` and pushes the signature manifest.
    pub async fn cosign_sign(
        &self,
        repo: &str,
        manifest_digest: &str,
        key: &CosignKey,
        docker_reference: &str,
    ) {
        let layer = SignatureLayer::new(key, docker_reference, manifest_digest);
        self.push_signatures(repo, manifest_digest, &[layer]).await;
    }

    /// Pushes `layers` as the signature manifest of `manifest_digest` (any
    /// payloads: tests make ones for other digests or identities).
    pub async fn push_signatures(
        &self,
        repo: &str,
        manifest_digest: &str,
        layers: &[SignatureLayer],
    ) {
        self.try_push_signatures(repo, manifest_digest, layers)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    pub async fn try_push_signatures(
        &self,
        repo: &str,
        manifest_digest: &str,
        layers: &[SignatureLayer],
    ) -> Result<(), PushError> {
        let config = b"{}".to_vec();
        self.try_blob(repo, &config).await?;
        let mut descriptors = Vec::new();
        for l in layers {
            self.try_blob(repo, &l.payload).await?;
            descriptors.push(json!({
                "mediaType": SIMPLE_SIGNING,
                "digest": sha(&l.payload),
                "size": l.payload.len(),
                "annotations": {
                    SIGNATURE_ANNOTATION: l.signature,
                    // What cosign adds with a transparency log; crust does
                    // not need it to verify with a key.
                    BUNDLE_ANNOTATION: json!({"SignedEntryTimestamp": "", "Payload": {}}).to_string(),
                },
            }));
        }
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha(&config), "size": config.len()},
            "layers": descriptors,
        }))
        .unwrap();
        self.try_manifest(
            repo,
            &signature_tag(manifest_digest),
            OCI_MANIFEST,
            &manifest,
        )
        .await
    }
}
