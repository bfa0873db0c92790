//! crust's private admin API on the CRI socket (as private as the CRI is):
//! `crust.admin.v1.Images` for the `crust images` commands, what CRI
//! cannot carry (pull progress, offline import, prune); the operator's
//! `crust.admin.v1.Daemon` is in `operator`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crust_api::admin::v1::images_server::Images;
use crust_api::admin::v1::*;
use crust_image::{Credentials, Progress, ProgressFn};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::ResponseStream;
use super::image::{PulledBytes, image_error};
use crate::daemon::Daemon;
use crate::logging::LogControl;
use crate::metrics::health::Health;

/// At most this often per blob a progress message goes out (its last one,
/// complete, always does).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// What the admin service needs beyond the daemon's parts.
pub struct Operator {
    pub log: LogControl,
    /// Re-reads the config (`crust reload`; SIGHUP shares it).
    pub reloader: Arc<crate::reload::Reloader>,
    pub health: Arc<Health>,
    /// Where `/metrics` is served; None when off.
    pub metrics_address: Option<SocketAddr>,
    pub started_at: SystemTime,
}

#[derive(Clone)]
pub struct Admin {
    pub(super) daemon: Arc<Daemon>,
    pub(super) ops: Arc<Operator>,
}

impl Admin {
    pub fn new(daemon: Arc<Daemon>, ops: Operator) -> Admin {
        Admin {
            daemon,
            ops: Arc::new(ops),
        }
    }
}

#[tonic::async_trait]
impl Images for Admin {
    type PullStream = ResponseStream<PullProgress>;

    async fn pull(&self, req: Request<PullRequest>) -> Result<Response<Self::PullStream>, Status> {
        let req = req.into_inner();
        let reference = req.image.trim().to_string();
        if reference.is_empty() {
            return Err(Status::invalid_argument("image is required"));
        }
        let creds = credentials(req.auth);
        let (tx, rx) = mpsc::unbounded_channel();
        let bytes = PulledBytes::default();
        let progress = bytes.counter(Some(throttled(tx.clone())));
        let images = self.daemon.images.clone();
        let metrics = self.daemon.metrics.clone();
        info!(image = %reference, "pulling image (admin)");
        tokio::spawn(async move {
            let started = Instant::now();
            let pull = images.pull_with_progress(&reference, &creds, Some(progress));
            // The client going away (Ctrl-C) cancels the pull.
            let result = tokio::select! {
                r = pull => r,
                () = tx.closed() => {
                    info!(image = %reference, "pull cancelled by the client");
                    metrics.image_pull(false, bytes.total(), started.elapsed());
                    return;
                }
            };
            metrics.image_pull(result.is_ok(), bytes.total(), started.elapsed());
            let last = match result {
                Ok(image) => Ok(PullProgress {
                    event: Some(pull_progress::Event::Image(image_info(&image))),
                }),
                Err(e) => {
                    warn!(image = %reference, error = %e, "pull failed");
                    Err(image_error(&format!("pulling image {reference:?}"), e))
                }
            };
            let _ = tx.send(last);
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn import(
        &self,
        req: Request<ImportRequest>,
    ) -> Result<Response<ImportResponse>, Status> {
        let path = PathBuf::from(req.into_inner().path);
        if !path.is_absolute() {
            return Err(Status::invalid_argument(format!(
                "path must be absolute, got {:?}",
                path.display().to_string()
            )));
        }
        let doing = format!("importing {}", path.display());
        let images = self
            .daemon
            .images
            .import(&path)
            .await
            .map_err(|e| image_error(&doing, e))?;
        info!(archive = %path.display(), images = images.len(), "imported images");
        Ok(Response::new(ImportResponse {
            images: images.iter().map(image_info).collect(),
        }))
    }

    async fn prune(&self, _req: Request<PruneRequest>) -> Result<Response<PruneResponse>, Status> {
        let removed = self
            .daemon
            .images
            .prune()
            .await
            .map_err(|e| image_error("pruning images", e))?;
        info!(images = removed.len(), "pruned images");
        Ok(Response::new(PruneResponse {
            removed: removed.iter().map(image_info).collect(),
        }))
    }
}

/// A progress callback that forwards at most one message per blob per
/// [`PROGRESS_INTERVAL`], plus each blob's completion.
fn throttled(tx: mpsc::UnboundedSender<Result<PullProgress, Status>>) -> ProgressFn {
    let last_sent: Mutex<HashMap<String, Instant>> = Mutex::new(HashMap::new());
    Arc::new(move |p: Progress| {
        let digest = p.digest.to_string();
        let now = Instant::now();
        {
            let mut last = last_sent.lock().unwrap_or_else(|e| e.into_inner());
            let due = last
                .get(&digest)
                .is_none_or(|t| now.duration_since(*t) >= PROGRESS_INTERVAL);
            if !due && p.done < p.total {
                return;
            }
            last.insert(digest.clone(), now);
        }
        let _ = tx.send(Ok(PullProgress {
            event: Some(pull_progress::Event::Blob(BlobProgress {
                digest,
                done: p.done,
                total: p.total,
                present: p.present,
            })),
        }));
    })
}

fn credentials(auth: Option<Auth>) -> Credentials {
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

fn image_info(image: &crust_image::Image) -> ImageInfo {
    ImageInfo {
        id: image.id.clone(),
        repo_tags: image.repo_tags.clone(),
        repo_digests: image.repo_digests.clone(),
        size: image.size,
    }
}
