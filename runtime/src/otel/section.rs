//! The `[tracing]` table: where OpenTelemetry spans go, and how many.

use serde::{Deserialize, Serialize};

/// CRI-O's default: only calls whose caller sampled them (kubelet's
/// `traceparent` with the sampled flag) are traced; see
/// [`TracingSection::sampling_rate_per_million`].
pub const DEFAULT_SAMPLING_RATE_PER_MILLION: u32 = 0;

/// All of them.
pub const MAX_SAMPLING_RATE_PER_MILLION: u32 = 1_000_000;

/// The longest `service_name` (it goes into every export).
const MAX_SERVICE_NAME: usize = 128;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingSection {
    /// The OTLP/gRPC collector, `http://HOST:PORT` (e.g.
    /// `http://127.0.0.1:4317`); "" (the default): tracing is off, no
    /// exporter exists and no span is made.
    pub endpoint: String,
    /// Calls traced per million that come without a sampling decision of
    /// their caller (a call with a W3C `traceparent` follows its sampled
    /// flag, as CRI-O and kubelet do): 0 (CRI-O's default) traces only
    /// what kubelet samples, 1000000 traces every call (crictl's too).
    pub sampling_rate_per_million: u32,
    /// `service.name` of the exported spans.
    pub service_name: String,
}

impl Default for TracingSection {
    fn default() -> Self {
        TracingSection {
            endpoint: String::new(),
            sampling_rate_per_million: DEFAULT_SAMPLING_RATE_PER_MILLION,
            service_name: "crust".into(),
        }
    }
}

impl TracingSection {
    /// Whether spans are made and exported.
    pub fn enabled(&self) -> bool {
        !self.endpoint.trim().is_empty()
    }

    /// The collector's URI, checked; None when tracing is off.
    pub fn endpoint_uri(&self) -> Result<Option<http::Uri>, String> {
        let text = self.endpoint.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let shown = || crust_quote::quote(text);
        let uri: http::Uri = text.parse().map_err(|_| {
            format!(
                "tracing.endpoint must be http://HOST:PORT (an OTLP/gRPC collector, e.g. \
                 \"http://127.0.0.1:4317\"), got {}",
                shown()
            )
        })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "tracing.endpoint {}: https is not supported (crust speaks plain OTLP/gRPC \
                     to a collector on the node or its network); use http://",
                    shown()
                ));
            }
            _ => {
                return Err(format!(
                    "tracing.endpoint must start with http:// (e.g. \"http://127.0.0.1:4317\"), \
                     got {}",
                    shown()
                ));
            }
        }
        if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
            return Err(format!(
                "tracing.endpoint must name a host and a port (e.g. \"http://127.0.0.1:4317\"), \
                 got {}",
                shown()
            ));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(format!(
                "tracing.endpoint {}: OTLP/gRPC takes no path (OTLP/HTTP's /v1/traces is not \
                 supported); use http://HOST:PORT",
                shown()
            ));
        }
        Ok(Some(uri))
    }

    /// The sampling ratio of calls without a caller's decision.
    pub fn ratio(&self) -> f64 {
        f64::from(
            self.sampling_rate_per_million
                .min(MAX_SAMPLING_RATE_PER_MILLION),
        ) / f64::from(MAX_SAMPLING_RATE_PER_MILLION)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.endpoint_uri()?;
        if self.sampling_rate_per_million > MAX_SAMPLING_RATE_PER_MILLION {
            return Err(format!(
                "tracing.sampling_rate_per_million must be 0 to {MAX_SAMPLING_RATE_PER_MILLION}, \
                 got {}",
                self.sampling_rate_per_million
            ));
        }
        let name = self.service_name.trim();
        if name.is_empty() || name.len() > MAX_SERVICE_NAME || name.chars().any(|c| c.is_control())
        {
            return Err(format!(
                "tracing.service_name must be 1 to {MAX_SERVICE_NAME} printable characters, got \
                 {}",
                crust_quote::quote(&self.service_name)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_endpoint(e: &str) -> TracingSection {
        TracingSection {
            endpoint: e.into(),
            ..TracingSection::default()
        }
    }

    #[test]
    fn off_by_default() {
        let s = TracingSection::default();
        assert!(!s.enabled());
        assert_eq!(s.endpoint_uri().unwrap(), None);
        assert_eq!(s.ratio(), 0.0);
        s.validate().unwrap();
    }

    #[test]
    fn endpoints_are_checked() {
        let s = with_endpoint("http://127.0.0.1:4317");
        assert!(s.enabled());
        assert_eq!(s.endpoint_uri().unwrap().unwrap().port_u16(), Some(4317));
        with_endpoint("http://collector.local:4317/")
            .validate()
            .unwrap();
        for (bad, says) in [
            ("https://c:4317", "https"),
            ("grpc://c:4317", "http://"),
            ("c:4317", "http://"),
            ("http://c", "port"),
            ("http://c:4318/v1/traces", "/v1/traces"),
            ("http://exa mple:1", "http://HOST:PORT"),
        ] {
            let err = with_endpoint(bad).validate().unwrap_err();
            assert!(
                err.contains("tracing.endpoint") && err.contains(says),
                "{bad}: {err}"
            );
        }
        let long = format!("http://{}:1", "a b".repeat(5_000));
        assert!(with_endpoint(&long).validate().unwrap_err().len() < 1024);
    }

    #[test]
    fn rate_and_name_are_checked() {
        let mut s = with_endpoint("http://127.0.0.1:4317");
        s.sampling_rate_per_million = 250_000;
        assert_eq!(s.ratio(), 0.25);
        s.sampling_rate_per_million = 1_000_001;
        let err = s.validate().unwrap_err();
        assert!(err.contains("sampling_rate_per_million"), "{err}");
        s.sampling_rate_per_million = 1_000_000;
        s.service_name = " ".into();
        assert!(s.validate().unwrap_err().contains("service_name"));
        s.service_name = "a\nb".into();
        assert!(s.validate().unwrap_err().contains("service_name"));
    }
}
