//! Builds the bench's images, pushed to a local registry (plain http on
//! 127.0.0.1) with the tests' push client: a busybox-static image for the
//! container scenarios, and a generated ~100 MB, 5-layer image for the pull
//! scenario.

use anyhow::Context;
use crust_test_support::registry::{self, Blob, ImageSpec, LayerTar, Pusher, TestImage};

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

/// The push client of the bench: the tests' one, reporting failures, and
/// leaving out blobs the registry has (the pull scenario's second image
/// shares its layers with the first).
pub fn pusher(registry: &str) -> Pusher {
    Pusher::for_host(registry).skip_existing()
}
