//! Image builders: layer tars, compressed blobs, configs and manifests,
//! indexes; the busybox-static base layer.

use std::io::Write;

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

    /// /bin/busybox (the bytes of busybox-static) with `applets` linked to
    /// it in /bin.
    pub fn busybox(self, busybox: &[u8], applets: &[&str]) -> Self {
        let mut tar = self.dir("bin/").file_mode("bin/busybox", busybox, 0o755);
        for applet in applets {
            tar = tar.symlink(&format!("bin/{applet}"), "busybox");
        }
        tar
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

/// The start of a test image's root file system: busybox-static as
/// /bin/busybox and `applets` linked to it in /bin. The test adds the rest
/// (/etc, /tmp ...) and calls [`LayerTar::finish`].
pub fn busybox_with(applets: &[&str]) -> LayerTar {
    let busybox = std::fs::read(BUSYBOX).expect("busybox-static must be installed");
    LayerTar::new().busybox(&busybox, applets)
}

/// An image of one gzip layer that runs `cmd`.
pub fn one_layer_image(layer: &[u8], cmd: &[&str]) -> TestImage {
    build(ImageSpec {
        layers: vec![gzip(layer)],
        cmd,
        ..ImageSpec::default()
    })
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

/// An image of `layers` layers of 256 KiB noise each (xorshift64: gzip
/// cannot shrink it), so a blob is many chunks: for registries that stall
/// or trickle mid-blob.
pub fn noise_image(layers: usize) -> TestImage {
    let blobs = (0..layers)
        .map(|i| {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
            let data: Vec<u8> = (0..256 * 1024)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            gzip(&LayerTar::new().file(&format!("data{i}"), &data).finish())
        })
        .collect();
    build(ImageSpec {
        layers: blobs,
        ..ImageSpec::default()
    })
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
