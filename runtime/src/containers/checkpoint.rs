//! CheckpointContainer: CRIU images of a running container (through its
//! monitor) plus what a restore needs, in one tar archive with the layout
//! CRI-O writes and checkpointctl reads:
//!
//! ```text
//! checkpoint/        criu's images
//! config.dump        container metadata (id, name, image, runtime, times)
//! spec.dump          the container's OCI spec (config.json)
//! rootfs-diff.tar    the writable layer's files (whiteouts left out)
//! deleted.files      JSON list of the image files the container deleted
//! container.log      the container's CRI log, when it has one
//! restore.json       crust's restore metadata (pod, container config, mounts)
//! ```

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{ContainerError, ContainerState, Containers};
use crate::containers::ContainerRecord;

/// The staging dir under the container's layer dir (same file system as
/// its upper dir, never the tmpfs of the run dir: memory dumps are big).
const STAGING_PREFIX: &str = "checkpoint.";

impl Containers {
    /// Writes the checkpoint archive of running container `id` to
    /// `location` within `timeout`. The container keeps running whatever
    /// happens; on failure nothing is left at `location` or in the staging
    /// dir.
    pub async fn checkpoint(
        &self,
        id: &str,
        location: &Path,
        timeout: Duration,
    ) -> Result<(), ContainerError> {
        let rec = self.get(id)?;
        if rec.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {} is not running: only a running container can be checkpointed",
                rec.id
            )));
        }
        let parent = location.parent().unwrap_or(Path::new("/"));
        if !parent.is_dir() {
            return Err(ContainerError::InvalidArgument(format!(
                "location: its directory {} does not exist",
                parent.display()
            )));
        }
        if fs::symlink_metadata(location).is_ok() {
            return Err(ContainerError::AlreadyExists(format!(
                "location: {} exists already",
                location.display()
            )));
        }
        let deadline = Instant::now() + timeout;
        let staging = rec.layer_dir.join(format!(
            "{STAGING_PREFIX}{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        let r = self
            .checkpoint_into(&rec, &staging, location, deadline)
            .await;
        let cleanup = staging.clone();
        let _ = tokio::task::spawn_blocking(move || fs::remove_dir_all(cleanup)).await;
        r
    }

    async fn checkpoint_into(
        &self,
        rec: &ContainerRecord,
        staging: &Path,
        location: &Path,
        deadline: Instant,
    ) -> Result<(), ContainerError> {
        let images = staging.join("checkpoint");
        let work = staging.join("work");
        for d in [staging, &images, &work] {
            fs::create_dir(d).map_err(|e| io_error("creating", d, e))?;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        self.host
            .checkpoint(&rec.state_dir, &images, &work, left)
            .await
            .map_err(|e| match e {
                ContainerError::Internal(m) => ContainerError::Internal(format!(
                    "checkpointing with criu: {m}{}",
                    dump_log_tail(&work)
                )),
                other => other,
            })?;
        let spec = self.host.read_spec(&rec.bundle);
        let (rec, staging, location) = (rec.clone(), staging.to_path_buf(), location.to_path_buf());
        let write =
            tokio::task::spawn_blocking(move || write_archive(&rec, &spec, &staging, &location));
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, write).await {
            Ok(joined) => joined.map_err(ContainerError::internal)?,
            Err(_) => Err(ContainerError::DeadlineExceeded(
                "checkpoint: the archive was not written within the timeout".into(),
            )),
        }
    }
}

fn io_error(what: &str, path: &Path, e: io::Error) -> ContainerError {
    ContainerError::Internal(format!("checkpoint: {what} {}: {e}", path.display()))
}

/// The end of criu's dump log (runc leaves it in the work dir): where
/// criu says what it could not dump.
fn dump_log_tail(work: &Path) -> String {
    let Ok(text) = fs::read_to_string(work.join("dump.log")) else {
        return String::new();
    };
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    match errors.last() {
        Some(l) => format!(" (criu: {})", crust_quote::truncate(l.trim(), 256)),
        None => String::new(),
    }
}

/// Everything but the criu images, then the archive: written next to
/// `location` and renamed into place, so a reader never sees half of it.
fn write_archive(
    rec: &ContainerRecord,
    spec: &serde_json::Value,
    staging: &Path,
    location: &Path,
) -> Result<(), ContainerError> {
    let put = |name: &str, data: &[u8]| {
        let p = staging.join(name);
        fs::write(&p, data).map_err(|e| io_error("writing", &p, e))
    };
    put(
        "spec.dump",
        &serde_json::to_vec_pretty(spec).map_err(ContainerError::internal)?,
    )?;
    put(
        "config.dump",
        &serde_json::to_vec_pretty(&config_dump(rec)).map_err(ContainerError::internal)?,
    )?;
    put(
        "restore.json",
        &serde_json::to_vec_pretty(&restore_info(rec)).map_err(ContainerError::internal)?,
    )?;
    let deleted = rootfs_diff(
        &rec.layer_dir.join("upper"),
        &staging.join("rootfs-diff.tar"),
    )?;
    put(
        "deleted.files",
        &serde_json::to_vec(&deleted).map_err(ContainerError::internal)?,
    )?;
    if let Some(log) = &rec.log_path
        && log.is_file()
    {
        let to = staging.join("container.log");
        fs::copy(log, &to).map_err(|e| io_error("copying the log to", &to, e))?;
    }
    let tmp = location.with_file_name(format!(
        ".{}.crust-tmp",
        location.file_name().unwrap_or_default().to_string_lossy()
    ));
    let r = tar_dir(staging, &tmp, &["work"]).and_then(|()| {
        fs::rename(&tmp, location).map_err(|e| io_error("renaming into", location, e))
    });
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}

/// CRI-O's config.dump fields (checkpointctl shows them).
fn config_dump(rec: &ContainerRecord) -> serde_json::Value {
    let image = rec.reported_image();
    serde_json::json!({
        "id": rec.id,
        "name": rec.name,
        "rootfsImage": rec.image,
        "rootfsImageRef": rec.image_id,
        "rootfsImageName": image.name,
        "runtime": rec.handler,
        "createdTime": time(rec.created_at),
        "checkpointedTime": time(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or_default()
        ),
    })
}

/// What CreateContainer needs to restore: the pod and the container's
/// CRI config (mounts, env, labels, annotations) as it was created.
fn restore_info(rec: &ContainerRecord) -> serde_json::Value {
    let image = rec.reported_image();
    serde_json::json!({
        "version": 1,
        "podSandboxId": rec.pod_id,
        "containerName": rec.name,
        "attempt": rec.attempt,
        "image": image.name,
        "imageRef": image.image_ref,
        "imageId": rec.image_id,
        "labels": rec.labels,
        "annotations": rec.annotations,
        // ContainerConfig as protobuf, hex: every field, mounts included.
        "containerConfig": rec.config,
    })
}

/// RFC 3339 of nanoseconds since the epoch.
fn time(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let sub = nanos.rem_euclid(1_000_000_000);
    chrono_free_rfc3339(secs, sub as u32)
}

/// Days-from-civil (Howard Hinnant's algorithm), to avoid a date crate.
fn chrono_free_rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The upper dir as a tar (paths relative to the container's root);
/// whiteouts (0/0 character devices) become the returned deleted paths.
/// Symlinks are stored as links, never followed.
fn rootfs_diff(upper: &Path, out: &Path) -> Result<Vec<String>, ContainerError> {
    let file = fs::File::create(out).map_err(|e| io_error("creating", out, e))?;
    let mut tar = tar::Builder::new(io::BufWriter::new(file));
    tar.follow_symlinks(false);
    let mut deleted = Vec::new();
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = upper.join(&rel);
        let entries = fs::read_dir(&dir).map_err(|e| io_error("reading", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_error("reading", &dir, e))?;
            let path = entry.path();
            let name = rel.join(entry.file_name());
            let meta = fs::symlink_metadata(&path).map_err(|e| io_error("reading", &path, e))?;
            let kind = meta.file_type();
            if kind.is_char_device() && meta.rdev() == 0 {
                deleted.push(format!("/{}", name.display()));
                continue;
            }
            if kind.is_dir() {
                stack.push(name.clone());
            } else if !(kind.is_file() || kind.is_symlink()) {
                // Sockets, fifos and device nodes are not part of a
                // restorable writable layer.
                continue;
            }
            tar.append_path_with_name(&path, &name)
                .map_err(|e| io_error("archiving", &path, e))?;
        }
    }
    tar.into_inner()
        .and_then(|mut w| io::Write::flush(&mut w))
        .map_err(|e| io_error("writing", out, e))?;
    deleted.sort();
    Ok(deleted)
}

/// `dir` as a tar at `out`, top-level entries in `skip` left out.
fn tar_dir(dir: &Path, out: &Path, skip: &[&str]) -> Result<(), ContainerError> {
    let file = fs::File::create(out).map_err(|e| io_error("creating", out, e))?;
    let mut tar = tar::Builder::new(io::BufWriter::new(file));
    tar.follow_symlinks(false);
    let mut names: Vec<_> = fs::read_dir(dir)
        .map_err(|e| io_error("reading", dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| !skip.iter().any(|s| n == *s))
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let r = if path.is_dir() {
            tar.append_dir_all(&name, &path)
        } else {
            tar.append_path_with_name(&path, &name)
        };
        r.map_err(|e| io_error("archiving", &path, e))?;
    }
    tar.into_inner()
        .and_then(|mut w| io::Write::flush(&mut w))
        .map_err(|e| io_error("writing", out, e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_rfc3339() {
        assert_eq!(super::time(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            super::time(1_795_000_000_123_456_789),
            "2026-11-18T11:06:40.123456789Z"
        );
    }
}
