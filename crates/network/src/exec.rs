//! Running a CNI plugin binary: the crate's only process spawn, part of the
//! daemon's audited spawn path.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::Error;

/// Largest result a plugin may print; real ones are a few KiB.
const MAX_STDOUT: usize = 1 << 20;
/// How much of stderr is kept for error messages.
const MAX_STDERR: usize = 16 << 10;

/// A plugin's error JSON (spec: "Error" result type).
#[derive(Deserialize)]
struct PluginError {
    code: u64,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// Runs the plugin at `path` with exactly `env` (the environment is not
/// inherited) and `stdin`, and returns its stdout if it succeeded. The
/// process is killed when `timeout` passes, the returned future is
/// dropped, or the daemon dies (call it from an async task: the spawning
/// thread must be a runtime worker, see `crust_linux::spawn`).
pub(crate) async fn run_plugin(
    plugin: &str,
    command: &'static str,
    path: &Path,
    env: &[(&str, String)],
    stdin: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let mut cmd = tokio::process::Command::new(path);
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A plugin must not outlive a daemon killed mid-ADD: a recovery's DEL
    // would race its half-done work, and a hanging one would run on.
    crust_linux::spawn::die_with_parent(cmd.as_std_mut());
    let mut child = spawn(&mut cmd, path).await?;
    let (Some(mut child_stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(Error::Spawn {
            path: path.to_path_buf(),
            source: std::io::Error::other("plugin stdio not captured"),
        });
    };

    let run = async move {
        let feed = async {
            // A plugin may exit without reading all of stdin; its exit
            // status tells what happened, not our broken pipe.
            let _ = child_stdin.write_all(stdin).await;
            drop(child_stdin);
        };
        let ((), out, err) = tokio::join!(
            feed,
            read_capped(stdout, MAX_STDOUT),
            read_capped(stderr, MAX_STDERR)
        );
        let status = child.wait().await;
        (status, out, err)
    };
    let Ok((status, out, err)) = tokio::time::timeout(timeout, run).await else {
        return Err(Error::Timeout {
            plugin: plugin.to_string(),
            command,
            seconds: timeout.as_secs(),
        });
    };
    let status = status.map_err(|source| Error::Spawn {
        path: path.to_path_buf(),
        source,
    })?;
    let (out, out_truncated) = out.map_err(|source| Error::Spawn {
        path: path.to_path_buf(),
        source,
    })?;
    let (err, _) = err.unwrap_or_default();

    if status.success() {
        if out_truncated {
            return Err(Error::InvalidResult {
                plugin: plugin.to_string(),
                why: format!("output larger than {MAX_STDOUT} bytes"),
            });
        }
        return Ok(out);
    }
    if let Ok(e) = serde_json::from_slice::<PluginError>(&out) {
        return Err(Error::Plugin {
            plugin: plugin.to_string(),
            command,
            code: e.code,
            msg: e.msg,
            details: e.details,
        });
    }
    let output = [err, out]
        .iter()
        .map(|b| String::from_utf8_lossy(b).trim().to_string())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Err(Error::PluginExit {
        plugin: plugin.to_string(),
        command,
        status: status.to_string(),
        output: if output.is_empty() {
            "no output".into()
        } else {
            output
        },
    })
}

/// Spawns, retrying briefly on ETXTBSY: a binary just written (an upgrade,
/// a test's fake plugin) can still be open for writing in a process that
/// another thread forked meanwhile.
async fn spawn(
    cmd: &mut tokio::process::Command,
    path: &Path,
) -> Result<tokio::process::Child, Error> {
    let mut delay = Duration::from_millis(10);
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Ok(child) => return Ok(child),
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && attempts < 5 => {
                attempts += 1;
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(source) => {
                return Err(Error::Spawn {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
}

/// ETXTBSY on Linux (all architectures), without a libc dependency.
const ETXTBSY: i32 = 26;

/// Reads all of `r`, keeping at most `limit` bytes; the flag tells whether
/// more came. Draining the rest keeps the plugin from blocking on a full
/// pipe.
async fn read_capped(
    mut r: impl AsyncRead + Unpin,
    limit: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, truncated));
        }
        let room = limit.saturating_sub(kept.len());
        if n > room {
            truncated = true;
        }
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}
