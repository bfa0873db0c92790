//! Pushing built images to a registry.

use super::image::{TestImage, sha};
use super::server::Registry;

/// A minimal registry push client (blob upload + manifest PUT).
#[derive(Clone)]
pub struct Pusher {
    http: reqwest::Client,
    base: String,
    basic: Option<(String, String)>,
    bearer: Option<String>,
}

impl Pusher {
    pub fn new(reg: &Registry) -> Pusher {
        Pusher {
            http: reqwest::Client::new(),
            base: format!("http://{}", reg.host),
            basic: None,
            bearer: None,
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
        let digest = sha(bytes);
        let url = format!("{}/v2/{repo}/blobs/uploads/", self.base);
        let resp = self.auth(self.http.post(&url)).send().await.unwrap();
        assert_eq!(
            resp.status(),
            202,
            "start upload: {}",
            resp.text().await.unwrap()
        );
        let location = resp.headers()["location"].to_str().unwrap().to_string();
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
            .unwrap();
        assert_eq!(resp.status(), 201, "upload: {}", resp.text().await.unwrap());
    }

    pub async fn manifest(&self, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) {
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base);
        let resp = self
            .auth(self.http.put(&url))
            .header("content-type", media_type)
            .body(bytes.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            201,
            "manifest: {}",
            resp.text().await.unwrap()
        );
    }

    pub async fn image(&self, repo: &str, tag: &str, img: &TestImage) {
        for l in &img.layers {
            self.blob(repo, &l.bytes).await;
        }
        self.blob(repo, &img.config).await;
        self.manifest(repo, tag, img.manifest_type, &img.manifest)
            .await;
    }
}
