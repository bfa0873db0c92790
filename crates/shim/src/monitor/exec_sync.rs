//! Exec-syncs (probes and `crictl exec --sync`): a runtime `exec --detach`
//! with two pipes, run by the container's own monitor. Output streams
//! straight to the requesting control connection as attach frames (at
//! most 16 MiB per stream; the rest is read and dropped), then one exit
//! frame; the pipes are not read while that connection is behind.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crust_linux::children::ChildExit;
use crust_linux::poll::PollFlags;
use crust_shim_protocol::{
    EXEC_SYNC_OUTPUT_CAP, ExecRequest, ExecSyncResult, STREAM_EXIT, STREAM_STDERR, STREAM_STDOUT,
    Status,
};

use super::container_io::output_pipe;
use super::control::{Controls, Waiting};
use super::exec_session::build_process;
use super::exit::exit_code;
use super::{BACKPRESSURE, Error, Monitor, PollSet, Tok};
use crate::runtime::{ExecOptions, Stdio};

/// Bytes read from an exec-sync's pipe at a time.
const READ_CHUNK: usize = 32 * 1024;

/// A running exec-sync.
struct Job {
    /// The control connection that asked.
    client: u64,
    pid: i32,
    /// stdout, stderr.
    outs: [Option<File>; 2],
    sent: [usize; 2],
    truncated: [bool; 2],
    deadline: Option<Instant>,
    status: Option<ChildExit>,
    timed_out: bool,
}

impl Job {
    fn running(&self) -> bool {
        self.status.is_none()
    }
}

/// The running exec-syncs.
#[derive(Default)]
pub(super) struct Jobs {
    jobs: BTreeMap<u64, Job>,
    /// Numbers the per-job files in the state dir.
    seq: u64,
}

impl Jobs {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The pipes of jobs whose connection is not too far behind.
    pub fn register<'a>(&'a self, set: &mut PollSet<'a>, ctl: &Controls) {
        for (id, j) in &self.jobs {
            if ctl.pending(j.client) >= BACKPRESSURE {
                continue;
            }
            for (i, o) in j.outs.iter().enumerate() {
                if let Some(f) = o {
                    set.add(f.as_fd(), PollFlags::POLLIN, Tok::JobOut(*id, i));
                }
            }
        }
    }

    /// The earliest timeout of a job still running.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.jobs
            .values()
            .filter(|j| j.running() && !j.timed_out)
            .filter_map(|j| j.deadline)
            .min()
    }

    /// A reaped child: if it is a job's process, the job is done.
    pub fn on_reaped(&mut self, pid: i32, exit: ChildExit) {
        if let Some(j) = self.jobs.values_mut().find(|j| j.pid == pid) {
            j.status = Some(exit);
        }
    }

    /// Kills job `id`'s process tree if it still runs: nobody wants the
    /// result.
    pub fn abandon(&mut self, id: u64) {
        if let Some(j) = self.jobs.get(&id)
            && j.running()
        {
            kill_job_tree(j.pid);
        }
    }

    /// Kills every job's process tree (the container has exited).
    pub fn kill_all(&self) {
        for j in self.jobs.values().filter(|j| j.running()) {
            kill_job_tree(j.pid);
        }
    }
}

/// Kills an exec-sync's process and all it started that can still be
/// told from the container's own processes (see `crust_linux::proctree`):
/// a probe that timed out must not leave its background children behind.
/// `pid` is our child, not yet reaped.
fn kill_job_tree(pid: i32) {
    match crust_linux::proctree::kill_tree(pid) {
        Ok(r) if r.unfinished => {
            eprintln!(
                "crust-shim: exec-sync {pid}: its process tree still grew after the last walk ({} killed)",
                r.members
            )
        }
        Ok(_) => {}
        Err(e) => {
            eprintln!("crust-shim: exec-sync {pid}: killing its process tree: {e}");
            let _ = crust_linux::process::send_signal(pid, libc::SIGKILL);
        }
    }
}

impl Monitor {
    /// Starts an exec-sync for control connection `client`; its pid.
    pub(super) fn start_job(&mut self, client: u64, req: ExecRequest) -> Result<i32, Error> {
        if self.status != Status::Running || self.reaped.is_some() {
            return Err(Error::FailedPrecondition("the container is not running"));
        }
        if req.tty || req.stdin {
            return Err(Error::InvalidArgument(
                "exec-sync has neither tty nor stdin".into(),
            ));
        }
        let process = build_process(&self.bundle, &req, false)?;
        self.jobs.seq += 1;
        let seq = self.jobs.seq;
        let pfile = self.dir.join(format!("exec-sync-{seq}.json"));
        let pidfile = self.dir.join(format!("exec-sync-{seq}.pid"));
        fs::write(&pfile, serde_json::to_vec(&process).unwrap_or_default())
            .map_err(Error::io(format!("writing {}", pfile.display())))?;
        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        let r = self.runtime.exec(
            &self.id,
            ExecOptions {
                process: &pfile,
                pid_file: &pidfile,
                console_socket: None,
                own_orphans: true,
                stdio: Stdio {
                    stdin: None,
                    stdout: Some(out_w),
                    stderr: Some(err_w),
                },
            },
        );
        let _ = fs::remove_file(&pfile);
        let _ = fs::remove_file(&pidfile);
        let pid = r?;
        let jid = self.ids.next();
        self.jobs.jobs.insert(
            jid,
            Job {
                client,
                pid,
                outs: [Some(out_r), Some(err_r)],
                sent: [0, 0],
                truncated: [false, false],
                deadline: (req.timeout_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(req.timeout_ms)),
                status: None,
                timed_out: false,
            },
        );
        self.ctl.set_waiting(client, Waiting::Job(jid));
        Ok(pid)
    }

    /// Reads pipe `i` of job `jid` (a few chunks, or all with `drain`) and
    /// forwards it, up to the cap.
    pub(super) fn read_job(&mut self, jid: u64, i: usize, drain: bool) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut rounds = if drain { 256 } else { 4 };
        while rounds > 0 {
            rounds -= 1;
            let Some(j) = self.jobs.jobs.get_mut(&jid) else {
                return;
            };
            let Some(f) = j.outs[i].as_mut() else { return };
            let n = match f.read(&mut buf) {
                Ok(0) => {
                    j.outs[i] = None;
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    j.outs[i] = None;
                    return;
                }
            };
            let room = EXEC_SYNC_OUTPUT_CAP - j.sent[i];
            let take = n.min(room);
            if take < n {
                j.truncated[i] = true;
            }
            if take == 0 {
                continue;
            }
            j.sent[i] += take;
            let stream = if i == 0 { STREAM_STDOUT } else { STREAM_STDERR };
            if let Some(pending) = self.ctl.send_frame(j.client, stream, &buf[..take])
                && !drain
                && pending >= BACKPRESSURE
            {
                return;
            }
        }
    }

    /// Timeouts and completions of exec-syncs.
    pub(super) fn progress_jobs(&mut self) {
        let now = Instant::now();
        let ids: Vec<u64> = self.jobs.jobs.keys().copied().collect();
        for id in ids {
            let Some(j) = self.jobs.jobs.get_mut(&id) else {
                continue;
            };
            if j.running() && !j.timed_out && j.deadline.is_some_and(|d| now >= d) {
                j.timed_out = true;
                kill_job_tree(j.pid);
            }
            if !j.running() {
                self.finish_job(id);
            }
        }
    }

    fn finish_job(&mut self, jid: u64) {
        // The process is gone: what it wrote is in the pipes.
        self.read_job(jid, 0, true);
        self.read_job(jid, 1, true);
        let Some(j) = self.jobs.jobs.remove(&jid) else {
            return;
        };
        let exit_code = j.status.map_or(255, |s| exit_code(s).0);
        let result = ExecSyncResult {
            exit_code,
            timed_out: j.timed_out,
            stdout_truncated: j.truncated[0],
            stderr_truncated: j.truncated[1],
            error: None,
        };
        self.trim_soon();
        let payload = serde_json::to_vec(&result).unwrap_or_default();
        if self
            .ctl
            .send_frame(j.client, STREAM_EXIT, &payload)
            .is_some()
        {
            self.ctl.set_waiting(j.client, Waiting::No);
        }
    }
}
