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
use std::time::Duration;

use tower::{Layer, Service};

/// Quiet time after which the daemon trims itself (once per quiet spell).
pub const IDLE_AFTER: Duration = Duration::from_secs(5);

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

/// Whether a quiet spell has just begun: no call since the last tick, and
/// none trimmed for yet.
fn should_trim(last: &mut (u64, bool), now: u64) -> bool {
    let (seen, trimmed) = *last;
    if now != seen {
        *last = (now, false);
        return false;
    }
    if trimmed {
        return false;
    }
    last.1 = true;
    true
}

/// Starts the task that trims the daemon after [`IDLE_AFTER`] of quiet.
pub fn spawn_idle_trim() {
    tokio::spawn(async {
        // Start-up itself counts as activity: trim after the first quiet spell.
        let mut last = (u64::MAX, false);
        loop {
            tokio::time::sleep(IDLE_AFTER).await;
            if should_trim(&mut last, CALLS.load(Ordering::Relaxed)) {
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
        let mut last = (u64::MAX, false);
        assert!(!should_trim(&mut last, 0), "start-up is activity");
        assert!(should_trim(&mut last, 0), "a whole quiet tick");
        assert!(!should_trim(&mut last, 0), "only once");
        assert!(!should_trim(&mut last, 3), "calls came in");
        assert!(!should_trim(&mut last, 5), "still busy");
        assert!(should_trim(&mut last, 5), "quiet again");
    }
}
