//! A noisy neighbour: a thread that keeps mounting and unmounting a tmpfs
//! and renaming files and directories while a suite runs, so that the
//! kernel's transient answers a busy node gives (openat2 `RESOLVE_*`
//! lookups through `..` answer EAGAIN when any mount or rename happens on
//! the system meanwhile: the global mount_lock and rename_lock sequence
//! counts) show up in `make test` instead of in production.
//!
//! Every [`Daemon`](crate::Daemon) holds a [`NoisyGuard`]: the neighbour runs
//! while any daemon of the test process does. `CRUST_TEST_NOISY=0` turns it
//! off; `CRUST_TEST_NOISY=<n>` sets `n` renames per second (and `n/20`
//! mount cycles).
//!
//! Nothing of it is visible to the host or can be left behind: the thread
//! has a mount namespace of its own (`unshare(CLONE_NEWNS)`, everything
//! private), whose root it replaces by a tmpfs of its own (`pivot_root`,
//! then the copied host mounts are detached, so it holds no reference to
//! another test's mounts or network namespaces). Its mounts and files live
//! in that tmpfs and go with the namespace when the thread ends: when
//! stopped, when the test panics (the guard's drop), or when the process
//! is killed (the kernel tears the namespace down). The mount lock and the
//! rename lock are global all the same, so the host's lookups see the
//! noise.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};

/// Set to `0` to turn the noisy neighbour off, or to a number of renames
/// per second.
pub const NOISY_ENV: &str = "CRUST_TEST_NOISY";

/// How much noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Renames per second (a file and a directory in turn).
    pub renames_per_sec: u32,
    /// Mount + unmount cycles of a tmpfs per second.
    pub mounts_per_sec: u32,
}

impl Rate {
    /// The suites' default: one rename every 250 µs and a tmpfs mounted and
    /// unmounted every 5 ms; about 6 % of one core while it runs (measured
    /// on the 2-core test host).
    pub const DEFAULT: Rate = Rate {
        renames_per_sec: 4000,
        mounts_per_sec: 200,
    };

    /// The rate `CRUST_TEST_NOISY` asks for; `None`: off.
    pub fn from_env() -> Option<Rate> {
        match std::env::var(NOISY_ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("1") | Some("on") => Some(Rate::DEFAULT),
            Some("0") | Some("off") => None,
            Some(n) => match n.parse::<u32>() {
                Ok(n) => Some(Rate {
                    renames_per_sec: n,
                    mounts_per_sec: (n / 20).max(1),
                }),
                Err(_) => panic!("{NOISY_ENV}={n:?}: 0, 1 or a number of renames per second"),
            },
        }
    }
}

/// What a neighbour did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub renames: u64,
    pub mounts: u64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    renames: AtomicU64,
    mounts: AtomicU64,
}

/// A running noisy neighbour; stopped (and everything of it gone) on drop
/// or by [`Noisy::stop`].
pub struct Noisy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Noisy {
    /// Starts a neighbour at `rate`. Where it cannot have a mount namespace
    /// of its own (not root), it renames only, in a temp dir of its own.
    pub fn start(rate: Rate) -> Noisy {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("noisy-neighbour".into())
            .spawn(move || {
                if let Err(e) = make_noise(&s, rate) {
                    eprintln!("noisy neighbour stopped: {e}");
                }
            })
            .expect("spawn the noisy neighbour");
        Noisy {
            shared,
            thread: Some(thread),
        }
    }

    /// What it did so far.
    pub fn counts(&self) -> Counts {
        Counts {
            renames: self.shared.renames.load(Ordering::Relaxed),
            mounts: self.shared.mounts.load(Ordering::Relaxed),
        }
    }

    /// Stops it, waits for its thread (its namespace and mounts go with
    /// it) and says what it did.
    pub fn stop(mut self) -> Counts {
        self.halt();
        self.counts()
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Noisy {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The neighbour the daemons of this process share while any of them
/// runs (see [`shared`]).
static SHARED: Mutex<(usize, Option<Noisy>)> = Mutex::new((0, None));

/// A share in the process's noisy neighbour; the last one dropped stops
/// it.
pub struct NoisyGuard(());

/// Starts the process's noisy neighbour at the rate `CRUST_TEST_NOISY`
/// asks for, or joins the running one; `None` when it is off.
pub fn shared() -> Option<NoisyGuard> {
    Rate::from_env().map(share)
}

/// A share in the process's noisy neighbour even when `CRUST_TEST_NOISY`
/// turns it off for the suites (then at [`Rate::DEFAULT`]): for the tests
/// that are about the noise.
pub fn always() -> NoisyGuard {
    share(Rate::from_env().unwrap_or(Rate::DEFAULT))
}

/// What the process's neighbour did so far (zeros when none runs).
pub fn shared_counts() -> Counts {
    let s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    s.1.as_ref().map(Noisy::counts).unwrap_or_default()
}

fn share(rate: Rate) -> NoisyGuard {
    let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if s.1.is_none() {
        s.1 = Some(Noisy::start(rate));
    }
    s.0 += 1;
    NoisyGuard(())
}

impl Drop for NoisyGuard {
    fn drop(&mut self) {
        let noisy = {
            let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            s.0 -= 1;
            if s.0 == 0 { s.1.take() } else { None }
        };
        // Joined outside the lock.
        drop(noisy);
    }
}

fn make_noise(s: &Shared, rate: Rate) -> Result<(), String> {
    // Not root (or no namespaces): renames in a temp dir on the host only.
    let fallback;
    let base = match private_root() {
        Ok(()) => Path::new("/"),
        // Half set up: this thread's namespace may still hold copies of the
        // host's mounts; ending the thread releases them.
        Err(Setup::Unshared(e)) => return Err(e),
        Err(Setup::NoNamespace(e)) => {
            eprintln!("noisy neighbour: renames only ({e})");
            fallback = tempfile::Builder::new()
                .prefix("crust-noisy-")
                .tempdir()
                .map_err(|e| format!("temp dir: {e}"))?;
            fallback.path()
        }
    };
    let mounts = base == Path::new("/");
    let (file, dir, mnt) = (base.join("f"), base.join("d"), base.join("m"));
    std::fs::write(&file, b"").map_err(|e| format!("create {}: {e}", file.display()))?;
    std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    std::fs::create_dir(&mnt).map_err(|e| format!("mkdir {}: {e}", mnt.display()))?;
    let moved = |p: &Path| p.with_extension("moved");
    let rename_tick = Duration::from_secs(1) / rate.renames_per_sec.max(1);
    let mount_every = (rate.renames_per_sec / rate.mounts_per_sec.max(1)).max(1) as u64;
    let start = Instant::now();
    let mut tick: u64 = 0;
    while !s.stop.load(Ordering::Relaxed) {
        let what = if tick.is_multiple_of(2) { &file } else { &dir };
        let (from, to) = if tick % 4 < 2 {
            (what.clone(), moved(what))
        } else {
            (moved(what), what.clone())
        };
        if std::fs::rename(&from, &to).is_ok() {
            s.renames.fetch_add(1, Ordering::Relaxed);
        }
        if mounts && tick.is_multiple_of(mount_every) {
            let m = nix::mount::mount(
                Some("noisy"),
                &mnt,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=64k"),
            );
            if m.is_ok() && nix::mount::umount2(&mnt, MntFlags::empty()).is_ok() {
                s.mounts.fetch_add(1, Ordering::Relaxed);
            }
        }
        tick += 1;
        // Paced against the clock: a late wake-up does not lower the rate
        // for long, and an early one never raises it.
        let due = start + rename_tick * u32::try_from(tick).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// Gives this thread a mount namespace of its own whose root is a fresh
/// tmpfs and that holds nothing of the host's (the copies unshare made are
/// detached at once).
fn private_root() -> Result<(), Setup> {
    use nix::sched::{CloneFlags, unshare};
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| Setup::NoNamespace(format!("unshare(CLONE_NEWNS): {e}")))?;
    set_up_root().map_err(Setup::Unshared)
}

/// Why [`private_root`] failed.
enum Setup {
    /// No namespace of its own (not root): renames on the host will do.
    NoNamespace(String),
    /// A namespace of its own, not set up.
    Unshared(String),
}

fn set_up_root() -> Result<(), String> {
    // From here on this thread's namespace: nothing propagates to the host.
    let none = None::<&str>;
    nix::mount::mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| format!("make / private: {e}"))?;
    let at = std::env::temp_dir();
    nix::mount::mount(
        Some("noisy-root"),
        &at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=1m,mode=0700"),
    )
    .map_err(|e| format!("mount a tmpfs on {}: {e}", at.display()))?;
    nix::unistd::chdir(&at).map_err(|e| format!("chdir: {e}"))?;
    // pivot_root(".", "."): the old root ends up stacked on the new one and
    // is detached with everything mounted below it.
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    nix::mount::umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_makes_noise_and_leaves_nothing_on_the_host() {
        let before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let n = Noisy::start(Rate {
            renames_per_sec: 2000,
            mounts_per_sec: 100,
        });
        std::thread::sleep(Duration::from_millis(300));
        let during = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let counts = n.stop();
        assert!(counts.renames > 100, "{counts:?}");
        if nix::unistd::geteuid().is_root() {
            assert!(counts.mounts > 5, "{counts:?}");
        }
        // The host's mount table never saw the neighbour's mounts.
        assert!(!during.contains("noisy"), "{during}");
        assert!(!before.contains("noisy"), "{before}");
    }

    #[test]
    fn shares_are_counted() {
        let g1 = share(Rate::DEFAULT);
        let g2 = share(Rate::DEFAULT);
        assert!(SHARED.lock().unwrap().1.is_some());
        drop(g1);
        assert!(SHARED.lock().unwrap().1.is_some());
        drop(g2);
        assert!(SHARED.lock().unwrap().1.is_none());
    }
}
