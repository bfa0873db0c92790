//! The D-Bus side of the driver against a stand-in manager on a socket
//! pair (this host has no systemd): the calls, their signatures and
//! arguments, replies and D-Bus errors, job waiting. The same calls against
//! a real systemd are in tests/host.rs, run in the VM.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};

use oci_spec::runtime::{LinuxCpuBuilder, LinuxMemoryBuilder, LinuxResourcesBuilder};
use tokio_stream::StreamExt;
use zbus::message::Type as MessageType;
use zbus::{Guid, MessageStream, OwnedVariant};

use super::*;

/// One call the stand-in received: method, body signature, and what it
/// decoded.
#[derive(Debug, Clone)]
struct Call {
    member: String,
    signature: String,
    unit: Option<String>,
    props: HashMap<String, OwnedVariant>,
}

#[derive(Default)]
struct FakeState {
    calls: Vec<Call>,
    /// unit -> ActiveState
    units: HashMap<String, String>,
    /// How many State polls a job answers before it is gone.
    job_polls: usize,
}

type Props = Vec<(String, OwnedVariant)>;
/// StartTransientUnit's arguments as the stand-in decodes them.
type StartArgs = (String, String, Props, Vec<(String, Props)>);

/// A minimal systemd manager: enough of org.freedesktop.systemd1 for the
/// driver, answering from `FakeState`.
async fn fake_systemd(conn: Connection, state: Arc<StdMutex<FakeState>>) {
    let mut stream = MessageStream::from(&conn);
    while let Some(Ok(msg)) = stream.next().await {
        if msg.message_type() != MessageType::MethodCall {
            continue;
        }
        let hdr = msg.header();
        let member = hdr.member().map(|m| m.to_string()).unwrap_or_default();
        let path = hdr.path().map(|p| p.to_string()).unwrap_or_default();
        let body = msg.body();
        // As the header field carries it on the wire.
        let signature = body.signature().to_string_no_parens();
        let mut call = Call {
            member: member.clone(),
            signature,
            unit: None,
            props: HashMap::new(),
        };
        let reply = match member.as_str() {
            "StartTransientUnit" => {
                let (name, mode, props, _aux): StartArgs = body.deserialize().unwrap();
                assert_eq!(mode, "replace");
                call.unit = Some(name.clone());
                call.props = props.into_iter().collect();
                let mut st = state.lock().unwrap();
                let exists = st.units.contains_key(&name);
                st.units.entry(name).or_insert_with(|| "active".into());
                if exists {
                    Err(("org.freedesktop.systemd1.UnitExists", "exists"))
                } else {
                    st.job_polls = 2;
                    Ok(Message::method_return(&hdr)
                        .build(&(
                            OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap(),
                        ))
                        .unwrap())
                }
            }
            "StopUnit" => {
                let (name, _mode): (String, String) = body.deserialize().unwrap();
                call.unit = Some(name.clone());
                let mut st = state.lock().unwrap();
                if st.units.remove(&name).is_some() {
                    st.job_polls = 1;
                    Ok(Message::method_return(&hdr)
                        .build(&(
                            OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/8").unwrap(),
                        ))
                        .unwrap())
                } else {
                    Err(("org.freedesktop.systemd1.NoSuchUnit", "no such unit"))
                }
            }
            "GetUnit" => {
                let (name,): (String,) = body.deserialize().unwrap();
                call.unit = Some(name.clone());
                if state.lock().unwrap().units.contains_key(&name) {
                    let p = format!(
                        "/org/freedesktop/systemd1/unit/{}",
                        name.replace(['-', '.'], "_")
                    );
                    Ok(Message::method_return(&hdr)
                        .build(&(OwnedObjectPath::try_from(p).unwrap(),))
                        .unwrap())
                } else {
                    Err(("org.freedesktop.systemd1.NoSuchUnit", "no such unit"))
                }
            }
            "SetUnitProperties" => {
                let (name, runtime, props): (String, bool, Props) = body.deserialize().unwrap();
                assert!(runtime);
                call.unit = Some(name);
                call.props = props.into_iter().collect();
                Ok(Message::method_return(&hdr).build(&()).unwrap())
            }
            "KillUnit" => {
                let (name, whom, signal): (String, String, i32) = body.deserialize().unwrap();
                assert_eq!((whom.as_str(), signal), ("all", 9));
                call.unit = Some(name);
                Ok(Message::method_return(&hdr).build(&()).unwrap())
            }
            "ResetFailedUnit" => Ok(Message::method_return(&hdr).build(&()).unwrap()),
            "Get" => {
                let (iface, prop): (String, String) = body.deserialize().unwrap();
                let mut st = state.lock().unwrap();
                let value = match (iface.as_str(), prop.as_str()) {
                    ("org.freedesktop.systemd1.Manager", "Version") => Some("254.5-1".to_string()),
                    ("org.freedesktop.systemd1.Job", "State") => {
                        if st.job_polls > 0 {
                            st.job_polls -= 1;
                            Some("running".into())
                        } else {
                            None
                        }
                    }
                    ("org.freedesktop.systemd1.Unit", "ActiveState") => st
                        .units
                        .iter()
                        .find(|(u, _)| path.ends_with(&u.replace(['-', '.'], "_")))
                        .map(|(_, s)| s.clone()),
                    ("org.freedesktop.systemd1.Unit", "SubState") => Some("running".into()),
                    ("org.freedesktop.systemd1.Scope", "ControlGroup") => {
                        Some("/kubepods.slice/kubepods-pod1.slice/crust-abc.scope".into())
                    }
                    _ => None,
                };
                match value {
                    Some(v) => Ok(Message::method_return(&hdr)
                        .build(&(Variant::from(v.as_str()),))
                        .unwrap()),
                    None => Err(("org.freedesktop.DBus.Error.UnknownObject", "gone")),
                }
            }
            _ => Err(("org.freedesktop.DBus.Error.UnknownMethod", "unknown")),
        };
        state.lock().unwrap().calls.push(call);
        let reply = match reply {
            Ok(m) => m,
            Err((name, text)) => Message::error(&hdr, name).build(&(text,)).unwrap(),
        };
        if conn.send(&reply).await.is_err() {
            break;
        }
    }
}

async fn pair() -> (Systemd, Arc<StdMutex<FakeState>>) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let guid = Guid::generate();
    let server = zbus::connection::Builder::unix_stream(a)
        .server(guid)
        .p2p()
        .build();
    let client = zbus::connection::Builder::unix_stream(b).p2p().build();
    let (server, client) = tokio::join!(server, client);
    let state = Arc::new(StdMutex::new(FakeState::default()));
    tokio::spawn(fake_systemd(server.unwrap(), state.clone()));
    (
        Systemd::with_connection(Hierarchy::V2, client.unwrap()),
        state,
    )
}

fn last(state: &StdMutex<FakeState>, member: &str) -> Call {
    state
        .lock()
        .unwrap()
        .calls
        .iter()
        .rev()
        .find(|c| c.member == member)
        .cloned()
        .unwrap_or_else(|| panic!("no {member} call"))
}

fn u64_prop(call: &Call, name: &str) -> u64 {
    u64::try_from(call.props[name].try_clone().unwrap()).unwrap()
}

#[tokio::test]
async fn scope_start_sends_the_properties_and_waits_for_the_job() {
    let (sd, state) = pair().await;
    let resources = LinuxResourcesBuilder::default()
        .memory(
            LinuxMemoryBuilder::default()
                .limit(64i64 << 20)
                .build()
                .unwrap(),
        )
        .cpu(
            LinuxCpuBuilder::default()
                .quota(50_000i64)
                .period(100_000u64)
                .cpus("0-1")
                .build()
                .unwrap(),
        )
        .unified(HashMap::from([(
            "memory.oom.group".to_string(),
            "1".to_string(),
        )]))
        .build()
        .unwrap();
    sd.start_scope(
        "crust-abc.scope",
        "kubepods-pod1.slice",
        &[4242],
        "crust container abc",
        &resources,
    )
    .await
    .unwrap();
    let call = last(&state, "StartTransientUnit");
    assert_eq!(call.signature, "ssa(sv)a(sa(sv))");
    assert_eq!(call.unit.as_deref(), Some("crust-abc.scope"));
    assert_eq!(
        String::try_from(call.props["Slice"].try_clone().unwrap()).unwrap(),
        "kubepods-pod1.slice"
    );
    assert!(bool::try_from(call.props["Delegate"].try_clone().unwrap()).unwrap());
    assert_eq!(
        Vec::<u32>::try_from(call.props["PIDs"].try_clone().unwrap()).unwrap(),
        vec![4242]
    );
    assert_eq!(u64_prop(&call, "MemoryMax"), 64 << 20);
    assert_eq!(u64_prop(&call, "CPUQuotaPerSecUSec"), 500_000);
    assert_eq!(
        Vec::<u8>::try_from(call.props["AllowedCPUs"].try_clone().unwrap()).unwrap(),
        vec![0b11]
    );
    assert_eq!(
        String::try_from(call.props["OOMPolicy"].try_clone().unwrap()).unwrap(),
        "kill"
    );
    // The job was polled until it was gone, then the unit checked.
    let polls = state
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.member == "Get")
        .count();
    assert!(polls >= 4, "{polls}");
    assert_eq!(
        sd.unit_state("crust-abc.scope")
            .await
            .unwrap()
            .unwrap()
            .active,
        "active"
    );
    assert_eq!(
        sd.unit_cgroup("crust-abc.scope")
            .await
            .unwrap()
            .unwrap()
            .as_str(),
        "/kubepods.slice/kubepods-pod1.slice/crust-abc.scope"
    );
}

#[tokio::test]
async fn slices_that_exist_are_kept_scopes_that_exist_are_refused() {
    let (sd, state) = pair().await;
    let none = LinuxResources::default();
    sd.start_slice("kubepods-pod1.slice", &none).await.unwrap();
    let call = last(&state, "StartTransientUnit");
    assert_eq!(
        Vec::<String>::try_from(call.props["Wants"].try_clone().unwrap()).unwrap(),
        vec!["kubepods.slice".to_string()]
    );
    // Again: UnitExists is fine for a slice.
    sd.start_slice("kubepods-pod1.slice", &none).await.unwrap();
    sd.start_scope("crust-x.scope", "system.slice", &[1], "x", &none)
        .await
        .unwrap();
    let e = sd
        .start_scope("crust-x.scope", "system.slice", &[1], "x", &none)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("UnitExists"), "{e}");
    // The driver reset the failed unit once before giving up.
    assert!(
        state
            .lock()
            .unwrap()
            .calls
            .iter()
            .any(|c| c.member == "ResetFailedUnit")
    );
}

#[tokio::test]
async fn stop_kill_and_missing_units() {
    let (sd, state) = pair().await;
    assert_eq!(sd.unit_state("crust-gone.scope").await.unwrap(), None);
    assert_eq!(sd.unit_cgroup("crust-gone.scope").await.unwrap(), None);
    // Stopping what is not there is fine (orphan cleanup is idempotent).
    sd.stop_unit("crust-gone.scope").await.unwrap();
    sd.start_scope(
        "crust-y.scope",
        "system.slice",
        &[1],
        "y",
        &LinuxResources::default(),
    )
    .await
    .unwrap();
    sd.kill_unit("crust-y.scope", 9).await.unwrap();
    assert_eq!(last(&state, "KillUnit").signature, "ssi");
    sd.stop_unit("crust-y.scope").await.unwrap();
    assert_eq!(sd.unit_state("crust-y.scope").await.unwrap(), None);
}

#[tokio::test]
async fn set_properties_and_version() {
    let (sd, state) = pair().await;
    assert_eq!(sd.version().await.unwrap(), 254);
    let props = vec![
        properties::prop("MemoryMax", Value::U64(1 << 30)),
        properties::prop("CPUWeight", Value::U64(100)),
    ];
    sd.set_properties("crust-z.scope", &props).await.unwrap();
    let call = last(&state, "SetUnitProperties");
    assert_eq!(call.signature, "sba(sv)");
    assert_eq!(u64_prop(&call, "MemoryMax"), 1 << 30);
    assert_eq!(u64_prop(&call, "CPUWeight"), 100);
}

#[tokio::test]
async fn bad_unit_names_never_reach_systemd() {
    let (sd, state) = pair().await;
    for unit in [
        "../x.scope",
        "a/b.scope",
        "x.service",
        ".scope",
        "",
        "crust x.scope",
    ] {
        assert!(sd.stop_unit(unit).await.is_err(), "{unit:?}");
        assert!(sd.unit_state(unit).await.is_err(), "{unit:?}");
    }
    assert!(
        sd.start_scope(
            "crust-a.scope",
            "../x.slice",
            &[1],
            "",
            &LinuxResources::default()
        )
        .await
        .is_err()
    );
    let e = sd
        .start_scope(
            "crust-a.scope",
            "system.slice",
            &[],
            "",
            &LinuxResources::default(),
        )
        .await
        .unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
    assert!(state.lock().unwrap().calls.is_empty());
}

#[tokio::test]
async fn nothing_connects_until_used() {
    let sd = Systemd::with_address(Hierarchy::V2, "unix:path=/nonexistent/crust-test", true);
    assert!(!sd.is_connected().await);
    let e = sd.unit_state("crust-a.scope").await.unwrap_err();
    assert!(matches!(e, Error::Dbus { .. }), "{e}");
    assert!(!sd.is_connected().await);
}

#[test]
fn versions() {
    assert_eq!(parse_version("252.19-1~deb12u1"), Some(252));
    assert_eq!(parse_version("\"v245.4-1.fc32\""), Some(245));
    assert_eq!(parse_version("255"), Some(255));
    assert_eq!(parse_version("x"), None);
}
