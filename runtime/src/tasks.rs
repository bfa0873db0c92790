//! Running blocking work (syscalls, mounts, store commits with fsync) off
//! the async workers.

use tokio::task::JoinError;

/// Runs `f` on tokio's blocking pool, in the caller's span (spans made in
/// `f` are its children). A panic in `f` becomes the caller's error type
/// (every domain error converts from [`JoinError`]).
pub async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, E>
where
    T: Send + 'static,
    E: From<JoinError> + Send + 'static,
{
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(E::from)?
}
