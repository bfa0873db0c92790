//! Whole-spec tests: [`container_spec`] and [`pause_spec`] field by field,
//! with a fake [`Host`].

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

use crust_api::v1::{
    Capability as CriCaps, CdiDevice, ContainerConfig, ContainerMetadata, Device, ImageSpec,
    Int64Value, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount,
    MountPropagation, NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
    SecurityProfile, UserNamespace, security_profile::ProfileType,
};
use oci_spec::runtime::{
    Capability, LinuxDeviceType, LinuxNamespaceType, LinuxSeccompAction, PosixRlimit,
    PosixRlimitType, Spec,
};

use crate::*;

// ---------------------------------------------------------------- fixture

#[derive(Default)]
struct FakeHost {
    /// path -> resolved path; anything absent does not exist.
    paths: HashMap<PathBuf, PathBuf>,
    propagation: HashMap<PathBuf, HostPropagation>,
    devices: HashMap<PathBuf, Vec<HostDevice>>,
    all_devices: Vec<HostDevice>,
    profiles: HashMap<PathBuf, String>,
    /// Loaded AppArmor profiles.
    apparmor: HashSet<String>,
    /// Fail every look-up with this kind.
    fail: Option<io::ErrorKind>,
}

impl FakeHost {
    fn check(&self) -> io::Result<()> {
        match self.fail {
            Some(k) => Err(io::Error::from(k)),
            None => Ok(()),
        }
    }
}

impl Host for FakeHost {
    fn resolve(&self, path: &Path) -> io::Result<PathBuf> {
        self.check()?;
        self.paths
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
    fn propagation(&self, path: &Path) -> io::Result<HostPropagation> {
        self.check()?;
        Ok(*self
            .propagation
            .get(path)
            .unwrap_or(&HostPropagation::Private))
    }
    fn devices(&self, path: &Path) -> io::Result<Vec<HostDevice>> {
        self.check()?;
        if let Some(d) = self.devices.get(path) {
            return Ok(d.clone());
        }
        if self.paths.contains_key(path) {
            return Ok(Vec::new());
        }
        Err(io::Error::from(io::ErrorKind::NotFound))
    }
    fn all_devices(&self) -> io::Result<Vec<HostDevice>> {
        self.check()?;
        Ok(self.all_devices.clone())
    }
    fn read_seccomp_profile(&self, path: &Path) -> io::Result<String> {
        self.check()?;
        self.profiles
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
    fn apparmor_profile_loaded(&self, name: &str) -> io::Result<bool> {
        self.check()?;
        Ok(self.apparmor.contains(name))
    }
}

fn dev(relative: &str, kind: LinuxDeviceType, major: i64, minor: i64) -> HostDevice {
    HostDevice {
        relative: PathBuf::from(relative),
        kind,
        major,
        minor,
        file_mode: 0o660,
        uid: 0,
        gid: 44,
    }
}

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n";
const GROUP: &str = "root:x:0:\nalice:x:1000:\nvideo:x:44:alice\n";

struct Fx {
    id: String,
    config: ContainerConfig,
    sandbox: PodSandboxConfig,
    image: ImageConfig,
    pod: PodFacts,
    runtime: RuntimeFacts,
    host: FakeHost,
    passwd: Option<&'static str>,
    group: Option<&'static str>,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

impl Fx {
    /// A kubelet-like container in a kubelet-like pod (own PID namespace,
    /// pod network/IPC), cgroup v2, cgroupfs.
    fn new() -> Fx {
        let sandbox = PodSandboxConfig {
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
        };
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: "docker.io/library/busybox:latest".into(),
                ..Default::default()
            }),
            linux: Some(LinuxContainerConfig {
                resources: None,
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
        };
        let image = ImageConfig {
            entrypoint: vec![],
            cmd: s(&["/bin/sh"]),
            env: s(&["PATH=/usr/bin:/bin"]),
            ..Default::default()
        };
        let pod = PodFacts {
            sandbox_id: "sb1".into(),
            net_ns: Some("/run/crust/ns/net/sb1".into()),
            ipc_ns: Some("/run/crust/ns/ipc/sb1".into()),
            uts_ns: Some("/run/crust/ns/uts/sb1".into()),
            pid_ns: None,
            target_pid_ns: None,
            cgroup_parent: "/kubepods/pod-uid-1".into(),
            resolv_conf: Some("/run/crust/pods/sb1/resolv.conf".into()),
            hosts: Some("/run/crust/pods/sb1/hosts".into()),
            hostname_file: Some("/run/crust/pods/sb1/hostname".into()),
            shm: Some("/run/crust/pods/sb1/shm".into()),
            user_ns: None,
        };
        let runtime = RuntimeFacts {
            node_hostname: "node1".into(),
            seccomp_arch: SeccompArch::X86_64,
            ..Default::default()
        };
        let mut host = FakeHost::default();
        for p in [
            "/data",
            "/var/log",
            "/srv/shared",
            "/srv/slave",
            "/dev/snd",
            "/dev/fuse",
        ] {
            host.paths.insert(p.into(), p.into());
        }
        host.paths.insert("/link-to-data".into(), "/data".into());
        host.propagation
            .insert("/srv/shared".into(), HostPropagation::Shared);
        host.propagation
            .insert("/srv/slave".into(), HostPropagation::Slave);
        host.devices.insert(
            "/dev/fuse".into(),
            vec![dev("", LinuxDeviceType::C, 10, 229)],
        );
        host.devices.insert(
            "/dev/snd".into(),
            vec![
                dev("controlC0", LinuxDeviceType::C, 116, 0),
                dev("pcmC0D0p", LinuxDeviceType::C, 116, 16),
            ],
        );
        host.all_devices = vec![
            dev("null", LinuxDeviceType::C, 1, 3),
            dev("sda", LinuxDeviceType::B, 8, 0),
            dev("fuse", LinuxDeviceType::C, 10, 229),
        ];
        Fx {
            id: "c0ffee".into(),
            config,
            sandbox,
            image,
            pod,
            runtime,
            host,
            passwd: Some(PASSWD),
            group: Some(GROUP),
        }
    }

    fn spec(&self) -> Result<Spec, SpecError> {
        container_spec(&SpecInput {
            container_id: &self.id,
            config: &self.config,
            sandbox_config: &self.sandbox,
            image: &self.image,
            image_name: "busybox:latest",
            etc_passwd: self.passwd,
            etc_group: self.group,
            rootfs: Path::new("/var/lib/crust/containers/c0ffee/rootfs"),
            pod: &self.pod,
            runtime: &self.runtime,
            host: &self.host,
        })
    }

    fn ok(&self) -> Spec {
        self.spec().unwrap()
    }

    fn err(&self) -> SpecError {
        self.spec().unwrap_err()
    }

    fn sc(&mut self) -> &mut LinuxContainerSecurityContext {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }

    fn res(&mut self) -> &mut LinuxContainerResources {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default)
    }

    fn sandbox_sc(&mut self) -> &mut LinuxSandboxSecurityContext {
        self.sandbox
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }

    fn pod_ns(&mut self) -> &mut NamespaceOption {
        self.sandbox_sc()
            .namespace_options
            .get_or_insert_with(Default::default)
    }

    fn ctr_ns(&mut self) -> &mut NamespaceOption {
        self.sc()
            .namespace_options
            .get_or_insert_with(Default::default)
    }

    fn host_network(&mut self) {
        self.pod_ns().network = NamespaceMode::Node as i32;
        self.ctr_ns().network = NamespaceMode::Node as i32;
        self.pod.net_ns = None;
        self.pod.uts_ns = None;
    }

    fn privileged(&mut self) {
        self.sandbox_sc().privileged = true;
        self.sc().privileged = true;
    }

    fn mount(&mut self, container: &str, host: &str) -> &mut Mount {
        self.config.mounts.push(Mount {
            container_path: container.into(),
            host_path: host.into(),
            ..Default::default()
        });
        self.config.mounts.last_mut().unwrap()
    }
}

fn process(spec: &Spec) -> &oci_spec::runtime::Process {
    spec.process().as_ref().unwrap()
}

fn linux(spec: &Spec) -> &oci_spec::runtime::Linux {
    spec.linux().as_ref().unwrap()
}

fn mounts(spec: &Spec) -> Vec<(String, String, String, Vec<String>)> {
    spec.mounts()
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m.destination().to_string_lossy().into_owned(),
                m.typ().clone().unwrap_or_default(),
                m.source()
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                m.options().clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn mount_at(spec: &Spec, dest: &str) -> Option<(String, String, String, Vec<String>)> {
    mounts(spec).into_iter().find(|m| m.0 == dest)
}

fn namespaces(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<String>)> {
    linux(spec)
        .namespaces()
        .as_ref()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n.typ(),
                n.path().as_ref().map(|p| p.to_string_lossy().into_owned()),
            )
        })
        .collect()
}

fn ns_of(spec: &Spec, t: LinuxNamespaceType) -> Option<Option<String>> {
    namespaces(spec).into_iter().find(|n| n.0 == t).map(|n| n.1)
}

fn bounding(spec: &Spec) -> HashSet<Capability> {
    process(spec)
        .capabilities()
        .as_ref()
        .unwrap()
        .bounding()
        .clone()
        .unwrap()
}

// ---------------------------------------------------------------- baseline

#[test]
fn baseline_spec() {
    let spec = Fx::new().ok();
    assert_eq!(spec.version(), OCI_VERSION);
    let root = spec.root().as_ref().unwrap();
    assert_eq!(
        root.path(),
        Path::new("/var/lib/crust/containers/c0ffee/rootfs")
    );
    assert_eq!(root.readonly(), Some(false));
    let p = process(&spec);
    assert_eq!(p.terminal(), Some(false));
    assert_eq!(p.args().clone().unwrap(), s(&["/bin/sh"]));
    assert_eq!(
        p.env().clone().unwrap(),
        s(&["PATH=/usr/bin:/bin", "HOSTNAME=web-0"])
    );
    assert_eq!(p.cwd(), Path::new("/"));
    assert_eq!((p.user().uid(), p.user().gid()), (0, 0));
    assert_eq!(p.user().additional_gids().clone().unwrap(), vec![0]);
    assert_eq!(p.no_new_privileges(), Some(false));
    assert_eq!(p.oom_score_adj(), None);
    assert_eq!(bounding(&spec), DEFAULT_CAPABILITIES.into_iter().collect());
    assert_eq!(spec.hostname().as_deref(), Some("web-0"));
    assert!(
        linux(&spec).seccomp().is_none(),
        "unset seccomp is unconfined"
    );
    assert_eq!(
        linux(&spec).cgroups_path().as_deref(),
        Some(Path::new("/kubepods/pod-uid-1/crust-c0ffee"))
    );
}

#[test]
fn nothing_leaks_from_oci_spec_defaults() {
    let spec = Fx::new().ok();
    let p = process(&spec);
    assert!(p.rlimits().is_none());
    assert!(p.apparmor_profile().is_none());
    assert!(p.selinux_label().is_none());
    assert!(p.scheduler().is_none());
    assert!(p.console_size().is_none());
    assert!(spec.hooks().is_none());
    assert!(spec.domainname().is_none());
    let l = linux(&spec);
    assert!(l.uid_mappings().is_none());
    assert!(l.gid_mappings().is_none());
    assert!(l.sysctl().is_none());
    assert!(l.rootfs_propagation().is_none());
    assert!(l.mount_label().is_none());
    assert!(l.intel_rdt().is_none());
    assert!(l.personality().is_none());
    let r = l.resources().as_ref().unwrap();
    assert!(r.cpu().is_none() && r.memory().is_none() && r.pids().is_none());
    assert!(r.block_io().is_none() && r.network().is_none());
}

#[test]
fn serializes_to_oci_json_and_back() {
    let mut fx = Fx::new();
    fx.sc().seccomp = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let spec = fx.ok();
    let j = serde_json::to_value(&spec).unwrap();
    for key in [
        "ociVersion",
        "root",
        "mounts",
        "process",
        "hostname",
        "annotations",
        "linux",
    ] {
        assert!(j.get(key).is_some(), "{key}");
    }
    assert_eq!(j["ociVersion"], OCI_VERSION);
    assert_eq!(j["root"]["path"], "/var/lib/crust/containers/c0ffee/rootfs");
    assert_eq!(
        j["process"]["user"]["additionalGids"],
        serde_json::json!([0])
    );
    assert!(
        j["process"]["capabilities"]["bounding"]
            .as_array()
            .unwrap()
            .contains(&"CAP_CHOWN".into())
    );
    assert_eq!(j["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
    assert_eq!(
        j["linux"]["cgroupsPath"],
        "/kubepods/pod-uid-1/crust-c0ffee"
    );
    assert_eq!(j["linux"]["namespaces"][0]["type"], "pid");
    let back: Spec = serde_json::from_value(j).unwrap();
    assert_eq!(back, spec);
}

// ---------------------------------------------------------------- process

#[test]
fn args_from_request_and_image() {
    let mut fx = Fx::new();
    fx.image.entrypoint = s(&["/entry"]);
    fx.image.cmd = s(&["default"]);
    fx.config.args = s(&["a1"]);
    assert_eq!(
        process(&fx.ok()).args().clone().unwrap(),
        s(&["/entry", "a1"])
    );
    fx.config.command = s(&["/cmd"]);
    assert_eq!(
        process(&fx.ok()).args().clone().unwrap(),
        s(&["/cmd", "a1"])
    );
}

#[test]
fn no_command_is_error() {
    let mut fx = Fx::new();
    fx.image.cmd.clear();
    assert_eq!(fx.err().field(), "config.command");
    assert_eq!(fx.err().class(), ErrorClass::InvalidArgument);
}

#[test]
fn env_in_spec() {
    let mut fx = Fx::new();
    fx.config.envs = vec![KeyValue {
        key: "FOO".into(),
        value: "bar".into(),
    }];
    fx.config.tty = true;
    let spec = fx.ok();
    assert_eq!(
        process(&spec).env().clone().unwrap(),
        s(&[
            "PATH=/usr/bin:/bin",
            "HOSTNAME=web-0",
            "TERM=xterm",
            "FOO=bar"
        ])
    );
    assert_eq!(process(&spec).terminal(), Some(true));
}

#[test]
fn env_key_with_equals_rejected() {
    let mut fx = Fx::new();
    fx.config.envs = vec![KeyValue {
        key: "A=B".into(),
        value: "x".into(),
    }];
    assert_eq!(fx.err().field(), "config.envs[0].key");
}

#[test]
fn hostname_env_falls_back_to_node() {
    let mut fx = Fx::new();
    fx.sandbox.hostname.clear();
    let spec = fx.ok();
    assert!(
        process(&spec)
            .env()
            .clone()
            .unwrap()
            .contains(&"HOSTNAME=node1".into())
    );
    assert_eq!(spec.hostname().as_deref(), Some("node1"));
}

#[test]
fn bad_sandbox_hostname_rejected() {
    let mut fx = Fx::new();
    fx.sandbox.hostname = "bad host\n".into();
    assert_eq!(fx.err().field(), "sandbox_config.hostname");
}

#[test]
fn working_dir() {
    let mut fx = Fx::new();
    fx.image.working_dir = "/img".into();
    assert_eq!(process(&fx.ok()).cwd(), Path::new("/img"));
    fx.config.working_dir = "/req".into();
    assert_eq!(process(&fx.ok()).cwd(), Path::new("/req"));
    fx.config.working_dir = "req".into();
    assert_eq!(fx.err().field(), "config.working_dir");
}

#[test]
fn rlimits_from_runtime_facts() {
    let mut fx = Fx::new();
    let r: PosixRlimit = oci_spec::runtime::PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .hard(1u64 << 20)
        .soft(1u64 << 20)
        .build()
        .unwrap();
    fx.runtime.rlimits = vec![r];
    assert_eq!(process(&fx.ok()).rlimits().clone().unwrap(), vec![r]);
}

// ---------------------------------------------------------------- user

#[test]
fn user_from_request() {
    let mut fx = Fx::new();
    fx.sc().run_as_user = Some(Int64Value { value: 1000 });
    fx.sc().supplemental_groups = vec![5000];
    let spec = fx.ok();
    let u = process(&spec).user();
    assert_eq!((u.uid(), u.gid()), (1000, 1000));
    assert_eq!(u.additional_gids().clone().unwrap(), vec![1000, 44, 5000]);
}

#[test]
fn user_from_image() {
    let mut fx = Fx::new();
    fx.image.user = "alice".into();
    let spec = fx.ok();
    assert_eq!(process(&spec).user().uid(), 1000);
}

#[test]
fn missing_username_is_error() {
    let mut fx = Fx::new();
    fx.sc().run_as_username = "nobody-such".into();
    let e = fx.err();
    assert!(matches!(e, SpecError::UserNotFound { .. }));
    assert_eq!(e.class(), ErrorClass::InvalidArgument);
    // Also when the image has no /etc/passwd.
    fx.passwd = None;
    assert!(matches!(fx.err(), SpecError::UserNotFound { .. }));
}

#[test]
fn run_as_group_without_user_is_error() {
    let mut fx = Fx::new();
    fx.sc().run_as_group = Some(Int64Value { value: 5 });
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.run_as_group"
    );
}

// ---------------------------------------------------------------- namespaces

#[test]
fn pod_namespaces_joined_by_path() {
    let spec = Fx::new().ok();
    assert_eq!(
        namespaces(&spec),
        vec![
            (LinuxNamespaceType::Pid, None),
            (
                LinuxNamespaceType::Ipc,
                Some("/run/crust/ns/ipc/sb1".into())
            ),
            (
                LinuxNamespaceType::Uts,
                Some("/run/crust/ns/uts/sb1".into())
            ),
            (LinuxNamespaceType::Mount, None),
            (
                LinuxNamespaceType::Network,
                Some("/run/crust/ns/net/sb1".into())
            ),
            (LinuxNamespaceType::Cgroup, None),
        ]
    );
}

#[test]
fn no_cgroup_namespace_on_v1() {
    let mut fx = Fx::new();
    fx.runtime.cgroup_v2 = false;
    assert_eq!(ns_of(&fx.ok(), LinuxNamespaceType::Cgroup), None);
}

#[test]
fn host_network_uses_host_net_and_uts() {
    let mut fx = Fx::new();
    fx.host_network();
    let spec = fx.ok();
    assert_eq!(ns_of(&spec, LinuxNamespaceType::Network), None);
    assert_eq!(ns_of(&spec, LinuxNamespaceType::Uts), None);
    assert!(ns_of(&spec, LinuxNamespaceType::Ipc).is_some());
    assert!(spec.hostname().is_none());
}

#[test]
fn container_without_namespace_options_in_host_network_pod() {
    // crictl configs often leave the container's options unset.
    let mut fx = Fx::new();
    fx.host_network();
    fx.pod_ns().pid = NamespaceMode::Pod as i32;
    fx.sc().namespace_options = None;
    fx.pod.pid_ns = Some("/proc/42/ns/pid".into());
    let spec = fx.ok();
    assert_eq!(ns_of(&spec, LinuxNamespaceType::Network), None);
    assert_eq!(
        ns_of(&spec, LinuxNamespaceType::Pid),
        Some(Some("/proc/42/ns/pid".into()))
    );
}

#[test]
fn host_ipc_uses_host_ipc_and_shm() {
    let mut fx = Fx::new();
    fx.pod_ns().ipc = NamespaceMode::Node as i32;
    fx.ctr_ns().ipc = NamespaceMode::Node as i32;
    fx.pod.ipc_ns = None;
    let spec = fx.ok();
    assert_eq!(ns_of(&spec, LinuxNamespaceType::Ipc), None);
    let shm = mount_at(&spec, "/dev/shm").unwrap();
    assert_eq!((shm.1.as_str(), shm.2.as_str()), ("bind", "/dev/shm"));
}

#[test]
fn container_cannot_ask_for_host_namespaces_its_pod_lacks() {
    let mut fx = Fx::new();
    fx.ctr_ns().network = NamespaceMode::Node as i32;
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.network"
    );
    let mut fx = Fx::new();
    fx.ctr_ns().ipc = NamespaceMode::Node as i32;
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.ipc"
    );
    let mut fx = Fx::new();
    fx.ctr_ns().pid = NamespaceMode::Node as i32;
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.pid"
    );
}

#[test]
fn target_mode_only_for_pid() {
    let mut fx = Fx::new();
    fx.ctr_ns().network = NamespaceMode::Target as i32;
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.network"
    );
}

#[test]
fn pid_pod_joins_pause() {
    let mut fx = Fx::new();
    fx.pod_ns().pid = NamespaceMode::Pod as i32;
    fx.ctr_ns().pid = NamespaceMode::Pod as i32;
    fx.pod.pid_ns = Some("/proc/4242/ns/pid".into());
    assert_eq!(
        ns_of(&fx.ok(), LinuxNamespaceType::Pid),
        Some(Some("/proc/4242/ns/pid".into()))
    );
    fx.pod.pid_ns = None;
    let e = fx.err();
    assert_eq!(e.field(), "pod.pid_ns");
    assert_eq!(e.class(), ErrorClass::FailedPrecondition);
}

#[test]
fn pid_pod_in_a_pod_without_shared_pid_namespace() {
    let mut fx = Fx::new();
    fx.ctr_ns().pid = NamespaceMode::Pod as i32;
    let e = fx.err();
    assert_eq!(
        e.field(),
        "config.linux.security_context.namespace_options.pid"
    );
    assert!(e.to_string().contains("does not share"), "{e}");
}

#[test]
fn pid_node() {
    let mut fx = Fx::new();
    fx.pod_ns().pid = NamespaceMode::Node as i32;
    fx.ctr_ns().pid = NamespaceMode::Node as i32;
    assert_eq!(ns_of(&fx.ok(), LinuxNamespaceType::Pid), None);
    // POD in a host-PID pod is contradictory.
    fx.ctr_ns().pid = NamespaceMode::Pod as i32;
    assert!(fx.err().to_string().contains("host PID"));
}

#[test]
fn pid_target() {
    let mut fx = Fx::new();
    fx.ctr_ns().pid = NamespaceMode::Target as i32;
    fx.ctr_ns().target_id = "other".into();
    fx.pod.target_pid_ns = Some("/proc/77/ns/pid".into());
    assert_eq!(
        ns_of(&fx.ok(), LinuxNamespaceType::Pid),
        Some(Some("/proc/77/ns/pid".into()))
    );
    fx.pod.target_pid_ns = None;
    assert_eq!(fx.err().field(), "pod.target_pid_ns");
    fx.ctr_ns().target_id.clear();
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.target_id"
    );
    fx.ctr_ns().target_id = "../x".into();
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.target_id"
    );
}

#[test]
fn missing_pinned_namespace_is_precondition() {
    let mut fx = Fx::new();
    fx.pod.net_ns = None;
    let e = fx.err();
    assert_eq!(e.field(), "pod.net_ns");
    assert_eq!(e.class(), ErrorClass::FailedPrecondition);
}

#[test]
fn user_namespaces_join_the_pods() {
    use crate::{IdMapping, UserNs};
    // The pod's userns POD without a pinned namespace: the daemon's state
    // is missing it.
    let mut fx = Fx::new();
    fx.pod_ns().userns_options = Some(UserNamespace {
        mode: NamespaceMode::Pod as i32,
        ..Default::default()
    });
    let e = fx.err();
    assert_eq!(e.field(), "pod.user_ns");
    assert_eq!(e.class(), ErrorClass::FailedPrecondition);
    // A container asking for POD in a pod without one.
    let mut fx = Fx::new();
    fx.ctr_ns().userns_options = Some(UserNamespace {
        mode: NamespaceMode::Pod as i32,
        ..Default::default()
    });
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.userns_options.mode"
    );
    // With the pod's namespace: joined first, with its mappings.
    let mut fx = Fx::new();
    let map = |host_id| IdMapping {
        container_id: 0,
        host_id,
        size: 65536,
    };
    fx.pod.user_ns = Some(UserNs {
        path: "/run/crust/pods/sb1/ns/user".into(),
        uid: map(100000),
        gid: map(200000),
    });
    let pod_mode = || {
        Some(UserNamespace {
            mode: NamespaceMode::Pod as i32,
            ..Default::default()
        })
    };
    fx.pod_ns().userns_options = pod_mode();
    fx.ctr_ns().userns_options = pod_mode();
    let spec = fx.spec().unwrap();
    let linux = spec.linux().as_ref().unwrap();
    let first = &linux.namespaces().as_ref().unwrap()[0];
    assert_eq!(first.typ(), oci_spec::runtime::LinuxNamespaceType::User);
    assert_eq!(
        first.path().as_deref(),
        Some(std::path::Path::new("/run/crust/pods/sb1/ns/user"))
    );
    let uid = &linux.uid_mappings().as_ref().unwrap()[0];
    let gid = &linux.gid_mappings().as_ref().unwrap()[0];
    assert_eq!(
        (uid.container_id(), uid.host_id(), uid.size()),
        (0, 100000, 65536)
    );
    assert_eq!(gid.host_id(), 200000);
    // NODE (kubelet's hostUsers: true) is fine, and no user namespace.
    let mut fx = Fx::new();
    fx.ctr_ns().userns_options = Some(UserNamespace {
        mode: NamespaceMode::Node as i32,
        ..Default::default()
    });
    fx.pod_ns().userns_options = Some(UserNamespace {
        mode: NamespaceMode::Node as i32,
        ..Default::default()
    });
    let spec = fx.spec().unwrap();
    assert!(spec.linux().as_ref().unwrap().uid_mappings().is_none());
}

/// A user namespace pod on the node's network joins the user namespace,
/// not a network or UTS one, and binds the node's /sys (its user namespace
/// cannot mount sysfs for the node's network namespace).
#[test]
fn user_namespace_on_the_host_network() {
    let mut fx = Fx::new();
    fx.host_network();
    fx.pod.user_ns = Some(UserNs {
        path: "/run/crust/pods/sb1/ns/user".into(),
        uid: IdMapping {
            container_id: 0,
            host_id: 100000,
            size: 65536,
        },
        gid: IdMapping {
            container_id: 0,
            host_id: 100000,
            size: 65536,
        },
    });
    let pod_mode = Some(UserNamespace {
        mode: NamespaceMode::Pod as i32,
        ..Default::default()
    });
    fx.pod_ns().userns_options = pod_mode.clone();
    fx.ctr_ns().userns_options = pod_mode;
    let spec = fx.ok();
    let kinds: Vec<_> = namespaces(&spec).into_iter().map(|n| n.0).collect();
    use oci_spec::runtime::LinuxNamespaceType as T;
    assert_eq!(kinds[0], T::User);
    assert!(!kinds.contains(&T::Network) && !kinds.contains(&T::Uts));
    let sys = mount_at(&spec, "/sys").unwrap();
    assert_eq!(
        sys,
        (
            "/sys".into(),
            "bind".into(),
            "/sys".into(),
            s(&["rbind", "nosuid", "nodev", "noexec", "ro", "rro"])
        )
    );
    // Without rro on the handler: read-only at the top.
    fx.runtime.rro_supported = false;
    assert_eq!(
        mount_at(&fx.ok(), "/sys").unwrap().3,
        s(&["rbind", "nosuid", "nodev", "noexec", "ro"])
    );
    // /sys/fs/cgroup stays the container's own cgroup mount.
    assert_eq!(
        mount_at(&fx.ok(), "/sys/fs/cgroup").unwrap().1,
        "cgroup".to_string()
    );
    // Without a user namespace, or with the pod's own network: sysfs.
    let mut plain = Fx::new();
    plain.host_network();
    assert_eq!(mount_at(&plain.ok(), "/sys").unwrap().1, "sysfs");
    fx.pod_ns().network = NamespaceMode::Pod as i32;
    fx.ctr_ns().network = NamespaceMode::Pod as i32;
    fx.pod.net_ns = Some("/run/crust/pods/sb1/ns/net".into());
    fx.pod.uts_ns = Some("/run/crust/pods/sb1/ns/uts".into());
    assert_eq!(mount_at(&fx.ok(), "/sys").unwrap().1, "sysfs");
}

#[test]
fn unknown_namespace_modes_rejected() {
    let mut fx = Fx::new();
    fx.ctr_ns().pid = 17;
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.namespace_options.pid"
    );
    let mut fx = Fx::new();
    fx.pod_ns().network = -1;
    assert_eq!(
        fx.err().field(),
        "sandbox_config.linux.security_context.namespace_options.network"
    );
    let mut fx = Fx::new();
    fx.pod_ns().network = NamespaceMode::Container as i32;
    assert_eq!(
        fx.err().field(),
        "sandbox_config.linux.security_context.namespace_options.network"
    );
}

// ---------------------------------------------------------------- mounts

#[test]
fn default_and_pod_mounts() {
    let spec = Fx::new().ok();
    let m = mounts(&spec);
    let dests: Vec<&str> = m.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(
        dests,
        vec![
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup",
            "/etc/hostname",
            "/etc/hosts",
            "/etc/resolv.conf",
            "/dev/shm",
        ]
    );
    assert_eq!(
        mount_at(&spec, "/proc").unwrap(),
        (
            "/proc".into(),
            "proc".into(),
            "proc".into(),
            s(&["nosuid", "noexec", "nodev"])
        )
    );
    assert_eq!(
        mount_at(&spec, "/sys").unwrap().3,
        s(&["nosuid", "noexec", "nodev", "ro"])
    );
    assert_eq!(
        mount_at(&spec, "/sys/fs/cgroup").unwrap().3,
        s(&["nosuid", "noexec", "nodev", "relatime", "ro"])
    );
    assert_eq!(mount_at(&spec, "/dev").unwrap().1, "tmpfs");
    assert_eq!(mount_at(&spec, "/dev/pts").unwrap().1, "devpts");
    assert_eq!(mount_at(&spec, "/dev/mqueue").unwrap().1, "mqueue");
    assert_eq!(
        mount_at(&spec, "/etc/hosts").unwrap(),
        (
            "/etc/hosts".into(),
            "bind".into(),
            "/run/crust/pods/sb1/hosts".into(),
            s(&["rbind", "rprivate", "rw"])
        )
    );
    assert_eq!(
        mount_at(&spec, "/etc/resolv.conf").unwrap().2,
        "/run/crust/pods/sb1/resolv.conf"
    );
    assert_eq!(
        mount_at(&spec, "/etc/hostname").unwrap().2,
        "/run/crust/pods/sb1/hostname"
    );
    assert_eq!(
        mount_at(&spec, "/dev/shm").unwrap(),
        (
            "/dev/shm".into(),
            "bind".into(),
            "/run/crust/pods/sb1/shm".into(),
            s(&["rbind", "rprivate", "rw"])
        )
    );
}

#[test]
fn private_shm_without_pod_shm() {
    let mut fx = Fx::new();
    fx.pod.shm = None;
    fx.pod.hostname_file = None;
    let spec = fx.ok();
    let shm = mount_at(&spec, "/dev/shm").unwrap();
    assert_eq!(
        (shm.1.as_str(), shm.2.as_str(), shm.3.clone()),
        (
            "tmpfs",
            "shm",
            s(&["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"])
        )
    );
    assert!(mount_at(&spec, "/etc/hostname").is_none());
}

#[test]
fn readonly_rootfs_makes_pod_files_readonly() {
    let mut fx = Fx::new();
    fx.sc().readonly_rootfs = true;
    let spec = fx.ok();
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    for f in ["/etc/hosts", "/etc/resolv.conf", "/etc/hostname"] {
        assert_eq!(
            mount_at(&spec, f).unwrap().3,
            s(&["rbind", "rprivate", "ro"]),
            "{f}"
        );
    }
    // /dev/shm stays writable.
    assert_eq!(
        mount_at(&spec, "/dev/shm").unwrap().3,
        s(&["rbind", "rprivate", "rw"])
    );
}

#[test]
fn request_mount_replaces_pod_file() {
    let mut fx = Fx::new();
    fx.mount("/etc/hosts", "/data");
    let spec = fx.ok();
    let all: Vec<_> = mounts(&spec)
        .into_iter()
        .filter(|m| m.0 == "/etc/hosts")
        .collect();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].2, "/data");
}

#[test]
fn request_dev_mount_drops_default_dev_mounts() {
    let mut fx = Fx::new();
    fx.mount("/dev", "/data");
    let spec = fx.ok();
    let dests: Vec<String> = mounts(&spec).into_iter().map(|m| m.0).collect();
    assert!(!dests.contains(&"/dev/pts".to_string()));
    assert!(!dests.contains(&"/dev/mqueue".to_string()));
    assert_eq!(dests.iter().filter(|d| *d == "/dev").count(), 1);
    // The pod's /dev/shm is a supplied mount and stays, after /dev.
    let dev = dests.iter().position(|d| d == "/dev").unwrap();
    let shm = dests.iter().position(|d| d == "/dev/shm").unwrap();
    assert!(dev < shm);
}

#[test]
fn bind_mount_options() {
    let mut fx = Fx::new();
    fx.mount("/data", "/link-to-data").readonly = true;
    let m = fx.mount("/logs", "/var/log");
    m.propagation = MountPropagation::PropagationPrivate as i32;
    m.selinux_relabel = true;
    let spec = fx.ok();
    assert_eq!(
        mount_at(&spec, "/data").unwrap(),
        (
            "/data".into(),
            "bind".into(),
            "/data".into(),
            s(&["rbind", "rprivate", "ro"])
        )
    );
    assert_eq!(
        mount_at(&spec, "/logs").unwrap().3,
        s(&["rbind", "rprivate", "rw"])
    );
    assert!(linux(&spec).rootfs_propagation().is_none());
}

#[test]
fn host_to_container_propagation() {
    let mut fx = Fx::new();
    fx.mount("/mnt", "/srv/slave").propagation =
        MountPropagation::PropagationHostToContainer as i32;
    let spec = fx.ok();
    assert_eq!(
        mount_at(&spec, "/mnt").unwrap().3,
        s(&["rbind", "rslave", "rw"])
    );
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("rslave"));
    // On a private host mount it cannot work.
    let mut fx = Fx::new();
    fx.mount("/mnt", "/data").propagation = MountPropagation::PropagationHostToContainer as i32;
    let e = fx.err();
    assert_eq!(e.field(), "config.mounts[0].propagation");
    assert_eq!(e.class(), ErrorClass::FailedPrecondition);
}

#[test]
fn bidirectional_propagation() {
    // Only for privileged containers: a mount made inside shows on the host.
    let mut fx = Fx::new();
    fx.mount("/a", "/srv/slave").propagation = MountPropagation::PropagationHostToContainer as i32;
    fx.mount("/b", "/srv/shared").propagation = MountPropagation::PropagationBidirectional as i32;
    let e = fx.err();
    assert_eq!(
        (e.class(), e.field()),
        (ErrorClass::InvalidArgument, "config.mounts[1].propagation")
    );
    fx.privileged();
    let spec = fx.ok();
    assert_eq!(
        mount_at(&spec, "/b").unwrap().3,
        s(&["rbind", "rshared", "rw"])
    );
    assert_eq!(
        linux(&spec).rootfs_propagation().as_deref(),
        Some("rshared")
    );
    // Order does not matter: rshared wins over rslave.
    let mut fx = Fx::new();
    fx.privileged();
    fx.mount("/b", "/srv/shared").propagation = MountPropagation::PropagationBidirectional as i32;
    fx.mount("/a", "/srv/slave").propagation = MountPropagation::PropagationHostToContainer as i32;
    assert_eq!(
        linux(&fx.ok()).rootfs_propagation().as_deref(),
        Some("rshared")
    );
    // A slave host mount is not enough.
    let mut fx = Fx::new();
    fx.privileged();
    fx.mount("/b", "/srv/slave").propagation = MountPropagation::PropagationBidirectional as i32;
    assert_eq!(fx.err().class(), ErrorClass::FailedPrecondition);
}

#[test]
fn unknown_propagation_rejected() {
    let mut fx = Fx::new();
    fx.mount("/b", "/data").propagation = 9;
    assert_eq!(fx.err().field(), "config.mounts[0].propagation");
}

#[test]
fn recursive_read_only() {
    let mut fx = Fx::new();
    let m = fx.mount("/ro", "/data");
    m.readonly = true;
    m.recursive_read_only = true;
    assert_eq!(
        mount_at(&fx.ok(), "/ro").unwrap().3,
        s(&["rbind", "rprivate", "ro", "rro"])
    );
    fx.runtime.rro_supported = false;
    assert!(matches!(fx.err(), SpecError::Unsupported { .. }));
    fx.runtime.rro_supported = true;
    fx.config.mounts[0].readonly = false;
    assert_eq!(fx.err().field(), "config.mounts[0].recursive_read_only");
    fx.config.mounts[0].readonly = true;
    fx.config.mounts[0].host_path = "/srv/slave".into();
    fx.config.mounts[0].propagation = MountPropagation::PropagationHostToContainer as i32;
    assert_eq!(fx.err().field(), "config.mounts[0].recursive_read_only");
}

/// KEP-5855: nosuid, nodev and noexec go onto the bind as asked (once
/// each); anything else is refused naming the option's index.
#[test]
fn kep_5855_mount_options() {
    let mut fx = Fx::new();
    fx.mount("/hard", "/data").mount_options = s(&["noexec", "nosuid", "nodev", "noexec"]);
    fx.mount("/plain", "/data");
    let spec = fx.ok();
    assert_eq!(
        mount_at(&spec, "/hard").unwrap().3,
        s(&["rbind", "rprivate", "rw", "noexec", "nosuid", "nodev"])
    );
    assert_eq!(
        mount_at(&spec, "/plain").unwrap().3,
        s(&["rbind", "rprivate", "rw"])
    );
    for bad in [
        "exec", "suid", "NOEXEC", "ro", "", " noexec", "size=1m", "noexec\0",
    ] {
        fx.config.mounts[1].mount_options = s(&["nodev", bad]);
        let e = fx.err();
        assert_eq!(e.class(), ErrorClass::InvalidArgument, "{bad:?}");
        assert_eq!(e.field(), "config.mounts[1].mount_options[1]", "{bad:?}");
        assert!(e.to_string().contains("noexec"), "{e}");
    }
    // A long option is quoted only in part.
    fx.config.mounts[1].mount_options = vec!["x".repeat(100_000)];
    assert!(fx.err().to_string().len() < 1024);
}

#[test]
fn mounts_sorted_parents_first() {
    let mut fx = Fx::new();
    fx.mount("/a/b/c", "/data");
    fx.mount("/a", "/var/log");
    fx.mount("/z/y", "/data");
    let dests: Vec<String> = mounts(&fx.ok()).into_iter().map(|m| m.0).collect();
    let pos = |d: &str| dests.iter().position(|x| x == d).unwrap();
    assert!(pos("/a") < pos("/z/y") && pos("/z/y") < pos("/a/b/c"));
}

#[test]
fn mount_container_path_validation() {
    for (path, why) in [
        ("relative", "must be absolute"),
        ("/a/../etc", "'..'"),
        ("/", "must not be /"),
        ("/proc", "/proc"),
        ("/proc/sys/kernel", "/proc"),
        ("", "must not be empty"),
        ("/a\0b", "NUL"),
    ] {
        let mut fx = Fx::new();
        fx.mount(path, "/data");
        let e = fx.err();
        assert_eq!(e.field(), "config.mounts[0].container_path", "{path:?}");
        assert!(e.to_string().contains(why), "{path:?}: {e}");
    }
    // Clean form is used.
    let mut fx = Fx::new();
    fx.mount("/data//x/./", "/data");
    assert!(mount_at(&fx.ok(), "/data/x").is_some());
}

#[test]
fn duplicate_mount_paths_rejected() {
    let mut fx = Fx::new();
    fx.mount("/data", "/data");
    fx.mount("/data/", "/var/log");
    let e = fx.err();
    assert_eq!(e.field(), "config.mounts[1].container_path");
    assert!(e.to_string().contains("more than once"));
}

#[test]
fn mount_host_path_validation() {
    for (path, field_err) in [("relative", true), ("/a/../b", true), ("", true)] {
        let mut fx = Fx::new();
        fx.mount("/x", path);
        let e = fx.err();
        assert_eq!(e.field(), "config.mounts[0].host_path", "{path:?}");
        assert_eq!(matches!(e, SpecError::Invalid { .. }), field_err);
    }
}

#[test]
fn missing_host_path_is_error() {
    let mut fx = Fx::new();
    fx.mount("/x", "/does/not/exist");
    let e = fx.err();
    assert_eq!(
        e,
        SpecError::HostPathNotFound {
            field: "config.mounts[0].host_path".into(),
            path: "/does/not/exist".into()
        }
    );
    assert_eq!(e.class(), ErrorClass::InvalidArgument);
}

#[test]
fn host_lookup_failure_is_internal() {
    let mut fx = Fx::new();
    fx.mount("/x", "/data");
    fx.host.fail = Some(io::ErrorKind::PermissionDenied);
    let e = fx.err();
    assert!(matches!(e, SpecError::Host { .. }));
    assert_eq!(e.class(), ErrorClass::Internal);
}

#[test]
fn unsupported_mount_kinds() {
    let mut fx = Fx::new();
    fx.mount("/img", "").image = Some(ImageSpec {
        image: "busybox".into(),
        ..Default::default()
    });
    assert_eq!(fx.err().field(), "config.mounts[0].image");
    let mut fx = Fx::new();
    fx.mount("/x", "/data").uid_mappings = vec![Default::default()];
    assert!(matches!(fx.err(), SpecError::Unsupported { .. }));
}

#[test]
fn image_volumes_are_read_only_nosuid_nodev() {
    // As the daemon passes a mounted image volume: `image` set, host_path
    // its mount; read-only whatever the request says.
    let mut fx = Fx::new();
    let m = fx.mount("/img", "/data");
    m.image = Some(ImageSpec {
        image: "busybox".into(),
        ..Default::default()
    });
    m.readonly = false;
    let spec = fx.ok();
    assert_eq!(
        mount_at(&spec, "/img").unwrap().3,
        s(&["rbind", "rprivate", "ro", "nosuid", "nodev"])
    );
    // Other bind mounts keep what they ask for.
    let mut fx = Fx::new();
    fx.mount("/x", "/data");
    assert_eq!(
        mount_at(&fx.ok(), "/x").unwrap().3,
        s(&["rbind", "rprivate", "rw"])
    );
}

#[test]
fn privileged_sysfs_and_cgroup_rw() {
    let mut fx = Fx::new();
    fx.privileged();
    let spec = fx.ok();
    assert_eq!(
        mount_at(&spec, "/sys").unwrap().3,
        s(&["nosuid", "noexec", "nodev", "rw"])
    );
    assert_eq!(
        mount_at(&spec, "/sys/fs/cgroup").unwrap().3,
        s(&["nosuid", "noexec", "nodev", "relatime", "rw"])
    );
}

// ---------------------------------------------------------------- devices

fn devices(spec: &Spec) -> Vec<(String, LinuxDeviceType, i64, i64)> {
    linux(spec)
        .devices()
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d.path().to_string_lossy().into_owned(),
                d.typ(),
                d.major(),
                d.minor(),
            )
        })
        .collect()
}

fn device_rules(spec: &Spec) -> Vec<String> {
    linux(spec)
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", if r.allow() { "allow" } else { "deny" }, r))
        .collect()
}

#[test]
fn no_devices_by_default_deny_all() {
    let spec = Fx::new().ok();
    assert!(devices(&spec).is_empty());
    assert_eq!(device_rules(&spec), vec!["deny a *:* rwm"]);
}

#[test]
fn single_device() {
    let mut fx = Fx::new();
    fx.config.devices = vec![Device {
        container_path: "/dev/fuse".into(),
        host_path: "/dev/fuse".into(),
        permissions: "rw".into(),
    }];
    let spec = fx.ok();
    assert_eq!(
        devices(&spec),
        vec![("/dev/fuse".into(), LinuxDeviceType::C, 10, 229)]
    );
    let d = &linux(&spec).devices().as_ref().unwrap()[0];
    assert_eq!(
        (d.file_mode(), d.uid(), d.gid()),
        (Some(0o660), Some(0), Some(44))
    );
    assert_eq!(
        device_rules(&spec),
        vec!["deny a *:* rwm", "allow c 10:229 rw"]
    );
}

#[test]
fn device_directory_expands() {
    let mut fx = Fx::new();
    fx.config.devices = vec![Device {
        container_path: "/dev/sound".into(),
        host_path: "/dev/snd".into(),
        permissions: "rwm".into(),
    }];
    let spec = fx.ok();
    assert_eq!(
        devices(&spec),
        vec![
            ("/dev/sound/controlC0".into(), LinuxDeviceType::C, 116, 0),
            ("/dev/sound/pcmC0D0p".into(), LinuxDeviceType::C, 116, 16),
        ]
    );
    assert_eq!(
        device_rules(&spec),
        vec!["deny a *:* rwm", "allow c 116:0 rwm", "allow c 116:16 rwm"]
    );
}

#[test]
fn device_errors() {
    for (d, field) in [
        (
            ("/dev/x", "/dev/fuse", "rwx"),
            "config.devices[0].permissions",
        ),
        (("/dev/x", "/dev/fuse", ""), "config.devices[0].permissions"),
        (
            ("dev/x", "/dev/fuse", "rw"),
            "config.devices[0].container_path",
        ),
        (("/", "/dev/fuse", "rw"), "config.devices[0].container_path"),
        (
            ("/dev/x", "/dev/../etc/shadow", "rw"),
            "config.devices[0].host_path",
        ),
        (("/dev/x", "/dev/nope", "rw"), "config.devices[0].host_path"),
        (("/dev/x", "/data", "rw"), "config.devices[0].host_path"),
    ] {
        let mut fx = Fx::new();
        fx.config.devices = vec![Device {
            container_path: d.0.into(),
            host_path: d.1.into(),
            permissions: d.2.into(),
        }];
        assert_eq!(fx.err().field(), field, "{d:?}");
    }
    let mut fx = Fx::new();
    fx.config.devices = vec![Device {
        container_path: "/dev/x".into(),
        host_path: "/dev/nope".into(),
        permissions: "rw".into(),
    }];
    assert!(matches!(fx.err(), SpecError::HostPathNotFound { .. }));
}

#[test]
fn privileged_gets_all_host_devices() {
    let mut fx = Fx::new();
    fx.privileged();
    fx.config.devices = vec![Device {
        container_path: "/dev/fuse".into(),
        host_path: "/dev/fuse".into(),
        permissions: "r".into(),
    }];
    let spec = fx.ok();
    assert_eq!(
        devices(&spec),
        vec![
            ("/dev/null".into(), LinuxDeviceType::C, 1, 3),
            ("/dev/sda".into(), LinuxDeviceType::B, 8, 0),
            ("/dev/fuse".into(), LinuxDeviceType::C, 10, 229),
        ]
    );
    assert_eq!(device_rules(&spec), vec!["allow a *:* rwm"]);
}

const CDI_JSON: &str = r#"{
  "cdiVersion": "0.6.0",
  "kind": "example.com/dev",
  "containerEdits": {"env": ["SPEC_WIDE=1"]},
  "devices": [
    {"name": "a", "containerEdits": {
      "env": ["DEV=a", "PATH=/cdi"],
      "deviceNodes": [{"path": "/dev/cdi-null", "hostPath": "/dev/null", "permissions": "rw"}],
      "mounts": [{"hostPath": "/opt/lib", "containerPath": "/usr/lib/vendor", "options": ["ro", "bind"]}],
      "hooks": [{"hookName": "createContainer", "path": "/usr/bin/hook", "args": ["hook", "x"]}],
      "additionalGIDs": [44]
    }},
    {"name": "b", "containerEdits": {"deviceNodes": [{"path": "/dev/b", "type": "b", "major": 8, "minor": 1}]}}
  ]
}"#;

const CDI_YAML: &str = "cdiVersion: 0.6.0\nkind: example.com/dev\ndevices:\n- name: a\n  containerEdits:\n    env: [DEV=override]\n- name: y\n  containerEdits:\n    env: [Y=1]\n";

fn cdi_registry() -> crate::cdi::CdiRegistry {
    crate::cdi::CdiRegistry::from_files(vec![
        ("/etc/cdi/a.json".into(), CDI_JSON.into()),
        ("/etc/cdi/broken.yaml".into(), "kind: [".into()),
    ])
}

#[test]
fn cdi_edits_apply_to_the_spec() {
    let mut fx = Fx::new();
    fx.host.devices.insert(
        PathBuf::from("/dev/null"),
        vec![dev("", LinuxDeviceType::C, 1, 3)],
    );
    fx.config.cdi_devices = vec![CdiDevice {
        name: "example.com/dev=a".into(),
    }];
    fx.config.annotations.insert(
        "cdi.k8s.io/plugin".into(),
        "example.com/dev=b, example.com/dev=a".into(),
    );
    let names = crate::cdi::requested_devices(&fx.config);
    assert_eq!(
        names,
        vec![
            (
                "config.CDI_devices[0].name".to_string(),
                "example.com/dev=a".to_string()
            ),
            (
                "config.annotations[\"cdi.k8s.io/plugin\"]".to_string(),
                "example.com/dev=b".to_string()
            ),
        ]
    );
    let reg = cdi_registry();
    assert_eq!(reg.errors.len(), 1, "{:?}", reg.errors);
    let edits = reg.resolve(&names).unwrap();
    // The spec-wide edits once, then each device's.
    assert_eq!(edits.len(), 3);
    let mut spec = fx.spec().unwrap();
    crate::cdi::apply(&mut spec, &edits, "config.CDI_devices", &fx.host).unwrap();
    let env = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env.contains(&"SPEC_WIDE=1".to_string()), "{env:?}");
    assert!(env.contains(&"DEV=a".to_string()), "{env:?}");
    assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
    assert!(env.contains(&"PATH=/cdi".to_string()));
    let devs = devices(&spec);
    assert!(
        devs.contains(&("/dev/cdi-null".into(), LinuxDeviceType::C, 1, 3)),
        "{devs:?}"
    );
    assert!(
        devs.contains(&("/dev/b".into(), LinuxDeviceType::B, 8, 1)),
        "{devs:?}"
    );
    let rules = device_rules(&spec);
    assert!(rules.contains(&"allow c 1:3 rw".to_string()), "{rules:?}");
    assert!(rules.contains(&"allow b 8:1 rwm".to_string()), "{rules:?}");
    let m = mount_at(&spec, "/usr/lib/vendor").unwrap();
    assert_eq!((m.1.as_str(), m.2.as_str()), ("bind", "/opt/lib"));
    let hooks = spec
        .hooks()
        .as_ref()
        .unwrap()
        .create_container()
        .clone()
        .unwrap();
    assert_eq!(hooks[0].path(), Path::new("/usr/bin/hook"));
    let gids = spec
        .process()
        .as_ref()
        .unwrap()
        .user()
        .additional_gids()
        .clone()
        .unwrap();
    assert!(gids.contains(&44));
}

#[test]
fn cdi_later_files_win_and_unknown_devices_are_named() {
    let reg = crate::cdi::CdiRegistry::from_files(vec![
        ("/etc/cdi/a.json".into(), CDI_JSON.into()),
        ("/var/run/cdi/a.yaml".into(), CDI_YAML.into()),
    ]);
    assert!(reg.errors.is_empty(), "{:?}", reg.errors);
    let e = reg
        .resolve(&[("f".into(), "example.com/dev=a".into())])
        .unwrap();
    assert_eq!(e.last().unwrap().env, vec!["DEV=override".to_string()]);
    let err = cdi_registry()
        .resolve(&[(
            "config.CDI_devices[3].name".into(),
            "example.com/dev=zz".into(),
        )])
        .unwrap_err();
    assert_eq!(err.field(), "config.CDI_devices[3].name");
    let msg = err.to_string();
    assert!(
        msg.contains("example.com/dev=zz") && msg.contains("broken.yaml"),
        "{msg}"
    );
    assert_eq!(err.class(), crate::ErrorClass::InvalidArgument);
}

#[test]
fn cdi_bad_edits_are_refused() {
    let fx = Fx::new();
    let mut spec = fx.spec().unwrap();
    for edits in [
        crate::cdi::ContainerEdits {
            env: vec!["NOEQUALS".into()],
            ..Default::default()
        },
        crate::cdi::ContainerEdits {
            device_nodes: vec![crate::cdi::DeviceNode {
                path: "relative".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
        crate::cdi::ContainerEdits {
            hooks: vec![crate::cdi::CdiHook {
                hook_name: "sometime".into(),
                path: "/bin/true".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
        crate::cdi::ContainerEdits {
            net_devices: vec![serde_json::json!({})],
            ..Default::default()
        },
    ] {
        let e = crate::cdi::apply(&mut spec, &[edits], "config.CDI_devices[0].name", &fx.host)
            .unwrap_err();
        assert_eq!(e.field(), "config.CDI_devices[0].name");
        assert_eq!(e.class(), crate::ErrorClass::InvalidArgument, "{e}");
    }
}

// ---------------------------------------------------------------- resources

#[test]
fn resources_in_spec() {
    let mut fx = Fx::new();
    *fx.res() = LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 20_000,
        cpu_shares: 256,
        memory_limit_in_bytes: 128 << 20,
        oom_score_adj: 500,
        cpuset_cpus: "0".into(),
        unified: [("memory.oom.group".to_string(), "1".to_string())].into(),
        ..Default::default()
    };
    let spec = fx.ok();
    let r = linux(&spec).resources().as_ref().unwrap();
    let cpu = r.cpu().clone().unwrap();
    assert_eq!(
        (cpu.period(), cpu.quota(), cpu.shares()),
        (Some(100_000), Some(20_000), Some(256))
    );
    assert_eq!(cpu.cpus().as_deref(), Some("0"));
    assert_eq!(r.memory().unwrap().limit(), Some(128 << 20));
    assert_eq!(r.memory().unwrap().swap(), Some(128 << 20));
    assert_eq!(r.unified().clone().unwrap()["memory.oom.group"], "1");
    assert_eq!(process(&spec).oom_score_adj(), Some(500));
    assert_eq!(device_rules(&spec), vec!["deny a *:* rwm"]);
}

#[test]
fn oom_score_adj_clamped_in_spec() {
    let mut fx = Fx::new();
    fx.res().oom_score_adj = -999;
    fx.runtime.min_oom_score_adj = -500;
    assert_eq!(process(&fx.ok()).oom_score_adj(), Some(-500));
}

#[test]
fn bad_resources_rejected_in_spec() {
    let mut fx = Fx::new();
    fx.res().cpuset_cpus = "0-3\n".into();
    assert_eq!(fx.err().field(), "config.linux.resources.cpuset_cpus");
}

// ---------------------------------------------------------------- security

#[test]
fn capabilities_in_spec() {
    let mut fx = Fx::new();
    fx.sc().capabilities = Some(CriCaps {
        add_capabilities: s(&["NET_ADMIN"]),
        drop_capabilities: s(&["CAP_NET_RAW"]),
        add_ambient_capabilities: vec![],
    });
    let b = bounding(&fx.ok());
    assert!(b.contains(&Capability::NetAdmin));
    assert!(!b.contains(&Capability::NetRaw));
}

#[test]
fn privileged_container() {
    let mut fx = Fx::new();
    fx.privileged();
    fx.sc().seccomp = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    fx.sc().masked_paths = s(&["/proc/kcore"]);
    let spec = fx.ok();
    assert_eq!(bounding(&spec), ALL_CAPABILITIES.into_iter().collect());
    assert!(linux(&spec).seccomp().is_none());
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        Vec::<String>::new()
    );
    assert!(process(&spec).apparmor_profile().is_none());
}

#[test]
fn privileged_all_capabilities_come_from_runtime_facts() {
    let mut fx = Fx::new();
    fx.privileged();
    fx.runtime.all_capabilities = Some(vec![Capability::Chown, Capability::SysAdmin]);
    assert_eq!(
        bounding(&fx.ok()),
        [Capability::Chown, Capability::SysAdmin]
            .into_iter()
            .collect()
    );
}

#[test]
fn privileged_container_needs_privileged_pod() {
    let mut fx = Fx::new();
    fx.sc().privileged = true;
    assert_eq!(fx.err().field(), "config.linux.security_context.privileged");
}

#[test]
fn no_new_privs() {
    let mut fx = Fx::new();
    fx.sc().no_new_privs = true;
    assert_eq!(process(&fx.ok()).no_new_privileges(), Some(true));
}

#[test]
fn masked_and_readonly_paths() {
    let spec = Fx::new().ok();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        s(DEFAULT_MASKED_PATHS)
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        s(DEFAULT_READONLY_PATHS)
    );
    assert!(DEFAULT_MASKED_PATHS.contains(&"/proc/kcore"));
    assert!(DEFAULT_READONLY_PATHS.contains(&"/proc/sys"));
    let mut fx = Fx::new();
    fx.sc().masked_paths = s(&["/proc/x", "/sys//y/"]);
    fx.sc().readonly_paths = s(&["/proc/z"]);
    let spec = fx.ok();
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        s(&["/proc/x", "/sys/y"])
    );
    assert_eq!(
        linux(&spec).readonly_paths().clone().unwrap(),
        s(&["/proc/z"])
    );
    fx.sc().masked_paths = s(&["/ok", "proc/x"]);
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.masked_paths[1]"
    );
    fx.sc().masked_paths.clear();
    fx.sc().readonly_paths = s(&["/../x"]);
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.readonly_paths[0]"
    );
}

#[test]
fn seccomp_runtime_default_follows_capabilities() {
    let mut fx = Fx::new();
    fx.sc().seccomp = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let spec = fx.ok();
    let sec = linux(&spec).seccomp().clone().unwrap();
    assert_eq!(
        sec,
        default_seccomp_profile(&bounding(&spec), SeccompArch::X86_64)
    );
    let has = |name: &str, s: &oci_spec::runtime::LinuxSeccomp| {
        s.syscalls().as_ref().unwrap().iter().any(|r| {
            r.action() == LinuxSeccompAction::ScmpActAllow
                && r.args().is_none()
                && r.names().iter().any(|n| n == name)
        })
    };
    assert!(!has("mount", &sec));
    fx.sc().capabilities = Some(CriCaps {
        add_capabilities: s(&["SYS_ADMIN"]),
        ..Default::default()
    });
    let sec = linux(&fx.ok()).seccomp().clone().unwrap();
    assert!(has("mount", &sec));
}

#[test]
fn seccomp_unset_uses_runtime_choice() {
    let mut fx = Fx::new();
    assert!(linux(&fx.ok()).seccomp().is_none());
    fx.runtime.unset_seccomp = UnsetSeccomp::RuntimeDefault;
    assert!(linux(&fx.ok()).seccomp().is_some());
}

#[test]
fn seccomp_localhost() {
    let mut fx = Fx::new();
    fx.host.profiles.insert(
        "/var/lib/kubelet/seccomp/block.json".into(),
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}"#.into(),
    );
    fx.sc().seccomp = Some(SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: "/var/lib/kubelet/seccomp/block.json".into(),
    });
    let sec = linux(&fx.ok()).seccomp().clone().unwrap();
    assert_eq!(sec.default_action(), LinuxSeccompAction::ScmpActAllow);
    // Missing file.
    fx.sc().seccomp.as_mut().unwrap().localhost_ref = "/var/lib/kubelet/seccomp/none.json".into();
    let e = fx.err();
    assert!(matches!(e, SpecError::HostPathNotFound { .. }));
    assert_eq!(
        e.field(),
        "config.linux.security_context.seccomp.localhost_ref"
    );
    // Invalid file.
    fx.host.profiles.insert("/bad.json".into(), "{nope".into());
    fx.sc().seccomp.as_mut().unwrap().localhost_ref = "/bad.json".into();
    let e = fx.err();
    assert!(e.to_string().contains("not valid JSON"), "{e}");
}

#[test]
#[allow(deprecated)]
fn seccomp_deprecated_path_in_spec() {
    let mut fx = Fx::new();
    fx.sc().seccomp_profile_path = "runtime/default".into();
    assert!(linux(&fx.ok()).seccomp().is_some());
    fx.sc().seccomp_profile_path = "unconfined".into();
    assert!(linux(&fx.ok()).seccomp().is_none());
    fx.host.profiles.insert(
        "/p.json".into(),
        r#"{"defaultAction":"SCMP_ACT_LOG"}"#.into(),
    );
    fx.sc().seccomp_profile_path = "localhost//p.json".into();
    assert_eq!(
        linux(&fx.ok()).seccomp().clone().unwrap().default_action(),
        LinuxSeccompAction::ScmpActLog
    );
    fx.sc().seccomp_profile_path = "whatever".into();
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.seccomp_profile_path"
    );
}

#[test]
#[allow(deprecated)]
fn apparmor_without_apparmor_on_the_node() {
    let mut fx = Fx::new();
    assert!(process(&fx.ok()).apparmor_profile().is_none());
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    assert!(process(&fx.ok()).apparmor_profile().is_none());
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: "my-profile".into(),
    });
    assert!(matches!(fx.err(), SpecError::Unsupported { .. }));
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.apparmor.localhost_ref"
    );
    fx.sc().apparmor = None;
    fx.sc().apparmor_profile = "localhost/my-profile".into();
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.apparmor_profile"
    );
    assert!(fx.err().to_string().contains("no AppArmor"), "{}", fx.err());
    fx.sc().apparmor_profile = "runtime/default".into();
    assert!(process(&fx.ok()).apparmor_profile().is_none());
    fx.sc().apparmor_profile = "unconfined".into();
    assert!(fx.spec().is_ok());
    // Malformed requests are malformed on any node.
    fx.sc().apparmor_profile = "docker-default".into();
    assert_eq!(
        fx.err().class(),
        ErrorClass::InvalidArgument,
        "{}",
        fx.err()
    );
}

/// A node with AppArmor whose default profile is `crust-default` and where
/// `deny-write` is loaded.
fn apparmor_fx() -> Fx {
    let mut fx = Fx::new();
    fx.runtime.apparmor_default_profile = Some("crust-default".into());
    fx.host.apparmor = ["crust-default", "deny-write"]
        .into_iter()
        .map(String::from)
        .collect();
    fx
}

fn aa(fx: &Fx) -> Option<String> {
    process(&fx.ok()).apparmor_profile().clone()
}

fn localhost(name: &str) -> Option<SecurityProfile> {
    Some(SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: name.into(),
    })
}

#[test]
#[allow(deprecated)]
fn apparmor_default_unset_and_unconfined() {
    let mut fx = apparmor_fx();
    // Unset means the default (kubernetes#51746), like RuntimeDefault.
    assert_eq!(aa(&fx).as_deref(), Some("crust-default"));
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    assert_eq!(aa(&fx).as_deref(), Some("crust-default"));
    fx.sc().apparmor = None;
    fx.sc().apparmor_profile = "runtime/default".into();
    assert_eq!(aa(&fx).as_deref(), Some("crust-default"));
    fx.sc().apparmor_profile = "unconfined".into();
    assert_eq!(aa(&fx), None);
    fx.sc().apparmor_profile = String::new();
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert_eq!(aa(&fx), None);
}

#[test]
fn apparmor_privileged_is_unconfined_unless_a_profile_is_named() {
    let mut fx = apparmor_fx();
    fx.sandbox
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .get_or_insert_default()
        .privileged = true;
    fx.sc().privileged = true;
    assert_eq!(aa(&fx), None);
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    assert_eq!(aa(&fx), None);
    fx.sc().apparmor = localhost("deny-write");
    assert_eq!(aa(&fx).as_deref(), Some("deny-write"));
}

#[test]
#[allow(deprecated)]
fn apparmor_localhost_must_be_loaded() {
    let mut fx = apparmor_fx();
    fx.sc().apparmor = localhost("deny-write");
    assert_eq!(aa(&fx).as_deref(), Some("deny-write"));
    // The annotation's form, as containerd accepts it.
    fx.sc().apparmor = localhost("localhost/deny-write");
    assert_eq!(aa(&fx).as_deref(), Some("deny-write"));
    fx.sc().apparmor = localhost("non-existent-profile");
    let err = fx.err();
    assert_eq!(err.class(), ErrorClass::FailedPrecondition, "{err}");
    assert_eq!(
        err.field(),
        "config.linux.security_context.apparmor.localhost_ref"
    );
    assert!(
        err.to_string()
            .contains("AppArmor profile \"non-existent-profile\" is not loaded"),
        "{err}"
    );
    // The deprecated string, and the structured field winning over it.
    fx.sc().apparmor = None;
    fx.sc().apparmor_profile = "localhost/deny-write".into();
    assert_eq!(aa(&fx).as_deref(), Some("deny-write"));
    fx.sc().apparmor_profile = "localhost/non-existent-profile".into();
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.apparmor_profile"
    );
    fx.sc().apparmor = localhost("deny-write");
    assert_eq!(aa(&fx).as_deref(), Some("deny-write"));
}

#[test]
#[allow(deprecated)]
fn apparmor_bad_names_and_types() {
    let mut fx = apparmor_fx();
    for (name, why) in [
        ("", "empty"),
        ("localhost/", "empty"),
        ("a\nb (enforce)", "control characters"),
        ("x\0", "control characters"),
    ] {
        fx.sc().apparmor = localhost(name);
        let err = fx.err();
        assert_eq!(err.class(), ErrorClass::InvalidArgument, "{err}");
        assert!(err.to_string().contains(why), "{name:?}: {err}");
    }
    fx.sc().apparmor = localhost(&"p".repeat(5000));
    let err = fx.err().to_string();
    assert!(err.contains("longer than"), "{err}");
    assert!(err.len() < 400, "{err}");
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: 7,
        localhost_ref: String::new(),
    });
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.apparmor.profile_type"
    );
    fx.sc().apparmor = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: "deny-write".into(),
    });
    assert_eq!(
        fx.err().field(),
        "config.linux.security_context.apparmor.localhost_ref"
    );
    fx.sc().apparmor = None;
    fx.sc().apparmor_profile = "x".repeat(10_000);
    let err = fx.err().to_string();
    assert!(err.contains("unknown AppArmor profile"), "{err}");
    assert!(err.len() < 600, "{err}");
}

#[test]
fn apparmor_default_that_cannot_be_loaded_is_a_precondition() {
    let mut fx = apparmor_fx();
    fx.host.apparmor.clear();
    let err = fx.err();
    assert_eq!(err.class(), ErrorClass::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("crust-default"), "{err}");
    fx.host.fail = Some(io::ErrorKind::PermissionDenied);
    let err = fx.err();
    assert!(err.to_string().contains("loading it failed"), "{err}");
}

// ---------------------------------------------------------------- pod-level

#[test]
fn sysctls_in_spec() {
    let mut fx = Fx::new();
    fx.sandbox.linux.as_mut().unwrap().sysctls = [
        (
            "net.ipv4.ip_unprivileged_port_start".to_string(),
            "0".to_string(),
        ),
        ("kernel.shm_rmid_forced".to_string(), "1".to_string()),
    ]
    .into();
    let spec = fx.ok();
    let sys = linux(&spec).sysctl().clone().unwrap();
    assert_eq!(sys.len(), 2);
    assert_eq!(sys["net.ipv4.ip_unprivileged_port_start"], "0");
    fx.sandbox
        .linux
        .as_mut()
        .unwrap()
        .sysctls
        .insert("kernel/../../x".into(), "1".into());
    assert!(
        fx.err()
            .field()
            .starts_with("sandbox_config.linux.sysctls[")
    );
}

#[test]
fn cgroup_paths() {
    let mut fx = Fx::new();
    fx.pod.cgroup_parent = String::new();
    assert_eq!(
        linux(&fx.ok()).cgroups_path().as_deref(),
        Some(Path::new("/crust/crust-c0ffee"))
    );
    fx.runtime.cgroup_driver = CgroupDriver::Systemd;
    fx.pod.cgroup_parent = "kubepods-besteffort-pod1.slice".into();
    assert_eq!(
        linux(&fx.ok()).cgroups_path().as_deref(),
        Some(Path::new("kubepods-besteffort-pod1.slice:crust:c0ffee"))
    );
    fx.pod.cgroup_parent = "/a/../b".into();
    assert_eq!(fx.err().field(), "sandbox_config.linux.cgroup_parent");
}

#[test]
fn annotations_in_spec() {
    let spec = Fx::new().ok();
    let a = spec.annotations().clone().unwrap();
    assert_eq!(a[annotations::CONTAINER_TYPE], "container");
    assert_eq!(a[annotations::SANDBOX_ID], "sb1");
    assert_eq!(a[annotations::SANDBOX_NAME], "web");
    assert_eq!(a[annotations::SANDBOX_NAMESPACE], "default");
    assert_eq!(a[annotations::SANDBOX_UID], "uid-1");
    assert_eq!(a[annotations::CONTAINER_NAME], "app");
    assert_eq!(a[annotations::IMAGE_NAME], "busybox:latest");
    assert_eq!(a.len(), 7);
}

#[test]
fn bad_ids_and_rootfs() {
    let mut fx = Fx::new();
    fx.id = "../evil".into();
    assert_eq!(fx.err().field(), "container_id");
    let fx = Fx::new();
    let e = container_spec(&SpecInput {
        container_id: &fx.id,
        config: &fx.config,
        sandbox_config: &fx.sandbox,
        image: &fx.image,
        image_name: "x",
        etc_passwd: None,
        etc_group: None,
        rootfs: Path::new("relative/rootfs"),
        pod: &fx.pod,
        runtime: &fx.runtime,
        host: &fx.host,
    })
    .unwrap_err();
    assert_eq!(e.field(), "rootfs");
}

#[test]
fn compat_on_a_full_spec() {
    // Bidirectional needs a privileged container, which has no seccomp.
    let mut fx = Fx::new();
    fx.privileged();
    fx.mount("/b", "/srv/shared").propagation = MountPropagation::PropagationBidirectional as i32;
    let mut spec = fx.ok();
    libcontainer_compat(&mut spec);
    assert_eq!(linux(&spec).rootfs_propagation().as_deref(), Some("shared"));
    let mut fx = Fx::new();
    fx.sc().seccomp = Some(SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let mut spec = fx.ok();
    libcontainer_compat(&mut spec);
    let sec = linux(&spec).seccomp().clone().unwrap();
    let clone = sec
        .syscalls()
        .as_ref()
        .unwrap()
        .iter()
        .find(|r| r.names() == &["clone".to_string()])
        .unwrap();
    let a = clone.args().as_ref().unwrap()[0];
    assert_eq!(
        (a.value(), a.value_two()),
        (0, Some(seccomp::CLONE_NAMESPACE_FLAGS))
    );
}

// ---------------------------------------------------------------- pause

fn pause_fx() -> Fx {
    let mut fx = Fx::new();
    fx.pod_ns().pid = NamespaceMode::Pod as i32;
    fx
}

fn pause(fx: &Fx) -> Result<Spec, SpecError> {
    pause_spec(&PauseInput {
        sandbox_config: &fx.sandbox,
        pod: &fx.pod,
        rootfs: Path::new("/var/lib/crust/pause/rootfs"),
        command: "/pause",
        runtime: &fx.runtime,
    })
}

#[test]
fn pause_spec_fields() {
    let fx = pause_fx();
    let spec = pause(&fx).unwrap();
    let root = spec.root().as_ref().unwrap();
    assert_eq!(root.path(), Path::new("/var/lib/crust/pause/rootfs"));
    assert_eq!(root.readonly(), Some(true));
    let p = process(&spec);
    assert_eq!(p.args().clone().unwrap(), s(&["/pause"]));
    assert_eq!(p.cwd(), Path::new("/"));
    assert_eq!((p.user().uid(), p.user().gid()), (PAUSE_UID, PAUSE_UID));
    assert_eq!(p.no_new_privileges(), Some(true));
    assert_eq!(p.terminal(), Some(false));
    assert_eq!(p.oom_score_adj(), Some(-998));
    assert!(p.rlimits().is_none());
    let caps = p.capabilities().as_ref().unwrap();
    for set in [
        caps.bounding(),
        caps.effective(),
        caps.permitted(),
        caps.inheritable(),
        caps.ambient(),
    ] {
        assert!(set.as_ref().unwrap().is_empty());
    }
    assert_eq!(
        namespaces(&spec),
        vec![
            (LinuxNamespaceType::Pid, None),
            (
                LinuxNamespaceType::Ipc,
                Some("/run/crust/ns/ipc/sb1".into())
            ),
            (
                LinuxNamespaceType::Uts,
                Some("/run/crust/ns/uts/sb1".into())
            ),
            (LinuxNamespaceType::Mount, None),
            (
                LinuxNamespaceType::Network,
                Some("/run/crust/ns/net/sb1".into())
            ),
            (LinuxNamespaceType::Cgroup, None),
        ]
    );
    assert_eq!(
        linux(&spec).cgroups_path().as_deref(),
        Some(Path::new("/kubepods/pod-uid-1/crust-sb1"))
    );
    let sec = linux(&spec).seccomp().clone().unwrap();
    assert_eq!(sec.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert_eq!(
        sec,
        default_seccomp_profile(&HashSet::new(), SeccompArch::X86_64)
    );
    let dests: Vec<String> = mounts(&spec).into_iter().map(|m| m.0).collect();
    assert_eq!(dests, s(&["/proc", "/dev", "/dev/pts"]));
    assert_eq!(device_rules(&spec), vec!["deny a *:* rwm"]);
    assert_eq!(
        linux(&spec).masked_paths().clone().unwrap(),
        s(DEFAULT_MASKED_PATHS)
    );
    assert_eq!(spec.hostname().as_deref(), Some("web-0"));
    let a = spec.annotations().clone().unwrap();
    assert_eq!(a[annotations::CONTAINER_TYPE], "sandbox");
    assert_eq!(a[annotations::SANDBOX_ID], "sb1");
    assert_eq!(a[annotations::SANDBOX_LOG_DIRECTORY], "/var/log/pods/x");
    assert_eq!(a[annotations::SANDBOX_NAMESPACE], "default");
    // Valid OCI JSON.
    let back: Spec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn pause_host_network() {
    let mut fx = pause_fx();
    fx.host_network();
    let spec = pause(&fx).unwrap();
    assert_eq!(ns_of(&spec, LinuxNamespaceType::Network), None);
    assert_eq!(ns_of(&spec, LinuxNamespaceType::Uts), None);
    assert!(spec.hostname().is_none());
}

#[test]
fn pause_oom_clamped() {
    let mut fx = pause_fx();
    fx.runtime.min_oom_score_adj = 0;
    assert_eq!(process(&pause(&fx).unwrap()).oom_score_adj(), Some(0));
}

#[test]
fn pause_errors() {
    // Only for pods sharing a PID namespace.
    let fx = Fx::new();
    assert_eq!(
        pause(&fx).unwrap_err().field(),
        "sandbox_config.linux.security_context.namespace_options.pid"
    );
    let mut fx = pause_fx();
    fx.pod.sandbox_id = "a/b".into();
    assert_eq!(pause(&fx).unwrap_err().field(), "sandbox_id");
    let mut fx = pause_fx();
    fx.pod.ipc_ns = None;
    assert_eq!(pause(&fx).unwrap_err().field(), "pod.ipc_ns");
    let mut fx = pause_fx();
    fx.sandbox.hostname = "no spaces allowed".into();
    assert_eq!(pause(&fx).unwrap_err().field(), "sandbox_config.hostname");
    let fx = pause_fx();
    let e = pause_spec(&PauseInput {
        sandbox_config: &fx.sandbox,
        pod: &fx.pod,
        rootfs: Path::new("/r"),
        command: "pause",
        runtime: &fx.runtime,
    })
    .unwrap_err();
    assert_eq!(e.field(), "pause command");
}

#[test]
fn pause_systemd_cgroup() {
    let mut fx = pause_fx();
    fx.runtime.cgroup_driver = CgroupDriver::Systemd;
    fx.pod.cgroup_parent = "kubepods-pod1.slice".into();
    assert_eq!(
        linux(&pause(&fx).unwrap()).cgroups_path().as_deref(),
        Some(Path::new("kubepods-pod1.slice:crust:sb1"))
    );
}
