//! CRI calls and configs many suites make the same way.

use crust_api::v1;
use tonic::transport::Channel;

type RuntimeClient = v1::runtime_service_client::RuntimeServiceClient<Channel>;
type ImageClient = v1::image_service_client::ImageServiceClient<Channel>;

/// A pod's metadata as the suites name their pods: uid `uid-<name>`,
/// attempt 0.
pub fn pod_metadata(name: &str, namespace: &str) -> Option<v1::PodSandboxMetadata> {
    Some(v1::PodSandboxMetadata {
        name: name.into(),
        uid: format!("uid-{name}"),
        namespace: namespace.into(),
        attempt: 0,
    })
}

/// RunPodSandbox of `config` with `handler`; panics with the error.
pub async fn run_pod(rt: &mut RuntimeClient, config: v1::PodSandboxConfig, handler: &str) -> Pod {
    let id = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
        .into_inner()
        .pod_sandbox_id;
    (id, config)
}

/// A container `name` of `image` with its log at `<name>.log` and a
/// default Linux security context; suites override what they test.
pub fn container_config(name: &str, image: &str) -> v1::ContainerConfig {
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        log_path: format!("{name}.log"),
        linux: Some(v1::LinuxContainerConfig {
            security_context: Some(v1::LinuxContainerSecurityContext::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// PullImage of `image`; the image ref. Panics with the error.
pub async fn pull_image(ic: &mut ImageClient, image: &str) -> String {
    ic.pull_image(v1::PullImageRequest {
        image: Some(v1::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("pull {image}: {e}"))
    .into_inner()
    .image_ref
}

/// A pod as the tests hold it: its id and the config it was run with
/// (CreateContainer repeats the config).
pub type Pod = (String, v1::PodSandboxConfig);

/// CreateContainer of `config` in `pod`.
pub async fn create_container(
    rt: &mut RuntimeClient,
    pod: &Pod,
    config: v1::ContainerConfig,
) -> Result<String, tonic::Status> {
    rt.create_container(v1::CreateContainerRequest {
        pod_sandbox_id: pod.0.clone(),
        config: Some(config),
        sandbox_config: Some(pod.1.clone()),
    })
    .await
    .map(|r| r.into_inner().container_id)
}

/// CreateContainer and StartContainer; panics with the failing RPC.
pub async fn run_container(
    rt: &mut RuntimeClient,
    pod: &Pod,
    config: v1::ContainerConfig,
) -> String {
    let id = create_container(rt, pod, config)
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"));
    rt.start_container(v1::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    id
}

/// ExecSync of `cmd` in container `id`: (exit code, stdout, stderr).
/// Panics with the error.
pub async fn exec_sync(
    rt: &mut RuntimeClient,
    id: &str,
    cmd: &[&str],
    timeout_secs: i64,
) -> (i32, String, String) {
    let r = rt
        .exec_sync(v1::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: timeout_secs,
        })
        .await
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e}"))
        .into_inner();
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

/// Verbose ContainerStatus of `id`. Panics with the error.
pub async fn container_status(rt: &mut RuntimeClient, id: &str) -> v1::ContainerStatusResponse {
    rt.container_status(v1::ContainerStatusRequest {
        container_id: id.into(),
        verbose: true,
    })
    .await
    .unwrap_or_else(|e| panic!("ContainerStatus: {e}"))
    .into_inner()
}

/// Every container ListContainers answers (no filter). Panics with the
/// error.
pub async fn list_containers(rt: &mut RuntimeClient) -> Vec<v1::Container> {
    rt.list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap_or_else(|e| panic!("ListContainers: {e}"))
        .into_inner()
        .containers
}

/// A pod `name` in `namespace` on the host's network (no CNI needed), as
/// most suites run theirs; suites override what they test.
pub fn host_network_pod(name: &str, namespace: &str) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: pod_metadata(name, namespace),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
