//! The image pull scenarios: a generated image pushed to --registry and
//! pulled cold, then again with every layer present; and signed images
//! pulled with and without a signature policy checking them.

use std::time::{Duration, Instant};

use anyhow::Context;
use crust_test_support::registry::{CosignKey, SignatureLayer};

use crate::cli::Args;
use crate::progress::bar;
use crate::push::{big_image, pusher};
use crate::stats::{Report, summarize};
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

/// The namespaces of the signed-pull scenario: one whose policy file
/// checks signatures, one without a file (not checked).
const CHECKED_NS: &str = "crust-bench-signed";
const UNCHECKED_NS: &str = "crust-bench-unchecked";

/// --signed-pulls cold pulls of signed 5-layer images in [`CHECKED_NS`]
/// (a sigstoreSigned policy with a key of the run's own) and as many in
/// [`UNCHECKED_NS`], alternating which goes first; every image is new
/// (cold) and removed after its pull. On --endpoint only.
pub async fn signed_pull(
    report: &mut Report,
    targets: &mut [Target],
    args: &Args,
) -> anyhow::Result<()> {
    let (Some(registry), Some(dir)) = (&args.registry, &args.signature_policy_dir) else {
        report.skipped.push(
            "image-pull-signed: needs --registry and --signature-policy-dir (the daemon's \
             [image] signature_policy_dir)"
                .into(),
        );
        return Ok(());
    };
    let Some(t) = targets.first_mut() else {
        return Ok(());
    };
    let key = CosignKey::generate();
    let policy = serde_json::json!({"default": [{
        "type": "sigstoreSigned",
        "keyData": key.key_data(),
        "signedIdentity": {"type": "matchRepository"},
    }]});
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let policy_file = dir.join(format!("{CHECKED_NS}.json"));
    std::fs::write(&policy_file, serde_json::to_vec(&policy)?)
        .with_context(|| format!("writing {}", policy_file.display()))?;
    let pusher = pusher(registry);
    let repo = "crust-bench/signed";
    // The daemon must really check: an unsigned image is refused there.
    let unsigned = big_image(1, 1, std::process::id() as u64);
    let tag = t.client.fixtures.unique("unsigned");
    pusher.try_image(repo, &tag, &unsigned).await?;
    let reference = format!("{registry}/{repo}:{tag}");
    if t.client
        .pull_for_namespace(&reference, CHECKED_NS)
        .await
        .is_ok()
    {
        t.client.remove_image(&reference).await?;
        anyhow::bail!(
            "image-pull-signed: {} pulled an unsigned image in namespace {CHECKED_NS}: its \
             [image] signature_policy_dir is not {}",
            t.name,
            dir.display()
        );
    }
    let layers = 5;
    let per_layer = args.signed_pull_mib.div_ceil(layers).max(1);
    let seed = std::process::id() as u64 * 1_000_000
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
    let pulls = args.signed_pulls.max(1);
    let pb = bar(2 * pulls as u64, &format!("signed pulls ({})", t.name));
    let (mut checked, mut unchecked, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..pulls {
        let mut took = [Duration::ZERO; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for kind in order {
            let image = big_image(layers, per_layer, seed + (2 * round + kind) as u64);
            let tag = t.client.fixtures.unique("s");
            pusher.try_image(repo, &tag, &image).await?;
            let digest = image.manifest_digest();
            let signature = SignatureLayer::new(&key, &format!("{registry}/{repo}"), &digest);
            pusher
                .try_push_signatures(repo, &digest, &[signature])
                .await?;
            let reference = format!("{registry}/{repo}:{tag}");
            let ns = if kind == 0 { CHECKED_NS } else { UNCHECKED_NS };
            let start = Instant::now();
            t.client.pull_for_namespace(&reference, ns).await?;
            took[kind] = start.elapsed();
            t.client.remove_image(&reference).await?;
            pb.inc(1);
        }
        checked.push(took[0]);
        unchecked.push(took[1]);
        diffs.push(took[0].as_secs_f64() - took[1].as_secs_f64());
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_file(&policy_file);
    let mb = (layers * per_layer) as f64 * 1.048_576;
    report.results.push(summarize(
        &format!("pull {mb:.0} MB signed, checked"),
        &t.name,
        checked,
    ));
    report.results.push(summarize(
        &format!("pull {mb:.0} MB signed, unchecked"),
        &t.name,
        unchecked,
    ));
    diffs.sort_by(f64::total_cmp);
    report.figure(
        "signature check (paired p50)",
        &t.name,
        diffs[diffs.len() / 2] * 1e3,
        "ms",
    );
    Ok(())
}
