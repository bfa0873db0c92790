//! AppArmor: the container's `process.apparmorProfile`, as containerd's CRI
//! plugin chooses it.
//!
//! The request names a profile in the v1 `apparmor` message or, when that
//! is absent, the deprecated `apparmor_profile` string (`runtime/default`,
//! `unconfined`, `localhost/<name>`). On a node with AppArmor
//! ([`RuntimeFacts::apparmor_default_profile`] is set):
//! - RuntimeDefault, and no profile at all (kubernetes#51746), mean the
//!   daemon's default profile, except for privileged containers, which run
//!   unconfined unless a Localhost profile is named;
//! - Localhost profiles must be loaded already ([`Host::apparmor_profile_loaded`]);
//! - Unconfined means none.
//!
//! On a node without AppArmor, Localhost profiles are refused (nothing could
//! enforce them) and everything else means none.

use crust_api::v1::{
    LinuxContainerSecurityContext, SecurityProfile, security_profile::ProfileType,
};
use crust_quote::{clip, quote};

use crate::validate::MAX_PATH;
use crate::{Host, RuntimeFacts, SpecError};

const F: &str = "config.linux.security_context";

/// What the request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Choice {
    Unset,
    RuntimeDefault,
    Unconfined,
    /// (field, profile name)
    Localhost(String, String),
}

#[allow(deprecated)]
fn choice(sc: Option<&LinuxContainerSecurityContext>) -> Result<Choice, SpecError> {
    let Some(sc) = sc else {
        return Ok(Choice::Unset);
    };
    // The structured field wins when both are set (as kubelet sends them).
    if let Some(p) = &sc.apparmor {
        return profile_choice(&format!("{F}.apparmor"), p);
    }
    let field = format!("{F}.apparmor_profile");
    match sc.apparmor_profile.as_str() {
        "" => Ok(Choice::Unset),
        "runtime/default" => Ok(Choice::RuntimeDefault),
        "unconfined" => Ok(Choice::Unconfined),
        other => match other.strip_prefix("localhost/") {
            Some(name) => Ok(Choice::Localhost(
                field.clone(),
                profile_name(&field, name)?,
            )),
            None => Err(SpecError::invalid(
                field,
                format!(
                    "unknown AppArmor profile {} (want runtime/default, unconfined or localhost/<name>)",
                    quote(other)
                ),
            )),
        },
    }
}

fn profile_choice(field: &str, p: &SecurityProfile) -> Result<Choice, SpecError> {
    let t = ProfileType::try_from(p.profile_type).map_err(|_| {
        SpecError::invalid(
            format!("{field}.profile_type"),
            format!("unknown profile type {}", p.profile_type),
        )
    })?;
    if t != ProfileType::Localhost && !p.localhost_ref.is_empty() {
        return Err(SpecError::invalid(
            format!("{field}.localhost_ref"),
            format!(
                "is only valid with profile_type Localhost, not {}",
                t.as_str_name()
            ),
        ));
    }
    Ok(match t {
        ProfileType::RuntimeDefault => Choice::RuntimeDefault,
        ProfileType::Unconfined => Choice::Unconfined,
        ProfileType::Localhost => {
            let f = format!("{field}.localhost_ref");
            // kubelet sends the bare name; older clients the
            // `localhost/` form of the annotation (containerd trims it too).
            let raw = &p.localhost_ref;
            let name = profile_name(&f, raw.strip_prefix("localhost/").unwrap_or(raw))?;
            Choice::Localhost(f, name)
        }
    })
}

/// A profile name as the kernel's `exec <name>` and securityfs' list carry
/// it: not empty, no control characters (a newline would split the list's
/// lines), at most a page.
fn profile_name(field: &str, name: &str) -> Result<String, SpecError> {
    if name.is_empty() {
        return Err(SpecError::invalid(field, "AppArmor profile name is empty"));
    }
    if name.len() > MAX_PATH {
        return Err(SpecError::invalid(
            field,
            format!("AppArmor profile name is longer than {MAX_PATH} bytes"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(SpecError::invalid(
            field,
            format!(
                "AppArmor profile name {} contains control characters",
                quote(name)
            ),
        ));
    }
    Ok(name.to_string())
}

/// The container's `process.apparmorProfile` (None: unconfined, or no
/// AppArmor on the node).
pub(crate) fn container_apparmor(
    sc: Option<&LinuxContainerSecurityContext>,
    privileged: bool,
    runtime: &RuntimeFacts,
    host: &dyn Host,
) -> Result<Option<String>, SpecError> {
    let choice = choice(sc)?;
    let Some(default) = runtime.apparmor_default_profile.as_deref() else {
        return match choice {
            Choice::Localhost(field, _) => Err(SpecError::unsupported(
                field,
                "AppArmor (the host has no AppArmor)",
            )),
            _ => Ok(None),
        };
    };
    match choice {
        Choice::Unconfined => Ok(None),
        Choice::Unset | Choice::RuntimeDefault if privileged => Ok(None),
        Choice::Unset | Choice::RuntimeDefault => {
            let field = format!("{F}.apparmor");
            // The daemon's host (re)loads its default profile here when it
            // went missing, as containerd does at each create.
            match host.apparmor_profile_loaded(default) {
                Ok(true) => Ok(Some(default.to_string())),
                Ok(false) => Err(SpecError::precondition(
                    field,
                    format!(
                        "the default AppArmor profile {} is not loaded",
                        quote(default)
                    ),
                )),
                Err(e) => Err(SpecError::precondition(
                    field,
                    format!(
                        "the default AppArmor profile {} is not loaded and loading it failed: {}",
                        quote(default),
                        clip(&e.to_string())
                    ),
                )),
            }
        }
        Choice::Localhost(field, name) => match host.apparmor_profile_loaded(&name) {
            Ok(true) => Ok(Some(name)),
            Ok(false) => Err(SpecError::precondition(
                field,
                format!(
                    "AppArmor profile {} is not loaded on this node (load it with apparmor_parser first)",
                    quote(&name)
                ),
            )),
            Err(e) => Err(SpecError::precondition(
                field,
                format!(
                    "cannot tell whether AppArmor profile {} is loaded: {}",
                    quote(&name),
                    clip(&e.to_string())
                ),
            )),
        },
    }
}
