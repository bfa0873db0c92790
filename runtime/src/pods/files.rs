//! The files a pod's containers mount: /etc/hostname, /etc/hosts and
//! /etc/resolv.conf. Their content comes from validated input only (see
//! `spec`); the node's own files are copied, bounded in size.

use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::Path;

use super::error::PodError;
use super::spec::DnsSpec;

/// The most of a node file (/etc/hosts, /etc/resolv.conf) copied into a pod.
const MAX_NODE_FILE: u64 = 1 << 20;

/// The loopback part of /etc/hosts, as kubelet writes it.
const LOCALHOST_ENTRIES: &str = "127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::0\tip6-mcastprefix
fe00::1\tip6-allnodes
fe00::2\tip6-allrouters
";

/// resolv.conf from the pod's DNSConfig, laid out as containerd does.
pub fn resolv_conf(dns: &DnsSpec) -> String {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for server in &dns.servers {
        out.push_str(&format!("nameserver {server}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

/// /etc/hosts of a pod with its own network: loopback names, then one line
/// per pod IP naming the pod's hostname (what kubelet writes for the pods
/// it manages; crictl users get the same).
pub fn hosts(hostname: &str, ips: &[IpAddr]) -> String {
    let mut out = String::from("# Kubernetes-managed hosts file (written by crust).\n");
    out.push_str(LOCALHOST_ENTRIES);
    for ip in ips {
        out.push_str(&format!("{ip}\t{hostname}\n"));
    }
    out
}

pub fn hostname(hostname: &str) -> String {
    format!("{hostname}\n")
}

/// The node's hostname for a pod that names none. The kernel allows any
/// bytes; a name that is no valid hostname is not written into files.
pub fn node_hostname() -> Result<String, PodError> {
    let name = nix::unistd::gethostname()
        .map_err(|e| PodError::internal("reading the node's hostname", e))?
        .to_string_lossy()
        .into_owned();
    crust_linux::ns::validate_hostname(&name).map_err(|e| {
        PodError::Internal(format!(
            "the node's hostname cannot be used for a pod ({e}); set config.hostname"
        ))
    })?;
    Ok(name)
}

/// Reads a node file (e.g. /etc/resolv.conf) to copy into a pod; a missing
/// one reads as empty.
pub fn read_node_file(path: &Path) -> Result<String, PodError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => {
            return Err(PodError::internal(
                &format!("reading {}", path.display()),
                e,
            ));
        }
    };
    let mut text = String::new();
    file.take(MAX_NODE_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| PodError::internal(&format!("reading {}", path.display()), e))?;
    if text.len() as u64 > MAX_NODE_FILE {
        return Err(PodError::Internal(format!(
            "{} is larger than {MAX_NODE_FILE} bytes",
            path.display()
        )));
    }
    Ok(text)
}

/// Writes `content` to `path` in a dir crust created, never through a
/// symlink: the file is opened relative to its dir (itself opened without
/// following a symlink), never through one, never a FIFO or a device; an
/// existing file is truncated in place (its inode, which containers
/// bind-mount, stays).
pub fn write(path: &Path, content: &str) -> Result<(), PodError> {
    use crust_linux::fs::{Access, Dir, Errno};
    let err = |e: std::io::Error| PodError::internal(&format!("writing {}", path.display()), e);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    };
    let dir = Dir::open(parent).map_err(|e| err(e.into()))?;
    let mut file = match dir.open_existing(name, Access::Write) {
        Ok(f) => f,
        Err(Errno::ENOENT) => dir.create_file(name, 0o644).map_err(|e| err(e.into()))?,
        Err(e) => return Err(err(e.into())),
    };
    if !file.metadata().map_err(err)?.is_file() {
        return Err(err(std::io::Error::other("not a regular file")));
    }
    file.write_all(content.as_bytes()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_layout() {
        let dns = DnsSpec {
            servers: vec!["10.96.0.10".into(), "fd00::10".into()],
            searches: vec!["ns.svc.cluster.local".into(), "cluster.local".into()],
            options: vec!["ndots:5".into(), "edns0".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "search ns.svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\nnameserver fd00::10\n\
             options ndots:5 edns0\n"
        );
        let only_servers = DnsSpec {
            servers: vec!["1.1.1.1".into()],
            ..Default::default()
        };
        assert_eq!(resolv_conf(&only_servers), "nameserver 1.1.1.1\n");
    }

    #[test]
    fn hosts_has_loopback_and_the_pod_ips() {
        let ips: Vec<IpAddr> = vec!["10.88.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let text = hosts("web-0", &ips);
        assert!(text.contains("127.0.0.1\tlocalhost\n"), "{text}");
        assert!(text.contains("::1\tlocalhost ip6-localhost ip6-loopback\n"));
        assert!(
            text.ends_with("10.88.0.5\tweb-0\nfd00::5\tweb-0\n"),
            "{text}"
        );
        assert!(!hosts("web-0", &[]).contains("web-0"));
    }

    #[test]
    fn writes_refuse_symlinks_and_keep_the_inode() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        write(&path, "first, longer content\n").unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        write(&path, "second\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second\n");
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino);

        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(write(&link, "evil").is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn node_files_are_bounded_and_missing_ones_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_node_file(&dir.path().join("none")).unwrap(), "");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'#'; (MAX_NODE_FILE + 1) as usize]).unwrap();
        assert!(read_node_file(&big).is_err());
    }
}
