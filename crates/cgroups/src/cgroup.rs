//! A cgroup at a validated path, in every hierarchy of the host: create,
//! resources, stats, kill and recursive delete.

use std::path::Path;
use std::time::{Duration, Instant};

use crust_linux::retry::Retry;
use oci_spec::runtime::LinuxResources;

use crate::dir::CgroupDir;
use crate::error::{Error, Result};
use crate::hierarchy::{CgroupFs, Controller, Controllers, Hierarchy};
use crate::path::{CgroupPath, MAX_DEPTH};
use crate::resources::{Step, Write, plan};
use crate::stats::{self, Stats, StatsRequest};

/// How long [`Cgroup::delete`] waits for killed processes to go.
pub const DEFAULT_KILL_WAIT: Duration = Duration::from_secs(5);

/// How an rmdir is retried while the kernel still counts exiting tasks
/// (EBUSY), or is interrupted: every 10 ms for about 2 s.
const RMDIR_RETRY: Retry = Retry::BUSY
    .delays(Duration::from_millis(10), Duration::from_millis(10))
    .attempts(200);

/// A cgroup in the host's hierarchies. Cheap: touches nothing until a
/// method is called; every file access is confined (see the `dir` module).
#[derive(Debug, Clone)]
pub struct Cgroup<'a> {
    fs: &'a CgroupFs,
    path: CgroupPath,
}

impl<'a> Cgroup<'a> {
    pub(crate) fn new(fs: &'a CgroupFs, path: CgroupPath) -> Self {
        Cgroup { fs, path }
    }

    pub fn path(&self) -> &CgroupPath {
        &self.path
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.fs.hierarchy()
    }

    /// The controllers this cgroup has (v2: its `cgroup.controllers`).
    pub fn controllers(&self) -> Result<Controllers> {
        self.fs.controllers(&self.path)
    }

    fn open(&self, mount: &Path) -> Result<Option<CgroupDir>> {
        self.fs
            .open_existing(mount, &self.path)
            .map_err(Error::io("open cgroup", self.path.under(mount)))
    }

    fn open_required(&self, mount: &Path) -> Result<CgroupDir> {
        self.fs
            .open_dir(mount, &self.path)
            .map_err(Error::io("open cgroup", self.path.under(mount)))
    }

    /// Whether the cgroup exists in any hierarchy.
    pub fn exists(&self) -> bool {
        self.fs
            .all_mounts()
            .into_iter()
            .any(|m| matches!(self.fs.open_existing(m, &self.path), Ok(Some(_))))
    }

    /// The names of the cgroups right below this one, in any hierarchy
    /// (sorted, each once); none when it does not exist.
    pub fn children(&self) -> Result<Vec<String>> {
        let mut names = std::collections::BTreeSet::new();
        for mount in self.fs.all_mounts() {
            if let Some(dir) = self.open(mount)? {
                let subdirs = dir
                    .subdirs()
                    .map_err(Error::io("list cgroup", self.path.under(mount)))?;
                names.extend(subdirs);
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Creates a cgroup that will hold processes (a container's, the pause
    /// process's), with missing ancestors: on v1 in every controller
    /// hierarchy (cpuset ones get their parent's CPUs and nodes), on v2
    /// with the ancestors delegating every controller they have. Idempotent;
    /// on error the directories this call made are removed.
    pub fn create(&self) -> Result<()> {
        self.create_inner(false)
    }

    /// Like [`Cgroup::create`], for a cgroup whose processes live in child
    /// cgroups (a pod's): on v2 it delegates its controllers to its
    /// children too (a v2 cgroup that does cannot hold processes itself).
    pub fn create_for_children(&self) -> Result<()> {
        self.create_inner(true)
    }

    fn create_inner(&self, delegate_self: bool) -> Result<()> {
        if self.path.is_root() {
            return Ok(());
        }
        let mut created: Vec<(&Path, CgroupPath)> = Vec::new();
        let result = (|| {
            for mount in self.fs.controller_mounts() {
                self.create_in(mount, delegate_self, &mut created)?;
            }
            Ok(())
        })();
        if result.is_err() {
            for (mount, path) in created.iter().rev() {
                let _ = remove_one(self.fs, mount, path);
            }
        }
        result
    }

    fn create_in<'m>(
        &self,
        mount: &'m Path,
        delegate_self: bool,
        created: &mut Vec<(&'m Path, CgroupPath)>,
    ) -> Result<()> {
        let v2 = self.fs.hierarchy().is_unified();
        let mut dir = self
            .fs
            .open_dir(mount, &CgroupPath::root())
            .map_err(Error::io("open cgroup mount", mount))?;
        let cpuset = !v2 && dir.has("cpuset.cpus");
        let mut path = CgroupPath::root();
        for name in self.path.components() {
            if v2 {
                enable_controllers(&dir);
            }
            path = path.join(name)?;
            let made = dir
                .mkdir(name)
                .map_err(Error::io("create cgroup", path.under(mount)))?;
            if made {
                created.push((mount, path.clone()));
            }
            let child = dir
                .child(name)
                .map_err(Error::io("open cgroup", path.under(mount)))?;
            if made && cpuset {
                // A new v1 cpuset has no CPUs or nodes and refuses tasks.
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    copy_if_empty(&dir, &child, file)?;
                }
            }
            dir = child;
        }
        if v2 && delegate_self {
            enable_controllers(&dir);
        }
        Ok(())
    }

    /// An open descriptor of this (v2) cgroup's directory, to start a
    /// process in it with clone3(CLONE_INTO_CGROUP) instead of moving it
    /// after the fact. v1 has no such thing.
    pub fn open_fd(&self) -> Result<std::os::fd::OwnedFd> {
        match (self.fs.hierarchy(), self.fs.unified_mount()) {
            (Hierarchy::V2, Some(root)) => Ok(self.open_required(root)?.into_fd()),
            _ => Err(Error::unsupported(
                "CLONE_INTO_CGROUP",
                "a cgroup v2 feature",
            )),
        }
    }

    /// Moves process `pid` into this cgroup (every hierarchy where it
    /// exists).
    pub fn add_process(&self, pid: u32) -> Result<()> {
        let mut any = false;
        for mount in self.fs.all_mounts() {
            let Some(dir) = self.open(mount)? else {
                continue;
            };
            dir.write("cgroup.procs", &pid.to_string())
                .map_err(Error::io("write cgroup.procs", dir.path()))?;
            any = true;
        }
        if any { Ok(()) } else { Err(self.not_found()) }
    }

    fn not_found(&self) -> Error {
        Error::Io {
            op: "open cgroup",
            path: self.path.as_str().into(),
            source: std::io::ErrorKind::NotFound.into(),
        }
    }

    /// The processes in this cgroup and below, in every hierarchy, without
    /// duplicates, sorted.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let mut pids = Vec::new();
        let mut buf = Vec::new();
        for mount in self.fs.all_mounts() {
            for path in subtree(self.fs, mount, &self.path)? {
                let Some(dir) = self
                    .fs
                    .open_existing(mount, &path)
                    .map_err(Error::io("open cgroup", path.under(mount)))?
                else {
                    continue;
                };
                if dir
                    .read_into("cgroup.procs", &mut buf)
                    .map_err(Error::io("read", dir.file_path("cgroup.procs")))?
                {
                    pids.extend(
                        std::str::from_utf8(&buf)
                            .unwrap_or("")
                            .split_ascii_whitespace()
                            .filter_map(|p| p.parse::<i32>().ok()),
                    );
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// Checks `resources` for this cgroup without writing anything: the
    /// validation the daemon runs on every path a request enters by.
    pub fn check(&self, resources: &LinuxResources) -> Result<Vec<Step>> {
        plan(resources, self.fs.hierarchy(), self.controllers()?)
    }

    /// Applies `resources` (see [`crate::resources::plan`] for the
    /// mapping). Nothing is written unless the whole request is valid.
    pub fn apply(&self, resources: &LinuxResources) -> Result<()> {
        let steps = self.check(resources)?;
        self.execute(&steps)
    }

    /// Runs checked steps (as [`Cgroup::check`] returned them).
    pub fn execute(&self, steps: &[Step]) -> Result<()> {
        let mut dirs: Vec<(&Path, CgroupDir)> = Vec::new();
        for step in steps {
            match step {
                Step::Write(w) => self.write(&mut dirs, w)?,
                Step::IfExists(w) => {
                    if self.dir_for(&mut dirs, w.controller)?.has(&w.file) {
                        self.write(&mut dirs, w)?;
                    }
                }
                Step::FirstExisting(ws) => {
                    let mut chosen = ws.last();
                    for w in ws {
                        if self.dir_for(&mut dirs, w.controller)?.has(&w.file) {
                            chosen = Some(w);
                            break;
                        }
                    }
                    if let Some(w) = chosen {
                        self.write(&mut dirs, w)?;
                    }
                }
                Step::Pair(a, b) => match self.write(&mut dirs, a) {
                    Err(Error::Write { source, .. }) if source.raw_os_error() == Some(22) => {
                        self.write(&mut dirs, b)?;
                        self.write(&mut dirs, a)?;
                    }
                    Err(e) => return Err(e),
                    Ok(()) => self.write(&mut dirs, b)?,
                },
                Step::CheckMemoryUsage(limit) => {
                    let dir = self.dir_for(&mut dirs, Controller::Memory)?;
                    let file = if self.fs.hierarchy().is_unified() {
                        "memory.current"
                    } else {
                        "memory.usage_in_bytes"
                    };
                    let usage: u64 = dir
                        .read_string(file)
                        .map_err(Error::io("read", dir.file_path(file)))?
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    if usage > *limit as u64 {
                        return Err(Error::invalid(
                            "resources.memory.limit",
                            format!("{limit} is below the current usage {usage}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The directory a controller's files are in (v1: its hierarchy).
    fn dir_for<'d>(
        &self,
        dirs: &'d mut Vec<(&'a Path, CgroupDir)>,
        controller: Controller,
    ) -> Result<&'d CgroupDir> {
        let mount = match self.fs.hierarchy() {
            Hierarchy::V2 => self.fs.unified_mount(),
            Hierarchy::V1 | Hierarchy::Hybrid => self.fs.v1_mount(controller),
        }
        .ok_or_else(|| {
            Error::unsupported(
                format!("the {controller} controller"),
                "not mounted on this host",
            )
        })?;
        let i = match dirs.iter().position(|(m, _)| *m == mount) {
            Some(i) => i,
            None => {
                dirs.push((mount, self.open_required(mount)?));
                dirs.len() - 1
            }
        };
        Ok(&dirs[i].1)
    }

    fn write(&self, dirs: &mut Vec<(&'a Path, CgroupDir)>, w: &Write) -> Result<()> {
        let dir = self.dir_for(dirs, w.controller)?;
        dir.write(&w.file, &w.value).map_err(|source| Error::Write {
            path: dir.file_path(&w.file),
            value: w.value.clone(),
            source,
        })
    }

    /// Sets `memory.oom.group` (v2): the OOM killer then ends the whole
    /// cgroup, not one process of it, as kubelet expects of containers.
    pub fn set_oom_group(&self, on: bool) -> Result<()> {
        if !self.fs.hierarchy().is_unified() {
            return Err(Error::unsupported(
                "memory.oom.group",
                "a cgroup v2 setting",
            ));
        }
        let w = Write {
            controller: Controller::Memory,
            file: "memory.oom.group".into(),
            value: if on { "1" } else { "0" }.into(),
        };
        self.write(&mut Vec::new(), &w)
    }

    /// How many processes the OOM killer killed in this cgroup (and below,
    /// on v2 and on v1 with hierarchical accounting).
    pub fn oom_kills(&self) -> Result<u64> {
        let req = StatsRequest {
            memory: true,
            memory_details: true,
            ..StatsRequest::NONE
        };
        Ok(self
            .stats(req)?
            .memory
            .and_then(|m| m.oom_kills)
            .unwrap_or(0))
    }

    /// Reads the figures asked for.
    pub fn stats(&self, want: StatsRequest) -> Result<Stats> {
        self.stats_into(want, &mut Vec::with_capacity(4096))
    }

    /// [`Cgroup::stats`] with a caller's buffer, for loops over many
    /// cgroups.
    pub fn stats_into(&self, want: StatsRequest, buf: &mut Vec<u8>) -> Result<Stats> {
        let mut out = Stats::default();
        let sizes = if want.hugetlb {
            self.fs.hugepage_sizes()
        } else {
            &[]
        };
        match (self.fs.hierarchy(), self.fs.unified_mount()) {
            (Hierarchy::V2, Some(root)) => {
                let dir = self.open_required(root)?;
                if want.cpu {
                    out.cpu = stats::cpu_v2(&dir, buf)?;
                }
                if want.memory {
                    out.memory = stats::memory_v2(&dir, want.memory_details, buf)?;
                }
                if want.pids {
                    out.pids = stats::pids(&dir, buf)?;
                }
                if want.io {
                    out.io = stats::io_v2(&dir, buf)?;
                }
                if want.hugetlb {
                    out.hugetlb = stats::hugetlb(&dir, true, sizes, buf)?;
                }
                if want.psi {
                    out.psi = stats::psi(&dir, buf)?;
                }
            }
            _ => {
                let mut found = false;
                let mut open = |c: Controller| -> Result<Option<CgroupDir>> {
                    let Some(mount) = self.fs.v1_mount(c) else {
                        return Ok(None);
                    };
                    let dir = self.open(mount)?;
                    found |= dir.is_some();
                    Ok(dir)
                };
                if want.cpu {
                    let acct = open(Controller::Cpuacct)?;
                    let cpu = if want.cpu_details {
                        open(Controller::Cpu)?
                    } else {
                        None
                    };
                    out.cpu = stats::cpu_v1(acct.as_ref(), cpu.as_ref(), want.cpu_details, buf)?;
                }
                if want.memory
                    && let Some(d) = open(Controller::Memory)?
                {
                    out.memory = stats::memory_v1(&d, want.memory_details, buf)?;
                }
                if want.pids
                    && let Some(d) = open(Controller::Pids)?
                {
                    out.pids = stats::pids(&d, buf)?;
                }
                if want.io
                    && let Some(d) = open(Controller::Blkio)?
                {
                    out.io = stats::io_v1(&d, buf)?;
                }
                if want.hugetlb
                    && let Some(d) = open(Controller::Hugetlb)?
                {
                    out.hugetlb = stats::hugetlb(&d, false, sizes, buf)?;
                }
                // A hybrid host's cgroup2 side has PSI for cgroups an OCI
                // runtime also made there (runc does).
                if want.psi
                    && let Some(unified) = self.fs.unified_mount()
                    && let Some(d) = self.open(unified)?
                {
                    found = true;
                    out.psi = stats::psi(&d, buf)?;
                }
                let wanted_any = want != StatsRequest::NONE;
                if wanted_any && !found {
                    return Err(self.not_found());
                }
            }
        }
        Ok(out)
    }

    /// Kills every process in this cgroup and below and waits, at most
    /// `wait`, until none is left. v2: `cgroup.kill` where the kernel has
    /// it (5.14+), else freeze, SIGKILL each, thaw, until empty; v1: the
    /// same with the freezer hierarchy if mounted. The calling process is
    /// never killed (an error instead).
    pub fn kill_all(&self, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        let me = std::process::id() as i32;
        let mut pause = Duration::from_millis(1);
        let mut killed_by_kernel = false;
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(());
            }
            if pids.contains(&me) {
                return Err(Error::unsupported(
                    format!("killing cgroup {}", self.path),
                    "the calling process is in it",
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::NotEmpty {
                    path: self.path.as_str().into(),
                    waited_ms: wait.as_millis() as u64,
                });
            }
            if !killed_by_kernel {
                killed_by_kernel = self.kill_by_kernel()?;
                if !killed_by_kernel {
                    self.freeze_and_kill()?;
                }
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// v2 cgroup.kill: one write kills the whole subtree, forks included.
    fn kill_by_kernel(&self) -> Result<bool> {
        let Some(root) = self
            .fs
            .unified_mount()
            .filter(|_| self.fs.hierarchy().is_unified())
        else {
            return Ok(false);
        };
        let Some(dir) = self.open(root)? else {
            return Ok(false);
        };
        if !dir.has("cgroup.kill") {
            return Ok(false);
        }
        dir.write("cgroup.kill", "1")
            .map_err(Error::io("write cgroup.kill", dir.path()))?;
        Ok(true)
    }

    /// Freezes (so nothing forks past the kill), SIGKILLs each process,
    /// thaws (v1 frozen tasks die only once thawed).
    fn freeze_and_kill(&self) -> Result<()> {
        let freezer = self.freezer()?;
        if let Some((dir, file, frozen, _)) = &freezer {
            let _ = dir.write(file, frozen);
            // v1 FREEZING settles quickly; go on regardless after a bit.
            for _ in 0..20 {
                if dir.read_string(file).ok().flatten().as_deref() == Some(frozen) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let result = self.pids().map(|pids| {
            for pid in pids {
                // ESRCH: gone already.
                let _ = crust_linux::process::kill_process(pid);
            }
        });
        if let Some((dir, file, _, thawed)) = &freezer {
            match dir.write(file, thawed) {
                // Emptied and removed meanwhile (the OCI runtime deleting
                // its container): nothing is left to thaw.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                r => r.map_err(Error::io("thaw", dir.file_path(file)))?,
            }
        }
        result
    }

    /// The freezer of this cgroup: (dir, file, frozen value, thawed value).
    fn freezer(&self) -> Result<Option<(CgroupDir, &'static str, &'static str, &'static str)>> {
        let (mount, file, frozen, thawed) = match self.fs.hierarchy() {
            Hierarchy::V2 => (self.fs.unified_mount(), "cgroup.freeze", "1", "0"),
            _ => (
                self.fs.v1_mount(Controller::Freezer),
                "freezer.state",
                "FROZEN",
                "THAWED",
            ),
        };
        let Some(mount) = mount else {
            return Ok(None);
        };
        Ok(self
            .open(mount)?
            .filter(|d| d.has(file))
            .map(|d| (d, file, frozen, thawed)))
    }

    /// Kills what runs in the cgroup and removes it with every child cgroup
    /// in every hierarchy, the controller-less v1 ones (`name=systemd`, the
    /// hybrid cgroup2) included, where an OCI runtime also creates a
    /// container's cgroup. Idempotent; ancestors are left alone.
    pub fn delete(&self) -> Result<()> {
        self.delete_with_wait(DEFAULT_KILL_WAIT)
    }

    pub fn delete_with_wait(&self, wait: Duration) -> Result<()> {
        if self.path.is_root() {
            return Err(Error::invalid(
                "cgroup path \"/\"",
                "the root cgroup cannot be deleted",
            ));
        }
        self.kill_all(wait)?;
        for mount in self.fs.all_mounts() {
            let mut paths = subtree(self.fs, mount, &self.path)?;
            // Deepest first, so parents are empty when their turn comes.
            paths.reverse();
            for path in paths {
                remove_one(self.fs, mount, &path)?;
            }
        }
        Ok(())
    }
}

/// `path` and every cgroup below it in the hierarchy at `mount`, parents
/// before children; empty when `path` does not exist there.
fn subtree(fs: &CgroupFs, mount: &Path, path: &CgroupPath) -> Result<Vec<CgroupPath>> {
    let mut out = Vec::new();
    let mut stack = vec![path.clone()];
    while let Some(p) = stack.pop() {
        let Some(dir) = fs
            .open_existing(mount, &p)
            .map_err(Error::io("open cgroup", p.under(mount)))?
        else {
            continue;
        };
        if p.depth() < MAX_DEPTH {
            let children = dir
                .subdirs()
                .map_err(Error::io("list cgroup", p.under(mount)))?;
            for name in children.into_iter().rev() {
                if let Ok(child) = p.join(&name) {
                    stack.push(child);
                }
            }
        }
        out.push(p);
    }
    // Pre-order from a stack is parents first already; keep it stable.
    Ok(out)
}

/// rmdir of one (empty) cgroup, retried while the kernel still counts
/// exiting tasks.
fn remove_one(fs: &CgroupFs, mount: &Path, path: &CgroupPath) -> Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.name()) else {
        return Ok(());
    };
    let Some(dir) = fs
        .open_existing(mount, &parent)
        .map_err(Error::io("open cgroup", parent.under(mount)))?
    else {
        return Ok(());
    };
    // EBUSY passes once the kernel has released the last exiting tasks; a
    // cgroup that keeps a live process or a child stays busy and its EBUSY
    // is the answer after RMDIR_WAIT.
    RMDIR_RETRY
        .run(|| dir.rmdir(name))
        .map(|_| ())
        .map_err(Error::io("remove cgroup", path.under(mount)))
}

/// Enables in `dir`'s subtree_control every controller it has that is not
/// enabled yet. Best effort, as runc and libcgroups do: a cgroup with
/// processes of its own cannot delegate (no-internal-processes rule), and a
/// limit that needs a missing controller fails when applied, naming it.
fn enable_controllers(dir: &CgroupDir) {
    let read = |f| dir.read_string(f).ok().flatten().unwrap_or_default();
    let have = Controllers::parse(&read("cgroup.controllers"));
    let enabled = Controllers::parse(&read("cgroup.subtree_control"));
    let missing: Vec<Controller> = have.iter().filter(|c| !enabled.contains(*c)).collect();
    if missing.is_empty() {
        return;
    }
    let all: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
    if dir.write("cgroup.subtree_control", &all.join(" ")).is_ok() {
        return;
    }
    for c in missing {
        if let Err(e) = dir.write("cgroup.subtree_control", &format!("+{c}")) {
            tracing::debug!("enable {c} in {}: {e}", dir.path().display());
        }
    }
}

fn copy_if_empty(parent: &CgroupDir, child: &CgroupDir, file: &str) -> Result<()> {
    let current = child
        .read_string(file)
        .map_err(Error::io("read", child.file_path(file)))?
        .unwrap_or_default();
    if !current.is_empty() {
        return Ok(());
    }
    let value = parent
        .read_string(file)
        .map_err(Error::io("read", parent.file_path(file)))?
        .unwrap_or_default();
    child
        .write(file, &value)
        .map_err(Error::io("write", child.file_path(file)))
}

#[cfg(test)]
mod tests {
    //! The cgroup logic against fake cgroupfs trees in a temp dir (the
    //! root is a parameter): this host has no cgroup v2 controllers, and
    //! a plain directory lets the tests play the kernel's part (the
    //! control files a new cgroup gets). tests/host.rs runs the same on
    //! real hierarchies.

    use super::*;
    use crate::hierarchy::V1Mount;
    use oci_spec::runtime::{
        LinuxCpuBuilder, LinuxMemoryBuilder, LinuxPidsBuilder, LinuxResourcesBuilder,
    };
    use std::collections::HashMap;
    use std::os::unix::fs::symlink;

    /// The files the kernel gives a new v2 cgroup with these controllers.
    fn v2_cgroup(dir: &Path, controllers: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let mut files = vec![
            ("cgroup.controllers", format!("{controllers}\n")),
            ("cgroup.subtree_control", "\n".into()),
            ("cgroup.procs", String::new()),
        ];
        for c in controllers.split_whitespace() {
            let more: &[(&str, &str)] = match c {
                "cpu" => &[
                    ("cpu.weight", "100\n"),
                    ("cpu.max", "max 100000\n"),
                    ("cpu.stat", "usage_usec 0\n"),
                ],
                "memory" => &[
                    ("memory.max", "max\n"),
                    ("memory.low", "0\n"),
                    ("memory.swap.max", "max\n"),
                    ("memory.current", "0\n"),
                    ("memory.stat", "anon 0\n"),
                    ("memory.oom.group", "0\n"),
                    ("memory.events", "oom_kill 0\n"),
                ],
                "pids" => &[("pids.max", "max\n"), ("pids.current", "0\n")],
                _ => &[],
            };
            files.extend(more.iter().map(|(a, b)| (*a, b.to_string())));
        }
        for (name, content) in files {
            std::fs::write(dir.join(name), content).unwrap();
        }
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap().trim().to_string()
    }

    fn resources() -> LinuxResources {
        LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .shares(2048u64)
                    .quota(20_000i64)
                    .period(100_000u64)
                    .build()
                    .unwrap(),
            )
            .memory(
                LinuxMemoryBuilder::default()
                    .limit(64i64 << 20)
                    .build()
                    .unwrap(),
            )
            .pids(LinuxPidsBuilder::default().limit(50).build().unwrap())
            .build()
            .unwrap()
    }

    #[test]
    fn v2_create_delegates_down_the_path() {
        let root = tempfile::tempdir().unwrap();
        v2_cgroup(root.path(), "cpuset cpu io memory pids");
        // kubepods exists and delegates cpu already; pod1 is new.
        v2_cgroup(&root.path().join("kubepods"), "cpuset cpu io memory pids");
        std::fs::write(root.path().join("kubepods/cgroup.subtree_control"), "cpu\n").unwrap();
        let fs = CgroupFs::v2(root.path());
        let pod = fs.cgroup(CgroupPath::parse("/kubepods/pod1").unwrap());
        assert!(!pod.exists());
        pod.create_for_children().unwrap();
        assert!(pod.exists());
        assert_eq!(
            read(&root.path().join("cgroup.subtree_control")),
            "+cpu +cpuset +memory +io +pids"
        );
        // Only what was missing.
        assert_eq!(
            read(&root.path().join("kubepods/cgroup.subtree_control")),
            "+cpuset +memory +io +pids"
        );
        // Now the kernel's part: pod1's files; creating it again delegates
        // from pod1 itself as well (a pod cgroup's children hold the
        // processes), but a leaf never delegates.
        v2_cgroup(&root.path().join("kubepods/pod1"), "cpu memory pids");
        pod.create_for_children().unwrap();
        assert_eq!(
            read(&root.path().join("kubepods/pod1/cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        let leaf = fs.cgroup(CgroupPath::parse("/kubepods/pod1/c1").unwrap());
        leaf.create().unwrap();
        v2_cgroup(&root.path().join("kubepods/pod1/c1"), "cpu memory pids");
        leaf.create().unwrap();
        assert_eq!(
            read(&root.path().join("kubepods/pod1/c1/cgroup.subtree_control")),
            ""
        );
    }

    #[test]
    fn v2_apply_writes_the_mapped_files() {
        let root = tempfile::tempdir().unwrap();
        v2_cgroup(root.path(), "cpu memory pids");
        let c = root.path().join("pod/c1");
        v2_cgroup(&root.path().join("pod"), "cpu memory pids");
        v2_cgroup(&c, "cpu memory pids");
        std::fs::write(c.join("memory.high"), "max\n").unwrap();
        let fs = CgroupFs::v2(root.path());
        let cg = fs.cgroup(CgroupPath::parse("/pod/c1").unwrap());
        let mut r = resources();
        r.set_unified(Some(HashMap::from([(
            "memory.high".into(),
            "50000000".into(),
        )])));
        cg.apply(&r).unwrap();
        assert_eq!(read(&c.join("cpu.weight")), "174");
        assert_eq!(read(&c.join("cpu.max")), "20000 100000");
        assert_eq!(read(&c.join("memory.max")), "67108864");
        assert_eq!(read(&c.join("pids.max")), "50");
        assert_eq!(read(&c.join("memory.high")), "50000000");
        cg.set_oom_group(true).unwrap();
        assert_eq!(read(&c.join("memory.oom.group")), "1");
        // The directory for CLONE_INTO_CGROUP is the cgroup's own.
        let fd = cg.open_fd().unwrap();
        let st = std::fs::File::from(fd).metadata().unwrap();
        let want = std::fs::metadata(&c).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((st.dev(), st.ino()), (want.dev(), want.ino()));
    }

    #[test]
    fn host_facts_from_a_fake_tree() {
        let root = tempfile::tempdir().unwrap();
        v2_cgroup(root.path(), "cpu memory hugetlb");
        let fs = CgroupFs::v2(root.path());
        assert!(fs.has_controller(Controller::Hugetlb));
        assert!(!fs.has_controller(Controller::Pids));
        assert!(!fs.swap_accounting());
        v2_cgroup(&root.path().join("system.slice"), "memory");
        assert!(fs.swap_accounting());
        let v1 = CgroupFs::v1(Vec::new(), None);
        assert!(v1.cgroup(CgroupPath::root()).open_fd().is_err());
    }

    #[test]
    fn v2_refusals_change_nothing() {
        let root = tempfile::tempdir().unwrap();
        v2_cgroup(root.path(), "cpu memory pids");
        let c = root.path().join("c1");
        v2_cgroup(&c, "memory pids");
        let host_file = root.path().join("host-file");
        std::fs::write(&host_file, "precious").unwrap();
        symlink(&host_file, c.join("memory.high")).unwrap();
        let fs = CgroupFs::v2(root.path());
        let cg = fs.cgroup(CgroupPath::parse("/c1").unwrap());
        for (key, value) in [
            ("../host-file", "1"),
            ("/etc/x", "1"),
            ("cgroup.procs", "1"),
            ("memory.max/../../host-file", "1"),
            ("memory.low", "1\n2"),
            ("memory.low", "1\0"),
            // The cpu controller is not enabled in c1.
            ("cpu.weight", "100"),
        ] {
            let mut r = resources();
            r.set_cpu(None);
            r.set_unified(Some(HashMap::from([(key.to_string(), value.to_string())])));
            let e = cg.apply(&r).unwrap_err();
            assert!(e.is_invalid_argument(), "{key}: {e}");
            assert!(e.to_string().contains(&crate::quote(key)), "{key}: {e}");
            // Validation came first: nothing at all was written.
            assert_eq!(read(&c.join("memory.max")), "max", "{key}");
        }
        // A planted symlink under a control file's name is not followed.
        let mut r = LinuxResources::default();
        r.set_unified(Some(HashMap::from([("memory.high".into(), "1".into())])));
        assert!(cg.apply(&r).is_err());
        assert_eq!(read(&host_file), "precious");
        // A file the kernel does not have is never created.
        r.set_unified(Some(HashMap::from([("memory.min".into(), "1".into())])));
        assert!(cg.apply(&r).unwrap_err().is_not_found());
        assert!(!c.join("memory.min").exists());
        // Mapped fields whose controller is missing are refused whole.
        let e = cg.apply(&resources()).unwrap_err();
        assert!(
            e.is_unsupported() && e.to_string().contains("cpu controller"),
            "{e}"
        );
        assert_eq!(read(&c.join("memory.max")), "max");
    }

    #[test]
    fn v2_stats_from_a_fake_tree() {
        let root = tempfile::tempdir().unwrap();
        v2_cgroup(root.path(), "cpu memory pids");
        let c = root.path().join("c1");
        v2_cgroup(&c, "cpu memory pids");
        std::fs::write(c.join("memory.current"), "1000000\n").unwrap();
        std::fs::write(c.join("memory.stat"), crate::stats::tests::MEMORY_STAT_V2).unwrap();
        std::fs::write(c.join("pids.current"), "2\n").unwrap();
        std::fs::write(
            c.join("cpu.stat"),
            "usage_usec 7\nuser_usec 5\nsystem_usec 2\n",
        )
        .unwrap();
        std::fs::write(c.join("memory.events"), "oom 3\noom_kill 2\n").unwrap();
        std::fs::write(c.join("io.pressure"), "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1\n").unwrap();
        let fs = CgroupFs::v2(root.path());
        let cg = fs.cgroup(CgroupPath::parse("/c1").unwrap());
        let s = cg.stats(StatsRequest::ALL).unwrap();
        assert_eq!(s.cpu.unwrap().usage_ns, 7000);
        let m = s.memory.unwrap();
        assert_eq!((m.usage, m.working_set, m.rss), (1_000_000, 0, 73_728_000));
        assert_eq!(s.pids.unwrap().current, 2);
        assert!(s.io.is_none());
        assert!(s.psi.unwrap().io.is_some());
        assert_eq!(cg.oom_kills().unwrap(), 2);
        // Only what is asked for.
        let s = cg
            .stats(StatsRequest {
                pids: true,
                ..StatsRequest::NONE
            })
            .unwrap();
        assert!(s.cpu.is_none() && s.memory.is_none() && s.pids.is_some());
        let missing = fs.cgroup(CgroupPath::parse("/nope").unwrap());
        assert!(
            missing
                .stats(StatsRequest::CPU_MEMORY)
                .unwrap_err()
                .is_not_found()
        );
    }

    #[test]
    fn delete_removes_children_first_and_keeps_ancestors() {
        let root = tempfile::tempdir().unwrap();
        for d in ["pod/a/x", "pod/b", "other"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        let fs = CgroupFs::v2(root.path());
        let cg = fs.cgroup(CgroupPath::parse("/pod").unwrap());
        assert_eq!(cg.pids().unwrap(), Vec::<i32>::new());
        cg.delete().unwrap();
        assert!(!root.path().join("pod").exists());
        assert!(root.path().join("other").exists());
        // Idempotent.
        cg.delete().unwrap();
        assert!(fs.cgroup(CgroupPath::root()).delete().is_err());
    }

    fn v1_fs(root: &Path) -> CgroupFs {
        let mount = |name: &str, controllers: &str, named: Option<&str>| {
            let path = root.join(name);
            std::fs::create_dir_all(&path).unwrap();
            V1Mount {
                path,
                controllers: Controllers::parse(controllers),
                name: named.map(str::to_string),
            }
        };
        CgroupFs::v1(
            vec![
                mount("cpu,cpuacct", "cpu cpuacct", None),
                mount("memory", "memory", None),
                mount("cpuset", "cpuset", None),
                mount("systemd", "", Some("systemd")),
            ],
            Some({
                let u = root.join("unified");
                std::fs::create_dir_all(&u).unwrap();
                u
            }),
        )
    }

    #[test]
    fn children_are_listed_once_across_hierarchies() {
        let root = tempfile::tempdir().unwrap();
        let fs = v1_fs(root.path());
        let pod = fs.cgroup(CgroupPath::parse("/crust/pod1").unwrap());
        assert_eq!(pod.children().unwrap(), Vec::<String>::new());
        for (m, child) in [("memory", "c1"), ("cpu,cpuacct", "c1"), ("systemd", "c2")] {
            std::fs::create_dir_all(root.path().join(m).join("crust/pod1").join(child)).unwrap();
        }
        // Files are no cgroups.
        std::fs::write(root.path().join("memory/crust/pod1/cgroup.procs"), "").unwrap();
        assert_eq!(pod.children().unwrap(), vec!["c1", "c2"]);
    }

    #[test]
    fn v1_create_in_controller_hierarchies_delete_in_all() {
        let root = tempfile::tempdir().unwrap();
        let fs = v1_fs(root.path());
        assert_eq!(fs.hierarchy(), Hierarchy::Hybrid);
        std::fs::write(root.path().join("cpuset/cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(root.path().join("cpuset/cpuset.mems"), "0\n").unwrap();
        let cg = fs.cgroup(CgroupPath::parse("/crust/pod1").unwrap());
        // A new cpuset cgroup gets its parent's CPUs and nodes; a plain
        // directory has no cpuset files to take them, so the copy fails,
        // and the create removes what it made in every hierarchy.
        let e = cg.create().unwrap_err();
        assert!(e.is_not_found(), "{e}");
        for m in ["cpu,cpuacct", "memory", "cpuset"] {
            assert!(
                !root.path().join(m).join("crust").exists(),
                "{m} left behind"
            );
        }
        // Without a cpuset hierarchy to fake, creation goes through.
        std::fs::remove_file(root.path().join("cpuset/cpuset.cpus")).unwrap();
        cg.create().unwrap();
        for m in ["cpu,cpuacct", "memory", "cpuset"] {
            assert!(root.path().join(m).join("crust/pod1").is_dir(), "{m}");
        }
        // Not in the controller-less ones: the OCI runtime makes those.
        assert!(!root.path().join("systemd/crust").exists());
        std::fs::create_dir_all(root.path().join("systemd/crust/pod1/c1")).unwrap();
        std::fs::create_dir_all(root.path().join("unified/crust/pod1/c1")).unwrap();
        cg.delete().unwrap();
        for m in ["cpu,cpuacct", "memory", "cpuset", "systemd", "unified"] {
            assert!(!root.path().join(m).join("crust/pod1").exists(), "{m}");
            assert!(
                root.path().join(m).join("crust").exists(),
                "{m}: ancestors stay"
            );
        }
    }

    #[test]
    fn v1_apply_goes_to_each_controllers_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        let fs = v1_fs(root.path());
        let path = CgroupPath::parse("/c1").unwrap();
        let cpu = root.path().join("cpu,cpuacct/c1");
        let mem = root.path().join("memory/c1");
        std::fs::create_dir_all(&cpu).unwrap();
        std::fs::create_dir_all(&mem).unwrap();
        for (f, v) in [
            ("cpu.shares", "1024"),
            ("cpu.cfs_period_us", "100000"),
            ("cpu.cfs_quota_us", "-1"),
        ] {
            std::fs::write(cpu.join(f), v).unwrap();
        }
        std::fs::write(mem.join("memory.limit_in_bytes"), "9223372036854771712").unwrap();
        let mut r = resources();
        r.set_pids(None);
        fs.cgroup(path.clone()).apply(&r).unwrap();
        assert_eq!(read(&cpu.join("cpu.shares")), "2048");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "20000");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
        // No pids hierarchy on this fake host: refused, nothing written.
        let e = fs.cgroup(path).apply(&resources()).unwrap_err();
        assert!(e.is_unsupported(), "{e}");
    }
}
