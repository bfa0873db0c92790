//! Running a CNI plugin binary, and the iptables tools for what plugins
//! left behind: the crate's only process spawns, part of the daemon's
//! audited spawn path.

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
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let Some(done) = communicate(&mut cmd, path, stdin, MAX_STDOUT, timeout).await? else {
        return Err(Error::Timeout {
            plugin: plugin.to_string(),
            command,
            seconds: timeout.as_secs(),
        });
    };
    let Finished {
        status,
        out,
        out_truncated,
        err,
    } = done;

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

/// Appended to the daemon's PATH for plugins and tools: portmap and bridge
/// run `iptables`, which lives in sbin.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The daemon's PATH with [`SYSTEM_PATH`]'s dirs it lacks appended.
pub(crate) fn search_path() -> String {
    let mut path = std::env::var("PATH").unwrap_or_default();
    for dir in SYSTEM_PATH.split(':') {
        if !path.split(':').any(|p| p == dir) {
            if !path.is_empty() {
                path.push(':');
            }
            path.push_str(dir);
        }
    }
    path
}

/// Runs the system tool `name` (found in [`search_path`]) with `args` and
/// `stdin`, and returns its stdout if it succeeded; None if the tool is
/// not installed. Killed like a plugin on timeout or daemon death.
pub(crate) async fn run_tool(
    name: &'static str,
    args: &[&str],
    stdin: &[u8],
    timeout: Duration,
) -> Result<Option<Vec<u8>>, Error> {
    use std::os::unix::fs::PermissionsExt;
    let path = search_path();
    let Some(program) = path
        .split(':')
        .filter(|d| d.starts_with('/'))
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    else {
        return Ok(None);
    };
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(args).env_clear().env("PATH", &path);
    // A nat table of a big node is a few MiB.
    let Some(done) = communicate(&mut cmd, &program, stdin, 64 << 20, timeout).await? else {
        return Err(Error::ToolFailed {
            tool: name,
            why: format!("timed out after {}s", timeout.as_secs()),
        });
    };
    let Finished {
        status,
        out,
        out_truncated: truncated,
        err,
    } = done;
    if !status.success() || truncated {
        let why = if truncated {
            "output too large".to_string()
        } else {
            format!("{status}: {}", String::from_utf8_lossy(&err).trim())
        };
        return Err(Error::ToolFailed { tool: name, why });
    }
    Ok(Some(out))
}

/// What a child run by [`communicate`] left.
struct Finished {
    status: std::process::ExitStatus,
    out: Vec<u8>,
    /// More than the cap came on stdout.
    out_truncated: bool,
    /// The start of stderr (for error messages).
    err: Vec<u8>,
}

/// Spawns `cmd` in `/` with its stdio piped, feeds it `stdin`, reads
/// stdout (at most `max_out` bytes kept) and stderr, and waits for it;
/// None when `timeout` passed first. The child is killed when the future
/// is dropped or the daemon dies.
async fn communicate(
    cmd: &mut tokio::process::Command,
    program: &Path,
    stdin: &[u8],
    max_out: usize,
    timeout: Duration,
) -> Result<Option<Finished>, Error> {
    cmd.current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A plugin must not outlive a daemon killed mid-ADD: a recovery's DEL
    // would race its half-done work, and a hanging one would run on.
    crust_linux::spawn::die_with_parent(cmd.as_std_mut());
    let mut child = spawn(cmd, program).await?;
    let (Some(mut child_stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(Error::Spawn {
            path: program.to_path_buf(),
            source: std::io::Error::other("stdio not captured"),
        });
    };
    let run = async move {
        let feed = async {
            // A child may exit without reading all of stdin; its exit
            // status tells what happened, not our broken pipe.
            let _ = child_stdin.write_all(stdin).await;
            drop(child_stdin);
        };
        let ((), out, err) = tokio::join!(
            feed,
            read_capped(stdout, max_out),
            read_capped(stderr, MAX_STDERR)
        );
        (child.wait().await, out, err)
    };
    let Ok((status, out, err)) = tokio::time::timeout(timeout, run).await else {
        return Ok(None);
    };
    let io = |source| Error::Spawn {
        path: program.to_path_buf(),
        source,
    };
    let status = status.map_err(io)?;
    let (out, out_truncated) = out.map_err(io)?;
    let (err, _) = err.unwrap_or_default();
    Ok(Some(Finished {
        status,
        out,
        out_truncated,
        err,
    }))
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
