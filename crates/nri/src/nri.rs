//! The runtime-facing NRI handle: plugin registry, registration and
//! synchronization, and one call per lifecycle event.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use prost::Message as _;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;

use crate::api::*;
use crate::config::Config;
use crate::error::NriError;
use crate::merge::{CreateMerge, CreateResult, UpdateMerge, UpdateResult};
use crate::plugin::{Plugin, invocation_order};
use crate::wire::{self, CallError, Code, Connection, Handler, Role, Status};

/// A boxed future, for [`RuntimeBackend`]'s methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What NRI needs from the runtime.
pub trait RuntimeBackend: Send + Sync + 'static {
    /// Every pod and container the runtime has, for a newly registered
    /// plugin. Called while lifecycle calls are held off (see
    /// [`Nri::block_plugin_sync`]): it must not wait for a [`SyncBlock`].
    fn snapshot(&self) -> BoxFuture<'_, Snapshot>;
    /// Applies resource updates plugins asked for (unsolicited, or while
    /// synchronizing); returns the ones that could not be applied.
    fn update_containers(
        &self,
        updates: Vec<ContainerUpdate>,
    ) -> BoxFuture<'_, Vec<ContainerUpdate>>;
    /// Stops containers plugins asked to evict; returns the ones that could
    /// not be stopped.
    fn evict_containers(
        &self,
        evictions: Vec<ContainerEviction>,
    ) -> BoxFuture<'_, Vec<ContainerEviction>>;
}

/// The runtime's pods and containers.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub pods: Vec<SnapshotPod>,
    /// Containers with `state` set.
    pub containers: Vec<Container>,
}

/// A pod, and whether it is still ready (not stopped).
#[derive(Debug, Clone)]
pub struct SnapshotPod {
    pub pod: PodSandbox,
    pub ready: bool,
}

/// Name and version plugins are told in Configure.
#[derive(Debug, Clone)]
pub struct RuntimeInfo {
    pub name: String,
    pub version: String,
}

/// A registered plugin, for logs and status.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// "NN-name".
    pub name: String,
    pub index: String,
    pub events: EventMask,
    /// Connected through the socket (not started by the runtime).
    pub external: bool,
    pub pid: Option<i32>,
}

/// Held by a lifecycle operation from before its NRI call until its effect
/// is visible in what [`RuntimeBackend::snapshot`] returns; a plugin's
/// synchronization waits for it, and it waits for a synchronization in
/// progress. Thus a plugin either finds a container in its snapshot or is
/// registered in time to receive the container's event: none is missed.
pub struct SyncBlock {
    _guard: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
}

/// What plugins were told about a pod or container, so that Stop and
/// Remove reach them exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Created,
    Running,
    Stopped,
}

struct Inner {
    config: Config,
    /// `plugin_registration_timeout` and `plugin_request_timeout` in force,
    /// in milliseconds ([`Nri::set_timeouts`] changes them).
    registration_timeout_ms: AtomicU64,
    request_timeout_ms: AtomicU64,
    runtime: RuntimeInfo,
    backend: Arc<dyn RuntimeBackend>,
    plugins: RwLock<Arc<[Arc<Plugin>]>>,
    /// Names of plugins between RegisterPlugin and the end of their
    /// synchronization (for the duplicate check).
    registering: Mutex<HashSet<String>>,
    sync_lock: Arc<tokio::sync::RwLock<()>>,
    states: Mutex<HashMap<String, State>>,
    next_id: AtomicU64,
    listener: Mutex<Option<(tokio::task::JoinHandle<()>, PathBuf)>>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The registered plugins in invocation order (cheap to clone).
type PluginList = Arc<[Arc<Plugin>]>;

/// The NRI adaptation of one runtime. Clones share it.
#[derive(Clone)]
pub struct Nri {
    inner: Option<Arc<Inner>>,
}

impl Nri {
    /// NRI switched off: every call is a no-op.
    pub fn disabled() -> Nri {
        Nri { inner: None }
    }

    /// Starts NRI as `config` says: pre-installed plugins are started,
    /// registered and synchronized before this returns (each within the
    /// registration timeout; one that fails is logged and left out), then
    /// the socket is served unless `disable_connections`.
    pub async fn start(
        config: Config,
        runtime: RuntimeInfo,
        backend: Arc<dyn RuntimeBackend>,
    ) -> Result<Nri, NriError> {
        if !config.enable {
            return Ok(Nri::disabled());
        }
        config.validate().map_err(NriError::Config)?;
        let inner = Arc::new(Inner {
            registration_timeout_ms: AtomicU64::new(millis(config.plugin_registration_timeout)),
            request_timeout_ms: AtomicU64::new(millis(config.plugin_request_timeout)),
            config,
            runtime,
            backend,
            plugins: RwLock::new(Arc::from(Vec::new())),
            registering: Mutex::new(HashSet::new()),
            sync_lock: Arc::new(tokio::sync::RwLock::new(())),
            states: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            listener: Mutex::new(None),
        });

        let found =
            crate::launch::discover(&inner.config.plugin_path, &inner.config.plugin_config_path)
                .map_err(|e| {
                    NriError::Config(format!(
                        "plugin_path {}: {e}",
                        inner.config.plugin_path.display()
                    ))
                })?;
        let mut admissions = tokio::task::JoinSet::new();
        for p in found {
            match crate::launch::start(&p) {
                Ok((child, stream)) => {
                    let inner = inner.clone();
                    admissions.spawn(async move {
                        let name = format!("{}-{}", p.index, p.base);
                        let pre = Preinstalled { index: p.index, base: p.base, config: p.config, child };
                        if let Err(e) = admit(inner, stream, Some(pre)).await {
                            tracing::warn!(plugin = %name, "pre-installed NRI plugin not started: {e}");
                        }
                    });
                }
                Err(e) => tracing::warn!(path = %p.path.display(), "cannot start NRI plugin: {e}"),
            }
        }
        while admissions.join_next().await.is_some() {}

        if !inner.config.disable_connections {
            let path = inner.config.socket_path.clone();
            let listener = listen(&path)?;
            let task = tokio::spawn(accept_loop(Arc::downgrade(&inner), listener));
            *inner.listener.lock().unwrap() = Some((task, path));
        }
        Ok(Nri { inner: Some(inner) })
    }

    /// New registration and request timeouts (a config reload), for the
    /// registrations and requests from now on. Plugins were told the
    /// timeouts when they registered (Configure) and are not told again.
    pub fn set_timeouts(&self, registration: Duration, request: Duration) {
        let Some(inner) = &self.inner else { return };
        inner
            .registration_timeout_ms
            .store(millis(registration), Ordering::Relaxed);
        inner
            .request_timeout_ms
            .store(millis(request), Ordering::Relaxed);
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether some plugin is registered: a runtime may skip gathering
    /// what only plugins would be shown. (Under a [`SyncBlock`] no plugin
    /// can become registered.)
    pub fn has_plugins(&self) -> bool {
        self.active().is_some()
    }

    /// The registered plugins, in invocation order.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        let Some(inner) = &self.inner else {
            return Vec::new();
        };
        inner
            .current()
            .iter()
            .map(|p| PluginInfo {
                name: p.name.clone(),
                index: p.index.clone(),
                events: p.events,
                external: p.external(),
                pid: p.pid,
            })
            .collect()
    }

    /// Holds plugin synchronization off; see [`SyncBlock`]. Take it in
    /// RunPodSandbox, CreateContainer, StartContainer, StopContainer,
    /// RemoveContainer, StopPodSandbox and RemovePodSandbox before the NRI
    /// call and drop it once the store reflects the change. Never hold it
    /// while waiting for another CRI call.
    pub async fn block_plugin_sync(&self) -> SyncBlock {
        match &self.inner {
            None => SyncBlock { _guard: None },
            Some(inner) => SyncBlock {
                _guard: Some(inner.sync_lock.clone().read_owned().await),
            },
        }
    }

    /// Asks the remaining plugins to shut down, disconnects them, stops the
    /// ones the runtime started and removes the socket.
    pub async fn shutdown(&self) {
        let Some(inner) = &self.inner else { return };
        if let Some((task, path)) = inner.listener.lock().unwrap().take() {
            task.abort();
            let _ = std::fs::remove_file(path);
        }
        let plugins = inner.current();
        let timeout = inner.request_timeout();
        let mut calls = tokio::task::JoinSet::new();
        for p in plugins.iter() {
            let p = p.clone();
            calls.spawn(async move {
                let _: Result<Empty, _> = p.call("Shutdown", &Empty {}, timeout).await;
                p.stop();
            });
        }
        while calls.join_next().await.is_some() {}
        *inner.plugins.write().unwrap() = Arc::from(Vec::new());
    }

    // ---- pod lifecycle -------------------------------------------------

    /// RunPodSandbox: call after the pod is set up (namespaces, network,
    /// cgroup) and before it is visible in List/Status or accepts
    /// containers. On error, plugins have already been sent StopPodSandbox
    /// and RemovePodSandbox; the runtime tears the pod down and fails the
    /// CRI call. `pod` is only called if some plugin subscribed.
    pub async fn run_pod_sandbox(&self, pod: impl FnOnce() -> PodSandbox) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(());
        };
        let pod = pod();
        inner.set_state(&pod.id, State::Running);
        let req = RunPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        let result = inner
            .notify(
                &plugins,
                Event::RunPodSandbox,
                "RunPodSandbox",
                &req,
                Some(&pod),
                None,
            )
            .await;
        if result.is_err() {
            let _ = self.stop_pod_sandbox(|| pod.clone()).await;
            let _ = self.remove_pod_sandbox(|| pod).await;
        }
        result
    }

    /// UpdatePodSandboxResources, before the pod's resources change.
    pub async fn update_pod_sandbox(
        &self,
        req: impl FnOnce() -> (PodSandbox, Option<LinuxResources>, Option<LinuxResources>),
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.subscribed(Event::UpdatePodSandbox) else {
            return Ok(());
        };
        let (pod, overhead, resources) = req();
        let req = UpdatePodSandboxRequest {
            pod: Some(pod),
            overhead_linux_resources: overhead,
            linux_resources: resources,
        };
        for p in plugins.iter() {
            let _: Option<UpdatePodSandboxResponse> =
                inner.call(p, Event::UpdatePodSandbox, &req).await?;
        }
        Ok(())
    }

    /// After the pod's resources changed.
    pub async fn post_update_pod_sandbox(
        &self,
        pod: impl FnOnce() -> PodSandbox,
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.subscribed(Event::PostUpdatePodSandbox) else {
            return Ok(());
        };
        let pod = pod();
        let req = PostUpdatePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::PostUpdatePodSandbox,
                "PostUpdatePodSandbox",
                &req,
                Some(&pod),
                None,
            )
            .await
    }

    /// StopPodSandbox: call after every container of the pod is stopped and
    /// while the pod is still inspectable (Status/List), before its
    /// namespaces and network go. Sent once per pod: later calls (a
    /// repeated StopPodSandbox, RemovePodSandbox of a stopped pod) are
    /// no-ops.
    pub async fn stop_pod_sandbox(&self, pod: impl FnOnce() -> PodSandbox) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(());
        };
        let pod = pod();
        if !inner.begin_stop(&pod.id) {
            return Ok(());
        }
        let req = StopPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::StopPodSandbox,
                "StopPodSandbox",
                &req,
                Some(&pod),
                None,
            )
            .await
    }

    /// RemovePodSandbox: call once the pod is gone. Sent once per pod.
    pub async fn remove_pod_sandbox(
        &self,
        pod: impl FnOnce() -> PodSandbox,
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(());
        };
        let pod = pod();
        if inner.begin_remove(&pod.id).is_none() {
            return Ok(());
        }
        let req = RemovePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::RemovePodSandbox,
                "RemovePodSandbox",
                &req,
                Some(&pod),
                None,
            )
            .await
    }

    // ---- container lifecycle -------------------------------------------

    /// CreateContainer: call with the container as its OCI spec stands
    /// (ID assigned, not yet visible in List/Status, nothing created on the
    /// host that a failure could leak), then apply `adjust` to the spec
    /// (see [`crate::spec::apply_adjustment`]) and `updates`/`evictions`
    /// through the runtime's own update path. On error plugins have been
    /// sent StopContainer and RemoveContainer; if creation fails later, call
    /// [`Nri::undo_create_container`].
    pub async fn create_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<CreateResult, NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(CreateResult::default());
        };
        let (pod, container) = req();
        inner.set_state(&container.id, State::Created);
        let result = inner
            .create_container(&plugins, &pod, container.clone())
            .await;
        if result.is_err() {
            self.undo_create_container(|| (pod, container)).await;
        }
        result
    }

    /// Tells plugins a container whose CreateContainer they saw will not
    /// exist after all (StopContainer then RemoveContainer, errors logged).
    pub async fn undo_create_container(&self, req: impl FnOnce() -> (PodSandbox, Container)) {
        let Some((inner, _)) = self.active() else {
            return;
        };
        let (pod, container) = req();
        if !inner.needs_removal(&container.id) {
            return;
        }
        if let Err(e) = self
            .stop_container(|| (pod.clone(), container.clone()))
            .await
        {
            tracing::warn!(container = %container.id, "NRI undo of container creation (stop): {e}");
        }
        if let Err(e) = self.remove_container(|| (pod, container.clone())).await {
            tracing::warn!(container = %container.id, "NRI undo of container creation (remove): {e}");
        }
    }

    /// After the container was created (visible, state CREATED).
    pub async fn post_create_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.subscribed(Event::PostCreateContainer) else {
            return Ok(());
        };
        let (pod, c) = req();
        let r = PostCreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::PostCreateContainer,
                "PostCreateContainer",
                &r,
                Some(&pod),
                Some(&c),
            )
            .await
    }

    /// StartContainer: right before the container's process is started. On
    /// error the runtime does not start it and fails the CRI call.
    pub async fn start_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(());
        };
        let (pod, c) = req();
        inner.set_state(&c.id, State::Running);
        let r = StartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::StartContainer,
                "StartContainer",
                &r,
                Some(&pod),
                Some(&c),
            )
            .await
    }

    /// After the container started.
    pub async fn post_start_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.subscribed(Event::PostStartContainer) else {
            return Ok(());
        };
        let (pod, c) = req();
        let r = PostStartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::PostStartContainer,
                "PostStartContainer",
                &r,
                Some(&pod),
                Some(&c),
            )
            .await
    }

    /// UpdateContainerResources: before applying `resources`; apply the
    /// returned `resources` instead (plugins may have changed them) and the
    /// `updates` to other containers.
    pub async fn update_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container, LinuxResources),
    ) -> Result<Option<UpdateResult>, NriError> {
        let Some((inner, plugins)) = self.subscribed(Event::UpdateContainer) else {
            return Ok(None);
        };
        let (pod, c, resources) = req();
        let mut merge = UpdateMerge::for_update(c.id.clone(), resources);
        for p in plugins.iter() {
            let r = UpdateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(c.clone()),
                linux_resources: merge.requested_resources().cloned(),
            };
            if let Some(rsp) = inner
                .call::<_, UpdateContainerResponse>(p, Event::UpdateContainer, &r)
                .await?
            {
                merge.apply(&rsp.update, rsp.evict, &p.name)?;
            }
        }
        Ok(Some(merge.finish()))
    }

    /// After the container's resources changed.
    pub async fn post_update_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.subscribed(Event::PostUpdateContainer) else {
            return Ok(());
        };
        let (pod, c) = req();
        let r = PostUpdateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::PostUpdateContainer,
                "PostUpdateContainer",
                &r,
                Some(&pod),
                Some(&c),
            )
            .await
    }

    /// StopContainer: after the container stopped (by StopContainer, or by
    /// StopPodSandbox/RemoveContainer). Sent once per container; the
    /// returned updates are for the remaining containers.
    pub async fn stop_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<Vec<ContainerUpdate>, NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(Vec::new());
        };
        let (pod, c) = req();
        if !inner.begin_stop(&c.id) {
            return Ok(Vec::new());
        }
        inner.stop_container(&plugins, pod, c).await
    }

    /// A container exited on its own: plugins get StopContainer (once; a
    /// later stop_container is then a no-op). Updates plugins ask for are
    /// applied through the backend. Call it from the exit monitor.
    pub async fn notify_container_exit(&self, req: impl FnOnce() -> (PodSandbox, Container)) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        match self.stop_container(req).await {
            Ok(updates) if !updates.is_empty() => {
                let failed = inner.backend.update_containers(updates).await;
                if !failed.is_empty() {
                    tracing::warn!(
                        count = failed.len(),
                        "NRI post-stop container updates failed"
                    );
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("NRI StopContainer for an exited container: {e}"),
        }
    }

    /// RemoveContainer: after the container is gone. Plugins that were not
    /// yet told it stopped get StopContainer first. Sent once.
    pub async fn remove_container(
        &self,
        req: impl FnOnce() -> (PodSandbox, Container),
    ) -> Result<(), NriError> {
        let Some((inner, plugins)) = self.active() else {
            return Ok(());
        };
        let (pod, c) = req();
        let Some(was) = inner.begin_remove(&c.id) else {
            return Ok(());
        };
        if matches!(was, State::Created | State::Running)
            && let Err(e) = inner.stop_container(&plugins, pod.clone(), c.clone()).await
        {
            tracing::warn!(container = %c.id, "NRI StopContainer before removal: {e}");
        }
        let r = RemoveContainerRequest {
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        };
        inner
            .notify(
                &plugins,
                Event::RemoveContainer,
                "RemoveContainer",
                &r,
                Some(&pod),
                Some(&c),
            )
            .await
    }

    /// The plugins, if any is registered (the cheap no-op check).
    fn active(&self) -> Option<(&Arc<Inner>, PluginList)> {
        let inner = self.inner.as_ref()?;
        let plugins = inner.current();
        (!plugins.is_empty()).then_some((inner, plugins))
    }

    /// The plugins subscribed to `event`, if any.
    fn subscribed(&self, event: Event) -> Option<(&Arc<Inner>, Vec<Arc<Plugin>>)> {
        let (inner, plugins) = self.active()?;
        let list: Vec<_> = plugins
            .iter()
            .filter(|p| p.events.is_set(event))
            .cloned()
            .collect();
        (!list.is_empty()).then_some((inner, list))
    }
}

struct Preinstalled {
    index: String,
    base: String,
    config: String,
    child: tokio::process::Child,
}

impl Inner {
    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed))
    }

    fn registration_timeout(&self) -> Duration {
        Duration::from_millis(self.registration_timeout_ms.load(Ordering::Relaxed))
    }

    fn current(&self) -> Arc<[Arc<Plugin>]> {
        self.plugins.read().unwrap().clone()
    }

    fn remove_plugin(&self, id: u64) {
        let mut list = self.plugins.write().unwrap();
        if let Some(p) = list.iter().find(|p| p.id == id) {
            tracing::info!(plugin = %p.name, "NRI plugin disconnected");
            p.stop();
        } else {
            return;
        }
        let kept: Vec<_> = list.iter().filter(|p| p.id != id).cloned().collect();
        if kept.is_empty() {
            // Nobody to keep consistent: the next plugin starts from a snapshot.
            self.states.lock().unwrap().clear();
        }
        *list = Arc::from(kept);
    }

    fn set_state(&self, id: &str, s: State) {
        self.states.lock().unwrap().insert(id.to_string(), s);
    }

    /// Marks a pod or container stopped; true if plugins are yet to be
    /// told (it was created or running). Check and mark are one step, so
    /// that of two concurrent stops (StopContainer and the exit watcher)
    /// exactly one sends the event.
    fn begin_stop(&self, id: &str) -> bool {
        match self.states.lock().unwrap().get_mut(id) {
            Some(s @ (State::Created | State::Running)) => {
                *s = State::Stopped;
                true
            }
            _ => false,
        }
    }

    /// Forgets a pod or container; its state if plugins are yet to be told
    /// of its removal (one step, as [`Inner::begin_stop`]).
    fn begin_remove(&self, id: &str) -> Option<State> {
        self.states.lock().unwrap().remove(id)
    }

    fn needs_removal(&self, id: &str) -> bool {
        self.states.lock().unwrap().contains_key(id)
    }

    /// One request to one plugin. `Ok(None)`: the plugin is gone (timed
    /// out, disconnected, broke the protocol) and was removed; the call
    /// goes on without it, as in NRI. A plugin's error answer fails it.
    async fn call<Req, Resp>(
        &self,
        p: &Plugin,
        event: Event,
        req: &Req,
    ) -> Result<Option<Resp>, NriError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        match p
            .call(event.pretty_name(), req, self.request_timeout())
            .await
        {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.is_fatal() => {
                tracing::warn!(plugin = %p.name, event = event.pretty_name(), "closing NRI plugin: {e}");
                self.remove_plugin(p.id);
                Ok(None)
            }
            Err(e) => Err(NriError::PluginFailed {
                plugin: p.name.clone(),
                event: event.pretty_name(),
                message: e.to_string(),
            }),
        }
    }

    /// A pure notification to every plugin subscribed to `event`; plugins
    /// that do not implement the dedicated method get StateChange instead.
    async fn notify<Req: prost::Message>(
        &self,
        plugins: &[Arc<Plugin>],
        event: Event,
        method: &'static str,
        req: &Req,
        pod: Option<&PodSandbox>,
        container: Option<&Container>,
    ) -> Result<(), NriError> {
        for p in plugins.iter().filter(|p| p.events.is_set(event)) {
            match p
                .call::<_, Empty>(method, req, self.request_timeout())
                .await
            {
                Ok(_) => {}
                Err(CallError::Status(s)) if s.code == Code::Unimplemented as i32 => {
                    let change = StateChangeEvent {
                        event: event as i32,
                        pod: pod.cloned(),
                        container: container.cloned(),
                    };
                    match p
                        .call::<_, Empty>("StateChange", &change, self.request_timeout())
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if e.is_fatal() => {
                            tracing::warn!(plugin = %p.name, event = method, "closing NRI plugin: {e}");
                            self.remove_plugin(p.id);
                        }
                        Err(e) => {
                            return Err(NriError::PluginFailed {
                                plugin: p.name.clone(),
                                event: event.pretty_name(),
                                message: e.to_string(),
                            });
                        }
                    }
                }
                Err(e) if e.is_fatal() => {
                    tracing::warn!(plugin = %p.name, event = method, "closing NRI plugin: {e}");
                    self.remove_plugin(p.id);
                }
                Err(e) => {
                    return Err(NriError::PluginFailed {
                        plugin: p.name.clone(),
                        event: event.pretty_name(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    async fn create_container(
        &self,
        plugins: &[Arc<Plugin>],
        pod: &PodSandbox,
        container: Container,
    ) -> Result<CreateResult, NriError> {
        let pristine = container.clone();
        let mut merge = CreateMerge::new(container);
        let mut consulted = Vec::new();
        for p in plugins
            .iter()
            .filter(|p| p.events.is_set(Event::CreateContainer))
        {
            consulted.push(PluginInstance {
                name: p.base.clone(),
                index: p.index.clone(),
            });
            let req = CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(merge.container.clone()),
            };
            if let Some(rsp) = self
                .call::<_, CreateContainerResponse>(p, Event::CreateContainer, &req)
                .await?
            {
                merge.apply(rsp, &p.name)?;
            }
        }
        let validators: Vec<_> = plugins
            .iter()
            .filter(|p| p.events.is_set(Event::ValidateContainerAdjustment))
            .cloned()
            .collect();
        if !validators.is_empty() {
            let req = ValidateContainerAdjustmentRequest {
                pod: Some(pod.clone()),
                container: Some(pristine.clone()),
                adjust: merge.adjustment().cloned(),
                update: merge.updates_snapshot(),
                owners: Some(merge.owners.0.clone()),
                plugins: consulted,
            };
            let mut checks = tokio::task::JoinSet::new();
            for v in validators {
                let req = req.clone();
                let timeout = self.request_timeout();
                checks.spawn(async move {
                    let r: Result<ValidateContainerAdjustmentResponse, CallError> =
                        v.call("ValidateContainerAdjustment", &req, timeout).await;
                    (v, r)
                });
            }
            while let Some(Ok((v, r))) = checks.join_next().await {
                match r {
                    Ok(rsp) if rsp.reject => {
                        return Err(NriError::Rejected {
                            plugin: v.name.clone(),
                            container: pristine.id,
                            reason: rsp.reason,
                        });
                    }
                    Ok(_) => {}
                    Err(e) => {
                        // Unlike hooks, a validator that cannot answer fails
                        // the creation (NRI: the adjustment is not validated).
                        if e.is_fatal() {
                            self.remove_plugin(v.id);
                        }
                        return Err(NriError::PluginFailed {
                            plugin: v.name.clone(),
                            event: "ValidateContainerAdjustment",
                            message: e.to_string(),
                        });
                    }
                }
            }
        }
        Ok(merge.finish())
    }

    async fn stop_container(
        &self,
        plugins: &[Arc<Plugin>],
        pod: PodSandbox,
        c: Container,
    ) -> Result<Vec<ContainerUpdate>, NriError> {
        let mut merge = UpdateMerge::for_stop();
        let req = StopContainerRequest {
            pod: Some(pod),
            container: Some(c),
        };
        for p in plugins
            .iter()
            .filter(|p| p.events.is_set(Event::StopContainer))
        {
            if let Some(rsp) = self
                .call::<_, StopContainerResponse>(p, Event::StopContainer, &req)
                .await?
            {
                merge.apply(&rsp.update, Vec::new(), &p.name)?;
            }
        }
        Ok(merge.finish().updates)
    }
}

/// Binds the socket root-only: bound under a temporary name, made 0600,
/// then renamed into place, so it is never reachable with wider access.
fn listen(path: &Path) -> Result<UnixListener, NriError> {
    let err = |source| NriError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(err(std::io::Error::other("exists and is not a socket")));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(NriError::SocketInUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(err)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(err)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    Ok(listener)
}

async fn accept_loop(inner: Weak<Inner>, listener: UnixListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("NRI socket accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(inner) = inner.upgrade() else { return };
        tokio::spawn(async move {
            if let Err(e) = admit(inner, stream, None).await {
                tracing::warn!("NRI plugin not registered: {e}");
            }
        });
    }
}

/// What the runtime serves a plugin: RegisterPlugin and UpdateContainers.
struct RuntimeService {
    inner: Weak<Inner>,
    /// The file name identity of a pre-installed plugin.
    preset: Option<(String, String)>,
    registered: Mutex<Option<oneshot::Sender<(String, String)>>>,
}

impl Handler for RuntimeService {
    fn handle(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
    ) -> wire::BoxFuture<Result<Vec<u8>, Status>> {
        if service != RUNTIME_SERVICE {
            let msg = format!("service {} is not served", crate::quote(service));
            return Box::pin(async move { Err(Status::new(Code::Unimplemented, msg)) });
        }
        match method {
            "RegisterPlugin" => {
                let r = self.register(&payload);
                Box::pin(async move { r.map(|_| Empty {}.encode_to_vec()) })
            }
            "UpdateContainers" => {
                let inner = self.inner.clone();
                Box::pin(async move {
                    let req = UpdateContainersRequest::decode(payload.as_slice()).map_err(|e| {
                        Status::new(
                            Code::InvalidArgument,
                            format!("bad UpdateContainersRequest: {e}"),
                        )
                    })?;
                    let Some(inner) = inner.upgrade() else {
                        return Err(Status::new(Code::Unknown, "runtime is shutting down"));
                    };
                    let failed = if req.update.is_empty() {
                        Vec::new()
                    } else {
                        inner.backend.update_containers(req.update).await
                    };
                    if !req.evict.is_empty() {
                        let not = inner.backend.evict_containers(req.evict).await;
                        if !not.is_empty() {
                            tracing::warn!(count = not.len(), "NRI evictions failed");
                        }
                    }
                    Ok(UpdateContainersResponse { failed }.encode_to_vec())
                })
            }
            m => {
                let msg = format!("method {} is not served", crate::quote(m));
                Box::pin(async move { Err(Status::new(Code::Unimplemented, msg)) })
            }
        }
    }
}

impl RuntimeService {
    fn register(&self, payload: &[u8]) -> Result<(), Status> {
        let req = RegisterPluginRequest::decode(payload).map_err(|e| {
            Status::new(
                Code::InvalidArgument,
                format!("bad RegisterPluginRequest: {e}"),
            )
        })?;
        // The sender is taken only once the registration is accepted: a
        // refused plugin gets its error answer (dropping the sender would
        // close the connection, maybe before the answer is out) and then
        // disconnects, or is dropped at the registration timeout.
        let mut slot = self.registered.lock().unwrap();
        if slot.is_none() {
            return Err(Status::new(
                Code::FailedPrecondition,
                "plugin is already registered",
            ));
        }
        let (index, base) = match &self.preset {
            Some(p) => p.clone(),
            None => {
                check_plugin_name(&req.plugin_name)
                    .map_err(|e| Status::new(Code::InvalidArgument, e))?;
                check_plugin_index(&req.plugin_idx)
                    .map_err(|e| Status::new(Code::InvalidArgument, e))?;
                (req.plugin_idx, req.plugin_name)
            }
        };
        let name = format!("{index}-{base}");
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| Status::new(Code::Unknown, "runtime is shutting down"))?;
        let mut registering = inner.registering.lock().unwrap();
        if registering.contains(&name) || inner.current().iter().any(|p| p.name == name) {
            return Err(Status::new(
                Code::AlreadyExists,
                format!("plugin {name} is already registered"),
            ));
        }
        registering.insert(name);
        if let Some(tx) = slot.take() {
            let _ = tx.send((index, base));
        }
        Ok(())
    }
}

/// Takes a connected plugin through registration, configuration and
/// synchronization, then adds it to the plugins called for events.
async fn admit(
    inner: Arc<Inner>,
    stream: UnixStream,
    pre: Option<Preinstalled>,
) -> Result<(), String> {
    let (tx, rx) = oneshot::channel();
    let (preset, config, mut child) = match pre {
        Some(p) => (Some((p.index, p.base)), p.config, Some(p.child)),
        None => (None, String::new(), None),
    };
    // A socket pair's peer credentials are our own: ask the child instead.
    let pid = match &child {
        Some(c) => c.id().and_then(|id| i32::try_from(id).ok()),
        None => Connection::peer_pid(&stream),
    };
    let service = Arc::new(RuntimeService {
        inner: Arc::downgrade(&inner),
        preset,
        registered: Mutex::new(Some(tx)),
    });
    let conn = Connection::start(stream, Role::Runtime, service);

    let reg_timeout = inner.registration_timeout();
    let registered = tokio::select! {
        r = tokio::time::timeout(reg_timeout, rx) => match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err("connection closed before registration".to_string()),
            Err(_) => Err(format!("registration timed out after {reg_timeout:?}")),
        },
        _ = conn.closed() => Err("connection closed before registration".to_string()),
    };
    let (index, base) = match registered {
        Ok(v) => v,
        Err(e) => {
            conn.close();
            if let Some(c) = child.as_mut() {
                let _ = c.start_kill();
            }
            return Err(e);
        }
    };
    let name = format!("{index}-{base}");
    let result = match configure(&inner, &conn, config).await {
        Ok(events) => {
            let plugin = Arc::new(Plugin {
                id: inner.next_id.fetch_add(1, Ordering::Relaxed),
                index,
                base,
                name: name.clone(),
                events,
                conn: conn.clone(),
                pid,
                child: Mutex::new(child.take()),
            });
            let r = sync_and_add(&inner, &plugin).await;
            if r.is_err() {
                plugin.stop();
            }
            r
        }
        Err(e) => Err(e),
    };
    inner.registering.lock().unwrap().remove(&name);
    if let Err(e) = result {
        conn.close();
        if let Some(c) = child.as_mut() {
            let _ = c.start_kill();
        }
        return Err(format!("plugin {name}: {e}"));
    }
    tracing::info!(plugin = %name, pid = ?pid, "NRI plugin registered and synchronized");

    // Drop it from the invocation list as soon as it disconnects.
    let weak = Arc::downgrade(&inner);
    let id = inner
        .current()
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.id);
    drop(inner);
    tokio::spawn(async move {
        conn.closed().await;
        if let (Some(inner), Some(id)) = (weak.upgrade(), id) {
            inner.remove_plugin(id);
        }
    });
    Ok(())
}

/// Configure: hands the plugin its configuration, returns its events.
async fn configure(inner: &Inner, conn: &Connection, config: String) -> Result<EventMask, String> {
    let req = ConfigureRequest {
        config,
        runtime_name: inner.runtime.name.clone(),
        runtime_version: inner.runtime.version.clone(),
        registration_timeout: inner.registration_timeout().as_millis() as i64,
        request_timeout: inner.request_timeout().as_millis() as i64,
        nri_version: NRI_VERSION.to_string(),
    };
    let rsp: ConfigureResponse = conn
        .call(PLUGIN_SERVICE, "Configure", &req, inner.request_timeout())
        .await
        .map_err(|e| format!("Configure failed: {e}"))?;
    match rsp.events {
        0 => Ok(EventMask::ALL),
        e if e & !EventMask::ALL.0 != 0 => Err(format!(
            "invalid plugin events: 0x{:x}",
            e & !EventMask::ALL.0
        )),
        e => Ok(EventMask(e)),
    }
}

/// Holding off lifecycle calls: Synchronize, then add the plugin to the
/// invocation list.
async fn sync_and_add(inner: &Arc<Inner>, plugin: &Arc<Plugin>) -> Result<(), String> {
    let _sync = inner.sync_lock.clone().write_owned().await;
    let snapshot = inner.backend.snapshot().await;
    let updates = synchronize(inner, plugin, &snapshot).await?;
    if plugin.conn.is_closed() {
        return Err("connection closed during synchronization".into());
    }
    {
        let mut states = inner.states.lock().unwrap();
        for p in &snapshot.pods {
            states.entry(p.pod.id.clone()).or_insert(if p.ready {
                State::Running
            } else {
                State::Stopped
            });
        }
        for c in &snapshot.containers {
            let s = match c.state() {
                ContainerState::ContainerCreated => State::Created,
                ContainerState::ContainerRunning | ContainerState::ContainerPaused => {
                    State::Running
                }
                ContainerState::ContainerStopped => State::Stopped,
                ContainerState::ContainerUnknown => continue,
            };
            states.entry(c.id.clone()).or_insert(s);
        }
    }
    {
        let mut list = inner.plugins.write().unwrap();
        let mut v: Vec<_> = list.iter().cloned().collect();
        v.push(plugin.clone());
        v.sort_by(|a, b| invocation_order(a, b));
        *list = Arc::from(v);
    }
    if !updates.is_empty() {
        let failed = inner.backend.update_containers(updates).await;
        if !failed.is_empty() {
            tracing::warn!(plugin = %plugin.name, count = failed.len(), "NRI post-sync container updates failed");
        }
    }
    Ok(())
}

/// Sends the snapshot, split into messages under ttrpc's size limit.
/// Synchronization is part of registration, so it gets the registration
/// timeout per message (a plugin may take a while to digest the state).
async fn synchronize(
    inner: &Inner,
    plugin: &Plugin,
    snap: &Snapshot,
) -> Result<Vec<ContainerUpdate>, String> {
    // Room for the request envelope and protobuf framing.
    const BUDGET: usize = wire::MAX_MESSAGE_LEN - 64 * 1024;
    let pods: Vec<&PodSandbox> = snap.pods.iter().map(|p| &p.pod).collect();
    let containers: Vec<&Container> = snap.containers.iter().collect();
    let (mut pi, mut ci) = (0, 0);
    let timeout = inner.registration_timeout().max(inner.request_timeout());
    loop {
        let mut req = SynchronizeRequest::default();
        let mut size = 0;
        while pi < pods.len()
            && (req.pods.is_empty() || size + pods[pi].encoded_len() + 16 < BUDGET)
        {
            size += pods[pi].encoded_len() + 16;
            req.pods.push(pods[pi].clone());
            pi += 1;
        }
        while ci < containers.len()
            && (size + containers[ci].encoded_len() + 16 < BUDGET
                || (req.pods.is_empty() && req.containers.is_empty()))
        {
            size += containers[ci].encoded_len() + 16;
            req.containers.push(containers[ci].clone());
            ci += 1;
        }
        req.more = pi < pods.len() || ci < containers.len();
        let rsp: SynchronizeResponse = plugin
            .call("Synchronize", &req, timeout)
            .await
            .map_err(|e| format!("Synchronize failed: {e}"))?;
        if !req.more {
            return Ok(rsp.update);
        }
        if !rsp.update.is_empty() || !rsp.more {
            return Err("plugin does not handle split sync requests".into());
        }
    }
}
