//! The `crust-shim` binary monitors run from: a sealed in-memory copy
//! ([`crust_linux::sealed`]) made once, never the file itself.
//!
//! A container's init and exec processes are forks of their monitor, so
//! until their final `execve` (and in a `#!/proc/self/exe` script the
//! container runs) `/proc/self/exe` is the monitor's executable. Run from
//! the host file, a container could execute it with its own libraries and
//! hold a descriptor to it (CVE-2019-5736); run from the sealed copy, it
//! reaches only bytes nobody can change. Exec sessions' monitors re-exec
//! `/proc/self/exe`, the same copy.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crust_linux::sealed::{SealedExecutable, sealed_copy};

use crate::error::{Error, Result};

/// A sealed copy of `crust-shim`, cheap to clone (one copy in memory).
#[derive(Debug, Clone)]
pub struct ShimBinary {
    copy: Arc<SealedExecutable>,
    origin: PathBuf,
}

impl ShimBinary {
    /// Copies and seals `path`, then runs the copy once (`--version`), so
    /// that a kernel or a policy that will not execute it shows now, not
    /// at the first container. Returns the version line it printed.
    pub fn seal(path: &Path) -> Result<(ShimBinary, String)> {
        let err = |message: String| Error::Binary {
            path: path.to_path_buf(),
            message,
        };
        let copy = sealed_copy(path, c"crust-shim").map_err(|e| {
            err(format!(
                "cannot make the sealed in-memory copy monitors run from: {e}"
            ))
        })?;
        let bin = ShimBinary {
            copy: Arc::new(copy),
            origin: path.to_path_buf(),
        };
        let out = bin
            .command()
            .arg("--version")
            .env_clear()
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| err(format!("running its sealed copy: {e}")))?;
        let line = String::from_utf8_lossy(&out.stdout);
        let line = line.lines().next().unwrap_or("").trim();
        if !out.status.success() || !line.starts_with("crust-shim ") {
            return Err(err(format!(
                "its sealed copy answered {} to --version: {:?}, not a crust-shim",
                out.status,
                line.chars().take(80).collect::<String>()
            )));
        }
        Ok((bin, line.to_string()))
    }

    /// The file the copy was made from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The size of the copy in memory.
    pub fn size(&self) -> u64 {
        self.copy.len()
    }

    /// Whether the copy's execute bits are sealed too (Linux 6.3+).
    pub fn exec_bits_sealed(&self) -> bool {
        self.copy.exec_bits_sealed()
    }

    /// A command that runs the copy, with the origin's path as `argv[0]`
    /// (what `ps` shows and what finding a monitor by its command line
    /// expects).
    pub(crate) fn command(&self) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(self.copy.exec_path());
        cmd.arg0(&self.origin);
        cmd
    }
}
