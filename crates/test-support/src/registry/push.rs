//! Pushing built images to a registry: the one push client of the tests
//! (which panic on a failure: `blob`, `manifest`, `image`) and the bench
//! (which reports it: `try_*`).

use super::image::{TestImage, sha};
use super::server::Registry;

/// Why a push failed: the step and what the registry or the connection
/// said.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{step}: {source}")]
    Http {
        step: &'static str,
        source: reqwest::Error,
    },
    #[error("{step}: {status} {body}")]
    Refused {
        step: &'static str,
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("upload without location")]
    NoLocation,
}

/// A minimal registry push client (blob upload + manifest PUT).
#[derive(Clone)]
pub struct Pusher {
    http: reqwest::Client,
    base: String,
    basic: Option<(String, String)>,
    bearer: Option<String>,
    skip_existing: bool,
}

impl Pusher {
    pub fn new(reg: &Registry) -> Pusher {
        Pusher::for_host(&reg.host)
    }

    /// A client of the registry at `host` (host:port, plain http).
    pub fn for_host(host: &str) -> Pusher {
        Pusher {
            http: reqwest::Client::new(),
            base: format!("http://{host}"),
            basic: None,
            bearer: None,
            skip_existing: false,
        }
    }

    pub fn with_basic(mut self, user: &str, password: &str) -> Pusher {
        self.basic = Some((user.into(), password.into()));
        self
    }

    pub fn with_bearer(mut self, token: &str) -> Pusher {
        self.bearer = Some(token.into());
        self
    }

    /// Asks first (HEAD) and leaves out blobs the registry has.
    pub fn skip_existing(mut self) -> Pusher {
        self.skip_existing = true;
        self
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let rb = match &self.basic {
            Some((u, p)) => rb.basic_auth(u, Some(p)),
            None => rb,
        };
        match &self.bearer {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    pub async fn blob(&self, repo: &str, bytes: &[u8]) {
        self.try_blob(repo, bytes)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    pub async fn manifest(&self, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) {
        self.try_manifest(repo, reference, media_type, bytes)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    pub async fn image(&self, repo: &str, tag: &str, img: &TestImage) {
        self.try_image(repo, tag, img)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    pub async fn try_blob(&self, repo: &str, bytes: &[u8]) -> Result<(), PushError> {
        let digest = sha(bytes);
        if self.skip_existing {
            let head = self
                .auth(
                    self.http
                        .head(format!("{}/v2/{repo}/blobs/{digest}", self.base)),
                )
                .send()
                .await
                .map_err(|source| PushError::Http {
                    step: "blob exists",
                    source,
                })?;
            if head.status().is_success() {
                return Ok(());
            }
        }
        let url = format!("{}/v2/{repo}/blobs/uploads/", self.base);
        let resp = self
            .auth(self.http.post(&url))
            .send()
            .await
            .map_err(|source| PushError::Http {
                step: "starting a blob upload",
                source,
            })?;
        let resp = expect(resp, 202, "start upload").await?;
        let location = resp
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .ok_or(PushError::NoLocation)?
            .to_string();
        let location = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            location
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let resp = self
            .auth(self.http.put(format!("{location}{sep}digest={digest}")))
            .header("content-type", "application/octet-stream")
            .body(bytes.to_vec())
            .send()
            .await
            .map_err(|source| PushError::Http {
                step: "upload",
                source,
            })?;
        expect(resp, 201, "upload").await?;
        Ok(())
    }

    pub async fn try_manifest(
        &self,
        repo: &str,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<(), PushError> {
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base);
        let resp = self
            .auth(self.http.put(&url))
            .header("content-type", media_type)
            .body(bytes.to_vec())
            .send()
            .await
            .map_err(|source| PushError::Http {
                step: "manifest",
                source,
            })?;
        expect(resp, 201, "manifest").await?;
        Ok(())
    }

    /// The layers, the config, then the manifest as `repo:tag`.
    pub async fn try_image(&self, repo: &str, tag: &str, img: &TestImage) -> Result<(), PushError> {
        for l in &img.layers {
            self.try_blob(repo, &l.bytes).await?;
        }
        self.try_blob(repo, &img.config).await?;
        self.try_manifest(repo, tag, img.manifest_type, &img.manifest)
            .await
    }
}

/// `resp` if its status is `status`, else the step refused with the body.
async fn expect(
    resp: reqwest::Response,
    status: u16,
    step: &'static str,
) -> Result<reqwest::Response, PushError> {
    if resp.status() == status {
        return Ok(resp);
    }
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    Err(PushError::Refused { step, status, body })
}
