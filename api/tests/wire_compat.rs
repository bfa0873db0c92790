//! The daemon serves v1alpha2 by routing it to the v1 services, which is
//! only sound while every v1alpha2 message, field, enum value and RPC exists
//! in v1 with the same number and type. This test fails the build of any
//! proto edit that breaks that.

use std::collections::HashMap;

use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorProto};

fn load(path: &str) -> FileDescriptorProto {
    let fds = protox::compile([path], ["proto"]).expect("protos compile");
    fds.file
        .into_iter()
        .find(|f| f.name() == path.trim_start_matches("proto/"))
        .expect("file in descriptor set")
}

fn messages(f: &FileDescriptorProto) -> HashMap<String, DescriptorProto> {
    fn walk(prefix: &str, ms: &[DescriptorProto], out: &mut HashMap<String, DescriptorProto>) {
        for m in ms {
            let name = format!("{prefix}{}", m.name());
            walk(&format!("{name}."), &m.nested_type, out);
            out.insert(name, m.clone());
        }
    }
    let mut out = HashMap::new();
    walk("", &f.message_type, &mut out);
    out
}

fn enums(f: &FileDescriptorProto) -> HashMap<String, EnumDescriptorProto> {
    let mut out: HashMap<_, _> = f
        .enum_type
        .iter()
        .map(|e| (e.name().to_string(), e.clone()))
        .collect();
    for (name, m) in messages(f) {
        for e in &m.enum_type {
            out.insert(format!("{name}.{}", e.name()), e.clone());
        }
    }
    out
}

fn local(type_name: &str) -> String {
    type_name
        .trim_start_matches(".runtime.v1alpha2.")
        .trim_start_matches(".runtime.v1.")
        .to_string()
}

#[test]
fn v1alpha2_is_a_wire_subset_of_v1() {
    let v1 = load("proto/runtime/v1/api.proto");
    let a2 = load("proto/runtime/v1alpha2/api.proto");
    let (m1, m2) = (messages(&v1), messages(&a2));
    let mut problems = Vec::new();
    for (name, m) in &m2 {
        let Some(n) = m1.get(name) else {
            problems.push(format!("message {name} missing in v1"));
            continue;
        };
        for f in &m.field {
            match n.field.iter().find(|g| g.number() == f.number()) {
                None => problems.push(format!(
                    "{name}.{} (#{}) missing in v1",
                    f.name(),
                    f.number()
                )),
                Some(g) => {
                    if (g.r#type(), g.label(), local(g.type_name()))
                        != (f.r#type(), f.label(), local(f.type_name()))
                    {
                        problems.push(format!("{name}.{} differs in v1", f.name()));
                    }
                }
            }
        }
    }
    let (e1, e2) = (enums(&v1), enums(&a2));
    for (name, e) in &e2 {
        let Some(n) = e1.get(name) else {
            problems.push(format!("enum {name} missing in v1"));
            continue;
        };
        for v in &e.value {
            if !n.value.iter().any(|w| w.number() == v.number()) {
                problems.push(format!("{name}.{} missing in v1", v.name()));
            }
        }
    }
    for s in &a2.service {
        let s1 = v1.service.iter().find(|t| t.name() == s.name());
        for m in &s.method {
            let ok = s1
                .and_then(|s1| s1.method.iter().find(|n| n.name() == m.name()))
                .is_some_and(|n| {
                    local(n.input_type()) == local(m.input_type())
                        && local(n.output_type()) == local(m.output_type())
                        && n.server_streaming() == m.server_streaming()
                });
            if !ok {
                problems.push(format!("rpc {}.{} differs in v1", s.name(), m.name()));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(m2.len() > 100, "v1alpha2 descriptor looks empty");
}

#[test]
fn v1_has_every_cri_rpc() {
    let v1 = load("proto/runtime/v1/api.proto");
    let count: usize = v1.service.iter().map(|s| s.method.len()).sum();
    // kubernetes-1.36.0: 35 RuntimeService + 6 ImageService RPCs.
    assert_eq!(count, 41);
}
