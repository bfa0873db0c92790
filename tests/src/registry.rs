//! A real registry for tests (Debian's `docker-registry`, CNCF
//! distribution) on 127.0.0.1, a tiny push client, image builders that make
//! small images from Debian's busybox-static, and offline archives (OCI
//! image layout, `docker save`). Shared by the daemon's integration tests
//! and `crust-image`'s own tests.

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest as _, Sha256};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

pub const BUSYBOX: &str = "/bin/busybox";
const MTIME: u64 = 1_704_067_200;

pub fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

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

/// One blob as pushed.
#[derive(Clone)]
pub struct Blob {
    pub bytes: Vec<u8>,
    pub media_type: &'static str,
    pub diff_id: String,
}

impl Blob {
    pub fn digest(&self) -> String {
        sha(&self.bytes)
    }

    pub fn descriptor(&self) -> serde_json::Value {
        json!({"mediaType": self.media_type, "digest": self.digest(), "size": self.bytes.len()})
    }
}

/// Builds a layer tar; names are written raw so tests can make hostile ones.
pub struct LayerTar(tar::Builder<Vec<u8>>);

impl Default for LayerTar {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerTar {
    pub fn new() -> Self {
        LayerTar(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, name: &str, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        let slot = &mut h.as_old_mut().name;
        assert!(name.len() < slot.len(), "test names must be short");
        slot[..name.len()].copy_from_slice(name.as_bytes());
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h.set_size(size);
        h
    }

    fn add(mut self, mut h: tar::Header, data: &[u8]) -> Self {
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    pub fn dir(self, name: &str) -> Self {
        let h = Self::header(tar::EntryType::Directory, name, 0o755, 0);
        self.add(h, b"")
    }

    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.file_mode(name, data, 0o644)
    }

    pub fn file_mode(self, name: &str, data: &[u8], mode: u32) -> Self {
        let h = Self::header(tar::EntryType::Regular, name, mode, data.len() as u64);
        self.add(h, data)
    }

    pub fn symlink(self, name: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Symlink, name, 0o777, 0);
        h.set_link_name_literal(target).unwrap();
        self.add(h, b"")
    }

    pub fn hardlink(self, name: &str, target: &str) -> Self {
        let mut h = Self::header(tar::EntryType::Link, name, 0o644, 0);
        h.set_link_name_literal(target).unwrap();
        self.add(h, b"")
    }

    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

pub fn gzip(tar: &[u8]) -> Blob {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(tar).unwrap();
    Blob {
        bytes: gz.finish().unwrap(),
        media_type: LAYER_GZIP,
        diff_id: sha(tar),
    }
}

pub fn zstd_layer(tar: &[u8]) -> Blob {
    Blob {
        bytes: zstd::encode_all(tar, 3).unwrap(),
        media_type: LAYER_ZSTD,
        diff_id: sha(tar),
    }
}

pub fn plain(tar: &[u8]) -> Blob {
    Blob {
        bytes: tar.to_vec(),
        media_type: LAYER_TAR,
        diff_id: sha(tar),
    }
}

/// The busybox base: /bin/busybox with a few applet links, /etc/passwd and
/// /etc/group with www-data, and a file later layers delete.
pub fn busybox_tar() -> Vec<u8> {
    let busybox = std::fs::read(BUSYBOX).expect("busybox-static must be installed");
    LayerTar::new()
        .dir("bin/")
        .file_mode("bin/busybox", &busybox, 0o755)
        .symlink("bin/sh", "busybox")
        .symlink("bin/ls", "busybox")
        .hardlink("bin/cat", "bin/busybox")
        .dir("etc/")
        .file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/sh\n",
        )
        .file("etc/group", b"root:x:0:\nwww-data:x:33:\ngroup:x:1004:\n")
        .dir("tmp/")
        .file("etc/motd", b"deleted by a later layer\n")
        .dir("data/")
        .file("data/old", b"hidden by an opaque dir\n")
        .finish()
}

pub fn busybox_layer() -> Blob {
    gzip(&busybox_tar())
}

/// A built image: its blobs, config and manifest.
#[derive(Clone)]
pub struct TestImage {
    pub layers: Vec<Blob>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub manifest_type: &'static str,
}

impl TestImage {
    pub fn id(&self) -> String {
        sha(&self.config)
    }

    pub fn manifest_digest(&self) -> String {
        sha(&self.manifest)
    }

    pub fn size(&self) -> u64 {
        (self.config.len()
            + self.manifest.len()
            + self.layers.iter().map(|l| l.bytes.len()).sum::<usize>()) as u64
    }
}

pub struct ImageSpec<'a> {
    pub layers: Vec<Blob>,
    pub user: &'a str,
    pub arch: &'a str,
    pub cmd: &'a [&'a str],
    pub docker_types: bool,
}

impl Default for ImageSpec<'_> {
    fn default() -> Self {
        ImageSpec {
            layers: vec![busybox_layer()],
            user: "",
            arch: "amd64",
            cmd: &["sh"],
            docker_types: false,
        }
    }
}

pub fn build(spec: ImageSpec) -> TestImage {
    let diff_ids: Vec<&str> = spec.layers.iter().map(|l| l.diff_id.as_str()).collect();
    let config = serde_json::to_vec(&json!({
        "architecture": spec.arch,
        "os": "linux",
        "created": "2024-01-01T00:00:00Z",
        "config": {
            "User": spec.user,
            "Env": ["PATH=/bin", "HOME=/"],
            "Entrypoint": null,
            "Cmd": spec.cmd,
            "WorkingDir": "/tmp",
            "StopSignal": "SIGTERM",
            "Volumes": {"/data": {}},
            "Labels": {"test": "crust"},
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let (manifest_type, config_type) = if spec.docker_types {
        (DOCKER_MANIFEST, DOCKER_CONFIG)
    } else {
        (OCI_MANIFEST, OCI_CONFIG)
    };
    let layers: Vec<serde_json::Value> = spec
        .layers
        .iter()
        .map(|l| {
            let mut d = l.descriptor();
            if spec.docker_types && l.media_type == LAYER_GZIP {
                d["mediaType"] = json!(DOCKER_LAYER_GZIP);
            }
            d
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": manifest_type,
        "config": {"mediaType": config_type, "digest": sha(&config), "size": config.len()},
        "layers": layers,
    }))
    .unwrap();
    TestImage {
        layers: spec.layers,
        config,
        manifest,
        manifest_type,
    }
}

/// An OCI index over images, each with its platform.
pub fn index(images: &[(&TestImage, &str)]) -> Vec<u8> {
    let manifests: Vec<serde_json::Value> = images
        .iter()
        .map(|(img, arch)| {
            json!({
                "mediaType": img.manifest_type,
                "digest": img.manifest_digest(),
                "size": img.manifest.len(),
                "platform": {"os": "linux", "architecture": arch},
            })
        })
        .collect();
    serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": manifests,
    }))
    .unwrap()
}

/// A minimal registry push client (blob upload + manifest PUT).
#[derive(Clone)]
pub struct Pusher {
    http: reqwest::Client,
    base: String,
    basic: Option<(String, String)>,
    bearer: Option<String>,
}

impl Pusher {
    pub fn new(reg: &Registry) -> Pusher {
        Pusher {
            http: reqwest::Client::new(),
            base: format!("http://{}", reg.host),
            basic: None,
            bearer: None,
        }
    }

    pub fn with_basic(mut self, user: &str, password: &str) -> Pusher {
        self.basic = Some((user.into(), password.into()));
        self
    }

    pub fn with_bearer(mut self, token: &str) -> Pusher {
        self.bearer = Some(token.into());
        self
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let rb = match &self.basic {
            Some((u, p)) => rb.basic_auth(u, Some(p)),
            None => rb,
        };
        match &self.bearer {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    pub async fn blob(&self, repo: &str, bytes: &[u8]) {
        let digest = sha(bytes);
        let url = format!("{}/v2/{repo}/blobs/uploads/", self.base);
        let resp = self.auth(self.http.post(&url)).send().await.unwrap();
        assert_eq!(
            resp.status(),
            202,
            "start upload: {}",
            resp.text().await.unwrap()
        );
        let location = resp.headers()["location"].to_str().unwrap().to_string();
        let location = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            location
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let resp = self
            .auth(self.http.put(format!("{location}{sep}digest={digest}")))
            .header("content-type", "application/octet-stream")
            .body(bytes.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "upload: {}", resp.text().await.unwrap());
    }

    pub async fn manifest(&self, repo: &str, reference: &str, media_type: &str, bytes: &[u8]) {
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base);
        let resp = self
            .auth(self.http.put(&url))
            .header("content-type", media_type)
            .body(bytes.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            201,
            "manifest: {}",
            resp.text().await.unwrap()
        );
    }

    pub async fn image(&self, repo: &str, tag: &str, img: &TestImage) {
        for l in &img.layers {
            self.blob(repo, &l.bytes).await;
        }
        self.blob(repo, &img.config).await;
        self.manifest(repo, tag, img.manifest_type, &img.manifest)
            .await;
    }
}

/// Builds an OCI image-layout tar of `img` named `name`.
pub fn oci_layout(img: &TestImage, name: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, data).unwrap();
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": img.manifest_type,
            "digest": img.manifest_digest(),
            "size": img.manifest.len(),
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": "latest",
            },
        }],
    });
    add("index.json", &serde_json::to_vec(&index).unwrap());
    for blob in img
        .layers
        .iter()
        .map(|l| &l.bytes)
        .chain([&img.config, &img.manifest])
    {
        add(&format!("blobs/sha256/{}", &sha(blob)[7..]), blob);
    }
    b.into_inner().unwrap()
}

/// Builds a classic `docker save` tar: uncompressed layers, manifest.json,
/// and a repeated layer stored as a symlink, as docker does.
pub fn docker_save(layers: &[Vec<u8>], tags: &[&str]) -> (Vec<u8>, String) {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(l)).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"User": "www-data", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let config_name = format!("{}.json", &sha(&config)[7..]);
    let mut b = tar::Builder::new(Vec::new());
    let mut layer_paths = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let path = format!("layer{i}/layer.tar");
        if i > 0 && l == &layers[0] {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_cksum();
            b.append_link(&mut h, &path, "../layer0/layer.tar").unwrap();
        } else {
            let mut h = tar::Header::new_ustar();
            h.set_size(l.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, &path, l.as_slice()).unwrap();
        }
        layer_paths.push(path);
    }
    let mut h = tar::Header::new_ustar();
    h.set_size(config.len() as u64);
    h.set_cksum();
    b.append_data(&mut h, &config_name, config.as_slice())
        .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": config_name, "RepoTags": tags, "Layers": layer_paths}
    ]))
    .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_size(manifest.len() as u64);
    h.set_cksum();
    b.append_data(&mut h, "manifest.json", manifest.as_slice())
        .unwrap();
    (b.into_inner().unwrap(), sha(&config))
}
