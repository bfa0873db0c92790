//! CDI (Container Device Interface) devices: the spec files device vendors
//! and DRA drivers write (`/etc/cdi`, `/var/run/cdi`), the fully qualified
//! device names a request asks for (`vendor.com/class=name`, from
//! `ContainerConfig.CDI_devices` or the older `cdi.k8s.io/*` annotations),
//! and the container edits they make to the OCI spec: device nodes (with
//! their cgroup rule), mounts, environment, hooks, additional GIDs.
//!
//! Parsing and applying are pure; the daemon reads the files (and this crate
//! asks [`Host::devices`] for a node's type and numbers when the spec leaves
//! them out, as the CDI spec says).
//!
//! Not supported (InvalidArgument naming the device): `intelRdt`,
//! `netDevices`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Hook, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, Mount, Spec};
use serde::Deserialize;

use crate::error::SpecError;
use crate::input::Host;

/// The annotation prefix of CDI devices in the pre-`CDI_devices` form.
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// The largest CDI spec file read.
pub const MAX_SPEC_FILE_BYTES: u64 = 1 << 20;

/// One CDI spec file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecFile {
    #[allow(dead_code)]
    cdi_version: String,
    /// `vendor.com/class`.
    kind: String,
    devices: Vec<DeviceEntry>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceEntry {
    name: String,
    container_edits: ContainerEdits,
}

/// What a device (or every device of a spec file) does to a container.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub mounts: Vec<CdiMount>,
    #[serde(default)]
    pub hooks: Vec<CdiHook>,
    #[serde(default, rename = "additionalGIDs")]
    pub additional_gids: Vec<u32>,
    #[serde(default)]
    pub intel_rdt: Option<serde_json::Value>,
    #[serde(default)]
    pub net_devices: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Where the node appears in the container.
    pub path: String,
    /// The node on the host (default: `path`).
    pub host_path: Option<String>,
    /// `c`, `b` or `p`; with `major`/`minor` taken from the host when absent.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub file_mode: Option<u32>,
    /// cgroup access, e.g. `rw` (default `rwm`).
    pub permissions: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiMount {
    pub host_path: String,
    pub container_path: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiHook {
    /// prestart, createRuntime, createContainer, startContainer,
    /// poststart or poststop.
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub timeout: Option<i64>,
}

/// Every device the spec files define, by fully qualified name.
#[derive(Debug, Default)]
pub struct CdiRegistry {
    /// name -> (index of its spec file, its own edits).
    devices: BTreeMap<String, (usize, ContainerEdits)>,
    /// The spec-wide edits of each file, and its path.
    files: Vec<(PathBuf, ContainerEdits)>,
    /// Files that could not be used, with why (reported in an unknown
    /// device's error: the device may be in one of them).
    pub errors: Vec<String>,
}

impl CdiRegistry {
    /// The registry of `files` (path, contents), in priority order: a
    /// device defined again by a later file replaces the earlier one (as
    /// `/var/run/cdi` overrides `/etc/cdi`). `.json` files are JSON, every
    /// other file YAML; a file that does not parse is recorded in
    /// [`CdiRegistry::errors`] and skipped.
    pub fn from_files(files: Vec<(PathBuf, String)>) -> CdiRegistry {
        let mut reg = CdiRegistry::default();
        for (path, text) in files {
            let parsed: Result<SpecFile, String> = if path.extension().is_some_and(|e| e == "json")
            {
                serde_json::from_str(&text).map_err(|e| e.to_string())
            } else {
                serde_norway::from_str(&text).map_err(|e| e.to_string())
            };
            let file = match parsed.and_then(|f| check_kind(&f.kind).map(|()| f)) {
                Ok(f) => f,
                Err(e) => {
                    reg.errors.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            let index = reg.files.len();
            for d in file.devices {
                reg.devices.insert(
                    format!("{}={}", file.kind, d.name),
                    (index, d.container_edits),
                );
            }
            reg.files.push((path, file.container_edits));
        }
        reg
    }

    /// The edits of the named devices (each spec file's own edits once,
    /// before its devices'), in request order. `names` are (field, name);
    /// an unknown name is InvalidArgument naming the field and the device.
    pub fn resolve(&self, names: &[(String, String)]) -> Result<Vec<ContainerEdits>, SpecError> {
        let mut out = Vec::new();
        let mut files_used = Vec::new();
        for (field, name) in names {
            let Some((file, edits)) = self.devices.get(name) else {
                let mut why = format!(
                    "unknown CDI device {} (no CDI spec file defines it)",
                    crust_quote::quote_os(name)
                );
                if !self.errors.is_empty() {
                    why.push_str(&format!(
                        "; unusable spec files: {}",
                        crust_quote::clip(&self.errors.join("; "))
                    ));
                }
                return Err(SpecError::invalid(field.clone(), why));
            };
            if !files_used.contains(file) {
                files_used.push(*file);
                out.push(self.files[*file].1.clone());
            }
            out.push(edits.clone());
        }
        Ok(out)
    }
}

/// `vendor.com/class`: a vendor with a dot-free-or-dotted domain and a
/// class, both of `[A-Za-z0-9_.-]`.
fn check_kind(kind: &str) -> Result<(), String> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    };
    match kind.split_once('/') {
        Some((vendor, class)) if ok(vendor) && ok(class) => Ok(()),
        _ => Err(format!("kind {kind:?} is not vendor/class")),
    }
}

/// The device names a request asks for: `config.CDI_devices[i].name`, then
/// the values of `cdi.k8s.io/*` annotations (comma-separated names), each
/// with the field it came from; duplicates once.
pub fn requested_devices(config: &crust_api::v1::ContainerConfig) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |field: String, name: &str| {
        let name = name.trim();
        if !name.is_empty() && !out.iter().any(|(_, n)| n == name) {
            out.push((field, name.to_string()));
        }
    };
    for (i, d) in config.cdi_devices.iter().enumerate() {
        push(format!("config.CDI_devices[{i}].name"), &d.name);
    }
    let mut keys: Vec<&String> = config
        .annotations
        .keys()
        .filter(|k| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    for k in keys {
        for name in config.annotations[k].split(',') {
            push(
                format!("config.annotations[{}]", crust_quote::quote_os(k)),
                name,
            );
        }
    }
    out
}

/// Applies `edits` (from [`CdiRegistry::resolve`]) to `spec`; `field`
/// names the request field in errors.
pub fn apply(
    spec: &mut Spec,
    edits: &[ContainerEdits],
    field: &str,
    host: &dyn Host,
) -> Result<(), SpecError> {
    for e in edits {
        if e.intel_rdt.is_some() {
            return Err(SpecError::unsupported(field, "CDI intelRdt edits"));
        }
        if !e.net_devices.is_empty() {
            return Err(SpecError::unsupported(field, "CDI netDevices edits"));
        }
        apply_env(spec, &e.env, field)?;
        for node in &e.device_nodes {
            apply_device(spec, node, field, host)?;
        }
        for m in &e.mounts {
            apply_mount(spec, m, field)?;
        }
        for h in &e.hooks {
            apply_hook(spec, h, field)?;
        }
        if !e.additional_gids.is_empty() {
            let mut process = spec.process().clone().unwrap_or_default();
            let mut user = process.user().clone();
            let mut gids = user.additional_gids().clone().unwrap_or_default();
            for g in &e.additional_gids {
                if *g != 0 && !gids.contains(g) {
                    gids.push(*g);
                }
            }
            user.set_additional_gids(Some(gids));
            process.set_user(user);
            spec.set_process(Some(process));
        }
    }
    Ok(())
}

fn apply_env(spec: &mut Spec, env: &[String], field: &str) -> Result<(), SpecError> {
    if env.is_empty() {
        return Ok(());
    }
    let mut process = spec.process().clone().unwrap_or_default();
    let mut all = process.env().clone().unwrap_or_default();
    for kv in env {
        let Some((key, _)) = kv.split_once('=') else {
            return Err(SpecError::invalid(
                field,
                format!(
                    "CDI env entry {} is not KEY=VALUE",
                    crust_quote::quote_os(kv)
                ),
            ));
        };
        let prefix = format!("{key}=");
        all.retain(|e| !e.starts_with(&prefix));
        all.push(kv.clone());
    }
    process.set_env(Some(all));
    spec.set_process(Some(process));
    Ok(())
}

fn abs(field: &str, what: &str, p: &str) -> Result<(), SpecError> {
    if p.starts_with('/') && !p.contains('\0') {
        Ok(())
    } else {
        Err(SpecError::invalid(
            field,
            format!(
                "CDI {what} {} is not an absolute path",
                crust_quote::quote_os(p)
            ),
        ))
    }
}

fn apply_device(
    spec: &mut Spec,
    node: &DeviceNode,
    field: &str,
    host: &dyn Host,
) -> Result<(), SpecError> {
    abs(field, "deviceNodes path", &node.path)?;
    let host_path = node.host_path.clone().unwrap_or_else(|| node.path.clone());
    abs(field, "deviceNodes hostPath", &host_path)?;
    let kind = match node.kind.as_deref() {
        Some("c") | Some("u") => Some(LinuxDeviceType::C),
        Some("b") => Some(LinuxDeviceType::B),
        Some("p") => Some(LinuxDeviceType::P),
        None | Some("") => None,
        Some(other) => {
            return Err(SpecError::invalid(
                field,
                format!(
                    "CDI device node type {} (c, b or p)",
                    crust_quote::quote_os(other)
                ),
            ));
        }
    };
    // Type and numbers the spec leaves out are the host node's.
    let (kind, major, minor, file_mode, uid, gid) =
        if let (Some(k), Some(ma), Some(mi)) = (kind, node.major, node.minor) {
            (k, ma, mi, node.file_mode, node.uid, node.gid)
        } else {
            let found = host
                .devices(Path::new(&host_path))
                .map_err(|e| SpecError::Host {
                    field: field.into(),
                    path: host_path.clone().into(),
                    message: e.to_string(),
                })?;
            let Some(d) = found
                .into_iter()
                .find(|d| d.relative.as_os_str().is_empty())
            else {
                return Err(SpecError::invalid(
                    field,
                    format!(
                        "CDI device node {} is not a device on the host",
                        crust_quote::quote_os(&host_path)
                    ),
                ));
            };
            (
                kind.unwrap_or(d.kind),
                node.major.unwrap_or(d.major),
                node.minor.unwrap_or(d.minor),
                node.file_mode.or(Some(d.file_mode)),
                node.uid.or(Some(d.uid)),
                node.gid.or(Some(d.gid)),
            )
        };
    let mut dev = LinuxDevice::default();
    dev.set_path(PathBuf::from(&node.path));
    dev.set_typ(kind);
    dev.set_major(major);
    dev.set_minor(minor);
    dev.set_file_mode(file_mode);
    dev.set_uid(uid);
    dev.set_gid(gid);
    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut devices = linux.devices().clone().unwrap_or_default();
    devices.retain(|d| d.path() != Path::new(&node.path));
    devices.push(dev);
    linux.set_devices(Some(devices));
    if kind != LinuxDeviceType::P {
        let access = node.permissions.clone().unwrap_or_else(|| "rwm".into());
        if access.is_empty() || !access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(SpecError::invalid(
                field,
                format!(
                    "CDI device permissions {} (r, w, m)",
                    crust_quote::quote_os(&access)
                ),
            ));
        }
        let mut rule = LinuxDeviceCgroup::default();
        rule.set_allow(true);
        rule.set_typ(Some(kind));
        rule.set_major(Some(major));
        rule.set_minor(Some(minor));
        rule.set_access(Some(access));
        let mut res = linux.resources().clone().unwrap_or_default();
        let mut rules = res.devices().clone().unwrap_or_default();
        rules.push(rule);
        res.set_devices(Some(rules));
        linux.set_resources(Some(res));
    }
    spec.set_linux(Some(linux));
    Ok(())
}

fn apply_mount(spec: &mut Spec, m: &CdiMount, field: &str) -> Result<(), SpecError> {
    abs(field, "mount hostPath", &m.host_path)?;
    abs(field, "mount containerPath", &m.container_path)?;
    let mut mount = Mount::default();
    mount.set_destination(PathBuf::from(&m.container_path));
    mount.set_source(Some(PathBuf::from(&m.host_path)));
    let mut options = m.options.clone();
    let kind = match m.kind.as_deref() {
        Some(k) if !k.is_empty() => k.to_string(),
        _ => {
            if !options.iter().any(|o| o == "bind" || o == "rbind") {
                options.push("rbind".into());
            }
            "bind".into()
        }
    };
    mount.set_typ(Some(kind));
    mount.set_options(Some(options));
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.retain(|x| x.destination() != Path::new(&m.container_path));
    mounts.push(mount);
    spec.set_mounts(Some(mounts));
    Ok(())
}

fn apply_hook(spec: &mut Spec, h: &CdiHook, field: &str) -> Result<(), SpecError> {
    abs(field, "hook path", &h.path)?;
    let mut hook = Hook::default();
    hook.set_path(PathBuf::from(&h.path));
    hook.set_args((!h.args.is_empty()).then(|| h.args.clone()));
    hook.set_env((!h.env.is_empty()).then(|| h.env.clone()));
    hook.set_timeout(h.timeout);
    let mut hooks = spec.hooks().clone().unwrap_or_default();
    let list = match h.hook_name.as_str() {
        "prestart" => {
            #[allow(deprecated)]
            let l = hooks.prestart().clone();
            l
        }
        "createRuntime" => hooks.create_runtime().clone(),
        "createContainer" => hooks.create_container().clone(),
        "startContainer" => hooks.start_container().clone(),
        "poststart" => hooks.poststart().clone(),
        "poststop" => hooks.poststop().clone(),
        other => {
            return Err(SpecError::invalid(
                field,
                format!("CDI hook name {}", crust_quote::quote_os(other)),
            ));
        }
    };
    let mut list = list.unwrap_or_default();
    list.push(hook);
    match h.hook_name.as_str() {
        "prestart" =>
        {
            #[allow(deprecated)]
            hooks.set_prestart(Some(list))
        }
        "createRuntime" => hooks.set_create_runtime(Some(list)),
        "createContainer" => hooks.set_create_container(Some(list)),
        "startContainer" => hooks.set_start_container(Some(list)),
        "poststart" => hooks.set_poststart(Some(list)),
        _ => hooks.set_poststop(Some(list)),
    };
    spec.set_hooks(Some(hooks));
    Ok(())
}
