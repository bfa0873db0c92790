//! The image pull scenario: a generated image pushed to --registry and
//! pulled cold, then again with every layer present.

use std::time::Instant;

use crate::cli::Args;
use crate::progress::bar;
use crate::push::{big_image, pusher};
use crate::stats::Report;
use crate::target::Target;

/// Pulls of a --pull-mib image (5 layers of incompressible data), per
/// target: cold, then with its layers present (same layers, another config).
pub async fn image_pull(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    let Some(registry) = &args.registry else {
        report
            .skipped
            .push("image-pull: needs --registry HOST:PORT".into());
        return Ok(());
    };
    let pusher = pusher(registry);
    let layers = 5;
    let per_layer = args.pull_mib.div_ceil(layers).max(1);
    for t in targets.iter_mut() {
        let pb = bar(4, &format!("image pull ({})", t.name));
        // Distinct data per endpoint and run: the first pull is cold.
        let seed = std::process::id() as u64 * 1000
            + t.index as u64
            + std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
        let cold = big_image(layers, per_layer, seed);
        // Same layers, another config: a pull with every layer present.
        let mut warm_spec_layers = cold.layers.clone();
        let warm = crust_test_support::registry::build(crust_test_support::registry::ImageSpec {
            layers: std::mem::take(&mut warm_spec_layers),
            cmd: &["sh", "-c", "true"],
            ..Default::default()
        });
        let mb = cold.size() as f64 / 1e6;
        let tag = t.client.fixtures.unique("t");
        pb.inc(1);
        pusher.try_image("crust-bench/big", &tag, &cold).await?;
        pusher
            .try_image("crust-bench/big", &format!("{tag}-warm"), &warm)
            .await?;
        pb.inc(1);
        for (kind, tag) in [
            ("cold", tag.clone()),
            ("layers present", format!("{tag}-warm")),
        ] {
            let reference = format!("{registry}/crust-bench/big:{tag}");
            let start = Instant::now();
            let image_ref = t.client.pull(&reference).await?;
            let secs = start.elapsed().as_secs_f64();
            t.client.tracker.image_pulled(image_ref);
            report.figure(
                &format!("pull {:.0} MB {kind}", mb),
                &t.name,
                secs * 1e3,
                "ms",
            );
            report.figure(
                &format!("pull {:.0} MB {kind} rate", mb),
                &t.name,
                mb / secs,
                "MB/s",
            );
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    Ok(())
}
