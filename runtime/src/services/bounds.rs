//! Bounds on every size a client controls, checked where a request enters,
//! before anything is looked up or touched. The limits are Kubernetes'
//! own where it has one (label values 63 bytes, annotations 256 KiB in
//! all, 3 DNS servers, 32 search domains of at most 2048 bytes together),
//! the kernel's where a value ends up in a syscall (PATH_MAX,
//! HOST_NAME_MAX, MAX_ARG_STRLEN, ARG_MAX, NGROUPS_MAX, NAME_MAX), and the
//! image reference grammar's for images. The domain layers check meaning
//! (paths absolute, sysctls namespaced, ...); this module only sizes and
//! shapes, so those checks and their error messages work on bounded input.
//!
//! Every refusal is InvalidArgument naming the field and the limit, and
//! quotes at most [`crust_quote::MAX_QUOTED`] bytes of what was sent.

use std::collections::HashMap;

use crust_api::v1::*;
use tonic::Status;

use crust_quote::quote;

/// Pod, container and exec IDs are 64 hex characters (a unique prefix
/// names one too); nothing longer can name one.
pub const MAX_ID: usize = 64;
/// Kubernetes object names (pod names): DNS-1123 subdomains.
pub const MAX_POD_NAME: usize = 253;
/// Kubernetes namespaces: DNS-1123 labels.
pub const MAX_NAMESPACE: usize = 63;
/// Pod UIDs (UUIDs from the API server; mirror pods' hashes).
pub const MAX_UID: usize = 253;
/// Container names. Kubernetes' own are DNS labels (63), but crictl and
/// critest send longer ones (critest: a 49-byte prefix and a UUID).
pub const MAX_CONTAINER_NAME: usize = 253;
/// HOST_NAME_MAX.
pub const MAX_HOSTNAME: usize = 64;
/// PATH_MAX.
pub const MAX_PATH: usize = 4096;
/// NAME_MAX: one path component (a cgroup file name).
pub const MAX_NAME: usize = 255;
/// Kubernetes: label values.
pub const MAX_LABEL_VALUE: usize = 63;
/// The values of kubelet's own `io.kubernetes.*` labels are object names
/// (the pod's name, up to 253 bytes), not user label values.
pub const MAX_KUBELET_LABEL_VALUE: usize = 253;
/// Kubernetes: the name part of a qualified name (label and annotation
/// keys).
pub const MAX_KEY_NAME: usize = 63;
/// Kubernetes: the prefix of a qualified name, a DNS-1123 subdomain.
pub const MAX_KEY_PREFIX: usize = 253;
/// Kubernetes: all annotations of an object together (keys and values).
pub const MAX_ANNOTATIONS_TOTAL: usize = 256 << 10;
/// Labels of one object together; Kubernetes bounds them only through the
/// object's size, this keeps a record small.
pub const MAX_LABELS_TOTAL: usize = 64 << 10;
/// MAX_ARG_STRLEN less the NUL: one argument or `KEY=value` execve takes.
pub const MAX_ARG: usize = (128 << 10) - 1;
/// ARG_MAX at the default 8 MiB stack: arguments and environment together
/// (each string counted with its NUL and its pointer, as the kernel does).
pub const MAX_ARGV_ENV_TOTAL: usize = 2 << 20;
/// Entries of a command (command and args together) and of an exec.
pub const MAX_ARGS: usize = 16 << 10;
/// Environment entries (a namespace with a thousand services gives its
/// pods seven thousand service-link variables).
pub const MAX_ENVS: usize = 16 << 10;
pub const MAX_MOUNTS: usize = 1024;
/// A mount's `mount_options` (KEP-5855 allows three, each a few bytes;
/// repeats are harmless, so some room).
pub const MAX_MOUNT_OPTIONS: usize = 32;
pub const MAX_MOUNT_OPTION: usize = 64;
pub const MAX_DEVICES: usize = 1024;
/// uid_map / gid_map take at most 340 lines.
pub const MAX_ID_MAPPINGS: usize = 340;
/// Kubernetes: nameservers (resolvers read no more than 3).
pub const MAX_DNS_SERVERS: usize = 3;
/// Kubernetes: search domains, and their characters together.
pub const MAX_DNS_SEARCHES: usize = 32;
pub const MAX_DNS_SEARCH_CHARS: usize = 2048;
pub const MAX_DNS_OPTIONS: usize = 32;
/// One DNS name (a search domain), or one resolv.conf option.
pub const MAX_DNS_ENTRY: usize = 253;
pub const MAX_PORT_MAPPINGS: usize = 1024;
/// The longest textual IP address (INET6_ADDRSTRLEN less the NUL).
pub const MAX_IP: usize = 45;
pub const MAX_SYSCTLS: usize = 128;
/// A sysctl name; its value is written in one page.
pub const MAX_SYSCTL_NAME: usize = 256;
pub const MAX_SYSCTL_VALUE: usize = 4096;
/// An image reference: a name of at most 255 bytes, a tag of at most 128
/// and a digest (sha512: 135) fit in far less.
pub const MAX_IMAGE_REF: usize = 1024;
/// One credential of PullImage's auth (bearer tokens are a few KiB).
pub const MAX_AUTH_FIELD: usize = 64 << 10;
/// Runtime handler names (config keys).
pub const MAX_HANDLER: usize = 253;
/// Capability names in each list (the kernel has 41).
pub const MAX_CAPABILITIES: usize = 128;
pub const MAX_CAPABILITY_NAME: usize = 64;
/// NGROUPS_MAX.
pub const MAX_GROUPS: usize = 65536;
/// LOGIN_NAME_MAX.
pub const MAX_USERNAME: usize = 256;
/// Masked and read-only paths.
pub const MAX_PATH_LIST: usize = 1024;
/// A cgroup v2 `unified` map: a cgroup has well under a hundred files;
/// a value is written in one page.
pub const MAX_UNIFIED: usize = 128;
pub const MAX_UNIFIED_VALUE: usize = 4096;
pub const MAX_HUGEPAGE_LIMITS: usize = 16;
/// A huge page size (`2MB`, `1GB`) or a cpuset list.
pub const MAX_PAGE_SIZE: usize = 16;
pub const MAX_CPUSET: usize = 4096;
pub const MAX_CDI_DEVICES: usize = 1024;
/// A CDI device name: `vendor/class=name`.
pub const MAX_CDI_NAME: usize = 4096;
/// PortForward: ports of one request.
pub const MAX_FORWARD_PORTS: usize = 1024;
/// An SELinux label part, an AppArmor or seccomp profile reference.
pub const MAX_PROFILE: usize = 4096;
/// List filters' label selectors.
pub const MAX_SELECTOR_TOTAL: usize = 256 << 10;

fn invalid(field: &str, why: String) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

/// A string of at most `max` bytes.
pub fn text(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(invalid(
            field,
            format!(
                "{} bytes, over the limit of {max} ({}...)",
                value.len(),
                quote(&value[..floor_char_boundary(value, 32)])
            ),
        ));
    }
    Ok(())
}

/// At most `max` entries.
pub fn count(field: &str, n: usize, max: usize) -> Result<(), Status> {
    if n > max {
        return Err(invalid(
            field,
            format!("{n} entries, over the limit of {max}"),
        ));
    }
    Ok(())
}

/// At most `max_count` strings of at most `max_each` bytes each.
pub fn strings(
    field: &str,
    list: &[String],
    max_count: usize,
    max_each: usize,
) -> Result<(), Status> {
    count(field, list.len(), max_count)?;
    for (i, s) in list.iter().enumerate() {
        text(&format!("{field}[{i}]"), s, max_each)?;
    }
    Ok(())
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A qualified name as Kubernetes checks label and annotation keys:
/// `[prefix/]name`, the name 1-63 bytes of `[A-Za-z0-9._-]` starting and
/// ending alphanumeric, the prefix a DNS-1123 subdomain (lowercase;
/// annotation keys are checked lowercased, as Kubernetes does).
fn qualified_name(field: &str, key: &str, lowercase_prefix: bool) -> Result<(), Status> {
    let bad = |why: String| Err(invalid(field, format!("key {}: {why}", quote(key))));
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return bad("the name part is empty".into());
    }
    if name.len() > MAX_KEY_NAME {
        return bad(format!(
            "the name part is {} bytes, over the limit of {MAX_KEY_NAME}",
            name.len()
        ));
    }
    if !label_shaped(name) {
        return bad(
            "the name part must be [A-Za-z0-9._-] starting and ending with a letter or digit"
                .into(),
        );
    }
    if let Some(prefix) = prefix {
        if prefix.len() > MAX_KEY_PREFIX {
            return bad(format!(
                "the prefix is {} bytes, over the limit of {MAX_KEY_PREFIX}",
                prefix.len()
            ));
        }
        let prefix = if lowercase_prefix {
            prefix.to_string()
        } else {
            prefix.to_ascii_lowercase()
        };
        if !dns_subdomain(&prefix) {
            return bad("the prefix must be a DNS subdomain (lowercase a-z, 0-9, '-', '.')".into());
        }
    }
    Ok(())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: Kubernetes' label value and
/// qualified-name shape.
fn label_shaped(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// DNS-1123 subdomain: dot-separated labels of `[a-z0-9-]`, each starting
/// and ending alphanumeric.
fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_KEY_PREFIX
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Labels as Kubernetes validates them: qualified-name keys, values of at
/// most 63 bytes of the label shape (or empty).
pub fn labels(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    for (k, v) in map {
        qualified_name(field, k, true)?;
        let max = if k.starts_with("io.kubernetes.") {
            MAX_KUBELET_LABEL_VALUE
        } else {
            MAX_LABEL_VALUE
        };
        if v.len() > max {
            return Err(invalid(
                field,
                format!(
                    "the value of {} is {} bytes, over the limit of {max}",
                    quote(k),
                    v.len()
                ),
            ));
        }
        if !v.is_empty() && !label_shaped(v) {
            return Err(invalid(
                field,
                format!(
                    "the value of {} ({}) must be [A-Za-z0-9._-] starting and ending with a \
                     letter or digit",
                    quote(k),
                    quote(v)
                ),
            ));
        }
    }
    let total: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_LABELS_TOTAL {
        return Err(invalid(
            field,
            format!("{total} bytes in all, over the limit of {MAX_LABELS_TOTAL}"),
        ));
    }
    Ok(())
}

/// Annotations as Kubernetes validates them: qualified-name keys (checked
/// lowercased), 256 KiB for keys and values together.
pub fn annotations(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    let total: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ANNOTATIONS_TOTAL {
        return Err(invalid(
            field,
            format!("{total} bytes in all, over the limit of {MAX_ANNOTATIONS_TOTAL}"),
        ));
    }
    for k in map.keys() {
        qualified_name(field, k, false)?;
    }
    Ok(())
}

/// A command line and environment that execve(2) would take: each string
/// at most MAX_ARG_STRLEN, all of them at most ARG_MAX.
fn argv_env(args: &[(&str, &[String])], envs: Option<(&str, &[KeyValue])>) -> Result<(), Status> {
    let mut total = 0usize;
    let mut fields = Vec::new();
    for (field, list) in args {
        for (i, s) in list.iter().enumerate() {
            text(&format!("{field}[{i}]"), s, MAX_ARG)?;
            total += s.len() + 1 + 8;
        }
        fields.push(*field);
    }
    let n: usize = args.iter().map(|(_, l)| l.len()).sum();
    count(&fields.join(" + "), n, MAX_ARGS)?;
    if let Some((field, envs)) = envs {
        count(field, envs.len(), MAX_ENVS)?;
        for (i, kv) in envs.iter().enumerate() {
            // As execve sees it: `KEY=value`.
            let len = kv.key.len() + 1 + kv.value.len();
            if len > MAX_ARG {
                return Err(invalid(
                    &format!("{field}[{i}]"),
                    format!(
                        "{} (key {}) is {len} bytes as KEY=value, over the limit of {MAX_ARG}",
                        "the variable",
                        quote(&kv.key)
                    ),
                ));
            }
            total += len + 1 + 8;
        }
        fields.push(field);
    }
    if total > MAX_ARGV_ENV_TOTAL {
        return Err(invalid(
            &fields.join(" + "),
            format!(
                "{total} bytes in all (with NULs and pointers), over the limit of \
                 {MAX_ARGV_ENV_TOTAL}"
            ),
        ));
    }
    Ok(())
}

/// IDs of pods, containers (full or a unique prefix).
pub fn id(field: &str, value: &str) -> Result<(), Status> {
    text(field, value, MAX_ID)
}

/// An ImageSpec (PullImage, ImageStatus, RemoveImage, a container's image,
/// an image volume).
pub fn image_spec(field: &str, spec: &ImageSpec) -> Result<(), Status> {
    text(&format!("{field}.image"), &spec.image, MAX_IMAGE_REF)?;
    text(
        &format!("{field}.user_specified_image"),
        &spec.user_specified_image,
        MAX_IMAGE_REF,
    )?;
    text(
        &format!("{field}.image_ref"),
        &spec.image_ref,
        MAX_IMAGE_REF,
    )?;
    text(
        &format!("{field}.runtime_handler"),
        &spec.runtime_handler,
        MAX_HANDLER,
    )?;
    annotations(&format!("{field}.annotations"), &spec.annotations)
}

/// PullImage's credentials. Never quoted: counts only.
pub fn auth(field: &str, auth: &AuthConfig) -> Result<(), Status> {
    for (name, value) in [
        ("username", &auth.username),
        ("password", &auth.password),
        ("auth", &auth.auth),
        ("server_address", &auth.server_address),
        ("identity_token", &auth.identity_token),
        ("registry_token", &auth.registry_token),
    ] {
        if value.len() > MAX_AUTH_FIELD {
            return Err(invalid(
                &format!("{field}.{name}"),
                format!("{} bytes, over the limit of {MAX_AUTH_FIELD}", value.len()),
            ));
        }
    }
    Ok(())
}

fn security_profile(field: &str, p: &Option<SecurityProfile>) -> Result<(), Status> {
    match p {
        Some(p) => text(
            &format!("{field}.localhost_ref"),
            &p.localhost_ref,
            MAX_PROFILE,
        ),
        None => Ok(()),
    }
}

fn selinux(field: &str, s: &Option<SeLinuxOption>) -> Result<(), Status> {
    let Some(s) = s else { return Ok(()) };
    for (name, v) in [
        ("user", &s.user),
        ("role", &s.role),
        ("type", &s.r#type),
        ("level", &s.level),
    ] {
        text(&format!("{field}.{name}"), v, MAX_PROFILE)?;
    }
    Ok(())
}

fn id_mappings(field: &str, list: &[IdMapping]) -> Result<(), Status> {
    count(field, list.len(), MAX_ID_MAPPINGS)
}

fn namespace_options(field: &str, n: &Option<NamespaceOption>) -> Result<(), Status> {
    let Some(n) = n else { return Ok(()) };
    id(&format!("{field}.target_id"), &n.target_id)?;
    if let Some(u) = &n.userns_options {
        id_mappings(&format!("{field}.userns_options.uids"), &u.uids)?;
        id_mappings(&format!("{field}.userns_options.gids"), &u.gids)?;
    }
    Ok(())
}

/// LinuxContainerResources (CreateContainer, UpdateContainerResources,
/// a pod's overhead and resources). The `unified` keys' meaning is the
/// cgroup layer's to check; here their number and sizes.
pub fn resources(field: &str, r: &LinuxContainerResources) -> Result<(), Status> {
    text(&format!("{field}.cpuset_cpus"), &r.cpuset_cpus, MAX_CPUSET)?;
    text(&format!("{field}.cpuset_mems"), &r.cpuset_mems, MAX_CPUSET)?;
    count(
        &format!("{field}.hugepage_limits"),
        r.hugepage_limits.len(),
        MAX_HUGEPAGE_LIMITS,
    )?;
    for (i, h) in r.hugepage_limits.iter().enumerate() {
        text(
            &format!("{field}.hugepage_limits[{i}].page_size"),
            &h.page_size,
            MAX_PAGE_SIZE,
        )?;
    }
    let unified = format!("{field}.unified");
    count(&unified, r.unified.len(), MAX_UNIFIED)?;
    for (k, v) in &r.unified {
        if k.is_empty() || k.len() > MAX_NAME {
            return Err(invalid(
                &unified,
                format!(
                    "key {} is {} bytes; a cgroup file name is 1 to {MAX_NAME}",
                    quote(k),
                    k.len()
                ),
            ));
        }
        if v.len() > MAX_UNIFIED_VALUE {
            return Err(invalid(
                &unified,
                format!(
                    "the value of {} is {} bytes, over the limit of {MAX_UNIFIED_VALUE}",
                    quote(k),
                    v.len()
                ),
            ));
        }
    }
    Ok(())
}

/// RunPodSandbox.
// The deprecated profile fields are still sent by older kubelets.
#[allow(deprecated)]
pub fn run_pod_sandbox(req: &RunPodSandboxRequest) -> Result<(), Status> {
    text("runtime_handler", &req.runtime_handler, MAX_HANDLER)?;
    let Some(c) = &req.config else { return Ok(()) };
    if let Some(md) = &c.metadata {
        text("config.metadata.name", &md.name, MAX_POD_NAME)?;
        text("config.metadata.namespace", &md.namespace, MAX_NAMESPACE)?;
        text("config.metadata.uid", &md.uid, MAX_UID)?;
    }
    text("config.hostname", &c.hostname, MAX_HOSTNAME)?;
    text("config.log_directory", &c.log_directory, MAX_PATH)?;
    if let Some(dns) = &c.dns_config {
        strings(
            "config.dns_config.servers",
            &dns.servers,
            MAX_DNS_SERVERS,
            MAX_IP,
        )?;
        strings(
            "config.dns_config.searches",
            &dns.searches,
            MAX_DNS_SEARCHES,
            MAX_DNS_ENTRY,
        )?;
        // As Kubernetes counts them: the names and a separator each.
        let chars: usize = dns.searches.iter().map(|s| s.len()).sum::<usize>()
            + dns.searches.len().saturating_sub(1);
        if chars > MAX_DNS_SEARCH_CHARS {
            return Err(invalid(
                "config.dns_config.searches",
                format!("{chars} characters in all, over the limit of {MAX_DNS_SEARCH_CHARS}"),
            ));
        }
        strings(
            "config.dns_config.options",
            &dns.options,
            MAX_DNS_OPTIONS,
            MAX_DNS_ENTRY,
        )?;
    }
    count(
        "config.port_mappings",
        c.port_mappings.len(),
        MAX_PORT_MAPPINGS,
    )?;
    for (i, p) in c.port_mappings.iter().enumerate() {
        text(
            &format!("config.port_mappings[{i}].host_ip"),
            &p.host_ip,
            MAX_IP,
        )?;
    }
    labels("config.labels", &c.labels)?;
    annotations("config.annotations", &c.annotations)?;
    if let Some(l) = &c.linux {
        text("config.linux.cgroup_parent", &l.cgroup_parent, MAX_PATH)?;
        sysctls("config.linux.sysctls", &l.sysctls)?;
        if let Some(r) = &l.overhead {
            resources("config.linux.overhead", r)?;
        }
        if let Some(r) = &l.resources {
            resources("config.linux.resources", r)?;
        }
        if let Some(s) = &l.security_context {
            let f = "config.linux.security_context";
            namespace_options(&format!("{f}.namespace_options"), &s.namespace_options)?;
            selinux(&format!("{f}.selinux_options"), &s.selinux_options)?;
            count(
                &format!("{f}.supplemental_groups"),
                s.supplemental_groups.len(),
                MAX_GROUPS,
            )?;
            security_profile(&format!("{f}.seccomp"), &s.seccomp)?;
            security_profile(&format!("{f}.apparmor"), &s.apparmor)?;
            text(
                &format!("{f}.seccomp_profile_path"),
                &s.seccomp_profile_path,
                MAX_PROFILE,
            )?;
        }
    }
    Ok(())
}

fn sysctls(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    count(field, map.len(), MAX_SYSCTLS)?;
    for (k, v) in map {
        if k.len() > MAX_SYSCTL_NAME {
            return Err(invalid(
                field,
                format!(
                    "name {} is {} bytes, over the limit of {MAX_SYSCTL_NAME}",
                    quote(k),
                    k.len()
                ),
            ));
        }
        if v.len() > MAX_SYSCTL_VALUE {
            return Err(invalid(
                field,
                format!(
                    "the value of {} is {} bytes, over the limit of {MAX_SYSCTL_VALUE}",
                    quote(k),
                    v.len()
                ),
            ));
        }
    }
    Ok(())
}

/// CreateContainer (its `sandbox_config` is not used: the pod's stored
/// config is).
#[allow(deprecated)]
pub fn create_container(req: &CreateContainerRequest) -> Result<(), Status> {
    id("pod_sandbox_id", &req.pod_sandbox_id)?;
    let Some(c) = &req.config else { return Ok(()) };
    if let Some(md) = &c.metadata {
        text("config.metadata.name", &md.name, MAX_CONTAINER_NAME)?;
    }
    if let Some(image) = &c.image {
        image_spec("config.image", image)?;
    }
    argv_env(
        &[("config.command", &c.command), ("config.args", &c.args)],
        Some(("config.envs", &c.envs)),
    )?;
    text("config.working_dir", &c.working_dir, MAX_PATH)?;
    count("config.mounts", c.mounts.len(), MAX_MOUNTS)?;
    for (i, m) in c.mounts.iter().enumerate() {
        let f = format!("config.mounts[{i}]");
        text(&format!("{f}.container_path"), &m.container_path, MAX_PATH)?;
        text(&format!("{f}.host_path"), &m.host_path, MAX_PATH)?;
        text(&format!("{f}.image_sub_path"), &m.image_sub_path, MAX_PATH)?;
        strings(
            &format!("{f}.mount_options"),
            &m.mount_options,
            MAX_MOUNT_OPTIONS,
            MAX_MOUNT_OPTION,
        )?;
        id_mappings(&format!("{f}.uidMappings"), &m.uid_mappings)?;
        id_mappings(&format!("{f}.gidMappings"), &m.gid_mappings)?;
        if let Some(image) = &m.image {
            image_spec(&format!("{f}.image"), image)?;
        }
    }
    count("config.devices", c.devices.len(), MAX_DEVICES)?;
    for (i, d) in c.devices.iter().enumerate() {
        let f = format!("config.devices[{i}]");
        text(&format!("{f}.container_path"), &d.container_path, MAX_PATH)?;
        text(&format!("{f}.host_path"), &d.host_path, MAX_PATH)?;
        // Some of r, w and m.
        text(&format!("{f}.permissions"), &d.permissions, 3)?;
    }
    count("config.CDI_devices", c.cdi_devices.len(), MAX_CDI_DEVICES)?;
    for (i, d) in c.cdi_devices.iter().enumerate() {
        text(
            &format!("config.CDI_devices[{i}].name"),
            &d.name,
            MAX_CDI_NAME,
        )?;
    }
    labels("config.labels", &c.labels)?;
    annotations("config.annotations", &c.annotations)?;
    text("config.log_path", &c.log_path, MAX_PATH)?;
    if let Some(l) = &c.linux {
        if let Some(r) = &l.resources {
            resources("config.linux.resources", r)?;
        }
        if let Some(s) = &l.security_context {
            let f = "config.linux.security_context";
            if let Some(caps) = &s.capabilities {
                for (name, list) in [
                    ("add_capabilities", &caps.add_capabilities),
                    ("drop_capabilities", &caps.drop_capabilities),
                    ("add_ambient_capabilities", &caps.add_ambient_capabilities),
                ] {
                    strings(
                        &format!("{f}.capabilities.{name}"),
                        list,
                        MAX_CAPABILITIES,
                        MAX_CAPABILITY_NAME,
                    )?;
                }
            }
            namespace_options(&format!("{f}.namespace_options"), &s.namespace_options)?;
            selinux(&format!("{f}.selinux_options"), &s.selinux_options)?;
            text(
                &format!("{f}.run_as_username"),
                &s.run_as_username,
                MAX_USERNAME,
            )?;
            count(
                &format!("{f}.supplemental_groups"),
                s.supplemental_groups.len(),
                MAX_GROUPS,
            )?;
            strings(
                &format!("{f}.masked_paths"),
                &s.masked_paths,
                MAX_PATH_LIST,
                MAX_PATH,
            )?;
            strings(
                &format!("{f}.readonly_paths"),
                &s.readonly_paths,
                MAX_PATH_LIST,
                MAX_PATH,
            )?;
            security_profile(&format!("{f}.seccomp"), &s.seccomp)?;
            security_profile(&format!("{f}.apparmor"), &s.apparmor)?;
            text(
                &format!("{f}.apparmor_profile"),
                &s.apparmor_profile,
                MAX_PROFILE,
            )?;
            text(
                &format!("{f}.seccomp_profile_path"),
                &s.seccomp_profile_path,
                MAX_PROFILE,
            )?;
        }
    }
    Ok(())
}

/// ExecSync's and Exec's command.
pub fn exec_cmd(field: &str, cmd: &[String]) -> Result<(), Status> {
    argv_env(&[(field, cmd)], None)
}

/// ListPodSandbox's and ListContainers' label selectors (compared, never
/// stored: only their size).
pub fn selector(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    let total: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_SELECTOR_TOTAL {
        return Err(invalid(
            field,
            format!("{total} bytes in all, over the limit of {MAX_SELECTOR_TOTAL}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_and_len(r: Result<(), Status>) -> (String, usize) {
        let s = r.unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        let m = s.message().to_string();
        (m.split(':').next().unwrap().to_string(), m.len())
    }

    #[test]
    fn long_text_names_field_and_limit_and_quotes_little() {
        let (f, len) = field_and_len(text("config.x", &"y".repeat(1 << 20), 63));
        assert_eq!(f, "config.x");
        assert!(len < 200, "{len}");
        let m = text("f", &"é".repeat(100), 63).unwrap_err();
        assert!(m.message().contains("over the limit of 63"), "{m:?}");
        assert!(text("f", &"x".repeat(63), 63).is_ok());
    }

    #[test]
    fn labels_are_checked_as_kubernetes_does() {
        let map = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
        for (k, v) in [
            ("app", "web"),
            ("app.kubernetes.io/name", "Web_1.x-y"),
            ("foo", ""),
            ("io.kubernetes.pod.name", &"p".repeat(253)),
            ("x", &"v".repeat(63)),
        ] {
            labels("l", &map(k, v)).unwrap_or_else(|e| panic!("{k}={v}: {e:?}"));
        }
        for (k, v) in [
            ("app", &"v".repeat(64) as &str),
            ("app", &"v".repeat(1 << 20)),
            ("", "x"),
            ("-a", "x"),
            ("a/b/c", "x"),
            ("Upper.Case/name", "x"),
            (&"k".repeat(64), "x"),
            ("app", "a b"),
            ("app", "-x"),
            ("io.kubernetes.pod.name", &"p".repeat(254)),
        ] {
            let (f, len) = field_and_len(labels("config.labels", &map(k, v)));
            assert_eq!(f, "config.labels", "{k}");
            assert!(len < 700, "{len}");
        }
    }

    #[test]
    fn annotations_total_and_keys() {
        let mut m = HashMap::new();
        m.insert("Kubernetes.io/Config.Seen".to_string(), "x".repeat(1000));
        annotations("a", &m).unwrap();
        m.insert("big".to_string(), "x".repeat(MAX_ANNOTATIONS_TOTAL));
        let (f, _) = field_and_len(annotations("config.annotations", &m));
        assert_eq!(f, "config.annotations");
        let bad = HashMap::from([("a b".to_string(), String::new())]);
        assert!(annotations("a", &bad).is_err());
    }

    #[test]
    fn argv_and_env_follow_execve() {
        let ok = vec!["sh".to_string(), "-c".into(), "x".repeat(MAX_ARG)];
        exec_cmd("cmd", &ok).unwrap();
        let (f, _) = field_and_len(exec_cmd("cmd", &["x".repeat(MAX_ARG + 1)]));
        assert_eq!(f, "cmd[0]");
        let many = vec!["a".to_string(); MAX_ARGS + 1];
        assert_eq!(field_and_len(exec_cmd("cmd", &many)).0, "cmd");
        let big = vec!["x".repeat(100_000); 30];
        assert_eq!(field_and_len(exec_cmd("cmd", &big)).0, "cmd");
    }

    #[test]
    fn unified_maps_are_bounded() {
        let mut r = LinuxContainerResources::default();
        r.unified.insert("memory.high".into(), "1000".into());
        resources("r", &r).unwrap();
        r.unified.insert("k".repeat(256), "1".into());
        assert_eq!(field_and_len(resources("r", &r)).0, "r.unified");
        let mut r = LinuxContainerResources::default();
        r.unified.insert("memory.high".into(), "1".repeat(4097));
        assert_eq!(field_and_len(resources("r", &r)).0, "r.unified");
        let mut r = LinuxContainerResources::default();
        for i in 0..=MAX_UNIFIED {
            r.unified.insert(format!("f{i}"), String::new());
        }
        assert_eq!(field_and_len(resources("r", &r)).0, "r.unified");
    }

    /// Property test: CRI requests with every bounded field made hostile
    /// (path tricks, control characters, arbitrary Unicode, values of up
    /// to 8 KiB, maps and lists of up to 16 entries) never panic the
    /// validators, and every refusal is InvalidArgument in a short message
    /// (at most 1024 bytes, whatever was sent).
    mod prop {
        use super::*;
        use crust_quote::testing::{check_message, config, hostile_string};
        use proptest::collection::{hash_map, vec};
        use proptest::prelude::*;

        fn refusal(what: &str, r: Result<(), Status>) -> Result<(), TestCaseError> {
            if let Err(s) = r {
                prop_assert_eq!(s.code(), tonic::Code::InvalidArgument, "{}: {:?}", what, s);
                check_message(what, s.message())?;
            }
            Ok(())
        }

        fn map() -> BoxedStrategy<HashMap<String, String>> {
            hash_map(hostile_string(), hostile_string(), 0..16).boxed()
        }

        fn list() -> BoxedStrategy<Vec<String>> {
            vec(hostile_string(), 0..16).boxed()
        }

        fn pod_request() -> impl Strategy<Value = RunPodSandboxRequest> {
            (
                (hostile_string(), hostile_string(), hostile_string()),
                (hostile_string(), hostile_string(), hostile_string()),
                (map(), map(), map()),
                (list(), list(), list()),
                vec((hostile_string(), any::<i32>()), 0..8),
            )
                .prop_map(
                    |(
                        (name, ns, uid),
                        (host, logs, parent),
                        (labels, ann, sysctls),
                        (dns, search, opts),
                        ports,
                    )| {
                        RunPodSandboxRequest {
                            runtime_handler: parent.clone(),
                            config: Some(PodSandboxConfig {
                                metadata: Some(PodSandboxMetadata {
                                    name,
                                    namespace: ns,
                                    uid,
                                    attempt: 0,
                                }),
                                hostname: host,
                                log_directory: logs,
                                dns_config: Some(DnsConfig {
                                    servers: dns,
                                    searches: search,
                                    options: opts,
                                }),
                                port_mappings: ports
                                    .into_iter()
                                    .map(|(ip, port)| PortMapping {
                                        host_ip: ip,
                                        host_port: port,
                                        ..Default::default()
                                    })
                                    .collect(),
                                labels,
                                annotations: ann,
                                linux: Some(LinuxPodSandboxConfig {
                                    cgroup_parent: parent,
                                    sysctls,
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                        }
                    },
                )
        }

        fn container_request() -> impl Strategy<Value = CreateContainerRequest> {
            (
                (
                    hostile_string(),
                    hostile_string(),
                    hostile_string(),
                    hostile_string(),
                ),
                (list(), list(), list()),
                (map(), map(), map()),
                vec((hostile_string(), hostile_string()), 0..8),
            )
                .prop_map(
                    |(
                        (id, name, image, log),
                        (command, args, envs),
                        (labels, ann, unified),
                        paths,
                    )| {
                        CreateContainerRequest {
                            pod_sandbox_id: id,
                            config: Some(ContainerConfig {
                                metadata: Some(ContainerMetadata { name, attempt: 0 }),
                                image: Some(ImageSpec {
                                    image,
                                    ..Default::default()
                                }),
                                command,
                                args,
                                envs: envs
                                    .into_iter()
                                    .map(|e| KeyValue {
                                        key: e.clone(),
                                        value: e,
                                    })
                                    .collect(),
                                mounts: paths
                                    .iter()
                                    .map(|(c, h)| Mount {
                                        container_path: c.clone(),
                                        host_path: h.clone(),
                                        mount_options: vec![h.clone(), c.clone()],
                                        ..Default::default()
                                    })
                                    .collect(),
                                devices: paths
                                    .iter()
                                    .map(|(c, h)| Device {
                                        container_path: c.clone(),
                                        host_path: h.clone(),
                                        permissions: "rwm".into(),
                                    })
                                    .collect(),
                                log_path: log,
                                labels,
                                annotations: ann,
                                linux: Some(LinuxContainerConfig {
                                    resources: Some(LinuxContainerResources {
                                        unified,
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            sandbox_config: None,
                        }
                    },
                )
        }

        proptest! {
            #![proptest_config(config(128))]

            #[test]
            fn run_pod_sandbox_refusals_are_short(req in pod_request()) {
                refusal("RunPodSandbox", run_pod_sandbox(&req))?;
            }

            #[test]
            fn create_container_refusals_are_short(req in container_request()) {
                refusal("CreateContainer", create_container(&req))?;
            }

            #[test]
            fn exec_and_image_refusals_are_short(cmd in list(), image in hostile_string(), id in hostile_string()) {
                refusal("ExecSync cmd", exec_cmd("cmd", &cmd))?;
                refusal("container_id", super::super::id("container_id", &id))?;
                refusal("image", image_spec("image", &ImageSpec { image, ..Default::default() }))?;
            }
        }
    }
}
