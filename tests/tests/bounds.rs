//! Every size a client controls is bounded where the request enters: each
//! over-limit field of every RPC, sent to the real daemon, is refused with
//! InvalidArgument naming the field and the limit, in a short message
//! (at most a few hundred bytes of any input), and leaves nothing behind.

use std::collections::HashMap;

use crust_test_support::crust_api::v1;
use crust_test_support::tonic::transport::Channel;
use crust_test_support::tonic::{Code, Status};
use crust_test_support::{Daemon, host_network_pod, mounts_under};

type Rt = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type Img = v1::image_service_client::ImageServiceClient<Channel>;

/// The longest message a refusal may have: fixed text, the field's name
/// and a few quotes of at most 256 bytes each.
const MAX_MESSAGE: usize = 1024;

fn s(n: usize) -> String {
    "x".repeat(n)
}

fn many(n: usize, each: &str) -> Vec<String> {
    vec![each.to_string(); n]
}

fn pod_config() -> v1::PodSandboxConfig {
    host_network_pod("bounds", "crust-test")
}

fn linux(c: &mut v1::PodSandboxConfig) -> &mut v1::LinuxPodSandboxConfig {
    c.linux.get_or_insert_with(Default::default)
}

fn container_config() -> v1::ContainerConfig {
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        linux: Some(v1::LinuxContainerConfig {
            resources: Some(v1::LinuxContainerResources::default()),
            security_context: Some(v1::LinuxContainerSecurityContext::default()),
        }),
        ..Default::default()
    }
}

fn sc(c: &mut v1::ContainerConfig) -> &mut v1::LinuxContainerSecurityContext {
    c.linux.as_mut().unwrap().security_context.as_mut().unwrap()
}

fn res(c: &mut v1::ContainerConfig) -> &mut v1::LinuxContainerResources {
    c.linux.as_mut().unwrap().resources.as_mut().unwrap()
}

/// `n` entries of `size` bytes each in a map.
fn big_map(n: usize, size: usize) -> HashMap<String, String> {
    (0..n).map(|i| (format!("k{i}"), s(size))).collect()
}

/// Checks one refusal: the code, the field at the start of the message,
/// the limit in it, and its length.
fn check(what: &str, r: Result<(), Status>, field: &str, limit: usize) {
    let e = match r {
        Ok(()) => panic!("{what}: accepted"),
        Err(e) => e,
    };
    let m = e.message();
    assert_eq!(e.code(), Code::InvalidArgument, "{what}: {m}");
    assert!(
        m.starts_with(field),
        "{what}: the message does not start with {field:?}: {m}"
    );
    assert!(
        m.contains(&limit.to_string()),
        "{what}: the message does not name the limit {limit}: {m}"
    );
    assert!(
        m.len() <= MAX_MESSAGE,
        "{what}: a {}-byte message: {}...",
        m.len(),
        &m[..200]
    );
}

async fn run_pod(rt: &mut Rt, f: impl FnOnce(&mut v1::PodSandboxConfig)) -> Result<(), Status> {
    let mut config = pod_config();
    f(&mut config);
    rt.run_pod_sandbox(v1::RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .await
    .map(drop)
}

async fn create(
    rt: &mut Rt,
    pod: &str,
    f: impl FnOnce(&mut v1::ContainerConfig),
) -> Result<(), Status> {
    let mut config = container_config();
    f(&mut config);
    rt.create_container(v1::CreateContainerRequest {
        pod_sandbox_id: pod.into(),
        config: Some(config),
        sandbox_config: Some(pod_config()),
    })
    .await
    .map(drop)
}

#[tokio::test(flavor = "multi_thread")]
async fn run_pod_sandbox_bounds() {
    let d = Daemon::start().await;
    let mut rt = d.runtime_v1().await;
    let before = mounts_under(&d.run_dir);
    macro_rules! case {
        ($field:expr, $limit:expr, $f:expr $(,)?) => {
            check($field, run_pod(&mut rt, $f).await, $field, $limit)
        };
    }
    check(
        "runtime_handler",
        rt.run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config()),
            runtime_handler: s(10_000),
        })
        .await
        .map(drop),
        "runtime_handler",
        253,
    );
    case!("config.metadata.name", 253, |c| c
        .metadata
        .as_mut()
        .unwrap()
        .name = s(254));
    case!("config.metadata.namespace", 63, |c| c
        .metadata
        .as_mut()
        .unwrap()
        .namespace = s(64));
    case!("config.metadata.uid", 253, |c| c
        .metadata
        .as_mut()
        .unwrap()
        .uid = s(1 << 20));
    case!("config.hostname", 64, |c| c.hostname = s(65));
    case!("config.log_directory", 4096, |c| c.log_directory =
        format!("/{}", s(5000)));
    let dns = |servers: Vec<String>, searches: Vec<String>, options: Vec<String>| {
        move |c: &mut v1::PodSandboxConfig| {
            c.dns_config = Some(v1::DnsConfig {
                servers,
                searches,
                options,
            })
        }
    };
    case!(
        "config.dns_config.servers",
        3,
        dns(many(4, "10.0.0.1"), vec![], vec![])
    );
    case!(
        "config.dns_config.servers[0]",
        45,
        dns(vec![s(10_000)], vec![], vec![])
    );
    case!(
        "config.dns_config.searches",
        32,
        dns(vec![], many(33, "a.example"), vec![])
    );
    case!(
        "config.dns_config.searches[0]",
        253,
        dns(vec![], vec![s(254)], vec![]),
    );
    case!(
        "config.dns_config.searches",
        2048,
        dns(vec![], many(9, &s(250)), vec![])
    );
    case!(
        "config.dns_config.options",
        32,
        dns(vec![], vec![], many(33, "ndots:5"))
    );
    case!("config.port_mappings", 1024, |c| c.port_mappings =
        vec![v1::PortMapping::default(); 1025]);
    case!("config.port_mappings[0].host_ip", 45, |c| c.port_mappings =
        vec![v1::PortMapping {
            host_ip: s(100),
            ..Default::default()
        }]);
    // The case: a 1 MiB label value.
    case!("config.labels", 63, |c| {
        c.labels.insert("app".into(), s(1 << 20));
    });
    case!("config.labels", 63, |c| {
        c.labels.insert("app".into(), s(64));
    });
    case!("config.labels", 63, |c| {
        c.labels.insert(s(64), "v".into());
    });
    case!("config.labels", 253, |c| {
        c.labels.insert("io.kubernetes.pod.name".into(), s(254));
    });
    case!("config.labels", 65536, |c| c.labels = big_map(2000, 40));
    case!("config.annotations", 262144, |c| c.annotations =
        big_map(3, 100_000));
    case!("config.annotations", 63, |c| {
        c.annotations.insert(s(100), "v".into());
    });
    case!("config.linux.cgroup_parent", 4096, |c| linux(c)
        .cgroup_parent =
        format!("/{}", s(5000)));
    case!("config.linux.sysctls", 128, |c| linux(c).sysctls = (0..129)
        .map(|i| (format!("net.ipv4.conf.x{i}.forwarding"), "1".into()))
        .collect());
    case!("config.linux.sysctls", 4096, |c| {
        linux(c)
            .sysctls
            .insert("net.core.somaxconn".into(), s(5000));
    });
    case!("config.linux.sysctls", 256, |c| {
        linux(c).sysctls.insert(s(300), "1".into());
    });
    case!(
        "config.linux.security_context.seccomp.localhost_ref",
        4096,
        |c| {
            linux(c).security_context.as_mut().unwrap().seccomp = Some(v1::SecurityProfile {
                profile_type: 2,
                localhost_ref: s(5000),
            })
        }
    );
    case!("config.linux.resources.unified", 128, |c| linux(c)
        .resources =
        Some(v1::LinuxContainerResources {
            unified: big_map(129, 1),
            ..Default::default()
        }));
    let pods = rt
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(pods.is_empty(), "a refused pod was left: {pods:?}");
    assert_eq!(mounts_under(&d.run_dir), before);

    // IDs, filters.
    for (what, r) in [
        (
            "StopPodSandbox",
            rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: s(10_000),
            })
            .await
            .map(drop),
        ),
        (
            "RemovePodSandbox",
            rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: s(10_000),
            })
            .await
            .map(drop),
        ),
        (
            "PodSandboxStatus",
            rt.pod_sandbox_status(v1::PodSandboxStatusRequest {
                pod_sandbox_id: s(10_000),
                verbose: false,
            })
            .await
            .map(drop),
        ),
        (
            "PortForward",
            rt.port_forward(v1::PortForwardRequest {
                pod_sandbox_id: s(10_000),
                port: vec![],
            })
            .await
            .map(drop),
        ),
    ] {
        check(what, r, "pod_sandbox_id", 64);
    }
    check(
        "PortForward ports",
        rt.port_forward(v1::PortForwardRequest {
            pod_sandbox_id: "a".into(),
            port: vec![80; 1025],
        })
        .await
        .map(drop),
        "port",
        1024,
    );
    check(
        "ListPodSandbox filter",
        rt.list_pod_sandbox(v1::ListPodSandboxRequest {
            filter: Some(v1::PodSandboxFilter {
                label_selector: big_map(3, 100_000),
                ..Default::default()
            }),
        })
        .await
        .map(drop),
        "filter.label_selector",
        262144,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn container_bounds() {
    let d = Daemon::start().await;
    let mut rt = d.runtime_v1().await;
    // A real (host-network) pod: kubelet's path. The bounds come first, so
    // no image is needed.
    let pod = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let pod = pod.as_str();
    macro_rules! case {
        ($field:expr, $limit:expr, $f:expr $(,)?) => {
            check($field, create(&mut rt, pod, $f).await, $field, $limit)
        };
    }
    check(
        "pod_sandbox_id",
        create(&mut rt, &s(10_000), |_| {}).await,
        "pod_sandbox_id",
        64,
    );
    case!("config.metadata.name", 253, |c| c
        .metadata
        .as_mut()
        .unwrap()
        .name = s(254));
    case!("config.image.image", 1024, |c| c
        .image
        .as_mut()
        .unwrap()
        .image = s(10_000));
    case!("config.image.annotations", 262144, |c| c
        .image
        .as_mut()
        .unwrap()
        .annotations =
        big_map(3, 100_000));
    case!("config.command[0]", 131071, |c| c.command =
        vec![s(1 << 20)]);
    case!("config.args[1]", 131071, |c| c.args =
        vec!["a".into(), s(131_072)]);
    case!("config.command + config.args", 16384, |c| c.args =
        many(16_385, "a"));
    case!("config.envs", 16384, |c| c.envs =
        vec![v1::KeyValue::default(); 16_385]);
    case!("config.envs[0]", 131071, |c| c.envs = vec![v1::KeyValue {
        key: "K".into(),
        value: s(131_070),
    }]);
    case!("config.command + config.args + config.envs", 2097152, |c| {
        c.args = many(12, &s(100_000));
        c.envs = (0..12)
            .map(|i| v1::KeyValue {
                key: format!("K{i}"),
                value: s(100_000),
            })
            .collect();
    });
    case!("config.working_dir", 4096, |c| c.working_dir =
        format!("/{}", s(5000)));
    case!("config.mounts", 1024, |c| c.mounts =
        vec![v1::Mount::default(); 1025]);
    case!("config.mounts[0].container_path", 4096, |c| c.mounts =
        vec![v1::Mount {
            container_path: s(5000),
            ..Default::default()
        }]);
    case!("config.mounts[0].host_path", 4096, |c| c.mounts =
        vec![v1::Mount {
            container_path: "/m".into(),
            host_path: s(5000),
            ..Default::default()
        }]);
    case!("config.mounts[0].uidMappings", 340, |c| c.mounts =
        vec![v1::Mount {
            uid_mappings: vec![v1::IdMapping::default(); 341],
            ..Default::default()
        }]);
    case!("config.devices", 1024, |c| c.devices =
        vec![v1::Device::default(); 1025]);
    case!("config.devices[0].host_path", 4096, |c| c.devices =
        vec![v1::Device {
            host_path: s(5000),
            ..Default::default()
        }]);
    case!("config.devices[0].permissions", 3, |c| c.devices =
        vec![v1::Device {
            permissions: "rwmrwm".into(),
            ..Default::default()
        }]);
    case!("config.CDI_devices", 1024, |c| c.cdi_devices =
        vec![v1::CdiDevice::default(); 1025]);
    case!("config.labels", 63, |c| {
        c.labels.insert("app".into(), s(1 << 20));
    });
    case!("config.annotations", 262144, |c| c.annotations =
        big_map(3, 100_000));
    case!("config.log_path", 4096, |c| c.log_path = s(5000));
    case!("config.linux.resources.unified", 128, |c| res(c).unified =
        big_map(129, 1));
    case!("config.linux.resources.unified", 255, |c| {
        res(c).unified.insert(s(256), "1".into());
    });
    case!("config.linux.resources.unified", 4096, |c| {
        res(c).unified.insert("memory.high".into(), s(4097));
    });
    case!("config.linux.resources.cpuset_cpus", 4096, |c| res(c)
        .cpuset_cpus =
        s(5000));
    case!("config.linux.resources.hugepage_limits", 16, |c| res(c)
        .hugepage_limits =
        vec![v1::HugepageLimit::default(); 17]);
    case!(
        "config.linux.security_context.capabilities.add_capabilities",
        128,
        |c| sc(c).capabilities = Some(v1::Capability {
            add_capabilities: many(129, "CAP_CHOWN"),
            ..Default::default()
        })
    );
    case!("config.linux.security_context.masked_paths", 1024, |c| {
        sc(c).masked_paths = many(1025, "/proc/x")
    });
    case!(
        "config.linux.security_context.readonly_paths[0]",
        4096,
        |c| sc(c).readonly_paths = vec![s(5000)]
    );
    case!("config.linux.security_context.run_as_username", 256, |c| {
        sc(c).run_as_username = s(10_000)
    });
    case!(
        "config.linux.security_context.supplemental_groups",
        65536,
        |c| sc(c).supplemental_groups = vec![1; 65_537]
    );
    case!(
        "config.linux.security_context.namespace_options.target_id",
        64,
        |c| sc(c).namespace_options = Some(v1::NamespaceOption {
            target_id: s(100),
            ..Default::default()
        })
    );
    case!(
        "config.linux.security_context.apparmor.localhost_ref",
        4096,
        |c| sc(c).apparmor = Some(v1::SecurityProfile {
            profile_type: 2,
            localhost_ref: s(5000),
        })
    );
    let listed = rt
        .list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(
        listed.is_empty(),
        "a refused container was left: {listed:?}"
    );

    // The calls on containers: IDs, commands, resources.
    let long_id = s(10_000);
    let cid = || "c".repeat(64);
    for (what, r) in [
        (
            "StartContainer",
            rt.start_container(v1::StartContainerRequest {
                container_id: long_id.clone(),
            })
            .await
            .map(drop),
        ),
        (
            "StopContainer",
            rt.stop_container(v1::StopContainerRequest {
                container_id: long_id.clone(),
                timeout: 0,
            })
            .await
            .map(drop),
        ),
        (
            "RemoveContainer",
            rt.remove_container(v1::RemoveContainerRequest {
                container_id: long_id.clone(),
            })
            .await
            .map(drop),
        ),
        (
            "ContainerStatus",
            rt.container_status(v1::ContainerStatusRequest {
                container_id: long_id.clone(),
                verbose: false,
            })
            .await
            .map(drop),
        ),
        (
            "ReopenContainerLog",
            rt.reopen_container_log(v1::ReopenContainerLogRequest {
                container_id: long_id.clone(),
            })
            .await
            .map(drop),
        ),
        (
            "ExecSync",
            rt.exec_sync(v1::ExecSyncRequest {
                container_id: long_id.clone(),
                cmd: vec!["true".into()],
                timeout: 0,
            })
            .await
            .map(drop),
        ),
        (
            "Attach",
            rt.attach(v1::AttachRequest {
                container_id: long_id.clone(),
                stdout: true,
                ..Default::default()
            })
            .await
            .map(drop),
        ),
    ] {
        check(what, r, "container_id", 64);
    }
    check(
        "ExecSync cmd",
        rt.exec_sync(v1::ExecSyncRequest {
            container_id: cid(),
            cmd: vec![s(200_000)],
            timeout: 0,
        })
        .await
        .map(drop),
        "cmd[0]",
        131071,
    );
    check(
        "ExecSync cmd count",
        rt.exec_sync(v1::ExecSyncRequest {
            container_id: cid(),
            cmd: many(16_385, "a"),
            timeout: 0,
        })
        .await
        .map(drop),
        "cmd",
        16384,
    );
    check(
        "Exec cmd",
        rt.exec(v1::ExecRequest {
            container_id: cid(),
            cmd: vec![s(200_000)],
            stdout: true,
            ..Default::default()
        })
        .await
        .map(drop),
        "cmd[0]",
        131071,
    );
    check(
        "UpdateContainerResources",
        rt.update_container_resources(v1::UpdateContainerResourcesRequest {
            container_id: cid(),
            linux: Some(v1::LinuxContainerResources {
                unified: big_map(129, 1),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(drop),
        "linux.unified",
        128,
    );
    check(
        "ListContainers filter",
        rt.list_containers(v1::ListContainersRequest {
            filter: Some(v1::ContainerFilter {
                id: s(10_000),
                ..Default::default()
            }),
        })
        .await
        .map(drop),
        "filter.id",
        64,
    );
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.into(),
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn image_bounds() {
    let d = Daemon::start().await;
    let mut img: Img = d.image_v1().await;
    let spec = |image: String| {
        Some(v1::ImageSpec {
            image,
            ..Default::default()
        })
    };
    // The case: a 10 KB name used to come back twice, as 20 KB of
    // grpc-message, which clients saw as RST_STREAM.
    check(
        "PullImage",
        img.pull_image(v1::PullImageRequest {
            image: spec(s(10_000)),
            ..Default::default()
        })
        .await
        .map(drop),
        "image.image",
        1024,
    );
    let password = format!("secret-{}", s(70_000));
    let e = img
        .pull_image(v1::PullImageRequest {
            image: spec("busybox".into()),
            auth: Some(v1::AuthConfig {
                password: password.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(drop);
    let msg = e.as_ref().map_err(|e| e.message().to_string()).unwrap_err();
    assert!(!msg.contains("secret-"), "a credential is quoted: {msg}");
    check("PullImage auth", e, "auth.password", 65536);
    check(
        "ImageStatus",
        img.image_status(v1::ImageStatusRequest {
            image: spec(s(10_000)),
            verbose: false,
        })
        .await
        .map(drop),
        "image.image",
        1024,
    );
    check(
        "RemoveImage",
        img.remove_image(v1::RemoveImageRequest {
            image: spec(s(10_000)),
        })
        .await
        .map(drop),
        "image.image",
        1024,
    );
    check(
        "ListImages",
        img.list_images(v1::ListImagesRequest {
            filter: Some(v1::ImageFilter {
                image: spec(s(10_000)),
            }),
        })
        .await
        .map(drop),
        "filter.image.image",
        1024,
    );
    // A valid but unknown reference still fails as before, with a short
    // message.
    let e = img
        .pull_image(v1::PullImageRequest {
            image: spec(format!("127.0.0.1:1/{}", "a".repeat(200))),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.message().len() <= MAX_MESSAGE, "{}", e.message().len());
}
