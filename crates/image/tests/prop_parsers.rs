//! Property tests of the image crate's parsers of registry-supplied and
//! client-supplied text: manifests, indexes, image configs, references,
//! digests and hosts.toml. Every input must give a value or a clean error
//! whose message stays short, never a panic. Case counts: see
//! `crust_quote::testing::cases` (PROPTEST_CASES overrides).

use std::path::Path;

use crust_image::manifest::{self, Document, Platform};
use crust_image::{Digest, Reference, hosts};
use crust_quote::testing::{check_message, config, hostile_string, long_string};
use proptest::prelude::*;
use serde_json::{Value, json};

fn digest_value() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => any::<[u8; 32]>().prop_map(|b| json!(format!("sha256:{}", hex(&b)))),
        1 => hostile_string().prop_map(Value::from),
        1 => Just(json!(7)),
    ]
    .boxed()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn media_type() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => prop::sample::select(vec![
            manifest::OCI_MANIFEST,
            manifest::OCI_INDEX,
            manifest::DOCKER_MANIFEST,
            manifest::DOCKER_LIST,
            manifest::OCI_CONFIG,
            manifest::DOCKER_CONFIG,
            manifest::OCI_LAYER_GZIP,
            manifest::OCI_LAYER_ZSTD,
            manifest::DOCKER_LAYER_GZIP,
        ])
        .prop_map(Value::from),
        1 => hostile_string().prop_map(Value::from),
        1 => Just(Value::Null),
    ]
    .boxed()
}

fn size_value() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => (0u64..100_000).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => hostile_string().prop_map(Value::from),
    ]
    .boxed()
}

fn platform() -> BoxedStrategy<Value> {
    (
        prop_oneof![Just("linux".to_string()), hostile_string()],
        prop_oneof![
            Just("amd64".to_string()),
            Just("arm64".to_string()),
            hostile_string()
        ],
        proptest::option::of(prop_oneof![Just("v8".to_string()), hostile_string()]),
    )
        .prop_map(|(os, arch, variant)| {
            let mut p = json!({"os": os, "architecture": arch});
            if let Some(v) = variant {
                p["variant"] = json!(v);
            }
            p
        })
        .boxed()
}

fn descriptor() -> BoxedStrategy<Value> {
    (
        media_type(),
        digest_value(),
        size_value(),
        proptest::option::of(platform()),
        proptest::option::of(proptest::collection::btree_map(
            hostile_string(),
            hostile_string(),
            0..3,
        )),
    )
        .prop_map(|(mt, digest, size, platform, annotations)| {
            let mut d = json!({"mediaType": mt, "digest": digest, "size": size});
            if let Some(p) = platform {
                d["platform"] = p;
            }
            if let Some(a) = annotations {
                d["annotations"] = json!(a);
            }
            d
        })
        .boxed()
}

/// Manifests and indexes, mostly well-shaped with hostile values, some
/// with whole parts replaced by the wrong JSON type.
fn document() -> BoxedStrategy<Value> {
    let version = prop_oneof![
        6 => Just(json!(2)),
        1 => Just(json!(1)),
        1 => any::<i64>().prop_map(Value::from),
        1 => hostile_string().prop_map(Value::from),
    ];
    (
        version,
        proptest::option::of(media_type()),
        proptest::option::of(descriptor()),
        proptest::option::of(proptest::collection::vec(descriptor(), 0..40)),
        proptest::option::of(proptest::collection::vec(descriptor(), 0..40)),
        any::<bool>(),
    )
        .prop_map(|(v, mt, config, layers, manifests, wrong)| {
            let mut d = json!({"schemaVersion": v});
            if let Some(mt) = mt {
                d["mediaType"] = mt;
            }
            if let Some(c) = config {
                d["config"] = c;
            }
            if let Some(l) = layers {
                d["layers"] = json!(l);
            }
            if let Some(m) = manifests {
                d["manifests"] = json!(m);
            }
            if wrong {
                d["layers"] = json!("not a list");
            }
            d
        })
        .boxed()
}

fn config_blob() -> BoxedStrategy<Value> {
    let strings = || proptest::collection::vec(hostile_string(), 0..4);
    (
        prop_oneof![Just("layers".to_string()), hostile_string()],
        proptest::collection::vec(digest_value(), 0..10),
        hostile_string(),
        strings(),
        strings(),
        proptest::collection::btree_map(hostile_string(), hostile_string(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(kind, diffs, user, env, cmd, labels, nulls)| {
            let config = if nulls {
                json!({"User": null, "Env": null, "Cmd": null, "Volumes": null})
            } else {
                json!({"User": user, "Env": env, "Cmd": cmd, "Labels": labels,
                       "Volumes": {"/data": {}}, "ExposedPorts": {"80/tcp": {}}})
            };
            json!({"architecture": "amd64", "os": "linux", "config": config,
                   "rootfs": {"type": kind, "diff_ids": diffs}})
        })
        .boxed()
}

/// Raw bytes: random, or a valid document with bytes flipped.
fn mangled(doc: impl Strategy<Value = Value>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            doc,
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8)
        )
            .prop_map(|(v, flips)| {
                let mut b = serde_json::to_vec(&v).unwrap();
                for (i, x) in flips {
                    if !b.is_empty() {
                        let n = b.len();
                        b[i % n] = x;
                    }
                }
                b
            }),
    ]
}

fn host() -> Platform {
    Platform {
        architecture: "amd64".into(),
        os: "linux".into(),
        variant: None,
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn documents_parse_or_fail_cleanly(doc in document()) {
        let bytes = serde_json::to_vec(&doc).unwrap();
        match manifest::parse_document(&bytes) {
            Ok(Document::Index(index)) => {
                if let Err(e) = manifest::select_manifest(&index, &host()) {
                    check_message("select_manifest", &e.to_string())?;
                }
            }
            Ok(Document::Manifest(m)) => {
                // What the parser accepted is what crust relies on.
                prop_assert!(m.config.size <= manifest::MAX_CONFIG_BYTES);
            }
            Err(e) => check_message("parse_document", &e.to_string())?,
        }
    }

    #[test]
    fn raw_documents_never_panic(bytes in mangled(document())) {
        if let Err(e) = manifest::parse_document(&bytes) {
            check_message("parse_document", &e.to_string())?;
        }
    }

    #[test]
    fn configs_parse_or_fail_cleanly(cfg in config_blob()) {
        let bytes = serde_json::to_vec(&cfg).unwrap();
        if let Err(e) = manifest::parse_config(&bytes) {
            check_message("parse_config", &e.to_string())?;
        }
    }

    #[test]
    fn raw_configs_never_panic(bytes in mangled(config_blob())) {
        if let Err(e) = manifest::parse_config(&bytes) {
            check_message("parse_config", &e.to_string())?;
        }
    }
}

/// Image references: the registry-ish shapes kubelet sends, with hostile
/// parts, and anything at all.
fn reference_text() -> BoxedStrategy<String> {
    let part = || prop_oneof![3 => "[a-z0-9]{1,8}([._-][a-z0-9]{1,4})?", 1 => hostile_string()];
    prop_oneof![
        (
            proptest::option::of(prop_oneof![
                "[a-z]{1,8}\\.[a-z]{2,3}(:[0-9]{1,5})?",
                Just("localhost".to_string()),
                Just("[::1]:5000".to_string()),
                hostile_string()
            ]),
            proptest::collection::vec(part(), 1..4),
            proptest::option::of(prop_oneof![
                "[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}",
                hostile_string()
            ]),
            proptest::option::of(prop_oneof![
                any::<[u8; 32]>().prop_map(|b| format!("sha256:{}", hex(&b))),
                hostile_string()
            ]),
        )
            .prop_map(|(domain, path, tag, digest)| {
                let mut s = domain.map(|d| format!("{d}/")).unwrap_or_default();
                s.push_str(&path.join("/"));
                if let Some(t) = tag {
                    s.push(':');
                    s.push_str(&t);
                }
                if let Some(d) = digest {
                    s.push('@');
                    s.push_str(&d);
                }
                s
            }),
        hostile_string(),
        long_string(),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn references_parse_or_fail_cleanly(s in reference_text()) {
        match Reference::parse(&s) {
            Ok(r) => {
                // A normalised reference parses to itself.
                let again = Reference::parse(&r.to_string());
                prop_assert_eq!(again.as_ref().ok(), Some(&r), "{}", r);
                prop_assert!(r.name().len() <= 255 + "docker.io/library/".len());
            }
            Err(e) => check_message("Reference::parse", &e.to_string())?,
        }
    }

    #[test]
    fn digests_parse_or_fail_cleanly(s in prop_oneof![
        any::<[u8; 32]>().prop_map(|b| format!("sha256:{}", hex(&b))),
        hostile_string().prop_map(|h| format!("sha256:{h}")),
        hostile_string(),
    ]) {
        match Digest::parse(&s) {
            Ok(d) => prop_assert_eq!(d.to_string(), s),
            Err(e) => check_message("Digest::parse", &e.to_string())?,
        }
    }
}

/// hosts.toml files: the documented keys with hostile values and types.
fn hosts_toml() -> BoxedStrategy<String> {
    let value = || {
        prop_oneof![
            hostile_string().prop_map(|s| toml_string(&s)),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|i| i.to_string()),
            proptest::collection::vec(
                prop_oneof![
                    Just("pull".to_string()),
                    Just("resolve".to_string()),
                    hostile_string()
                ],
                0..4
            )
            .prop_map(|v| format!(
                "[{}]",
                v.iter()
                    .map(|s| toml_string(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        ]
    };
    let key = || {
        prop::sample::select(vec![
            "capabilities",
            "skip_verify",
            "ca",
            "override_path",
            "client",
            "header",
        ])
    };
    let url = || {
        prop_oneof![
            "(http|https|ftp)://[a-z0-9.]{1,12}(:[0-9]{1,6})?(/[a-z0-9]{0,6}){0,2}(/v2)?",
            hostile_string()
        ]
    };
    (
        proptest::option::of(prop_oneof![url().prop_map(|u| toml_string(&u)), value()]),
        proptest::collection::vec((key(), value()), 0..3),
        proptest::collection::vec(
            (url(), proptest::collection::vec((key(), value()), 0..4)),
            0..4,
        ),
    )
        .prop_map(|(server, top, hosts)| {
            let mut s = String::new();
            if let Some(server) = server {
                s.push_str(&format!("server = {server}\n"));
            }
            for (k, v) in top {
                s.push_str(&format!("{k} = {v}\n"));
            }
            for (url, settings) in hosts {
                s.push_str(&format!("[host.{}]\n", toml_string(&url)));
                for (k, v) in settings {
                    s.push_str(&format!("{k} = {v}\n"));
                }
            }
            s
        })
        .boxed()
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn hosts_files_parse_or_fail_cleanly(
        text in prop_oneof![4 => hosts_toml(), 1 => hostile_string()],
        registry in prop_oneof![Just("docker.io".to_string()), hostile_string()],
    ) {
        match hosts::parse_hosts_toml(&text, &registry, Path::new("/etc/crust/certs.d/r")) {
            Ok(eps) => {
                for ep in eps {
                    prop_assert!(ep.path_prefix.is_empty() || ep.path_prefix.starts_with('/'));
                    for ca in &ep.ca {
                        prop_assert!(ca.is_absolute());
                    }
                }
            }
            Err(e) => check_message("parse_hosts_toml", &e)?,
        }
    }
}
