//! Process arguments, environment and working directory.

use crust_api::v1::ContainerConfig;
use crust_quote::quote_os;

use crate::validate::{abs_path, is_under, no_nul};
use crate::{ImageConfig, SpecError};

/// The PATH every container gets unless the image or request sets one
/// (containerd's `WithDefaultPathEnv`).
pub const DEFAULT_PATH_ENV: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The argv of the container process, as Kubernetes defines it:
///
/// - `command` set: `command + args`; the image's Entrypoint and Cmd are
///   ignored.
/// - only `args` set: image `Entrypoint + args`.
/// - neither: image `Entrypoint + Cmd`.
///
/// An Entrypoint of `[""]` counts as none (Docker writes that for
/// `ENTRYPOINT []`). An empty result, or an empty argv\[0\], is an error.
pub fn process_args(
    config: &ContainerConfig,
    image: &ImageConfig,
) -> Result<Vec<String>, SpecError> {
    for (i, a) in config.command.iter().enumerate() {
        no_nul(&format!("config.command[{i}]"), a)?;
    }
    for (i, a) in config.args.iter().enumerate() {
        no_nul(&format!("config.args[{i}]"), a)?;
    }
    let mut argv: Vec<String>;
    if !config.command.is_empty() {
        argv = config.command.clone();
        argv.extend(config.args.iter().cloned());
    } else {
        argv = if image.entrypoint.len() == 1 && image.entrypoint[0].is_empty() {
            Vec::new()
        } else {
            for (i, a) in image.entrypoint.iter().enumerate() {
                no_nul(&format!("image.config.Entrypoint[{i}]"), a)?;
            }
            image.entrypoint.clone()
        };
        if !config.args.is_empty() {
            argv.extend(config.args.iter().cloned());
        } else {
            for (i, a) in image.cmd.iter().enumerate() {
                no_nul(&format!("image.config.Cmd[{i}]"), a)?;
            }
            argv.extend(image.cmd.iter().cloned());
        }
    }
    if argv.is_empty() {
        return Err(SpecError::invalid(
            "config.command",
            "no command specified: the request has no command or args and the image no Entrypoint or Cmd",
        ));
    }
    if argv[0].is_empty() {
        return Err(SpecError::invalid(
            "config.command",
            "the executable (first argument) is empty",
        ));
    }
    Ok(argv)
}

/// Checks an environment variable name: non-empty, no `=`, no NUL.
fn env_key(field: &str, key: &str) -> Result<(), SpecError> {
    if key.is_empty() {
        return Err(SpecError::invalid(
            field,
            "environment variable name is empty",
        ));
    }
    if key.contains('=') {
        return Err(SpecError::invalid(
            field,
            format!(
                "environment variable name {key} must not contain '='",
                key = quote_os(&key)
            ),
        ));
    }
    no_nul(field, key)
}

/// Sets `key=value`, replacing an earlier entry with the same key in place.
fn set_env(env: &mut Vec<String>, key: &str, entry: String) {
    if let Some(slot) = env
        .iter_mut()
        .find(|e| e.split_once('=').map(|(k, _)| k) == Some(key))
    {
        *slot = entry;
    } else {
        env.push(entry);
    }
}

/// The process environment, in containerd's order, later entries replacing
/// earlier ones with the same name in place: the default PATH, `HOSTNAME`,
/// `TERM=xterm` when `tty`, the image's Env, then the request's envs.
pub fn process_env(
    config: &ContainerConfig,
    image: &ImageConfig,
    hostname: &str,
) -> Result<Vec<String>, SpecError> {
    let mut env = Vec::new();
    set_env(&mut env, "PATH", DEFAULT_PATH_ENV.to_string());
    set_env(&mut env, "HOSTNAME", format!("HOSTNAME={hostname}"));
    if config.tty {
        set_env(&mut env, "TERM", "TERM=xterm".to_string());
    }
    for (i, e) in image.env.iter().enumerate() {
        let field = format!("image.config.Env[{i}]");
        let Some((k, _)) = e.split_once('=') else {
            return Err(SpecError::invalid(
                field,
                format!("{e} is not of the form KEY=value", e = quote_os(&e)),
            ));
        };
        env_key(&field, k)?;
        no_nul(&field, e)?;
        set_env(&mut env, k, e.clone());
    }
    for (i, kv) in config.envs.iter().enumerate() {
        env_key(&format!("config.envs[{i}].key"), &kv.key)?;
        no_nul(&format!("config.envs[{i}].value"), &kv.value)?;
        set_env(&mut env, &kv.key, format!("{}={}", kv.key, kv.value));
    }
    Ok(env)
}

/// The working directory: the request's, else the image's, else `/`. Must be
/// absolute (and without `..`); returned clean.
pub fn process_cwd(config: &ContainerConfig, image: &ImageConfig) -> Result<String, SpecError> {
    let (field, dir) = if !config.working_dir.is_empty() {
        ("config.working_dir", &config.working_dir)
    } else if !image.working_dir.is_empty() {
        ("image.config.WorkingDir", &image.working_dir)
    } else {
        return Ok("/".to_string());
    };
    let clean = abs_path(field, dir)?;
    no_magic_links(field, &clean)?;
    Ok(clean)
}

/// Where a working dir must not be: /proc (its magic links, such as
/// /proc/self/fd/N or /proc/1/cwd, lead to whatever a descriptor of the
/// runtime names, possibly a host dir: CVE-2024-21626) and the /dev links
/// runtimes create into it.
const MAGIC_DIRS: &[&str] = &[
    "/proc",
    "/dev/fd",
    "/dev/stdin",
    "/dev/stdout",
    "/dev/stderr",
];

/// The dir of [`MAGIC_DIRS`] the clean absolute `path` lies in, if any:
/// no working dir may be there (also once the image's symlinks on the way
/// are resolved, which the daemon checks in the rootfs).
pub fn magic_dir(clean: &str) -> Option<&'static str> {
    MAGIC_DIRS.iter().find(|d| is_under(clean, d)).copied()
}

/// Refuses a `clean` absolute path inside one of [`MAGIC_DIRS`].
fn no_magic_links(field: &str, clean: &str) -> Result<(), SpecError> {
    match magic_dir(clean) {
        Some(d) => Err(SpecError::invalid(
            field,
            format!(
                "{} is inside {d}, whose entries lead outside the container",
                quote_os(clean)
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::KeyValue;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn cfg(command: &[&str], args: &[&str]) -> ContainerConfig {
        ContainerConfig {
            command: s(command),
            args: s(args),
            ..Default::default()
        }
    }

    fn img(entrypoint: &[&str], cmd: &[&str]) -> ImageConfig {
        ImageConfig {
            entrypoint: s(entrypoint),
            cmd: s(cmd),
            ..Default::default()
        }
    }

    #[test]
    fn image_entrypoint_and_cmd() {
        let a = process_args(&cfg(&[], &[]), &img(&["/ep", "-x"], &["c1", "c2"])).unwrap();
        assert_eq!(a, s(&["/ep", "-x", "c1", "c2"]));
    }

    #[test]
    fn command_overrides_entrypoint_and_drops_cmd() {
        let a = process_args(&cfg(&["/bin/sh"], &[]), &img(&["/ep"], &["c1"])).unwrap();
        assert_eq!(a, s(&["/bin/sh"]));
    }

    #[test]
    fn command_and_args() {
        let a = process_args(
            &cfg(&["/bin/sh", "-c"], &["echo hi"]),
            &img(&["/ep"], &["c1"]),
        )
        .unwrap();
        assert_eq!(a, s(&["/bin/sh", "-c", "echo hi"]));
    }

    #[test]
    fn args_override_cmd_keep_entrypoint() {
        let a = process_args(&cfg(&[], &["a1", "a2"]), &img(&["/ep"], &["c1"])).unwrap();
        assert_eq!(a, s(&["/ep", "a1", "a2"]));
    }

    #[test]
    fn args_without_entrypoint() {
        let a = process_args(&cfg(&[], &["/bin/true"]), &img(&[], &["c1"])).unwrap();
        assert_eq!(a, s(&["/bin/true"]));
    }

    #[test]
    fn cmd_only() {
        let a = process_args(&cfg(&[], &[]), &img(&[], &["/bin/sh", "-c", "x"])).unwrap();
        assert_eq!(a, s(&["/bin/sh", "-c", "x"]));
    }

    #[test]
    fn empty_string_entrypoint_is_none() {
        let a = process_args(&cfg(&[], &[]), &img(&[""], &["/bin/true"])).unwrap();
        assert_eq!(a, s(&["/bin/true"]));
    }

    #[test]
    fn empty_result_is_error() {
        let e = process_args(&cfg(&[], &[]), &img(&[], &[])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("config.command: no command specified"),
            "{e}"
        );
        let e = process_args(&cfg(&[], &[]), &img(&[""], &[])).unwrap_err();
        assert!(e.to_string().contains("no command"), "{e}");
    }

    #[test]
    fn empty_executable_is_error() {
        let e = process_args(&cfg(&[""], &["x"]), &img(&[], &[])).unwrap_err();
        assert!(e.to_string().contains("executable"), "{e}");
    }

    #[test]
    fn nul_in_args_rejected() {
        let e = process_args(&cfg(&["/bin/sh", "a\0b"], &[]), &img(&[], &[])).unwrap_err();
        assert_eq!(e.field(), "config.command[1]");
        let e = process_args(&cfg(&[], &["a\0"]), &img(&[], &[])).unwrap_err();
        assert_eq!(e.field(), "config.args[0]");
        let e = process_args(&cfg(&[], &[]), &img(&["/x\0"], &[])).unwrap_err();
        assert_eq!(e.field(), "image.config.Entrypoint[0]");
        let e = process_args(&cfg(&[], &[]), &img(&[], &["\0"])).unwrap_err();
        assert_eq!(e.field(), "image.config.Cmd[0]");
    }

    fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    #[test]
    fn env_order_and_override() {
        let c = ContainerConfig {
            envs: vec![
                kv("B", "from-config"),
                kv("C", "c=with=equals"),
                kv("EMPTY", ""),
            ],
            ..Default::default()
        };
        let i = ImageConfig {
            env: s(&["PATH=/image/bin", "A=1", "B=from-image"]),
            ..Default::default()
        };
        let env = process_env(&c, &i, "pod-host").unwrap();
        assert_eq!(
            env,
            s(&[
                "PATH=/image/bin",
                "HOSTNAME=pod-host",
                "A=1",
                "B=from-config",
                "C=c=with=equals",
                "EMPTY=",
            ])
        );
    }

    #[test]
    fn env_defaults() {
        let env = process_env(&ContainerConfig::default(), &ImageConfig::default(), "h").unwrap();
        assert_eq!(env, s(&[DEFAULT_PATH_ENV, "HOSTNAME=h"]));
    }

    #[test]
    fn env_tty_sets_term() {
        let c = ContainerConfig {
            tty: true,
            ..Default::default()
        };
        let env = process_env(&c, &ImageConfig::default(), "h").unwrap();
        assert!(env.contains(&"TERM=xterm".to_string()));
        let c = ContainerConfig {
            tty: true,
            envs: vec![kv("TERM", "vt100")],
            ..Default::default()
        };
        let env = process_env(&c, &ImageConfig::default(), "h").unwrap();
        assert!(env.contains(&"TERM=vt100".to_string()));
        assert!(!env.contains(&"TERM=xterm".to_string()));
    }

    #[test]
    fn env_config_overrides_hostname_and_path() {
        let c = ContainerConfig {
            envs: vec![kv("HOSTNAME", "mine"), kv("PATH", "/p")],
            ..Default::default()
        };
        let env = process_env(&c, &ImageConfig::default(), "h").unwrap();
        assert_eq!(env, s(&["PATH=/p", "HOSTNAME=mine"]));
    }

    #[test]
    fn env_rejects_bad_keys_and_values() {
        for (k, v, field) in [
            ("A=B", "x", "config.envs[0].key"),
            ("", "x", "config.envs[0].key"),
            ("A\0", "x", "config.envs[0].key"),
            ("A", "x\0y", "config.envs[0].value"),
        ] {
            let c = ContainerConfig {
                envs: vec![kv(k, v)],
                ..Default::default()
            };
            let e = process_env(&c, &ImageConfig::default(), "h").unwrap_err();
            assert_eq!(e.field(), field, "{k:?}={v:?}: {e}");
        }
        let e = process_env(
            &ContainerConfig {
                envs: vec![kv("A=B", "x")],
                ..Default::default()
            },
            &ImageConfig::default(),
            "h",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "config.envs[0].key: environment variable name \"A=B\" must not contain '='"
        );
    }

    #[test]
    fn env_rejects_bad_image_entries() {
        for bad in ["NOEQUALS", "=value", "A=\0", "A\0=x"] {
            let i = ImageConfig {
                env: s(&["OK=1", bad]),
                ..Default::default()
            };
            let e = process_env(&ContainerConfig::default(), &i, "h").unwrap_err();
            assert_eq!(e.field(), "image.config.Env[1]", "{bad:?}");
        }
    }

    #[test]
    fn cwd_precedence() {
        let c = ContainerConfig {
            working_dir: "/work//dir/".into(),
            ..Default::default()
        };
        let i = ImageConfig {
            working_dir: "/img".into(),
            ..Default::default()
        };
        assert_eq!(process_cwd(&c, &i).unwrap(), "/work/dir");
        assert_eq!(
            process_cwd(&ContainerConfig::default(), &i).unwrap(),
            "/img"
        );
        assert_eq!(
            process_cwd(&ContainerConfig::default(), &ImageConfig::default()).unwrap(),
            "/"
        );
    }

    #[test]
    fn cwd_is_no_magic_link() {
        for (bad, field) in [
            ("/proc/self/fd/7", "config.working_dir"),
            ("/proc", "config.working_dir"),
            ("/proc/1/cwd/x", "config.working_dir"),
            ("/dev/fd/3", "config.working_dir"),
            ("//proc//thread-self/root", "config.working_dir"),
            ("/dev/stdin", "config.working_dir"),
        ] {
            let c = ContainerConfig {
                working_dir: bad.into(),
                ..Default::default()
            };
            let e = process_cwd(&c, &ImageConfig::default()).unwrap_err();
            assert!(e.to_string().starts_with(field), "{bad}: {e}");
            let i = ImageConfig {
                working_dir: bad.into(),
                ..Default::default()
            };
            let e = process_cwd(&ContainerConfig::default(), &i).unwrap_err();
            assert!(
                e.to_string().starts_with("image.config.WorkingDir"),
                "{bad}: {e}"
            );
        }
        for ok in ["/procfs", "/dev", "/devices/fd", "/srv/proc/self"] {
            let c = ContainerConfig {
                working_dir: ok.into(),
                ..Default::default()
            };
            assert_eq!(process_cwd(&c, &ImageConfig::default()).unwrap(), ok);
        }
    }

    #[test]
    fn cwd_must_be_absolute() {
        let c = ContainerConfig {
            working_dir: "rel".into(),
            ..Default::default()
        };
        let e = process_cwd(&c, &ImageConfig::default()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("config.working_dir: must be absolute"),
            "{e}"
        );
        let i = ImageConfig {
            working_dir: "/a/../b".into(),
            ..Default::default()
        };
        let e = process_cwd(&ContainerConfig::default(), &i).unwrap_err();
        assert_eq!(e.field(), "image.config.WorkingDir");
    }
}

#[cfg(test)]
mod prop {
    use super::*;
    use crust_quote::testing::{check_message, config, hostile_string};
    use proptest::prelude::*;

    /// Paths made of the components that matter here, and hostile strings.
    fn working_dir() -> BoxedStrategy<String> {
        let part = prop_oneof![
            Just("proc".to_string()),
            Just("dev".to_string()),
            Just("fd".to_string()),
            Just("self".to_string()),
            Just("stdin".to_string()),
            Just("..".to_string()),
            Just(".".to_string()),
            Just(String::new()),
            "[a-z]{1,4}",
        ];
        prop_oneof![
            proptest::collection::vec(part, 0..8).prop_map(|p| format!("/{}", p.join("/"))),
            hostile_string(),
        ]
        .boxed()
    }

    proptest! {
        #![proptest_config(config(1024))]

        /// Any working dir is refused with a bounded message naming its
        /// field, or comes out clean, absolute and outside the magic dirs.
        #[test]
        fn cwd_is_never_a_magic_link(dir in working_dir(), from_image in any::<bool>()) {
            let (c, i, field) = if from_image {
                (ContainerConfig::default(), ImageConfig { working_dir: dir.clone(), ..Default::default() }, "image.config.WorkingDir")
            } else {
                (ContainerConfig { working_dir: dir.clone(), ..Default::default() }, ImageConfig::default(), "config.working_dir")
            };
            match process_cwd(&c, &i) {
                Ok(cwd) => {
                    prop_assert!(cwd.starts_with('/'), "{cwd}");
                    prop_assert!(!cwd.split('/').any(|p| p == ".." || p == "."), "{cwd}");
                    for d in MAGIC_DIRS {
                        prop_assert!(!is_under(&cwd, d), "{cwd}");
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(msg.starts_with(field), "{msg}");
                    check_message("process_cwd", &msg)?;
                }
            }
        }
    }
}
