//! GetContainerEvents: the container events of `crate::events`, each with
//! the container's status as the change left it, its pod's status and the
//! statuses of the pod's other containers.
//!
//! A subscriber that falls more than `events::CAPACITY` events behind gets
//! `Aborted` ("events lost ...") and the stream ends: gRPC's code for
//! "retry at a higher level", which is what kubelet's evented PLEG does
//! (it lists again and subscribes anew). Nothing is skipped silently.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use crust_api::v1::*;
use tokio_stream::Stream;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::{Request, Response, Status};

use super::container::container_status;
use super::pod::sandbox_status;
use super::{Cri, ResponseStream};
use crate::containers::ContainerRecord;
use crate::events::{Event, EventKind};

impl Cri {
    pub(super) async fn get_container_events_impl(
        &self,
        _req: Request<GetEventsRequest>,
    ) -> Result<Response<ResponseStream<ContainerEventResponse>>, Status> {
        let sub = self.daemon.containers.events().subscribe();
        Ok(Response::new(Box::pin(EventStream {
            cri: self.clone(),
            replay: sub.replay,
            live: BroadcastStream::new(sub.live),
            done: false,
        })))
    }

    fn event_response(&self, ev: Event<ContainerRecord>) -> ContainerEventResponse {
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
        // The others as they are now; this one as the change left it (a
        // deleted one is in no list, as containerd reports it).
        let mut containers_statuses: Vec<ContainerStatus> = self
            .daemon
            .containers
            .list()
            .iter()
            .filter(|r| r.pod_id == ev.pod_id && r.id != ev.container_id)
            .map(|r| container_status(r))
            .collect();
        if ev.kind != EventKind::Deleted {
            containers_statuses.push(container_status(&ev.snapshot));
        }
        ContainerEventResponse {
            container_id: ev.container_id,
            container_event_type: kind as i32,
            created_at: ev.at,
            pod_sandbox_status,
            containers_statuses,
        }
    }
}

/// One subscriber's events: what recovery found, then the live ones,
/// until it falls behind.
struct EventStream {
    cri: Cri,
    replay: VecDeque<Event<ContainerRecord>>,
    live: BroadcastStream<Event<ContainerRecord>>,
    done: bool,
}

impl Stream for EventStream {
    type Item = Result<ContainerEventResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(ev) = self.replay.pop_front() {
            return Poll::Ready(Some(Ok(self.cri.event_response(ev))));
        }
        match std::task::ready!(Pin::new(&mut self.live).poll_next(cx)) {
            Some(Ok(ev)) => Poll::Ready(Some(Ok(self.cri.event_response(ev)))),
            Some(Err(BroadcastStreamRecvError::Lagged(n))) => {
                self.done = true;
                tracing::warn!(
                    lost = n,
                    "a GetContainerEvents subscriber fell behind; ending its stream"
                );
                Poll::Ready(Some(Err(Status::aborted(format!(
                    "events lost: subscriber fell behind by {n} events (more than {} buffered); \
                     list the containers again and subscribe anew",
                    crate::events::CAPACITY
                )))))
            }
            None => Poll::Ready(None),
        }
    }
}
