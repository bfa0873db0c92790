//! Checks of what a client sends for a container, before anything is
//! touched. Errors name the field.

use crust_api::v1::ContainerConfig;

use super::error::ContainerError;
use crust_quote::quote;

fn invalid(m: String) -> ContainerError {
    ContainerError::InvalidArgument(m)
}

/// CreateContainer's `config`: present, with metadata, a usable name and a
/// safe log path.
pub fn checked_config(config: Option<ContainerConfig>) -> Result<ContainerConfig, ContainerError> {
    let config = config.ok_or_else(|| invalid("config: required".into()))?;
    let md = config
        .metadata
        .as_ref()
        .ok_or_else(|| invalid("config.metadata: required".into()))?;
    check_name("config.metadata.name", &md.name)?;
    check_log_path(&config.log_path)?;
    check_image_volumes(&config)?;
    check_propagation(&config)?;
    Ok(config)
}

/// `mounts[i].propagation`: Bidirectional only for a privileged container
/// (a mount made inside would show on the host); kubelet refuses it too.
fn check_propagation(config: &ContainerConfig) -> Result<(), ContainerError> {
    let privileged = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|s| s.privileged);
    if privileged {
        return Ok(());
    }
    for (i, m) in config.mounts.iter().enumerate() {
        if m.propagation == crust_api::v1::MountPropagation::PropagationBidirectional as i32 {
            return Err(invalid(format!(
                "config.mounts[{i}].propagation: PROPAGATION_BIDIRECTIONAL is only allowed for \
                 privileged containers"
            )));
        }
    }
    Ok(())
}

/// Image volumes (`mounts[i].image`): no host path besides the image, and a
/// relative `image_sub_path` without `..` (symlinks in it are resolved
/// inside the image when it is mounted).
fn check_image_volumes(config: &ContainerConfig) -> Result<(), ContainerError> {
    for (i, m) in config.mounts.iter().enumerate() {
        let image = m.image.as_ref().is_some_and(|img| !img.image.is_empty());
        let sub = &m.image_sub_path;
        let bad =
            |field: &str, why: &str| Err(invalid(format!("config.mounts[{i}].{field}: {why}")));
        let image_ref = m.image.as_ref().map_or("", |img| img.image_ref.as_str());
        if !image_ref.is_empty() {
            if !image {
                return bad("image.image", "required with image.image_ref");
            }
            if !is_digest_ref(image_ref) {
                return bad(
                    "image.image_ref",
                    &format!(
                        "{} is not an image digest (sha256:<64 hex digits>, or \
                         <name>@sha256:<64 hex digits>)",
                        quote(image_ref)
                    ),
                );
            }
        }
        if !image {
            if !sub.is_empty() {
                return bad("image_sub_path", "needs an image volume (image)");
            }
            continue;
        }
        if !m.host_path.is_empty() {
            return bad("host_path", "must be empty for an image volume");
        }
        if sub.contains('\0') {
            return bad("image_sub_path", "contains NUL");
        }
        if sub.starts_with('/') {
            return bad(
                "image_sub_path",
                &format!("{} must be relative to the image's root", quote(sub)),
            );
        }
        if sub.split('/').any(|c| c == "..") {
            return bad(
                "image_sub_path",
                &format!("{} must not contain '..' components", quote(sub)),
            );
        }
        if sub.len() > 4096 {
            return bad("image_sub_path", "is too long");
        }
    }
    Ok(())
}

/// `ImageSpec.image_ref` of an image volume pins its content, so only a
/// digest is taken: an image ID (`sha256:<hex>`) or a digest reference
/// (`<name>@sha256:<hex>`), never a tag or an ID prefix.
fn is_digest_ref(r: &str) -> bool {
    let digest = match r.rsplit_once('@') {
        Some((name, d)) if !name.is_empty() => d,
        Some(_) => return false,
        None => r,
    };
    crust_image::digest::Digest::parse(digest).is_ok()
}

/// The mounts to id-map (`mounts[i].uidMappings`/`gidMappings`, which
/// kubelet sets on every volume of a `hostUsers: false` pod): their
/// indexes. crust id-maps through the pod's own user namespace, so the
/// mappings must be the pod's (as kubelet sends them): anything else is
/// InvalidArgument naming the field.
pub fn idmapped_mounts(
    config: &ContainerConfig,
    userns: Option<&crust_oci::UserNs>,
) -> Result<Vec<usize>, ContainerError> {
    let mut out = Vec::new();
    for (i, m) in config.mounts.iter().enumerate() {
        if m.uid_mappings.is_empty() && m.gid_mappings.is_empty() {
            continue;
        }
        let Some(userns) = userns else {
            return Err(invalid(format!(
                "config.mounts[{i}].uidMappings: id-mapped mounts need a pod with its own \
                 user namespace (namespace_options.userns_options mode POD)"
            )));
        };
        let same = |field: &str, given: &[crust_api::v1::IdMapping], pod: &crust_oci::IdMapping| {
            match given {
                [m] if m.container_id == pod.container_id
                    && m.host_id == pod.host_id
                    && m.length == pod.size =>
                {
                    Ok(())
                }
                _ => Err(invalid(format!(
                    "config.mounts[{i}].{field}: must be the pod's user namespace mapping \
                     (container {} host {} length {}): {} range(s) given",
                    pod.container_id,
                    pod.host_id,
                    pod.size,
                    given.len()
                ))),
            }
        };
        same("uidMappings", &m.uid_mappings, &userns.uid)?;
        same("gidMappings", &m.gid_mappings, &userns.gid)?;
        out.push(i);
    }
    Ok(out)
}

/// `config.image.image`, which CreateContainer needs.
pub fn image_name(config: &ContainerConfig) -> Result<String, ContainerError> {
    let name = config
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .unwrap_or_default();
    if name.is_empty() {
        return Err(invalid("config.image.image: required".into()));
    }
    Ok(name)
}

/// ExecSync's command and timeout.
pub fn check_exec_sync(cmd: &[String], timeout_s: i64) -> Result<(), ContainerError> {
    if cmd.is_empty() {
        return Err(invalid("cmd: required".into()));
    }
    if timeout_s < 0 {
        return Err(invalid("timeout: must not be negative".into()));
    }
    Ok(())
}

/// `config.log_path`: relative, no `..`, no NUL.
fn check_log_path(p: &str) -> Result<(), ContainerError> {
    let bad = |why: &str| Err(invalid(format!("config.log_path: {} {why}", quote(p))));
    if p.contains('\0') {
        return bad("contains NUL");
    }
    if p.starts_with('/') {
        return bad("must be relative to the pod's log directory");
    }
    if p.split('/').any(|c| c == ".." || c == ".") {
        return bad("must not contain '.' or '..' components");
    }
    if p.len() > 4096 {
        return bad("is too long");
    }
    Ok(())
}

fn check_name(field: &str, name: &str) -> Result<(), ContainerError> {
    if name.is_empty() {
        return Err(invalid(format!("{field}: required")));
    }
    if name.len() > 253 || name.bytes().any(|b| b.is_ascii_control() || b == b'/') {
        return Err(invalid(format!(
            "{field}: {} must be at most 253 printable characters without '/'",
            quote(name)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::{ContainerMetadata, ImageSpec};

    fn config(name: &str, log_path: &str) -> Option<ContainerConfig> {
        Some(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            log_path: log_path.into(),
            ..Default::default()
        })
    }

    fn field_of(e: ContainerError) -> String {
        match e {
            ContainerError::InvalidArgument(m) => m.split(':').next().unwrap_or("").to_string(),
            other => panic!("not InvalidArgument: {other:?}"),
        }
    }

    #[test]
    fn config_and_metadata_are_required() {
        assert_eq!(field_of(checked_config(None).unwrap_err()), "config");
        let no_md = Some(ContainerConfig::default());
        assert_eq!(
            field_of(checked_config(no_md).unwrap_err()),
            "config.metadata"
        );
        assert!(checked_config(config("web", "web/0.log")).is_ok());
    }

    #[test]
    fn names_are_printable_and_without_slashes() {
        for bad in ["", "a/b", "tab\there", &"x".repeat(254)] {
            let e = checked_config(config(bad, "")).unwrap_err();
            assert_eq!(field_of(e), "config.metadata.name", "{bad:?}");
        }
        assert!(checked_config(config(&"x".repeat(253), "")).is_ok());
    }

    #[test]
    fn log_paths_stay_inside_the_pod_log_dir() {
        for bad in ["/var/log/x", "../x", "a/../../x", "./x", "a\0b"] {
            let e = checked_config(config("web", bad)).unwrap_err();
            assert_eq!(field_of(e), "config.log_path", "{bad:?}");
        }
        let long = "a/".repeat(2049);
        assert!(checked_config(config("web", &long)).is_err());
        assert!(checked_config(config("web", "")).is_ok());
        assert!(checked_config(config("web", "web_0/0.log")).is_ok());
    }

    #[test]
    fn image_volumes_name_an_image_and_stay_inside_it() {
        use crust_api::v1::Mount;
        let with = |m: Mount| {
            let mut c = config("web", "").unwrap();
            c.mounts = vec![Mount::default(), m];
            checked_config(Some(c))
        };
        let image = || {
            Some(ImageSpec {
                image: "registry/artifact:1".into(),
                ..Default::default()
            })
        };
        let vol = |sub: &str| Mount {
            container_path: "/vol".into(),
            image: image(),
            image_sub_path: sub.into(),
            ..Default::default()
        };
        for ok in ["", "dir", "a/b/c", "a/./b"] {
            assert!(with(vol(ok)).is_ok(), "{ok:?}");
        }
        for bad in ["/etc", "..", "a/../../b", "a/..", "a\0b"] {
            let e = with(vol(bad)).unwrap_err();
            assert_eq!(field_of(e), "config.mounts[1].image_sub_path", "{bad:?}");
        }
        let mut m = vol("");
        m.host_path = "/etc".into();
        assert_eq!(field_of(with(m).unwrap_err()), "config.mounts[1].host_path");
        let m = Mount {
            container_path: "/x".into(),
            host_path: "/tmp".into(),
            image_sub_path: "a".into(),
            ..Default::default()
        };
        assert_eq!(
            field_of(with(m).unwrap_err()),
            "config.mounts[1].image_sub_path"
        );
    }

    /// `image.image_ref` pins an image volume to a digest: with `image`,
    /// and only a digest.
    #[test]
    fn image_volume_refs_are_digests() {
        use crust_api::v1::Mount;
        let hex = "0123456789abcdef".repeat(4);
        let with = |image: &str, image_ref: &str| {
            let mut c = config("web", "").unwrap();
            c.mounts = vec![Mount {
                container_path: "/vol".into(),
                image: Some(ImageSpec {
                    image: image.into(),
                    image_ref: image_ref.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }];
            checked_config(Some(c))
        };
        for ok in [
            format!("sha256:{hex}"),
            format!("registry.local/artifact@sha256:{hex}"),
            String::new(),
        ] {
            assert!(with("registry.local/artifact:1", &ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "registry.local/artifact:1".to_string(),
            format!("sha256:{}", &hex[..12]),
            hex.clone(),
            format!("sha256:{}", hex.to_uppercase()),
            format!("@sha256:{hex}"),
            format!("sha512:{hex}{hex}"),
            format!("a@sha256:{hex}0"),
            "x".repeat(10_000),
        ] {
            let e = with("registry.local/artifact:1", &bad).unwrap_err();
            let msg = e.to_string();
            assert!(msg.len() < 1024, "{msg}");
            assert_eq!(field_of(e), "config.mounts[0].image.image_ref", "{bad:?}");
        }
        let e = with("", &format!("sha256:{hex}")).unwrap_err();
        assert_eq!(field_of(e), "config.mounts[0].image.image");
    }

    #[test]
    fn bidirectional_propagation_needs_privileged() {
        use crust_api::v1::{LinuxContainerConfig, LinuxContainerSecurityContext, Mount};
        let m = |p: MountPropagation| Mount {
            container_path: "/m".into(),
            host_path: "/tmp".into(),
            propagation: p as i32,
            ..Default::default()
        };
        use crust_api::v1::MountPropagation;
        let mut c = config("web", "").unwrap();
        c.mounts = vec![
            m(MountPropagation::PropagationHostToContainer),
            m(MountPropagation::PropagationPrivate),
            m(MountPropagation::PropagationBidirectional),
        ];
        let e = checked_config(Some(c.clone())).unwrap_err();
        assert_eq!(field_of(e), "config.mounts[2].propagation");
        c.linux = Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                privileged: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(checked_config(Some(c.clone())).is_ok());
        c.mounts.pop();
        c.linux = None;
        assert!(checked_config(Some(c)).is_ok());
    }

    #[test]
    fn idmapped_mounts_must_be_the_pods_mapping() {
        use crust_api::v1::{IdMapping, Mount};
        let map = |c, h, l| IdMapping {
            container_id: c,
            host_id: h,
            length: l,
        };
        let pod = crust_oci::UserNs {
            path: "/run/ns/user".into(),
            uid: crust_oci::IdMapping {
                container_id: 0,
                host_id: 100_000,
                size: 65536,
            },
            gid: crust_oci::IdMapping {
                container_id: 0,
                host_id: 200_000,
                size: 65536,
            },
        };
        let mount = |uids: Vec<IdMapping>, gids: Vec<IdMapping>| Mount {
            container_path: "/v".into(),
            host_path: "/tmp".into(),
            uid_mappings: uids,
            gid_mappings: gids,
            ..Default::default()
        };
        let mut c = config("c", "").unwrap();
        c.mounts = vec![
            mount(vec![], vec![]),
            mount(vec![map(0, 100_000, 65536)], vec![map(0, 200_000, 65536)]),
        ];
        assert_eq!(idmapped_mounts(&c, Some(&pod)).unwrap(), vec![1]);
        assert_eq!(
            field_of(idmapped_mounts(&c, None).unwrap_err()),
            "config.mounts[1].uidMappings"
        );
        for (uids, gids, field) in [
            (
                vec![map(0, 100_001, 65536)],
                vec![map(0, 200_000, 65536)],
                "uidMappings",
            ),
            (
                vec![map(0, 100_000, 65536)],
                vec![map(0, 200_000, 1)],
                "gidMappings",
            ),
            (vec![map(0, 100_000, 65536)], vec![], "gidMappings"),
            (
                vec![map(0, 100_000, 1), map(1, 100_001, 65535)],
                vec![map(0, 200_000, 65536)],
                "uidMappings",
            ),
        ] {
            c.mounts[1] = mount(uids, gids);
            assert_eq!(
                field_of(idmapped_mounts(&c, Some(&pod)).unwrap_err()),
                format!("config.mounts[1].{field}")
            );
        }
    }

    #[test]
    fn image_and_exec_sync_arguments() {
        let mut c = config("web", "").unwrap();
        assert_eq!(field_of(image_name(&c).unwrap_err()), "config.image.image");
        c.image = Some(ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        });
        assert_eq!(image_name(&c).unwrap(), "busybox");
        assert_eq!(field_of(check_exec_sync(&[], 0).unwrap_err()), "cmd");
        assert_eq!(
            field_of(check_exec_sync(&["true".into()], -1).unwrap_err()),
            "timeout"
        );
        assert!(check_exec_sync(&["true".into()], 0).is_ok());
    }
}
