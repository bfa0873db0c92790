//! Running blocking work (syscalls, mounts, store commits with fsync) off
//! the async workers.

use tokio::task::JoinError;

/// Runs `f` on tokio's blocking pool. A panic in `f` becomes the caller's
/// error type (every domain error converts from [`JoinError`]).
pub async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, E>
where
    T: Send + 'static,
    E: From<JoinError> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(E::from)?
}
