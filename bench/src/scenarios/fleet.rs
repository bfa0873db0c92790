//! Many pods at once: started (a running container each) and removed
//! with bounded parallelism, for the density and metrics scenarios.

use crate::progress::bar;
use crate::target::Target;

/// Starts `n` pods (host network unless `cni`) with a running container
/// each, `par` at a time; returns the pod IDs.
pub async fn start_pods(
    t: &Target,
    n: usize,
    par: usize,
    cni: bool,
    label: &str,
) -> anyhow::Result<Vec<String>> {
    let image = t.image()?;
    let pb = bar(n as u64, &format!("{label} ({})", t.name));
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(par.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut client = t.client.clone();
        let sem = sem.clone();
        let image = image.clone();
        let pb = pb.clone();
        set.spawn(async move {
            let _permit = sem.acquire().await?;
            let pod = client.run_pod("", !cni).await?;
            let id = client.create_container(&pod, &image).await?;
            client.start_container(&id).await?;
            pb.inc(1);
            anyhow::Ok(pod.0)
        });
    }
    let mut pods = Vec::new();
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        match r? {
            Ok(p) => pods.push(p),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    pb.finish_and_clear();
    match first_err {
        Some(e) => {
            // Started ones are tracked and go at exit.
            Err(e.context(format!("{label}: starting pods")))
        }
        None => Ok(pods),
    }
}

/// Removes `pods`, `par` at a time.
pub async fn remove_pods(t: &Target, pods: Vec<String>, par: usize) -> anyhow::Result<()> {
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(par.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for pod in pods {
        let mut client = t.client.clone();
        let sem = sem.clone();
        set.spawn(async move {
            let _permit = sem.acquire().await?;
            client.remove_pod(&pod).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}
