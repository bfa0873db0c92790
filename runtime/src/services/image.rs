//! CRI ImageService: translation onto `crust_image::ImageService`, which
//! does the work (registry, content store, unpack, index, GC).
//!
//! Behaviour, as containerd unless noted:
//! - ListImages' `filter.image.image` names an image by ID, ID prefix, tag
//!   or digest reference; a repository name without tag or digest
//!   (`busybox`, `registry.k8s.io/pause`) matches every image of that
//!   repository (containerd ignores the filter; this is what `crictl images
//!   NAME` users expect).
//! - ImageStatus answers a nil image, not an error, for an unknown image.
//! - PullImage answers the image ID as `image_ref`; of `sandbox_config`
//!   only the pod's namespace is used, to pick its signature policy
//!   (`image.signature_policy_dir`, as CRI-O); no per-runtime-handler
//!   snapshotters here. An image the signature policy refuses is
//!   FailedPrecondition, its message starting `SignatureValidationFailed`
//!   as CRI-O's does.
//! - RemoveImage removes the whole image, with all its tags and digests,
//!   whichever reference names it (critest: "removing image by one tag
//!   should remove all tags"); idempotent.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use crust_api::v1::image_service_server::ImageService;
use crust_api::v1::*;
use crust_image::signature::Verdict;
use crust_image::{Credentials, ErrorKind, FsUsage, Progress, ProgressFn, Reference, image_user};
use tonic::{Code, Request, Response, Status};
use tracing::{info, warn};

use super::{Cri, ResponseStream, bounds};
use crate::clock::now_ns;
use crate::metrics::SignatureResult;
use crust_quote::quote;

/// The bytes a pull downloads, for the metrics: the last progress of
/// every blob fetched (blobs already in the store count nothing).
#[derive(Default, Clone)]
pub(super) struct PulledBytes(std::sync::Arc<std::sync::Mutex<HashMap<String, u64>>>);

impl PulledBytes {
    /// A progress callback that counts, then hands on to `forward`.
    pub(super) fn counter(&self, forward: Option<ProgressFn>) -> ProgressFn {
        let this = self.clone();
        std::sync::Arc::new(move |p: Progress| {
            if !p.present {
                let mut seen = this.0.lock().unwrap_or_else(|e| e.into_inner());
                let done = seen.entry(p.digest.to_string()).or_default();
                *done = (*done).max(p.done);
            }
            if let Some(f) = &forward {
                f(p);
            }
        })
    }

    pub(super) fn total(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }
}

#[tonic::async_trait]
impl ImageService for Cri {
    async fn list_images(
        &self,
        req: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        let filter = filter_query(req.into_inner().filter)?;
        let images = self.images_matching(filter.as_deref())?;
        Ok(Response::new(ListImagesResponse {
            images: images.iter().map(cri_image).collect(),
        }))
    }

    type StreamImagesStream = ResponseStream<StreamImagesResponse>;

    async fn stream_images(
        &self,
        req: Request<StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        let filter = filter_query(req.into_inner().filter)?;
        let images: Vec<Image> = self
            .images_matching(filter.as_deref())?
            .iter()
            .map(cri_image)
            .collect();
        Ok(Response::new(super::batched(images, |images| {
            StreamImagesResponse { images }
        })))
    }

    async fn image_status(
        &self,
        req: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        let req = req.into_inner();
        let query = required_image(req.image)?;
        let images = &self.daemon.images;
        let Some(image) = images
            .get(&query)
            .map_err(|e| image_error(&format!("image status of {}", quote(&query)), e))?
        else {
            return Ok(Response::new(ImageStatusResponse::default()));
        };
        let mut info = HashMap::new();
        if req.verbose {
            let config = images
                .config_json(&image)
                .map_err(|e| image_error(&format!("image status of {}", quote(&query)), e))?;
            info.insert("info".to_string(), verbose_info(&image, &config));
        }
        Ok(Response::new(ImageStatusResponse {
            image: Some(cri_image(&image)),
            info,
        }))
    }

    async fn pull_image(
        &self,
        req: Request<PullImageRequest>,
    ) -> Result<Response<PullImageResponse>, Status> {
        let req = req.into_inner();
        let reference = required_image(req.image)?;
        if let Some(auth) = &req.auth {
            bounds::auth("auth", auth)?;
        }
        let namespace = req
            .sandbox_config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.namespace.as_str())
            .filter(|ns| !ns.is_empty());
        if let Some(ns) = namespace {
            crust_image::signature::check_namespace(ns).map_err(|e| {
                Status::invalid_argument(format!("sandbox_config.metadata.namespace: {e}"))
            })?;
        }
        let creds = credentials(req.auth);
        // Never the credentials themselves: only which kind was given.
        info!(image = %reference, auth = auth_kind(&creds), "pulling image");
        let started = Instant::now();
        let bytes = PulledBytes::default();
        crate::crash::point("image.pull.begun");
        let result = self
            .daemon
            .images
            .pull_checked(&reference, &creds, Some(bytes.counter(None)), namespace)
            .await;
        let metrics = &self.daemon.metrics;
        metrics.image_pull(result.is_ok(), bytes.total(), started.elapsed());
        match &result {
            Ok((_, Verdict::Verified)) => metrics.image_signature(SignatureResult::Verified),
            Ok((_, Verdict::Accepted)) => metrics.image_signature(SignatureResult::Accepted),
            Ok((_, Verdict::Unchecked)) => {}
            Err(e) if e.kind() == ErrorKind::PolicyRefused => {
                metrics.image_signature(SignatureResult::Refused)
            }
            Err(_) => {}
        }
        let (image, _) = result.map_err(|e| {
            warn!(image = %reference, error = %e, "pull failed");
            image_error(&format!("pulling image {}", quote(&reference)), e)
        })?;
        crate::crash::point("image.pull.done");
        info!(
            image = %reference,
            id = %image.id,
            size = image.size,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pulled image"
        );
        Ok(Response::new(PullImageResponse {
            image_ref: image.id,
        }))
    }

    async fn remove_image(
        &self,
        req: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        let query = required_image(req.into_inner().image)?;
        let removed = self
            .daemon
            .images
            .remove(&query)
            .await
            .map_err(|e| image_error(&format!("removing image {}", quote(&query)), e))?;
        if removed {
            info!(image = %query, "removed image");
        }
        Ok(Response::new(RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _req: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        let timestamp = now_ns();
        let config = &self.daemon.config;
        let images = self
            .daemon
            .images
            .fs_usage()
            .await
            .map_err(|e| image_error("image filesystem usage", e))?;
        let containers = config.containers_dir();
        let dir = containers.clone();
        let writable =
            tokio::task::spawn_blocking(move || crust_image::usage::usage(&[dir.as_path()]))
                .await
                .map_err(|e| Status::internal(format!("container filesystem usage: {e}")))?
                .map_err(|e| image_error("container filesystem usage", e))?;
        Ok(Response::new(ImageFsInfoResponse {
            image_filesystems: vec![fs_usage(&config.root, images, timestamp)],
            container_filesystems: vec![fs_usage(&containers, writable, timestamp)],
        }))
    }
}

impl Cri {
    /// The images a ListImages filter selects (all without a filter).
    fn images_matching(&self, query: Option<&str>) -> Result<Vec<crust_image::Image>, Status> {
        let images = &self.daemon.images;
        let listing = |e| image_error("listing images", e);
        let Some(query) = query else {
            return images.list().map_err(listing);
        };
        if let Some(repo) = bare_repository(query) {
            let all = images.list().map_err(listing)?;
            let in_repo: Vec<_> = all
                .into_iter()
                .filter(|i| in_repository(i, &repo))
                .collect();
            if !in_repo.is_empty() {
                return Ok(in_repo);
            }
        }
        match images.get(query) {
            Ok(found) => Ok(found.into_iter().collect()),
            // An ambiguous ID prefix selects nothing rather than failing.
            Err(e) if e.kind() == ErrorKind::InvalidArgument => Ok(Vec::new()),
            Err(e) => Err(listing(e)),
        }
    }
}

fn filter_query(filter: Option<ImageFilter>) -> Result<Option<String>, Status> {
    let Some(spec) = filter.and_then(|f| f.image) else {
        return Ok(None);
    };
    bounds::image_spec("filter.image", &spec)?;
    Ok(Some(spec.image.trim().to_string()).filter(|s| !s.is_empty()))
}

/// `name` normalised (`busybox` -> `docker.io/library/busybox`) when the
/// query is a repository name written without tag or digest.
fn bare_repository(query: &str) -> Option<String> {
    let last = query.rsplit('/').next().unwrap_or(query);
    if query.contains('@') || last.contains(':') {
        return None;
    }
    Reference::parse(query).ok().map(|r| r.name())
}

fn in_repository(image: &crust_image::Image, repo: &str) -> bool {
    let tagged = image
        .repo_tags
        .iter()
        .any(|t| t.rsplit_once(':').is_some_and(|(name, _)| name == repo));
    let digested = image
        .repo_digests
        .iter()
        .any(|d| d.split_once('@').is_some_and(|(name, _)| name == repo));
    tagged || digested
}

/// The request's `image.image`, which every image RPC needs.
fn required_image(spec: Option<ImageSpec>) -> Result<String, Status> {
    let spec = spec.unwrap_or_default();
    bounds::image_spec("image", &spec)?;
    let image = spec.image.trim();
    if image.is_empty() {
        return Err(Status::invalid_argument("image.image is required"));
    }
    Ok(image.to_string())
}

fn credentials(auth: Option<AuthConfig>) -> Credentials {
    let a = auth.unwrap_or_default();
    Credentials {
        username: a.username,
        password: a.password,
        auth: a.auth,
        server_address: a.server_address,
        identity_token: a.identity_token,
        registry_token: a.registry_token,
    }
}

/// What kind of credentials a pull carries, for logs.
fn auth_kind(c: &Credentials) -> &'static str {
    if !c.registry_token.is_empty() {
        "registry-token"
    } else if !c.identity_token.is_empty() {
        "identity-token"
    } else if !c.username.is_empty() || !c.auth.is_empty() {
        "basic"
    } else {
        "anonymous"
    }
}

pub(super) fn cri_image(image: &crust_image::Image) -> Image {
    let user = image_user(&image.config.user);
    Image {
        id: image.id.clone(),
        repo_tags: image.repo_tags.clone(),
        repo_digests: image.repo_digests.clone(),
        size: image.size,
        uid: user.uid.map(|value| Int64Value { value }),
        username: user.username,
        spec: None,
        pinned: image.pinned,
    }
}

/// containerd's verbose ImageStatus info: the top layer's chain ID and the
/// image's OCI config (`imageSpec`), as one JSON document under `info`.
fn verbose_info(image: &crust_image::Image, config: &[u8]) -> String {
    let spec: serde_json::Value = serde_json::from_slice(config).unwrap_or(serde_json::Value::Null);
    let chain_id = image
        .chain_ids
        .last()
        .map(ToString::to_string)
        .unwrap_or_default();
    serde_json::json!({
        "chainID": chain_id,
        "imageSpec": spec,
        "manifestDigest": image.manifest_digest.to_string(),
        "pinned": image.pinned,
    })
    .to_string()
}

/// An image error as a gRPC status a client can act on, naming what was
/// being done (and so the reference).
pub(super) fn image_error(doing: &str, e: crust_image::Error) -> Status {
    let code = match e.kind() {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::Unavailable => Code::Unavailable,
        // Valid, but nothing crust can run (e.g. no manifest for this
        // platform): retrying will not help.
        ErrorKind::Unsupported => Code::FailedPrecondition,
        // Corrupt or hostile content, rejected.
        ErrorKind::InvalidContent => Code::InvalidArgument,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::InUse => Code::FailedPrecondition,
        // The node's policy refuses the image: no retry helps until the
        // image is signed or the policy changes. The message starts as
        // CRI-O's, which kubelet reports as SignatureValidationFailed.
        ErrorKind::PolicyRefused => {
            return super::status(Code::FailedPrecondition, format!("{e} ({doing})"));
        }
    };
    super::status(code, format!("{doing}: {e}"))
}

fn fs_usage(mountpoint: &Path, usage: FsUsage, timestamp: i64) -> FilesystemUsage {
    FilesystemUsage {
        timestamp,
        fs_id: Some(FilesystemIdentifier {
            mountpoint: mountpoint.display().to_string(),
        }),
        used_bytes: Some(UInt64Value { value: usage.bytes }),
        inodes_used: Some(UInt64Value {
            value: usage.inodes,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_repositories_are_names_without_tag_or_digest() {
        assert_eq!(
            bare_repository("busybox").as_deref(),
            Some("docker.io/library/busybox")
        );
        assert_eq!(
            bare_repository("127.0.0.1:5000/a/b").as_deref(),
            Some("127.0.0.1:5000/a/b")
        );
        assert_eq!(bare_repository("busybox:1.36"), None);
        assert_eq!(bare_repository("127.0.0.1:5000/a/b:v1"), None);
        assert_eq!(
            bare_repository(&format!("b@sha256:{}", "a".repeat(64))),
            None
        );
        assert_eq!(bare_repository("Not A Ref"), None);
    }

    #[test]
    fn auth_config_maps_field_by_field_and_logs_only_its_kind() {
        let c = credentials(Some(AuthConfig {
            username: "u".into(),
            password: "secret".into(),
            auth: "dTpw".into(),
            server_address: "r.example".into(),
            identity_token: String::new(),
            registry_token: String::new(),
        }));
        assert_eq!((c.username.as_str(), c.password.as_str()), ("u", "secret"));
        assert_eq!(c.auth, "dTpw");
        assert_eq!(c.server_address, "r.example");
        assert_eq!(auth_kind(&c), "basic");
        assert!(!format!("{c:?}").contains("secret"));
        assert_eq!(auth_kind(&credentials(None)), "anonymous");
    }

    #[test]
    fn error_kinds_map_to_codes_with_the_reference() {
        let e = crust_image::Error::NotFound("manifest x".into());
        let s = image_error("pulling image \"x\"", e);
        assert_eq!(s.code(), Code::NotFound);
        assert!(s.message().contains("\"x\""), "{}", s.message());
        let e = crust_image::Error::Unsupported("no linux/amd64 manifest".into());
        assert_eq!(image_error("p", e).code(), Code::FailedPrecondition);
        // CRI-O's reason first, where kubelet looks for it.
        let e = crust_image::Error::SignatureRefused {
            image: "r.io/a:v1".into(),
            policy: "/p.json".into(),
            rule: "default requirement 1 (reject)".into(),
            reason: "the policy rejects these images".into(),
        };
        let s = image_error("pulling image \"r.io/a:v1\"", e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(
            s.message().starts_with("SignatureValidationFailed: ")
                && s.message().ends_with("(pulling image \"r.io/a:v1\")"),
            "{}",
            s.message()
        );
    }
}
