//! The systemd cgroup driver: a D-Bus client of systemd's manager, for
//! the units crust makes or uses (pod slices, `crust-<id>.scope` for
//! containers and pause processes).
//!
//! Nothing connects until the first call, so a daemon on the cgroupfs
//! driver holds no socket, task or buffer for this. It talks to systemd
//! over the system bus (dbus-daemon or dbus-broker, which systemd hosts
//! run). Not over systemd's private socket (`/run/systemd/private`, what
//! runc uses as root): systemd names itself `org.freedesktop.systemd1` in
//! the SENDER field of its replies there, which zbus refuses ("Invalid
//! unique name": a sender must be a unique `:x.y` name), as found in the
//! VM. Calls run on the caller's tokio runtime (zbus spawns its socket
//! reader there, no thread of its own). A dropped connection (the bus
//! restarting) is made again once per call.

pub mod properties;

use std::time::{Duration, Instant};

use oci_spec::runtime::LinuxResources;
use tokio::sync::Mutex;
use zbus::message::Message;
use zbus::{Connection, OwnedObjectPath, Variant};

use crate::error::{Error, Result, quote};
use crate::hierarchy::{CgroupFs, Hierarchy};
use crate::path::{CgroupPath, expand_slice, validate_name};
pub use properties::{Property, Value, base_properties, oom_policy, resource_properties};

const DESTINATION: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";

/// How long a start or stop job may take.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one D-Bus call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(25);

/// A unit's state as systemd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitState {
    /// `active`, `activating`, `deactivating`, `inactive`, `failed`, ...
    pub active: String,
    /// Type-specific: `running`, `abandoned`, `dead`, ...
    pub sub: String,
}

impl UnitState {
    pub fn is_active(&self) -> bool {
        self.active == "active" || self.active == "activating" || self.active == "reloading"
    }
}

enum Target {
    /// The system bus.
    Default,
    /// A given address (bus or peer-to-peer).
    Address { address: String, p2p: bool },
    /// A connection made elsewhere (tests, a shared connection).
    Given(Connection),
}

/// A lazily connected client of systemd's manager.
pub struct Systemd {
    hierarchy: Hierarchy,
    target: Target,
    conn: Mutex<Option<Connection>>,
    version: tokio::sync::OnceCell<u32>,
}

/// A unit name crust may address: a checked name ending in `.scope` or
/// `.slice`.
pub fn check_unit_name(unit: &str) -> Result<()> {
    validate_name(unit)?;
    if !(unit.ends_with(".scope") || unit.ends_with(".slice")) || unit.len() <= ".scope".len() {
        return Err(Error::invalid(
            format!("unit {}", quote(unit)),
            "crust manages .scope and .slice units only",
        ));
    }
    Ok(())
}

/// The D-Bus error name of a failed call, if it is one.
fn error_name(e: &zbus::Error) -> Option<String> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str().to_string()),
        zbus::Error::FDO(e) => {
            use zbus::DBusError;
            Some(e.name().as_str().to_string())
        }
        _ => None,
    }
}

fn is_disconnect(e: &zbus::Error) -> bool {
    matches!(e, zbus::Error::InputOutput(_))
}

/// systemd's version string (`252.19-1~deb12u1`, `"v245.4-1.fc32"`) as a
/// number.
pub fn parse_version(s: &str) -> Option<u32> {
    let s = s.trim_start_matches(['"', 'v']);
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

/// The body of StartTransientUnit: name, mode, properties, no auxiliary
/// units (`ssa(sv)a(sa(sv))`).
pub(crate) type StartBody<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, Variant<'a>)>,
    Vec<(&'a str, Vec<(&'a str, Variant<'a>)>)>,
);

fn to_variants(props: &[Property]) -> Vec<(&str, Variant<'_>)> {
    props
        .iter()
        .map(|p| {
            let v = match &p.value {
                Value::U64(v) => Variant::from(*v),
                Value::Bool(v) => Variant::from(*v),
                Value::Str(v) => Variant::from(v.as_str()),
                Value::Bytes(v) => Variant::from(v.clone()),
                Value::U32s(v) => Variant::from(v.clone()),
                Value::Strs(v) => Variant::from(v.iter().map(String::as_str).collect::<Vec<_>>()),
            };
            (p.name, v)
        })
        .collect()
}

impl Systemd {
    /// A client that connects on first use.
    pub fn new(hierarchy: Hierarchy) -> Self {
        Self::with_target(hierarchy, Target::Default)
    }

    /// A client of the manager at `address` (`unix:path=...`); `p2p` for a
    /// direct socket such as systemd's private one, false for a bus.
    pub fn with_address(hierarchy: Hierarchy, address: &str, p2p: bool) -> Self {
        Self::with_target(
            hierarchy,
            Target::Address {
                address: address.to_string(),
                p2p,
            },
        )
    }

    /// A client over an existing connection.
    pub fn with_connection(hierarchy: Hierarchy, conn: Connection) -> Self {
        Self::with_target(hierarchy, Target::Given(conn))
    }

    fn with_target(hierarchy: Hierarchy, target: Target) -> Self {
        Systemd {
            hierarchy,
            target,
            conn: Mutex::new(None),
            version: tokio::sync::OnceCell::new(),
        }
    }

    /// Whether a connection is held now (none until the first call).
    pub async fn is_connected(&self) -> bool {
        self.conn.lock().await.is_some() || matches!(self.target, Target::Given(_))
    }

    async fn connect(&self) -> Result<Connection> {
        let build = |address: &str, p2p: bool| -> Result<zbus::connection::Builder<'static>> {
            let b = zbus::connection::Builder::address(address.to_string().as_str())
                .method_timeout(CALL_TIMEOUT);
            Ok(if p2p { b.p2p() } else { b })
        };
        match &self.target {
            Target::Given(c) => Ok(c.clone()),
            Target::Address { address, p2p } => build(address, *p2p)?
                .build()
                .await
                .map_err(Error::dbus(format!("connecting to {address}"))),
            Target::Default => zbus::connection::Builder::system()
                .method_timeout(CALL_TIMEOUT)
                .build()
                .await
                .map_err(Error::dbus("connecting to the system bus")),
        }
    }

    async fn connection(&self) -> Result<Connection> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = self.connect().await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    /// One method call, made again on a fresh connection if the old one
    /// was dropped.
    async fn call<B>(
        &self,
        path: &str,
        interface: &str,
        method: &str,
        body: &B,
    ) -> Result<Message, zbus::Error>
    where
        B: serde::Serialize + zbus::DynamicType,
    {
        let mut retried = false;
        loop {
            let conn = match self.connection().await {
                Ok(c) => c,
                Err(Error::Dbus { source, .. }) => return Err(*source),
                Err(e) => return Err(zbus::Error::Failure(e.to_string())),
            };
            match conn
                .call_method(Some(DESTINATION), path, Some(interface), method, body)
                .await
            {
                Err(e) if is_disconnect(&e) && !retried => {
                    retried = true;
                    *self.conn.lock().await = None;
                }
                other => return other,
            }
        }
    }

    async fn get_property(
        &self,
        path: &str,
        interface: &str,
        name: &str,
    ) -> Result<Option<String>, zbus::Error> {
        let reply = self
            .call(path, PROPERTIES, "Get", &(interface, name))
            .await?;
        let body = reply.body();
        let v: Variant<'_> = body.deserialize()?;
        Ok(match v {
            Variant::Str(s) => Some(s.as_str().to_string()),
            Variant::ObjectPath(p) => Some(p.as_str().to_string()),
            _ => None,
        })
    }

    /// systemd's version (from the manager's `Version` property), once.
    pub async fn version(&self) -> Result<u32> {
        self.version
            .get_or_try_init(|| async {
                let s = self
                    .get_property(MANAGER_PATH, MANAGER, "Version")
                    .await
                    .map_err(Error::dbus("reading the systemd version"))?
                    .unwrap_or_default();
                parse_version(&s)
                    .ok_or_else(|| Error::Systemd(format!("cannot read version {}", quote(&s))))
            })
            .await
            .copied()
    }

    async fn unit_path(&self, unit: &str) -> Result<Option<String>> {
        match self.call(MANAGER_PATH, MANAGER, "GetUnit", &(unit,)).await {
            Ok(reply) => {
                let path: OwnedObjectPath = reply
                    .body()
                    .deserialize()
                    .map_err(Error::dbus(format!("GetUnit {unit}")))?;
                Ok(Some(path.as_str().to_string()))
            }
            Err(e) if error_name(&e).as_deref() == Some("org.freedesktop.systemd1.NoSuchUnit") => {
                Ok(None)
            }
            Err(e) => Err(Error::dbus(format!("GetUnit {unit}"))(e)),
        }
    }

    /// The unit's state, None when systemd has no such unit loaded.
    pub async fn unit_state(&self, unit: &str) -> Result<Option<UnitState>> {
        check_unit_name(unit)?;
        let Some(path) = self.unit_path(unit).await? else {
            return Ok(None);
        };
        let get = |name: &'static str| {
            let path = path.clone();
            async move {
                self.get_property(&path, "org.freedesktop.systemd1.Unit", name)
                    .await
                    .map_err(Error::dbus(format!("reading {name} of {unit}")))
            }
        };
        match (get("ActiveState").await, get("SubState").await) {
            (Ok(active), Ok(sub)) => Ok(Some(UnitState {
                active: active.unwrap_or_default(),
                sub: sub.unwrap_or_default(),
            })),
            // Unloaded between the two calls.
            (Err(Error::Dbus { source, .. }), _) | (_, Err(Error::Dbus { source, .. }))
                if error_name(&source).is_some_and(|n| n.contains("UnknownObject")) =>
            {
                Ok(None)
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    }

    /// The cgroup of a unit (its `ControlGroup`), None when there is no
    /// such unit or it has no cgroup (not running).
    pub async fn unit_cgroup(&self, unit: &str) -> Result<Option<CgroupPath>> {
        check_unit_name(unit)?;
        let Some(path) = self.unit_path(unit).await? else {
            return Ok(None);
        };
        let iface = if unit.ends_with(".slice") {
            "org.freedesktop.systemd1.Slice"
        } else {
            "org.freedesktop.systemd1.Scope"
        };
        let cg = self
            .get_property(&path, iface, "ControlGroup")
            .await
            .map_err(Error::dbus(format!("reading ControlGroup of {unit}")))?
            .unwrap_or_default();
        if cg.is_empty() {
            return Ok(None);
        }
        CgroupPath::parse(&cg).map(Some)
    }

    /// Waits until the job at `job` is gone (done, failed or cancelled).
    async fn wait_job(&self, job: &str, what: &str) -> Result<()> {
        let deadline = Instant::now() + JOB_TIMEOUT;
        let mut pause = Duration::from_millis(2);
        loop {
            match self
                .get_property(job, "org.freedesktop.systemd1.Job", "State")
                .await
            {
                Ok(_) => {}
                // The job object goes away when the job ends.
                Err(e)
                    if error_name(&e).is_some_and(|n| {
                        n.contains("UnknownObject")
                            || n.contains("UnknownMethod")
                            || n.contains("UnknownInterface")
                            || n.contains("NoSuchJob")
                    }) =>
                {
                    return Ok(());
                }
                Err(e) => return Err(Error::dbus(format!("waiting for {what}"))(e)),
            }
            if Instant::now() >= deadline {
                return Err(Error::Systemd(format!(
                    "{what}: no result in {JOB_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    async fn start_transient(&self, unit: &str, props: &[Property]) -> Result<(), zbus::Error> {
        let body: StartBody<'_> = (unit, "replace", to_variants(props), Vec::new());
        let reply = self
            .call(MANAGER_PATH, MANAGER, "StartTransientUnit", &body)
            .await?;
        let job: OwnedObjectPath = reply.body().deserialize()?;
        self.wait_job(job.as_str(), &format!("starting {unit}"))
            .await
            .map_err(|e| zbus::Error::Failure(e.to_string()))
    }

    async fn start_unit(&self, unit: &str, props: Vec<Property>, exists_ok: bool) -> Result<()> {
        let mut retried = false;
        loop {
            match self.start_transient(unit, &props).await {
                Ok(()) => break,
                Err(e)
                    if error_name(&e).as_deref() == Some("org.freedesktop.systemd1.UnitExists") =>
                {
                    if exists_ok {
                        return Ok(());
                    }
                    if retried {
                        return Err(Error::dbus(format!("starting {unit}"))(e));
                    }
                    // A failed unit of the same name lingers until reset.
                    retried = true;
                    let _ = self.reset_failed(unit).await;
                }
                Err(e) => return Err(Error::dbus(format!("starting {unit}"))(e)),
            }
        }
        match self.unit_state(unit).await? {
            Some(s) if s.is_active() => Ok(()),
            Some(s) => {
                let _ = self.reset_failed(unit).await;
                Err(Error::Systemd(format!(
                    "{unit} is {}/{} after its start",
                    s.active, s.sub
                )))
            }
            None => Err(Error::Systemd(format!("{unit} is gone after its start"))),
        }
    }

    /// Makes a transient slice (a pod's, when kubelet has not made it)
    /// with `resources`; one that exists already is left as it is
    /// (kubelet's, or an earlier attempt's): [`Systemd::apply`] changes the
    /// limits of an existing one (UpdatePodSandboxResources).
    pub async fn start_slice(&self, slice: &str, resources: &LinuxResources) -> Result<()> {
        check_unit_name(slice)?;
        let path = expand_slice(slice)?;
        let version = self.version().await?;
        let mut props = base_properties(format!("crust pod slice {slice}"), self.hierarchy);
        // The parent is implied by the name; Wants= makes systemd start it
        // first if it is not there.
        if let Some(parent) = path.parent().and_then(|p| p.name().map(str::to_string)) {
            props.push(properties::prop("Wants", Value::Strs(vec![parent])));
        }
        props.extend(resource_properties(resources, self.hierarchy, version)?.0);
        self.start_unit(slice, props, true).await
    }

    /// Makes the transient scope `scope` in `slice` holding `pids` (a
    /// container's or pause process's), with `Delegate=yes` and
    /// `resources`.
    pub async fn start_scope(
        &self,
        scope: &str,
        slice: &str,
        pids: &[u32],
        description: &str,
        resources: &LinuxResources,
    ) -> Result<()> {
        check_unit_name(scope)?;
        check_unit_name(slice)?;
        if pids.is_empty() {
            return Err(Error::invalid(
                format!("scope {}", quote(scope)),
                "systemd starts a scope only around processes: no PID given",
            ));
        }
        if !scope.ends_with(".scope") || !slice.ends_with(".slice") {
            return Err(Error::invalid(
                format!("scope {} in slice {}", quote(scope), quote(slice)),
                "a scope goes in a slice",
            ));
        }
        let version = self.version().await?;
        let mut props = base_properties(description.to_string(), self.hierarchy);
        props.push(properties::prop("Slice", Value::Str(slice.to_string())));
        props.push(properties::prop("Delegate", Value::Bool(true)));
        props.push(properties::prop("PIDs", Value::U32s(pids.to_vec())));
        props.extend(resource_properties(resources, self.hierarchy, version)?.0);
        props.extend(oom_policy(resources, version)?);
        self.start_unit(scope, props, false).await
    }

    /// Sets unit properties at run time (not persisted across reboots).
    pub async fn set_properties(&self, unit: &str, props: &[Property]) -> Result<()> {
        check_unit_name(unit)?;
        if props.is_empty() {
            return Ok(());
        }
        let body = (unit, true, to_variants(props));
        self.call(MANAGER_PATH, MANAGER, "SetUnitProperties", &body)
            .await
            .map_err(Error::dbus(format!("setting properties of {unit}")))?;
        Ok(())
    }

    /// Applies `resources` to the unit `unit` whose cgroup is `path`: the
    /// properties systemd has through it, then every file (so that what
    /// systemd cannot express, `unified` keys included, lands too, and
    /// both agree), as runc does. Everything is checked before anything
    /// changes.
    pub async fn apply(
        &self,
        fs: &CgroupFs,
        unit: &str,
        path: &CgroupPath,
        resources: &LinuxResources,
    ) -> Result<()> {
        check_unit_name(unit)?;
        let cgroup = fs.cgroup(path.clone());
        // Validate the whole request against the cgroup first.
        cgroup.check(resources)?;
        let version = self.version().await?;
        let (props, adjusted_quota) = resource_properties(resources, self.hierarchy, version)?;
        self.set_properties(unit, &props).await?;
        let mut files = resources.clone();
        if let (Some(q), Some(cpu)) = (adjusted_quota, files.cpu_mut().as_mut()) {
            cpu.set_quota(Some(q));
        }
        cgroup.apply(&files)
    }

    /// Stops a unit (a scope: its processes are killed) and waits for it to
    /// go; a unit that does not exist is fine. A failed unit is reset so
    /// that its name can be used again.
    pub async fn stop_unit(&self, unit: &str) -> Result<()> {
        check_unit_name(unit)?;
        match self
            .call(MANAGER_PATH, MANAGER, "StopUnit", &(unit, "replace"))
            .await
        {
            Ok(reply) => {
                let job: OwnedObjectPath = reply
                    .body()
                    .deserialize()
                    .map_err(Error::dbus(format!("stopping {unit}")))?;
                self.wait_job(job.as_str(), &format!("stopping {unit}"))
                    .await?;
            }
            Err(e) if error_name(&e).as_deref() == Some("org.freedesktop.systemd1.NoSuchUnit") => {}
            Err(e) => return Err(Error::dbus(format!("stopping {unit}"))(e)),
        }
        let _ = self.reset_failed(unit).await;
        match self.unit_state(unit).await? {
            Some(s) if s.is_active() => Err(Error::Systemd(format!(
                "{unit} is still {}/{} after its stop",
                s.active, s.sub
            ))),
            _ => Ok(()),
        }
    }

    /// Sends `signal` to every process of a unit.
    pub async fn kill_unit(&self, unit: &str, signal: i32) -> Result<()> {
        check_unit_name(unit)?;
        self.call(MANAGER_PATH, MANAGER, "KillUnit", &(unit, "all", signal))
            .await
            .map_err(Error::dbus(format!("killing {unit}")))?;
        Ok(())
    }

    /// Clears a failed unit; one that is not failed or not there is fine.
    pub async fn reset_failed(&self, unit: &str) -> Result<()> {
        check_unit_name(unit)?;
        match self
            .call(MANAGER_PATH, MANAGER, "ResetFailedUnit", &(unit,))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if error_name(&e).is_some_and(|n| n.contains("NoSuchUnit")) => Ok(()),
            Err(e) => Err(Error::dbus(format!("resetting {unit}"))(e)),
        }
    }
}

#[cfg(test)]
mod tests;
