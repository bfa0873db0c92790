//! Container life-cycle events (GetContainerEvents): one broadcast channel,
//! in the order the changes happened (the changes of one container are
//! made one at a time, so its events come in order).
//!
//! - A subscriber sees every event from its subscription on. One that
//!   falls more than [`CAPACITY`] events behind is told so (`Lagged`) and
//!   the stream ends there, never silently skipping: a consumer such as
//!   kubelet's evented PLEG then lists again.
//! - What changed while the daemon was down is found at recovery (e.g. a
//!   container that exited: STOPPED). Those events are kept and handed to
//!   every subscriber that comes within [`RECOVERY_REPLAY`] of the end of
//!   recovery, before the live ones.
//! - Each event carries a snapshot `S` of the container as the change left
//!   it (taken only while someone can receive it).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::clock::now_ns;

/// Events buffered for the slowest subscriber.
pub const CAPACITY: usize = 1024;

/// How long after recovery new subscribers still get what recovery found.
pub const RECOVERY_REPLAY: Duration = Duration::from_secs(300);

/// What happened to a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

#[derive(Debug)]
pub struct Event<S> {
    pub kind: EventKind,
    pub container_id: String,
    pub pod_id: String,
    /// Nanoseconds since the Unix epoch.
    pub at: i64,
    /// The container as this change left it.
    pub snapshot: Arc<S>,
}

impl<S> Clone for Event<S> {
    fn clone(&self) -> Self {
        Event {
            kind: self.kind,
            container_id: self.container_id.clone(),
            pod_id: self.pod_id.clone(),
            at: self.at,
            snapshot: self.snapshot.clone(),
        }
    }
}

enum Phase {
    /// Recovering: events are kept for later subscribers.
    Recovering,
    /// Recovered; the kept events go to subscribers until then.
    ReplayUntil(Instant),
}

struct Kept<S> {
    phase: Phase,
    events: Vec<Event<S>>,
}

pub struct Events<S> {
    /// Also what makes taking the kept events and subscribing one step
    /// against emitting (no event both kept and received, none missed).
    kept: Mutex<Kept<S>>,
    tx: broadcast::Sender<Event<S>>,
}

impl<S: Clone + Send + Sync + 'static> Default for Events<S> {
    fn default() -> Self {
        Events::with_capacity(CAPACITY)
    }
}

/// A subscriber's end: what recovery found, then the live events.
pub struct Subscription<S> {
    pub replay: VecDeque<Event<S>>,
    pub live: broadcast::Receiver<Event<S>>,
}

impl<S: Clone> Subscription<S> {
    /// The next event if one is there (`Lagged` once fallen behind).
    #[cfg(test)]
    pub fn try_recv(&mut self) -> Result<Event<S>, broadcast::error::TryRecvError> {
        match self.replay.pop_front() {
            Some(e) => Ok(e),
            None => self.live.try_recv(),
        }
    }
}

impl<S: Clone + Send + Sync + 'static> Events<S> {
    pub fn with_capacity(capacity: usize) -> Events<S> {
        Events {
            kept: Mutex::new(Kept {
                phase: Phase::Recovering,
                events: Vec::new(),
            }),
            tx: broadcast::channel(capacity).0,
        }
    }

    /// Reports a change of `container_id` (of pod `pod_id`), which left it
    /// as `record` says.
    pub fn emit(&self, kind: EventKind, container_id: &str, pod_id: &str, record: &S) {
        let mut kept = self.lock();
        let recovering = matches!(kept.phase, Phase::Recovering);
        if !recovering && self.tx.receiver_count() == 0 {
            return;
        }
        let event = Event {
            kind,
            container_id: container_id.to_string(),
            pod_id: pod_id.to_string(),
            at: now_ns(),
            snapshot: Arc::new(record.clone()),
        };
        if recovering {
            kept.events.push(event.clone());
        }
        // No subscriber is no error.
        let _ = self.tx.send(event);
    }

    /// Recovery is over: what it found goes to the subscribers of the
    /// next `replay` (a daemon restart's worth of changes), then is
    /// dropped.
    pub fn recovered(&self, replay: Duration) {
        self.lock().phase = Phase::ReplayUntil(Instant::now() + replay);
    }

    pub fn subscribe(&self) -> Subscription<S> {
        let mut kept = self.lock();
        let replay = match kept.phase {
            Phase::ReplayUntil(t) if Instant::now() < t => kept.events.iter().cloned().collect(),
            Phase::ReplayUntil(_) => {
                kept.events = Vec::new();
                VecDeque::new()
            }
            Phase::Recovering => VecDeque::new(),
        };
        Subscription {
            replay,
            live: self.tx.subscribe(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept<S>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::broadcast::error::TryRecvError;

    fn kinds(sub: &mut Subscription<u32>) -> Vec<(EventKind, String, u32)> {
        let mut v: Vec<_> = sub
            .replay
            .drain(..)
            .map(|e| (e.kind, e.container_id, *e.snapshot))
            .collect();
        while let Ok(e) = sub.live.try_recv() {
            v.push((e.kind, e.container_id, *e.snapshot));
        }
        v
    }

    #[test]
    fn recovery_events_go_to_subscribers_of_the_replay_window_then_live_ones() {
        let events = Events::<u32>::default();
        events.emit(EventKind::Stopped, "a", "p", &1);
        let mut during = events.subscribe();
        events.recovered(Duration::from_secs(60));
        events.emit(EventKind::Deleted, "a", "p", &2);
        let mut after = events.subscribe();
        events.emit(EventKind::Created, "b", "p", &3);
        // A subscriber during recovery sees only what comes after it.
        assert_eq!(
            kinds(&mut during),
            vec![
                (EventKind::Deleted, "a".into(), 2),
                (EventKind::Created, "b".into(), 3)
            ]
        );
        // A later one: recovery's events first, then its own, none twice.
        assert_eq!(
            kinds(&mut after),
            vec![
                (EventKind::Stopped, "a".into(), 1),
                (EventKind::Created, "b".into(), 3)
            ]
        );
        // After the window, no replay.
        events.recovered(Duration::ZERO);
        let mut late = events.subscribe();
        assert!(late.replay.is_empty());
        assert!(matches!(late.live.try_recv(), Err(TryRecvError::Empty)));
    }

    #[test]
    fn a_subscriber_that_falls_behind_is_told_by_how_much() {
        let events = Events::<u32>::with_capacity(4);
        events.recovered(Duration::ZERO);
        let mut sub = events.subscribe();
        for i in 0..10 {
            events.emit(EventKind::Created, &format!("c{i}"), "p", &i);
        }
        assert!(matches!(sub.live.try_recv(), Err(TryRecvError::Lagged(6))));
    }

    #[test]
    fn nothing_is_kept_without_subscribers_after_recovery() {
        let events = Events::<u32>::default();
        events.recovered(Duration::from_secs(60));
        events.emit(EventKind::Created, "a", "p", &1);
        let mut sub = events.subscribe();
        assert!(sub.replay.is_empty());
        assert!(matches!(sub.live.try_recv(), Err(TryRecvError::Empty)));
    }
}
