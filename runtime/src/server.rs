//! The gRPC server on the CRI Unix socket, and its orderly shutdown; the
//! metrics endpoint, systemd's readiness notice, the SIGUSR1 state dump and
//! the SIGHUP config reload around it.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use crust_api::admin::v1::daemon_server::DaemonServer;
use crust_api::admin::v1::images_server::ImagesServer;
use crust_api::admin::v1::orphans_server::OrphansServer;
use crust_api::v1::image_service_server::ImageServiceServer;
use sd_notify::NotifyState;
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tracing::{info, warn};

use crate::api_version::ApiVersionLayer;
use crate::authority::AuthorityFixed;
use crate::config::{ConfigSource, LoadedConfig};
use crate::daemon::Daemon;
use crate::logging::LogControl;
use crate::metrics::Metrics;
use crate::metrics::grpc::RpcMetricsLayer;
use crate::metrics::health::Health;
use crate::otel::CriTraceLayer;
use crate::reload::Reloader;
use crate::services::{Admin, Cri, Operator, RuntimeServer};

/// How long in-flight calls get to finish after SIGTERM before the daemon
/// exits anyway (long-lived streams such as GetContainerEvents never finish).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(
    source: ConfigSource,
    loaded: LoadedConfig,
    log: LogControl,
) -> anyhow::Result<()> {
    let LoadedConfig { file, config } = loaded;
    let socket = config.socket.clone();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    // Up before recovery, so that /healthz says "starting" meanwhile.
    let metrics_address = match config.metrics.socket_addr()? {
        Some(addr) => {
            Some(crate::metrics::http::start(addr, metrics.clone(), health.clone()).await?)
        }
        None => None,
    };
    let daemon = Arc::new(Daemon::open(config, metrics.clone()).await?);
    metrics.set_node_counts({
        // Weak: the daemon holds the metrics.
        let daemon = Arc::downgrade(&daemon);
        Box::new(move || {
            daemon
                .upgrade()
                .map(|d| crate::introspect::counts(&d))
                .unwrap_or_default()
        })
    });
    start_streaming(&daemon).await?;
    crate::check::spawn_periodic(&daemon);
    crate::idle::spawn_idle_trim();
    // Handlers first: whoever sees the socket may signal at once, and a
    // SIGTERM before the handler exists would kill the daemon uncleanly.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    spawn_state_dumps(&daemon)?;
    let reloader = Arc::new(Reloader::new(source, &file, log.clone()));
    spawn_reloads(&daemon, reloader.clone())?;
    let listener = bind(&socket)?;
    let _remove_socket = RemoveOnDrop(socket.clone());
    info!(
        socket = %socket.display(),
        version = env!("CARGO_PKG_VERSION"),
        cgroups = ?daemon.cgroup_hierarchy,
        "crust is serving the CRI (runtime.v1, runtime.v1alpha2)"
    );

    let admin = Admin::new(
        daemon.clone(),
        Operator {
            log,
            reloader,
            health: health.clone(),
            metrics_address,
            started_at: std::time::SystemTime::now(),
        },
    );
    let tracing_on = daemon.config.tracing.enabled();
    let cri = Cri::new(daemon.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFixed::new));
    let server = tonic::transport::Server::builder()
        // Outermost: counts each call once, under the name it came with.
        .layer(RpcMetricsLayer::new(metrics))
        // Before the v1alpha2 rewrite too: a span is named as its call came.
        .layer(CriTraceLayer::new(tracing_on))
        .layer(ApiVersionLayer)
        .layer(crate::idle::ActivityLayer)
        .add_service(RuntimeServer::new(cri.clone()))
        .add_service(ImageServiceServer::new(cri))
        // crust's private admin API (`crust images`, `status`,
        // `log-level`), on the same socket.
        .add_service(ImagesServer::new(admin.clone()))
        .add_service(OrphansServer::new(admin.clone()))
        .add_service(DaemonServer::new(admin))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);
    health
        .serving(socket.clone())
        .with_context(|| format!("checking {}", socket.display()))?;
    // Under systemd (Type=notify): started once recovery is done and the
    // socket serves. Children never see NOTIFY_SOCKET: every spawn path
    // (monitor, CNI, OCI CLI) clears the environment.
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready]) {
        warn!("cannot tell systemd that crust is ready: {e}");
    }

    tokio::select! {
        res = &mut server => return res.context("gRPC server failed"),
        _ = term.recv() => info!("SIGTERM: finishing in-flight calls"),
        _ = int.recv() => info!("SIGINT: finishing in-flight calls"),
    }
    health.stopping();
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
    let _ = stop_tx.send(());
    match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
        Ok(res) => res.context("gRPC server failed")?,
        Err(_) => warn!("calls still open after {DRAIN_TIMEOUT:?}; exiting anyway"),
    }
    daemon.lifecycle.shutdown().await;
    info!("stopped");
    Ok(())
}

/// Writes the daemon's state to the log on every SIGUSR1 (as containerd
/// dumps its state): at warn, so that it shows at any usual level.
fn spawn_state_dumps(daemon: &Arc<Daemon>) -> anyhow::Result<()> {
    let mut usr1 = signal(SignalKind::user_defined1()).context("SIGUSR1 handler")?;
    let daemon = Arc::downgrade(daemon);
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            let Some(d) = daemon.upgrade() else { return };
            let dump = crate::introspect::dump(&d);
            warn!("state dump (SIGUSR1):\n{dump}");
        }
    });
    Ok(())
}

/// Reloads the config on every SIGHUP (as CRI-O does); the outcome goes to
/// the log (`crust reload` answers it). Without this handler SIGHUP would
/// end the daemon.
fn spawn_reloads(daemon: &Arc<Daemon>, reloader: Arc<Reloader>) -> anyhow::Result<()> {
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let daemon = Arc::downgrade(daemon);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let Some(d) = daemon.upgrade() else { return };
            info!("SIGHUP: reloading the config");
            // The outcome is logged by the reload itself.
            let _ = reloader.reload(&d).await;
        }
    });
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
        daemon.sessions.clone(),
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

/// tonic reads a connection's peer (for the admin API's root check)
/// through the adapter from the socket under it.
impl tonic::transport::server::Connected for AuthorityFixed<tokio::net::UnixStream> {
    type ConnectInfo = tonic::transport::server::UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().connect_info()
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
