//! Privileged tests on the real hierarchies of whatever host runs them
//! (v1 hybrid here; cgroup v2 and systemd in the VM): real cgroups, real
//! processes in them, real kills. Each test cleans up in Drop, also when it
//! fails. A test whose precondition is missing (not root, not v2, no
//! systemd) prints "SKIPPED: <test>: <reason>" and is counted as ignored,
//! never as passed.
//!
//! Run under the machine-wide lock, in a PID namespace:
//!   flock /tmp/crust-integration.lock unshare -p -f --mount-proc \
//!     cargo test -p crust-cgroups --test host

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use crust_cgroups::systemd::Systemd;
use crust_cgroups::{
    CgroupFs, CgroupPath, Controller, Hierarchy, StatsRequest, quote, systemd_booted,
};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxMemoryBuilder, LinuxPidsBuilder, LinuxResources, LinuxResourcesBuilder,
};
use std::os::unix::process::ExitStatusExt;

/// Set in a child of this binary that must eat memory until the OOM
/// killer ends it.
const HOG_ENV: &str = "CRUST_CGROUPS_TEST_HOG";

type TestResult = Result<(), Failed>;

/// What a test needs of the host; None when it is there, else why not.
type Needs = fn(&CgroupFs) -> Option<String>;

fn root(_: &CgroupFs) -> Option<String> {
    (!crust_linux::fs::running_as_root()).then(|| "needs root".into())
}

fn root_v1(fs: &CgroupFs) -> Option<String> {
    root(fs).or_else(|| {
        fs.hierarchy()
            .is_unified()
            .then(|| "needs cgroup v1 or hybrid (this host is v2)".into())
    })
}

fn root_v2(fs: &CgroupFs) -> Option<String> {
    root(fs).or_else(|| {
        (!fs.hierarchy().is_unified())
            .then(|| format!("needs cgroup v2 (this host is {})", fs.hierarchy().as_str()))
    })
}

fn root_systemd(fs: &CgroupFs) -> Option<String> {
    root(fs).or_else(|| (!systemd_booted()).then(|| "needs systemd as PID 1".into()))
}

fn trial(name: &'static str, needs: Needs, test: fn(&CgroupFs) -> TestResult) -> Trial {
    Trial::ignorable_test(name, move || {
        let fs = CgroupFs::detect().map_err(|e| format!("detecting cgroups: {e}"))?;
        if let Some(reason) = needs(&fs) {
            // One write to stderr, so that the line stays whole beside
            // other tests' output (make test's summaries count it).
            let line = format!("SKIPPED: {name}: {reason}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            return Ok(Completion::ignored_with(reason));
        }
        test(&fs).map(|()| Completion::Completed)
    })
}

fn main() -> ExitCode {
    if std::env::var_os(HOG_ENV).is_some() {
        hog();
    }
    let args = Arguments::from_args();
    let tests = vec![
        trial(
            "lifecycle_with_a_real_process",
            root,
            lifecycle_with_a_real_process,
        ),
        trial("kill_all_gets_every_fork", root, kill_all_gets_every_fork),
        trial(
            "unified_escapes_leave_the_host_alone",
            root,
            unified_escapes_leave_the_host_alone,
        ),
        trial("oom_kills_are_counted", root, oom_kills_are_counted),
        trial(
            "v1_delete_clears_controllerless_hierarchies",
            root_v1,
            v1_delete_clears_controllerless_hierarchies,
        ),
        trial(
            "v2_oom_group_and_cgroup_kill",
            root_v2,
            v2_oom_group_and_cgroup_kill,
        ),
        trial(
            "systemd_slice_and_scope",
            root_systemd,
            systemd_slice_and_scope,
        ),
    ];
    libtest_mimic::run(&args, tests).exit_code()
}

/// A cgroup (and processes) a test made; gone in Drop whatever happened.
struct Scratch {
    fs: CgroupFs,
    path: CgroupPath,
    children: Vec<Child>,
}

impl Scratch {
    fn new(fs: &CgroupFs, test: &str) -> Scratch {
        let path =
            CgroupPath::parse(&format!("/crust-cgtest-{}-{test}", std::process::id())).unwrap();
        Scratch {
            fs: fs.clone(),
            path,
            children: Vec::new(),
        }
    }

    fn child_path(&self, name: &str) -> CgroupPath {
        self.path.join(name).unwrap()
    }

    fn spawn(&mut self, cmd: &mut Command) -> u32 {
        let child = cmd.spawn().expect("spawning a test process");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    fn spawn_sleep(&mut self) -> u32 {
        self.spawn(Command::new("sleep").arg("600"))
    }

    /// A shell that joins `cg` before it runs `script`.
    fn spawn_in(&mut self, cg: &crust_cgroups::Cgroup<'_>, script: &str) -> u32 {
        let pid = self.spawn(
            Command::new("sh")
                .args(["-c", &format!("read go; {script}")])
                .stdin(Stdio::piped()),
        );
        cg.add_process(pid).expect("joining the cgroup");
        let child = self.children.last_mut().unwrap();
        writeln!(child.stdin.as_mut().unwrap(), "go").expect("starting the shell");
        pid
    }

    /// Waits for the test's child `pid` and returns the signal that ended
    /// it.
    fn wait_signal(&mut self, pid: u32) -> Option<i32> {
        let i = self.children.iter().position(|c| c.id() == pid)?;
        let mut child = self.children.remove(i);
        child.wait().ok()?.signal()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Err(e) = self.fs.cgroup(self.path.clone()).delete() {
            eprintln!("cleanup of {}: {e}", self.path);
        }
    }
}

fn resources() -> LinuxResources {
    LinuxResourcesBuilder::default()
        .cpu(
            LinuxCpuBuilder::default()
                .shares(512u64)
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
        .pids(LinuxPidsBuilder::default().limit(64).build().unwrap())
        .build()
        .unwrap()
}

/// The content of a control file of `path` in `controller`'s hierarchy.
fn control_file(fs: &CgroupFs, controller: Controller, path: &CgroupPath, file: &str) -> String {
    let mount = match fs.hierarchy() {
        Hierarchy::V2 => fs.unified_mount().unwrap().to_path_buf(),
        _ => fs.v1_mount(controller).unwrap().to_path_buf(),
    };
    std::fs::read_to_string(path.under(&mount).join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .trim()
        .to_string()
}

fn lifecycle_with_a_real_process(fs: &CgroupFs) -> TestResult {
    let mut s = Scratch::new(fs, "life");
    let pod = fs.cgroup(s.path.clone());
    pod.create_for_children()?;
    let c1_path = s.child_path("c1");
    let c1 = fs.cgroup(c1_path.clone());
    c1.create()?;
    assert!(c1.exists());
    if fs.hierarchy() == Hierarchy::Hybrid {
        // As runc does on a hybrid host, so that PSI is there to read.
        std::fs::create_dir_all(c1_path.under(fs.unified_mount().unwrap()))?;
    }
    // Started inside the cgroup (v1 does not move the charges of a
    // process that joins), then running.
    let pid = s.spawn_in(&c1, "exec sleep 600");
    assert_eq!(c1.pids()?, vec![pid as i32]);
    assert_eq!(pod.pids()?, vec![pid as i32]);

    c1.apply(&resources())?;
    let f = |c, file| control_file(fs, c, &c1_path, file);
    if fs.hierarchy().is_unified() {
        assert_eq!(f(Controller::Memory, "memory.max"), "67108864");
        assert_eq!(f(Controller::Cpu, "cpu.weight"), "59");
        assert_eq!(f(Controller::Cpu, "cpu.max"), "20000 100000");
    } else {
        assert_eq!(f(Controller::Memory, "memory.limit_in_bytes"), "67108864");
        assert_eq!(f(Controller::Cpu, "cpu.shares"), "512");
        assert_eq!(f(Controller::Cpu, "cpu.cfs_quota_us"), "20000");
        assert_eq!(f(Controller::Cpu, "cpu.cfs_period_us"), "100000");
    }
    assert_eq!(f(Controller::Pids, "pids.max"), "64");

    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let stats = loop {
        let stats = c1.stats(StatsRequest::ALL)?;
        if stats.memory.is_some_and(|m| m.usage > 0) || std::time::Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let m = stats.memory.expect("memory stats");
    assert!(m.usage > 0, "{m:?}");
    assert!(m.working_set <= m.usage);
    assert_eq!(m.limit, Some(64 << 20));
    let p = stats.pids.expect("pids stats");
    assert_eq!((p.current, p.limit), (1, Some(64)));
    assert!(stats.cpu.is_some());
    assert!(stats.io.is_some());
    if fs.unified_mount().is_some() {
        let psi = stats.psi.expect("PSI from the cgroup2 side");
        assert!(
            psi.cpu.is_some() && psi.memory.is_some() && psi.io.is_some(),
            "{psi:?}"
        );
    }
    // The pod's figures include the container's. Usage moves between two
    // reads (the first reading can come while the freshly forked process
    // still holds its pre-exec pages: it halved before the pod's read in a
    // VM run), so both are read again, pod last, until they agree or 5 s
    // pass.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (pod_mem, m) = loop {
        let m = c1.stats(StatsRequest::CPU_MEMORY)?.memory.expect("memory");
        let pod_mem = pod
            .stats(StatsRequest::CPU_MEMORY)?
            .memory
            .expect("pod memory");
        if pod_mem.usage >= m.usage / 2 || std::time::Instant::now() > deadline {
            break (pod_mem, m);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(pod_mem.usage >= m.usage / 2, "{pod_mem:?} vs {m:?}");

    c1.kill_all(Duration::from_secs(5))?;
    assert_eq!(s.wait_signal(pid), Some(9));
    assert!(c1.pids()?.is_empty());
    pod.delete()?;
    assert!(!pod.exists() && !c1.exists());
    for mount in fs.all_mounts() {
        assert!(!s.path.under(mount).exists(), "left in {}", mount.display());
    }
    Ok(())
}

fn kill_all_gets_every_fork(fs: &CgroupFs) -> TestResult {
    let mut s = Scratch::new(fs, "forks");
    let cg = fs.cgroup(s.path.clone());
    cg.create()?;
    let pid = s.spawn_in(&cg, "sleep 600 & sleep 600 & sleep 600 & wait");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while cg.pids()?.len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "forks never showed up: {:?}",
            cg.pids()?
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let forks: Vec<i32> = cg
        .pids()?
        .into_iter()
        .filter(|p| *p != pid as i32)
        .collect();
    cg.delete()?;
    assert_eq!(s.wait_signal(pid), Some(9));
    for f in forks {
        // Gone, or a zombie waiting for the namespace's init to reap it.
        let stat = std::fs::read_to_string(format!("/proc/{f}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next();
        assert!(
            matches!(state, None | Some("Z") | Some("X")),
            "fork {f} still alive: {stat}"
        );
    }
    assert!(!cg.exists());
    Ok(())
}

fn unified_escapes_leave_the_host_alone(fs: &CgroupFs) -> TestResult {
    let mut s = Scratch::new(fs, "escape");
    let cg = fs.cgroup(s.path.clone());
    cg.create()?;
    let pid = s.spawn_sleep();
    cg.add_process(pid)?;
    let host_file = PathBuf::from(format!("/tmp/crust-pwn-precreated-{}", std::process::id()));
    std::fs::write(&host_file, "precious")?;
    let _remove = RemoveOnDrop(host_file.clone());
    let escape = format!("../../../../../../..{}", host_file.display());
    let before = cg.pids()?;
    for key in [
        escape.as_str(),
        "/etc/hostname",
        "cgroup.procs",
        "cgroup.subtree_control",
        "memory.max/../../x",
        "../x",
    ] {
        let r = LinuxResourcesBuilder::default()
            .unified(HashMap::from([(key.to_string(), "1".to_string())]))
            .build()
            .unwrap();
        let e = cg.apply(&r).unwrap_err();
        if fs.hierarchy().is_unified() {
            assert!(e.is_invalid_argument(), "{key}: {e}");
            assert!(e.to_string().contains(&quote(key)), "{key}: {e}");
        } else {
            // No unified resources on v1 at all.
            assert!(e.is_unsupported(), "{key}: {e}");
        }
    }
    assert_eq!(std::fs::read_to_string(&host_file)?, "precious");
    assert_eq!(cg.pids()?, before);
    assert!(
        std::fs::read_to_string("/proc/1/cgroup")?
            .lines()
            .all(|l| !l.contains("crust-cgtest"))
    );
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The child side of `oom_kills_are_counted`: waits for the go, then eats
/// memory until killed.
fn hog() -> ! {
    let mut line = String::new();
    let _ = BufReader::new(std::io::stdin()).read_line(&mut line);
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..1024 {
        // Touch every page so that it is charged.
        chunks.push(vec![1u8; 1 << 20]);
    }
    std::hint::black_box(&chunks);
    std::process::exit(3);
}

fn oom_kills_are_counted(fs: &CgroupFs) -> TestResult {
    let mut s = Scratch::new(fs, "oom");
    let cg = fs.cgroup(s.path.clone());
    cg.create()?;
    let limit = 32i64 << 20;
    let mut memory = LinuxMemoryBuilder::default().limit(limit);
    if fs.hierarchy().is_unified()
        || control_file_exists(fs, &s.path, "memory.memsw.limit_in_bytes")
    {
        // No swap to escape to.
        memory = memory.swap(limit);
    }
    cg.apply(
        &LinuxResourcesBuilder::default()
            .memory(memory.build().unwrap())
            .build()
            .unwrap(),
    )?;
    assert_eq!(cg.oom_kills()?, 0);
    let pid = s.spawn(
        Command::new(std::env::current_exe()?)
            .env(HOG_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null()),
    );
    cg.add_process(pid)?;
    let child = s.children.last_mut().unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "go")?;
    assert_eq!(s.wait_signal(pid), Some(9), "the hog was not OOM-killed");
    assert!(cg.oom_kills()? >= 1);
    let m = cg.stats(StatsRequest::ALL)?.memory.unwrap();
    assert!(m.oom_events >= Some(1), "{m:?}");
    if fs.hierarchy().is_unified() {
        assert!(m.limit_hits >= Some(1), "{m:?}");
    }
    Ok(())
}

fn control_file_exists(fs: &CgroupFs, path: &CgroupPath, file: &str) -> bool {
    fs.v1_mount(Controller::Memory)
        .is_some_and(|m| path.under(m).join(file).exists())
}

fn v1_delete_clears_controllerless_hierarchies(fs: &CgroupFs) -> TestResult {
    let s = Scratch::new(fs, "named");
    let cg = fs.cgroup(s.path.clone());
    cg.create()?;
    // An OCI runtime makes the container's cgroup in the named systemd
    // hierarchy and the hybrid cgroup2 too; the pod's delete must take
    // them.
    let named: Vec<PathBuf> = fs
        .v1_mounts()
        .iter()
        .filter(|m| m.controllers.is_empty())
        .map(|m| m.path.clone())
        .chain(fs.unified_mount().map(|p| p.to_path_buf()))
        .collect();
    assert!(
        !named.is_empty(),
        "no controller-less hierarchy on this v1 host"
    );
    for mount in &named {
        std::fs::create_dir_all(s.child_path("c1").under(mount))?;
    }
    cg.delete()?;
    for mount in fs.all_mounts() {
        assert!(!s.path.under(mount).exists(), "left in {}", mount.display());
    }
    Ok(())
}

fn v2_oom_group_and_cgroup_kill(fs: &CgroupFs) -> TestResult {
    let mut s = Scratch::new(fs, "v2");
    let pod = fs.cgroup(s.path.clone());
    pod.create_for_children()?;
    let c = fs.cgroup(s.child_path("c"));
    c.create()?;
    c.set_oom_group(true)?;
    assert_eq!(
        control_file(fs, Controller::Memory, c.path(), "memory.oom.group"),
        "1"
    );
    // The pod delegates what the root has, so container limits land.
    let enabled = fs.controllers(c.path())?;
    for ctl in [Controller::Cpu, Controller::Memory, Controller::Pids] {
        assert!(enabled.contains(ctl), "{ctl} not delegated: {enabled}");
    }
    // Joined before it forks: sleeps forked earlier would stay outside,
    // survive the kill and hold the caller's stdout open.
    let pid = s.spawn_in(&c, "sleep 600 & sleep 600 & wait");
    std::thread::sleep(Duration::from_millis(100));
    pod.kill_all(Duration::from_secs(5))?;
    assert_eq!(s.wait_signal(pid), Some(9));
    pod.delete()?;
    assert!(!pod.exists());
    Ok(())
}

fn systemd_slice_and_scope(fs: &CgroupFs) -> TestResult {
    let mut s = Scratch::new(fs, "systemd");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let sd = Systemd::new(fs.hierarchy());
    let id = std::process::id();
    let slice = format!("crusttest{id}.slice");
    let scope = format!("crust-cgtest{id}.scope");
    let pid = s.spawn_sleep();
    let result = rt.block_on(async {
        sd.start_slice(&slice, &LinuxResources::default()).await?;
        sd.start_scope(&scope, &slice, &[pid], "crust test", &resources())
            .await?;
        let state = sd.unit_state(&scope).await?.expect("the scope");
        assert!(state.is_active(), "{state:?}");
        let path = sd.unit_cgroup(&scope).await?.expect("the scope's cgroup");
        assert_eq!(path.as_str(), format!("/{slice}/{scope}"));
        let cg = fs.cgroup(path.clone());
        assert_eq!(cg.pids()?, vec![pid as i32]);
        let (mem_file, pids_file) = if fs.hierarchy().is_unified() {
            ("memory.max", "pids.max")
        } else {
            ("memory.limit_in_bytes", "pids.max")
        };
        assert_eq!(
            control_file(fs, Controller::Memory, &path, mem_file),
            "67108864"
        );
        assert_eq!(control_file(fs, Controller::Pids, &path, pids_file), "64");
        // An update goes through systemd and the files alike.
        let mut more = resources();
        more.set_memory(Some(
            LinuxMemoryBuilder::default()
                .limit(128i64 << 20)
                .build()
                .unwrap(),
        ));
        if fs.hierarchy().is_unified() {
            more.set_unified(Some(HashMap::from([(
                "memory.high".into(),
                "104857600".into(),
            )])));
        }
        sd.apply(fs, &scope, &path, &more).await?;
        assert_eq!(
            control_file(fs, Controller::Memory, &path, mem_file),
            "134217728"
        );
        if fs.hierarchy().is_unified() {
            assert_eq!(
                control_file(fs, Controller::Memory, &path, "memory.high"),
                "104857600"
            );
        }
        // Orphan cleanup: stopping the scope ends its processes.
        sd.stop_unit(&scope).await?;
        assert_eq!(sd.unit_state(&scope).await?, None);
        sd.stop_unit(&scope).await?;
        Ok::<_, Failed>(())
    });
    // Stopping the scope must have ended the process (waited for only
    // then: on a failure Drop kills it).
    let killed = result.is_ok().then(|| s.wait_signal(pid));
    let cleanup = rt.block_on(async {
        let _ = sd.stop_unit(&scope).await;
        sd.stop_unit(&slice).await
    });
    result?;
    cleanup?;
    assert!(
        killed.flatten().is_some(),
        "stopping the scope left its process running"
    );
    Ok(())
}
