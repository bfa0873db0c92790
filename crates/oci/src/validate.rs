//! Checks shared by the field mappers. Every value a request or an image
//! supplies passes one of these before it reaches the spec.
use crust_quote::quote_os;

use crate::SpecError;

/// Longest path accepted (PATH_MAX).
pub(crate) const MAX_PATH: usize = 4096;

/// Rejects NUL, which no kernel interface can carry.
pub(crate) fn no_nul(field: &str, value: &str) -> Result<(), SpecError> {
    if value.contains('\0') {
        return Err(SpecError::invalid(field, "must not contain NUL"));
    }
    Ok(())
}

/// An absolute path without `..` components or NUL, returned in clean form
/// (no `.` components, no repeated or trailing slashes). `/` itself is
/// allowed; callers that must not get it check for it.
pub(crate) fn abs_path(field: &str, value: &str) -> Result<String, SpecError> {
    if value.is_empty() {
        return Err(SpecError::invalid(field, "must not be empty"));
    }
    no_nul(field, value)?;
    if value.len() > MAX_PATH {
        return Err(SpecError::invalid(
            field,
            format!("longer than {MAX_PATH} bytes"),
        ));
    }
    if !value.starts_with('/') {
        return Err(SpecError::invalid(
            field,
            format!("must be absolute, got {value}", value = quote_os(&value)),
        ));
    }
    let mut out = String::with_capacity(value.len());
    for part in value.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(SpecError::invalid(
                    field,
                    format!(
                        "must not contain '..', got {value}",
                        value = quote_os(&value)
                    ),
                ));
            }
            p => {
                out.push('/');
                out.push_str(p);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Number of components of a clean absolute path (`/` has 0).
pub(crate) fn depth(clean: &str) -> usize {
    clean.split('/').filter(|p| !p.is_empty()).count()
}

/// `path` equals `dir` or lies below it (both clean and absolute).
pub(crate) fn is_under(path: &str, dir: &str) -> bool {
    if dir == "/" {
        return true;
    }
    path == dir || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
}

/// An ID that ends up in a cgroup path or unit name: 1-128 of
/// `[A-Za-z0-9_.-]`, starting with an alphanumeric.
pub(crate) fn id(field: &str, value: &str) -> Result<(), SpecError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(SpecError::invalid(
            field,
            format!(
                "must be 1-128 characters of [A-Za-z0-9_.-] starting with a letter or digit, got {value}",
                value = quote_os(&value)
            ),
        ));
    }
    Ok(())
}

/// A hostname: 1-64 bytes (HOST_NAME_MAX) of `[A-Za-z0-9._-]`.
pub(crate) fn hostname(field: &str, value: &str) -> Result<(), SpecError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if !ok {
        return Err(SpecError::invalid(
            field,
            format!(
                "must be 1-64 characters of [A-Za-z0-9._-], got {value}",
                value = quote_os(&value)
            ),
        ));
    }
    Ok(())
}

/// A uid or gid from a request: 0..=i32::MAX (runc's limit, as containerd).
pub(crate) fn id_number(field: &str, value: i64) -> Result<u32, SpecError> {
    if !(0..=i64::from(i32::MAX)).contains(&value) {
        return Err(SpecError::invalid(
            field,
            format!("must be between 0 and {}, got {value}", i32::MAX),
        ));
    }
    Ok(value as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abs_path_cleans() {
        assert_eq!(abs_path("f", "/a/b").unwrap(), "/a/b");
        assert_eq!(abs_path("f", "//a/./b/").unwrap(), "/a/b");
        assert_eq!(abs_path("f", "/").unwrap(), "/");
        assert_eq!(abs_path("f", "/./").unwrap(), "/");
    }

    #[test]
    fn abs_path_rejects() {
        for (bad, why) in [
            ("", "must not be empty"),
            ("a/b", "must be absolute"),
            ("./a", "must be absolute"),
            ("/a/../b", "'..'"),
            ("/..", "'..'"),
            ("/a\0b", "NUL"),
        ] {
            let e = abs_path("config.x", bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
            assert!(e.to_string().starts_with("config.x: "), "{e}");
        }
        let long = format!("/{}", "a".repeat(MAX_PATH));
        assert!(abs_path("f", &long).is_err());
        // `..` as part of a name is fine.
        assert_eq!(abs_path("f", "/a..b/..c").unwrap(), "/a..b/..c");
    }

    #[test]
    fn under_and_depth() {
        assert!(is_under("/dev/shm", "/dev"));
        assert!(is_under("/dev", "/dev"));
        assert!(!is_under("/devices", "/dev"));
        assert!(is_under("/x", "/"));
        assert_eq!(depth("/"), 0);
        assert_eq!(depth("/a/b"), 2);
    }

    #[test]
    fn ids() {
        assert!(id("f", "abc123").is_ok());
        assert!(id("f", "a.b_c-d").is_ok());
        for bad in ["", "-a", "a/b", "a b", "..", &"a".repeat(129)] {
            assert!(id("f", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hostnames() {
        assert!(hostname("f", "pod-1.example").is_ok());
        for bad in ["", "a b", "a\nb", "a/b", &"a".repeat(65)] {
            assert!(hostname("f", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn id_numbers() {
        assert_eq!(id_number("f", 0).unwrap(), 0);
        assert_eq!(
            id_number("f", i64::from(i32::MAX)).unwrap(),
            i32::MAX as u32
        );
        assert!(id_number("f", -1).is_err());
        assert!(id_number("f", i64::from(i32::MAX) + 1).is_err());
    }
}
