//! Checks of the daemon's layering, read from the sources: no module
//! imports, directly or through others, a module that imports it back;
//! pods and containers know nothing of each other; nothing below the
//! services knows of tonic.
//!
//! An edge A -> B is a `crate::B` path in a file of top-level module A (or
//! a `super::b` path between sibling files of one directory module), in
//! code outside comments and `#[cfg(test)]` modules. Test-only code
//! (`fakes/`, `tests.rs`, this file) is left out: test rigs may reach
//! everywhere. `cargo test -p crust-runtime layering -- --nocapture` prints
//! the graph; `CRUST_LAYERING_SRC=DIR` checks another source tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules and files that only build with `cfg(test)`.
const TEST_ONLY_MODULES: &[&str] = &["fakes", "layering"];
const TEST_ONLY_FILES: &[&str] = &["tests.rs"];

/// Modules that may know of tonic: the gRPC layer, the server, its tower
/// layers, the CLI's client, and the OTLP exporter (a gRPC client).
const GRPC: &[&str] = &[
    "services",
    "server",
    "api_version",
    "idle",
    "cli",
    "main",
    "otel",
];

struct Source {
    /// Top-level module (`pods` for `pods/host.rs`; `main` for main.rs).
    top: String,
    /// The file's own module inside a directory module (`host`), `mod` for
    /// its mod.rs; None for a single-file top-level module.
    child: Option<String>,
    code: String,
}

fn sources() -> Vec<Source> {
    // Another tree (e.g. an old commit's, to see the checks fail there).
    let root = std::env::var_os("CRUST_LAYERING_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .filter(|p| !TEST_ONLY_FILES.contains(&p.file_name().unwrap().to_str().unwrap()))
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap();
            let parts: Vec<String> = rel
                .components()
                .map(|c| {
                    c.as_os_str()
                        .to_string_lossy()
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .collect();
            let (top, child) = match parts.as_slice() {
                [one] => (one.clone(), None),
                [dir, file] => (dir.clone(), Some(file.clone())),
                _ => panic!("unexpected depth: {}", rel.display()),
            };
            Source {
                top,
                child,
                code: code_of(&std::fs::read_to_string(&p).unwrap()),
            }
        })
        .filter(|s| !TEST_ONLY_MODULES.contains(&s.top.as_str()))
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file: no comments, no inline `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|line| {
            // A `//` outside a string literal starts a comment.
            let mut in_str = false;
            let b = line.as_bytes();
            for i in 0..b.len() {
                match b[i] {
                    b'"' if i == 0 || b[i - 1] != b'\\' => in_str = !in_str,
                    b'/' if !in_str && b.get(i + 1) == Some(&b'/') => return &line[..i],
                    _ => {}
                }
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers right after each `prefix` (`crate::` -> `pods`), and
/// inside a brace group right after it (`super::{files, pause}`).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices(prefix) {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(0)];
            out.extend(group.split(',').map(|s| ident(s.trim())));
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Top-level module -> the top-level modules it uses.
fn top_graph(sources: &[Source]) -> Graph {
    let tops: BTreeSet<&str> = sources.iter().map(|s| s.top.as_str()).collect();
    let mut g = Graph::new();
    for s in sources.iter().filter(|s| s.top != "main") {
        let edges = g.entry(s.top.clone()).or_default();
        for n in names_after(&s.code, "crate::") {
            if n != s.top && tops.contains(n.as_str()) {
                edges.insert(n);
            }
        }
    }
    g
}

/// For each directory module: sibling file -> the sibling files it uses
/// (mod.rs, the module's face, left out).
fn sibling_graphs(sources: &[Source]) -> BTreeMap<String, Graph> {
    let mut out: BTreeMap<String, Graph> = BTreeMap::new();
    for s in sources {
        let Some(child) = s.child.as_ref().filter(|c| *c != "mod") else {
            continue;
        };
        let siblings: BTreeSet<String> = sources
            .iter()
            .filter(|o| o.top == s.top)
            .filter_map(|o| o.child.clone())
            .filter(|c| c != "mod")
            .collect();
        let mut used = names_after(&s.code, "super::");
        used.extend(names_after(&s.code, &format!("crate::{}::", s.top)));
        let edges = out
            .entry(s.top.clone())
            .or_default()
            .entry(child.clone())
            .or_default();
        edges.extend(
            used.into_iter()
                .filter(|n| n != child && siblings.contains(n)),
        );
    }
    out
}

/// A cycle of `g`, if it has one.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

fn print(title: &str, g: &Graph) {
    println!("{title}");
    for (n, edges) in g {
        let edges: Vec<&str> = edges.iter().map(String::as_str).collect();
        println!("  {n} -> {}", edges.join(", "));
    }
}

#[test]
fn the_module_graph_has_no_cycle() {
    let sources = sources();
    let g = top_graph(&sources);
    print("top-level modules:", &g);
    assert_eq!(cycle(&g), None, "a cycle between top-level modules");
    for (module, siblings) in sibling_graphs(&sources) {
        print(&format!("{module}/:"), &siblings);
        assert_eq!(cycle(&siblings), None, "a cycle inside {module}/");
    }
}

#[test]
fn pods_and_containers_know_nothing_of_each_other_or_of_the_layers_above() {
    let g = top_graph(&sources());
    for (from, to) in [
        ("pods", "containers"),
        ("containers", "pods"),
        ("pods", "lifecycle"),
        ("containers", "lifecycle"),
    ] {
        assert!(!g[from].contains(to), "{from} uses {to}");
    }
    for domain in [
        "pods",
        "containers",
        "lifecycle",
        "streaming_backend",
        "launch",
        "monitor",
    ] {
        for above in ["services", "daemon", "server"] {
            assert!(!g[domain].contains(above), "{domain} uses {above}");
        }
    }
}

#[test]
fn nothing_below_the_services_knows_of_tonic() {
    for s in sources() {
        if GRPC.contains(&s.top.as_str()) {
            continue;
        }
        assert!(
            !s.code.contains("tonic"),
            "{}/{} mentions tonic",
            s.top,
            s.child.as_deref().unwrap_or("")
        );
    }
}

/// The checks themselves: they find what they are there to find.
#[test]
fn the_checks_see_cycles_and_grouped_imports() {
    let code =
        code_of("use super::{files, pause};\n// crate::nope\nlet s = \"// x\"; crate::real::f();");
    assert_eq!(
        names_after(&code, "super::"),
        BTreeSet::from(["files".to_string(), "pause".to_string()])
    );
    assert_eq!(
        names_after(&code, "crate::"),
        BTreeSet::from(["real".to_string()])
    );
    let g: Graph = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| (x.to_string(), BTreeSet::from([y.to_string()])))
        .collect();
    assert_eq!(cycle(&g).unwrap().len(), 4);
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&acyclic), None);
}
