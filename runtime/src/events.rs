//! Container life-cycle events (GetContainerEvents). One broadcast
//! channel: every subscriber sees every event from its subscription on; a
//! subscriber that falls more than [`CAPACITY`] behind skips what it missed.

use tokio::sync::broadcast;

use crate::clock::now_ns;

/// Events buffered for the slowest subscriber.
pub const CAPACITY: usize = 1024;

/// What happened to a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    pub container_id: String,
    pub pod_id: String,
    /// Nanoseconds since the Unix epoch.
    pub at: i64,
}

pub struct Events {
    tx: broadcast::Sender<Event>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(CAPACITY).0,
        }
    }
}

impl Events {
    pub fn emit(&self, kind: EventKind, container_id: &str, pod_id: &str) {
        // No subscriber is no error.
        let _ = self.tx.send(Event {
            kind,
            container_id: container_id.to_string(),
            pod_id: pod_id.to_string(),
            at: now_ns(),
        });
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
