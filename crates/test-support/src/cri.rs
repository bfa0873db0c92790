//! CRI calls many suites make the same way.

use crust_api::v1;
use tonic::transport::Channel;

/// A pod as the tests hold it: its id and the config it was run with
/// (CreateContainer repeats the config).
pub type Pod = (String, v1::PodSandboxConfig);

/// CreateContainer of `config` in `pod`.
pub async fn create_container(
    rt: &mut v1::runtime_service_client::RuntimeServiceClient<Channel>,
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
    rt: &mut v1::runtime_service_client::RuntimeServiceClient<Channel>,
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
