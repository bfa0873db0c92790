//! The container process's uid, gid and supplementary groups, resolved in the
//! image's /etc/passwd and /etc/group.
//!
//! Rules (containerd's, with Kubernetes' SupplementalGroupsPolicy):
//!
//! - The user comes from `run_as_username` (wins), else `run_as_user`, else
//!   the image's `User` (`uid`, `name`, `uid:gid`, `name:group`, `uid:group`,
//!   `name:gid`), else root.
//! - A user *name* that is not in /etc/passwd is an error; there is no
//!   fallback to root, ever. A numeric uid not in /etc/passwd is fine and
//!   gets gid 0 (unless a group is given).
//! - `run_as_group` sets the primary gid; it needs `run_as_user` or
//!   `run_as_username`.
//! - Supplementary groups: the primary gid, then (policy Merge, the default)
//!   the groups of /etc/group that list the user's name, then the request's
//!   `supplemental_groups`; duplicates dropped. Policy Strict skips
//!   /etc/group.

use crust_api::v1::{LinuxContainerSecurityContext, SupplementalGroupsPolicy};
use crust_quote::quote_os;

use crate::SpecError;
use crate::validate::id_number;

const SC: &str = "config.linux.security_context";

/// The identity the container process runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, primary gid first.
    pub additional_gids: Vec<u32>,
    /// The user's name when /etc/passwd knows it.
    pub username: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// Parses /etc/passwd text; malformed lines, comments and NIS `+`/`-`
/// entries are skipped, as getpwent(3) does with what it cannot use.
fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_end_matches('\r');
            if line.is_empty() || line.starts_with('#') || line.starts_with(['+', '-']) {
                return None;
            }
            let mut f = line.split(':');
            let name = f.next()?;
            let _pw = f.next()?;
            let uid = f.next()?.trim().parse().ok()?;
            let gid = f.next()?.trim().parse().ok()?;
            (!name.is_empty()).then(|| PasswdEntry {
                name: name.to_string(),
                uid,
                gid,
            })
        })
        .collect()
}

/// Parses /etc/group text, same leniency as [`parse_passwd`].
fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_end_matches('\r');
            if line.is_empty() || line.starts_with('#') || line.starts_with(['+', '-']) {
                return None;
            }
            let mut f = line.split(':');
            let name = f.next()?;
            let _pw = f.next()?;
            let gid = f.next()?.trim().parse().ok()?;
            let members = f
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect();
            (!name.is_empty()).then(|| GroupEntry {
                name: name.to_string(),
                gid,
                members,
            })
        })
        .collect()
}

/// A user or group given by name or by number.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Who {
    Id(u32),
    Name(String),
}

/// Parses one side of an image `User` value.
fn parse_who(field: &str, part: &str) -> Result<Who, SpecError> {
    if part.is_empty() {
        return Err(SpecError::invalid(field, "empty user or group"));
    }
    if part.contains('\0') {
        return Err(SpecError::invalid(field, "must not contain NUL"));
    }
    if part.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = part.parse().unwrap_or(i64::MAX);
        return Ok(Who::Id(id_number(field, n)?));
    }
    Ok(Who::Name(part.to_string()))
}

/// Resolves the container's identity. `etc_passwd` / `etc_group` are the
/// image's files (None when the image has none).
pub fn resolve_user(
    sc: Option<&LinuxContainerSecurityContext>,
    image_user: &str,
    etc_passwd: Option<&str>,
    etc_group: Option<&str>,
) -> Result<ResolvedUser, SpecError> {
    let default_sc = LinuxContainerSecurityContext::default();
    let sc = sc.unwrap_or(&default_sc);

    let policy =
        SupplementalGroupsPolicy::try_from(sc.supplemental_groups_policy).map_err(|_| {
            SpecError::invalid(
                format!("{SC}.supplemental_groups_policy"),
                format!("unknown policy {}", sc.supplemental_groups_policy),
            )
        })?;

    // Who and which group, with the field each came from (for errors).
    let run_as_group = sc
        .run_as_group
        .map(|g| id_number(&format!("{SC}.run_as_group"), g.value))
        .transpose()?;
    let (user, user_field, mut group, group_field): (Who, String, Option<Who>, String) =
        if !sc.run_as_username.is_empty() {
            let f = format!("{SC}.run_as_username");
            if sc.run_as_username.contains('\0') {
                return Err(SpecError::invalid(f, "must not contain NUL"));
            }
            (
                Who::Name(sc.run_as_username.clone()),
                f,
                run_as_group.map(Who::Id),
                format!("{SC}.run_as_group"),
            )
        } else if let Some(u) = sc.run_as_user {
            let f = format!("{SC}.run_as_user");
            let uid = id_number(&f, u.value)?;
            (
                Who::Id(uid),
                f,
                run_as_group.map(Who::Id),
                format!("{SC}.run_as_group"),
            )
        } else if run_as_group.is_some() {
            return Err(SpecError::invalid(
                format!("{SC}.run_as_group"),
                "is set without run_as_user or run_as_username",
            ));
        } else if image_user.is_empty() {
            (
                Who::Id(0),
                "image.config.User".to_string(),
                None,
                String::new(),
            )
        } else {
            let f = "image.config.User".to_string();
            let parts: Vec<&str> = image_user.split(':').collect();
            match parts.as_slice() {
                [u] => (parse_who(&f, u)?, f, None, String::new()),
                [u, g] => {
                    let user = parse_who(&f, u)?;
                    let group = parse_who(&f, g)?;
                    (user, f.clone(), Some(group), f)
                }
                _ => {
                    return Err(SpecError::invalid(
                        f,
                        format!(
                            "{image_user} is not of the form user[:group]",
                            image_user = quote_os(&image_user)
                        ),
                    ));
                }
            }
        };

    let passwd = etc_passwd.map(parse_passwd).unwrap_or_default();
    let groups = etc_group.map(parse_group).unwrap_or_default();

    let (uid, mut gid, username) = match &user {
        Who::Name(name) => {
            let Some(p) = passwd.iter().find(|p| &p.name == name) else {
                return Err(SpecError::UserNotFound {
                    field: user_field,
                    user: name.clone(),
                });
            };
            (p.uid, p.gid, Some(p.name.clone()))
        }
        Who::Id(uid) => match passwd.iter().find(|p| p.uid == *uid) {
            Some(p) => (p.uid, p.gid, Some(p.name.clone())),
            None => (*uid, 0, None),
        },
    };

    match group.take() {
        Some(Who::Id(g)) => gid = g,
        Some(Who::Name(name)) => {
            let Some(g) = groups.iter().find(|g| g.name == name) else {
                return Err(SpecError::GroupNotFound {
                    field: group_field,
                    group: name,
                });
            };
            gid = g.gid;
        }
        None => {}
    }

    let mut additional = vec![gid];
    let mut push = |g: u32| {
        if !additional.contains(&g) {
            additional.push(g);
        }
    };
    if policy == SupplementalGroupsPolicy::Merge
        && let Some(name) = &username
    {
        for g in groups
            .iter()
            .filter(|g| g.members.iter().any(|m| m == name))
        {
            push(g.gid);
        }
    }
    for (i, g) in sc.supplemental_groups.iter().enumerate() {
        push(id_number(&format!("{SC}.supplemental_groups[{i}]"), *g)?);
    }

    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids: additional,
        username,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crust_api::v1::Int64Value;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
# a comment
daemon:x:1:1::/:/sbin/nologin

broken line
bad:x:notanumber:1::/:
+nisuser
alice:x:1000:1000:Alice:/home/alice:/bin/sh
bob:x:1001:1001::/home/bob:/bin/sh
nogroup-user:x:2000:2000::/:/bin/sh
alice:x:4242:4242:duplicate, later entries lose:/:/bin/sh
";

    const GROUP: &str = "\
root:x:0:
wheel:x:10:alice,bob
alice:x:1000:
bob:x:1001:
video:x:44: alice , carol
staff:x:50:carol
bad:x:zz:alice
";

    fn sc() -> LinuxContainerSecurityContext {
        LinuxContainerSecurityContext::default()
    }

    fn resolve(
        sc: &LinuxContainerSecurityContext,
        image_user: &str,
    ) -> Result<ResolvedUser, SpecError> {
        resolve_user(Some(sc), image_user, Some(PASSWD), Some(GROUP))
    }

    #[test]
    fn default_is_root_with_root_groups() {
        let u = resolve(&sc(), "").unwrap();
        assert_eq!((u.uid, u.gid), (0, 0));
        assert_eq!(u.additional_gids, vec![0]);
        assert_eq!(u.username.as_deref(), Some("root"));
        let u = resolve_user(None, "", None, None).unwrap();
        assert_eq!((u.uid, u.gid, u.additional_gids), (0, 0, vec![0]));
    }

    #[test]
    fn run_as_user_in_passwd() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1000 });
        let u = resolve(&s, "bob").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.additional_gids, vec![1000, 10, 44]);
        assert_eq!(u.username.as_deref(), Some("alice"));
    }

    #[test]
    fn run_as_user_not_in_passwd_gets_gid_0() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 5555 });
        let u = resolve(&s, "").unwrap();
        assert_eq!((u.uid, u.gid), (5555, 0));
        assert_eq!(u.additional_gids, vec![0]);
        assert_eq!(u.username, None);
        // Also without any /etc/passwd.
        let u = resolve_user(Some(&s), "", None, None).unwrap();
        assert_eq!((u.uid, u.gid), (5555, 0));
    }

    #[test]
    fn run_as_user_with_group() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 5555 });
        s.run_as_group = Some(Int64Value { value: 777 });
        let u = resolve(&s, "").unwrap();
        assert_eq!((u.uid, u.gid), (5555, 777));
        assert_eq!(u.additional_gids, vec![777]);
    }

    #[test]
    fn run_as_group_overrides_passwd_gid() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1001 });
        s.run_as_group = Some(Int64Value { value: 3000 });
        let u = resolve(&s, "").unwrap();
        assert_eq!((u.uid, u.gid), (1001, 3000));
        assert_eq!(u.additional_gids, vec![3000, 10]);
    }

    #[test]
    fn run_as_username_resolves() {
        let mut s = sc();
        s.run_as_username = "bob".into();
        let u = resolve(&s, "alice").unwrap();
        assert_eq!((u.uid, u.gid), (1001, 1001));
        assert_eq!(u.additional_gids, vec![1001, 10]);
    }

    #[test]
    fn run_as_username_wins_over_run_as_user() {
        let mut s = sc();
        s.run_as_username = "bob".into();
        s.run_as_user = Some(Int64Value { value: 0 });
        let u = resolve(&s, "").unwrap();
        assert_eq!(u.uid, 1001);
    }

    #[test]
    fn first_passwd_entry_wins() {
        let mut s = sc();
        s.run_as_username = "alice".into();
        assert_eq!(resolve(&s, "").unwrap().uid, 1000);
    }

    #[test]
    fn missing_username_is_error_never_root() {
        let mut s = sc();
        s.run_as_username = "mallory".into();
        let e = resolve(&s, "").unwrap_err();
        assert_eq!(
            e,
            SpecError::UserNotFound {
                field: "config.linux.security_context.run_as_username".into(),
                user: "mallory".into()
            }
        );
        // No /etc/passwd at all: still an error.
        let e = resolve_user(Some(&s), "", None, None).unwrap_err();
        assert!(matches!(e, SpecError::UserNotFound { .. }));
        // Names that only look like lines of the file do not match.
        s.run_as_username = "root:x:0".into();
        assert!(resolve(&s, "").is_err());
        s.run_as_username = "+nisuser".into();
        assert!(resolve(&s, "").is_err());
    }

    #[test]
    fn run_as_group_without_user_is_error() {
        let mut s = sc();
        s.run_as_group = Some(Int64Value { value: 10 });
        let e = resolve(&s, "alice").unwrap_err();
        assert_eq!(e.field(), "config.linux.security_context.run_as_group");
        assert_eq!(e.class(), crate::ErrorClass::InvalidArgument);
    }

    #[test]
    fn out_of_range_ids() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: -1 });
        assert_eq!(
            resolve(&s, "").unwrap_err().field(),
            "config.linux.security_context.run_as_user"
        );
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1 });
        s.run_as_group = Some(Int64Value { value: 1 << 40 });
        assert_eq!(
            resolve(&s, "").unwrap_err().field(),
            "config.linux.security_context.run_as_group"
        );
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1 });
        s.supplemental_groups = vec![5, -3];
        assert_eq!(
            resolve(&s, "").unwrap_err().field(),
            "config.linux.security_context.supplemental_groups[1]"
        );
        assert!(resolve(&sc(), "99999999999999999999999").is_err());
    }

    #[test]
    fn image_user_forms() {
        let u = resolve(&sc(), "1001").unwrap();
        assert_eq!((u.uid, u.gid), (1001, 1001));
        let u = resolve(&sc(), "alice").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.additional_gids, vec![1000, 10, 44]);
        let u = resolve(&sc(), "1001:44").unwrap();
        assert_eq!((u.uid, u.gid), (1001, 44));
        let u = resolve(&sc(), "alice:staff").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 50));
        let u = resolve(&sc(), "7000:video").unwrap();
        assert_eq!((u.uid, u.gid), (7000, 44));
        let u = resolve(&sc(), "bob:9").unwrap();
        assert_eq!((u.uid, u.gid), (1001, 9));
        let u = resolve(&sc(), "6000").unwrap();
        assert_eq!((u.uid, u.gid), (6000, 0));
    }

    #[test]
    fn image_user_errors() {
        let e = resolve(&sc(), "nobody-here").unwrap_err();
        assert_eq!(
            e,
            SpecError::UserNotFound {
                field: "image.config.User".into(),
                user: "nobody-here".into()
            }
        );
        let e = resolve(&sc(), "alice:nogroup").unwrap_err();
        assert_eq!(
            e,
            SpecError::GroupNotFound {
                field: "image.config.User".into(),
                group: "nogroup".into()
            }
        );
        for bad in ["a:b:c", ":", "alice:", ":10", "al\0ice"] {
            let e = resolve(&sc(), bad).unwrap_err();
            assert_eq!(e.field(), "image.config.User", "{bad:?}");
        }
        // A name in an image without /etc/passwd.
        let e = resolve_user(Some(&sc()), "alice", None, None).unwrap_err();
        assert!(matches!(e, SpecError::UserNotFound { .. }));
    }

    #[test]
    fn request_user_ignores_image_user() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1001 });
        // The image's group part must not leak into a request user.
        let u = resolve(&s, "alice:staff").unwrap();
        assert_eq!((u.uid, u.gid), (1001, 1001));
    }

    #[test]
    fn supplemental_groups_merge() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1000 });
        s.run_as_group = Some(Int64Value { value: 3000 });
        s.supplemental_groups = vec![4000, 44, 3000];
        let u = resolve(&s, "").unwrap();
        assert_eq!(u.additional_gids, vec![3000, 10, 44, 4000]);
    }

    #[test]
    fn supplemental_groups_strict() {
        let mut s = sc();
        s.run_as_user = Some(Int64Value { value: 1000 });
        s.run_as_group = Some(Int64Value { value: 3000 });
        s.supplemental_groups = vec![4000];
        s.supplemental_groups_policy = SupplementalGroupsPolicy::Strict as i32;
        let u = resolve(&s, "").unwrap();
        assert_eq!(u.additional_gids, vec![3000, 4000]);
    }

    #[test]
    fn unknown_policy_rejected() {
        let mut s = sc();
        s.supplemental_groups_policy = 9;
        let e = resolve(&s, "").unwrap_err();
        assert_eq!(
            e.field(),
            "config.linux.security_context.supplemental_groups_policy"
        );
    }

    #[test]
    fn parsers_skip_garbage() {
        let p = parse_passwd(PASSWD);
        assert!(
            p.iter()
                .all(|e| e.name != "bad" && !e.name.starts_with('+'))
        );
        assert_eq!(p.len(), 6);
        let g = parse_group(GROUP);
        assert!(g.iter().all(|e| e.name != "bad"));
        assert_eq!(
            g.iter().find(|e| e.name == "video").unwrap().members,
            vec!["alice", "carol"]
        );
        assert!(parse_passwd("").is_empty());
        assert!(parse_group("::\n:x:1:\n").is_empty());
        // CRLF files
        let p = parse_passwd("root:x:0:0::/:/bin/sh\r\n");
        assert_eq!(p[0].uid, 0);
    }
}
