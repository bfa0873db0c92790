//! Talking to registries: credentials, endpoint fallback (mirrors, then the
//! server), manifests and verified blob downloads, through oci-client.
//!
//! One [`Remote`] per pull, with its own oci-client per endpoint: the
//! client caches credentials and tokens per registry, and sharing one
//! across pulls would let a pull without credentials ride on another's token.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use crust_quote::quote;
use futures_util::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use tokio::sync::OnceCell;

use crate::content::ContentStore;
use crate::digest::Digest;
use crate::error::{Error, ErrorKind, Result};
use crate::hosts::{Endpoint, RegistryHosts, Scheme};
use crate::manifest::{Descriptor, MANIFEST_TYPES, MAX_MANIFEST_BYTES};
use crate::reference::Reference;

const USER_AGENT: &str = concat!("crust/", env!("CARGO_PKG_VERSION"));
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest silence tolerated by the token exchange (manifests and blobs go
/// by the pull's own progress timeout).
const READ_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_TOKEN_RESPONSE: usize = 1 << 20;

/// Registry credentials as CRI's AuthConfig carries them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// base64 of `username:password`.
    pub auth: String,
    /// The registry these credentials are for; empty = the image's registry.
    pub server_address: String,
    /// An OAuth2 refresh token, exchanged at the registry's token endpoint.
    pub identity_token: String,
    /// A bearer token sent to the registry as is.
    pub registry_token: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("server_address", &self.server_address)
            .finish_non_exhaustive()
    }
}

/// The one way of authenticating a set of credentials selects.
#[derive(Clone, PartialEq, Eq)]
enum Auth {
    Anonymous,
    Basic(String, String),
    Bearer(String),
    Identity(String),
}

impl Credentials {
    /// Registry token first, then identity token, then username/password,
    /// then the encoded `auth`.
    fn auth(&self) -> Result<Auth> {
        if !self.registry_token.is_empty() {
            return Ok(Auth::Bearer(self.registry_token.clone()));
        }
        if !self.identity_token.is_empty() {
            return Ok(Auth::Identity(self.identity_token.clone()));
        }
        if !self.username.is_empty() {
            return Ok(Auth::Basic(self.username.clone(), self.password.clone()));
        }
        if !self.auth.is_empty() {
            return decode_basic(&self.auth);
        }
        Ok(Auth::Anonymous)
    }

    /// Whether these credentials may be sent to `endpoint` serving `registry`.
    fn applies_to(&self, registry: &str, endpoint: &str) -> bool {
        if self.server_address.is_empty() {
            return true;
        }
        let server = canonical_host(&self.server_address);
        server == canonical_host(registry) || server == canonical_host(endpoint)
    }
}

fn decode_basic(encoded: &str) -> Result<Auth> {
    let bad = || Error::InvalidArgument("auth is not base64 of \"username:password\"".to_string());
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (user, pass) = text.split_once(':').ok_or_else(bad)?;
    Ok(Auth::Basic(user.to_string(), pass.to_string()))
}

/// `https://index.docker.io/v1/` -> `docker.io`; Docker Hub's aliases are one.
fn canonical_host(s: &str) -> String {
    let s = s.split_once("://").map_or(s, |(_, rest)| rest);
    let host = s.split('/').next().unwrap_or(s).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

/// What an endpoint is asked for; selects endpoints by capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Resolve,
    Pull,
}

struct EndpointClient {
    endpoint: Endpoint,
    client: oci_client::Client,
    creds_apply: bool,
    /// The credentials as this endpoint takes them (identity tokens are
    /// exchanged on first use).
    auth: OnceCell<RegistryAuth>,
}

/// Download progress of one blob, for progress bars. A blob (or layer)
/// already in the store is reported once, complete, with `present` set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub digest: Digest,
    pub done: u64,
    pub total: u64,
    /// Already in the store: nothing was downloaded.
    pub present: bool,
}

pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// The registry side of one pull.
pub struct Remote {
    reference: Reference,
    auth: Auth,
    endpoints: Vec<EndpointClient>,
    /// A request that receives nothing for this long is given up (the next
    /// endpoint is tried); None: never.
    progress_timeout: Option<Duration>,
}

impl Remote {
    pub fn new(
        hosts: &RegistryHosts,
        reference: &Reference,
        creds: &Credentials,
        progress_timeout: Option<Duration>,
    ) -> Result<Self> {
        let auth = creds.auth()?;
        let endpoints = hosts
            .endpoints(reference.domain())?
            .into_iter()
            .map(|endpoint| {
                let client = build_client(&endpoint)?;
                let creds_apply = creds.applies_to(reference.domain(), &endpoint.host);
                Ok(EndpointClient {
                    endpoint,
                    client,
                    creds_apply,
                    auth: OnceCell::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Remote {
            reference: reference.clone(),
            auth,
            endpoints,
            progress_timeout,
        })
    }

    /// `step` as long as it makes progress: None when it took longer than
    /// the progress timeout (its future is dropped, which cancels it).
    async fn within<T>(&self, step: impl std::future::Future<Output = T>) -> Option<T> {
        match self.progress_timeout {
            Some(limit) => tokio::time::timeout(limit, step).await.ok(),
            None => Some(step.await),
        }
    }

    fn stalled(&self, ep: &EndpointClient, what: &str) -> Error {
        Error::Stalled {
            host: ep.endpoint.url(),
            what: what.to_string(),
            after: self.progress_timeout.unwrap_or_default(),
        }
    }

    /// Fetches the manifest (or index) the reference names: by digest if it
    /// has one, else by tag. Returns the bytes and their sha256.
    pub async fn fetch_top_manifest(&self) -> Result<(Vec<u8>, Digest)> {
        match (self.reference.digest(), self.reference.tag()) {
            (Some(d), _) => {
                let d = d.clone();
                self.fetch_manifest(&d).await.map(|b| (b, d))
            }
            (None, Some(tag)) => self.fetch_manifest_by_tag(tag).await,
            (None, None) => Err(Error::InvalidArgument(format!(
                "{} has neither tag nor digest",
                self.reference
            ))),
        }
    }

    async fn fetch_manifest_by_tag(&self, tag: &str) -> Result<(Vec<u8>, Digest)> {
        let what = format!("manifest {}", self.reference);
        self.try_endpoints(Need::Resolve, &what, |ep| {
            let what = what.clone();
            async move {
                let oref = self.oci_ref(ep, |reg, repo| {
                    oci_client::Reference::with_tag(reg, repo, tag.to_string())
                });
                let (bytes, _) = self.manifest_raw(ep, &oref, &what).await?;
                let digest = Digest::of(&bytes);
                Ok((bytes, digest))
            }
        })
        .await
    }

    /// Fetches a manifest by digest, verified against it.
    pub async fn fetch_manifest(&self, digest: &Digest) -> Result<Vec<u8>> {
        let what = format!("manifest {}", self.reference.repo_digest(digest));
        self.try_endpoints(Need::Pull, &what, async |ep| {
            let oref = self.oci_ref(ep, |reg, repo| {
                oci_client::Reference::with_digest(reg, repo, digest.to_string())
            });
            let (bytes, _) = self.manifest_raw(ep, &oref, &what).await?;
            if &Digest::of(&bytes) != digest {
                return Err(Error::verification(
                    digest.to_string(),
                    format!(
                        "{} served a manifest with another digest",
                        ep.endpoint.url()
                    ),
                ));
            }
            Ok(bytes)
        })
        .await
    }

    async fn manifest_raw(
        &self,
        ep: &EndpointClient,
        oref: &oci_client::Reference,
        what: &str,
    ) -> Result<(Vec<u8>, String)> {
        // A manifest is small: the whole answer must come within the
        // progress timeout.
        let fetch = async {
            let auth = self.endpoint_auth(ep).await?;
            ep.client
                .pull_manifest_raw(oref, &auth, MANIFEST_TYPES)
                .await
                .map_err(|e| map_oci_error(&ep.endpoint, what, e))
        };
        let (bytes, digest) = self
            .within(fetch)
            .await
            .ok_or_else(|| self.stalled(ep, what))??;
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::verification(
                what,
                format!("manifest larger than {MAX_MANIFEST_BYTES} bytes"),
            ));
        }
        Ok((bytes.to_vec(), digest))
    }

    /// The manifest tagged `tag` in the image's repository, or None when
    /// the registry has no such tag (signature lookups).
    pub(crate) async fn fetch_tagged(&self, tag: &str) -> Result<Option<Vec<u8>>> {
        match self.fetch_manifest_by_tag(tag).await {
            Ok((bytes, _)) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A small blob, whole, in memory (never in the content store),
    /// checked against its descriptor's size and digest; at most `max`
    /// bytes are read.
    pub(crate) async fn fetch_blob_bytes(&self, desc: &Descriptor, max: u64) -> Result<Vec<u8>> {
        let what = format!("blob {}", desc.digest);
        if desc.size > max {
            return Err(Error::verification(
                what,
                format!("{} bytes is over the {max} byte limit", desc.size),
            ));
        }
        self.try_endpoints(Need::Pull, &what, |ep| {
            let what = what.clone();
            async move {
                let oref = self.oci_ref(ep, |reg, repo| {
                    oci_client::Reference::with_digest(reg, repo, desc.digest.to_string())
                });
                let digest = desc.digest.to_string();
                let fetch = async {
                    let auth = self.endpoint_auth(ep).await?;
                    ep.client
                        .store_auth_if_needed(oref.resolve_registry(), &auth)
                        .await;
                    let mut stream = ep
                        .client
                        .pull_blob_stream(&oref, digest.as_str())
                        .await
                        .map_err(|e| map_oci_error(&ep.endpoint, &what, e))?;
                    let mut bytes = Vec::new();
                    while let Some(chunk) = stream.next().await {
                        let chunk = chunk.map_err(|e| Error::Registry {
                            host: ep.endpoint.url(),
                            message: format!("downloading {what}: {}", error_chain(&e)),
                        })?;
                        if (bytes.len() + chunk.len()) as u64 > desc.size {
                            return Err(Error::verification(&what, "more bytes than declared"));
                        }
                        bytes.extend_from_slice(&chunk);
                    }
                    Ok(bytes)
                };
                let bytes = self
                    .within(fetch)
                    .await
                    .ok_or_else(|| self.stalled(ep, &what))??;
                if bytes.len() as u64 != desc.size || Digest::of(&bytes) != desc.digest {
                    return Err(Error::verification(
                        &what,
                        "the registry sent other content than the descriptor names",
                    ));
                }
                Ok(bytes)
            }
        })
        .await
    }

    /// Downloads a blob into the content store, verifying size and digest
    /// as it streams; another endpoint is tried if one fails.
    pub async fn fetch_blob(
        &self,
        content: &ContentStore,
        desc: &Descriptor,
        progress: Option<&ProgressFn>,
    ) -> Result<()> {
        let what = format!("blob {}", desc.digest);
        self.try_endpoints(Need::Pull, &what, |ep| {
            self.fetch_blob_from(ep, content, desc, progress)
        })
        .await
    }

    async fn fetch_blob_from(
        &self,
        ep: &EndpointClient,
        content: &ContentStore,
        desc: &Descriptor,
        progress: Option<&ProgressFn>,
    ) -> Result<()> {
        let what = format!("blob {}", desc.digest);
        let oref = self.oci_ref(ep, |reg, repo| {
            oci_client::Reference::with_digest(reg, repo, desc.digest.to_string())
        });
        // A plain digest string: foreign-layer URLs in the descriptor are
        // never followed (they would send requests anywhere).
        let digest = desc.digest.to_string();
        let request = async {
            let auth = self.endpoint_auth(ep).await?;
            ep.client
                .store_auth_if_needed(oref.resolve_registry(), &auth)
                .await;
            ep.client
                .pull_blob_stream(&oref, digest.as_str())
                .await
                .map_err(|e| map_oci_error(&ep.endpoint, &what, e))
        };
        let mut stream = self
            .within(request)
            .await
            .ok_or_else(|| self.stalled(ep, &what))??;
        // Dropped on any error below: its temp file goes with it, so a
        // cancelled download leaves no partial blob.
        let mut writer = content.writer(Some((desc.digest.clone(), desc.size)))?;
        // The timeout restarts with every chunk: a slow download that keeps
        // coming is never given up.
        while let Some(chunk) = self
            .within(stream.next())
            .await
            .ok_or_else(|| self.stalled(ep, &what))?
        {
            let chunk = match chunk {
                Ok(c) => c,
                // oci-client checks the digest too and fails the stream's
                // end; with every byte in, crust's own check says what is
                // wrong with the content.
                Err(e) if writer.written() == desc.size => {
                    writer.commit()?;
                    return Err(Error::verification(what, error_chain(&e)));
                }
                Err(e) => {
                    return Err(Error::Registry {
                        host: ep.endpoint.url(),
                        message: format!("downloading {what}: {}", error_chain(&e)),
                    });
                }
            };
            writer.write(&chunk)?;
            if let Some(report) = progress {
                report(Progress {
                    digest: desc.digest.clone(),
                    done: writer.written(),
                    total: desc.size,
                    present: false,
                });
            }
        }
        content.commit(writer).await?;
        Ok(())
    }

    /// Builds the oci-client reference for an endpoint: the endpoint is the
    /// registry, so URLs and token scopes go to it.
    fn oci_ref(
        &self,
        ep: &EndpointClient,
        make: impl FnOnce(String, String) -> oci_client::Reference,
    ) -> oci_client::Reference {
        make(ep.endpoint.registry(), self.reference.path().to_string())
    }

    async fn endpoint_auth(&self, ep: &EndpointClient) -> Result<RegistryAuth> {
        ep.auth
            .get_or_try_init(|| async {
                if !ep.creds_apply {
                    return Ok(RegistryAuth::Anonymous);
                }
                match &self.auth {
                    Auth::Anonymous => Ok(RegistryAuth::Anonymous),
                    Auth::Basic(u, p) => Ok(RegistryAuth::Basic(u.clone(), p.clone())),
                    Auth::Bearer(t) => Ok(RegistryAuth::Bearer(t.clone())),
                    Auth::Identity(refresh) => {
                        let token =
                            exchange_identity_token(&ep.endpoint, self.reference.path(), refresh)
                                .await?;
                        Ok(RegistryAuth::Bearer(token))
                    }
                }
            })
            .await
            .cloned()
    }

    /// Runs `attempt` on each endpoint able to do `need`, in order, until one
    /// succeeds. If all fail, the error is NotFound only when every endpoint
    /// said so; otherwise the first other error.
    async fn try_endpoints<'a, T, F>(
        &'a self,
        need: Need,
        what: &str,
        attempt: impl Fn(&'a EndpointClient) -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + 'a,
    {
        let mut first_failure: Option<Error> = None;
        let mut tried = 0;
        for ep in &self.endpoints {
            let able = match need {
                Need::Resolve => ep.endpoint.capabilities.resolve,
                Need::Pull => ep.endpoint.capabilities.pull,
            };
            if !able {
                continue;
            }
            tried += 1;
            match attempt(ep).await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    tracing::debug!(endpoint = %ep.endpoint.url(), error = %e, "{what}: endpoint failed");
                    if e.kind() != ErrorKind::NotFound && first_failure.is_none() {
                        first_failure = Some(e);
                    }
                }
            }
        }
        if tried == 0 {
            return Err(Error::Registry {
                host: self.reference.domain().to_string(),
                message: format!("no configured host may {need:?} {what}").to_lowercase(),
            });
        }
        Err(first_failure.unwrap_or_else(|| Error::NotFound(what.to_string())))
    }
}

fn build_client(ep: &Endpoint) -> Result<oci_client::Client> {
    let config = ClientConfig {
        protocol: match ep.scheme {
            Scheme::Http => ClientProtocol::Http,
            Scheme::Https => ClientProtocol::Https,
        },
        accept_invalid_certificates: ep.skip_verify,
        extra_root_certificates: load_cas(ep)?
            .into_iter()
            .map(|data| Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            })
            .collect(),
        // Indexes are resolved by crust itself.
        platform_resolver: None,
        connect_timeout: Some(CONNECT_TIMEOUT),
        // No read timeout of the client's own: the pull's progress timeout
        // (`Remote::within`) watches every request, with an error that
        // says what stalled.
        read_timeout: None,
        user_agent: USER_AGENT,
        // Proxies from the environment, as containerd honours them; never
        // for registries on this machine.
        https_proxy: proxy_env(ep, "https_proxy"),
        http_proxy: proxy_env(ep, "http_proxy"),
        no_proxy: proxy_env(ep, "no_proxy"),
        ..ClientConfig::default()
    };
    oci_client::Client::try_from(config).map_err(|e| Error::Registry {
        host: ep.url(),
        message: format!("setting up the client: {}", error_chain(&e)),
    })
}

fn proxy_env(ep: &Endpoint, name: &str) -> Option<String> {
    if crate::hosts::is_loopback(&ep.host) {
        return None;
    }
    std::env::var(name.to_ascii_uppercase())
        .or_else(|_| std::env::var(name))
        .ok()
        .filter(|v| !v.is_empty())
}

/// The endpoint's CA files, split into one PEM certificate each.
fn load_cas(ep: &Endpoint) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for path in &ep.ca {
        let text = std::fs::read_to_string(path).map_err(|e| Error::HostsConfig {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        out.extend(split_pem(&text).into_iter().map(String::into_bytes));
    }
    Ok(out)
}

fn split_pem(text: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

fn map_oci_error(ep: &Endpoint, what: &str, e: OciDistributionError) -> Error {
    let host = ep.url();
    match e {
        OciDistributionError::UnauthorizedError { .. } => Error::Unauthorized {
            host,
            message: format!("{what}: the registry wants credentials or refused them"),
        },
        OciDistributionError::AuthenticationFailure(m) => Error::Unauthorized { host, message: m },
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            let message = format!("{what}: {envelope}");
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                Error::NotFound(format!("{what} at {host}"))
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                Error::Unauthorized { host, message }
            } else {
                Error::Registry { host, message }
            }
        }
        OciDistributionError::ServerError { code: 404, .. } => {
            Error::NotFound(format!("{what} at {host}"))
        }
        OciDistributionError::ServerError {
            code: 401 | 403,
            message,
            ..
        } => Error::Unauthorized { host, message },
        OciDistributionError::DigestError(d) => Error::verification(what, d.to_string()),
        other => Error::Registry {
            host,
            message: format!("{what}: {}", error_chain(&other)),
        },
    }
}

/// A duration as the config writes it: `5m`, `1m30s`, `2s`, `500ms`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let (secs, millis) = (d.as_secs(), d.subsec_millis());
    if secs == 0 {
        return format!("{millis}ms");
    }
    let mut out = String::new();
    for (n, unit) in [(secs / 3600, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if millis > 0 {
        out.push_str(&format!("{millis}ms"));
    }
    out
}

/// An error with its sources, so "connection refused" is not lost behind
/// "error sending request".
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let text = src.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = src.source();
    }
    s
}

/// A `WWW-Authenticate: Bearer realm=...,service=...` challenge.
#[derive(Debug, PartialEq, Eq)]
struct BearerChallenge {
    realm: String,
    service: Option<String>,
}

fn parse_bearer_challenge(header: &str) -> Option<BearerChallenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut realm = None;
    let mut service = None;
    for (key, value) in parse_auth_params(params) {
        match key.to_ascii_lowercase().as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            _ => {}
        }
    }
    Some(BearerChallenge {
        realm: realm?,
        service,
    })
}

/// `key="quoted \" value",key2=token` pairs (RFC 7235 auth-params).
fn parse_auth_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key.trim().to_string(), value.trim().to_string()));
    }
    out
}

/// Exchanges a CRI identity token (an OAuth2 refresh token) for an access
/// token at the token endpoint the registry's challenge names, as Docker
/// and containerd do (POST, grant_type=refresh_token).
async fn exchange_identity_token(ep: &Endpoint, repository: &str, refresh: &str) -> Result<String> {
    let host = ep.url();
    let fail = |message: String| Error::Unauthorized {
        host: host.clone(),
        message,
    };
    let http = token_http_client(ep)?;
    let ping = http
        .get(format!("{host}/v2/"))
        .send()
        .await
        .map_err(|e| Error::Registry {
            host: host.clone(),
            message: error_chain(&e),
        })?;
    let challenge = ping
        .headers()
        .get(reqwest::header::WWW_AUTHENTICATE)
        .and_then(|h| h.to_str().ok())
        .and_then(parse_bearer_challenge)
        .ok_or_else(|| fail("an identity token needs a registry with token auth, and this one sent no Bearer challenge".to_string()))?;
    let realm = reqwest::Url::parse(&challenge.realm)
        .map_err(|e| fail(format!("token realm {}: {e}", quote(&challenge.realm))))?;
    check_realm(ep, &realm).map_err(fail)?;
    let scope = format!("repository:{repository}:pull");
    let mut form = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh),
        ("client_id", "crust"),
        ("scope", scope.as_str()),
    ];
    if let Some(service) = &challenge.service {
        form.push(("service", service));
    }
    let mut resp = http
        .post(realm)
        .form(&form)
        .send()
        .await
        .map_err(|e| fail(format!("token request: {}", error_chain(&e))))?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| fail(format!("token response: {}", error_chain(&e))))?
    {
        if body.len() + chunk.len() > MAX_TOKEN_RESPONSE {
            return Err(fail("token response too large".to_string()));
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        return Err(fail(format!(
            "token endpoint refused the identity token: {status} {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>()
        )));
    }
    access_token_from(&body).ok_or_else(|| fail("token response has no access_token".to_string()))
}

fn access_token_from(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct TokenResponse {
        #[serde(default)]
        access_token: Option<String>,
        #[serde(default)]
        token: Option<String>,
    }
    let r: TokenResponse = serde_json::from_slice(body).ok()?;
    r.access_token.or(r.token).filter(|t| !t.is_empty())
}

/// A refresh token must not travel in clear text unless the registry
/// itself is plain http or the realm is on this machine.
fn check_realm(ep: &Endpoint, realm: &reqwest::Url) -> std::result::Result<(), String> {
    match realm.scheme() {
        "https" => Ok(()),
        "http"
            if ep.scheme == Scheme::Http
                || realm.host_str().is_some_and(crate::hosts::is_loopback) =>
        {
            Ok(())
        }
        other => Err(format!(
            "token realm {realm} uses {other}; refusing to send a token there"
        )),
    }
}

fn token_http_client(ep: &Endpoint) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .danger_accept_invalid_certs(ep.skip_verify);
    for pem in load_cas(ep)? {
        let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| Error::HostsConfig {
            path: ep.url(),
            reason: format!("CA certificate: {e}"),
        })?;
        builder = builder.add_root_certificate(cert);
    }
    builder.build().map_err(|e| Error::Registry {
        host: ep.url(),
        message: format!("setting up the client: {}", error_chain(&e)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    fn creds() -> Credentials {
        Credentials::default()
    }

    #[test]
    fn durations_read_as_the_config_writes_them() {
        let d = Duration::from_millis;
        assert_eq!(fmt_duration(d(300_000)), "5m");
        assert_eq!(fmt_duration(d(90_000)), "1m30s");
        assert_eq!(fmt_duration(d(2_000)), "2s");
        assert_eq!(fmt_duration(d(1_500)), "1s500ms");
        assert_eq!(fmt_duration(d(250)), "250ms");
        assert_eq!(fmt_duration(d(3_723_000)), "1h2m3s");
    }

    #[test]
    fn credentials_pick_one_auth() {
        assert!(matches!(creds().auth().unwrap(), Auth::Anonymous));
        let c = Credentials {
            username: "u".into(),
            password: "p".into(),
            ..creds()
        };
        assert!(matches!(c.auth().unwrap(), Auth::Basic(u, p) if u == "u" && p == "p"));
        let c = Credentials {
            auth: base64::engine::general_purpose::STANDARD.encode("user:pa:ss"),
            ..creds()
        };
        assert!(matches!(c.auth().unwrap(), Auth::Basic(u, p) if u == "user" && p == "pa:ss"));
        let c = Credentials {
            identity_token: "refresh".into(),
            username: "u".into(),
            ..creds()
        };
        assert!(matches!(c.auth().unwrap(), Auth::Identity(t) if t == "refresh"));
        let c = Credentials {
            registry_token: "tok".into(),
            identity_token: "refresh".into(),
            ..creds()
        };
        assert!(matches!(c.auth().unwrap(), Auth::Bearer(t) if t == "tok"));
        for bad in ["!!!", "bm9jb2xvbg=="] {
            let c = Credentials {
                auth: bad.into(),
                ..creds()
            };
            assert!(
                matches!(c.auth(), Err(e) if e.kind() == ErrorKind::InvalidArgument),
                "{bad}"
            );
        }
    }

    #[test]
    fn credentials_go_only_to_their_server() {
        let c = Credentials {
            server_address: "https://index.docker.io/v1/".into(),
            ..creds()
        };
        assert!(c.applies_to("docker.io", "registry-1.docker.io"));
        assert!(c.applies_to("docker.io", "mirror.local"));
        assert!(!c.applies_to("quay.io", "quay.io"));
        let c = Credentials {
            server_address: "127.0.0.1:5000".into(),
            ..creds()
        };
        assert!(c.applies_to("127.0.0.1:5000", "127.0.0.1:5000"));
        assert!(!c.applies_to("evil.example.com", "evil.example.com"));
        assert!(creds().applies_to("anything", "anywhere"));
    }

    #[test]
    fn debug_hides_secrets() {
        let c = Credentials {
            password: "hunter2".into(),
            registry_token: "tok".into(),
            ..creds()
        };
        let s = format!("{c:?}");
        assert!(!s.contains("hunter2") && !s.contains("tok\""), "{s}");
    }

    #[test]
    fn bearer_challenges() {
        let c = parse_bearer_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#,
        )
        .unwrap();
        assert_eq!(c.realm, "https://auth.docker.io/token");
        assert_eq!(c.service.as_deref(), Some("registry.docker.io"));
        let c = parse_bearer_challenge(r#"bearer realm=http://127.0.0.1:1/t , service="a \"q\"""#)
            .unwrap();
        assert_eq!(c.realm, "http://127.0.0.1:1/t");
        assert_eq!(c.service.as_deref(), Some("a \"q\""));
        assert!(parse_bearer_challenge(r#"Basic realm="x""#).is_none());
        assert!(parse_bearer_challenge("Bearer service=x").is_none());
        assert!(parse_bearer_challenge("").is_none());
    }

    proptest::proptest! {
        #![proptest_config(crust_quote::testing::config(1024))]

        /// Any WWW-Authenticate value: a challenge or none, never a panic;
        /// a quoted realm comes back unescaped.
        #[test]
        fn any_challenge_parses_or_is_none(
            scheme in proptest::prop_oneof!["Bearer", "bearer", "Basic", "[A-Za-z]{0,8}"],
            params in proptest::collection::vec(
                (
                    proptest::prop_oneof!["realm", "service", "scope", "REALM", "[a-z=,\" ]{0,6}"],
                    crust_quote::testing::hostile_string(),
                    proptest::prelude::any::<bool>(),
                ),
                0..5,
            ),
            tail in crust_quote::testing::hostile_string(),
        ) {
            let mut header = format!("{scheme} ");
            for (k, v, quoted) in &params {
                if *quoted {
                    let escaped = v.replace('\\', "\\\\").replace('"', "\\\"");
                    header.push_str(&format!("{k}=\"{escaped}\","));
                } else {
                    header.push_str(&format!("{k}={v},"));
                }
            }
            header.push_str(&tail);
            if let Some(c) = parse_bearer_challenge(&header) {
                proptest::prop_assert!(scheme.eq_ignore_ascii_case("bearer"));
                proptest::prop_assert!(c.realm.len() <= header.len());
            }
            let _ = parse_auth_params(&tail);
        }

        #[test]
        fn any_token_response_is_a_token_or_none(
            body in proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
                crust_quote::testing::hostile_string().prop_map(|t| {
                    serde_json::json!({"access_token": t, "token": "x"}).to_string().into_bytes()
                }),
            ]
        ) {
            if let Some(t) = access_token_from(&body) {
                proptest::prop_assert!(!t.is_empty());
            }
        }
    }

    #[test]
    fn token_responses() {
        assert_eq!(
            access_token_from(br#"{"access_token":"a","token":"b"}"#).as_deref(),
            Some("a")
        );
        assert_eq!(access_token_from(br#"{"token":"b"}"#).as_deref(), Some("b"));
        assert_eq!(access_token_from(br#"{"token":""}"#), None);
        assert_eq!(access_token_from(b"nope"), None);
    }

    #[test]
    fn realm_must_be_safe_for_tokens() {
        let https = Endpoint {
            scheme: Scheme::Https,
            host: "r.example.com".into(),
            path_prefix: String::new(),
            capabilities: crate::hosts::Capabilities::ALL,
            skip_verify: false,
            ca: vec![],
        };
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(check_realm(&https, &url("https://auth.example.com/token")).is_ok());
        assert!(check_realm(&https, &url("http://auth.example.com/token")).is_err());
        assert!(check_realm(&https, &url("http://127.0.0.1:9/token")).is_ok());
        assert!(check_realm(&https, &url("ftp://x/")).is_err());
    }

    #[test]
    fn pem_bundles_split() {
        let one = "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----";
        let two = format!("junk\n{one}\n{one}\ntrailing");
        assert_eq!(split_pem(&two).len(), 2);
        assert!(split_pem("nothing").is_empty());
    }
}
