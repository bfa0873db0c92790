//! An endpoint under test: its gRPC clients, what is known of it (daemon
//! PID, network readiness, metrics endpoint) and the fixtures of the
//! scenario being measured on it.

use std::sync::Arc;

use anyhow::Context;
use crust_api::v1;
use tonic::transport::Endpoint;

use crate::client::{Client, ImageClient, Pod, RuntimeClient};
use crate::fixtures::Fixtures;
use crate::stats::Report;

pub struct Target {
    pub name: String,
    /// 0 for --endpoint, 1 for --vs.
    pub index: usize,
    pub client: Client,
    pub pid: Option<u32>,
    pub network_ready: bool,
    /// The container image as the endpoint resolved it.
    pub image: Option<String>,
    /// Fixtures of the scenario being measured.
    pub pod: Option<Pod>,
    pub container: Option<String>,
    /// Left out of the scenario being measured (e.g. it has no such
    /// runtime handler).
    pub skip: bool,
    /// Its Prometheus endpoint, if it has one.
    pub metrics_url: Option<String>,
}

impl Target {
    /// Connects to `endpoint` and asks its Status (is the network ready?).
    pub async fn connect(
        endpoint: &str,
        label: Option<&String>,
        index: usize,
        pid: Option<u32>,
        fixtures: Arc<Fixtures>,
    ) -> anyhow::Result<Target> {
        let uri = if endpoint.starts_with("unix:") {
            endpoint.to_string()
        } else {
            format!("unix://{endpoint}")
        };
        let channel = Endpoint::from_shared(uri.clone())?
            .connect()
            .await
            .with_context(|| format!("connecting to {uri}"))?;
        let mut rt = RuntimeClient::new(channel.clone());
        let status = rt
            .status(v1::StatusRequest { verbose: false })
            .await
            .with_context(|| format!("Status of {endpoint}"))?
            .into_inner();
        let network_ready = status
            .status
            .map(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.r#type == "NetworkReady" && c.status)
            })
            .unwrap_or(false);
        Ok(Target {
            name: label.cloned().unwrap_or_else(|| endpoint.to_string()),
            index,
            client: Client {
                rt,
                img: ImageClient::new(channel),
                fixtures,
                tracker: Arc::default(),
            },
            pid,
            network_ready,
            image: None,
            pod: None,
            container: None,
            skip: false,
            metrics_url: None,
        })
    }

    /// The container image, once pulled.
    pub fn image(&self) -> anyhow::Result<String> {
        self.image.clone().context("no image")
    }

    /// The scenario `name` does not apply to this target (e.g. it has no
    /// such runtime handler): reported as n/a, and the target is left out
    /// of it (`skip`).
    pub fn not_applicable(&mut self, report: &mut Report, name: &str, why: &anyhow::Error) {
        report.not_applicable(name, &self.name, why);
        self.skip = true;
    }

    /// Removes the scenario's fixture pod (and so its containers).
    pub async fn remove_fixtures(&mut self) -> anyhow::Result<()> {
        self.container = None;
        if let Some((id, _)) = self.pod.take() {
            self.client.remove_pod(&id).await?;
        }
        Ok(())
    }
}
