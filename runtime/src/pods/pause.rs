//! The pause process of a pod that shares one PID namespace (pid = POD).
//!
//! It is PID 1 of the pod's PID namespace: it reaps the zombies other
//! processes leave (as init) and exits on SIGTERM or SIGINT. It runs through
//! the pod's OCI runtime, under a monitor like any container, from a
//! minimal read-only rootfs crust writes itself (`<root>/pause/rootfs`,
//! holding only `/pause`), so no pause image is ever pulled.
//!
//! # Why a hand-made static binary
//!
//! The pause program must run inside an empty rootfs, so it must be static.
//! crust's own binaries are dynamically linked against glibc (and libseccomp)
//! and a static Rust build needs a musl target cargo does not give us per
//! binary; copying a dynamic binary plus its `ldd` closure would tie the
//! pod to the host's glibc files and be megabytes. Nodes have no C
//! toolchain. So the program is 110 bytes of x86-64 code, assembled from
//! the source below (`as pause.s && objcopy -O binary -j .text`) and
//! wrapped in a minimal ELF header here: it only ever makes five system
//! calls, and the default seccomp profile, no capabilities, uid 65535 and
//! no_new_privs confine it like any container.
//!
//! ```text
//! _start: rt_sigprocmask(SIG_BLOCK, &all, NULL, 8)
//! wait:   sig = rt_sigtimedwait(&all, NULL, NULL, 8)
//!         if sig == SIGCHLD: while wait4(-1, NULL, WNOHANG, NULL) > 0 {}
//!         if sig == SIGTERM || sig == SIGINT: exit_group(0)
//!         goto wait
//! all:    .quad 0xffffffffffffffff
//! ```
//!
//! Other architectures have no pause program yet: pid = POD pods are
//! rejected there with a clear error.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crust_api::v1::NamespaceMode;
use crust_shim_protocol::RuntimeConfig;

use super::{PodError, PodRecord};
use crate::launch::Launch;
use crate::monitor::Monitor;

/// How long the pause process's monitor may take to create it.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a SIGKILLed pause process may take to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Path of the program inside the pause rootfs.
pub const COMMAND: &str = "/pause";

/// x86-64 machine code of the pause program (see the module docs).
#[cfg(target_arch = "x86_64")]
const CODE: &[u8] = &[
    0xb8, 0x0e, 0x00, 0x00, 0x00, 0x31, 0xff, 0x48, 0x8d, 0x35, 0x58, 0x00, 0x00, 0x00, 0x31, 0xd2,
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xb8, 0x80, 0x00, 0x00, 0x00, 0x48, 0x8d, 0x3d,
    0x42, 0x00, 0x00, 0x00, 0x31, 0xf6, 0x31, 0xd2, 0x41, 0xba, 0x08, 0x00, 0x00, 0x00, 0x0f, 0x05,
    0x83, 0xf8, 0x11, 0x74, 0x0c, 0x83, 0xf8, 0x0f, 0x74, 0x23, 0x83, 0xf8, 0x02, 0x74, 0x1e, 0xeb,
    0xd7, 0xb8, 0x3d, 0x00, 0x00, 0x00, 0xbf, 0xff, 0xff, 0xff, 0xff, 0x31, 0xf6, 0xba, 0x01, 0x00,
    0x00, 0x00, 0x45, 0x31, 0xd2, 0x0f, 0x05, 0x85, 0xc0, 0x7f, 0xe6, 0xeb, 0xbb, 0xb8, 0xe7, 0x00,
    0x00, 0x00, 0x31, 0xff, 0x0f, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
];

/// The pause program as a static ELF executable: one header, one loadable
/// segment (read + execute) holding header and code, entry right after the
/// headers.
#[cfg(target_arch = "x86_64")]
pub fn elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const HEADERS: u64 = 64 + 56;
    let total = HEADERS + CODE.len() as u64;
    let mut e = Vec::with_capacity(total as usize);
    e.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
    e.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    e.extend_from_slice(&(BASE + HEADERS).to_le_bytes()); // entry
    e.extend_from_slice(&64u64.to_le_bytes()); // phoff
    e.extend_from_slice(&0u64.to_le_bytes()); // shoff
    e.extend_from_slice(&0u32.to_le_bytes()); // flags
    e.extend_from_slice(&64u16.to_le_bytes()); // ehsize
    e.extend_from_slice(&56u16.to_le_bytes()); // phentsize
    e.extend_from_slice(&1u16.to_le_bytes()); // phnum
    e.extend_from_slice(&[0; 6]); // shentsize, shnum, shstrndx
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    e.extend_from_slice(&0u64.to_le_bytes()); // offset
    e.extend_from_slice(&BASE.to_le_bytes()); // vaddr
    e.extend_from_slice(&BASE.to_le_bytes()); // paddr
    e.extend_from_slice(&total.to_le_bytes()); // filesz
    e.extend_from_slice(&total.to_le_bytes()); // memsz
    e.extend_from_slice(&0x1000u64.to_le_bytes()); // align
    e.extend_from_slice(CODE);
    e
}

#[cfg(not(target_arch = "x86_64"))]
pub fn elf() -> Vec<u8> {
    Vec::new()
}

/// The monitor state dir of a pod's pause process.
pub fn dir(rec: &PodRecord) -> PathBuf {
    rec.run_dir.join("pause")
}

/// Whether the pod shares a PID namespace (and so has a pause process).
pub fn shares_pid(rec: &PodRecord) -> bool {
    !rec.host_pid
        && rec
            .sandbox_config()
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .map_or(NamespaceMode::Pod as i32, |n| n.pid)
            == NamespaceMode::Pod as i32
}

/// Pid of the pod's pause process, if it runs.
pub fn pid(rec: &PodRecord) -> Option<i32> {
    Monitor::connect(&dir(rec))
        .ok()
        .map(|m| m.pid())
        .filter(|p| *p > 0)
}

/// Writes `<root>/pause/rootfs` (idempotent, replaced if different).
/// Blocking.
pub fn ensure_rootfs(root: &Path) -> Result<PathBuf, PodError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        PodError::Internal(format!("{what} {}: {e}", p.display()))
    };
    let rootfs = root.join("pause").join("rootfs");
    for d in ["", "proc", "dev", "sys"] {
        let p = rootfs.join(d);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&p)
            .map_err(|e| io("creating", &p, e))?;
    }
    let bin = elf();
    if bin.is_empty() {
        return Err(PodError::Unimplemented(
            "config.linux.security_context.namespace_options.pid: POD needs the pause \
             program, which crust has only for x86_64"
                .into(),
        ));
    }
    let target = rootfs.join("pause");
    if std::fs::read(&target).ok().as_deref() != Some(bin.as_slice()) {
        let tmp = rootfs.join(".pause.tmp");
        std::fs::write(&tmp, &bin).map_err(|e| io("writing", &tmp, e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("chmod", &tmp, e))?;
        std::fs::rename(&tmp, &target).map_err(|e| io("renaming", &tmp, e))?;
    }
    Ok(rootfs)
}

/// What runs the pause process of `rec` from `rootfs`: its spec, bundle
/// and monitor state dir, for [`crate::launch`]. `facts` are the pod's
/// (namespaces, cgroup parent).
pub fn launch(
    rec: &PodRecord,
    facts: &crust_oci::PodFacts,
    runtime: RuntimeConfig,
    rootfs: &Path,
    runtime_facts: &crust_oci::RuntimeFacts,
) -> Result<Launch, PodError> {
    let config = rec.sandbox_config();
    let spec = crust_oci::pause_spec(&crust_oci::PauseInput {
        sandbox_config: &config,
        pod: facts,
        rootfs,
        command: COMMAND,
        runtime: runtime_facts,
    })
    .map_err(|e| PodError::Internal(format!("the pause process's spec: {e}")))?;
    let state_dir = dir(rec);
    Ok(Launch {
        id: rec.id.clone(),
        bundle: state_dir.join("bundle"),
        state_dir,
        spec,
        runtime,
        log_path: None,
        log_directory: None,
        stdin: false,
        stdin_once: false,
        keep_spec: false,
        timeout: CREATE_TIMEOUT,
        restore: None,
    })
}

/// Stops the pause process (SIGKILL) and removes its state. Idempotent.
pub async fn stop(rec: &PodRecord) -> Result<(), PodError> {
    let state_dir = dir(rec);
    if let Ok(monitor) = Monitor::connect(&state_dir) {
        monitor
            .kill_and_reap(KILL_WAIT, Duration::from_millis(10))
            .await;
    }
    crate::tasks::blocking(move || {
        crust_linux::remove_tree::remove_tree(&state_dir)
            .map_err(|e| PodError::Internal(format!("removing {}: {e}", state_dir.display())))
    })
    .await
}
