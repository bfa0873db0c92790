//! NRI configuration, named as containerd names it
//! (`[plugins."io.containerd.nri.v1.nri"]`), for the daemon's `[nri]` table.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where plugins connect.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// Where pre-installed plugins (`NN-name` executables) are looked for.
pub const DEFAULT_PLUGIN_PATH: &str = "/opt/nri/plugins";
/// Where pre-installed plugins' configuration drop-ins are looked for.
pub const DEFAULT_PLUGIN_CONFIG_PATH: &str = "/etc/nri/conf.d";
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// NRI on or off (on by default, as in containerd 2.x).
    pub enable: bool,
    /// The socket external plugins connect to (root-only, 0600).
    pub socket_path: PathBuf,
    /// Directory of pre-installed plugins the runtime starts itself.
    pub plugin_path: PathBuf,
    /// Directory of their configuration (`NN-name.conf` or `name.conf`).
    pub plugin_config_path: PathBuf,
    /// How long a plugin has to register (Go duration syntax: "5s").
    #[serde(with = "go_duration")]
    pub plugin_registration_timeout: Duration,
    /// How long a plugin has to answer a request ("2s").
    #[serde(with = "go_duration")]
    pub plugin_request_timeout: Duration,
    /// Only pre-installed plugins: no socket for external ones.
    pub disable_connections: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            enable: true,
            socket_path: DEFAULT_SOCKET_PATH.into(),
            plugin_path: DEFAULT_PLUGIN_PATH.into(),
            plugin_config_path: DEFAULT_PLUGIN_CONFIG_PATH.into(),
            plugin_registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            plugin_request_timeout: DEFAULT_REQUEST_TIMEOUT,
            disable_connections: false,
        }
    }
}

impl Config {
    /// Checks what serde cannot: timeouts must be positive.
    pub fn validate(&self) -> Result<(), String> {
        for (name, d) in [
            (
                "plugin_registration_timeout",
                self.plugin_registration_timeout,
            ),
            ("plugin_request_timeout", self.plugin_request_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("nri.{name} must be greater than zero"));
            }
        }
        Ok(())
    }
}

/// Parses a Go `time.Duration` string ("1m30s", "500ms", "2h"), the form
/// containerd's configuration uses for these timeouts.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {:?} (expected e.g. \"5s\", \"500ms\", \"1m30s\")",
            crate::quote(s)
        )
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = Duration::ZERO;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_end == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        rest = &rest[unit_end..];
        let nanos = value * nanos_per;
        if !nanos.is_finite() || nanos > u64::MAX as f64 {
            return Err(bad());
        }
        total = total
            .checked_add(Duration::from_nanos(nanos as u64))
            .ok_or_else(bad)?;
    }
    Ok(total)
}

/// Formats a duration the way Go prints simple ones ("5s", "1500ms").
pub fn format_go_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

mod go_duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_containerds() {
        let c = Config::default();
        assert!(c.enable);
        assert_eq!(c.socket_path, PathBuf::from("/var/run/nri/nri.sock"));
        assert_eq!(c.plugin_path, PathBuf::from("/opt/nri/plugins"));
        assert_eq!(c.plugin_config_path, PathBuf::from("/etc/nri/conf.d"));
        assert_eq!(c.plugin_registration_timeout, Duration::from_secs(5));
        assert_eq!(c.plugin_request_timeout, Duration::from_secs(2));
        assert!(!c.disable_connections);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_go_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "5", "s", "5x", "-5s", "5s3"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_go_duration(Duration::from_secs(5)), "5s");
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn toml_table_round_trips_with_containerd_names() {
        #[derive(Deserialize)]
        struct Outer {
            nri: Config,
        }
        let text = r#"
            [nri]
            enable = false
            socket_path = "/run/x/nri.sock"
            plugin_registration_timeout = "10s"
            plugin_request_timeout = "1500ms"
            disable_connections = true
        "#;
        let c: Outer = toml_like(text);
        assert!(!c.nri.enable);
        assert_eq!(c.nri.socket_path, PathBuf::from("/run/x/nri.sock"));
        assert_eq!(c.nri.plugin_registration_timeout, Duration::from_secs(10));
        assert_eq!(c.nri.plugin_request_timeout, Duration::from_millis(1500));
        assert!(c.nri.disable_connections);
        assert_eq!(c.nri.plugin_path, PathBuf::from(DEFAULT_PLUGIN_PATH));

        let zero = Config {
            plugin_request_timeout: Duration::ZERO,
            ..Config::default()
        };
        assert!(
            zero.validate()
                .unwrap_err()
                .contains("plugin_request_timeout")
        );
    }

    fn toml_like<T: serde::de::DeserializeOwned>(text: &str) -> T {
        toml::from_str(text).unwrap()
    }
}
