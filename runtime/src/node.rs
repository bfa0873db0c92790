//! What the daemon knows of the node: the facts every spec needs, detected
//! once at start (AppArmor with them), and the real-filesystem
//! [`crust_oci::Host`] that spec generation looks paths and devices up
//! through.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crust_apparmor::{AppArmor, ApparmorParser, Availability, KernelPaths, Loaded};
use crust_oci::{Host, HostDevice, HostPropagation, RuntimeFacts};
use oci_spec::runtime::{Capability, LinuxDeviceType};
use tracing::{info, warn};

/// Largest seccomp profile file read.
const MAX_PROFILE: u64 = crust_oci::MAX_SECCOMP_PROFILE_BYTES as u64 + 1;

/// AppArmor on this node, as found at start.
pub struct NodeAppArmor {
    pub availability: Availability,
    /// Set when AppArmor is enabled.
    pub apparmor: Option<Arc<AppArmor>>,
}

impl NodeAppArmor {
    /// Detects AppArmor and, when it is on, loads crust's default profile
    /// unless it is loaded. A failed load is logged, not fatal: Localhost
    /// profiles still work, and each container that needs the default
    /// tries again and fails with the reason (as containerd does).
    pub fn setup() -> NodeAppArmor {
        let paths = KernelPaths::default();
        let availability = crust_apparmor::detect(&paths);
        let Availability::Enabled = availability else {
            if let Availability::Disabled(why) = &availability {
                info!("AppArmor: not used ({why})");
            }
            return NodeAppArmor {
                availability,
                apparmor: None,
            };
        };
        let parser: Box<dyn crust_apparmor::Parser> = match ApparmorParser::find() {
            Ok(p) => Box::new(p),
            Err(e) => Box::new(MissingParser(e.to_string())),
        };
        let abi = crust_apparmor::node_abi(Path::new(crust_apparmor::POLICY_DIR));
        let apparmor = Arc::new(AppArmor::new(paths, parser, abi));
        match apparmor.ensure_default() {
            Ok(Loaded::Now) => info!(
                profile = apparmor.default_name(),
                "AppArmor: loaded the default profile"
            ),
            Ok(Loaded::Already) => info!(
                profile = apparmor.default_name(),
                "AppArmor: the default profile is loaded"
            ),
            Err(e) => warn!(
                profile = apparmor.default_name(),
                "AppArmor: cannot load the default profile: {e}"
            ),
        }
        NodeAppArmor {
            availability,
            apparmor: Some(apparmor),
        }
    }

    /// What RuntimeFacts::apparmor_default_profile says.
    pub fn default_profile(&self) -> Option<String> {
        self.apparmor.as_ref().map(|a| a.default_name().to_string())
    }

    /// Status' `info["apparmor"]`.
    pub fn status_info(&self) -> serde_json::Value {
        match (&self.availability, &self.apparmor) {
            (Availability::Enabled, Some(a)) => {
                let loaded = a.is_loaded(a.default_name());
                serde_json::json!({
                    "enabled": true,
                    "defaultProfile": a.default_name(),
                    "defaultProfileLoaded": loaded.as_ref().is_ok_and(|l| *l),
                    "error": loaded.err().map(|e| e.to_string()),
                })
            }
            (Availability::Disabled(why), _) => {
                serde_json::json!({"enabled": false, "reason": why})
            }
            (Availability::Enabled, None) => serde_json::json!({"enabled": false}),
        }
    }
}

/// Stands in for apparmor_parser where none is installed: every load
/// fails with the reason.
struct MissingParser(String);

impl crust_apparmor::Parser for MissingParser {
    fn load(&self, _policy: &str) -> Result<(), crust_apparmor::Error> {
        Err(crust_apparmor::Error::ParserFailed {
            status: "not run".into(),
            stderr: self.0.clone(),
        })
    }
}

/// The real filesystem, as spec generation looks it up.
pub struct NodeHost {
    /// Set when the node has AppArmor.
    pub apparmor: Option<Arc<AppArmor>>,
}

impl Host for NodeHost {
    fn apparmor_profile_loaded(&self, name: &str) -> io::Result<bool> {
        let Some(aa) = &self.apparmor else {
            return Err(io::Error::other("AppArmor is not enabled on this node"));
        };
        if name == aa.default_name() {
            // Unloaded behind the daemon's back: load it again.
            return aa.ensure_default().map(|_| true).map_err(io::Error::other);
        }
        aa.is_loaded(name).map_err(io::Error::other)
    }

    fn resolve(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }

    fn propagation(&self, path: &Path) -> io::Result<HostPropagation> {
        let info = std::fs::read_to_string("/proc/self/mountinfo")?;
        let mut best: Option<(usize, HostPropagation)> = None;
        for line in info.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 7 {
                continue;
            }
            let mount_point = unescape(fields[4]);
            if !path.starts_with(&mount_point) {
                continue;
            }
            let len = mount_point.as_os_str().len();
            let optional = fields[6..].iter().take_while(|f| **f != "-");
            let mut prop = HostPropagation::Private;
            for f in optional {
                if f.starts_with("shared:") {
                    prop = HostPropagation::Shared;
                    break;
                } else if f.starts_with("master:") {
                    prop = HostPropagation::Slave;
                }
            }
            // Later lines win for the same mount point (over-mounts).
            if best.is_none_or(|(l, _)| len >= l) {
                best = Some((len, prop));
            }
        }
        Ok(best.map_or(HostPropagation::Private, |(_, p)| p))
    }

    fn devices(&self, path: &Path) -> io::Result<Vec<HostDevice>> {
        let meta = std::fs::metadata(path)?;
        if meta.is_dir() {
            let mut out = Vec::new();
            walk_devices(path, path, &mut out, 0);
            return Ok(out);
        }
        Ok(device(&meta, PathBuf::new()).into_iter().collect())
    }

    fn all_devices(&self) -> io::Result<Vec<HostDevice>> {
        let mut out = Vec::new();
        walk_devices(Path::new("/dev"), Path::new("/dev"), &mut out, 0);
        out.retain(|d| {
            let first = d
                .relative
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            !matches!(
                first.as_str(),
                "pts" | "shm" | "mqueue" | "console" | "ptmx" | "hugepages"
            )
        });
        Ok(out)
    }

    fn read_seccomp_profile(&self, path: &Path) -> io::Result<String> {
        use std::io::Read;
        let mut s = String::new();
        std::fs::File::open(path)?
            .take(MAX_PROFILE)
            .read_to_string(&mut s)?;
        Ok(s)
    }
}

/// Controllers libcontainer's (libcgroups 0.7) v1 manager creates a
/// container's cgroup in.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// Mount points of the cgroup v1 hierarchies under /sys/fs/cgroup that hold
/// one of [`V1_CONTROLLERS`]; empty on a cgroup v2 only host.
pub fn cgroup_v1_hierarchies() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        let (Some("cgroup"), Some(_), Some(opts)) = (r.next(), r.next(), r.next()) else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4).map(unescape) else {
            continue;
        };
        if mount_point.parent() == Some(Path::new("/sys/fs/cgroup"))
            && opts.split(',').any(|o| V1_CONTROLLERS.contains(&o))
            && !out.contains(&mount_point)
        {
            out.push(mount_point);
        }
    }
    out
}

fn unescape(s: &str) -> PathBuf {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

fn device(meta: &std::fs::Metadata, relative: PathBuf) -> Option<HostDevice> {
    let ft = meta.file_type();
    let kind = if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_block_device() {
        LinuxDeviceType::B
    } else if ft.is_fifo() {
        LinuxDeviceType::P
    } else {
        return None;
    };
    let rdev = meta.rdev();
    Some(HostDevice {
        relative,
        kind,
        major: libc::major(rdev) as i64,
        minor: libc::minor(rdev) as i64,
        file_mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

fn walk_devices(base: &Path, dir: &Path, out: &mut Vec<HostDevice>, depth: usize) {
    if depth > 8 || out.len() > 4096 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let rel = path.strip_prefix(base).unwrap_or(&path).to_path_buf();
        if meta.is_dir() {
            walk_devices(base, &path, out, depth + 1);
        } else if let Some(d) = device(&meta, rel) {
            out.push(d);
        }
    }
}

/// The daemon's capability bounding set: what "ALL" and privileged give.
pub fn bounding_set() -> Option<Vec<Capability>> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))?
        .trim();
    let bits = u64::from_str_radix(hex, 16).ok()?;
    Some(
        crust_oci::ALL_CAPABILITIES
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1u64 << i) != 0)
            .map(|(_, c)| *c)
            .collect(),
    )
}

/// Node facts for every spec, detected once at start.
pub fn runtime_facts(cgroups: &crust_cgroups::CgroupFs, systemd: bool) -> RuntimeFacts {
    let min_oom = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    RuntimeFacts {
        cgroup_v2: cgroups.hierarchy().is_unified(),
        cgroup_driver: if systemd {
            crust_oci::CgroupDriver::Systemd
        } else {
            crust_oci::CgroupDriver::Cgroupfs
        },
        min_oom_score_adj: min_oom,
        swap_available: cgroups.swap_accounting(),
        hugetlb_available: cgroups.has_controller(crust_cgroups::Controller::Hugetlb),
        // Per handler: set at CreateContainer from its features.
        rro_supported: false,
        node_hostname: nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        all_capabilities: bounding_set(),
        ..RuntimeFacts::default()
    }
}
