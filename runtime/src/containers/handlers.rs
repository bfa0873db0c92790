//! Runtime handlers: RunPodSandbox's `runtime_handler` picks how the pod's
//! containers are run (the embedded runtime or an OCI runtime CLI).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crust_shim::RuntimeConfig;

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

/// Every handler of this node by name, with how the monitor runs it.
pub fn resolve(config: &Config) -> BTreeMap<String, RuntimeConfig> {
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

fn find_in_path(p: &Path) -> Option<PathBuf> {
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

/// The `crust-shim` binary: configured, else next to this executable.
pub fn shim_binary(config: &Config) -> PathBuf {
    if let Some(p) = &config.shim_binary {
        return p.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("crust-shim")))
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/crust-shim"))
}
