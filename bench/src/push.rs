//! Builds the bench's images and pushes them to a local registry
//! (plain http on 127.0.0.1): a busybox-static image for the container
//! scenarios, and a generated ~100 MB, 5-layer image for the pull scenario.

use anyhow::{Context, bail};
use crust_test_support::registry::{self, Blob, ImageSpec, LayerTar, TestImage};

/// busybox with the applets the scenarios run (`sleep`, `true`, `sh`).
pub fn busybox_image() -> anyhow::Result<TestImage> {
    let busybox = std::fs::read(registry::BUSYBOX)
        .with_context(|| format!("reading {} (busybox-static)", registry::BUSYBOX))?;
    let tar = LayerTar::new()
        .busybox(&busybox, &["sh", "sleep", "true", "ls", "cat", "echo"])
        .dir("etc/")
        .file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        .file("etc/group", b"root:x:0:\n")
        .dir("tmp/")
        .finish();
    Ok(registry::one_layer_image(&tar, &["sleep", "3600"]))
}

/// A pod sandbox image: `binary` (static) as /pause, its command.
pub fn pause_image(binary: &std::path::Path) -> anyhow::Result<TestImage> {
    let bin = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let tar = LayerTar::new().file_mode("pause", &bin, 0o755).finish();
    Ok(registry::one_layer_image(&tar, &["/pause"]))
}

/// `layers` layers of `mib_per_layer` MiB of incompressible data each (one
/// file per layer), gzip-wrapped; `seed` makes every generated image
/// distinct, so a cold pull shares nothing with an earlier one.
pub fn big_image(layers: usize, mib_per_layer: usize, seed: u64) -> TestImage {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let blobs: Vec<Blob> = (0..layers)
        .map(|i| {
            let mut data = vec![0u8; mib_per_layer << 20];
            for chunk in data.chunks_exact_mut(8) {
                // xorshift64*
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                chunk.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
            }
            let tar = LayerTar::new()
                .dir("data/")
                .file(&format!("data/layer-{i}.bin"), &data)
                .finish();
            registry::gzip(&tar)
        })
        .collect();
    registry::build(ImageSpec {
        layers: blobs,
        cmd: &["sh"],
        ..Default::default()
    })
}

pub struct Pusher {
    http: reqwest::Client,
    base: String,
}

impl Pusher {
    pub fn new(registry: &str) -> Pusher {
        Pusher {
            http: reqwest::Client::new(),
            base: format!("http://{registry}"),
        }
    }

    async fn blob(&self, repo: &str, bytes: &[u8]) -> anyhow::Result<()> {
        let digest = registry::sha(bytes);
        let head = self
            .http
            .head(format!("{}/v2/{repo}/blobs/{digest}", self.base))
            .send()
            .await?;
        if head.status().is_success() {
            return Ok(());
        }
        let resp = self
            .http
            .post(format!("{}/v2/{repo}/blobs/uploads/", self.base))
            .send()
            .await
            .context("starting a blob upload")?;
        if resp.status() != 202 {
            bail!("start upload: {} {}", resp.status(), resp.text().await?);
        }
        let location = resp
            .headers()
            .get("location")
            .context("upload without location")?
            .to_str()?
            .to_string();
        let location = if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            location
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let resp = self
            .http
            .put(format!("{location}{sep}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .body(bytes.to_vec())
            .send()
            .await?;
        if resp.status() != 201 {
            bail!("upload: {} {}", resp.status(), resp.text().await?);
        }
        Ok(())
    }

    pub async fn image(&self, repo: &str, tag: &str, img: &TestImage) -> anyhow::Result<()> {
        for l in &img.layers {
            self.blob(repo, &l.bytes).await?;
        }
        self.blob(repo, &img.config).await?;
        let resp = self
            .http
            .put(format!("{}/v2/{repo}/manifests/{tag}", self.base))
            .header("content-type", img.manifest_type)
            .body(img.manifest.clone())
            .send()
            .await?;
        if resp.status() != 201 {
            bail!("manifest: {} {}", resp.status(), resp.text().await?);
        }
        Ok(())
    }
}
