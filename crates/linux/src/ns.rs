//! Pod namespaces: created, configured and pinned without a process.
//!
//! Why a thread and not a helper process: the daemon must not fork, and a
//! re-exec'd helper would cost an exec per pod and tie this crate to the
//! daemon's command line. `unshare(2)` of CLONE_NEWNET, CLONE_NEWIPC and
//! CLONE_NEWUTS acts on the calling thread alone, so a short-lived thread
//! that nobody else uses can move into fresh namespaces, set the hostname,
//! write the namespaced sysctls (`/proc/sys` resolves against the opening
//! thread's namespaces), bind-mount `/proc/thread-self/ns/*` onto files in
//! the pod's dir (mounts act on the process's mount namespace, which the
//! thread still shares) and exit. The bind mounts keep the namespaces alive;
//! the thread's exit drops its own references. The same trick in reverse
//! ([`run_in_namespaces`]) runs code inside pinned namespaces. A thread
//! whose namespaces changed never returns to any pool: it always exits.
//!
//! These functions block for a few milliseconds; call them from
//! `spawn_blocking` in async code.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::statfs::{NSFS_MAGIC, statfs};

use crate::mounts::unmount_all;
use crate::{Error, sysctl};

/// The namespaces a pod sandbox can own and pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamespaceKind {
    Net,
    Ipc,
    Uts,
}

impl NamespaceKind {
    pub const ALL: [NamespaceKind; 3] =
        [NamespaceKind::Net, NamespaceKind::Ipc, NamespaceKind::Uts];

    /// The name under `/proc/<pid>/ns/`, also the pinned file's name.
    pub fn proc_name(self) -> &'static str {
        match self {
            NamespaceKind::Net => "net",
            NamespaceKind::Ipc => "ipc",
            NamespaceKind::Uts => "uts",
        }
    }

    pub(crate) fn clone_flag(self) -> CloneFlags {
        match self {
            NamespaceKind::Net => CloneFlags::CLONE_NEWNET,
            NamespaceKind::Ipc => CloneFlags::CLONE_NEWIPC,
            NamespaceKind::Uts => CloneFlags::CLONE_NEWUTS,
        }
    }
}

/// What [`pin_namespaces`] creates. A namespace not asked for is the
/// node's (host network / host IPC); the UTS namespace is private whenever
/// the network one is, as kubelet expects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinOptions {
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    /// Set in the new UTS namespace (requires `uts`).
    pub hostname: Option<String>,
    /// Written inside the new namespaces, in order; see [`crate::sysctl`].
    pub sysctls: Vec<(String, String)>,
    /// Bring `lo` up in the new network namespace, so a pod has loopback
    /// whatever the CNI config does.
    pub loopback_up: bool,
    /// Create a user namespace with these mappings too, pinned at
    /// `dir/user`, and make it the owner of the other new namespaces (a
    /// pod with `hostUsers: false`).
    pub userns: Option<UserNsMappings>,
}

/// One line of a user namespace's uid_map or gid_map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub container_id: u32,
    pub host_id: u32,
    pub length: u32,
}

/// The uid and gid mappings of a user namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserNsMappings {
    pub uids: Vec<IdMap>,
    pub gids: Vec<IdMap>,
}

/// Where a pod's user namespace is pinned inside its namespace `dir`.
pub fn user_pin_path(dir: &Path) -> PathBuf {
    dir.join("user")
}

fn map_text(maps: &[IdMap]) -> String {
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.container_id, m.host_id, m.length))
        .collect()
}

/// Creates a user namespace with `maps` owning new namespaces of `flags`,
/// and bind-mounts each onto its target (`user` first). A user namespace
/// cannot be entered by a thread of a multi-threaded process, so a child
/// made with clone(2) holds them while they are mapped and pinned; it does
/// nothing but wait for a pipe to close (raw syscalls only: it is a copy
/// of a multi-threaded process) and exits.
fn pin_with_user_namespace(
    maps: &UserNsMappings,
    flags: CloneFlags,
    user_target: &File,
    targets: &[(NamespaceKind, PathBuf, File)],
) -> Result<(), Error> {
    use std::os::fd::IntoRawFd;
    let (hold_r, hold_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::sys("pipe2"))?;
    let (r, w) = (hold_r.into_raw_fd(), hold_w.into_raw_fd());
    let mut stack = vec![0u8; 64 * 1024];
    let child = Box::new(move || -> isize {
        // SAFETY: raw fds this copy of the process owns; read/close are
        // async-signal-safe.
        unsafe {
            libc::close(w);
            let mut b = 0u8;
            while libc::read(r, (&raw mut b).cast(), 1) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
        }
        0
    });
    // SAFETY: without CLONE_VM the child runs on a copy of the address
    // space and `child` only makes raw syscalls before it exits.
    let pid = unsafe {
        nix::sched::clone(
            child,
            &mut stack,
            CloneFlags::CLONE_NEWUSER | flags,
            Some(libc::SIGCHLD),
        )
    };
    // SAFETY: our own pipe fds, closed once.
    unsafe { libc::close(r) };
    let pid = match pid {
        Ok(pid) => pid,
        Err(e) => {
            // SAFETY: as above.
            unsafe { libc::close(w) };
            return Err(Error::sys("clone(CLONE_NEWUSER)")(e));
        }
    };
    let result = (|| {
        for (file, maps) in [("uid_map", &maps.uids), ("gid_map", &maps.gids)] {
            let path = PathBuf::from(format!("/proc/{pid}/{file}"));
            std::fs::write(&path, map_text(maps)).map_err(Error::io("write", path))?;
        }
        let mut mounted: Vec<String> = Vec::new();
        let all = std::iter::once(("user", user_target))
            .chain(targets.iter().map(|(k, _, f)| (k.proc_name(), f)));
        for (name, file) in all {
            let source = format!("/proc/{pid}/ns/{name}");
            let target = format!("/proc/self/fd/{}", file.as_raw_fd());
            if let Err(e) = crate::retry::transient(|| {
                nix::mount::mount(
                    Some(source.as_str()),
                    target.as_str(),
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
            }) {
                for t in &mounted {
                    let _ = nix::mount::umount2(t.as_str(), nix::mount::MntFlags::MNT_DETACH);
                }
                return Err(Error::Io {
                    op: "bind-mount namespace to",
                    path: PathBuf::from(target),
                    source: e.into(),
                });
            }
            mounted.push(target);
        }
        Ok(())
    })();
    // SAFETY: our own pipe fd, closed once: the child sees EOF and exits.
    unsafe { libc::close(w) };
    let _ = nix::sys::wait::waitpid(pid, None);
    result
}

/// Paths of the pinned namespaces; join them by path in OCI specs, pass the
/// network one to CNI as CNI_NETNS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PinnedNamespaces {
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
}

impl PinnedNamespaces {
    pub fn get(&self, kind: NamespaceKind) -> Option<&Path> {
        match kind {
            NamespaceKind::Net => self.net.as_deref(),
            NamespaceKind::Ipc => self.ipc.as_deref(),
            NamespaceKind::Uts => self.uts.as_deref(),
        }
    }

    fn slot(&mut self, kind: NamespaceKind) -> &mut Option<PathBuf> {
        match kind {
            NamespaceKind::Net => &mut self.net,
            NamespaceKind::Ipc => &mut self.ipc,
            NamespaceKind::Uts => &mut self.uts,
        }
    }
}

/// Where the namespace of `kind` is pinned inside a pod's `dir`.
pub fn pin_path(dir: &Path, kind: NamespaceKind) -> PathBuf {
    dir.join(kind.proc_name())
}

/// Checks a pod hostname: what the kernel takes (at most 64 bytes) and what
/// may go into /etc/hostname and /etc/hosts (RFC 1123 labels).
pub fn validate_hostname(hostname: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::invalid(format!("hostname {hostname:?}"), why));
    if hostname.is_empty() {
        return bad("empty");
    }
    if hostname.len() > 64 {
        return bad("longer than 64 bytes");
    }
    for label in hostname.split('.') {
        if label.is_empty() {
            return bad("empty label");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label starts or ends with '-'");
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return bad(&format!("contains {c:?}"));
        }
    }
    Ok(())
}

/// Creates the namespaces `opts` asks for, configures them and pins each at
/// `dir/<net|ipc|uts>`. `dir` is created if missing (it must not be a
/// symlink); pinned files must not exist yet. On error nothing is left
/// behind except `dir` itself.
pub fn pin_namespaces(dir: &Path, opts: &PinOptions) -> Result<PinnedNamespaces, Error> {
    if opts.hostname.is_some() && !opts.uts {
        return Err(Error::invalid(
            "hostname",
            "needs the pod's own UTS namespace",
        ));
    }
    if let Some(hostname) = &opts.hostname {
        validate_hostname(hostname)?;
    }
    let pod = sysctl::PodNamespaces {
        net: opts.net,
        ipc: opts.ipc,
    };
    sysctl::validate_all(
        opts.sysctls.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        pod,
    )?;

    let kinds: Vec<NamespaceKind> = NamespaceKind::ALL
        .into_iter()
        .filter(|k| match k {
            NamespaceKind::Net => opts.net,
            NamespaceKind::Ipc => opts.ipc,
            NamespaceKind::Uts => opts.uts,
        })
        .collect();
    // A user namespace is pinned even without others to own (a pod on the
    // node's network, IPC and UTS namespaces).
    if kinds.is_empty() && opts.userns.is_none() {
        return Ok(PinnedNamespaces::default());
    }
    crate::mounts::ensure_real_dir(dir, 0o755, "namespace dir")?;

    // The mount targets: fresh, empty files, opened so that the mounts land
    // on exactly these files even if someone swaps the path meanwhile.
    let mut targets: Vec<(NamespaceKind, PathBuf, File)> = Vec::new();
    for &kind in &kinds {
        let path = pin_path(dir, kind);
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path);
        match created {
            Ok(file) => targets.push((kind, path, file)),
            Err(e) => {
                remove_files(&targets);
                return Err(Error::io("create namespace pin", path)(e));
            }
        }
    }

    let flags = kinds
        .iter()
        .fold(CloneFlags::empty(), |f, k| f | k.clone_flag());
    if let Some(maps) = &opts.userns {
        return pin_in_user_namespace(dir, opts, maps, flags, targets);
    }
    let configured = on_helper_thread(|| {
        nix::sched::unshare(flags).map_err(Error::sys("unshare"))?;
        if opts.net && opts.loopback_up {
            set_loopback_up()?;
        }
        if let Some(hostname) = &opts.hostname {
            nix::unistd::sethostname(hostname).map_err(Error::sys("sethostname"))?;
        }
        for (name, value) in &opts.sysctls {
            sysctl::write(name, value)?;
        }
        let mut mounted: Vec<&Path> = Vec::new();
        for (kind, path, file) in &targets {
            let source = format!("/proc/thread-self/ns/{}", kind.proc_name());
            let target = format!("/proc/thread-self/fd/{}", file.as_raw_fd());
            let res = crate::retry::transient(|| {
                nix::mount::mount(
                    Some(source.as_str()),
                    target.as_str(),
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
            });
            if let Err(e) = res {
                for path in mounted {
                    let _ = unmount_all(path);
                }
                return Err(Error::Io {
                    op: "bind-mount namespace to",
                    path: path.clone(),
                    source: e.into(),
                });
            }
            mounted.push(path);
        }
        Ok(())
    })
    .and_then(|r| r);

    if let Err(e) = configured {
        remove_files(&targets);
        return Err(e);
    }
    let mut pinned = PinnedNamespaces::default();
    for (kind, path, _) in targets {
        *pinned.slot(kind) = Some(path);
    }
    Ok(pinned)
}

/// [`pin_namespaces`] for a pod with its own user namespace: the namespaces
/// are made by a child (see [`pin_with_user_namespace`]), then configured
/// from a thread that joins them (the daemon, root of the node, may enter
/// and configure namespaces a child user namespace owns).
fn pin_in_user_namespace(
    dir: &Path,
    opts: &PinOptions,
    maps: &UserNsMappings,
    flags: CloneFlags,
    targets: Vec<(NamespaceKind, PathBuf, File)>,
) -> Result<PinnedNamespaces, Error> {
    let user_path = user_pin_path(dir);
    let user_file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&user_path)
    {
        Ok(f) => f,
        Err(e) => {
            remove_files(&targets);
            return Err(Error::io("create namespace pin", user_path)(e));
        }
    };
    let undo = |targets: &[(NamespaceKind, PathBuf, File)]| {
        for (_, path, _) in targets {
            let _ = unpin(path);
        }
        let _ = unpin(&user_path);
    };
    if let Err(e) = pin_with_user_namespace(maps, flags, &user_file, &targets) {
        undo(&targets);
        return Err(e);
    }
    let mut pinned = PinnedNamespaces::default();
    for (kind, path, _) in &targets {
        *pinned.slot(*kind) = Some(path.clone());
    }
    let joins: Vec<(NamespaceKind, &Path)> = NamespaceKind::ALL
        .into_iter()
        .filter_map(|k| pinned.get(k).map(|p| (k, p)))
        .collect();
    let configured = run_in_namespaces(&joins, || -> Result<(), Error> {
        if opts.net && opts.loopback_up {
            set_loopback_up()?;
        }
        if let Some(hostname) = &opts.hostname {
            nix::unistd::sethostname(hostname).map_err(Error::sys("sethostname"))?;
        }
        for (name, value) in &opts.sysctls {
            sysctl::write(name, value)?;
        }
        Ok(())
    })
    .and_then(|r| r);
    if let Err(e) = configured {
        undo(&targets);
        return Err(e);
    }
    Ok(pinned)
}

/// Writes `sysctls` inside already pinned namespaces, after validating them
/// against what `pinned` holds. For sysctls that need something CNI creates
/// later (`net.ipv4.conf.eth0.*`): run it after ADD.
pub fn apply_sysctls(pinned: &PinnedNamespaces, sysctls: &[(String, String)]) -> Result<(), Error> {
    let pod = sysctl::PodNamespaces {
        net: pinned.net.is_some(),
        ipc: pinned.ipc.is_some(),
    };
    sysctl::validate_all(sysctls.iter().map(|(k, v)| (k.as_str(), v.as_str())), pod)?;
    if sysctls.is_empty() {
        return Ok(());
    }
    let joins: Vec<(NamespaceKind, &Path)> = [NamespaceKind::Net, NamespaceKind::Ipc]
        .into_iter()
        .filter_map(|k| pinned.get(k).map(|p| (k, p)))
        .collect();
    run_in_namespaces(&joins, || {
        sysctls
            .iter()
            .try_for_each(|(name, value)| sysctl::write(name, value))
    })?
}

/// Unpins one namespace: unmounts `path` (all stacked mounts) and removes
/// the file. Succeeds when it is already gone.
pub fn unpin(path: &Path) -> Result<(), Error> {
    unmount_all(path)?;
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove namespace pin", path)(e)),
    }
}

/// Unpins whatever [`pin_namespaces`] may have pinned in `dir` and removes
/// `dir` if it is then empty. Idempotent; the recovery path after a crash.
pub fn unpin_namespaces(dir: &Path) -> Result<(), Error> {
    let mut first_error = None;
    for kind in NamespaceKind::ALL {
        if let Err(e) = unpin(&pin_path(dir, kind)) {
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = unpin(&user_pin_path(dir)) {
        first_error.get_or_insert(e);
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error().map(Errno::from_raw),
                Some(Errno::ENOENT | Errno::ENOTEMPTY)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(Error::io("remove namespace dir", dir)(e)),
    }
}

/// Whether `path` is a pinned namespace (an nsfs mount), for recovery.
pub fn is_pinned(path: &Path) -> bool {
    // statfs follows symlinks; a pin is never a symlink.
    let is_symlink = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    !is_symlink && statfs(path).is_ok_and(|fs| fs.filesystem_type() == NSFS_MAGIC)
}

/// Runs `f` on a fresh thread that first joins the namespaces at the given
/// paths (pinned files or `/proc/<pid>/ns/*`), and returns its result.
/// Sockets created by `f` stay in the joined network namespace, so this
/// serves port-forward dials and tests. A panic in `f` comes back as
/// [`Error::HelperPanicked`].
pub fn run_in_namespaces<T, F>(namespaces: &[(NamespaceKind, &Path)], f: F) -> Result<T, Error>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    let mut files = Vec::with_capacity(namespaces.len());
    for (kind, path) in namespaces {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(Error::io("open namespace", *path))?;
        files.push((*kind, file));
    }
    on_helper_thread(move || {
        for (kind, file) in &files {
            // The type argument makes setns refuse a file of another kind.
            nix::sched::setns(file, kind.clone_flag()).map_err(Error::sys("setns"))?;
        }
        Ok(f())
    })
    .and_then(|r| r)
}

/// Runs `f` on a new thread that exits afterwards, so namespace changes
/// never leak into a thread that runs anything else.
pub(crate) fn on_helper_thread<T: Send>(f: impl FnOnce() -> T + Send) -> Result<T, Error> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("crust-ns".into())
            .spawn_scoped(s, f)
            .map_err(Error::io("spawn namespace thread", "crust-ns"))?
            .join()
            .map_err(|_| Error::HelperPanicked)
    })
}

fn remove_files(targets: &[(NamespaceKind, PathBuf, File)]) {
    for (_, path, _) in targets {
        let _ = std::fs::remove_file(path);
    }
}

/// The hostname of the calling thread's UTS namespace (the node's, for the
/// daemon), lossily decoded.
pub fn hostname() -> Result<String, Error> {
    let name = nix::unistd::gethostname().map_err(Error::sys("gethostname"))?;
    Ok(name.to_string_lossy().into_owned())
}

/// The running kernel's release (`uname -r`), e.g. `6.1.0-18-amd64`.
pub fn kernel_release() -> Result<String, Error> {
    let u = nix::sys::utsname::uname().map_err(Error::sys("uname"))?;
    Ok(u.release().to_string_lossy().into_owned())
}

/// The namespaces a process joins to run inside a container, in joining
/// order: the user namespace first (it owns the others), the mount
/// namespace last (after it, host paths no longer resolve).
const JOIN_ORDER: [(&str, CloneFlags); 7] = [
    ("user", CloneFlags::CLONE_NEWUSER),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ("mnt", CloneFlags::CLONE_NEWNS),
];

/// Another process's namespaces, opened (while host paths still resolve)
/// to be joined by this one.
#[derive(Debug)]
pub struct ProcessNamespaces {
    pid: i32,
    open: Vec<(&'static str, CloneFlags, File)>,
}

impl ProcessNamespaces {
    /// Opens the namespaces of `pid` that differ from ours. A namespace
    /// type the kernel lacks is skipped; [`Error::ProcessGone`] if `pid`
    /// has exited.
    pub fn open_differing(pid: i32) -> Result<ProcessNamespaces, Error> {
        use std::os::unix::fs::MetadataExt;
        let mut open = Vec::new();
        for (name, flag) in JOIN_ORDER {
            let theirs = PathBuf::from(format!("/proc/{pid}/ns/{name}"));
            let ours = format!("/proc/self/ns/{name}");
            let their_meta = match std::fs::metadata(&theirs) {
                Ok(m) => m,
                // A kernel without this namespace type (cgroup before 4.6).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && name != "mnt" => {
                    if Path::new(&format!("/proc/{pid}")).exists() {
                        continue;
                    }
                    return Err(Error::ProcessGone { pid });
                }
                Err(e) => return Err(Error::io("open namespace", theirs)(e)),
            };
            let our_meta = std::fs::metadata(&ours).map_err(Error::io("open namespace", &ours))?;
            if (their_meta.dev(), their_meta.ino()) == (our_meta.dev(), our_meta.ino()) {
                continue;
            }
            let file = File::open(&theirs).map_err(Error::io("open namespace", &theirs))?;
            open.push((name, flag, file));
        }
        Ok(ProcessNamespaces { pid, open })
    }

    /// No namespaces: [`Self::enter`] does nothing.
    pub fn none() -> ProcessNamespaces {
        ProcessNamespaces {
            pid: 0,
            open: Vec::new(),
        }
    }

    /// Takes the cgroup namespace out of the set, to be joined apart (by
    /// a child cloned into the container's cgroup: with the namespace
    /// joined first, the kernel would refuse to place a child from a
    /// cgroup outside it, nsdelegate). Empty when it does not differ.
    pub fn take_cgroup(&mut self) -> ProcessNamespaces {
        let (cgroup, rest) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|(name, _, _)| *name == "cgroup");
        self.open = rest;
        ProcessNamespaces {
            pid: self.pid,
            open: cgroup,
        }
    }

    /// Joins them, in order. Call it in a disposable single-threaded
    /// process: it stays inside them, and a joined PID namespace applies
    /// only to the children it forks afterwards.
    pub fn enter(self) -> Result<(), Error> {
        for (name, flag, file) in &self.open {
            nix::sched::setns(file, *flag).map_err(|e| Error::Io {
                op: "join namespace",
                path: PathBuf::from(format!("/proc/{}/ns/{name}", self.pid)),
                source: e.into(),
            })?;
        }
        Ok(())
    }
}

/// Sets IFF_UP on `lo` in the calling thread's network namespace.
fn set_loopback_up() -> Result<(), Error> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(Error::sys("socket for loopback"))?;
    // SAFETY: ifreq is a plain C struct (names and a union of integers and
    // addresses) for which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `sock` is an open socket and `req` a valid, NUL-terminated
    // ifreq that SIOCGIFFLAGS fills in (flags member of the union).
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(Error::sys("SIOCGIFFLAGS lo")(Errno::last()));
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds the flags member.
    unsafe {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(Error::sys("SIOCSIFFLAGS lo")(Errno::last()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_join_user_first_and_mount_last() {
        assert_eq!(JOIN_ORDER[0].0, "user");
        assert_eq!(JOIN_ORDER[JOIN_ORDER.len() - 1].0, "mnt");
    }

    #[test]
    fn our_own_namespaces_need_no_joining() {
        let ns = ProcessNamespaces::open_differing(std::process::id() as i32).unwrap();
        assert!(ns.open.is_empty());
        ns.enter().unwrap();
        let gone = ProcessNamespaces::open_differing(i32::MAX).unwrap_err();
        assert!(matches!(gone, Error::ProcessGone { .. }), "{gone}");
        assert!(!hostname().unwrap().is_empty());
        assert!(
            kernel_release()
                .unwrap()
                .chars()
                .next()
                .unwrap()
                .is_ascii_digit()
        );
    }

    #[test]
    fn the_cgroup_namespace_is_taken_apart_in_order() {
        let open = |name: &'static str, flag| {
            let f = File::open(format!("/proc/self/ns/{name}")).unwrap();
            (name, flag, f)
        };
        let mut ns = ProcessNamespaces {
            pid: 1,
            open: vec![
                open("user", CloneFlags::CLONE_NEWUSER),
                open("cgroup", CloneFlags::CLONE_NEWCGROUP),
                open("mnt", CloneFlags::CLONE_NEWNS),
            ],
        };
        let cgroup = ns.take_cgroup();
        let names = |n: &ProcessNamespaces| n.open.iter().map(|o| o.0).collect::<Vec<_>>();
        assert_eq!(names(&cgroup), ["cgroup"]);
        assert_eq!(names(&ns), ["user", "mnt"]);
        assert!(names(&ns.take_cgroup()).is_empty());
        assert!(names(&ProcessNamespaces::none()).is_empty());
    }

    #[test]
    fn hostnames() {
        for ok in ["a", "pod-1", "web.default", "A1", &"a".repeat(63)] {
            validate_hostname(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a b",
            "a\nb",
            "a/b",
            "a_b",
            &"a.".repeat(40),
            "héllo",
        ] {
            let e = validate_hostname(bad).unwrap_err();
            assert!(e.is_invalid_argument(), "{bad:?}");
        }
    }

    #[test]
    fn bad_options_are_refused_before_touching_anything() {
        let dir = tempfile::tempdir().unwrap();
        let pin_dir = dir.path().join("ns");
        let cases = [
            PinOptions {
                hostname: Some("h".into()),
                ..Default::default()
            },
            PinOptions {
                uts: true,
                hostname: Some("bad host".into()),
                ..Default::default()
            },
            PinOptions {
                net: false,
                sysctls: vec![("net.core.somaxconn".into(), "1".into())],
                ..Default::default()
            },
            PinOptions {
                net: true,
                sysctls: vec![("kernel.panic".into(), "1".into())],
                ..Default::default()
            },
        ];
        for opts in cases {
            let e = pin_namespaces(&pin_dir, &opts).unwrap_err();
            assert!(e.is_invalid_argument(), "{opts:?}: {e}");
            assert!(!pin_dir.exists());
        }
    }

    #[test]
    fn nothing_requested_pins_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let pinned = pin_namespaces(&dir.path().join("ns"), &PinOptions::default()).unwrap();
        assert_eq!(pinned, PinnedNamespaces::default());
    }

    #[test]
    fn unpinning_what_is_not_there_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        unpin_namespaces(&dir.path().join("never-pinned")).unwrap();
        assert!(!is_pinned(dir.path()));
    }

    #[test]
    fn a_panic_in_the_helper_is_an_error() {
        let r: Result<(), _> = run_in_namespaces(&[], || panic!("boom"));
        assert!(matches!(r, Err(Error::HelperPanicked)));
    }
}
