//! The start most suites share: a registry serving the suite's test image
//! and a daemon that has pulled it.

use crate::cri::pull_image;
use crate::daemon::{Daemon, DaemonBuilder};
use crate::registry::{Pusher, Registry, TestImage};

/// A daemon started from `builder` after `img` was pushed to a fresh
/// registry as `<repo>:v1`, with the image pulled. The registry must
/// outlive the daemon's use of it.
pub struct WithImage {
    pub daemon: Daemon,
    pub registry: Registry,
    /// The image's reference, `<registry>/<repo>:v1`.
    pub image: String,
}

pub async fn daemon_with_image(builder: DaemonBuilder, repo: &str, img: &TestImage) -> WithImage {
    let registry = Registry::start();
    Pusher::new(&registry).image(repo, "v1", img).await;
    let daemon = builder.start().await;
    let image = format!("{}/{repo}:v1", registry.host);
    pull_image(&mut daemon.image_v1().await, &image).await;
    WithImage {
        daemon,
        registry,
        image,
    }
}
