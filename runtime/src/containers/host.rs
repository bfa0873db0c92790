//! Everything a container does to the node, behind one trait: its rootfs
//! and dirs, its monitor (through `crate::launch` and `crate::monitor`) and
//! the OCI runtime's leftovers. [`RealContainerHost`] does it; the unit
//! tests of the container life cycle use a recording fake
//! (`crate::fakes`), so the rules are tested without root.
//!
//! Blocking methods are called from the blocking pool (or are a quick look
//! at a file); `async` ones talk to the monitor.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crust_cgroups::{CgroupPath, Controllers};
use crust_shim_protocol::{ExecRequest, ExecSyncOutput, ExitInfo, RuntimeConfig, Status};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::error::ContainerError;
use super::record::ContainerRecord;
use crate::cgroups::{ContainerCgroup, NodeCgroups};
use crate::launch::{Launch, LaunchError, Launcher};
use crate::monitor::{self, Monitor};
use crate::node::NodeHost;

/// Where a container's image volumes are mounted, in its state dir.
const IMAGE_VOLUMES: &str = "image-volumes";
/// Where the id-mapped views of its image volumes' layers are (user
/// namespace pods): `<volume index>-<layer index>`.
const IMAGE_VOLUME_LAYERS: &str = "image-volume-layers";
/// Where the id-mapped views of its image layers are (user namespace pods).
const IDMAPPED_LAYERS: &str = "idmapped-layers";
/// Where the id-mapped views of its volume mounts are (user namespace pods).
const IDMAPPED_MOUNTS: &str = "idmapped-mounts";
/// Largest /etc/passwd or /etc/group read from an image.
const MAX_ETC_FILE: u64 = 4 << 20;
/// Where the runtime mounts proc, sysfs and the /dev tmpfs: never
/// through a symlink of the image.
const KERNEL_MOUNT_POINTS: [&str; 3] = ["proc", "sys", "dev"];
/// How long a SIGKILLed container may take to be reaped.
pub const KILL_WAIT: Duration = Duration::from_secs(15);

#[async_trait::async_trait]
pub trait ContainerHost: Send + Sync + 'static {
    /// The container's dirs (writable layer, monitor state, bundle) and
    /// its rootfs: an overlay of `lowers` under the writable layer.
    /// Blocking.
    fn prepare_rootfs(
        &self,
        rec: &ContainerRecord,
        lowers: &[PathBuf],
    ) -> Result<(), ContainerError>;
    /// A file of the image, read inside the rootfs (bounded, no symlink
    /// out); None if it has none. Blocking.
    fn read_rootfs_file(&self, rootfs: &Path, rel: &str) -> Result<Option<String>, ContainerError>;
    /// Readies the image's mount points in the rootfs before the runtime
    /// mounts over them, following no symlink of the image on the host:
    /// an image whose /proc, /sys or /dev is a symlink is refused
    /// (FailedPrecondition naming `config.image.image`: the kernel's file
    /// systems go on real dirs), and a symlink at each of `files` (the
    /// pod's /etc files, e.g. `etc/hosts`) is replaced by an empty file in
    /// the writable layer, so the pod's file is mounted there and the
    /// link's target stays as the image has it. Blocking.
    fn prepare_mount_points(&self, rootfs: &Path, files: &[&str]) -> Result<(), ContainerError>;
    /// The path `path` (absolute) names in the rootfs once the image's
    /// symlinks on it are resolved inside it, as the container will see
    /// it (nothing followed on the host; missing parts as written). A
    /// symlink loop is InvalidArgument naming `field`. Blocking.
    fn resolve_in_rootfs(
        &self,
        rootfs: &Path,
        path: &str,
        field: &str,
    ) -> Result<String, ContainerError>;
    /// Makes the working dir `real` ([`Self::resolve_in_rootfs`]'s answer)
    /// in the rootfs when the image lacks it (0755, as runc and CRI-O do);
    /// a non-directory on the way is FailedPrecondition naming `field`.
    /// Blocking.
    fn make_working_dir(
        &self,
        rootfs: &Path,
        real: &str,
        field: &str,
    ) -> Result<(), ContainerError>;
    /// The node look-ups of spec generation (host paths, devices,
    /// seccomp profiles).
    fn spec_host(&self) -> &dyn crust_oci::Host;
    /// Starts, in the background, the grace period the runtime's move of
    /// the new container into its cgroup will wait for, so that it passes
    /// while the rootfs and the monitor are prepared
    /// (`crust_linux::migration`).
    fn prime_cgroup_migration(&self) {}
    /// Writes the bundle and spawns the monitor, which creates the
    /// container; returns the container's init pid.
    async fn launch(&self, launch: Launch) -> Result<i32, ContainerError>;

    /// Starts the created container's process.
    async fn start(&self, state_dir: &Path) -> Result<(), ContainerError>;
    /// Signals the container (every process with `all`); without a
    /// monitor there is nothing to signal.
    async fn kill(&self, state_dir: &Path, signal: i32, all: bool) -> Result<(), ContainerError>;
    /// Resolves once the container has exited.
    async fn wait(&self, state_dir: &Path) -> Result<(), ContainerError>;
    async fn update(&self, state_dir: &Path, resources: &Value) -> Result<(), ContainerError>;
    async fn reopen_log(&self, state_dir: &Path) -> Result<(), ContainerError>;
    /// CRIU images of the running container into `image_path`, through
    /// its monitor (which keeps owning the process).
    async fn checkpoint(
        &self,
        state_dir: &Path,
        image_path: &Path,
        work_path: &Path,
        timeout: std::time::Duration,
    ) -> Result<(), ContainerError>;
    async fn exec_sync(
        &self,
        state_dir: &Path,
        req: &ExecRequest,
    ) -> Result<ExecSyncOutput, ContainerError>;

    /// How the container ended, once it has.
    fn exit_file(&self, state_dir: &Path) -> Option<ExitInfo>;
    /// Whether the container's monitor runs.
    fn monitor_running(&self, state_dir: &Path) -> bool;
    /// Whether the container's process was started, as its monitor says
    /// (created, running, stopped); None without a monitor that answers.
    async fn monitor_status(&self, state_dir: &Path) -> Option<Status>;
    /// The container's init pid as its monitor knows it (a restored
    /// container's is known only once it is restored).
    async fn monitor_pid(&self, _state_dir: &Path) -> Option<i32> {
        None
    }
    /// When the container's monitor started its process (Unix ns), if it
    /// did and says so.
    async fn monitor_started_at(&self, _state_dir: &Path) -> Option<i64> {
        None
    }
    /// Unpacks checkpoint `archive` for the container: its CRIU images
    /// into the layer dir, its writable layer's changes into the mounted
    /// rootfs. Blocking.
    fn apply_checkpoint(
        &self,
        _rec: &ContainerRecord,
        archive: &Path,
    ) -> Result<(), ContainerError> {
        Err(ContainerError::Internal(format!(
            "this host cannot restore {}",
            archive.display()
        )))
    }
    /// SIGKILLs the container, waits for its monitor to leave and kills
    /// the monitor if it does not. False if no monitor runs.
    async fn reap_monitor(&self, state_dir: &Path) -> bool;
    /// Kills what is left of a container whose monitor is gone: stops its
    /// scope (systemd driver), kills its cgroup's processes and removes
    /// the cgroup. Blocking.
    fn kill_orphan(&self, rec: &ContainerRecord);
    /// Sets the oom_score_adj of every process in the container's cgroup
    /// (an update: OCI runtimes' `update` has no such field). Blocking.
    fn set_oom_score_adj(&self, rec: &ContainerRecord, value: i32) -> Result<(), ContainerError>;
    /// The container's cgroup: from its record's cgroupsPath, or (records
    /// of older daemons) its bundle's. None if it never had one.
    fn container_cgroup(&self, rec: &ContainerRecord) -> Option<ContainerCgroup>;
    /// The controllers `unified` keys for a cgroup at `path` may name (its
    /// nearest existing ancestor's); None on a cgroup v1 node. Blocking
    /// (a small read).
    fn unified_controllers(&self, path: &CgroupPath)
    -> Result<Option<Controllers>, ContainerError>;
    /// Writes `unified` keys into the container's cgroup (v2): a systemd
    /// scope gets from the runtime only the keys systemd has a property
    /// for, and an update may rewrite files a key had set
    /// ([`NodeCgroups::write_unified`]). Blocking.
    fn write_unified(
        &self,
        rec: &ContainerRecord,
        unified: &HashMap<String, String>,
    ) -> Result<(), ContainerError>;
    /// Removes what the OCI runtime may still hold for the container (a
    /// monitor killed before it could delete it). Blocking; failures are
    /// ignored: usually there is nothing.
    fn delete_runtime_state(&self, rec: &ContainerRecord);
    fn unmount_rootfs(&self, rootfs: &Path) -> Result<(), ContainerError>;
    /// Mounts image volume `config.mounts[index]`: the read-only (nosuid,
    /// nodev) overlay of `lowers` (bottom first) under the
    /// container's state dir, its layers first id-mapped through `userns`
    /// for a pod with its own user namespace (an overlay mount cannot be
    /// id-mapped itself); returns the host path of `sub_path` resolved
    /// inside it (never outside: `..` and symlinks stop at the image's
    /// root). A sub path that is not in the image is InvalidArgument naming
    /// `image_sub_path`. Blocking.
    fn mount_image_volume(
        &self,
        rec: &ContainerRecord,
        index: usize,
        lowers: &[PathBuf],
        sub_path: &str,
        userns: Option<&crust_oci::UserNs>,
    ) -> Result<PathBuf, ContainerError>;
    /// For a container in the pod's user namespace: bind-mounts each of
    /// `lowers` id-mapped through it (under the state dir) and gives the
    /// writable layer to the namespace's root, so the container's root owns
    /// its rootfs without a chown of the image. Returns the mapped lowers.
    /// Blocking.
    fn idmap_layers(
        &self,
        rec: &ContainerRecord,
        lowers: &[PathBuf],
        userns: &crust_oci::UserNs,
    ) -> Result<Vec<PathBuf>, ContainerError>;
    /// For a volume of a container in the pod's user namespace
    /// (`config.mounts[index]` with the pod's mappings): bind-mounts
    /// `source` (a dir or a file) id-mapped through the namespace under the
    /// state dir and returns that path, the mount's new source. A missing
    /// source is InvalidArgument naming `host_path`. Blocking.
    fn idmap_mount(
        &self,
        rec: &ContainerRecord,
        index: usize,
        source: &Path,
        userns: &crust_oci::UserNs,
    ) -> Result<PathBuf, ContainerError>;
    /// Unmounts the container's image volumes, id-mapped layers and
    /// id-mapped mounts (none is no error); after the rootfs. Blocking.
    fn unmount_private_mounts(&self, rec: &ContainerRecord) -> Result<(), ContainerError>;
    /// Removes a dir and everything in it (never through a mount: the
    /// rootfs is unmounted first); a missing one is no error.
    fn remove_tree(&self, dir: &Path) -> Result<(), ContainerError>;
    /// The runc-style spec the container was created with (verbose
    /// status), Null if unreadable.
    fn read_spec(&self, bundle: &Path) -> Value;
}

/// The node itself.
pub struct RealContainerHost {
    launcher: Launcher,
    cgroups: Arc<NodeCgroups>,
    node: NodeHost,
}

impl RealContainerHost {
    pub fn new(launcher: Launcher, cgroups: Arc<NodeCgroups>, node: NodeHost) -> RealContainerHost {
        RealContainerHost {
            launcher,
            cgroups,
            node,
        }
    }
}

fn mkdir(p: &Path, mode: u32) -> Result<(), ContainerError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| ContainerError::Internal(format!("creating {}: {e}", p.display())))?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ContainerError::Internal(format!("chmod {}: {e}", p.display())))
}

fn connect(state_dir: &Path) -> Result<Monitor, ContainerError> {
    Monitor::connect(state_dir).map_err(ContainerError::from_monitor)
}

#[async_trait::async_trait]
impl ContainerHost for RealContainerHost {
    fn prepare_rootfs(
        &self,
        rec: &ContainerRecord,
        lowers: &[PathBuf],
    ) -> Result<(), ContainerError> {
        mkdir(&rec.layer_dir, 0o700)?;
        mkdir(&rec.layer_dir.join("upper"), 0o755)?;
        mkdir(&rec.layer_dir.join("work"), 0o700)?;
        // 0711: a container in a user namespace (its root is an unprivileged
        // host uid) must reach its rootfs; nothing in them can be listed.
        mkdir(&rec.state_dir, 0o711)?;
        mkdir(&rec.bundle, 0o711)?;
        mkdir(&rec.rootfs, 0o755)?;
        crust_linux::mounts::mount_overlay(
            lowers,
            &rec.layer_dir.join("upper"),
            &rec.layer_dir.join("work"),
            &rec.rootfs,
        )
        .map_err(ContainerError::internal)
    }

    fn read_rootfs_file(&self, rootfs: &Path, rel: &str) -> Result<Option<String>, ContainerError> {
        crust_linux::mounts::read_file_in_root(rootfs, rel, MAX_ETC_FILE)
            .map(|o| o.map(|b| String::from_utf8_lossy(&b).into_owned()))
            .map_err(ContainerError::internal)
    }

    fn prepare_mount_points(&self, rootfs: &Path, files: &[&str]) -> Result<(), ContainerError> {
        for dir in KERNEL_MOUNT_POINTS {
            let link = crust_linux::rootfs::symlink_on_path(rootfs, dir)
                .map_err(ContainerError::internal)?;
            if let Some(link) = link {
                return Err(ContainerError::FailedPrecondition(format!(
                    "config.image.image: the image's /{link} is a symlink; /{dir} must be a \
                     directory (the runtime mounts a kernel file system there)"
                )));
            }
        }
        for file in files {
            if crust_linux::rootfs::replace_symlink_with_file(rootfs, file, 0o644)
                .map_err(ContainerError::internal)?
            {
                debug!(rootfs = %rootfs.display(), file, "replaced the image's symlink with the pod's file");
            }
        }
        Ok(())
    }

    fn resolve_in_rootfs(
        &self,
        rootfs: &Path,
        path: &str,
        field: &str,
    ) -> Result<String, ContainerError> {
        crust_linux::rootfs::resolve_path(rootfs, path).map_err(|e| match &e {
            crust_linux::Error::Io { source, .. } if source.raw_os_error() == Some(libc::ELOOP) => {
                ContainerError::InvalidArgument(format!(
                    "{field}: {} goes through a symlink loop of the image",
                    crust_quote::quote(path)
                ))
            }
            _ => ContainerError::internal(e),
        })
    }

    fn make_working_dir(
        &self,
        rootfs: &Path,
        real: &str,
        field: &str,
    ) -> Result<(), ContainerError> {
        match crust_linux::rootfs::make_dirs(rootfs, real, 0o755) {
            Ok(made) => {
                if made {
                    debug!(rootfs = %rootfs.display(), dir = real, "made the working dir the image lacks");
                }
                Ok(())
            }
            Err(crust_linux::Error::Io { source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENOTDIR | libc::ELOOP | libc::EEXIST)
                ) =>
            {
                Err(ContainerError::FailedPrecondition(format!(
                    "{field}: {} is not a directory in the image",
                    crust_quote::quote(real)
                )))
            }
            Err(e) => Err(ContainerError::internal(e)),
        }
    }

    fn spec_host(&self) -> &dyn crust_oci::Host {
        &self.node
    }

    fn prime_cgroup_migration(&self) {
        tokio::task::spawn_blocking(|| {
            if let Err(e) = crust_linux::migration::prime() {
                debug!("priming the cgroup migration lock: {e}");
            }
        });
    }

    async fn launch(&self, launch: Launch) -> Result<i32, ContainerError> {
        match self.launcher.create(launch).await {
            Ok(monitor) => Ok(monitor.pid()),
            Err(LaunchError::Bundle(m)) => Err(ContainerError::Internal(m)),
            Err(LaunchError::LogPath(m)) => Err(ContainerError::FailedPrecondition(m)),
            Err(LaunchError::Monitor(e)) => Err(ContainerError::Internal(format!(
                "creating the container: {e}"
            ))),
        }
    }

    async fn start(&self, state_dir: &Path) -> Result<(), ContainerError> {
        connect(state_dir)?
            .start()
            .await
            .map_err(ContainerError::from_monitor)
    }

    async fn kill(&self, state_dir: &Path, signal: i32, all: bool) -> Result<(), ContainerError> {
        match Monitor::connect(state_dir) {
            Ok(m) => m
                .kill(signal, all)
                .await
                .map_err(ContainerError::from_monitor),
            Err(_) => Ok(()),
        }
    }

    async fn wait(&self, state_dir: &Path) -> Result<(), ContainerError> {
        connect(state_dir)?
            .wait()
            .await
            .map(drop)
            .map_err(ContainerError::from_monitor)
    }

    async fn update(&self, state_dir: &Path, resources: &Value) -> Result<(), ContainerError> {
        connect(state_dir)?
            .update(resources)
            .await
            .map_err(ContainerError::from_monitor)
    }

    async fn checkpoint(
        &self,
        state_dir: &Path,
        image_path: &Path,
        work_path: &Path,
        timeout: std::time::Duration,
    ) -> Result<(), ContainerError> {
        connect(state_dir)?
            .checkpoint(image_path, work_path, timeout)
            .await
            .map_err(ContainerError::from_monitor)
    }

    async fn reopen_log(&self, state_dir: &Path) -> Result<(), ContainerError> {
        connect(state_dir)?
            .reopen_log()
            .await
            .map_err(ContainerError::from_monitor)
    }

    async fn exec_sync(
        &self,
        state_dir: &Path,
        req: &ExecRequest,
    ) -> Result<ExecSyncOutput, ContainerError> {
        connect(state_dir)?
            .exec_sync(req)
            .await
            .map_err(ContainerError::from_monitor)
    }

    fn exit_file(&self, state_dir: &Path) -> Option<ExitInfo> {
        monitor::exit_file(state_dir).ok().flatten()
    }

    fn monitor_running(&self, state_dir: &Path) -> bool {
        monitor::is_running(state_dir)
    }

    async fn monitor_status(&self, state_dir: &Path) -> Option<Status> {
        let m = Monitor::connect(state_dir).ok()?;
        m.state().await.ok().map(|s| s.status)
    }

    async fn monitor_pid(&self, state_dir: &Path) -> Option<i32> {
        let m = Monitor::connect(state_dir).ok()?;
        m.state().await.ok().map(|s| s.pid).filter(|&p| p > 0)
    }

    async fn monitor_started_at(&self, state_dir: &Path) -> Option<i64> {
        let m = Monitor::connect(state_dir).ok()?;
        let s = m.state().await.ok()?;
        (s.started_at_unix_nanos > 0).then_some(s.started_at_unix_nanos)
    }

    fn apply_checkpoint(
        &self,
        rec: &ContainerRecord,
        archive: &Path,
    ) -> Result<(), ContainerError> {
        super::restore::unpack(
            archive,
            &rec.rootfs,
            &super::restore::CheckpointArchive::images_dir(&rec.layer_dir),
        )
    }

    async fn reap_monitor(&self, state_dir: &Path) -> bool {
        let Ok(m) = Monitor::connect(state_dir) else {
            return false;
        };
        // Last resort: the container should have exited already.
        m.kill_and_reap(KILL_WAIT, Duration::from_millis(20)).await;
        true
    }

    fn kill_orphan(&self, rec: &ContainerRecord) {
        let Some(cg) = self.container_cgroup(rec) else {
            // No cgroupsPath: the bundle was never written, so no runtime
            // ever ran anything for it.
            debug!(id = %rec.id, "the container's monitor is gone; it had no cgroup yet");
            return;
        };
        match self.cgroups.kill_container(&cg) {
            Ok(true) => {
                info!(id = %rec.id, cgroup = %cg.path(), "the container's monitor is gone: killed what was left of the container")
            }
            Ok(false) => {}
            Err(e) => {
                warn!(id = %rec.id, cgroup = %cg.path(), "the container's monitor is gone; cannot kill its processes: {e}")
            }
        }
    }

    fn set_oom_score_adj(&self, rec: &ContainerRecord, value: i32) -> Result<(), ContainerError> {
        let cg = self.container_cgroup(rec).ok_or_else(|| {
            ContainerError::FailedPrecondition(format!(
                "container {}: its cgroup is unknown",
                rec.id
            ))
        })?;
        let pids = self
            .cgroups
            .fs()
            .cgroup(cg.path().clone())
            .pids()
            .map_err(|e| {
                ContainerError::Internal(format!("the processes of {}: {e}", cg.path()))
            })?;
        for pid in pids {
            // A process that has just exited is no error. One forked
            // between the read and the write keeps its parent's old value:
            // the window is one loop.
            match std::fs::write(format!("/proc/{pid}/oom_score_adj"), value.to_string()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ContainerError::Internal(format!(
                        "setting oom_score_adj {value} of process {pid}: {e}"
                    )));
                }
            }
        }
        Ok(())
    }

    fn container_cgroup(&self, rec: &ContainerRecord) -> Option<ContainerCgroup> {
        let path = match &rec.cgroups_path {
            Some(p) => p.clone(),
            None => {
                let data = std::fs::read(rec.bundle.join("config.json")).ok()?;
                let spec = serde_json::from_slice::<Value>(&data).ok()?;
                spec["linux"]["cgroupsPath"].as_str()?.to_string()
            }
        };
        match ContainerCgroup::parse(&path) {
            Ok(cg) => Some(cg),
            Err(e) => {
                warn!(id = %rec.id, "the container's cgroupsPath: {e}");
                None
            }
        }
    }

    fn unified_controllers(
        &self,
        path: &CgroupPath,
    ) -> Result<Option<Controllers>, ContainerError> {
        self.cgroups
            .unified_controllers(path)
            .map_err(|e| ContainerError::Internal(format!("reading {path}'s controllers: {e}")))
    }

    fn write_unified(
        &self,
        rec: &ContainerRecord,
        unified: &HashMap<String, String>,
    ) -> Result<(), ContainerError> {
        if unified.is_empty() {
            return Ok(());
        }
        let Some(cg) = self.container_cgroup(rec) else {
            return Ok(());
        };
        self.cgroups.write_unified(&cg, unified).map_err(|e| {
            ContainerError::Internal(format!("writing the unified keys into {}: {e}", cg.path()))
        })
    }

    fn delete_runtime_state(&self, rec: &ContainerRecord) {
        match &rec.runtime {
            RuntimeConfig::Embedded { root, .. } => {
                let dir = root.join(&rec.id);
                let _ = crust_linux::remove_tree::remove_tree(&dir);
            }
            RuntimeConfig::Cli { path, root, .. } => {
                if root.join(&rec.id).exists() {
                    let _ = std::process::Command::new(path)
                        .arg("--root")
                        .arg(root)
                        .args(["delete", "--force", &rec.id])
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status();
                }
            }
        }
    }

    fn unmount_rootfs(&self, rootfs: &Path) -> Result<(), ContainerError> {
        crust_linux::mounts::unmount(rootfs).map_err(ContainerError::internal)
    }

    fn mount_image_volume(
        &self,
        rec: &ContainerRecord,
        index: usize,
        lowers: &[PathBuf],
        sub_path: &str,
        userns: Option<&crust_oci::UserNs>,
    ) -> Result<PathBuf, ContainerError> {
        let dir = rec.state_dir.join(IMAGE_VOLUMES);
        let empty = dir.join("empty");
        let target = dir.join(index.to_string());
        mkdir(&empty, 0o755)?;
        mkdir(&target, 0o755)?;
        let mapped;
        let lowers = match userns {
            None => lowers,
            Some(userns) => {
                let layers = rec.state_dir.join(IMAGE_VOLUME_LAYERS);
                mkdir(&layers, 0o711)?;
                let mut out = Vec::with_capacity(lowers.len());
                for (i, lower) in lowers.iter().enumerate() {
                    let t = layers.join(format!("{index}-{i}"));
                    mkdir(&t, 0o755)?;
                    crust_linux::mounts::mount_idmapped(lower, &t, &userns.path)
                        .map_err(ContainerError::internal)?;
                    out.push(t);
                }
                mapped = out;
                &mapped
            }
        };
        crust_linux::mounts::mount_overlay_readonly(lowers, &empty, &target)
            .map_err(ContainerError::internal)?;
        crust_linux::mounts::resolve_in_root(&target, sub_path).map_err(|e| {
            if e.is_invalid_argument() {
                ContainerError::InvalidArgument(format!(
                    "config.mounts[{index}].image_sub_path: {e}"
                ))
            } else {
                ContainerError::internal(e)
            }
        })
    }

    fn idmap_layers(
        &self,
        rec: &ContainerRecord,
        lowers: &[PathBuf],
        userns: &crust_oci::UserNs,
    ) -> Result<Vec<PathBuf>, ContainerError> {
        let dir = rec.state_dir.join(IDMAPPED_LAYERS);
        let mut out = Vec::with_capacity(lowers.len());
        for (i, lower) in lowers.iter().enumerate() {
            let target = dir.join(i.to_string());
            mkdir(&target, 0o755)?;
            crust_linux::mounts::mount_idmapped(lower, &target, &userns.path)
                .map_err(ContainerError::internal)?;
            out.push(target);
        }
        let (uid, gid) = (userns.uid.host_id, userns.gid.host_id);
        for d in [rec.layer_dir.join("upper"), rec.layer_dir.join("work")] {
            mkdir(&d, 0o755)?;
            std::os::unix::fs::chown(&d, Some(uid), Some(gid))
                .map_err(|e| ContainerError::Internal(format!("chown {}: {e}", d.display())))?;
        }
        Ok(out)
    }

    fn idmap_mount(
        &self,
        rec: &ContainerRecord,
        index: usize,
        source: &Path,
        userns: &crust_oci::UserNs,
    ) -> Result<PathBuf, ContainerError> {
        if !source.is_absolute() {
            return Err(ContainerError::InvalidArgument(format!(
                "config.mounts[{index}].host_path: {} is not an absolute path",
                crust_quote::quote(&source.to_string_lossy())
            )));
        }
        let meta = std::fs::metadata(source).map_err(|e| {
            ContainerError::InvalidArgument(format!(
                "config.mounts[{index}].host_path: {}: {e}",
                crust_quote::quote(&source.to_string_lossy())
            ))
        })?;
        let dir = rec.state_dir.join(IDMAPPED_MOUNTS);
        mkdir(&dir, 0o711)?;
        let target = dir.join(index.to_string());
        if meta.is_dir() {
            mkdir(&target, 0o755)?;
        } else {
            // A file (or device) is bind-mounted onto a file.
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&target)
                .map_err(|e| {
                    ContainerError::Internal(format!("creating {}: {e}", target.display()))
                })?;
        }
        crust_linux::mounts::mount_idmapped(source, &target, &userns.path).map_err(|e| {
            ContainerError::InvalidArgument(format!(
                "config.mounts[{index}].uidMappings: cannot id-map {} (does its filesystem \
                 support id-mapped mounts?): {e}",
                crust_quote::quote(&source.to_string_lossy())
            ))
        })?;
        Ok(target)
    }

    fn unmount_private_mounts(&self, rec: &ContainerRecord) -> Result<(), ContainerError> {
        // Image volumes before the layers under them.
        for sub in [
            IMAGE_VOLUMES,
            IMAGE_VOLUME_LAYERS,
            IDMAPPED_LAYERS,
            IDMAPPED_MOUNTS,
        ] {
            let dir = rec.state_dir.join(sub);
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(ContainerError::Internal(format!(
                        "reading {}: {e}",
                        dir.display()
                    )));
                }
            };
            for entry in entries.flatten() {
                crust_linux::mounts::unmount(&entry.path()).map_err(ContainerError::internal)?;
            }
        }
        Ok(())
    }

    fn remove_tree(&self, dir: &Path) -> Result<(), ContainerError> {
        // Never through a mount left inside (the rootfs, an image volume
        // whose unmount failed): refused with EBUSY, its contents kept.
        crust_linux::remove_tree::remove_tree(dir)
            .map_err(|e| ContainerError::Internal(format!("removing {}: {e}", dir.display())))
    }

    fn read_spec(&self, bundle: &Path) -> Value {
        std::fs::read(bundle.join("spec.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null)
    }
}
