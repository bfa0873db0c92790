//! Serving CRI `runtime.v1alpha2` through the `runtime.v1` services.
//!
//! Every v1alpha2 message is a wire-compatible subset of its v1 namesake
//! (same names, field numbers and types; v1 only adds fields, checked by
//! `api/tests/wire_compat.rs`). So a v1alpha2 call is served by routing it to
//! the v1 method of the same name: the request bytes decode as the v1
//! message, and the v1 response bytes decode as the v1alpha2 one, with v1-only
//! fields skipped by the client as unknown. The one place the version shows
//! is the `ApiVersion` extension this layer adds, which `Version` reads.

use std::task::{Context, Poll};

use http::{Request, Uri};
use tower::{Layer, Service};

const V1ALPHA2_PREFIX: &str = "/runtime.v1alpha2.";
const V1_PREFIX: &str = "/runtime.v1.";

/// Which CRI API version a call came in as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1Alpha2,
}

impl ApiVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "v1",
            ApiVersion::V1Alpha2 => "v1alpha2",
        }
    }

    /// The version a call was made with (v1 unless this layer said otherwise).
    pub fn of<T>(req: &tonic::Request<T>) -> ApiVersion {
        req.extensions()
            .get::<ApiVersion>()
            .copied()
            .unwrap_or(ApiVersion::V1)
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ApiVersionLayer;

impl<S> Layer<S> for ApiVersionLayer {
    type Service = ApiVersionRouter<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiVersionRouter { inner }
    }
}

#[derive(Debug, Clone)]
pub struct ApiVersionRouter<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for ApiVersionRouter<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(uri) = v1_uri_for(req.uri()) {
            *req.uri_mut() = uri;
            req.extensions_mut().insert(ApiVersion::V1Alpha2);
        }
        self.inner.call(req)
    }
}

/// The v1 URI for a v1alpha2 call, `None` for anything else.
fn v1_uri_for(uri: &Uri) -> Option<Uri> {
    let rest = uri.path().strip_prefix(V1ALPHA2_PREFIX)?;
    let mut parts = uri.clone().into_parts();
    let path = format!("{V1_PREFIX}{rest}");
    parts.path_and_query = Some(path.parse().ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_v1alpha2_paths() {
        let uri: Uri = "http://localhost/runtime.v1alpha2.RuntimeService/Version"
            .parse()
            .unwrap();
        assert_eq!(
            v1_uri_for(&uri).unwrap().to_string(),
            "http://localhost/runtime.v1.RuntimeService/Version"
        );
        let v1: Uri = "/runtime.v1.ImageService/ListImages".parse().unwrap();
        assert!(v1_uri_for(&v1).is_none());
        let other: Uri = "/grpc.health.v1.Health/Check".parse().unwrap();
        assert!(v1_uri_for(&other).is_none());
    }
}
