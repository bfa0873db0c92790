//! AppArmor on the node, as the daemon needs it: is it on ([`detect`]),
//! is a profile loaded ([`AppArmor::is_loaded`]), and crust's own default
//! profile ([`default_profile::render`]) loaded when missing
//! ([`AppArmor::ensure_default`]), the way containerd keeps its
//! `cri-containerd.apparmor.d`.
//!
//! Applying a profile is not here: the OCI runtime does it from the spec's
//! `process.apparmorProfile` (libcontainer's init and crust's embedded exec
//! write `exec <profile>` to `/proc/self/attr/apparmor/exec`; runc does the
//! same).
//!
//! The seams: the kernel's files are read at paths the caller chooses
//! ([`KernelPaths`], tempdirs in the unit tests), and loading goes through
//! the [`Parser`] trait ([`ApparmorParser`] runs the real
//! `apparmor_parser`).

pub mod default_profile;

use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crust_quote::{clip, quote};

/// The name of crust's default profile.
pub const DEFAULT_PROFILE: &str = "crust-default";

/// Where the kernel says whether AppArmor is enabled (`Y`/`N`).
pub const ENABLED_PARAMETER: &str = "/sys/module/apparmor/parameters/enabled";

/// AppArmor's directory in securityfs.
pub const SECURITYFS_DIR: &str = "/sys/kernel/security/apparmor";

/// Where `apparmor_parser` resolves `abi <...>` and includes.
pub const POLICY_DIR: &str = "/etc/apparmor.d";

/// The policy ABI crust's default profile pins when the node has it.
pub const PINNED_ABI: &str = "abi/3.0";

/// Where `apparmor_parser` is looked for when it is not in `PATH` (a
/// daemon started by an init system often has no sbin in its PATH).
const PARSER_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Most bytes of apparmor_parser's stderr kept for an error.
const MAX_PARSER_OUTPUT: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the loaded AppArmor profiles ({}): {source}", path.display())]
    ReadProfiles { path: PathBuf, source: io::Error },
    #[error("apparmor_parser not found in PATH nor in {PARSER_DIRS:?}")]
    ParserMissing,
    #[error("running {}: {source}", path.display())]
    RunParser { path: PathBuf, source: io::Error },
    #[error("apparmor_parser refused the profile ({status}): {}", clip(stderr))]
    ParserFailed { status: String, stderr: String },
    #[error(
        "AppArmor profile {} is still not loaded after apparmor_parser succeeded",
        quote(name)
    )]
    NotLoadedAfterLoad { name: String },
}

/// Whether the node enforces AppArmor profiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Enabled,
    /// Why not, for the daemon's log and Status.
    Disabled(String),
}

/// The kernel files [`detect`] and [`AppArmor`] read.
#[derive(Debug, Clone)]
pub struct KernelPaths {
    /// `/sys/module/apparmor/parameters/enabled`.
    pub enabled: PathBuf,
    /// `/sys/kernel/security/apparmor`.
    pub securityfs: PathBuf,
}

impl Default for KernelPaths {
    fn default() -> Self {
        KernelPaths {
            enabled: ENABLED_PARAMETER.into(),
            securityfs: SECURITYFS_DIR.into(),
        }
    }
}

impl KernelPaths {
    fn profiles(&self) -> PathBuf {
        self.securityfs.join("profiles")
    }
}

/// AppArmor is usable when the module says `Y` and securityfs shows its
/// profile list (without it nothing can be checked or loaded), as runc and
/// containerd decide.
pub fn detect(paths: &KernelPaths) -> Availability {
    match std::fs::read(&paths.enabled) {
        Ok(v) if v.first() == Some(&b'Y') => {}
        Ok(_) => return Availability::Disabled("the AppArmor module is disabled".into()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Availability::Disabled("the kernel has no AppArmor".into());
        }
        Err(e) => {
            return Availability::Disabled(format!("reading {}: {e}", paths.enabled.display()));
        }
    }
    match std::fs::metadata(paths.profiles()) {
        Ok(_) => Availability::Enabled,
        Err(e) => Availability::Disabled(format!(
            "AppArmor is enabled but {} is not readable (is securityfs mounted?): {e}",
            paths.profiles().display()
        )),
    }
}

/// Loads (or replaces) policy text in the kernel.
pub trait Parser: Send + Sync {
    fn load(&self, policy: &str) -> Result<(), Error>;
}

/// The real `apparmor_parser`: `--replace --skip-cache`, the policy on
/// stdin (no temporary file to clean up).
#[derive(Debug, Clone)]
pub struct ApparmorParser {
    pub path: PathBuf,
}

impl ApparmorParser {
    /// Finds `apparmor_parser` in `PATH`, else in the usual sbin dirs.
    pub fn find() -> Result<ApparmorParser, Error> {
        let path_var = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path_var)
            .chain(PARSER_DIRS.iter().map(PathBuf::from))
            .map(|d| d.join("apparmor_parser"))
            .find(|p| p.is_file())
            .map(|path| ApparmorParser { path })
            .ok_or(Error::ParserMissing)
    }
}

impl Parser for ApparmorParser {
    fn load(&self, policy: &str) -> Result<(), Error> {
        let run = |source| Error::RunParser {
            path: self.path.clone(),
            source,
        };
        let mut child = Command::new(&self.path)
            .args(["--replace", "--skip-cache"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(run)?;
        let written = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(policy.as_bytes()))
            .unwrap_or(Ok(()));
        let out = child.wait_with_output().map_err(run)?;
        if out.status.success() {
            // A parser that succeeded without reading it all: say so.
            return written.map_err(run);
        }
        // A parser that failed early leaves a broken pipe: its own words
        // say more.
        let cut = out.stderr.len().min(MAX_PARSER_OUTPUT);
        Err(Error::ParserFailed {
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr[..cut])
                .trim()
                .to_string(),
        })
    }
}

/// Whether the load in [`AppArmor::ensure_default`] was needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// It was loaded already (by an earlier daemon, or another call).
    Already,
    /// This call loaded it.
    Now,
}

/// AppArmor on a node where [`detect`] said [`Availability::Enabled`].
pub struct AppArmor {
    paths: KernelPaths,
    parser: Box<dyn Parser>,
    default_name: String,
    default_policy: String,
    /// One load at a time: concurrent CreateContainers that find the
    /// default missing load it once.
    loading: Mutex<()>,
}

impl AppArmor {
    /// `abi`: the ABI to pin in the default profile (see
    /// [`node_abi`]).
    pub fn new(paths: KernelPaths, parser: Box<dyn Parser>, abi: Option<&str>) -> AppArmor {
        AppArmor {
            paths,
            parser,
            default_name: DEFAULT_PROFILE.into(),
            default_policy: default_profile::render(DEFAULT_PROFILE, abi),
            loading: Mutex::new(()),
        }
    }

    /// The name of the default profile.
    pub fn default_name(&self) -> &str {
        &self.default_name
    }

    /// The text of the default profile as it is loaded.
    pub fn default_policy(&self) -> &str {
        &self.default_policy
    }

    /// Whether a profile of exactly this name is loaded (any mode). Reads
    /// securityfs' list line by line (`name (mode)`), so a node with
    /// thousands of profiles costs no big buffer.
    pub fn is_loaded(&self, name: &str) -> Result<bool, Error> {
        let path = self.paths.profiles();
        let read = |source| Error::ReadProfiles {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(&path).map_err(read)?;
        for line in BufReader::new(file).split(b'\n') {
            let line = line.map_err(read)?;
            if profile_name(&line) == Some(name.as_bytes()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Loads the default profile unless it is loaded already.
    pub fn ensure_default(&self) -> Result<Loaded, Error> {
        if self.is_loaded(&self.default_name)? {
            return Ok(Loaded::Already);
        }
        let _one = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_loaded(&self.default_name)? {
            return Ok(Loaded::Already);
        }
        self.parser.load(&self.default_policy)?;
        if !self.is_loaded(&self.default_name)? {
            return Err(Error::NotLoadedAfterLoad {
                name: self.default_name.clone(),
            });
        }
        Ok(Loaded::Now)
    }
}

/// The ABI to pin when the node's policy dir has it.
pub fn node_abi(policy_dir: &Path) -> Option<&'static str> {
    policy_dir.join(PINNED_ABI).is_file().then_some(PINNED_ABI)
}

/// The name in a line of securityfs' `profiles`: `name (mode)`. Names may
/// hold spaces, so the mode is cut at the last ` (`.
fn profile_name(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let cut = line.windows(2).rposition(|w| w == b" (")?;
    line.ends_with(b")").then_some(&line[..cut])
}

#[cfg(test)]
mod tests;
