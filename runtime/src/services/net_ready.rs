//! Status's NetworkReady: the verdict of the CNI config dir, parsed again
//! only when the dir or one of its files changed. kubelet polls Status
//! every few seconds, and reading and parsing the config on every call was
//! most of what Status cost; a `stat` of the dir and of each file it holds
//! tells whether anything changed (a file added, removed, renamed,
//! rewritten, or a symlink's target changed).

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crust_network::config as cni_config;

/// A file changed this recently may change again within the same
/// timestamp tick and look unchanged: such a dir is not cached (as git
/// treats "racily clean" files). Generous for filesystems with 1 s stamps.
const RACY: Duration = Duration::from_secs(2);

/// What a `stat` says of one file (followed through symlinks, as the
/// loader reads it): any change to it changes one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Changed within [`RACY`] of `now` (or in the future).
    fn is_recent(&self, now: SystemTime) -> bool {
        let latest = self.mtime.max(self.ctime);
        let Ok(since_epoch) = now.duration_since(SystemTime::UNIX_EPOCH) else {
            return true;
        };
        let at = Duration::new(
            latest.0.max(0) as u64,
            latest.1.clamp(0, 999_999_999) as u32,
        );
        since_epoch.saturating_sub(at) < RACY
    }
}

/// The dir's state when its verdict was taken: the dir itself and every
/// entry in it (`None`: an entry that cannot be stat'ed, e.g. a dangling
/// symlink).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    dir: Stamp,
    files: Vec<(OsString, Option<Stamp>)>,
}

impl Snapshot {
    /// The dir's state now, if it can be trusted to show later changes.
    fn take(dir: &Path) -> Option<Snapshot> {
        let now = SystemTime::now();
        let dir_stamp = Stamp::of(dir)?;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).ok()? {
            let entry = entry.ok()?;
            files.push((entry.file_name(), Stamp::of(&entry.path())));
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        let recent = dir_stamp.is_recent(now)
            || files
                .iter()
                .any(|(_, s)| s.as_ref().is_some_and(|s| s.is_recent(now)));
        (!recent).then_some(Snapshot {
            dir: dir_stamp,
            files,
        })
    }

    /// Nothing changed since the snapshot: a `stat` of the dir (entries
    /// added, removed or renamed change it) and of each file.
    fn still_holds(&self, dir: &Path) -> bool {
        Stamp::of(dir).as_ref() == Some(&self.dir)
            && self
                .files
                .iter()
                .all(|(name, stamp)| Stamp::of(&dir.join(name)) == *stamp)
    }
}

/// The network's readiness: Ok, or why not (for the condition's message).
pub type Verdict = Result<(), String>;

/// The last verdict and the state of the dir it was taken from.
#[derive(Default)]
pub struct NetworkReadiness {
    last: Mutex<Option<(Snapshot, Verdict)>>,
}

impl NetworkReadiness {
    /// Whether `dir` holds a valid network config now.
    pub fn check(&self, dir: &Path) -> Verdict {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((snapshot, verdict)) = last.as_ref()
            && snapshot.still_holds(dir)
        {
            return verdict.clone();
        }
        // Taken before the load: a change during the load shows as a
        // different dir next time.
        let snapshot = Snapshot::take(dir);
        let verdict = cni_config::load_default(dir)
            .map(drop)
            .map_err(|e| e.to_string());
        *last = snapshot.map(|s| (s, verdict.clone()));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{"cniVersion":"1.0.0","name":"t","plugins":[{"type":"loopback"}]}"#;

    /// Makes every stamp in `dir` old enough to be trusted.
    fn age(dir: &Path) {
        let old = SystemTime::now() - Duration::from_secs(60);
        let set = |p: &Path| {
            std::fs::File::open(p)
                .unwrap()
                .set_modified(old)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        for e in std::fs::read_dir(dir).unwrap() {
            set(&e.unwrap().path());
        }
        set(dir);
    }

    #[test]
    fn recent_dirs_are_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("10.conflist"), VALID).unwrap();
        // ctime cannot be set back: a just-written dir is never cached.
        assert!(Snapshot::take(dir.path()).is_none());
        let r = NetworkReadiness::default();
        assert!(r.check(dir.path()).is_ok());
        assert!(r.last.lock().unwrap().is_none());
    }

    #[test]
    fn a_snapshot_sees_every_kind_of_change() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("10.conflist");
        std::fs::write(&file, VALID).unwrap();
        let now = SystemTime::now();
        // As Snapshot::take would see it once old enough (the test cannot
        // wait for ctime to age).
        let taken = |p: &Path| Snapshot {
            dir: Stamp::of(p).unwrap(),
            files: vec![("10.conflist".into(), Stamp::of(&p.join("10.conflist")))],
        };
        let s = taken(dir.path());
        assert!(s.dir.is_recent(now));
        assert!(s.still_holds(dir.path()));
        // Rewritten in place, same size.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&file, VALID.replace("\"t\"", "\"u\"")).unwrap();
        assert!(!s.still_holds(dir.path()));
        // A file added.
        let s = taken(dir.path());
        std::fs::write(dir.path().join("05.conf"), "{").unwrap();
        assert!(!s.still_holds(dir.path()));
        // A file removed.
        std::fs::remove_file(dir.path().join("05.conf")).unwrap();
        let s = taken(dir.path());
        std::fs::remove_file(&file).unwrap();
        assert!(!s.still_holds(dir.path()));
    }

    #[test]
    fn mtimes_set_back_do_not_hide_a_recent_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("10.conflist"), VALID).unwrap();
        age(dir.path());
        // mtime is old, but ctime says the file just changed.
        assert!(Snapshot::take(dir.path()).is_none());
    }
}
