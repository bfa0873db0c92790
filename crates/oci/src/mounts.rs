//! Mounts: the default set (/proc, /dev, /dev/pts, /dev/shm, /dev/mqueue,
//! /sys, /sys/fs/cgroup), the pod's files (/etc/hosts, /etc/resolv.conf,
//! /etc/hostname, /dev/shm), and the request's bind mounts with read-only,
//! recursive read-only and propagation, in containerd's order.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crust_api::v1::{ContainerConfig, MountPropagation};
use crust_quote::quote_os;
use oci_spec::runtime::Mount;

use crate::validate::{abs_path, depth, is_under, no_nul};
use crate::{Host, HostPropagation, PodFacts, RuntimeFacts, SpecError};

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Mount {
    let mut m = Mount::default();
    m.set_destination(PathBuf::from(dest));
    m.set_typ(Some(typ.to_string()));
    m.set_source(Some(PathBuf::from(source)));
    m.set_options(Some(options.iter().map(|o| o.to_string()).collect()));
    m
}

/// containerd's default mounts (without /run). /sys and /sys/fs/cgroup are
/// read-only unless `privileged`.
pub fn default_mounts(privileged: bool) -> Vec<Mount> {
    let ro = if privileged { "rw" } else { "ro" };
    vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        mount(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", ro]),
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", ro],
        ),
    ]
}

/// The options of an image volume's bind mount, whatever the request asks.
/// Not noexec: KEP-4639 dropped it (image volumes carry tools to run, and
/// critest checks that a binary in one runs), as containerd and CRI-O do.
pub const IMAGE_VOLUME_OPTIONS: &[&str] = &["ro", "nosuid", "nodev"];

/// The options `Mount.mount_options` may ask for (KEP-5855: what
/// Kubernetes' `volumeMounts[].bindMountOptions` allows). Every handler
/// applies them to the bind mount like `ro` (runc, crun and libcontainer
/// remount the bind with them), so they hold for all handlers alike.
pub const BIND_MOUNT_OPTIONS: &[&str] = &["nosuid", "nodev", "noexec"];

/// `config.mounts[i].mount_options`, checked: each one of
/// [`BIND_MOUNT_OPTIONS`]; anything else (a typo, `exec`, `suid`, a
/// filesystem's option) is refused naming it, since ignoring it would run
/// the container without a restriction its pod asked for.
fn bind_mount_options(i: usize, given: &[String]) -> Result<Vec<&'static str>, SpecError> {
    given
        .iter()
        .enumerate()
        .map(|(j, o)| {
            BIND_MOUNT_OPTIONS
                .iter()
                .find(|known| **known == o.as_str())
                .copied()
                .ok_or_else(|| {
                    SpecError::invalid(
                        format!("config.mounts[{i}].mount_options[{j}]"),
                        format!(
                            "unknown bind mount option {} (allowed: {})",
                            quote_os(o),
                            BIND_MOUNT_OPTIONS.join(", ")
                        ),
                    )
                })
        })
        .collect()
}

fn bind(dest: &str, source: &Path, options: Vec<String>) -> Mount {
    let mut m = Mount::default();
    m.set_destination(PathBuf::from(dest));
    m.set_typ(Some("bind".to_string()));
    m.set_source(Some(source.to_path_buf()));
    m.set_options(Some(options));
    m
}

/// /sys for a container whose user namespace does not own its network
/// namespace (a user namespace pod on the node's network): the kernel lets
/// only a user namespace that owns the network namespace mount sysfs, so
/// the node's /sys is bind-mounted instead, as containerd 2.3 and CRI-O
/// 1.35 do: read-only, recursively where the handler can (`rro`), nosuid,
/// nodev, noexec. The node's sysfs files stay owned by the node's root,
/// which the container's user namespace does not map.
fn host_sys_bind(privileged: bool, rro: bool) -> Mount {
    let mut options: Vec<String> = ["rbind", "nosuid", "nodev", "noexec"]
        .into_iter()
        .map(String::from)
        .collect();
    options.push(if privileged { "rw" } else { "ro" }.into());
    if rro && !privileged {
        options.push("rro".into());
    }
    bind("/sys", Path::new("/sys"), options)
}

/// The container's mounts and the root propagation they need
/// (`rslave`/`rshared` when a mount asks for it, else None). `host_sys`:
/// /sys is the node's, bound (see [`host_sys_bind`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn container_mounts(
    config: &ContainerConfig,
    privileged: bool,
    readonly_rootfs: bool,
    ipc_host: bool,
    host_sys: bool,
    pod: &PodFacts,
    runtime: &RuntimeFacts,
    host: &dyn Host,
) -> Result<(Vec<Mount>, Option<String>), SpecError> {
    let mut rootfs_propagation: Option<&str> = None;
    let mut requested: Vec<(String, Mount)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();

    for (i, m) in config.mounts.iter().enumerate() {
        let f = |name: &str| format!("config.mounts[{i}].{name}");
        // An image volume: the daemon mounts the image and sets host_path
        // to that mount (its `image` stays set, so the bind gets the
        // image volume's flags below).
        let image_volume = m.image.as_ref().is_some_and(|img| !img.image.is_empty());
        if image_volume && m.host_path.is_empty() {
            return Err(SpecError::unsupported(
                f("image"),
                "an unresolved image volume (the daemon mounts it first)",
            ));
        }
        if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
            return Err(SpecError::unsupported(
                f("uidMappings"),
                "an unresolved id-mapped mount (the daemon id-maps it through the pod's user namespace first)",
            ));
        }
        let dest = abs_path(&f("container_path"), &m.container_path)?;
        if dest == "/" {
            return Err(SpecError::invalid(f("container_path"), "must not be /"));
        }
        if is_under(&dest, "/proc") {
            return Err(SpecError::invalid(
                f("container_path"),
                format!(
                    "{dest} is inside /proc, which must not be mounted over",
                    dest = quote_os(&dest)
                ),
            ));
        }
        if !seen.insert(dest.clone()) {
            return Err(SpecError::invalid(
                f("container_path"),
                format!("{dest} is mounted more than once", dest = quote_os(&dest)),
            ));
        }
        let src = abs_path(&f("host_path"), &m.host_path)?;
        let resolved = host
            .resolve(Path::new(&src))
            .map_err(|e| SpecError::from_host_io(f("host_path"), &src, &e))?;
        no_nul(&f("host_path"), &resolved.to_string_lossy())?;

        let prop = MountPropagation::try_from(m.propagation).map_err(|_| {
            SpecError::invalid(
                f("propagation"),
                format!("unknown propagation {}", m.propagation),
            )
        })?;
        let mut options = vec!["rbind".to_string()];
        match prop {
            MountPropagation::PropagationPrivate => options.push("rprivate".into()),
            MountPropagation::PropagationHostToContainer => {
                let p = host
                    .propagation(&resolved)
                    .map_err(|e| SpecError::from_host_io(f("host_path"), &resolved, &e))?;
                if p == HostPropagation::Private {
                    return Err(SpecError::precondition(
                        f("propagation"),
                        format!(
                            "PROPAGATION_HOST_TO_CONTAINER needs {resolved} on a shared or slave mount, it is on a private one",
                            resolved = quote_os(&resolved)
                        ),
                    ));
                }
                options.push("rslave".into());
                if rootfs_propagation != Some("rshared") {
                    rootfs_propagation = Some("rslave");
                }
            }
            MountPropagation::PropagationBidirectional => {
                // A mount made inside would appear on the host: only for
                // containers that are trusted with the host anyway (kubelet
                // refuses it too, but other CRI clients exist).
                if !privileged {
                    return Err(SpecError::invalid(
                        f("propagation"),
                        "PROPAGATION_BIDIRECTIONAL is only allowed for privileged containers",
                    ));
                }
                let p = host
                    .propagation(&resolved)
                    .map_err(|e| SpecError::from_host_io(f("host_path"), &resolved, &e))?;
                if p != HostPropagation::Shared {
                    return Err(SpecError::precondition(
                        f("propagation"),
                        format!(
                            "PROPAGATION_BIDIRECTIONAL needs {resolved} on a shared mount, it is on a {} one",
                            if p == HostPropagation::Slave {
                                "slave"
                            } else {
                                "private"
                            },
                            resolved = quote_os(&resolved)
                        ),
                    ));
                }
                options.push("rshared".into());
                rootfs_propagation = Some("rshared");
            }
        }
        if image_volume {
            // Kubernetes documents image volumes as read-only; nosuid and
            // nodev keep an image's setuid binaries and device nodes inert. As mount options, so every runtime handler
            // applies them to the container's own bind mount.
            options.extend(IMAGE_VOLUME_OPTIONS.iter().map(|o| o.to_string()));
        } else {
            options.push(if m.readonly { "ro" } else { "rw" }.into());
        }
        if m.recursive_read_only {
            if !m.readonly {
                return Err(SpecError::invalid(
                    f("recursive_read_only"),
                    "requires readonly to be set",
                ));
            }
            if prop != MountPropagation::PropagationPrivate {
                return Err(SpecError::invalid(
                    f("recursive_read_only"),
                    "requires propagation PROPAGATION_PRIVATE",
                ));
            }
            if !runtime.rro_supported {
                return Err(SpecError::unsupported(
                    f("recursive_read_only"),
                    "recursive read-only mounts on this runtime handler",
                ));
            }
            options.push("rro".into());
        }
        for o in bind_mount_options(i, &m.mount_options)? {
            if !options.iter().any(|x| x == o) {
                options.push(o.to_string());
            }
        }
        // selinux_relabel: no SELinux on crust's hosts; ignored.
        requested.push((dest.clone(), bind(&dest, &resolved, options)));
    }

    // The pod's files, unless the request mounts something there itself.
    let pod_opts = |ro: bool| -> Vec<String> {
        vec![
            "rbind".into(),
            "rprivate".into(),
            if ro { "ro" } else { "rw" }.into(),
        ]
    };
    let mut extra: Vec<(String, Mount)> = Vec::new();
    for (dest, src) in [
        ("/etc/hostname", pod.hostname_file.as_deref()),
        ("/etc/hosts", pod.hosts.as_deref()),
        ("/etc/resolv.conf", pod.resolv_conf.as_deref()),
    ] {
        if let Some(src) = src
            && !seen.contains(dest)
        {
            extra.push((dest.to_string(), bind(dest, src, pod_opts(readonly_rootfs))));
        }
    }
    let shm = if ipc_host {
        Some(Path::new("/dev/shm"))
    } else {
        pod.shm.as_deref()
    };
    if let Some(src) = shm
        && !seen.contains("/dev/shm")
    {
        extra.push((
            "/dev/shm".to_string(),
            bind("/dev/shm", src, pod_opts(false)),
        ));
    }

    let mut supplied = requested;
    supplied.extend(extra);
    // Parents before children, otherwise request order (stable sort).
    supplied.sort_by_key(|(dest, _)| depth(dest));
    let supplied_dests: HashSet<&str> = supplied.iter().map(|(d, _)| d.as_str()).collect();
    let dev_supplied = supplied_dests.contains("/dev");

    let mut mounts: Vec<Mount> = default_mounts(privileged)
        .into_iter()
        .filter(|m| {
            let d = m.destination().to_string_lossy();
            let replaced = supplied_dests.contains(d.as_ref());
            let under_supplied_dev = dev_supplied && is_under(&d, "/dev");
            !replaced && !under_supplied_dev
        })
        .map(|m| {
            if host_sys && m.destination() == Path::new("/sys") {
                host_sys_bind(privileged, runtime.rro_supported)
            } else {
                m
            }
        })
        .collect();
    mounts.extend(supplied.into_iter().map(|(_, m)| m));
    Ok((mounts, rootfs_propagation.map(str::to_string)))
}
