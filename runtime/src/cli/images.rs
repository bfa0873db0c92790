//! `crust images`: pull (a progress bar per layer), ls, rm, import, prune,
//! through the running daemon. ls and rm use the CRI ImageService (so they
//! behave as `crictl images` / `crictl rmi`); pull, import and prune use
//! crust's admin API on the same socket.

use std::collections::{HashMap, HashSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use crust_api::admin::v1 as admin;
use crust_api::admin::v1::images_client::ImagesClient;
use crust_api::v1;
use crust_api::v1::image_service_client::ImageServiceClient;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{DaemonSocket, block_on, connect, human_size};

#[derive(Args)]
pub struct ImagesArgs {
    #[command(flatten)]
    daemon: DaemonSocket,
    #[command(subcommand)]
    command: ImagesCommand,
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Pull an image from its registry, with a progress bar per layer.
    Pull {
        /// Image reference: `busybox`, `registry.k8s.io/pause:3.10`,
        /// `name@sha256:...`.
        image: String,
        /// Registry credentials.
        #[arg(long, value_name = "USER:PASSWORD")]
        creds: Option<String>,
    },
    /// List images.
    #[command(visible_alias = "list")]
    Ls {
        /// Only this image (ID, tag, digest) or the images of this
        /// repository (a name without tag).
        image: Option<String>,
        /// Print image IDs only.
        #[arg(short, long)]
        quiet: bool,
        /// Print full image IDs.
        #[arg(long)]
        no_trunc: bool,
    },
    /// Remove images by ID, tag or digest. As with `crictl rmi`, an image
    /// goes with all its tags, whichever one names it.
    #[command(visible_alias = "rmi")]
    Rm {
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<String>,
    },
    /// Load every image of a `docker save` or OCI image-layout tar (plain,
    /// gzip or zstd), for nodes without registry access.
    Import {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Remove every image that no container uses (pinned images stay).
    Prune,
}

pub fn run(args: ImagesArgs) -> anyhow::Result<()> {
    let socket = args.daemon.socket;
    block_on(async move {
        match args.command {
            ImagesCommand::Pull { image, creds } => pull(&socket, image, creds).await,
            ImagesCommand::Ls {
                image,
                quiet,
                no_trunc,
            } => list(&socket, image, quiet, no_trunc).await,
            ImagesCommand::Rm { images } => remove(&socket, &images).await,
            ImagesCommand::Import { file } => import(&socket, &file).await,
            ImagesCommand::Prune => prune(&socket).await,
        }
    })
}

/// A gRPC error as the user sees it: the daemon's message says what failed.
fn rpc_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", status.message(), status.code())
}

fn parse_creds(creds: Option<String>) -> anyhow::Result<Option<admin::Auth>> {
    let Some(creds) = creds else {
        return Ok(None);
    };
    let Some((user, password)) = creds.split_once(':') else {
        bail!("--creds wants USER:PASSWORD");
    };
    if user.is_empty() {
        bail!("--creds: the user name is empty");
    }
    Ok(Some(admin::Auth {
        username: user.to_string(),
        password: password.to_string(),
        ..admin::Auth::default()
    }))
}

async fn pull(socket: &Path, image: String, creds: Option<String>) -> anyhow::Result<()> {
    let auth = parse_creds(creds)?;
    let mut client = ImagesClient::new(connect(socket).await?);
    let mut stream = client
        .pull(admin::PullRequest {
            image: image.clone(),
            auth,
        })
        .await
        .map_err(rpc_error)?
        .into_inner();
    let mut bars = Bars::new();
    while let Some(msg) = stream.message().await.map_err(rpc_error)? {
        match msg.event {
            Some(admin::pull_progress::Event::Blob(b)) => bars.update(&b),
            Some(admin::pull_progress::Event::Image(img)) => {
                bars.finish();
                println!("Pulled {image}: {} ({})", img.id, human_size(img.size));
                return Ok(());
            }
            None => {}
        }
    }
    bail!("the daemon ended the pull of {image} without a result")
}

/// One progress bar per blob on a terminal; one line per finished blob
/// otherwise. A blob ends as "exists" (was already there) or "downloaded";
/// all say "done" once the image is unpacked and recorded.
struct Bars {
    multi: MultiProgress,
    bars: HashMap<String, ProgressBar>,
    complete: HashSet<String>,
    tty: bool,
}

impl Bars {
    fn new() -> Bars {
        let tty = std::io::stderr().is_terminal();
        let target = if tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Bars {
            multi: MultiProgress::with_draw_target(target),
            bars: HashMap::new(),
            complete: HashSet::new(),
            tty,
        }
    }

    fn update(&mut self, b: &admin::BlobProgress) {
        if self.complete.contains(&b.digest) {
            return;
        }
        let short = short_digest(&b.digest);
        let bar = self.bars.entry(b.digest.clone()).or_insert_with(|| {
            let bar = self.multi.add(ProgressBar::new(b.total));
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {bytes:>10}/{total_bytes:<10} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(short.clone());
            bar
        });
        bar.set_length(b.total);
        bar.set_position(b.done.min(b.total));
        if b.done >= b.total {
            let state = if b.present { "exists" } else { "downloaded" };
            bar.set_message(state);
            self.complete.insert(b.digest.clone());
            if !self.tty {
                eprintln!("{short}: {state} ({})", human_size(b.total));
            }
        }
    }

    fn finish(&mut self) {
        for bar in self.bars.values() {
            bar.finish_with_message("done");
        }
    }
}

/// `sha256:0123456789ab` (12 hex digits, as docker shows layers).
fn short_digest(digest: &str) -> String {
    let (algo, hex) = digest.split_once(':').unwrap_or(("", digest));
    let hex: String = hex.chars().take(12).collect();
    if algo.is_empty() {
        hex
    } else {
        format!("{algo}:{hex}")
    }
}

/// The 13 characters of an ID that crictl prints.
fn truncated_id(id: &str) -> String {
    id.trim_start_matches("sha256:").chars().take(13).collect()
}

async fn list(
    socket: &Path,
    image: Option<String>,
    quiet: bool,
    no_trunc: bool,
) -> anyhow::Result<()> {
    let mut client = ImageServiceClient::new(connect(socket).await?);
    let filter = image.map(|image| v1::ImageFilter {
        image: Some(v1::ImageSpec {
            image,
            ..v1::ImageSpec::default()
        }),
    });
    let mut images = client
        .list_images(v1::ListImagesRequest { filter })
        .await
        .map_err(rpc_error)?
        .into_inner()
        .images;
    images.sort_by(|a, b| {
        let key = |i: &v1::Image| i.repo_tags.first().cloned().unwrap_or_default();
        key(a).cmp(&key(b)).then_with(|| a.id.cmp(&b.id))
    });
    if quiet {
        for i in &images {
            println!("{}", i.id);
        }
        return Ok(());
    }
    let mut rows = vec![[
        "IMAGE".to_string(),
        "TAG".to_string(),
        "IMAGE ID".to_string(),
        "SIZE".to_string(),
    ]];
    for i in &images {
        let id = if no_trunc {
            i.id.clone()
        } else {
            truncated_id(&i.id)
        };
        let size = human_size(i.size);
        let mut names: Vec<(String, String)> = i
            .repo_tags
            .iter()
            .map(|t| match t.rsplit_once(':') {
                Some((name, tag)) if !tag.contains('/') => (name.to_string(), tag.to_string()),
                _ => (t.clone(), "<none>".to_string()),
            })
            .collect();
        if names.is_empty() {
            let name = i
                .repo_digests
                .first()
                .and_then(|d| d.split_once('@'))
                .map_or("<none>", |(name, _)| name);
            names.push((name.to_string(), "<none>".to_string()));
        }
        for (name, tag) in names {
            rows.push([name, tag, id.clone(), size.clone()]);
        }
    }
    print!("{}", table(&rows));
    Ok(())
}

/// Left-aligned columns, three spaces apart.
fn table(rows: &[[String; 4]]) -> String {
    let mut widths = [0usize; 4];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}   ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

async fn remove(socket: &Path, images: &[String]) -> anyhow::Result<()> {
    let mut client = ImageServiceClient::new(connect(socket).await?);
    let mut failed = 0;
    for query in images {
        let spec = v1::ImageSpec {
            image: query.clone(),
            ..v1::ImageSpec::default()
        };
        let status = client
            .image_status(v1::ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            })
            .await
            .map_err(rpc_error)?
            .into_inner();
        let Some(image) = status.image else {
            eprintln!("crust: no such image {query}");
            failed += 1;
            continue;
        };
        if let Err(e) = client
            .remove_image(v1::RemoveImageRequest { image: Some(spec) })
            .await
        {
            eprintln!("crust: removing {query}: {}", rpc_error(e));
            failed += 1;
            continue;
        }
        for name in deleted_names(&image.id, &image.repo_tags, &image.repo_digests) {
            println!("Deleted: {name}");
        }
    }
    if failed > 0 {
        bail!("{failed} of {} images not removed", images.len());
    }
    Ok(())
}

/// What to print for a removed image: its tags, else its digests, else its
/// ID (as crictl).
fn deleted_names(id: &str, tags: &[String], digests: &[String]) -> Vec<String> {
    if !tags.is_empty() {
        tags.to_vec()
    } else if !digests.is_empty() {
        digests.to_vec()
    } else {
        vec![id.to_string()]
    }
}

async fn import(socket: &Path, file: &Path) -> anyhow::Result<()> {
    // The daemon opens the file: give it an absolute path.
    let path =
        std::fs::canonicalize(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut client = ImagesClient::new(connect(socket).await?);
    let images = client
        .import(admin::ImportRequest {
            path: path.display().to_string(),
        })
        .await
        .map_err(rpc_error)?
        .into_inner()
        .images;
    if images.is_empty() {
        bail!("{} holds no image", file.display());
    }
    for i in &images {
        let names = if i.repo_tags.is_empty() {
            "<untagged>".to_string()
        } else {
            i.repo_tags.join(", ")
        };
        println!("Imported {names}: {} ({})", i.id, human_size(i.size));
    }
    Ok(())
}

async fn prune(socket: &Path) -> anyhow::Result<()> {
    let mut client = ImagesClient::new(connect(socket).await?);
    let removed = client
        .prune(admin::PruneRequest {})
        .await
        .map_err(rpc_error)?
        .into_inner()
        .removed;
    let mut freed = 0u64;
    for i in &removed {
        freed = freed.saturating_add(i.size);
        for name in deleted_names(&i.id, &i.repo_tags, &i.repo_digests) {
            println!("Deleted: {name}");
        }
    }
    println!(
        "{} images removed, {} freed",
        removed.len(),
        human_size(freed)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creds_split_at_the_first_colon() {
        let a = parse_creds(Some("alice:pa:ss".into())).unwrap().unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.as_str()),
            ("alice", "pa:ss")
        );
        assert!(parse_creds(Some("alice".into())).is_err());
        assert!(parse_creds(Some(":x".into())).is_err());
        assert!(parse_creds(None).unwrap().is_none());
    }

    #[test]
    fn ids_and_digests_are_shortened_like_crictl_and_docker() {
        let id = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert_eq!(truncated_id(&id), "0123456789abc");
        assert_eq!(short_digest(&id), "sha256:0123456789ab");
    }

    #[test]
    fn table_columns_line_up() {
        let rows = [
            ["IMAGE", "TAG", "IMAGE ID", "SIZE"].map(String::from),
            ["docker.io/library/busybox", "latest", "abc", "1.00MB"].map(String::from),
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0].find("TAG"), lines[1].find("latest"));
        assert_eq!(lines[0].find("SIZE"), lines[1].find("1.00MB"));
    }
}
