//! CDI spec files on the node: read at every CreateContainer that asks for
//! CDI devices (so a DRA driver's newly written spec counts at once, as
//! with containerd's auto-refresh), in the configured dirs' order, each
//! dir's `*.json`, `*.yaml`, `*.yml` by name. Parsing and applying are
//! `crust_oci::cdi`'s.

use std::path::PathBuf;

use crust_oci::cdi::{CdiRegistry, MAX_SPEC_FILE_BYTES};

/// The registry of every spec file in `dirs` (later dirs win); a missing
/// dir is none, an unreadable file is listed in the registry's errors.
pub fn load(dirs: &[PathBuf]) -> CdiRegistry {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "json" || e == "yaml" || e == "yml")
            })
            .collect();
        paths.sort();
        for path in paths {
            match read_bounded(&path) {
                Ok(text) => files.push((path, text)),
                Err(e) => errors.push(format!("{}: {e}", path.display())),
            }
        }
    }
    let mut reg = CdiRegistry::from_files(files);
    reg.errors.extend(errors);
    reg
}

fn read_bounded(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    if f.metadata()?.len() > MAX_SPEC_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_SPEC_FILE_BYTES} bytes"
        )));
    }
    let mut text = String::new();
    f.take(MAX_SPEC_FILE_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_dirs_win_and_bad_files_are_listed() {
        let etc = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        let spec = |v: &str| {
            format!(
                r#"{{"cdiVersion":"0.6.0","kind":"x.com/c","devices":[{{"name":"d","containerEdits":{{"env":["V={v}"]}}}}]}}"#
            )
        };
        std::fs::write(etc.path().join("a.json"), spec("etc")).unwrap();
        std::fs::write(run.path().join("a.json"), spec("run")).unwrap();
        std::fs::write(run.path().join("bad.yaml"), "devices: [").unwrap();
        std::fs::write(run.path().join("ignored.txt"), "x").unwrap();
        let reg = load(&[
            etc.path().to_path_buf(),
            run.path().to_path_buf(),
            "/nonexistent-cdi-dir".into(),
        ]);
        assert_eq!(reg.errors.len(), 1, "{:?}", reg.errors);
        let e = reg.resolve(&[("f".into(), "x.com/c=d".into())]).unwrap();
        assert_eq!(e.last().unwrap().env, vec!["V=run".to_string()]);
    }
}
