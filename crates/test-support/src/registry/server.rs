//! The registry process and how it authenticates.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// How the registry authenticates clients.
pub enum RegistryAuth {
    None,
    /// htpasswd with one bcrypt user.
    Basic {
        user: String,
        password: String,
    },
    /// Token auth: realm URL, service, issuer, root cert bundle path.
    Token {
        realm: String,
        service: String,
        issuer: String,
        rootcertbundle: PathBuf,
    },
}

/// A docker-registry process on 127.0.0.1, killed (by PID) on drop.
pub struct Registry {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub host: String,
}

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with(RegistryAuth::None)
    }

    pub fn start_with(auth: RegistryAuth) -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let storage = dir.path().join("storage");
        std::fs::create_dir(&storage).unwrap();
        let auth_yaml = match &auth {
            RegistryAuth::None => String::new(),
            RegistryAuth::Basic { user, password } => {
                let hash = bcrypt::hash(password, 4).unwrap();
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n")).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: crust-test\n    path: {}\n",
                    htpasswd.display()
                )
            }
            RegistryAuth::Token {
                realm,
                service,
                issuer,
                rootcertbundle,
            } => format!(
                "auth:\n  token:\n    realm: {realm}\n    service: {service}\n    issuer: {issuer}\n    rootcertbundle: {}\n",
                rootcertbundle.display()
            ),
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: crust-test-secret\n{auth_yaml}",
            storage.display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry must be installed (apt-get install docker-registry)");
        let reg = Registry {
            child,
            port,
            dir,
            host: format!("127.0.0.1:{port}"),
        };
        reg.wait_ready();
        reg
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("registry did not start: {}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// How many GET requests for `path_part` the registry served.
    pub fn count_gets(&self, path_part: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("\"GET ") && l.contains(path_part))
            .count()
    }

    /// The registry's own file for a blob, to make it lie.
    pub fn blob_data_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
