//! Pre-installed plugins: executables named `NN-name` in `plugin_path`,
//! started by the runtime with a connected socket.
//!
//! NRI hands the plugin its end of a socket pair as an inherited file
//! descriptor and names it in `NRI_PLUGIN_SOCKET` (with `NRI_PLUGIN_NAME`
//! and `NRI_PLUGIN_IDX`). containerd places it at fd 3; placing a
//! descriptor at an arbitrary number needs code between fork and exec,
//! which this crate does not run, so crust passes it as the plugin's
//! standard input and says `NRI_PLUGIN_SOCKET=0`. Plugins read the number
//! from the variable (containerd/nri's stub does), so they work unchanged.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::api::{PLUGIN_IDX_ENV, PLUGIN_NAME_ENV, PLUGIN_SOCKET_ENV, parse_plugin_file_name};

pub(crate) struct Discovered {
    pub index: String,
    pub base: String,
    pub path: PathBuf,
    pub config: String,
}

/// Lists the plugins to start, in file-name order. Entries that are not
/// executable files are ignored; badly named executables are skipped with a
/// warning (one stray file must not keep the others from running).
pub(crate) fn discover(plugin_path: &Path, config_path: &Path) -> std::io::Result<Vec<Discovered>> {
    let entries = match std::fs::read_dir(plugin_path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            continue;
        }
        let file = entry.file_name().to_string_lossy().into_owned();
        let (index, base) = match parse_plugin_file_name(&file) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), "not starting NRI plugin: {e}");
                continue;
            }
        };
        let config = read_config(config_path, index, base)?;
        out.push(Discovered {
            index: index.into(),
            base: base.into(),
            path: entry.path(),
            config,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// `NN-name.conf`, else `name.conf`, else no configuration.
fn read_config(dir: &Path, index: &str, base: &str) -> std::io::Result<String> {
    for file in [format!("{index}-{base}.conf"), format!("{base}.conf")] {
        match std::fs::read_to_string(dir.join(file)) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(String::new())
}

/// Starts `plugin` with one end of a socket pair; returns the other end.
pub(crate) fn start(
    plugin: &Discovered,
) -> std::io::Result<(tokio::process::Child, tokio::net::UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let child = tokio::process::Command::new(&plugin.path)
        .env_clear()
        .env(PLUGIN_NAME_ENV, &plugin.base)
        .env(PLUGIN_IDX_ENV, &plugin.index)
        .env(PLUGIN_SOCKET_ENV, "0")
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    Ok((child, tokio::net::UnixStream::from_std(ours)?))
}
