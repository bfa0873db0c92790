//! Image signature verification at pull time, end to end: the real
//! daemon with a signature policy (`[image] signature_policy`,
//! `signature_policy_dir`), the real registry, images built and signed
//! here with a key generated here (cosign's layout: the tag
//! `sha256-<hex>.sig`, simple-signing payloads), pulled through CRI.

use std::path::{Path, PathBuf};

use crust_test_support::crust_api::v1;
use crust_test_support::registry::*;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Status};
use crust_test_support::{Daemon, pod_metadata, run_crust};
use serde_json::{Value, json};

type ImageClient = v1::image_service_client::ImageServiceClient<Channel>;

/// A registry, a key, and a dir for the policy files.
struct Setup {
    reg: Registry,
    push: Pusher,
    key: CosignKey,
    key_path: PathBuf,
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let reg = Registry::start();
        let push = Pusher::new(&reg);
        let key = CosignKey::generate();
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("cosign.pub");
        std::fs::write(&key_path, &key.public_pem).unwrap();
        std::fs::create_dir(dir.path().join("namespaces")).unwrap();
        Setup {
            reg,
            push,
            key,
            key_path,
            dir,
        }
    }

    fn host(&self) -> &str {
        &self.reg.host
    }

    fn policy_path(&self) -> PathBuf {
        self.dir.path().join("policy.json")
    }

    fn ns_dir(&self) -> PathBuf {
        self.dir.path().join("namespaces")
    }

    fn write_policy(&self, path: &Path, policy: &Value) {
        std::fs::write(path, serde_json::to_vec_pretty(policy).unwrap()).unwrap();
    }

    /// `sigstoreSigned` with the test key.
    fn signed_by_key(&self, identity: Value) -> Value {
        json!({"type": "sigstoreSigned", "keyPath": self.key_path, "signedIdentity": identity})
    }

    /// Pushes a small image of its own as `repo:v1`; returns its reference
    /// and manifest digest.
    async fn image(&self, repo: &str) -> (String, String) {
        let layer = LayerTar::new().file("name", repo.as_bytes()).finish();
        let img = build(ImageSpec {
            layers: vec![gzip(&layer)],
            ..ImageSpec::default()
        });
        self.push.image(repo, "v1", &img).await;
        (format!("{}/{repo}:v1", self.host()), img.manifest_digest())
    }

    /// [`Setup::image`], signed with `key` as cosign signs it, for the
    /// name `<registry>/<signed_as>`.
    async fn signed_image(&self, repo: &str, key: &CosignKey, signed_as: &str) -> (String, String) {
        let (reference, digest) = self.image(repo).await;
        let identity = format!("{}/{signed_as}", self.host());
        self.push.cosign_sign(repo, &digest, key, &identity).await;
        (reference, digest)
    }

    /// A daemon with these policy keys (and a metrics endpoint).
    async fn daemon(&self, policy: bool, dir: bool) -> Node {
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut image = String::new();
        if policy {
            image += &format!("signature_policy = {:?}\n", self.policy_path());
        }
        if dir {
            image += &format!("signature_policy_dir = {:?}\n", self.ns_dir());
        }
        let hosts = self.dir.path().join("certs.d");
        std::fs::create_dir_all(&hosts).unwrap();
        let d = Daemon::builder()
            .config(&format!(
                "[image]\n{image}[metrics]\naddress = \"{metrics}\"\n"
            ))
            .arg("--registry-config-dir")
            .arg(hosts.to_str().unwrap())
            .start()
            .await;
        let ic = d.image_v1().await;
        Node { d, ic, metrics }
    }
}

struct Node {
    d: Daemon,
    ic: ImageClient,
    metrics: String,
}

impl Node {
    async fn pull(&mut self, image: &str) -> Result<String, Status> {
        self.pull_in(image, None).await
    }

    /// PullImage for a pod in `namespace`.
    async fn pull_in(&mut self, image: &str, namespace: Option<&str>) -> Result<String, Status> {
        let sandbox_config = namespace.map(|ns| v1::PodSandboxConfig {
            metadata: pod_metadata("sig", ns),
            ..v1::PodSandboxConfig::default()
        });
        self.ic
            .pull_image(v1::PullImageRequest {
                image: Some(v1::ImageSpec {
                    image: image.to_string(),
                    ..v1::ImageSpec::default()
                }),
                auth: None,
                sandbox_config,
            })
            .await
            .map(|r| r.into_inner().image_ref)
    }

    /// A refused pull: FailedPrecondition, CRI-O's reason first, the
    /// image, the rule and `why` in the message.
    async fn refused(&mut self, image: &str, ns: Option<&str>, rule: &str, why: &str) {
        let e = self
            .pull_in(image, ns)
            .await
            .expect_err(&format!("{image} was pulled"));
        assert_eq!(e.code(), Code::FailedPrecondition, "{image}: {e}");
        let m = e.message();
        assert!(m.starts_with("SignatureValidationFailed: "), "{m}");
        for part in [image, rule, why] {
            assert!(m.contains(part), "{part:?} not in {m}");
        }
    }

    /// Nothing of any image is in the store (no blob, no layer, no record).
    async fn store_is_empty(&mut self) {
        for dir in ["content/blobs/sha256", "layers"] {
            let path = self.d.root.join(dir);
            let left: Vec<_> = std::fs::read_dir(&path)
                .map(|rd| rd.filter_map(Result::ok).map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "{} holds {left:?}", path.display());
        }
        let images = self
            .ic
            .list_images(v1::ListImagesRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .images;
        assert!(images.is_empty(), "{images:?}");
    }

    async fn signature_checks(&self, result: &str) -> u64 {
        let text = reqwest::get(format!("http://{}/metrics", self.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let series = format!("crust_image_signature_checks_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .unwrap()
    }
}

/// sigstoreSigned: an image signed with the policy's key pulls; unsigned,
/// signed with another key, a signature of another manifest, and one
/// signed under another name are refused, naming the rule, and leave
/// nothing behind; the metrics count both.
#[tokio::test(flavor = "multi_thread")]
async fn sigstore_signed_images_pull_and_bad_signatures_are_refused() {
    let s = Setup::new();
    let host = s.host().to_string();
    let scope = format!("{host}/signed");
    s.write_policy(
        &s.policy_path(),
        &json!({
            "default": [{"type": "reject"}],
            "transports": {"docker": {
                &scope: [s.signed_by_key(json!({"type": "matchRepository"}))],
            }},
        }),
    );
    let (good, good_digest) = s.signed_image("signed/good", &s.key, "signed/good").await;
    let (unsigned, _) = s.image("signed/unsigned").await;
    let stranger = CosignKey::generate();
    let (other_key, _) = s
        .signed_image("signed/otherkey", &stranger, "signed/otherkey")
        .await;
    // A valid signature, by the right key, of another image's manifest,
    // put where this image's signatures go.
    let (other_digest, digest) = s.image("signed/otherdigest").await;
    let misplaced =
        SignatureLayer::new(&s.key, &format!("{host}/signed/otherdigest"), &good_digest);
    s.push
        .push_signatures("signed/otherdigest", &digest, &[misplaced])
        .await;
    let (renamed, _) = s
        .signed_image("signed/renamed", &s.key, "signed/elsewhere")
        .await;
    let (outside, _) = s.image("outside/app").await;

    let mut n = s.daemon(true, false).await;
    let rule = format!("transports.docker \"{scope}\" requirement 1 (sigstoreSigned)");
    n.refused(&unsigned, None, &rule, "no cosign signature (tag sha256-")
        .await;
    n.refused(&other_key, None, &rule, "not made by any key of the policy")
        .await;
    n.refused(
        &other_digest,
        None,
        &rule,
        &format!("it signs manifest {good_digest}"),
    )
    .await;
    n.refused(
        &renamed,
        None,
        &rule,
        "signedIdentity matchRepository does not accept",
    )
    .await;
    n.refused(&outside, None, "default requirement 1 (reject)", "rejects")
        .await;
    n.store_is_empty().await;
    assert_eq!(n.signature_checks("refused").await, 5);
    assert_eq!(n.signature_checks("verified").await, 0);

    let id = n
        .pull(&good)
        .await
        .unwrap_or_else(|e| panic!("{good}: {e}"));
    assert!(id.starts_with("sha256:"), "{id}");
    assert_eq!(n.signature_checks("verified").await, 1);
    // By digest too (matchRepository: any tag or digest of the repository).
    let by_digest = format!("{host}/signed/good@{good_digest}");
    n.pull(&by_digest).await.unwrap();
    assert_eq!(n.signature_checks("verified").await, 2);
    assert_eq!(n.signature_checks("refused").await, 5);
}

/// The default identity rule (matchRepoDigestOrExact) and exactReference:
/// cosign signs the repository name, which a pull by digest accepts and a
/// pull by tag does not; exactReference accepts its own reference only.
#[tokio::test(flavor = "multi_thread")]
async fn signed_identity_rules_apply() {
    let s = Setup::new();
    let host = s.host().to_string();
    let (tagged, digest) = s.signed_image("ids/app", &s.key, "ids/app").await;
    let (pinned, _) = s.signed_image("ids/pinned", &s.key, "ids/pinned:v1").await;
    s.write_policy(
        &s.policy_path(),
        &json!({
            "default": [{"type": "reject"}],
            "transports": {"docker": {
                format!("{host}/ids/app"): [{"type": "sigstoreSigned",
                    "keyData": s.key.key_data()}],
                format!("{host}/ids/pinned"): [s.signed_by_key(json!({
                    "type": "exactReference", "dockerReference": format!("{host}/ids/other:v1"),
                }))],
            }},
        }),
    );
    let mut n = s.daemon(true, false).await;
    n.refused(&tagged, None, "(sigstoreSigned)", "matchRepoDigestOrExact")
        .await;
    n.pull(&format!("{host}/ids/app@{digest}")).await.unwrap();
    n.refused(&pinned, None, "(sigstoreSigned)", "exactReference")
        .await;
}

/// reject, insecureAcceptAnything and the most specific scope; a type
/// crust does not implement refuses the pull naming it (never accepted);
/// the file is read at each pull: a broken one refuses, naming it, and
/// the fixed one applies at once.
#[tokio::test(flavor = "multi_thread")]
async fn reject_accept_anything_and_unsupported_types() {
    let s = Setup::new();
    let host = s.host().to_string();
    let policy = json!({
        "default": [{"type": "insecureAcceptAnything"}],
        "transports": {"docker": {
            format!("{host}/closed"): [{"type": "reject"}],
            format!("{host}/closed/exception"): [{"type": "insecureAcceptAnything"}],
            format!("{host}/gpg"): [{"type": "signedBy", "keyType": "GPGKeys",
                "keyPath": "/nonexistent.gpg"}],
            format!("{host}/keyless"): [{"type": "sigstoreSigned", "fulcio": {
                "caPath": "/nonexistent", "oidcIssuer": "https://x", "subjectEmail": "a@b"}}],
        }},
    });
    s.write_policy(&s.policy_path(), &policy);
    let (open, _) = s.image("open/app").await;
    let (closed, _) = s.image("closed/app").await;
    let (exception, _) = s.image("closed/exception").await;
    let (gpg, _) = s.image("gpg/app").await;
    let (keyless, _) = s.image("keyless/app").await;

    let mut n = s.daemon(true, false).await;
    let scope = |s: &str| format!("transports.docker \"{host}/{s}\" requirement 1");
    n.refused(
        &closed,
        None,
        &format!("{} (reject)", scope("closed")),
        "rejects",
    )
    .await;
    n.refused(
        &gpg,
        None,
        &scope("gpg"),
        "type \"signedBy\" is not supported",
    )
    .await;
    n.refused(&keyless, None, &scope("keyless"), "fulcio").await;
    n.store_is_empty().await;
    n.pull(&open).await.unwrap();
    n.pull(&exception).await.unwrap();
    assert_eq!(n.signature_checks("accepted").await, 2);
    assert_eq!(n.signature_checks("refused").await, 3);

    std::fs::write(s.policy_path(), "{\"default\": [").unwrap();
    let e = n.pull(&open).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    let path = s.policy_path().display().to_string();
    assert!(
        e.message()
            .starts_with("SignatureValidationFailed: signature policy")
            && e.message().contains(&path)
            && e.message().contains("not JSON"),
        "{e}"
    );
    s.write_policy(&s.policy_path(), &json!({"default": [{"type": "reject"}]}));
    n.refused(&open, None, "default requirement 1 (reject)", "rejects")
        .await;
    s.write_policy(&s.policy_path(), &policy);
    n.pull(&open).await.unwrap();
}

/// Per-namespace policies (`signature_policy_dir/<namespace>.json`): a
/// strict namespace beside a permissive one on the same node; namespaces
/// without a file and pulls without a pod use `signature_policy` (here
/// none: not checked); a namespace that is no namespace name is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_strict_namespace_beside_a_permissive_one() {
    let s = Setup::new();
    let host = s.host().to_string();
    let (signed, _) = s.signed_image("team/signed", &s.key, "team/signed").await;
    let (unsigned, _) = s.image("team/unsigned").await;
    s.write_policy(
        &s.ns_dir().join("strict.json"),
        &json!({
            "default": [{"type": "reject"}],
            "transports": {"docker": {
                format!("{host}/team"): [s.signed_by_key(json!({"type": "matchRepository"}))],
            }},
        }),
    );
    s.write_policy(
        &s.ns_dir().join("open.json"),
        &json!({"default": [{"type": "insecureAcceptAnything"}]}),
    );
    let mut n = s.daemon(false, true).await;
    let strict_file = s.ns_dir().join("strict.json").display().to_string();
    n.refused(
        &unsigned,
        Some("strict"),
        &strict_file,
        "no cosign signature",
    )
    .await;
    n.store_is_empty().await;
    n.pull_in(&signed, Some("strict")).await.unwrap();
    n.pull_in(&unsigned, Some("open")).await.unwrap();
    n.pull_in(&unsigned, Some("elsewhere")).await.unwrap();
    n.pull(&unsigned).await.unwrap();
    assert_eq!(n.signature_checks("verified").await, 1);
    assert_eq!(n.signature_checks("accepted").await, 1);
    assert_eq!(n.signature_checks("refused").await, 1);
    // The image is here now, but a strict pull still refuses it.
    n.refused(
        &unsigned,
        Some("strict"),
        &strict_file,
        "no cosign signature",
    )
    .await;

    let e = n.pull_in(&unsigned, Some("../strict")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(
        e.message().contains("sandbox_config.metadata.namespace"),
        "{e}"
    );
}

/// `image.signature_policy` is reloadable: set by `crust reload`, the next
/// pull goes by it; removed again, images are not checked.
#[tokio::test(flavor = "multi_thread")]
async fn the_policy_key_is_reloadable() {
    let s = Setup::new();
    let (unsigned, _) = s.image("reload/app").await;
    s.write_policy(&s.policy_path(), &json!({"default": [{"type": "reject"}]}));
    let mut n = s.daemon(false, false).await;
    n.pull(&unsigned).await.unwrap();
    let reload = |n: &Node, toml: &str| {
        n.d.write_config(toml);
        let socket = n.d.socket.display().to_string();
        let out = run_crust(&["reload", "--socket", &socket]);
        let answer = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{answer} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        answer
    };
    let metrics = format!("[metrics]\naddress = \"{}\"\n", n.metrics);
    let answer = reload(
        &n,
        &format!(
            "[image]\nsignature_policy = {:?}\n{metrics}",
            s.policy_path()
        ),
    );
    assert!(answer.contains("image.signature_policy"), "{answer}");
    n.refused(&unsigned, None, "default requirement 1 (reject)", "rejects")
        .await;
    reload(&n, &metrics);
    n.pull(&unsigned).await.unwrap();
}
