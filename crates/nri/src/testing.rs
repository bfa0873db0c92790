//! A test NRI plugin speaking the wire protocol a real plugin speaks
//! (ttrpc over the multiplexed socket, registering, answering Configure and
//! Synchronize, serving every event), for the crate's tests and the
//! daemon's. It records what it receives, in order, and can be told to
//! adjust containers, fail, hang or disconnect.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::api::*;
use crate::wire::{self, Code, Connection, Handler, Role, Status};

/// What the plugin does when it receives one kind of request.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Action {
    /// Answer normally.
    #[default]
    Answer,
    /// Answer with an error status carrying this message.
    Fail(String),
    /// Never answer.
    Hang,
    /// Answer normally, this long after the request came.
    Delay(Duration),
    /// Drop the connection instead of answering.
    Disconnect,
    /// Answer Unimplemented (as a plugin built against an older NRI).
    Unimplemented,
}

/// How the plugin behaves; can be changed while it runs.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Events to subscribe to (empty: every lifecycle event, not
    /// ValidateContainerAdjustment, as Go's stub for a plugin without a
    /// validator method).
    pub events: Vec<Event>,
    /// Returned for every CreateContainer.
    pub adjust: Option<ContainerAdjustment>,
    /// Updates of other containers, returned for CreateContainer.
    pub create_updates: Vec<ContainerUpdate>,
    /// Returned for UpdateContainer.
    pub update_updates: Vec<ContainerUpdate>,
    /// Returned for StopContainer.
    pub stop_updates: Vec<ContainerUpdate>,
    /// Returned from Synchronize.
    pub sync_updates: Vec<ContainerUpdate>,
    /// Answer to ValidateContainerAdjustment: `Some(reason)` rejects.
    pub reject: Option<String>,
    /// Special actions per method name ("CreateContainer", "Synchronize").
    pub actions: HashMap<String, Action>,
    /// How long Synchronize takes.
    pub sync_delay: Duration,
    /// Take behaviour from the Configure config (JSON, see [`FileConfig`]).
    pub from_config: bool,
}

/// Configuration a pre-installed test plugin reads from its drop-in file.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct FileConfig {
    /// Appends one line per request received: "<Method> <pod> <container>".
    pub log_file: Option<PathBuf>,
    /// Environment variables to add to every created container.
    pub adjust_env: HashMap<String, String>,
}

/// One request the plugin received.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// The method ("CreateContainer", "Configure", "Synchronize", ...).
    pub method: String,
    pub pod: Option<PodSandbox>,
    pub container: Option<Container>,
    pub configure: Option<ConfigureRequest>,
    pub sync: Option<SynchronizeRequest>,
    pub resources: Option<LinuxResources>,
    pub state_change: Option<Event>,
    /// When it arrived (to compare the order across plugins).
    pub at: Instant,
}

impl Received {
    pub fn pod_id(&self) -> &str {
        self.pod.as_ref().map_or("", |p| p.id.as_str())
    }
    pub fn container_id(&self) -> &str {
        self.container.as_ref().map_or("", |c| c.id.as_str())
    }
}

struct State {
    behaviour: Mutex<Behaviour>,
    received: Mutex<Vec<Received>>,
    changed: watch::Sender<usize>,
    conn: OnceLock<Connection>,
    log_file: Mutex<Option<PathBuf>>,
}

/// A running test plugin.
pub struct TestPlugin {
    state: Arc<State>,
    conn: Connection,
    pub name: String,
    pub index: String,
}

impl TestPlugin {
    /// Connects to the runtime's socket and registers; returns once the
    /// runtime configured the plugin (synchronization follows: see
    /// [`TestPlugin::wait_synchronized`]).
    pub async fn connect(
        socket: &Path,
        name: &str,
        index: &str,
        behaviour: Behaviour,
    ) -> Result<TestPlugin, String> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        TestPlugin::start(stream, name, index, behaviour).await
    }

    /// Registers over an already connected socket (a pre-installed plugin).
    pub async fn start(
        stream: UnixStream,
        name: &str,
        index: &str,
        behaviour: Behaviour,
    ) -> Result<TestPlugin, String> {
        let (changed, _) = watch::channel(0);
        let state = Arc::new(State {
            behaviour: Mutex::new(behaviour),
            received: Mutex::new(Vec::new()),
            changed,
            conn: OnceLock::new(),
            log_file: Mutex::new(None),
        });
        let conn = Connection::start(stream, Role::Plugin, Arc::new(PluginService(state.clone())));
        let _ = state.conn.set(conn.clone());
        let plugin = TestPlugin {
            state,
            conn,
            name: name.into(),
            index: index.into(),
        };
        let req = RegisterPluginRequest {
            plugin_name: name.into(),
            plugin_idx: index.into(),
            nri_version: NRI_VERSION.into(),
        };
        let _: Empty = plugin
            .conn
            .call(
                RUNTIME_SERVICE,
                "RegisterPlugin",
                &req,
                Duration::from_secs(5),
            )
            .await
            .map_err(|e| format!("RegisterPlugin: {e}"))?;
        plugin
            .wait_for(Duration::from_secs(10), |r| {
                r.iter().any(|x| x.method == "Configure")
            })
            .await?;
        Ok(plugin)
    }

    /// Waits until the runtime synchronized the plugin.
    pub async fn wait_synchronized(&self, timeout: Duration) -> Result<SynchronizeRequest, String> {
        self.wait_for(timeout, |r| {
            r.iter()
                .any(|x| x.method == "Synchronize" && !x.sync.as_ref().unwrap().more)
        })
        .await?;
        // Merge split requests as a plugin would.
        let mut all = SynchronizeRequest::default();
        for r in self
            .received()
            .into_iter()
            .filter(|r| r.method == "Synchronize")
        {
            let s = r.sync.unwrap();
            all.pods.extend(s.pods);
            all.containers.extend(s.containers);
        }
        Ok(all)
    }

    /// Everything received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// The lifecycle events received so far: (method, pod id, container id).
    pub fn events(&self) -> Vec<(String, String, String)> {
        self.received()
            .into_iter()
            .filter(|r| !matches!(r.method.as_str(), "Configure" | "Synchronize" | "Shutdown"))
            .map(|r| {
                let m = match r.state_change {
                    Some(e) => e.pretty_name().to_string(),
                    None => r.method.clone(),
                };
                (m, r.pod_id().to_string(), r.container_id().to_string())
            })
            .collect()
    }

    pub fn clear(&self) {
        self.state.received.lock().unwrap().clear();
    }

    /// Changes the behaviour for later requests.
    pub fn set_behaviour(&self, f: impl FnOnce(&mut Behaviour)) {
        f(&mut self.state.behaviour.lock().unwrap());
    }

    /// Waits until `cond` holds for the received requests.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        cond: impl Fn(&[Received]) -> bool,
    ) -> Result<(), String> {
        let mut rx = self.state.changed.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            if cond(&self.state.received.lock().unwrap()) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return Err(format!("timed out; received: {:?}", self.events()));
            }
        }
    }

    /// Asks the runtime for updates (and evictions) on the plugin's own
    /// initiative; returns the updates that failed.
    pub async fn update_containers(
        &self,
        update: Vec<ContainerUpdate>,
        evict: Vec<ContainerEviction>,
    ) -> Result<Vec<ContainerUpdate>, String> {
        let req = UpdateContainersRequest { update, evict };
        let rsp: UpdateContainersResponse = self
            .conn
            .call(
                RUNTIME_SERVICE,
                "UpdateContainers",
                &req,
                Duration::from_secs(10),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(rsp.failed)
    }

    /// Disconnects.
    pub fn close(&self) {
        self.conn.close();
    }

    pub fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    /// Waits until the connection is closed (by either side).
    pub async fn closed(&self) {
        self.conn.closed().await
    }
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        self.conn.close();
    }
}

struct PluginService(Arc<State>);

fn decode<M: prost::Message + Default>(payload: &[u8]) -> Result<M, Status> {
    M::decode(payload).map_err(|e| Status::new(Code::InvalidArgument, e.to_string()))
}

impl Handler for PluginService {
    fn handle(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
    ) -> wire::BoxFuture<Result<Vec<u8>, Status>> {
        let state = self.0.clone();
        let service = service.to_string();
        let method = method.to_string();
        Box::pin(async move {
            if service != PLUGIN_SERVICE {
                return Err(Status::new(
                    Code::Unimplemented,
                    format!("no service {service}"),
                ));
            }
            state.serve(&method, &payload).await
        })
    }
}

impl State {
    fn record(&self, r: Received) {
        if let Some(path) = self.log_file.lock().unwrap().as_ref()
            && let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(f, "{} {} {}", r.method, r.pod_id(), r.container_id());
        }
        let n = {
            let mut v = self.received.lock().unwrap();
            v.push(r);
            v.len()
        };
        self.changed.send_replace(n);
    }

    async fn serve(&self, method: &str, payload: &[u8]) -> Result<Vec<u8>, Status> {
        let mut rec = Received {
            method: method.to_string(),
            pod: None,
            container: None,
            configure: None,
            sync: None,
            resources: None,
            state_change: None,
            at: Instant::now(),
        };
        macro_rules! pod_ctr {
            ($t:ty) => {{
                let r: $t = decode(payload)?;
                rec.pod = r.pod;
                rec.container = r.container;
            }};
        }
        match method {
            "Configure" => {
                let r: ConfigureRequest = decode(payload)?;
                if self.behaviour.lock().unwrap().from_config && !r.config.is_empty() {
                    let fc: FileConfig = serde_json::from_str(&r.config).map_err(|e| {
                        Status::new(Code::InvalidArgument, format!("bad config: {e}"))
                    })?;
                    *self.log_file.lock().unwrap() = fc.log_file;
                    if !fc.adjust_env.is_empty() {
                        let mut env: Vec<_> = fc
                            .adjust_env
                            .into_iter()
                            .map(|(k, v)| KeyValue::new(k, v))
                            .collect();
                        env.sort_by(|a, b| a.key.cmp(&b.key));
                        self.behaviour.lock().unwrap().adjust = Some(ContainerAdjustment {
                            env,
                            ..Default::default()
                        });
                    }
                }
                rec.configure = Some(r);
            }
            "Synchronize" => rec.sync = Some(decode(payload)?),
            "Shutdown" => {}
            "RunPodSandbox" => rec.pod = decode::<RunPodSandboxRequest>(payload)?.pod,
            "StopPodSandbox" => rec.pod = decode::<StopPodSandboxRequest>(payload)?.pod,
            "RemovePodSandbox" => rec.pod = decode::<RemovePodSandboxRequest>(payload)?.pod,
            "UpdatePodSandbox" => {
                let r: UpdatePodSandboxRequest = decode(payload)?;
                rec.pod = r.pod;
                rec.resources = r.linux_resources;
            }
            "PostUpdatePodSandbox" => rec.pod = decode::<PostUpdatePodSandboxRequest>(payload)?.pod,
            "CreateContainer" => pod_ctr!(CreateContainerRequest),
            "PostCreateContainer" => pod_ctr!(PostCreateContainerRequest),
            "StartContainer" => pod_ctr!(StartContainerRequest),
            "PostStartContainer" => pod_ctr!(PostStartContainerRequest),
            "UpdateContainer" => {
                let r: UpdateContainerRequest = decode(payload)?;
                rec.pod = r.pod;
                rec.container = r.container;
                rec.resources = r.linux_resources;
            }
            "PostUpdateContainer" => pod_ctr!(PostUpdateContainerRequest),
            "StopContainer" => pod_ctr!(StopContainerRequest),
            "RemoveContainer" => pod_ctr!(RemoveContainerRequest),
            "StateChange" => {
                let r: StateChangeEvent = decode(payload)?;
                rec.state_change = Some(r.event());
                rec.pod = r.pod;
                rec.container = r.container;
            }
            "ValidateContainerAdjustment" => pod_ctr!(ValidateContainerAdjustmentRequest),
            m => return Err(Status::new(Code::Unimplemented, format!("no method {m}"))),
        }
        let behaviour = self.behaviour.lock().unwrap().clone();
        let action = behaviour.actions.get(method).cloned().unwrap_or_default();
        if action == Action::Unimplemented {
            return Err(Status::new(
                Code::Unimplemented,
                format!("{method} not implemented"),
            ));
        }
        self.record(rec);
        match action {
            Action::Answer | Action::Unimplemented => {}
            Action::Fail(msg) => return Err(Status::new(Code::Unknown, msg)),
            Action::Hang => std::future::pending::<()>().await,
            Action::Delay(d) => tokio::time::sleep(d).await,
            Action::Disconnect => {
                if let Some(c) = self.conn.get() {
                    c.close();
                }
                std::future::pending::<()>().await
            }
        }
        Ok(match method {
            "Configure" => {
                let mut mask = EventMask::of(&behaviour.events);
                if behaviour.events.is_empty() {
                    mask = EventMask(
                        EventMask::ALL.0 & !EventMask::of(&[Event::ValidateContainerAdjustment]).0,
                    );
                }
                ConfigureResponse { events: mask.0 }.encode_to_vec()
            }
            "Synchronize" => {
                tokio::time::sleep(behaviour.sync_delay).await;
                let r: SynchronizeRequest = decode(payload)?;
                if r.more {
                    SynchronizeResponse {
                        update: Vec::new(),
                        more: true,
                    }
                    .encode_to_vec()
                } else {
                    SynchronizeResponse {
                        update: behaviour.sync_updates,
                        more: false,
                    }
                    .encode_to_vec()
                }
            }
            "CreateContainer" => CreateContainerResponse {
                adjust: behaviour.adjust,
                update: behaviour.create_updates,
                evict: Vec::new(),
            }
            .encode_to_vec(),
            "UpdateContainer" => UpdateContainerResponse {
                update: behaviour.update_updates,
                evict: Vec::new(),
            }
            .encode_to_vec(),
            "StopContainer" => StopContainerResponse {
                update: behaviour.stop_updates,
            }
            .encode_to_vec(),
            "ValidateContainerAdjustment" => ValidateContainerAdjustmentResponse {
                reject: behaviour.reject.is_some(),
                reason: behaviour.reject.unwrap_or_default(),
            }
            .encode_to_vec(),
            // Every other answer is an empty message.
            _ => Vec::new(),
        })
    }
}
