//! kubelet 1.36 speaks the runtime.v1 of cri-api `kubernetes-1.36.0`; crust's
//! proto adds fields of cri-api master (1.37). This test keeps the two
//! wire-compatible: every service, RPC, message, field and enum value of
//! 1.36.0 must still be in `proto/runtime/v1/api.proto` with the same name,
//! number, type and label, and what crust adds must be exactly the fields
//! listed in `ADDED` (so a renumbered, retyped or dropped field fails here,
//! and so does an addition nobody meant).
//!
//! `tests/cri-v1-1.36.0.wire` is the wire digest of upstream's 1.36.0 file
//! (one line per field, enum value and RPC, made by `digest` below). To
//! make it again from upstream's file:
//!
//! ```sh
//! CRI_API_PROTO=/path/to/cri-api-1.36.0/api.proto \
//!   cargo test -p crust-api --test wire_1_36 -- --ignored regenerate
//! ```

use std::collections::BTreeSet;
use std::path::Path;

use prost_types::{DescriptorProto, FileDescriptorProto};

const FIXTURE: &str = "tests/cri-v1-1.36.0.wire";

/// What crust's v1 proto has beyond 1.36.0 (KEP-5855, cri-api master).
const ADDED: &[&str] = &[
    "field Mount 11 mount_options string repeated",
    "field RuntimeFeatures 3 mount_options bool optional",
];

/// The one file of `path` compiled (with `include` as its import root).
fn compile(include: &Path, file: &str) -> FileDescriptorProto {
    let fds = protox::compile([include.join(file)], [include]).expect("the proto compiles");
    fds.file
        .into_iter()
        .find(|f| f.package() == "runtime.v1")
        .expect("runtime.v1 in the descriptor set")
}

fn local(type_name: &str) -> &str {
    type_name.trim_start_matches(".runtime.v1.")
}

fn type_of(f: &prost_types::FieldDescriptorProto) -> String {
    use prost_types::field_descriptor_proto::Type;
    match f.r#type() {
        Type::Message | Type::Enum => local(f.type_name()).to_string(),
        t => t
            .as_str_name()
            .trim_start_matches("TYPE_")
            .to_ascii_lowercase(),
    }
}

/// One line per RPC, field and enum value: everything the wire (and the
/// generated names) depend on, nothing else (comments, order, options).
fn digest(file: &FileDescriptorProto) -> BTreeSet<String> {
    fn messages(prefix: &str, ms: &[DescriptorProto], out: &mut BTreeSet<String>) {
        for m in ms {
            let name = format!("{prefix}{}", m.name());
            for f in &m.field {
                let label = f
                    .label()
                    .as_str_name()
                    .trim_start_matches("LABEL_")
                    .to_ascii_lowercase();
                let oneof = match f.oneof_index {
                    Some(i) => format!(" oneof {}", m.oneof_decl[i as usize].name()),
                    None => String::new(),
                };
                out.insert(format!(
                    "field {name} {} {} {} {label}{oneof}",
                    f.number(),
                    f.name(),
                    type_of(f),
                ));
            }
            for e in &m.enum_type {
                enum_values(&format!("{name}."), e, out);
            }
            messages(&format!("{name}."), &m.nested_type, out);
            out.insert(format!("message {name}"));
        }
    }
    fn enum_values(prefix: &str, e: &prost_types::EnumDescriptorProto, out: &mut BTreeSet<String>) {
        for v in &e.value {
            out.insert(format!(
                "enum {prefix}{} {} {}",
                e.name(),
                v.number(),
                v.name()
            ));
        }
    }
    let mut out = BTreeSet::new();
    messages("", &file.message_type, &mut out);
    for e in &file.enum_type {
        enum_values("", e, &mut out);
    }
    for s in &file.service {
        for m in &s.method {
            let stream = |on: bool| if on { "stream " } else { "" };
            out.insert(format!(
                "rpc {}.{} ({}{}) returns ({}{})",
                s.name(),
                m.name(),
                stream(m.client_streaming()),
                local(m.input_type()),
                stream(m.server_streaming()),
                local(m.output_type()),
            ));
        }
    }
    out
}

#[test]
fn v1_keeps_the_wire_of_1_36_and_adds_only_the_listed_fields() {
    let ours = digest(&compile(Path::new("proto"), "runtime/v1/api.proto"));
    let text = std::fs::read_to_string(FIXTURE).expect("the 1.36.0 digest");
    let upstream: BTreeSet<String> = text.lines().map(str::to_string).collect();
    assert!(
        upstream.len() > 800,
        "a whole digest: {} lines",
        upstream.len()
    );
    let missing: Vec<_> = upstream.difference(&ours).collect();
    assert!(
        missing.is_empty(),
        "1.36.0 has these, crust's proto has not (or differently): {missing:#?}"
    );
    let added: Vec<&str> = ours.difference(&upstream).map(String::as_str).collect();
    assert_eq!(added, ADDED, "crust's proto adds these to 1.36.0");
}

/// Rewrites the fixture from upstream's file (see the module doc).
#[test]
#[ignore = "needs upstream's api.proto at CRI_API_PROTO"]
fn regenerate() {
    let path = std::env::var("CRI_API_PROTO").expect("CRI_API_PROTO");
    let path = Path::new(&path);
    let dir = path.parent().unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let lines = digest(&compile(dir, name));
    let mut text = lines.into_iter().collect::<Vec<_>>().join("\n");
    text.push('\n');
    std::fs::write(FIXTURE, text).unwrap();
}

/// kubelet 1.36's `Mount`: without `mount_options` (11).
#[derive(Clone, PartialEq, prost::Message)]
struct Mount136 {
    #[prost(string, tag = "1")]
    container_path: String,
    #[prost(string, tag = "2")]
    host_path: String,
    #[prost(bool, tag = "3")]
    readonly: bool,
    #[prost(bool, tag = "4")]
    selinux_relabel: bool,
    #[prost(enumeration = "crust_api::v1::MountPropagation", tag = "5")]
    propagation: i32,
    #[prost(message, repeated, tag = "6")]
    uid_mappings: Vec<crust_api::v1::IdMapping>,
    #[prost(message, repeated, tag = "7")]
    gid_mappings: Vec<crust_api::v1::IdMapping>,
    #[prost(bool, tag = "8")]
    recursive_read_only: bool,
    #[prost(message, optional, tag = "9")]
    image: Option<crust_api::v1::ImageSpec>,
    #[prost(string, tag = "10")]
    image_sub_path: String,
}

/// A 1.36 kubelet's mount reaches crust whole and without options; a mount
/// with options reaches a 1.36 reader (crictl 1.36, a CRI proxy) whole but for
/// them.
#[test]
fn mounts_cross_between_1_36_and_master() {
    use prost::Message;
    let map = crust_api::v1::IdMapping {
        host_id: 100000,
        container_id: 0,
        length: 65536,
    };
    let old = Mount136 {
        container_path: "/data".into(),
        host_path: "/srv/data".into(),
        readonly: true,
        selinux_relabel: true,
        propagation: crust_api::v1::MountPropagation::PropagationHostToContainer as i32,
        uid_mappings: vec![map],
        gid_mappings: vec![map],
        recursive_read_only: true,
        image: Some(crust_api::v1::ImageSpec {
            image: "sha256:abc".into(),
            ..Default::default()
        }),
        image_sub_path: "sub".into(),
    };
    let new = crust_api::v1::Mount::decode(old.encode_to_vec().as_slice()).unwrap();
    assert!(new.mount_options.is_empty());
    let expect = crust_api::v1::Mount {
        container_path: old.container_path.clone(),
        host_path: old.host_path.clone(),
        readonly: true,
        selinux_relabel: true,
        propagation: old.propagation,
        uid_mappings: old.uid_mappings.clone(),
        gid_mappings: old.gid_mappings.clone(),
        recursive_read_only: true,
        image: old.image.clone(),
        image_sub_path: old.image_sub_path.clone(),
        mount_options: vec![],
    };
    assert_eq!(new, expect);
    // Without options the bytes are 1.36's own.
    assert_eq!(new.encode_to_vec(), old.encode_to_vec());
    let with_options = crust_api::v1::Mount {
        mount_options: vec!["noexec".into(), "nosuid".into()],
        ..expect
    };
    let seen = Mount136::decode(with_options.encode_to_vec().as_slice()).unwrap();
    assert_eq!(seen, old);
}
