//! Whether a pod's user namespace can reach crust's `--root`: the pause
//! process's and the containers' root file systems live under it, and the
//! runtime mounts them from inside the user namespace, as host users the
//! pod maps. A directory on the way (a 0700 temp dir of root's) that they
//! cannot search made the pause process fail with an opaque EACCES.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crust_linux::ns::UserNsMappings;

/// Who must be able to search the directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Searcher {
    /// Any user that is neither owner nor group (the daemon's start check:
    /// it does not know pods' mappings yet).
    Others,
    /// The host ids a pod maps: `[first, first + length)` of uids, of gids.
    Mapped { uids: (u32, u32), gids: (u32, u32) },
}

impl Searcher {
    /// The host ids of a pod's mappings (kubelet's: one of each).
    pub fn mapped(m: &UserNsMappings) -> Searcher {
        let range = |maps: &[crust_linux::ns::IdMap]| {
            maps.first().map_or((0, 0), |m| (m.host_id, m.length))
        };
        Searcher::Mapped {
            uids: range(&m.uids),
            gids: range(&m.gids),
        }
    }
}

/// A directory the searcher cannot search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub dir: PathBuf,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (mode {:04o}, owner {}:{})",
            self.dir.display(),
            self.mode & 0o7777,
            self.uid,
            self.gid
        )
    }
}

/// Whether a directory with this mode and owner lets `who` search it.
pub fn searchable(mode: u32, uid: u32, gid: u32, who: Searcher) -> bool {
    let within = |id: u32, (first, len): (u32, u32)| id >= first && id - first < len;
    mode & 0o001 != 0
        || match who {
            Searcher::Others => false,
            Searcher::Mapped { uids, gids } => {
                (within(uid, uids) && mode & 0o100 != 0) || (within(gid, gids) && mode & 0o010 != 0)
            }
        }
}

/// The first directory from `/` down to `path` (itself included, symlinks
/// resolved as the kernel would) that `who` cannot search.
pub fn first_unsearchable(path: &Path, who: Searcher) -> io::Result<Option<Blocked>> {
    let path = std::fs::canonicalize(path)?;
    let mut dirs: Vec<&Path> = path.ancestors().collect();
    dirs.reverse();
    for dir in dirs {
        let m = std::fs::metadata(dir)?;
        if !searchable(m.mode(), m.uid(), m.gid(), who) {
            return Ok(Some(Blocked {
                dir: dir.to_path_buf(),
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
            }));
        }
    }
    Ok(None)
}

impl super::Pods {
    /// RunPodSandbox with a user namespace: FailedPrecondition naming the
    /// directory on the way to `--root` that the pod's mapped users cannot
    /// search. A directory that cannot be read at all is left to the steps
    /// that need it.
    pub(super) async fn check_root_searchable(
        &self,
        m: &UserNsMappings,
    ) -> Result<(), super::PodError> {
        let root = self
            .state_root
            .parent()
            .unwrap_or(&self.state_root)
            .to_path_buf();
        let who = Searcher::mapped(m);
        let found = {
            let root = root.clone();
            crate::tasks::blocking(move || first_unsearchable(&root, who)).await
        };
        match found {
            Ok(None) => Ok(()),
            Ok(Some(b)) => Err(super::PodError::FailedPrecondition(format!(
                "crust's --root {}: {b} cannot be searched by the host users the pod's user \
                 namespace maps, so the runtime cannot reach the pod's root file systems; \
                 make it searchable by others (o+x) or move --root",
                root.display()
            ))),
            Err(e) => {
                tracing::warn!(root = %root.display(), "checking --root for user namespaces: {e}");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: Searcher = Searcher::Mapped {
        uids: (200_000, 65536),
        gids: (200_000, 65536),
    };

    #[test]
    fn others_need_the_x_bit_for_others() {
        assert!(searchable(0o711, 0, 0, Searcher::Others));
        assert!(searchable(0o1777, 0, 0, Searcher::Others));
        assert!(!searchable(0o700, 0, 0, Searcher::Others));
        assert!(!searchable(0o770, 0, 0, Searcher::Others));
    }

    #[test]
    fn mapped_users_may_own_the_directory() {
        assert!(!searchable(0o700, 0, 0, POD));
        assert!(searchable(0o700, 200_000, 0, POD));
        assert!(searchable(0o700, 265_535, 0, POD));
        assert!(!searchable(0o700, 265_536, 0, POD));
        assert!(!searchable(0o600, 200_000, 0, POD));
        assert!(searchable(0o070, 0, 200_001, POD));
        assert!(!searchable(0o070, 0, 199_999, POD));
        // Ranges up to the last id do not overflow.
        let top = Searcher::Mapped {
            uids: (u32::MAX - 1, 2),
            gids: (0, 0),
        };
        assert!(searchable(0o700, u32::MAX, 0, top));
        assert!(!searchable(0o070, 0, 0, top));
    }

    #[test]
    fn the_first_blocking_ancestor_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let private = tmp.path().join("private");
        let root = private.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let b = first_unsearchable(&root, Searcher::Others)
            .unwrap()
            .unwrap();
        assert_eq!(b.dir, std::fs::canonicalize(&private).unwrap());
        assert_eq!(b.mode & 0o7777, 0o700);
        assert!(b.to_string().contains("mode 0700"), "{b}");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(first_unsearchable(&root, POD).unwrap(), None);
        assert!(first_unsearchable(&tmp.path().join("missing"), POD).is_err());
    }
}
