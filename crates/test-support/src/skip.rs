//! Counted skips: a test that cannot run on this machine (a tool, a
//! kernel feature, a cgroup layout or driver is missing) says so on one
//! `SKIPPED: <test>: <reason>` line that `make test` counts, instead of
//! returning early as if it passed.

use std::path::Path;

use crate::run_env::cgroup_driver;

/// Ends a test that cannot run here (a tool is missing, the kernel lacks a
/// feature): see [`skipped`]. `skip!("kubectl is not installed")`.
#[macro_export]
macro_rules! skip {
    ($($reason:tt)*) => {{
        $crate::skipped(&format!($($reason)*));
        return;
    }};
}

/// Says that the running test was skipped: one `SKIPPED: <test>: <reason>`
/// line on stderr, written past the test harness's capture so that it is
/// seen (and counted: `grep -c '^SKIPPED'`) in every run, passed or not.
/// A skip is never silent: a test that returns early without this reads
/// as passed.
pub fn skipped(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    let line = format!("SKIPPED: {test}: {reason}\n");
    // One write, so that lines of parallel tests do not mix.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// What a test may need of the machine it runs on. `make test` runs the
/// suites on the host (cgroup v1 hybrid, no systemd, no AppArmor) and in the
/// VM test bed (cgroup v2 alone, systemd, AppArmor; once per cgroup driver);
/// a test that needs one of these starts with [`require!`] and is counted
/// as skipped, with the reason, where it is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The unified cgroup v2 hierarchy alone at /sys/fs/cgroup.
    CgroupV2,
    /// cgroup v1 controllers at /sys/fs/cgroup (legacy or hybrid layout).
    CgroupV1,
    /// systemd is the init system (`/run/systemd/system` exists).
    Systemd,
    /// systemd is not the init system.
    NoSystemd,
    /// The test daemons use the systemd cgroup driver.
    SystemdDriver,
    /// The test daemons use the cgroupfs driver.
    CgroupfsDriver,
    /// AppArmor is enabled in the kernel and `apparmor_parser` is installed.
    AppArmor,
    /// AppArmor is not enabled.
    NoAppArmor,
    /// `runc` is in PATH.
    Runc,
    /// `crun` is in PATH.
    Crun,
}

/// Why a test cannot run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipReason(pub String);

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `None` when this machine (and run) offers `need`, else why not.
pub fn require(need: Need) -> Option<SkipReason> {
    let v2 = cgroup_v2_alone();
    let apparmor = apparmor_enabled();
    let systemd = Path::new("/run/systemd/system").is_dir();
    let (ok, why) = match need {
        Need::CgroupV2 => (v2, "needs cgroup v2 alone (this machine mounts cgroup v1)"),
        Need::CgroupV1 => (!v2, "needs cgroup v1 (this machine has cgroup v2 alone)"),
        Need::Systemd => (systemd, "needs systemd as the init system"),
        Need::NoSystemd => (!systemd, "needs a machine without systemd as init"),
        Need::SystemdDriver => (
            cgroup_driver() == "systemd",
            "needs the systemd cgroup driver (CRUST_TEST_CGROUP_DRIVER=systemd)",
        ),
        Need::CgroupfsDriver => (
            cgroup_driver() == "cgroupfs",
            "needs the cgroupfs cgroup driver (this run uses systemd)",
        ),
        Need::AppArmor => (apparmor, "needs AppArmor (kernel and apparmor_parser)"),
        Need::NoAppArmor => (!apparmor, "needs a machine without AppArmor"),
        Need::Runc => (in_path("runc"), "needs runc in PATH"),
        // crun refuses hybrid hosts (v1 controllers with cgroup2 beside
        // them: "cgroups in hybrid mode not supported").
        Need::Crun => (
            in_path("crun") && !Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists(),
            "needs crun in PATH and a cgroup layout crun supports (not hybrid v1+v2)",
        ),
    };
    (!ok).then(|| SkipReason(why.to_string()))
}

/// Reports the running test as skipped for a missing [`Need`]: the same
/// counted `SKIPPED: <test>: <reason>` line as [`skipped`]. `make test`'s
/// summaries list such tests as skipped, not passed.
pub fn report_skip(reason: &SkipReason) {
    skipped(&reason.0);
}

/// `require!(Need::A, Need::B, ...)` at the start of a test (or a helper it
/// calls): returns from it, reported as a counted skip ([`report_skip`]),
/// unless the machine offers every one of them.
#[macro_export]
macro_rules! require {
    ($($env:expr),+ $(,)?) => {
        $(
            if let Some(reason) = $crate::require($env) {
                $crate::report_skip(&reason);
                return;
            }
        )+
    };
}

fn cgroup_v2_alone() -> bool {
    nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y")
        && Path::new("/sys/kernel/security/apparmor").is_dir()
        && in_path("apparmor_parser")
}

fn in_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
