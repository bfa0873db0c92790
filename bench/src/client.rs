//! The CRI clients of one endpoint and the calls the scenarios build on,
//! each with its context in errors; pods are tracked from creation to
//! removal.

use std::sync::Arc;

use anyhow::Context;
use crust_api::v1;
use tonic::transport::Channel;

use crate::fixtures::{Fixtures, container_config};
use crate::tracker::Tracker;

pub type RuntimeClient = v1::runtime_service_client::RuntimeServiceClient<Channel>;
pub type ImageClient = v1::image_service_client::ImageServiceClient<Channel>;

/// A pod as the bench holds it: its id and the config it was run with
/// (CreateContainer repeats the config).
pub type Pod = (String, v1::PodSandboxConfig);

/// The CRI clients of one endpoint with what the bench creates through
/// them tracked; cheap to clone into a concurrent task.
#[derive(Clone)]
pub struct Client {
    pub rt: RuntimeClient,
    pub img: ImageClient,
    pub fixtures: Arc<Fixtures>,
    pub tracker: Arc<Tracker>,
}

impl Client {
    /// RunPodSandbox of a fresh pod (host network or not).
    pub async fn run_pod(&mut self, handler: &str, host_network: bool) -> anyhow::Result<Pod> {
        let config = self
            .fixtures
            .pod_config(&self.fixtures.pod_name(), host_network);
        // As kubelet: the pod's log directory exists before the pod.
        std::fs::create_dir_all(&config.log_directory)
            .with_context(|| format!("creating {}", config.log_directory))?;
        let id = self
            .rt
            .run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: handler.into(),
            })
            .await
            .context("RunPodSandbox")?
            .into_inner()
            .pod_sandbox_id;
        self.tracker.pod_created(&id);
        Ok((id, config))
    }

    /// StopPodSandbox, then RemovePodSandbox.
    pub async fn remove_pod(&mut self, id: &str) -> anyhow::Result<()> {
        self.rt
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .context("StopPodSandbox")?;
        self.rt
            .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            })
            .await
            .context("RemovePodSandbox")?;
        self.tracker.pod_removed(id);
        Ok(())
    }

    /// CreateContainer of a fresh `sleep 3600` container of `image`.
    pub async fn create_container(&mut self, pod: &Pod, image: &str) -> anyhow::Result<String> {
        let name = self.fixtures.unique("c");
        Ok(self
            .rt
            .create_container(v1::CreateContainerRequest {
                pod_sandbox_id: pod.0.clone(),
                config: Some(container_config(&name, image, &pod.1)),
                sandbox_config: Some(pod.1.clone()),
            })
            .await
            .context("CreateContainer")?
            .into_inner()
            .container_id)
    }

    pub async fn start_container(&mut self, id: &str) -> anyhow::Result<()> {
        self.rt
            .start_container(v1::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .context("StartContainer")?;
        Ok(())
    }

    /// PullImage for a pod of `namespace` (signature policies are chosen
    /// by the pod's namespace); the image ref the endpoint resolved.
    pub async fn pull_for_namespace(
        &mut self,
        image: &str,
        namespace: &str,
    ) -> anyhow::Result<String> {
        let pod = v1::PodSandboxConfig {
            metadata: Some(v1::PodSandboxMetadata {
                name: "pull".into(),
                namespace: namespace.into(),
                uid: "pull".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        self.pull_with(image, Some(pod))
            .await
            .with_context(|| format!("namespace {namespace}"))
    }

    pub async fn remove_image(&mut self, image: &str) -> anyhow::Result<()> {
        self.img
            .remove_image(v1::RemoveImageRequest {
                image: Some(v1::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
            })
            .await
            .with_context(|| format!("RemoveImage {image}"))?;
        Ok(())
    }

    /// PullImage; the image ref the endpoint resolved.
    pub async fn pull(&mut self, image: &str) -> anyhow::Result<String> {
        self.pull_with(image, None).await
    }

    async fn pull_with(
        &mut self,
        image: &str,
        sandbox_config: Option<v1::PodSandboxConfig>,
    ) -> anyhow::Result<String> {
        Ok(self
            .img
            .pull_image(v1::PullImageRequest {
                image: Some(v1::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                sandbox_config,
                ..Default::default()
            })
            .await
            .with_context(|| format!("PullImage {image}"))?
            .into_inner()
            .image_ref)
    }
}
