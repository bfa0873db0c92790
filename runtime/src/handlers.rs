//! Runtime handlers: RunPodSandbox's `runtime_handler` picks how the pod's
//! containers are run (the embedded runtime or an OCI runtime CLI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crust_shim_protocol::RuntimeConfig;

use crate::config::{CgroupDriver, Config, RuntimeKind};

/// Where the built-in CLI handlers are looked for, in order.
const SEARCH_PATH: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The embedded runtime's handler name.
pub const EMBEDDED: &str = "embedded";

/// The runtime handlers of this node, with how the monitor runs each and
/// what each can do. Detected at start and again at a config reload
/// ([`Handlers::replace`]).
#[derive(Debug, Default)]
pub struct Handlers {
    table: RwLock<Arc<Table>>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Table {
    configs: BTreeMap<String, RuntimeConfig>,
    features: BTreeMap<String, HandlerFeatures>,
}

impl Handlers {
    /// The handlers `config` names (and the built-in ones), with their
    /// features detected.
    pub async fn detect(config: &Config) -> Handlers {
        let configs = resolve(config);
        let features = detect_features(&configs).await;
        Handlers::from_table(Table { configs, features })
    }

    fn from_table(table: Table) -> Handlers {
        Handlers {
            table: RwLock::new(Arc::new(table)),
        }
    }

    /// Handlers given as they are (tests).
    #[cfg(test)]
    pub fn from_parts(
        configs: BTreeMap<String, RuntimeConfig>,
        features: BTreeMap<String, HandlerFeatures>,
    ) -> Handlers {
        Handlers::from_table(Table { configs, features })
    }

    fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `new`'s handlers in place of these (a config reload) and says
    /// which names were added, changed and removed. Containers keep the
    /// runtime they were created with (their record holds it); only pods
    /// and containers created from now on see the new table.
    pub fn replace(&self, new: Handlers) -> HandlerChanges {
        let new = new.table();
        let mut slot = self.table.write().unwrap_or_else(|e| e.into_inner());
        let old = slot.clone();
        let mut changes = HandlerChanges::default();
        for (name, rc) in &new.configs {
            match old.configs.get(name) {
                None => changes.added.push(name.clone()),
                Some(was) if was != rc || old.features.get(name) != new.features.get(name) => {
                    changes.changed.push(name.clone())
                }
                Some(_) => {}
            }
        }
        changes.removed = old
            .configs
            .keys()
            .filter(|n| !new.configs.contains_key(*n))
            .cloned()
            .collect();
        *slot = new;
        changes
    }

    /// How the monitor runs the handler `name`; None if there is none.
    pub fn get(&self, name: &str) -> Option<RuntimeConfig> {
        self.table().configs.get(name).cloned()
    }

    /// Every handler's name, in order.
    pub fn names(&self) -> Vec<String> {
        self.table().configs.keys().cloned().collect()
    }

    /// What the handler `name` can do (nothing if it is unknown).
    pub fn features(&self, name: &str) -> HandlerFeatures {
        self.table().features.get(name).copied().unwrap_or_default()
    }
}

/// What [`Handlers::replace`] changed, by handler name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HandlerChanges {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// Every handler of this node by name, with how the monitor runs it.
fn resolve(config: &Config) -> BTreeMap<String, RuntimeConfig> {
    let systemd_cgroup = config.cgroup_driver == CgroupDriver::Systemd;
    let root_for = |name: &str| {
        let dir = if name.is_empty() { "default" } else { name };
        config.run_dir.join("runtimes").join(dir)
    };
    let mut out = BTreeMap::new();
    out.insert(
        EMBEDDED.to_string(),
        RuntimeConfig::Embedded {
            root: root_for(EMBEDDED),
            systemd_cgroup,
        },
    );
    for name in ["runc", "crun"] {
        if let Some(path) = find_in_path(Path::new(name)) {
            out.insert(
                name.to_string(),
                RuntimeConfig::Cli {
                    path,
                    root: root_for(name),
                    systemd_cgroup,
                },
            );
        }
    }
    // The default handler is the embedded runtime: a node needs no runtime
    // binary. (Its exec is crust's own, which keeps the container's seccomp
    // filter; see crust-shim's runtime::join.) `[runtimes.""]` replaces it.
    let default = RuntimeConfig::Embedded {
        root: root_for(""),
        systemd_cgroup,
    };
    out.insert(String::new(), default);
    for (name, h) in &config.runtimes {
        let root = h.root.clone().unwrap_or_else(|| root_for(name));
        let rc = match h.kind {
            RuntimeKind::Embedded => RuntimeConfig::Embedded {
                root,
                systemd_cgroup,
            },
            RuntimeKind::Cli => {
                let wanted = h.path.clone().unwrap_or_else(|| PathBuf::from(name));
                let Some(path) = find_in_path(&wanted) else {
                    tracing::warn!(
                        handler = name,
                        "runtime binary {} not found: handler disabled",
                        wanted.display()
                    );
                    out.remove(name);
                    continue;
                };
                RuntimeConfig::Cli {
                    path,
                    root,
                    systemd_cgroup,
                }
            }
        };
        out.insert(name.clone(), rc);
    }
    out
}

pub(crate) fn find_in_path(p: &Path) -> Option<PathBuf> {
    if p.is_absolute() {
        return p.is_file().then(|| p.to_path_buf());
    }
    if p.components().count() != 1 {
        return None;
    }
    SEARCH_PATH
        .iter()
        .map(|d| Path::new(d).join(p))
        .find(|c| c.is_file())
}

/// What a handler can do, as Status reports it and CreateContainer checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandlerFeatures {
    /// The `rro` mount option (recursive read-only, via mount_setattr).
    pub recursive_read_only_mounts: bool,
    /// Pods with their own user namespace (userns_options POD): the daemon
    /// creates and pins it, the handler joins it by path with its mappings
    /// (runc >= 1.0, crun, youki's libcontainer all do). Needs a kernel
    /// that allows user namespaces.
    pub user_namespaces: bool,
}

impl HandlerFeatures {
    /// Every feature by its CRI name (a `RuntimeHandlerFeatures` field):
    /// the one list CRI Status (crictl info) and `crust status` (the admin
    /// API) both come from. Destructured, so a new field must be named here.
    pub fn named(self) -> [(&'static str, bool); 2] {
        let HandlerFeatures {
            recursive_read_only_mounts,
            user_namespaces,
        } = self;
        [
            ("recursive_read_only_mounts", recursive_read_only_mounts),
            ("user_namespaces", user_namespaces),
        ]
    }

    /// The names of the features this handler has (`crust status`).
    pub fn enabled(self) -> Vec<String> {
        self.named()
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// As CRI Status reports them, built from [`Self::named`].
    pub fn to_cri(self) -> crust_api::v1::RuntimeHandlerFeatures {
        let mut cri = crust_api::v1::RuntimeHandlerFeatures::default();
        for (name, on) in self.named() {
            let field = match name {
                "recursive_read_only_mounts" => &mut cri.recursive_read_only_mounts,
                "user_namespaces" => &mut cri.user_namespaces,
                // `named` lists the fields above only (its unit test).
                _ => continue,
            };
            *field = on;
        }
        cri
    }
}

/// Detects every handler's features once (a CLI runtime is asked with its
/// `features` command, as containerd does; one that has none, or does not
/// list `rro`, is taken not to support it).
async fn detect_features(
    handlers: &BTreeMap<String, RuntimeConfig>,
) -> BTreeMap<String, HandlerFeatures> {
    let kernel_rro = nix::sys::utsname::uname()
        .ok()
        .and_then(|u| kernel_version(&u.release().to_string_lossy()))
        .is_some_and(|v| v >= (5, 12));
    // The daemon id-maps rootfs layers and volumes itself
    // (mount_setattr(MOUNT_ATTR_IDMAP), Linux 5.12), so user namespace
    // support is the kernel's, the same for every handler.
    let kernel_userns = kernel_rro
        && std::path::Path::new("/proc/self/ns/user").exists()
        && std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0);
    let mut cli_rro: BTreeMap<&Path, bool> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (name, rc) in handlers {
        let rro = kernel_rro
            && match rc {
                // libcontainer maps `rro` to mount_setattr.
                RuntimeConfig::Embedded { .. } => true,
                RuntimeConfig::Cli { path, .. } => match cli_rro.get(path.as_path()) {
                    Some(known) => *known,
                    None => {
                        let rro = cli_lists_mount_option(path, "rro").await;
                        cli_rro.insert(path, rro);
                        rro
                    }
                },
            };
        out.insert(
            name.clone(),
            HandlerFeatures {
                recursive_read_only_mounts: rro,
                user_namespaces: kernel_userns,
            },
        );
    }
    out
}

/// `(major, minor)` of a kernel release such as `6.1.0-18-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Runs `<runtime> features` (bounded to a few seconds) and looks for
/// `option` in its `mountOptions`.
async fn cli_lists_mount_option(path: &Path, option: &str) -> bool {
    let run = tokio::process::Command::new(path)
        .arg("features")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(std::time::Duration::from_secs(5), run).await {
        Ok(Ok(out)) => features_list_mount_option(&out.stdout, option),
        Ok(Err(e)) => {
            tracing::warn!("{} features: {e}: taken as no features", path.display());
            false
        }
        Err(_) => {
            tracing::warn!(
                "{} features did not answer: taken as no features",
                path.display()
            );
            false
        }
    }
}

/// Whether an OCI runtime `features` document lists a mount option.
fn features_list_mount_option(json: &[u8], option: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(json)
        .ok()
        .and_then(|v| {
            v.get("mountOptions")?
                .as_array()
                .map(|a| a.iter().any(|o| o.as_str() == Some(option)))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each named feature turns on the CRI field of that name, and only it.
    #[test]
    fn feature_names_are_the_cri_fields() {
        let none = HandlerFeatures::default();
        assert!(none.named().iter().all(|(_, on)| !on));
        assert_eq!(none.to_cri(), Default::default());
        for i in 0..none.named().len() {
            let one = match i {
                0 => HandlerFeatures {
                    recursive_read_only_mounts: true,
                    ..none
                },
                _ => HandlerFeatures {
                    user_namespaces: true,
                    ..none
                },
            };
            let names = one.enabled();
            assert_eq!(names.len(), 1, "{one:?}");
            let cri = format!("{:?}", one.to_cri());
            assert!(cri.contains(&format!("{}: true", names[0])), "{cri}");
            assert_eq!(cri.matches(": true").count(), 1, "{cri}");
        }
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.12.0"), Some((5, 12)));
        assert_eq!(kernel_version("6.18.44-fc-v595"), Some((6, 18)));
        assert_eq!(kernel_version("weird"), None);
    }

    #[test]
    fn features_documents() {
        let runc = br#"{"ociVersionMin":"1.0.0","mountOptions":["bind","ro","rro","rrw"]}"#;
        assert!(features_list_mount_option(runc, "rro"));
        assert!(!features_list_mount_option(
            br#"{"mountOptions":["ro"]}"#,
            "rro"
        ));
        assert!(!features_list_mount_option(
            b"unknown command features",
            "rro"
        ));
        assert!(!features_list_mount_option(
            br#"{"mountOptions":"rro"}"#,
            "rro"
        ));
    }
}
