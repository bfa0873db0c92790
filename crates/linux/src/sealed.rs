//! Sealed in-memory copies of executables (CVE-2019-5736).
//!
//! A process that becomes a container's process (the init, an exec) is a
//! fork of the monitor; until its final `execve` its `/proc/self/exe` is
//! the monitor's binary, and so is the interpreter of a `#!/proc/self/exe`
//! script the container runs. If that were the host's `crust-shim` file, a
//! container could run it with its own libraries and hold a descriptor to
//! it. Monitors therefore run from a copy in a memfd, sealed so that
//! nobody can change its contents, size or execute bits, made once by the
//! daemon and shared by every monitor it starts (one copy in memory, no
//! cost per container).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MemFdCreateFlag, memfd_create};

use crate::Error;

/// `MFD_EXEC` (Linux 6.3): the memfd may be executed even where
/// `vm.memfd_noexec = 1` makes memfds non-executable by default. Older
/// kernels refuse the unknown flag (EINVAL); their memfds are executable.
const MFD_EXEC: libc::c_uint = 0x0010;

/// `F_SEAL_EXEC` (Linux 6.3): the execute bits cannot be changed. Without
/// it, a container's root (the memfd's owner, or holding CAP_FOWNER) could
/// `fchmod` the copy to 0644 through `/proc/self/exe` and no monitor
/// could be started any more.
const F_SEAL_EXEC: libc::c_int = 0x0020;

/// The seals every copy carries: no writes, no size change, no more seals.
const REQUIRED_SEALS: libc::c_int =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// A sealed, close-on-exec memfd holding a copy of an executable.
#[derive(Debug)]
pub struct SealedExecutable {
    fd: OwnedFd,
    len: u64,
}

impl SealedExecutable {
    /// The path that executes the copy: `/proc/self/fd/N`. Valid in this
    /// process and in a child it spawns, up to the child's `execve` (the
    /// descriptor is close-on-exec, so the new program does not inherit
    /// it).
    pub fn exec_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The size of the copy in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the copy is empty (never: [`sealed_copy`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the kernel refuses changes to the execute bits too
    /// (`F_SEAL_EXEC`, Linux 6.3 and later).
    pub fn exec_bits_sealed(&self) -> bool {
        seals(self.fd.as_fd()).is_ok_and(|s| s & F_SEAL_EXEC != 0)
    }
}

impl AsFd for SealedExecutable {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The seals of `fd` (`F_GET_SEALS`); EINVAL for a file that cannot be
/// sealed (anything but a memfd or a shmem file).
pub fn seals(fd: BorrowedFd<'_>) -> Result<libc::c_int, Errno> {
    fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS)
}

/// Whether `fd` carries the seals a [`SealedExecutable`] has (write,
/// shrink, grow, seal).
pub fn is_sealed(fd: BorrowedFd<'_>) -> bool {
    seals(fd).is_ok_and(|s| s & REQUIRED_SEALS == REQUIRED_SEALS)
}

/// Copies the executable `src` into a new memfd named `name` (shown as
/// `/memfd:<name> (deleted)` in `/proc/PID/exe` and maps) and seals it.
///
/// Fails, saying why, where the kernel cannot give an executable sealed
/// memfd (no memfd_create, `vm.memfd_noexec = 2`, a seccomp or LSM policy
/// against it): the caller must not fall back to running `src` itself.
pub fn sealed_copy(src: &Path, name: &CStr) -> Result<SealedExecutable, Error> {
    let io_err = |op: &'static str| {
        move |source: io::Error| Error::Io {
            op,
            path: src.to_path_buf(),
            source,
        }
    };
    let mut from = File::open(src).map_err(io_err("opening"))?;
    let src_len = from.metadata().map_err(io_err("reading"))?.len();
    if src_len == 0 {
        return Err(io_err("copying")(io::Error::new(
            io::ErrorKind::InvalidData,
            "the file is empty",
        )));
    }
    let fd = create(name)?;
    let mut to = File::from(fd);
    let copied = io::copy(&mut from, &mut to).map_err(io_err("copying into a memfd"))?;
    if copied != src_len {
        // The file changed while we copied it (an upgrade in progress).
        return Err(io_err("copying into a memfd")(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("copied {copied} bytes of {src_len}; was the file replaced meanwhile?"),
        )));
    }
    let fd = OwnedFd::from(to);
    seal(fd.as_fd())?;
    Ok(SealedExecutable { fd, len: copied })
}

fn create(name: &CStr) -> Result<OwnedFd, Error> {
    let base = MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING;
    let exec = base | MemFdCreateFlag::from_bits_retain(MFD_EXEC);
    match memfd_create(name, exec) {
        Ok(fd) => Ok(fd),
        // A kernel before 6.3: no MFD_EXEC, every memfd is executable.
        Err(Errno::EINVAL) => memfd_create(name, base).map_err(|source| Error::Sys {
            op: "memfd_create",
            source,
        }),
        Err(Errno::EACCES) => Err(Error::Sys {
            op: "memfd_create(MFD_EXEC): executable memfds are forbidden here \
                 (vm.memfd_noexec = 2?)",
            source: Errno::EACCES,
        }),
        Err(source) => Err(Error::Sys {
            op: "memfd_create",
            source,
        }),
    }
}

fn seal(fd: BorrowedFd<'_>) -> Result<(), Error> {
    let add = |bits: libc::c_int| {
        fcntl(
            fd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::from_bits_retain(bits)),
        )
    };
    let contents = REQUIRED_SEALS & !libc::F_SEAL_SEAL;
    // F_SEAL_EXEC where the kernel knows it (6.3), else without; then
    // F_SEAL_SEAL last, so that nothing can be added or taken afterwards.
    match add(contents | F_SEAL_EXEC) {
        Ok(_) => {}
        Err(Errno::EINVAL) => {
            add(contents).map_err(|source| Error::Sys {
                op: "sealing the memfd",
                source,
            })?;
        }
        Err(source) => {
            return Err(Error::Sys {
                op: "sealing the memfd",
                source,
            });
        }
    }
    add(libc::F_SEAL_SEAL).map_err(|source| Error::Sys {
        op: "sealing the memfd",
        source,
    })?;
    if !is_sealed(fd) {
        return Err(Error::Sys {
            op: "sealing the memfd: the seals did not hold",
            source: Errno::EPERM,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    /// Any executable will do; coreutils has /bin/true everywhere.
    fn program() -> PathBuf {
        PathBuf::from("/bin/true")
    }

    fn reopen(copy: &SealedExecutable, write: bool) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(copy.exec_path())
    }

    #[test]
    fn the_copy_has_the_same_bytes_and_runs() {
        let copy = sealed_copy(&program(), c"crust-test").unwrap();
        let mut got = Vec::new();
        reopen(&copy, false).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got, std::fs::read(program()).unwrap());
        assert_eq!(copy.len(), got.len() as u64);
        let status = Command::new(copy.exec_path()).status().unwrap();
        assert!(status.success());
        let link = std::fs::read_link(copy.exec_path()).unwrap();
        assert_eq!(link, Path::new("/memfd:crust-test (deleted)"));
    }

    #[test]
    fn the_copy_cannot_be_written_resized_or_resealed() {
        let copy = sealed_copy(&program(), c"crust-test").unwrap();
        assert!(is_sealed(copy.as_fd()));
        // Not executing: opening for writing works, writing does not.
        let mut f = reopen(&copy, true).unwrap();
        assert_eq!(f.write(b"x").unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(
            f.set_len(1).unwrap_err().raw_os_error(),
            Some(libc::EPERM),
            "shrink"
        );
        assert_eq!(
            f.set_len(copy.len() + 4096).unwrap_err().raw_os_error(),
            Some(libc::EPERM),
            "grow"
        );
        let more = fcntl(
            copy.as_fd().as_raw_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_FUTURE_WRITE),
        );
        assert_eq!(more, Err(Errno::EPERM));
    }

    #[test]
    fn execute_bits_cannot_be_taken_where_the_kernel_seals_them() {
        let copy = sealed_copy(&program(), c"crust-test").unwrap();
        let f = reopen(&copy, false).unwrap();
        let r = f.set_permissions(std::fs::Permissions::from_mode(0o644));
        if copy.exec_bits_sealed() {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPERM));
        } else {
            // Before Linux 6.3 nothing stops it (documented residual risk).
            eprintln!("this kernel has no F_SEAL_EXEC: the copy's execute bits can change");
        }
    }

    #[test]
    fn the_descriptor_is_not_inherited() {
        let copy = sealed_copy(&program(), c"crust-test").unwrap();
        let fd = copy.as_fd().as_raw_fd();
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "test -e /proc/self/fd/{fd} && echo open || echo closed"
            ))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "closed");
    }

    #[test]
    fn a_missing_or_empty_source_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let err = sealed_copy(&d.path().join("nope"), c"x").unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        let empty = d.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let err = sealed_copy(&empty, c"x").unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn other_files_are_not_sealed() {
        let f = File::open(program()).unwrap();
        assert_eq!(seals(f.as_fd()), Err(Errno::EINVAL));
        assert!(!is_sealed(f.as_fd()));
    }
}
