//! Gives memory back while the daemon is idle.
//!
//! An idle daemon's resident set is mostly clean pages of its own binary
//! and libraries that start-up and the last calls touched (with the
//! kernel's fault-around, 64 KiB per touch), plus free heap. Once no CRI
//! call has arrived for a whole [`IDLE_AFTER`], the heap's free memory is
//! returned and those page-table entries are dropped (the pages stay in
//! the page cache; the next call maps what it touches again). Calls are
//! counted by [`ActivityLayer`] on the gRPC server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower::{Layer, Service};

/// Quiet time after which the daemon trims itself (once per quiet spell),
/// as the monitor does 2 s after its last request.
pub const IDLE_AFTER: Duration = Duration::from_secs(2);

/// How often the call counter is looked at.
const TICK: Duration = Duration::from_millis(500);

static CALLS: AtomicU64 = AtomicU64::new(0);

/// Counts every call the gRPC server receives.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivityLayer;

impl<S> Layer<S> for ActivityLayer {
    type Service = Activity<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Activity { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Activity<S> {
    inner: S,
}

impl<S, R> Service<R> for Activity<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        CALLS.fetch_add(1, Ordering::Relaxed);
        self.inner.call(req)
    }
}

/// The quiet-spell tracker: the call count last seen, since when it has
/// not changed, and whether this spell was trimmed already.
#[derive(Debug)]
struct Quiet {
    calls: u64,
    since: Instant,
    trimmed: bool,
}

impl Quiet {
    /// Whether to trim now, with `calls` counted so far at `now`.
    fn should_trim(&mut self, calls: u64, now: Instant) -> bool {
        if calls != self.calls {
            *self = Quiet {
                calls,
                since: now,
                trimmed: false,
            };
            return false;
        }
        if self.trimmed || now.duration_since(self.since) < IDLE_AFTER {
            return false;
        }
        self.trimmed = true;
        true
    }
}

/// Starts the task that trims the daemon after [`IDLE_AFTER`] of quiet.
pub fn spawn_idle_trim() {
    tokio::spawn(async {
        // Start-up itself counts as activity.
        let mut quiet = Quiet {
            calls: CALLS.load(Ordering::Relaxed),
            since: Instant::now(),
            trimmed: false,
        };
        loop {
            tokio::time::sleep(TICK).await;
            if quiet.should_trim(CALLS.load(Ordering::Relaxed), Instant::now()) {
                let _ =
                    tokio::task::spawn_blocking(crust_linux::process::trim_working_set_of_program)
                        .await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_per_quiet_spell() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut q = Quiet {
            calls: 0,
            since: t0,
            trimmed: false,
        };
        assert!(!q.should_trim(0, at(1500)), "not quiet long enough");
        assert!(q.should_trim(0, at(2000)), "quiet for IDLE_AFTER");
        assert!(!q.should_trim(0, at(2500)), "only once");
        assert!(!q.should_trim(3, at(3000)), "calls came in");
        assert!(!q.should_trim(3, at(4500)), "quiet again, not long enough");
        assert!(q.should_trim(3, at(5000)), "quiet again for IDLE_AFTER");
    }
}
