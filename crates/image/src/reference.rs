//! Image references, normalised as docker, kubelet, crictl and containerd do
//! (`busybox` = `docker.io/library/busybox:latest`).

use std::fmt;

use crate::digest::Digest;
use crust_quote::quote;

use crate::error::{Error, Result};

pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
/// distribution/reference's NameTotalLengthMax.
const NAME_MAX: usize = 255;
const TAG_MAX: usize = 128;

/// A normalised, validated image reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl Reference {
    /// Parses and normalises `s`; a reference with neither tag nor digest
    /// gets the tag `latest`.
    pub fn parse(s: &str) -> Result<Self> {
        Self::parse_with(s, true)
    }

    /// As [`Self::parse`], but a reference with neither tag nor digest
    /// stays a bare repository name (as signed identities and policy
    /// references are written): [`Self::tag`] and [`Self::digest`] are
    /// both None then.
    pub fn parse_name_or_ref(s: &str) -> Result<Self> {
        Self::parse_with(s, false)
    }

    fn parse_with(s: &str, default_tag: bool) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidReference {
            reference: s.to_string(),
            reason: reason.to_string(),
        };
        if s.is_empty() {
            return Err(invalid("empty"));
        }
        if Digest::from_hex(s).is_some() {
            return Err(invalid(
                "a 64-character hex string is an image ID, not a reference",
            ));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (rest, Some(parse_digest(d).map_err(|r| invalid(&r))?)),
            None => (s, None),
        };
        let (name, tag) = split_tag(rest);
        if let Some(tag) = tag {
            check_tag(tag).map_err(|r| invalid(&r))?;
        }
        let (domain, path) = split_domain(name);
        check_domain(&domain).map_err(|r| invalid(&r))?;
        check_path(&path).map_err(|r| invalid(&r))?;
        if domain.len() + 1 + path.len() > NAME_MAX {
            return Err(invalid("name longer than 255 characters"));
        }
        let tag = match (tag, &digest) {
            (None, None) if default_tag => Some("latest".to_string()),
            (t, _) => t.map(str::to_string),
        };
        Ok(Reference {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// The registry host (with port), e.g. `docker.io`, `127.0.0.1:5000`.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The repository path inside the registry, e.g. `library/busybox`.
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// `domain/path`, the repository name.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// `name:tag`, the form recorded as a repo tag.
    pub fn repo_tag(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// `name@digest`, the form recorded as a repo digest.
    pub fn repo_digest(&self, digest: &Digest) -> String {
        format!("{}@{digest}", self.name())
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

fn parse_digest(d: &str) -> std::result::Result<Digest, String> {
    Digest::parse(d).map_err(|e| e.to_string())
}

/// The tag is after the last `:` that follows the last `/` (a `:` before a
/// `/` is a registry port).
fn split_tag(s: &str) -> (&str, Option<&str>) {
    let last_slash = s.rfind('/').map_or(0, |i| i + 1);
    match s[last_slash..].rfind(':') {
        Some(i) => (&s[..last_slash + i], Some(&s[last_slash + i + 1..])),
        None => (s, None),
    }
}

/// docker's splitDockerDomain: the first component is a registry only if it
/// looks like a host (has `.` or `:`, or is `localhost`, or has uppercase).
fn split_domain(name: &str) -> (String, String) {
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    let domain = if domain == LEGACY_DEFAULT_DOMAIN {
        DEFAULT_DOMAIN.to_string()
    } else {
        domain
    };
    let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
        format!("{OFFICIAL_REPO_PREFIX}{path}")
    } else {
        path
    };
    (domain, path)
}

fn check_tag(tag: &str) -> std::result::Result<(), String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= TAG_MAX
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("invalid tag {}", quote(tag)))
    }
}

fn check_domain(domain: &str) -> std::result::Result<(), String> {
    let bad = || Err(format!("invalid registry host {}", quote(domain)));
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        // [IPv6]:port
        let Some((v6, after)) = rest.split_once(']') else {
            return bad();
        };
        if v6.is_empty() || !v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return bad();
        }
        match after {
            "" => return Ok(()),
            p => match p.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return bad(),
            },
        }
    } else {
        match domain.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(domain), None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return bad();
    }
    if let Some(host) = host
        && !host.split('.').all(is_domain_component)
    {
        return bad();
    }
    Ok(())
}

fn is_domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
}

fn check_path(path: &str) -> std::result::Result<(), String> {
    if path.to_lowercase() != path {
        return Err("repository name must be lowercase".to_string());
    }
    for component in path.split('/') {
        if !is_path_component(component) {
            return Err(format!(
                "invalid repository path component {}",
                quote(component)
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn is_path_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = c.as_bytes();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    fn norm(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn normalises_like_docker() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(norm("foo/bar"), "docker.io/foo/bar:latest");
        assert_eq!(
            norm("docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(norm("index.docker.io/foo/bar:1"), "docker.io/foo/bar:1");
        assert_eq!(norm("host:5000/x:tag"), "host:5000/x:tag");
        assert_eq!(norm("localhost/x"), "localhost/x:latest");
        assert_eq!(norm("127.0.0.1:5000/a/b/c:v1"), "127.0.0.1:5000/a/b/c:v1");
        assert_eq!(
            norm("registry.k8s.io/e2e-test-images/busybox:1.29-2"),
            "registry.k8s.io/e2e-test-images/busybox:1.29-2"
        );
        assert_eq!(norm("[::1]:5000/x"), "[::1]:5000/x:latest");
    }

    #[test]
    fn digests_and_tags() {
        let r = Reference::parse(&format!("x@{D}")).unwrap();
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest().unwrap().to_string(), D);
        assert_eq!(r.to_string(), format!("docker.io/library/x@{D}"));

        let r = Reference::parse(&format!("x:tag@{D}")).unwrap();
        assert_eq!(r.tag(), Some("tag"));
        assert_eq!(r.repo_tag().unwrap(), "docker.io/library/x:tag");
        assert_eq!(r.to_string(), format!("docker.io/library/x:tag@{D}"));
        assert_eq!(
            r.repo_digest(r.digest().unwrap()),
            format!("docker.io/library/x@{D}")
        );
        let r = Reference::parse("host:5000/x").unwrap();
        assert_eq!(r.domain(), "host:5000");
        assert_eq!(r.path(), "x");
        assert_eq!(r.tag(), Some("latest"));
    }

    #[test]
    fn separators_in_path_components() {
        for ok in ["a.b", "a_b", "a__b", "a-b", "a---b", "a-b.c_d", "0a"] {
            assert!(Reference::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "a..b", "a___b", "-a", "a-", "a.", "_a", "a/", "/a", "a//b", "a._b",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rejects_invalid() {
        for bad in [
            "",
            "Busybox",
            "foo/Bar",
            "busybox:",
            "busybox:-x",
            "busybox@sha256:abc",
            "busybox@md5:abcd",
            "busybox:tag:tag",
            "a b",
            "x/../y",
            "bad_host:5000/x",
            "host:port/x",
            "-host.com/x",
            "host.com:/x",
            "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
        ] {
            let err = Reference::parse(bad);
            assert!(err.is_err(), "{bad:?} parsed as {:?}", err.unwrap());
        }
        let long = "a".repeat(300);
        assert!(Reference::parse(&long).is_err());
        let long_tag = format!("a:{}", "t".repeat(129));
        assert!(Reference::parse(&long_tag).is_err());
    }

    #[test]
    fn error_names_the_reference() {
        let err = Reference::parse("Foo").unwrap_err().to_string();
        assert!(err.contains("Foo") && err.contains("lowercase"), "{err}");
    }
}
