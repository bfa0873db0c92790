//! Property tests of spec generation: arbitrary CreateContainer and
//! RunPodSandbox requests (a kubelet-like baseline with random fields made
//! hostile, and baselines whose protobuf encoding had bytes flipped), an
//! arbitrary image config and /etc/passwd, on every kind of node.
//!
//! Properties: `container_spec` and `pause_spec` return a spec or a clean
//! `SpecError`, never a panic; the error names a field and its message is
//! at most 1024 bytes however long the input; a spec that comes out
//! carries no NUL byte and only absolute, `..`-free mount destinations --
//! nothing unchecked reached it.
//!
//! Longer runs: `PROPTEST_CASES=20000 cargo test -p crust-oci --test prop_spec`.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use crust_api::v1::{
    Capability as CriCaps, CdiDevice, ContainerConfig, ContainerMetadata, Device, DnsConfig,
    HugepageLimit, ImageSpec, Int64Value, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, PortMapping,
    SecurityProfile,
};
use crust_oci::{
    CgroupDriver, Host, HostDevice, HostPropagation, ImageConfig, PauseInput, PodFacts,
    RuntimeFacts, SeccompArch, SpecError, SpecInput, UnsetSeccomp, container_spec, pause_spec,
};
use crust_quote::testing::{check_message, config, hostile_string, long_string};
use oci_spec::runtime::LinuxDeviceType;
use proptest::prelude::*;
use prost::Message as _;

/// A host with a few real-looking paths, devices and one seccomp profile.
struct FakeHost {
    paths: HashMap<PathBuf, PathBuf>,
}

impl FakeHost {
    fn new() -> Self {
        let mut paths = HashMap::new();
        for p in [
            "/data",
            "/var/log",
            "/srv/shared",
            "/dev/fuse",
            "/dev/snd",
            "/profiles/p.json",
        ] {
            paths.insert(PathBuf::from(p), PathBuf::from(p));
        }
        paths.insert("/link".into(), "/data".into());
        FakeHost { paths }
    }

    fn get(&self, path: &Path) -> io::Result<PathBuf> {
        self.paths
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
}

fn dev(relative: &str, major: i64, minor: i64) -> HostDevice {
    HostDevice {
        relative: relative.into(),
        kind: LinuxDeviceType::C,
        major,
        minor,
        file_mode: 0o660,
        uid: 0,
        gid: 0,
    }
}

impl Host for FakeHost {
    fn resolve(&self, path: &Path) -> io::Result<PathBuf> {
        self.get(path)
    }
    fn propagation(&self, path: &Path) -> io::Result<HostPropagation> {
        self.get(path)?;
        Ok(if path.starts_with("/srv/shared") {
            HostPropagation::Shared
        } else {
            HostPropagation::Private
        })
    }
    fn devices(&self, path: &Path) -> io::Result<Vec<HostDevice>> {
        self.get(path)?;
        Ok(match path.to_str() {
            Some("/dev/fuse") => vec![dev("", 10, 229)],
            Some("/dev/snd") => vec![dev("controlC0", 116, 0), dev("pcm", 116, 16)],
            _ => Vec::new(),
        })
    }
    fn all_devices(&self) -> io::Result<Vec<HostDevice>> {
        Ok(vec![dev("null", 1, 3), dev("fuse", 10, 229)])
    }
    fn read_seccomp_profile(&self, path: &Path) -> io::Result<String> {
        self.get(path)?;
        Ok(r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}"#.into())
    }
    fn apparmor_profile_loaded(&self, name: &str) -> io::Result<bool> {
        Ok(name.starts_with("loaded"))
    }
}

fn baseline_sandbox() -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web-0".into(),
        log_directory: "/var/log/pods/x".into(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/pod-uid-1".into(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
                    ipc: NamespaceMode::Pod as i32,
                    pid: NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn baseline_config() -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: "docker.io/library/busybox:latest".into(),
            ..Default::default()
        }),
        command: vec!["/bin/sh".into()],
        args: vec!["-c".into(), "sleep 1".into()],
        envs: vec![KeyValue {
            key: "A".into(),
            value: "1".into(),
        }],
        mounts: vec![Mount {
            container_path: "/data".into(),
            host_path: "/data".into(),
            ..Default::default()
        }],
        log_path: "app/0.log".into(),
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                cpu_shares: 512,
                memory_limit_in_bytes: 64 << 20,
                ..Default::default()
            }),
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Pod as i32,
                    ipc: NamespaceMode::Pod as i32,
                    pid: NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// Paths: the fake host's, tricky absolute ones, and anything.
fn path() -> BoxedStrategy<String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "/data", "/link", "/srv/shared", "/dev/fuse", "/dev/snd", "/", "/proc", "/sys/x",
            "/etc/hosts", "/dev/shm", "/a/../b", "relative", "/a/./b//", "/profiles/p.json",
        ])
        .prop_map(str::to_string),
        2 => hostile_string(),
        1 => long_string(),
    ]
    .boxed()
}

fn strings(max: usize) -> BoxedStrategy<Vec<String>> {
    proptest::collection::vec(hostile_string(), 0..max).boxed()
}

fn map(max: usize) -> BoxedStrategy<HashMap<String, String>> {
    proptest::collection::hash_map(hostile_string(), hostile_string(), 0..max).boxed()
}

fn num() -> BoxedStrategy<i64> {
    prop_oneof![
        Just(0i64),
        Just(-1),
        Just(i64::MIN),
        Just(i64::MAX),
        0i64..5000,
        any::<i64>()
    ]
    .boxed()
}

fn profile() -> BoxedStrategy<Option<SecurityProfile>> {
    proptest::option::of(
        (
            prop_oneof![0i32..3, any::<i32>()],
            prop_oneof![Just("/profiles/p.json".to_string()), path()],
        )
            .prop_map(|(t, r)| SecurityProfile {
                profile_type: t,
                localhost_ref: r,
            }),
    )
    .boxed()
}

/// One change to a request, an image or a node.
#[derive(Debug, Clone)]
enum Change {
    Name(String),
    Command(Vec<String>),
    Args(Vec<String>),
    WorkingDir(String),
    Envs(Vec<(String, String)>),
    Mount(String, String, bool, i32, bool),
    ImageMount(String, String),
    Device(String, String, String),
    Labels(HashMap<String, String>, HashMap<String, String>),
    LogPath(String),
    Tty(bool, bool),
    Resources(
        Vec<i64>,
        String,
        String,
        Vec<(String, u64)>,
        HashMap<String, String>,
    ),
    Caps(Vec<String>, Vec<String>, Vec<String>),
    Privileged(bool, bool, bool),
    Namespaces(i32, i32, i32, String, bool),
    RunAs(Option<i64>, Option<i64>, String, Vec<i64>),
    Paths(Vec<String>, Vec<String>),
    Seccomp(Option<SecurityProfile>, Option<SecurityProfile>, String),
    Cdi(Vec<String>),
    StopSignal(i32, String),
    Hostname(String, String),
    Dns(Vec<String>, Vec<String>, Vec<String>),
    PortMappings(Vec<(i32, i32, i32, String)>),
    CgroupParent(String),
    Sysctls(HashMap<String, String>),
    PodSecurity(Option<i64>, Vec<i64>, Option<SecurityProfile>, bool),
    Image(Vec<String>, Vec<String>, Vec<String>, String, String),
    Passwd(String, String),
    Node(bool, bool, bool, bool, bool),
}

fn change() -> BoxedStrategy<Change> {
    prop_oneof![
        hostile_string().prop_map(Change::Name),
        strings(4).prop_map(Change::Command),
        strings(4).prop_map(Change::Args),
        path().prop_map(Change::WorkingDir),
        proptest::collection::vec((hostile_string(), hostile_string()), 0..4)
            .prop_map(Change::Envs),
        (
            path(),
            path(),
            any::<bool>(),
            prop_oneof![0i32..3, any::<i32>()],
            any::<bool>()
        )
            .prop_map(|(c, h, ro, p, rro)| Change::Mount(c, h, ro, p, rro)),
        (path(), hostile_string()).prop_map(|(c, i)| Change::ImageMount(c, i)),
        (
            path(),
            path(),
            prop_oneof![Just("rwm".to_string()), hostile_string()]
        )
            .prop_map(|(c, h, p)| Change::Device(c, h, p)),
        (map(3), map(3)).prop_map(|(l, a)| Change::Labels(l, a)),
        path().prop_map(Change::LogPath),
        (any::<bool>(), any::<bool>()).prop_map(|(a, b)| Change::Tty(a, b)),
        (
            proptest::collection::vec(num(), 6),
            prop_oneof![Just("0-1".to_string()), hostile_string()],
            prop_oneof![Just("0".to_string()), hostile_string()],
            proptest::collection::vec(
                (
                    prop_oneof![Just("2MB".to_string()), hostile_string()],
                    any::<u64>()
                ),
                0..3
            ),
            proptest::collection::hash_map(
                prop_oneof![
                    prop::sample::select(vec![
                        "memory.high",
                        "cpu.weight",
                        "cgroup.procs",
                        "../x",
                        "pids.max",
                        "io.max"
                    ])
                    .prop_map(str::to_string),
                    hostile_string()
                ],
                hostile_string(),
                0..3
            ),
        )
            .prop_map(|(n, c, m, h, u)| Change::Resources(n, c, m, h, u)),
        (strings(3), strings(3), strings(2)).prop_map(|(a, d, amb)| Change::Caps(a, d, amb)),
        (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(a, b, c)| Change::Privileged(a, b, c)),
        (
            prop_oneof![0i32..4, any::<i32>()],
            prop_oneof![0i32..4, any::<i32>()],
            prop_oneof![0i32..4, any::<i32>()],
            hostile_string(),
            any::<bool>()
        )
            .prop_map(|(n, p, i, t, u)| Change::Namespaces(n, p, i, t, u)),
        (
            proptest::option::of(num()),
            proptest::option::of(num()),
            hostile_string(),
            proptest::collection::vec(num(), 0..4)
        )
            .prop_map(|(u, g, n, s)| Change::RunAs(u, g, n, s)),
        (
            proptest::collection::vec(path(), 0..3),
            proptest::collection::vec(path(), 0..3)
        )
            .prop_map(|(m, r)| Change::Paths(m, r)),
        (profile(), profile(), path()).prop_map(|(s, a, p)| Change::Seccomp(s, a, p)),
        strings(3).prop_map(Change::Cdi),
        (prop_oneof![0i32..70, any::<i32>()], hostile_string())
            .prop_map(|(s, i)| Change::StopSignal(s, i)),
        (hostile_string(), path()).prop_map(|(h, l)| Change::Hostname(h, l)),
        (strings(3), strings(3), strings(3)).prop_map(|(a, b, c)| Change::Dns(a, b, c)),
        proptest::collection::vec(
            (
                any::<i32>(),
                any::<i32>(),
                prop_oneof![0i32..3, any::<i32>()],
                hostile_string()
            ),
            0..3
        )
        .prop_map(Change::PortMappings),
        path().prop_map(Change::CgroupParent),
        proptest::collection::hash_map(
            prop_oneof![
                prop::sample::select(vec![
                    "net.ipv4.ip_forward",
                    "kernel.shm_rmid_forced",
                    "kernel.msgmax",
                    "fs.mqueue.x",
                    "net.core.somaxconn",
                    "kernel.hostname",
                    "vm.swappiness",
                    "net/ipv4/ping_group_range"
                ])
                .prop_map(str::to_string),
                hostile_string()
            ],
            hostile_string(),
            0..3
        )
        .prop_map(Change::Sysctls),
        (
            proptest::option::of(num()),
            proptest::collection::vec(num(), 0..3),
            profile(),
            any::<bool>()
        )
            .prop_map(|(u, g, s, p)| Change::PodSecurity(u, g, s, p)),
        (strings(3), strings(3), strings(3), path(), hostile_string())
            .prop_map(|(e, c, env, w, u)| Change::Image(e, c, env, w, u)),
        (passwd_text(), passwd_text()).prop_map(|(p, g)| Change::Passwd(p, g)),
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(a, b, c, d, e)| Change::Node(a, b, c, d, e)),
    ]
    .boxed()
}

/// /etc/passwd or /etc/group text: real lines, hostile fields, garbage.
fn passwd_text() -> BoxedStrategy<String> {
    proptest::collection::vec(
        prop_oneof![
            Just("root:x:0:0:root:/root:/bin/sh".to_string()),
            (hostile_string(), num(), num(), hostile_string())
                .prop_map(|(n, u, g, home)| format!("{n}:x:{u}:{g}::{home}:/bin/sh")),
            hostile_string(),
        ],
        0..5,
    )
    .prop_map(|lines| lines.join("\n"))
    .boxed()
}

struct Case {
    config: ContainerConfig,
    sandbox: PodSandboxConfig,
    image: ImageConfig,
    passwd: String,
    group: String,
    runtime: RuntimeFacts,
}

fn sc(c: &mut ContainerConfig) -> &mut LinuxContainerSecurityContext {
    c.linux
        .get_or_insert_default()
        .security_context
        .get_or_insert_default()
}

fn apply(case: &mut Case, ch: Change) {
    let c = &mut case.config;
    match ch {
        Change::Name(n) => c.metadata.get_or_insert_default().name = n,
        Change::Command(v) => c.command = v,
        Change::Args(v) => c.args = v,
        Change::WorkingDir(w) => c.working_dir = w,
        Change::Envs(e) => {
            c.envs = e
                .into_iter()
                .map(|(key, value)| KeyValue { key, value })
                .collect()
        }
        Change::Mount(container_path, host_path, readonly, propagation, recursive_read_only) => {
            c.mounts.push(Mount {
                container_path,
                host_path,
                readonly: readonly || recursive_read_only,
                propagation,
                recursive_read_only,
                ..Default::default()
            })
        }
        Change::ImageMount(container_path, image) => c.mounts.push(Mount {
            container_path,
            image: Some(ImageSpec {
                image,
                ..Default::default()
            }),
            ..Default::default()
        }),
        Change::Device(container_path, host_path, permissions) => c.devices.push(Device {
            container_path,
            host_path,
            permissions,
        }),
        Change::Labels(l, a) => {
            c.labels = l;
            c.annotations = a;
        }
        Change::LogPath(p) => c.log_path = p,
        Change::Tty(tty, stdin) => {
            c.tty = tty;
            c.stdin = stdin;
        }
        Change::Resources(n, cpus, mems, huge, unified) => {
            let r = c
                .linux
                .get_or_insert_default()
                .resources
                .get_or_insert_default();
            r.cpu_period = n[0];
            r.cpu_quota = n[1];
            r.cpu_shares = n[2];
            r.memory_limit_in_bytes = n[3];
            r.oom_score_adj = n[4];
            r.memory_swap_limit_in_bytes = n[5];
            r.cpuset_cpus = cpus;
            r.cpuset_mems = mems;
            r.hugepage_limits = huge
                .into_iter()
                .map(|(page_size, limit)| HugepageLimit { page_size, limit })
                .collect();
            r.unified = unified;
        }
        Change::Caps(add, drop, ambient) => {
            sc(c).capabilities = Some(CriCaps {
                add_capabilities: add,
                drop_capabilities: drop,
                add_ambient_capabilities: ambient,
            })
        }
        Change::Privileged(p, ro, nnp) => {
            let s = sc(c);
            s.privileged = p;
            s.readonly_rootfs = ro;
            s.no_new_privs = nnp;
            if p && let Some(l) = case.sandbox.linux.as_mut() {
                l.security_context.get_or_insert_default().privileged = true;
            }
        }
        Change::Namespaces(network, pid, ipc, target_id, userns) => {
            let ns = NamespaceOption {
                network,
                pid,
                ipc,
                target_id,
                userns_options: userns.then(Default::default),
            };
            sc(c).namespace_options = Some(ns.clone());
            if let Some(l) = case.sandbox.linux.as_mut() {
                l.security_context.get_or_insert_default().namespace_options = Some(ns);
            }
        }
        Change::RunAs(uid, gid, name, groups) => {
            let s = sc(c);
            s.run_as_user = uid.map(|value| Int64Value { value });
            s.run_as_group = gid.map(|value| Int64Value { value });
            s.run_as_username = name;
            s.supplemental_groups = groups;
        }
        Change::Paths(masked, readonly) => {
            let s = sc(c);
            s.masked_paths = masked;
            s.readonly_paths = readonly;
        }
        Change::Seccomp(seccomp, apparmor, path) => {
            let s = sc(c);
            s.seccomp = seccomp;
            s.apparmor = apparmor;
            // Old kubelets still send the deprecated field.
            #[allow(deprecated)]
            {
                s.seccomp_profile_path = path;
            }
        }
        Change::Cdi(names) => {
            c.cdi_devices = names.into_iter().map(|name| CdiDevice { name }).collect()
        }
        Change::StopSignal(sig, image) => {
            c.stop_signal = sig;
            case.image.stop_signal = image;
        }
        Change::Hostname(h, l) => {
            case.sandbox.hostname = h;
            case.sandbox.log_directory = l;
        }
        Change::Dns(servers, searches, options) => {
            case.sandbox.dns_config = Some(DnsConfig {
                servers,
                searches,
                options,
            })
        }
        Change::PortMappings(p) => {
            case.sandbox.port_mappings = p
                .into_iter()
                .map(
                    |(container_port, host_port, protocol, host_ip)| PortMapping {
                        protocol,
                        container_port,
                        host_port,
                        host_ip,
                    },
                )
                .collect()
        }
        Change::CgroupParent(p) => case.sandbox.linux.get_or_insert_default().cgroup_parent = p,
        Change::Sysctls(s) => case.sandbox.linux.get_or_insert_default().sysctls = s,
        Change::PodSecurity(uid, groups, seccomp, privileged) => {
            let s = case
                .sandbox
                .linux
                .get_or_insert_default()
                .security_context
                .get_or_insert_default();
            s.run_as_user = uid.map(|value| Int64Value { value });
            s.supplemental_groups = groups;
            s.seccomp = seccomp;
            s.privileged = privileged;
        }
        Change::Image(entrypoint, cmd, env, working_dir, user) => {
            case.image.entrypoint = entrypoint;
            case.image.cmd = cmd;
            case.image.env = env;
            case.image.working_dir = working_dir;
            case.image.user = user;
        }
        Change::Passwd(p, g) => {
            case.passwd = p;
            case.group = g;
        }
        Change::Node(v2, systemd, rro, swap, unset_default) => {
            let r = &mut case.runtime;
            r.cgroup_v2 = v2;
            r.cgroup_driver = if systemd {
                CgroupDriver::Systemd
            } else {
                CgroupDriver::Cgroupfs
            };
            r.rro_supported = rro;
            r.swap_available = swap;
            r.unset_seccomp = if unset_default {
                UnsetSeccomp::RuntimeDefault
            } else {
                UnsetSeccomp::Unconfined
            };
        }
    }
}

fn new_case() -> Case {
    Case {
        config: baseline_config(),
        sandbox: baseline_sandbox(),
        image: ImageConfig {
            cmd: vec!["/bin/sh".into()],
            env: vec!["PATH=/usr/bin:/bin".into()],
            ..Default::default()
        },
        passwd: "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n".into(),
        group: "root:x:0:\nalice:x:1000:\n".into(),
        runtime: RuntimeFacts {
            node_hostname: "node1".into(),
            seccomp_arch: SeccompArch::X86_64,
            ..Default::default()
        },
    }
}

fn pod_facts(case: &Case) -> PodFacts {
    PodFacts {
        sandbox_id: "sb1".into(),
        net_ns: Some("/run/crust/ns/net/sb1".into()),
        ipc_ns: Some("/run/crust/ns/ipc/sb1".into()),
        uts_ns: Some("/run/crust/ns/uts/sb1".into()),
        pid_ns: Some("/proc/42/ns/pid".into()),
        target_pid_ns: Some("/proc/43/ns/pid".into()),
        cgroup_parent: case
            .sandbox
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .unwrap_or_default(),
        resolv_conf: Some("/run/crust/pods/sb1/resolv.conf".into()),
        hosts: Some("/run/crust/pods/sb1/hosts".into()),
        hostname_file: Some("/run/crust/pods/sb1/hostname".into()),
        shm: Some("/run/crust/pods/sb1/shm".into()),
        user_ns: None,
    }
}

/// What every spec that comes out must satisfy, and every error.
fn check(
    case: &Case,
    result: Result<oci_spec::runtime::Spec, SpecError>,
) -> Result<(), TestCaseError> {
    match result {
        Ok(mut spec) => {
            // Annotations are opaque metadata (the request's names, JSON
            // escaped); everything else reaches a syscall or a file.
            spec.set_annotations(None);
            let json = serde_json::to_string(&spec).unwrap();
            prop_assert!(!json.contains("\\u0000"), "a NUL reached the spec: {json}");
            for m in spec.mounts().iter().flatten() {
                let d = m.destination().to_string_lossy();
                prop_assert!(d.starts_with('/'), "mount destination {d:?}");
                prop_assert!(!d.split('/').any(|c| c == ".."), "mount destination {d:?}");
            }
            if let Some(p) = spec.process() {
                prop_assert!(p.args().as_ref().is_some_and(|a| !a.is_empty()));
            }
            let _ = case;
        }
        Err(e) => {
            prop_assert!(!e.field().is_empty(), "{e}");
            check_message("SpecError", &e.to_string())?;
        }
    }
    Ok(())
}

fn run(case: &Case) -> Result<(), TestCaseError> {
    let host = FakeHost::new();
    let pod = pod_facts(case);
    let result = container_spec(&SpecInput {
        container_id: "c0ffee",
        config: &case.config,
        sandbox_config: &case.sandbox,
        image: &case.image,
        image_name: "busybox:latest",
        etc_passwd: Some(&case.passwd),
        etc_group: Some(&case.group),
        rootfs: Path::new("/var/lib/crust/containers/c0ffee/rootfs"),
        pod: &pod,
        runtime: &case.runtime,
        host: &host,
    });
    check(case, result)?;
    let result = pause_spec(&PauseInput {
        sandbox_config: &case.sandbox,
        pod: &pod,
        rootfs: Path::new("/var/lib/crust/pause"),
        command: "/pause",
        runtime: &case.runtime,
    });
    check(case, result)
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn hostile_requests_give_a_spec_or_a_short_error(
        changes in proptest::collection::vec(change(), 1..6),
    ) {
        let mut case = new_case();
        for ch in changes {
            apply(&mut case, ch);
        }
        run(&case)?;
    }
}

proptest! {
    #![proptest_config(config(1024))]

    /// The baseline requests' protobuf encodings with bytes flipped, as a
    /// client could send them: whatever still decodes is a request.
    #[test]
    fn mangled_requests_give_a_spec_or_a_short_error(
        changes in proptest::collection::vec(change(), 0..3),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        sandbox_flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
    ) {
        let mut case = new_case();
        for ch in changes {
            apply(&mut case, ch);
        }
        let mut bytes = case.config.encode_to_vec();
        for (i, b) in flips {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        let mut sbytes = case.sandbox.encode_to_vec();
        for (i, b) in sandbox_flips {
            let i = i.index(sbytes.len());
            sbytes[i] = b;
        }
        let (Ok(config), Ok(sandbox)) = (
            ContainerConfig::decode(bytes.as_slice()),
            PodSandboxConfig::decode(sbytes.as_slice()),
        ) else {
            return Ok(());
        };
        case.config = config;
        case.sandbox = sandbox;
        run(&case)?;
    }
}
