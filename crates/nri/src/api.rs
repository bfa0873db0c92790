//! The NRI protocol messages (generated from `proto/nri/v1alpha1/api.proto`)
//! and the small rules around them: event masks, removal markers, plugin
//! names and indices.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
}

pub use generated::*;

/// ttrpc service name of what plugins serve.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// ttrpc service name of what the runtime serves.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// Environment variables a pre-installed plugin is started with.
pub const PLUGIN_NAME_ENV: &str = "NRI_PLUGIN_NAME";
pub const PLUGIN_IDX_ENV: &str = "NRI_PLUGIN_IDX";
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";

/// The NRI version this crate speaks (reported in ConfigureRequest).
pub const NRI_VERSION: &str = "v0.12.1";

/// A set of [`Event`]s: bit `e - 1` stands for event `e`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventMask(pub i32);

impl EventMask {
    /// Every event a plugin may subscribe to.
    pub const ALL: EventMask = EventMask((1 << (Event::Last as i32 - 1)) - 1);

    pub fn of(events: &[Event]) -> EventMask {
        let mut m = EventMask(0);
        for e in events {
            m.set(*e);
        }
        m
    }

    pub fn set(&mut self, e: Event) {
        self.0 |= 1 << (e as i32 - 1);
    }

    pub fn is_set(self, e: Event) -> bool {
        let bit = e as i32 - 1;
        (0..31).contains(&bit) && self.0 & (1 << bit) != 0
    }
}

impl Event {
    /// The name NRI uses in messages and logs ("CreateContainer").
    pub fn pretty_name(self) -> &'static str {
        match self {
            Event::Unknown => "Unknown",
            Event::RunPodSandbox => "RunPodSandbox",
            Event::StopPodSandbox => "StopPodSandbox",
            Event::RemovePodSandbox => "RemovePodSandbox",
            Event::CreateContainer => "CreateContainer",
            Event::PostCreateContainer => "PostCreateContainer",
            Event::StartContainer => "StartContainer",
            Event::PostStartContainer => "PostStartContainer",
            Event::UpdateContainer => "UpdateContainer",
            Event::PostUpdateContainer => "PostUpdateContainer",
            Event::StopContainer => "StopContainer",
            Event::RemoveContainer => "RemoveContainer",
            Event::UpdatePodSandbox => "UpdatePodSandbox",
            Event::PostUpdatePodSandbox => "PostUpdatePodSandbox",
            Event::ValidateContainerAdjustment => "ValidateContainerAdjustment",
            Event::Last => "Last",
        }
    }
}

impl Field {
    /// The name NRI uses in conflict errors ("MemLimit").
    pub fn name(self) -> &'static str {
        // The generated `as_str_name` is the proto enum value name, which is
        // exactly NRI's name for the field.
        self.as_str_name()
    }
}

/// `Some(key)` when `key` carries the removal marker (a leading '-').
pub fn removal_target(key: &str) -> Option<&str> {
    key.strip_prefix('-').filter(|_| !key.is_empty())
}

/// The key without a removal marker.
pub fn clear_removal_marker(key: &str) -> &str {
    key.strip_prefix('-').unwrap_or(key)
}

/// `key` with the removal marker.
pub fn mark_for_removal(key: &str) -> String {
    format!("-{key}")
}

/// Checks a plugin index: exactly two decimal digits.
pub fn check_plugin_index(idx: &str) -> Result<(), String> {
    let b = idx.as_bytes();
    if b.len() != 2 || !b.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "invalid plugin index {:?}, must be 2 digits",
            crate::quote(idx)
        ));
    }
    Ok(())
}

/// Checks a plugin name: non-empty, `[a-zA-Z0-9_.+-]` only.
pub fn check_plugin_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("invalid plugin name: name is empty".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+')))
    {
        return Err(format!(
            "invalid plugin name {:?}: contains invalid character {c:?}",
            crate::quote(name)
        ));
    }
    Ok(())
}

/// Splits a pre-installed plugin's file name `NN-name` into index and name.
pub fn parse_plugin_file_name(file: &str) -> Result<(&str, &str), String> {
    let Some((idx, name)) = file.split_once('-') else {
        return Err(format!(
            "invalid plugin name {:?}, idx-pluginname expected",
            crate::quote(file)
        ));
    };
    check_plugin_index(idx)?;
    check_plugin_name(name)?;
    Ok((idx, name))
}

impl KeyValue {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_mask_bits_follow_nri() {
        // NRI: ValidEvents = (1 << (LAST-1)) - 1, RunPodSandbox is bit 0.
        assert_eq!(EventMask::ALL.0, 0x3fff);
        let m = EventMask::of(&[Event::RunPodSandbox, Event::CreateContainer]);
        assert_eq!(m.0, 0b1001);
        assert!(m.is_set(Event::CreateContainer));
        assert!(!m.is_set(Event::StopContainer));
        assert!(!m.is_set(Event::Unknown));
    }

    #[test]
    fn plugin_names_and_indices() {
        assert!(check_plugin_index("05").is_ok());
        assert!(check_plugin_index("5").is_err());
        assert!(check_plugin_index("a5").is_err());
        assert!(check_plugin_index("123").is_err());
        assert!(check_plugin_name("my-plugin_1.0+x").is_ok());
        assert!(check_plugin_name("").is_err());
        assert!(check_plugin_name("bad/name").is_err());
        assert_eq!(
            parse_plugin_file_name("10-logger").unwrap(),
            ("10", "logger")
        );
        assert_eq!(parse_plugin_file_name("10-a-b").unwrap(), ("10", "a-b"));
        assert!(parse_plugin_file_name("logger").is_err());
        assert!(parse_plugin_file_name("1-logger").is_err());
    }

    #[test]
    fn removal_markers() {
        assert_eq!(removal_target("-FOO"), Some("FOO"));
        assert_eq!(removal_target("FOO"), None);
        assert_eq!(removal_target(""), None);
        assert_eq!(clear_removal_marker("-/mnt"), "/mnt");
        assert_eq!(mark_for_removal("x"), "-x");
    }

    #[test]
    fn field_names_are_nri_names() {
        assert_eq!(Field::MemLimit.name(), "MemLimit");
        assert_eq!(Field::CpuSetCpUs.name(), "CPUSetCPUs");
    }
}
