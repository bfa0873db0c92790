//! Child processes that die with the daemon.
//!
//! A CNI plugin still running when the daemon is SIGKILLed would otherwise
//! run on as an orphan (a hanging plugin ran on after the restart, and a
//! half-done ADD raced the recovery's DEL). The kernel's parent-death
//! signal ends it instead.

use std::os::unix::process::CommandExt;

/// Makes the child that `cmd` spawns get SIGKILL when its parent goes
/// (`PR_SET_PDEATHSIG`), also when the parent died between the fork and
/// the setting (the child checks that its parent is still the spawner).
///
/// The kernel sends the signal when the *thread* that forked the child
/// ends: spawn from a thread that lives as long as the daemon (an async
/// runtime's worker), not from a pool thread that may retire while the
/// child runs. The setting survives the exec (not for set-uid programs)
/// and is not inherited by the child's own children.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed: prctl(2) and getppid(2)
    // are plain syscalls, and nothing is allocated or locked.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the setting took: nobody would send
            // the signal.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other("the spawning process is gone"));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// The signal comes when the spawning thread ends: a thread plays the
    /// daemon (the test process itself lives on and would reap a zombie).
    #[test]
    // The child is reaped below with waitpid, once the signal killed it.
    #[allow(clippy::zombie_processes)]
    fn the_child_dies_with_the_thread_that_spawned_it() {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawner = std::thread::spawn(move || {
            let mut cmd = Command::new("sleep");
            cmd.arg("60").stdin(Stdio::null()).stdout(Stdio::null());
            die_with_parent(&mut cmd);
            let child = cmd.spawn().unwrap();
            tx.send(child.id()).unwrap();
            // The Child handle is dropped without waiting; the thread ends.
        });
        let pid = rx.recv().unwrap();
        spawner.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Killed: a zombie (nobody waited) or gone.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().to_string()));
            match state {
                None => break,
                Some(s) if s.starts_with('Z') => {
                    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
                    break;
                }
                Some(_) => {}
            }
            assert!(
                Instant::now() < deadline,
                "the child outlived the thread that spawned it"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
