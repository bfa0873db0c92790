//! crust's own default profile: what `RuntimeDefault` (and an unset
//! profile) means on a node with AppArmor.
//!
//! The intent is the one of the default profiles of Docker, containerd and
//! CRI-O: a container may do with its own files, network and processes what
//! its capabilities and seccomp filter allow, but AppArmor adds a second
//! fence around the node's kernel interfaces that the other layers could
//! leave open (a capability granted by mistake, a writable /proc remount):
//! no mounts, no writes to kernel knobs under /proc and /sys, nothing of
//! securityfs, firmware or the power-capping controls, no signals or ptrace
//! across container boundaries.
//!
//! The text is self-contained: it includes no file from /etc/apparmor.d
//! (a node may have AppArmor in the kernel without the userspace policy
//! tree), so only the ABI line depends on the node.

/// Renders the profile named `name`. `abi` is the policy ABI to pin
/// (`abi/3.0`) when the node's parser has it, so a newer kernel's extra
/// mediation (unix sockets, io_uring, user namespaces) does not change
/// what the profile allows.
pub fn render(name: &str, abi: Option<&str>) -> String {
    let abi_line = abi.map(|a| format!("abi <{a}>,\n")).unwrap_or_default();
    format!(
        r#"# crust's default AppArmor profile for containers (RuntimeDefault).
# Generated and loaded by the crust daemon; edits are lost at the next load.
{abi_line}
@{{crust_proc}}=/proc/

profile {name} flags=(attach_disconnected,mediate_deleted) {{
  # The container's own world: files (paths are the container's after
  # pivot_root; attach_disconnected covers the ones outside it), network,
  # and the capabilities its OCI spec leaves it.
  file,
  network,
  capability,
  umount,

  # Signals from the node's own (unconfined) runtime and between the
  # container's processes; nothing to or from other profiles.
  signal (receive) peer=unconfined,
  signal (send, receive) peer={name},
  # ps, top and debuggers within the container, not across containers.
  ptrace (read, readby, trace, tracedby) peer={name},

  # No new mounts, whatever capabilities were granted.
  deny mount,

  # /proc: the files at its top are the kernel's (sysrq-trigger, kcore,
  # kmsg...), the directories not named by a number (sys, fs, irq, bus,
  # driver, sysvipc...) are its knobs. /proc/self and /proc/thread-self
  # resolve to numbered directories, so a process keeps writing its own
  # attributes (oom_score_adj, comm...).
  deny @{{crust_proc}}* w,
  deny @{{crust_proc}}[^0-9]*/** w,
  deny @{{crust_proc}}{{sysrq-trigger,kcore,kmsg}} rwklx,

  # /sys: read-only except the cgroup tree (which the runtime mounts
  # read-only unless asked otherwise); some of it not even readable.
  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/kernel/security/** rwklx,
  deny /sys/devices/virtual/powercap/** rwklx,
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_profile_and_pins_the_abi_when_given() {
        let text = render("crust-default", Some("abi/3.0"));
        assert!(text.contains("\nabi <abi/3.0>,\n"), "{text}");
        assert!(
            text.contains("profile crust-default flags=(attach_disconnected,mediate_deleted) {")
        );
        assert!(text.contains("signal (send, receive) peer=crust-default,"));
        assert!(text.contains("ptrace (read, readby, trace, tracedby) peer=crust-default,"));
        assert!(!render("crust-default", None).contains("abi <"));
    }

    #[test]
    fn denies_what_a_default_profile_must() {
        let text = render("p", None);
        for rule in [
            "deny mount,",
            "deny @{crust_proc}* w,",
            "deny @{crust_proc}[^0-9]*/** w,",
            "deny @{crust_proc}{sysrq-trigger,kcore,kmsg} rwklx,",
            "deny /sys/kernel/security/** rwklx,",
            "deny /sys/firmware/** rwklx,",
        ] {
            assert!(text.contains(rule), "missing {rule:?} in\n{text}");
        }
        // Self-contained: nothing from /etc/apparmor.d.
        assert!(!text.contains("#include"), "{text}");
        // Balanced braces: one profile block, variables aside.
        let opens = text.matches('{').count();
        assert_eq!(opens, text.matches('}').count());
    }
}
