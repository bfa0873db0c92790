//! What a run tells the tests through its environment: the `crust`
//! binary under test, the cgroup driver of the test daemons, and how much
//! slower than the development host the machine is.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `crust` binary under test: `$CRUST_BIN`, else the one cargo built next
/// to this test binary (`make test` builds it first).
pub fn crust_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CRUST_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>/crust
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("crust"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "{} not found: build it with `cargo build --bins` (make test does)",
        bin.display()
    );
    bin
}

/// The environment variable that picks the cgroup driver of every test
/// daemon (`--cgroup-driver`): `cgroupfs` or `systemd`. Unset: the daemon's
/// default (cgroupfs). The VM test bed (hack/vm) runs the suites once with
/// each.
pub const CGROUP_DRIVER_ENV: &str = "CRUST_TEST_CGROUP_DRIVER";

pub(crate) fn cgroup_driver_from_env() -> Option<&'static str> {
    let value = std::env::var(CGROUP_DRIVER_ENV).ok()?;
    match value.as_str() {
        "cgroupfs" => Some("cgroupfs"),
        "systemd" => Some("systemd"),
        "" => None,
        other => panic!("{CGROUP_DRIVER_ENV}={other:?}: expected cgroupfs or systemd"),
    }
}

/// The cgroup driver the test daemons run with (see [`CGROUP_DRIVER_ENV`]),
/// for assertions that depend on it.
pub fn cgroup_driver() -> &'static str {
    cgroup_driver_from_env().unwrap_or("cgroupfs")
}

/// The environment variable that says how many times slower than this
/// host the machine under test is (a float, default 1): the VM test bed
/// (hack/vm, TCG emulation) sets it. Deadlines that wait for real work
/// (a daemon to start, a CNI plugin to run) scale with it through
/// [`patience`]; a test never measures performance (that is `make bench`).
pub const SLOWDOWN_ENV: &str = "CRUST_TEST_SLOWDOWN";

/// `deadline` scaled by [`SLOWDOWN_ENV`]: how long to wait here for what
/// takes at most `deadline` on the development host.
pub fn patience(deadline: Duration) -> Duration {
    let factor = std::env::var(SLOWDOWN_ENV)
        .ok()
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|f| f.is_finite() && *f >= 1.0)
                .unwrap_or_else(|| panic!("{SLOWDOWN_ENV}={s:?}: expected a number >= 1"))
        })
        .unwrap_or(1.0);
    deadline.mul_f64(factor)
}
