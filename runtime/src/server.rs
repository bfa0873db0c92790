//! The gRPC server on the CRI Unix socket, and its orderly shutdown.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use crust_api::admin::v1::images_server::ImagesServer;
use crust_api::v1::image_service_server::ImageServiceServer;
use crust_api::v1::runtime_service_server::RuntimeServiceServer;
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{info, warn};

use crate::api_version::ApiVersionLayer;
use crate::config::Config;
use crate::daemon::Daemon;
use crate::services::{Admin, Cri};

/// How long in-flight calls get to finish after SIGTERM before the daemon
/// exits anyway (long-lived streams such as GetContainerEvents never finish).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(config: Config) -> anyhow::Result<()> {
    let socket = config.socket.clone();
    let daemon = Arc::new(Daemon::open(config).await?);
    start_streaming(&daemon).await?;
    crate::idle::spawn_idle_trim();
    let listener = bind(&socket)?;
    let _remove_socket = RemoveOnDrop(socket.clone());
    info!(
        socket = %socket.display(),
        version = env!("CARGO_PKG_VERSION"),
        cgroups = ?daemon.cgroup_hierarchy,
        "crust is serving the CRI (runtime.v1, runtime.v1alpha2)"
    );

    let admin = Admin::new(daemon.clone());
    let cri = Cri::new(daemon.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .layer(ApiVersionLayer)
        .layer(crate::idle::ActivityLayer)
        .add_service(RuntimeServiceServer::new(cri.clone()))
        .add_service(ImageServiceServer::new(cri))
        // crust's private admin API (`crust images`), on the same socket.
        .add_service(ImagesServer::new(admin))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        res = &mut server => return res.context("gRPC server failed"),
        _ = term.recv() => info!("SIGTERM: finishing in-flight calls"),
        _ = int.recv() => info!("SIGINT: finishing in-flight calls"),
    }
    let _ = stop_tx.send(());
    match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
        Ok(res) => res.context("gRPC server failed")?,
        Err(_) => warn!("calls still open after {DRAIN_TIMEOUT:?}; exiting anyway"),
    }
    daemon.lifecycle.shutdown().await;
    info!("stopped");
    Ok(())
}

/// Starts the exec / attach / port-forward server and keeps it in the
/// daemon. A bind failure stops the daemon with the address in the error.
async fn start_streaming(daemon: &Arc<Daemon>) -> anyhow::Result<()> {
    let section = &daemon.config.streaming;
    let mut cfg = crust_streaming::StreamingConfig {
        addr: section.socket_addr()?,
        ..Default::default()
    };
    if let (Some(cert), Some(key)) = (&section.tls_cert, &section.tls_key) {
        cfg.tls = Some(crust_streaming::TlsConfig {
            cert_path: cert.clone(),
            key_path: key.clone(),
        });
    }
    let backend = Arc::new(crate::streaming_backend::StreamingBackend::new(
        &daemon.pods,
        &daemon.containers,
    ));
    let server = crust_streaming::StreamingServer::start(cfg, backend)
        .await
        .context("starting the streaming server ([streaming] address and port)")?;
    info!(url = %server.base_url(), "streaming server (exec, attach, port-forward) listening");
    if daemon.streaming.set(server).is_err() {
        bail!("the streaming server was started twice");
    }
    Ok(())
}

/// Binds the CRI socket: parent dirs created, a stale socket (nobody
/// listening) replaced, a live one refused, and anything that is not a
/// socket left alone.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!(
                    "{} is in use: another daemon is serving on it",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(listener)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
