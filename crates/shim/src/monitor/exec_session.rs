//! Exec sessions (kubectl exec): the container's monitor starts a monitor
//! of its own for each, in exec mode, with a state directory
//! `exec/<id>/`. That monitor waits for its first attach client before it
//! reads any output (so none is lost), gives up after the attach timeout,
//! and kills the process when its last client detaches.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crust_shim_protocol::{
    DEFAULT_PATH, EXEC_CONFIG_FILE, EXEC_DIR, ExecConfig, ExecRequest, ExecStarted, PROCESS_FILE,
    Reply, StartupResult, Status, startup, valid_exec_id,
};

use super::startup::read_json;
use super::{Error, Monitor};

/// How long the container monitor waits for an exec session to start.
const EXEC_START_TIMEOUT: Duration = Duration::from_secs(120);

/// The OCI `process` for an exec: the container's own (user, capabilities,
/// env, cwd, rlimits, apparmor, no_new_privs...) with the request's argv,
/// extra env, cwd and tty; or the request's complete `process`.
pub fn build_process(
    bundle: &Path,
    req: &ExecRequest,
    tty: bool,
) -> Result<serde_json::Value, Error> {
    use serde_json::{Value, json};
    let invalid = |m: &str| Error::InvalidArgument(m.to_string());
    let mut p = match &req.process {
        Some(p) => p.clone(),
        None => {
            if req.args.is_empty() {
                return Err(invalid("exec needs args"));
            }
            let spec: Value = read_json(&bundle.join("config.json"))
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            let mut p = spec
                .get("process")
                .cloned()
                .ok_or_else(|| invalid("the container's config.json has no process"))?;
            p["args"] = json!(req.args);
            if !req.env.is_empty() {
                let mut env: Vec<Value> = p
                    .get("env")
                    .and_then(|e| e.as_array())
                    .cloned()
                    .unwrap_or_default();
                env.extend(req.env.iter().map(|e| json!(e)));
                p["env"] = Value::Array(env);
            }
            if let Some(cwd) = &req.cwd {
                p["cwd"] = json!(cwd);
            }
            p
        }
    };
    let obj = p
        .as_object_mut()
        .ok_or_else(|| invalid("process is not an object"))?;
    obj.insert("terminal".into(), json!(tty));
    match req.console_size {
        Some((w, h)) if tty => {
            obj.insert("consoleSize".into(), json!({"width": w, "height": h}));
        }
        _ => {
            obj.remove("consoleSize");
        }
    }
    Ok(p)
}

impl Monitor {
    /// Starts exec session `req.exec_id` in its own monitor.
    pub(super) fn start_exec_session(&mut self, req: ExecRequest) -> Result<Reply, Error> {
        if self.status != Status::Running || self.reaped.is_some() {
            return Err(Error::FailedPrecondition("the container is not running"));
        }
        if !valid_exec_id(&req.exec_id) {
            return Err(Error::InvalidArgument(format!(
                "invalid exec id {:?}",
                req.exec_id
            )));
        }
        let parent = self.dir.join(EXEC_DIR);
        fs::create_dir_all(&parent).map_err(Error::io(format!("creating {EXEC_DIR}")))?;
        let sdir = parent.join(&req.exec_id);
        match fs::DirBuilder::new().mode(0o700).create(&sdir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(Error::InvalidArgument(format!(
                    "exec id {} is in use",
                    req.exec_id
                )));
            }
            Err(e) => return Err(Error::io(format!("creating {}", sdir.display()))(e)),
        }
        let r = self.spawn_exec_session(&sdir, &req);
        if r.is_err() {
            let _ = fs::remove_dir_all(&sdir);
        }
        r
    }

    fn spawn_exec_session(&mut self, sdir: &Path, req: &ExecRequest) -> Result<Reply, Error> {
        let process = build_process(&self.bundle, req, req.tty)?;
        fs::write(
            sdir.join(PROCESS_FILE),
            serde_json::to_vec(&process).unwrap_or_default(),
        )
        .map_err(Error::io(format!("writing {PROCESS_FILE}")))?;
        let cfg = ExecConfig {
            container_id: self.id.clone(),
            runtime: self.runtime_cfg.clone(),
            tty: req.tty,
            stdin: req.stdin,
            attach_timeout_ms: req.timeout_ms,
        };
        fs::write(
            sdir.join(EXEC_CONFIG_FILE),
            serde_json::to_vec(&cfg).unwrap_or_default(),
        )
        .map_err(Error::io(format!("writing {EXEC_CONFIG_FILE}")))?;
        // The same binary as ours, even if the file was replaced since.
        let mut child = Command::new("/proc/self/exe")
            .arg("exec")
            .arg(sdir)
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(Error::io("starting the exec monitor"))?;
        // It stays our child; the SIGCHLD handler reaps it when it ends.
        let out = child
            .stdout
            .take()
            .ok_or_else(|| Error::Internal("exec monitor: no pipe".into()))?;
        let line = startup::read_line(out.into(), EXEC_START_TIMEOUT).map_err(|e| {
            let _ = child.kill();
            Error::io("exec monitor")(e)
        })?;
        match startup::parse(&line).map_err(|e| Error::Internal(format!("exec monitor: {e}")))? {
            StartupResult::Ok { shim_pid, pid } => Ok(Reply::ExecStarted(ExecStarted {
                exec_id: req.exec_id.clone(),
                pid,
                shim_pid,
                state_dir: sdir.to_path_buf(),
            })),
            StartupResult::Err { message } => Err(Error::ExecSession(message)),
        }
    }

    /// An exec session's own rules, each round: without a first client in
    /// time the process is killed; its exit is recorded once a client is
    /// (or was) there to see it, or nobody is expected any more.
    pub(super) fn progress_exec_session(&mut self) {
        if self.exit.is_some() {
            return;
        }
        let expired = self.attach.deadline_passed(Instant::now());
        if !self.attach.had_client() && expired && self.reaped.is_none() {
            eprintln!("crust-shim: no client attached in time, killing the exec process");
            let _ = crust_linux::process::send_signal(self.pid, libc::SIGKILL);
            self.attach.clear_deadline();
        }
        if self.reaped.is_some()
            && (!self.attach.is_empty()
                || self.attach.had_client()
                || expired
                || !self.attach.has_deadline())
        {
            self.finalize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_process_comes_from_the_container_with_the_request_on_top() {
        let d = tempfile::tempdir().unwrap();
        let spec = serde_json::json!({"process": {
            "args": ["sleep", "1"], "env": ["A=1"], "cwd": "/", "user": {"uid": 5, "gid": 5},
            "consoleSize": {"width": 1, "height": 1}
        }});
        fs::write(d.path().join("config.json"), spec.to_string()).unwrap();
        let req = ExecRequest {
            args: vec!["sh".into()],
            env: vec!["B=2".into()],
            cwd: Some("/tmp".into()),
            console_size: Some((80, 24)),
            ..Default::default()
        };
        let p = build_process(d.path(), &req, true).unwrap();
        assert_eq!(p["args"], serde_json::json!(["sh"]));
        assert_eq!(p["env"], serde_json::json!(["A=1", "B=2"]));
        assert_eq!(
            (p["cwd"].as_str(), p["user"]["uid"].as_u64()),
            (Some("/tmp"), Some(5))
        );
        assert_eq!(p["terminal"], true);
        assert_eq!(
            p["consoleSize"],
            serde_json::json!({"width": 80, "height": 24})
        );
        let p = build_process(d.path(), &req, false).unwrap();
        assert!(p.get("consoleSize").is_none());
        let none = ExecRequest::default();
        let e = build_process(d.path(), &none, false).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}
