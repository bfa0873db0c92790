//! Removes what the bench created, at exit whatever happened: its pods
//! (tracked, and any of its name the endpoints still list), the images
//! the pull scenario pulled, the pods' log directories and the emptied
//! cgroup parent.

use std::time::Duration;

use crust_api::v1;

use crate::fixtures::Fixtures;
use crate::target::Target;

/// Pods of this bench process the endpoint lists (also those whose
/// RunPodSandbox was cut short, so the bench never learnt their id).
async fn own_pods(t: &mut Target) -> Vec<String> {
    let Ok(list) = t
        .client
        .rt
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
    else {
        return Vec::new();
    };
    let fixtures = &t.client.fixtures;
    list.into_inner()
        .items
        .into_iter()
        .filter(|p| p.metadata.as_ref().is_some_and(|m| fixtures.is_own_pod(m)))
        .map(|p| p.id)
        .collect()
}

/// Removes every pod the bench created and did not remove, every image
/// the pull scenario pulled, the pods' log directories and their cgroup
/// parent.
pub async fn cleanup(targets: &mut [Target], fixtures: &Fixtures) {
    let pods: Vec<Vec<String>> = targets
        .iter()
        .map(|t| t.client.tracker.take_pods())
        .collect();
    let count: usize = pods.iter().map(Vec::len).sum();
    if count > 0 {
        eprintln!("cleaning up {count} pod(s)");
    }
    for (t, pods) in targets.iter_mut().zip(pods) {
        for id in pods {
            if let Err(e) = t.client.remove_pod(&id).await {
                eprintln!("cleanup of pod {id} on {}: {e:#}", t.name);
            }
        }
    }
    // Calls in flight when the bench was interrupted may still create pods:
    // sweep by name until two passes in a row find none.
    let mut quiet = 0;
    for _ in 0..20 {
        let mut found = 0;
        for t in targets.iter_mut() {
            for id in own_pods(t).await {
                found += 1;
                if let Err(e) = t.client.remove_pod(&id).await {
                    eprintln!("cleanup of pod {id} on {}: {e:#}", t.name);
                }
            }
        }
        quiet = if found == 0 { quiet + 1 } else { 0 };
        if quiet >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for t in targets.iter_mut() {
        for image in t.client.tracker.take_images() {
            let r = t
                .client
                .img
                .remove_image(v1::RemoveImageRequest {
                    image: Some(v1::ImageSpec {
                        image: image.clone(),
                        ..Default::default()
                    }),
                })
                .await;
            if let Err(e) = r {
                eprintln!("cleanup of image {image} on {}: {e}", t.name);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&fixtures.log_root);
    remove_cgroup_parent(&fixtures.cgroup_parent);
}

/// Removes the bench's cgroup parent in every hierarchy, deepest first
/// (rmdir only: a cgroup that still has processes stays, and says so).
fn remove_cgroup_parent(parent: &str) {
    let rel = parent.trim_matches('/');
    if rel.is_empty() {
        return;
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    fn rm(dir: &std::path::Path) -> bool {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rm(&e.path());
                }
            }
        }
        std::fs::remove_dir(dir).is_ok()
    }
    for h in hierarchies.flatten() {
        let dir = h.path().join(rel);
        if dir.is_dir() && !rm(&dir) {
            eprintln!("cgroup {} is not empty; left in place", dir.display());
        }
    }
    // A top-level "/crust-bench-N": nothing above it to clean.
}
