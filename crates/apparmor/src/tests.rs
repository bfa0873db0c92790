//! The crate against fake kernel files in a tempdir and a fake parser that
//! "loads" a policy by adding its profile to the fake securityfs list.

use std::sync::{Arc, Mutex};

use super::*;

struct Node {
    dir: tempfile::TempDir,
    paths: KernelPaths,
}

impl Node {
    /// A fake node: module parameter `enabled`, and securityfs with this
    /// profile list unless `profiles` is None.
    fn new(enabled: Option<&str>, profiles: Option<&str>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let paths = KernelPaths {
            enabled: dir.path().join("enabled"),
            securityfs: dir.path().join("apparmor"),
        };
        if let Some(e) = enabled {
            std::fs::write(&paths.enabled, e).unwrap();
        }
        if let Some(p) = profiles {
            std::fs::create_dir(&paths.securityfs).unwrap();
            std::fs::write(paths.securityfs.join("profiles"), p).unwrap();
        }
        Node { dir, paths }
    }

    fn profiles(&self) -> PathBuf {
        self.paths.securityfs.join("profiles")
    }
}

/// Records every load; appends `<name> (enforce)` to the fake list unless
/// told to fail or to "forget".
#[derive(Clone, Default)]
struct FakeParser {
    list: Arc<Mutex<Option<PathBuf>>>,
    loads: Arc<Mutex<Vec<String>>>,
    fail: Option<&'static str>,
}

impl Parser for FakeParser {
    fn load(&self, policy: &str) -> Result<(), Error> {
        self.loads.lock().unwrap().push(policy.to_string());
        if let Some(stderr) = self.fail {
            return Err(Error::ParserFailed {
                status: "exit status: 1".into(),
                stderr: stderr.into(),
            });
        }
        if let Some(list) = self.list.lock().unwrap().as_ref() {
            let mut text = std::fs::read_to_string(list).unwrap();
            text.push_str(&format!("{DEFAULT_PROFILE} (enforce)\n"));
            std::fs::write(list, text).unwrap();
        }
        Ok(())
    }
}

#[test]
fn detect_needs_the_module_and_securityfs() {
    assert_eq!(
        detect(&Node::new(Some("Y\n"), Some("")).paths),
        Availability::Enabled
    );
    let off = detect(&Node::new(Some("N\n"), Some("")).paths);
    assert_eq!(
        off,
        Availability::Disabled("the AppArmor module is disabled".into())
    );
    let absent = detect(&Node::new(None, None).paths);
    assert_eq!(
        absent,
        Availability::Disabled("the kernel has no AppArmor".into())
    );
    match detect(&Node::new(Some("Y\n"), None).paths) {
        Availability::Disabled(why) => assert!(why.contains("securityfs"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn is_loaded_matches_whole_names_only() {
    let node = Node::new(
        Some("Y"),
        Some(
            "crust-default (enforce)\n\
             cri-validate-apparmor-test-deny-write (enforce)\n\
             /usr/bin/man (complain)\n\
             name with spaces (unconfined)\n\
             parent//child (enforce)\n",
        ),
    );
    let aa = AppArmor::new(node.paths.clone(), Box::new(FakeParser::default()), None);
    for name in [
        "crust-default",
        "cri-validate-apparmor-test-deny-write",
        "/usr/bin/man",
        "name with spaces",
        "parent//child",
    ] {
        assert!(aa.is_loaded(name).unwrap(), "{name}");
    }
    for name in [
        "crust",
        "crust-default (enforce)",
        "deny-write",
        "parent",
        "",
        "name",
        "crust-default\n",
    ] {
        assert!(!aa.is_loaded(name).unwrap(), "{name:?}");
    }
}

#[test]
fn is_loaded_reports_an_unreadable_list() {
    let node = Node::new(Some("Y"), None);
    let aa = AppArmor::new(node.paths.clone(), Box::new(FakeParser::default()), None);
    let err = aa.is_loaded("x").unwrap_err();
    assert!(matches!(err, Error::ReadProfiles { .. }), "{err}");
    assert!(err.to_string().contains("profiles"), "{err}");
}

#[test]
fn ensure_default_loads_once_and_only_when_missing() {
    let node = Node::new(Some("Y"), Some("other (enforce)\n"));
    let parser = FakeParser::default();
    *parser.list.lock().unwrap() = Some(node.profiles());
    let aa = AppArmor::new(
        node.paths.clone(),
        Box::new(parser.clone()),
        Some(PINNED_ABI),
    );
    assert_eq!(aa.ensure_default().unwrap(), Loaded::Now);
    assert_eq!(aa.ensure_default().unwrap(), Loaded::Already);
    let loads = parser.loads.lock().unwrap().clone();
    assert_eq!(loads.len(), 1);
    assert_eq!(loads[0], aa.default_policy());
    assert!(loads[0].contains("profile crust-default "), "{}", loads[0]);
    assert!(loads[0].contains("abi <abi/3.0>,"), "{}", loads[0]);

    // Unloaded behind the daemon's back (apparmor_parser -R): loaded again.
    std::fs::write(node.profiles(), "other (enforce)\n").unwrap();
    assert_eq!(aa.ensure_default().unwrap(), Loaded::Now);
    assert_eq!(parser.loads.lock().unwrap().len(), 2);
    drop(node.dir);
}

#[test]
fn ensure_default_reports_the_parsers_words() {
    let node = Node::new(Some("Y"), Some(""));
    let parser = FakeParser {
        fail: Some("AppArmor parser error at line 7: syntax error"),
        ..FakeParser::default()
    };
    let aa = AppArmor::new(node.paths.clone(), Box::new(parser), None);
    let err = aa.ensure_default().unwrap_err();
    assert!(err.to_string().contains("line 7: syntax error"), "{err}");
}

#[test]
fn a_load_that_does_not_show_up_is_an_error() {
    let node = Node::new(Some("Y"), Some(""));
    // Succeeds but never adds the profile to the list.
    let aa = AppArmor::new(node.paths.clone(), Box::new(FakeParser::default()), None);
    let err = aa.ensure_default().unwrap_err();
    assert!(matches!(err, Error::NotLoadedAfterLoad { .. }), "{err}");
}

/// `parser.load`, again while the script just written is "text file busy"
/// (another test thread's fork may hold its write descriptor a moment).
fn load(parser: &ApparmorParser, policy: &str) -> Result<(), Error> {
    for _ in 0..50 {
        match parser.load(policy) {
            Err(Error::RunParser { source, .. }) if source.raw_os_error() == Some(26) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
    parser.load(policy)
}

#[test]
fn the_real_parser_is_run_with_the_policy_on_stdin() {
    // A stand-in "apparmor_parser" script: checks its flags, copies stdin.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("got");
    let script = dir.path().join("apparmor_parser");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$*\" = '--replace --skip-cache' ] || {{ echo \"bad args: $*\" >&2; exit 3; }}\ncat > {}\n",
            out.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let parser = ApparmorParser {
        path: script.clone(),
    };
    parser.load("profile x {}\n").unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "profile x {}\n");

    std::fs::write(&script, "#!/bin/sh\necho 'parse error' >&2\nexit 1\n").unwrap();
    let err = load(&parser, "x").unwrap_err();
    assert!(err.to_string().contains("parse error"), "{err}");
    assert!(err.to_string().contains("exit status: 1"), "{err}");

    let missing = ApparmorParser {
        path: dir.path().join("nope"),
    };
    assert!(matches!(missing.load("x"), Err(Error::RunParser { .. })));
}

#[test]
fn profile_lines() {
    assert_eq!(profile_name(b"a (enforce)"), Some(&b"a"[..]));
    assert_eq!(profile_name(b"a (b) (complain)"), Some(&b"a (b)"[..]));
    assert_eq!(profile_name(b"no mode"), None);
    assert_eq!(profile_name(b""), None);
}

#[test]
fn node_abi_only_when_present() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(node_abi(dir.path()), None);
    std::fs::create_dir(dir.path().join("abi")).unwrap();
    std::fs::write(dir.path().join("abi/3.0"), "").unwrap();
    assert_eq!(node_abi(dir.path()), Some(PINNED_ABI));
}
