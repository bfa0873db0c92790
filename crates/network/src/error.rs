use std::path::PathBuf;

use crust_quote::{clip, quote};

use crate::config::ConfigError;

/// Errors of CNI operations. [`Error::is_invalid_argument`] separates bad
/// requests (gRPC InvalidArgument) from network failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid {what}: {why}")]
    InvalidArgument { what: String, why: String },

    #[error(transparent)]
    Config(#[from] ConfigError),

    /// The network config names a plugin no bin dir holds.
    #[error("CNI plugin {} not found in {dirs}", quote(plugin))]
    PluginNotFound { plugin: String, dirs: String },

    /// The plugin failed and said why (CNI error JSON).
    #[error(
        "CNI plugin {plugin} {command} failed: {} (code {code}: {}){}",
        clip(msg),
        code_meaning(*code),
        details_suffix(details)
    )]
    Plugin {
        plugin: String,
        command: &'static str,
        code: u64,
        msg: String,
        details: String,
    },

    /// The plugin failed without an error JSON.
    #[error("CNI plugin {plugin} {command} failed ({status}): {}", clip(output))]
    PluginExit {
        plugin: String,
        command: &'static str,
        status: String,
        output: String,
    },

    #[error("CNI plugin {plugin} {command} timed out after {seconds}s")]
    Timeout {
        plugin: String,
        command: &'static str,
        seconds: u64,
    },

    #[error("cannot run CNI plugin {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A system tool (iptables) failed.
    #[error("{tool} failed: {}", clip(why))]
    ToolFailed { tool: &'static str, why: String },

    #[error("CNI plugin {plugin} returned an invalid result: {why}")]
    InvalidResult { plugin: String, why: String },

    #[error("{what} is not supported by CNI version {version}")]
    Unsupported { what: &'static str, version: String },

    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// ADD failed, and so did the DEL that was to undo its partial work;
    /// the caller should retry DEL.
    #[error("{add}; cleaning up with DEL also failed: {del}")]
    AddAndCleanup { add: Box<Error>, del: Box<Error> },
}

impl Error {
    /// Whether the request, not the network, is at fault.
    pub fn is_invalid_argument(&self) -> bool {
        match self {
            Error::InvalidArgument { .. } => true,
            Error::AddAndCleanup { add, .. } => add.is_invalid_argument(),
            _ => false,
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, why: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what: what.into(),
            why: why.into(),
        }
    }
}

/// The CNI spec's well-known error codes.
fn code_meaning(code: u64) -> &'static str {
    match code {
        1 => "incompatible CNI version",
        2 => "unsupported field in network configuration",
        3 => "container unknown or does not exist",
        4 => "invalid necessary environment variables",
        5 => "I/O failure",
        6 => "failed to decode content",
        7 => "invalid network config",
        11 => "try again later",
        50 => "plugin not available",
        51 => "plugin not available, existing containers may be affected",
        100.. => "plugin-specific error",
        _ => "reserved error code",
    }
}

fn details_suffix(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!("; details: {}", clip(details))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_errors_say_code_message_and_details() {
        let e = Error::Plugin {
            plugin: "bridge".into(),
            command: "ADD",
            code: 7,
            msg: "bad bridge".into(),
            details: "name too long".into(),
        };
        assert_eq!(
            e.to_string(),
            "CNI plugin bridge ADD failed: bad bridge (code 7: invalid network config); details: name too long"
        );
        let e = Error::Plugin {
            plugin: "x".into(),
            command: "DEL",
            code: 999,
            msg: "m".into(),
            details: String::new(),
        };
        assert_eq!(
            e.to_string(),
            "CNI plugin x DEL failed: m (code 999: plugin-specific error)"
        );
    }
}
