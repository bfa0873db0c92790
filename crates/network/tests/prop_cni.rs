//! Property tests of what CNI plugins and config files hand the daemon:
//! results of every spec version (0.1.0-1.1.0, legacy ip4/ip6 shape),
//! config files and lists, CNI_ARGS built from pod metadata, and the
//! errors a failing plugin produces. Every input gives a value or an
//! error of at most 1024 bytes, never a panic.
//!
//! Longer runs: `PROPTEST_CASES=50000 cargo test -p crust-network --test prop_cni`.

use std::path::Path;

use crust_network::{Attachment, CniResult, Error, cni_args, config};
use crust_quote::testing::{check_message, config as prop_config, hostile_string, long_string};
use proptest::prelude::*;
use serde_json::{Value, json};

fn address() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => (any::<[u8; 4]>(), 0u8..40).prop_map(|(a, p)| json!(format!(
            "{}.{}.{}.{}/{p}", a[0], a[1], a[2], a[3]
        ))),
        2 => (any::<[u16; 8]>(), 0u8..140).prop_map(|(a, p)| json!(format!(
            "{:x}:{:x}:{:x}:{:x}:{:x}:{:x}:{:x}:{:x}/{p}",
            a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
        ))),
        2 => hostile_string().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
    ]
    .boxed()
}

fn gateway() -> BoxedStrategy<Value> {
    prop_oneof![
        2 => any::<[u8; 4]>().prop_map(|a| json!(format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]))),
        1 => hostile_string().prop_map(Value::from),
        1 => Just(Value::Null),
    ]
    .boxed()
}

fn version() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => prop::sample::select(vec!["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
            .prop_map(Value::from),
        1 => hostile_string().prop_map(Value::from),
    ]
    .boxed()
}

fn result_json() -> BoxedStrategy<Value> {
    let interface = (hostile_string(), hostile_string(), hostile_string())
        .prop_map(|(name, mac, sandbox)| json!({"name": name, "mac": mac, "sandbox": sandbox}));
    let ip = (
        address(),
        gateway(),
        prop_oneof![
            3 => (0i64..4).prop_map(Value::from),
            1 => any::<i64>().prop_map(Value::from),
            1 => Just(Value::Null),
            1 => hostile_string().prop_map(Value::from)
        ],
    )
        .prop_map(|(address, gateway, interface)| {
            json!({"address": address, "gateway": gateway, "interface": interface})
        });
    let dns = (
        proptest::collection::vec(hostile_string(), 0..3),
        hostile_string(),
    )
        .prop_map(|(ns, domain)| json!({"nameservers": ns, "domain": domain}));
    let current = (
        version(),
        proptest::collection::vec(interface, 0..4),
        proptest::collection::vec(ip, 0..6),
        dns.clone(),
    )
        .prop_map(|(v, interfaces, ips, dns)| {
            json!({"cniVersion": v, "interfaces": interfaces, "ips": ips,
                   "routes": [{"dst": "0.0.0.0/0"}], "dns": dns})
        });
    let legacy_ip = (address(), gateway())
        .prop_map(|(ip, gw)| json!({"ip": ip, "gateway": gw, "routes": [{"dst": "0.0.0.0/0"}]}));
    let legacy = (
        version(),
        proptest::option::of(legacy_ip.clone()),
        proptest::option::of(legacy_ip),
        dns,
    )
        .prop_map(|(v, ip4, ip6, dns)| {
            let mut r = json!({"cniVersion": v, "dns": dns});
            if let Some(ip) = ip4 {
                r["ip4"] = ip;
            }
            if let Some(ip) = ip6 {
                r["ip6"] = ip;
            }
            r
        });
    prop_oneof![
        4 => current,
        2 => legacy,
        1 => hostile_string().prop_map(Value::from),
        1 => Just(json!({"ips": "not a list"})),
    ]
    .boxed()
}

fn conflist_bytes() -> BoxedStrategy<Vec<u8>> {
    let plugin = (
        prop_oneof![
            3 => prop::sample::select(vec!["bridge", "portmap", "loopback"]).prop_map(Value::from),
            2 => hostile_string().prop_map(Value::from),
            1 => Just(Value::Null),
        ],
        proptest::option::of(version()),
    )
        .prop_map(|(t, v)| {
            let mut p = json!({"type": t});
            if let Some(v) = v {
                p["cniVersion"] = v;
            }
            p
        });
    let list = (
        prop_oneof![
            Just(json!("net")),
            hostile_string().prop_map(Value::from),
            Just(Value::Null)
        ],
        proptest::option::of(version()),
        proptest::option::of(proptest::collection::vec(version(), 0..4)),
        proptest::option::of(proptest::collection::vec(plugin, 0..4)),
        any::<bool>(),
    )
        .prop_map(|(name, v, vs, plugins, dc)| {
            let mut l = json!({"name": name, "disableCheck": dc});
            if let Some(v) = v {
                l["cniVersion"] = v;
            }
            if let Some(vs) = vs {
                l["cniVersions"] = json!(vs);
            }
            if let Some(p) = plugins {
                l["plugins"] = json!(p);
            }
            serde_json::to_vec(&l).unwrap()
        });
    prop_oneof![
        4 => list,
        1 => proptest::collection::vec(any::<u8>(), 0..256),
        1 => hostile_string().prop_map(String::into_bytes),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(prop_config(1024))]

    #[test]
    fn results_parse_or_fail_cleanly(v in result_json(), ifname in hostile_string()) {
        match CniResult::parse(&v) {
            Ok(r) => {
                // What parse accepted, pod_ips can rely on.
                for ip in &r.ips {
                    if let Some(i) = ip.interface {
                        prop_assert!(usize::try_from(i).is_ok_and(|i| i < r.interfaces.len()));
                    }
                }
                let ips = r.pod_ips(&ifname);
                prop_assert!(ips.len() <= r.ips.len());
            }
            Err(why) => {
                check_message("CniResult::parse", &why)?;
                let e = Error::InvalidResult { plugin: "bridge".into(), why };
                check_message("InvalidResult", &e.to_string())?;
            }
        }
    }

    #[test]
    fn config_files_parse_or_fail_cleanly(
        bytes in conflist_bytes(),
        file in prop::sample::select(vec!["10-net.conflist", "10-net.conf", "10-net.json"]),
    ) {
        let path = Path::new("/etc/cni/net.d").join(file);
        match config::parse(&path, &bytes) {
            Ok(list) => {
                prop_assert!(!list.plugins.is_empty());
                prop_assert!(!list.name.is_empty());
                for p in &list.plugins {
                    let t = p["type"].as_str().unwrap();
                    prop_assert!(!t.contains('/') && t != ".." && t != ".");
                }
            }
            Err(e) => check_message("config::parse", &e.to_string())?,
        }
    }

    #[test]
    fn cni_args_are_safe_or_refused(
        namespace in hostile_string(),
        name in hostile_string(),
        uid in hostile_string(),
        id in hostile_string(),
    ) {
        let att = Attachment {
            container_id: id,
            netns: "/run/ns".into(),
            ifname: "eth0".into(),
            pod_namespace: namespace,
            pod_name: name,
            pod_uid: uid,
            capabilities: Default::default(),
        };
        match cni_args(&att) {
            Ok(args) => {
                // Exactly the five pairs: nothing smuggled in.
                prop_assert_eq!(args.matches(';').count(), 4);
                prop_assert_eq!(args.matches('=').count(), 5);
            }
            Err(e) => check_message("cni_args", &e.to_string())?,
        }
    }

    /// What a failing plugin prints ends up in a gRPC error: bounded.
    #[test]
    fn plugin_errors_are_bounded(
        msg in prop_oneof![hostile_string(), long_string()],
        details in prop_oneof![hostile_string(), long_string()],
        output in prop_oneof![hostile_string(), long_string()],
        code in any::<u64>(),
    ) {
        let plugin = Error::Plugin {
            plugin: "bridge".into(),
            command: "ADD",
            code,
            msg,
            details,
        };
        check_message("Plugin", &plugin.to_string())?;
        let exit = Error::PluginExit {
            plugin: "bridge".into(),
            command: "DEL",
            status: "exit status: 1".into(),
            output,
        };
        check_message("PluginExit", &exit.to_string())?;
        let both = Error::AddAndCleanup { add: Box::new(plugin), del: Box::new(exit) };
        check_message("AddAndCleanup", &both.to_string())?;
    }
}
