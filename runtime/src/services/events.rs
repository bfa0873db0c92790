//! GetContainerEvents: the container events of `crate::events`, each with
//! its pod's status and the statuses of the pod's containers.

use crust_api::v1::*;
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};

use super::container::container_status;
use super::pod::sandbox_status;
use super::{Cri, ResponseStream};
use crate::events::{Event, EventKind};

/// Answers buffered per subscriber before the sender waits for it.
const SUBSCRIBER_BUFFER: usize = 256;

impl Cri {
    pub(super) async fn get_container_events_impl(
        &self,
        _req: Request<GetEventsRequest>,
    ) -> Result<Response<ResponseStream<ContainerEventResponse>>, Status> {
        let mut rx = self.daemon.containers.events().subscribe();
        let this = self.clone();
        let (tx, out) = tokio::sync::mpsc::channel(SUBSCRIBER_BUFFER);
        tokio::spawn(async move {
            loop {
                let ev = match rx.recv().await {
                    Ok(ev) => ev,
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return,
                };
                if tx.send(Ok(this.event_response(ev))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    fn event_response(&self, ev: Event) -> ContainerEventResponse {
        let kind = match ev.kind {
            EventKind::Created => ContainerEventType::ContainerCreatedEvent,
            EventKind::Started => ContainerEventType::ContainerStartedEvent,
            EventKind::Stopped => ContainerEventType::ContainerStoppedEvent,
            EventKind::Deleted => ContainerEventType::ContainerDeletedEvent,
        };
        let pod_sandbox_status = self
            .daemon
            .pods
            .get(&ev.pod_id)
            .ok()
            .map(|p| sandbox_status(&p));
        let containers_statuses = self
            .daemon
            .containers
            .list()
            .iter()
            .filter(|r| r.pod_id == ev.pod_id)
            .map(|r| container_status(r))
            .collect();
        ContainerEventResponse {
            container_id: ev.container_id,
            container_event_type: kind as i32,
            created_at: ev.at,
            pod_sandbox_status,
            containers_statuses,
        }
    }
}
