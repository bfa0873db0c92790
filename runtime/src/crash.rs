//! Crash points: the steps where the kill-at-every-step test
//! (`tests/tests/crash.rs`) kills the daemon, one after each step that
//! persists something or changes the node.
//!
//! In debug builds, with `CRUST_CRASH_POINTS=<dir>` in the daemon's
//! environment, every point reached appends its name to `<dir>/trace`
//! (how the test learns which points an RPC passes), and the point named
//! in `<dir>/at` SIGKILLs the daemon, once (the file is removed first).
//! Without the variable a point costs one look at a `OnceLock`. Release
//! builds compile [`point`] to nothing: the release binary carries no
//! such hook.

/// A crash point named `name` (`<area>.<operation>.<step done>`).
#[cfg(debug_assertions)]
pub fn point(name: &str) {
    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::OnceLock;

    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let Some(dir) = DIR.get_or_init(|| std::env::var_os("CRUST_CRASH_POINTS").map(PathBuf::from))
    else {
        return;
    };
    if let Ok(mut trace) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("trace"))
    {
        let _ = trace.write_all(format!("{name}\n").as_bytes());
    }
    let at = dir.join("at");
    if std::fs::read_to_string(&at).is_ok_and(|t| t.trim() == name) {
        let _ = std::fs::remove_file(&at);
        tracing::warn!(point = name, "crash point reached: the daemon kills itself");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Release builds: nothing.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn point(_name: &str) {}
