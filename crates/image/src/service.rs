//! [`ImageService`]: pull, list, look up, remove, prune, lease and GC images.
//!
//! Consistency rules:
//! - every mutation of the index runs under `index_lock`, reading records
//!   and writing one store transaction;
//! - an operation in flight pins the blobs and layers it touches before it
//!   checks for them, and unpins only after its record is written; GC skips
//!   pinned content and decides under the same pin lock, so pulling and
//!   collecting the same content never interleave badly;
//! - GC keeps blobs referenced by images, and layers referenced by images or
//!   by container leases.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crust_quote::quote;
use crust_store::Store;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sha2::{Digest as _, Sha256};
use tokio::sync::{OnceCell, Semaphore, watch};
use tracing::{Instrument, info_span};

use crate::TRACE_TARGET;
use crate::content::ContentStore;
use crate::digest::{Digest, chain_ids};
use crate::error::{Error, ErrorKind, Result};
use crate::hosts::RegistryHosts;
use crate::index::{self, Changes, Image, Lease, LeaseRecord, Leases};
use crate::keyed::{KeyedLocks, PinSet, Pins};
use crate::layers::{LayerStore, remove_dir};
use crate::manifest::{
    self, Descriptor, Document, MAX_CONFIG_BYTES, MAX_INDEX_DEPTH, MAX_MANIFEST_BYTES, Manifest,
};
use crate::orphans::{ContentKind, OrphanContent, measured, unreferenced};
use crate::reference::Reference;
use crate::registry::{Credentials, ProgressFn, Remote};
use crate::signature::{PolicyFiles, Verdict};
use crate::usage::{FsUsage, usage};

/// Layer downloads run at once per pull by default (containerd's default).
pub const DEFAULT_MAX_CONCURRENT_DOWNLOADS: usize = 3;

/// How long a download may go without a byte before it is given up
/// (containerd's `image_pull_progress_timeout` default).
pub const DEFAULT_PULL_PROGRESS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone)]
pub struct Config {
    /// The daemon's root dir; images live in `content/` and `layers/` in it.
    pub root: PathBuf,
    /// The hosts.toml dir (`--registry-config-dir`); None = defaults only.
    pub registry_config_dir: Option<PathBuf>,
    pub max_concurrent_downloads: usize,
    /// A request to a registry that receives nothing for this long (no
    /// response yet, or no byte of a blob) is given up; None: never.
    pub pull_progress_timeout: Option<Duration>,
    /// Signature policies; default: none (images are not checked).
    pub signature_policy: PolicyFiles,
}

impl Config {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Config {
            root: root.into(),
            registry_config_dir: None,
            max_concurrent_downloads: DEFAULT_MAX_CONCURRENT_DOWNLOADS,
            pull_progress_timeout: Some(DEFAULT_PULL_PROGRESS_TIMEOUT),
            signature_policy: PolicyFiles::default(),
        }
    }
}

/// What pulls go by. The daemon replaces them when its config is reloaded
/// ([`ImageService::set_pull_settings`]); a pull uses the settings of the
/// moment it reaches each step (registry hosts and timeout when it starts,
/// the download limit when it fetches the layers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSettings {
    /// The hosts.toml dir; None = defaults only.
    pub registry_config_dir: Option<PathBuf>,
    /// Layer downloads at once per pull (at least 1).
    pub max_concurrent_downloads: usize,
    /// See [`Config::pull_progress_timeout`].
    pub progress_timeout: Option<Duration>,
    /// Where signature policies are (read at each pull).
    pub signature_policy: PolicyFiles,
}

type SharedResult = std::result::Result<(Image, Verdict), Arc<Error>>;

/// The image store. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct ImageService {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<Store>,
    content: ContentStore,
    layers: LayerStore,
    pull_settings: RwLock<Arc<PullSettings>>,
    privileged: bool,
    pins: Arc<Pins>,
    blob_locks: KeyedLocks,
    layer_locks: KeyedLocks,
    index_lock: tokio::sync::Mutex<()>,
    inflight: Mutex<HashMap<String, Arc<OnceCell<SharedResult>>>>,
}

/// Where an image's blobs come from while it is installed.
#[derive(Clone, Copy)]
enum Source<'a> {
    Registry(&'a Remote, Option<&'a ProgressFn>),
    /// Already in the content store (import).
    Local,
}

/// The references an installed image gets.
struct Names {
    tags: Vec<String>,
    digests: Vec<String>,
}

fn blob_key(d: &Digest) -> String {
    format!("blob:{d}")
}

fn layer_key(d: &Digest) -> String {
    format!("layer:{d}")
}

impl ImageService {
    /// Opens the store under `config.root`, removing what an interrupted
    /// earlier run left (temp files, half-deleted layers, unreferenced
    /// content). `store` is the daemon's metadata store.
    pub async fn open(config: Config, store: Arc<Store>) -> Result<Self> {
        let content = ContentStore::open(&config.root.join("content"))?;
        let layers = LayerStore::open(&config.root.join("layers"))?;
        let svc = ImageService {
            inner: Arc::new(Inner {
                store,
                content,
                layers,
                pull_settings: RwLock::new(Arc::new(PullSettings {
                    registry_config_dir: config.registry_config_dir,
                    max_concurrent_downloads: config.max_concurrent_downloads.max(1),
                    progress_timeout: config.pull_progress_timeout,
                    signature_policy: config.signature_policy,
                })),
                privileged: crate::unpack::running_as_root(),
                pins: Arc::new(Pins::default()),
                blob_locks: KeyedLocks::default(),
                layer_locks: KeyedLocks::default(),
                index_lock: tokio::sync::Mutex::new(()),
                inflight: Mutex::new(HashMap::new()),
            }),
        };
        svc.gc().await?;
        Ok(svc)
    }

    /// Pulls an image (PullImage). Concurrent pulls of the same reference
    /// with the same credentials run once and share the result.
    pub async fn pull(&self, reference: &str, creds: &Credentials) -> Result<Image> {
        self.pull_with_progress(reference, creds, None).await
    }

    /// [`Self::pull`], reporting per-blob download progress.
    pub async fn pull_with_progress(
        &self,
        reference: &str,
        creds: &Credentials,
        progress: Option<ProgressFn>,
    ) -> Result<Image> {
        self.pull_checked(reference, creds, progress, None)
            .await
            .map(|(image, _)| image)
    }

    /// [`Self::pull_with_progress`] for a pod in `namespace` (which may
    /// have a signature policy of its own), answering what the signature
    /// policy decided. A refused image is an error of kind
    /// [`ErrorKind::PolicyRefused`], and nothing of it is stored.
    pub async fn pull_checked(
        &self,
        reference: &str,
        creds: &Credentials,
        progress: Option<ProgressFn>,
        namespace: Option<&str>,
    ) -> Result<(Image, Verdict)> {
        let reference = Reference::parse(reference)?;
        if let Some(ns) = namespace {
            crate::signature::check_namespace(ns)?;
        }
        let settings = self.pull_settings();
        let policy = settings.signature_policy.select(namespace);
        // Pulls under different policies are different pulls.
        let key = flight_key(&reference, creds, policy.as_deref());
        let cell = self
            .inflight()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(OnceCell::new()))
            .clone();
        let result = cell
            .get_or_init(|| async {
                let result = self
                    .pull_uncached(&reference, creds, progress.as_ref(), policy.as_deref())
                    .instrument(info_span!(
                        target: TRACE_TARGET,
                        "image.pull",
                        image = %reference
                    ))
                    .await;
                if let Err(e) = &result
                    && e.kind() == ErrorKind::InvalidContent
                {
                    // Corrupt or hostile content: keep nothing of it (its
                    // pins are gone now; other pulls' content stays pinned).
                    if let Err(gc) = self.gc().await {
                        tracing::warn!(error = %gc, "cleaning up after a rejected image");
                    }
                }
                result.map_err(Arc::new)
            })
            .await
            .clone();
        let mut inflight = self.inflight();
        if inflight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            inflight.remove(&key);
        }
        result.map_err(Error::Shared)
    }

    /// The settings pulls go by now.
    pub fn pull_settings(&self) -> Arc<PullSettings> {
        self.inner
            .pull_settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the settings pulls go by (a config reload); pulls in
    /// flight keep what they already use.
    pub fn set_pull_settings(&self, mut settings: PullSettings) {
        settings.max_concurrent_downloads = settings.max_concurrent_downloads.max(1);
        *self
            .inner
            .pull_settings
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(settings);
    }

    fn inflight(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OnceCell<SharedResult>>>> {
        self.inner
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    async fn pull_uncached(
        &self,
        reference: &Reference,
        creds: &Credentials,
        progress: Option<&ProgressFn>,
        policy: Option<&Path>,
    ) -> Result<(Image, Verdict)> {
        let settings = self.pull_settings();
        let hosts = RegistryHosts::new(settings.registry_config_dir.clone());
        let remote = Remote::new(&hosts, reference, creds, settings.progress_timeout)?;
        let mut pins = self.inner.pins.pin([]);
        let (manifest, manifest_digest, docs, top_digest, verdict) = async {
            let (top, top_digest) = remote.fetch_top_manifest().await?;
            // The signature policy decides before anything of the image is
            // stored or any other blob fetched.
            let verdict = match policy {
                Some(path) => {
                    crate::signature::check(path, &remote, reference, &top_digest).await?
                }
                None => Verdict::Unchecked,
            };
            let (manifest, manifest_digest, docs) = self
                .resolve_platform(&remote, top, top_digest.clone(), &mut pins)
                .await?;
            Ok::<_, Error>((manifest, manifest_digest, docs, top_digest, verdict))
        }
        .instrument(info_span!(target: TRACE_TARGET, "image.manifest"))
        .await?;
        let names = Names {
            tags: reference.repo_tag().into_iter().collect(),
            digests: vec![reference.repo_digest(&top_digest)],
        };
        let source = Source::Registry(&remote, progress);
        let image = self
            .install(source, &manifest, &manifest_digest, &docs, names, &mut pins)
            .await?;
        Ok((image, verdict))
    }

    /// Follows indexes down to the host platform's manifest, storing every
    /// document on the way. Returns the manifest, its digest and all
    /// document digests.
    async fn resolve_platform(
        &self,
        remote: &Remote,
        mut bytes: Vec<u8>,
        mut digest: Digest,
        pins: &mut PinSet,
    ) -> Result<(Manifest, Digest, Vec<Digest>)> {
        let host = manifest::host_platform();
        let mut docs = Vec::new();
        for _ in 0..=MAX_INDEX_DEPTH {
            pins.add([blob_key(&digest)]);
            self.inner.content.put_bytes(&bytes)?;
            docs.push(digest.clone());
            match manifest::parse_document(&bytes)? {
                Document::Manifest(m) => return Ok((m, digest, docs)),
                Document::Index(index) => {
                    let entry = manifest::select_manifest(&index, &host)?;
                    check_size(entry, MAX_MANIFEST_BYTES)?;
                    digest = entry.digest.clone();
                    bytes = remote.fetch_manifest(&digest).await?;
                }
            }
        }
        Err(Error::Unsupported(format!(
            "indexes nested deeper than {MAX_INDEX_DEPTH}"
        )))
    }

    /// Makes an image whole locally (config, every layer unpacked) and
    /// records it under `names`.
    async fn install(
        &self,
        source: Source<'_>,
        manifest: &Manifest,
        manifest_digest: &Digest,
        docs: &[Digest],
        names: Names,
        pins: &mut PinSet,
    ) -> Result<Image> {
        let config_desc = &manifest.config;
        pins.add([blob_key(&config_desc.digest)]);
        self.ensure_blob(source, config_desc)
            .instrument(info_span!(
                target: TRACE_TARGET,
                "image.config",
                digest = %config_desc.digest
            ))
            .await?;
        let config_bytes = self
            .inner
            .content
            .read(&config_desc.digest, MAX_CONFIG_BYTES)?;
        let config = manifest::parse_config(&config_bytes)?;
        if config.diff_ids.len() != manifest.layers.len() {
            return Err(Error::verification(
                config_desc.digest.to_string(),
                format!(
                    "config lists {} diff IDs for {} layers",
                    config.diff_ids.len(),
                    manifest.layers.len()
                ),
            ));
        }
        let chains = chain_ids(&config.diff_ids);
        pins.add(manifest.layers.iter().map(|l| blob_key(&l.digest)));
        pins.add(chains.iter().map(layer_key));
        self.ensure_layers(source, manifest, &config.diff_ids, &chains)
            .await?;

        // Saturating: descriptor sizes come from the registry.
        let doc_bytes = docs
            .iter()
            .filter_map(|d| self.inner.content.size(d))
            .fold(0u64, u64::saturating_add);
        let layer_bytes = manifest
            .layers
            .iter()
            .fold(0u64, |sum, l| sum.saturating_add(l.size));
        let mut blobs = docs.to_vec();
        blobs.push(config_desc.digest.clone());
        blobs.extend(manifest.layers.iter().map(|l| l.digest.clone()));
        let image = Image {
            id: config_desc.digest.to_string(),
            repo_tags: vec![],
            repo_digests: vec![],
            size: doc_bytes
                .saturating_add(config_desc.size)
                .saturating_add(layer_bytes),
            config: config.config,
            platform: config.platform,
            created: config.created,
            manifest_digest: manifest_digest.clone(),
            diff_ids: config.diff_ids,
            chain_ids: chains,
            blobs,
            pinned: false,
        };
        self.record(image, names).await
    }

    /// Makes sure a blob is in the content store, fetching it if a registry
    /// is at hand. A present blob whose size differs from the descriptor
    /// means the descriptor lies.
    async fn ensure_blob(&self, source: Source<'_>, desc: &Descriptor) -> Result<()> {
        let _lock = self.inner.blob_locks.lock(desc.digest.hex()).await;
        if let Some(size) = self.inner.content.size(&desc.digest) {
            return if size == desc.size {
                report_present(source, desc);
                Ok(())
            } else {
                Err(Error::verification(
                    desc.digest.to_string(),
                    format!(
                        "descriptor declares {} bytes, the blob has {size}",
                        desc.size
                    ),
                ))
            };
        }
        match source {
            Source::Registry(remote, progress) => {
                remote.fetch_blob(&self.inner.content, desc, progress).await
            }
            Source::Local => Err(Error::NotFound(format!("blob {}", desc.digest))),
        }
    }

    /// Fetches and unpacks all layers concurrently. The first failure
    /// cancels the others (downloads are dropped, unpacks stop at their next
    /// entry) and is returned once all have stopped, so a failed pull leaves
    /// no layer finishing behind it. Dropping this future cancels too.
    async fn ensure_layers(
        &self,
        source: Source<'_>,
        manifest: &Manifest,
        diff_ids: &[Digest],
        chains: &[Digest],
    ) -> Result<()> {
        let cancel = Cancel::new();
        let downloads = Semaphore::new(self.pull_settings().max_concurrent_downloads);
        let mut jobs = FuturesUnordered::new();
        for (index, ((layer, diff_id), chain)) in
            manifest.layers.iter().zip(diff_ids).zip(chains).enumerate()
        {
            let span = info_span!(
                target: TRACE_TARGET,
                "image.layer",
                index,
                digest = %layer.digest,
                size = layer.size,
                present = tracing::field::Empty,
            );
            jobs.push(
                self.ensure_layer(source, layer, diff_id, chain, &downloads, cancel.token())
                    .instrument(span),
            );
        }
        let mut first_error = None;
        while let Some(result) = jobs.next().await {
            if let Err(e) = result
                && first_error.is_none()
            {
                cancel.trigger();
                first_error = Some(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Makes sure a layer is unpacked: once per chain ID, however many
    /// images or pulls want it.
    async fn ensure_layer(
        &self,
        source: Source<'_>,
        desc: &Descriptor,
        diff_id: &Digest,
        chain: &Digest,
        downloads: &Semaphore,
        mut cancel: CancelToken,
    ) -> Result<()> {
        let _lock = self.inner.layer_locks.lock(chain.hex()).await;
        if let Some(size) = self.inner.content.size(&desc.digest)
            && size != desc.size
        {
            return Err(Error::verification(
                desc.digest.to_string(),
                format!(
                    "descriptor declares {} bytes, the blob has {size}",
                    desc.size
                ),
            ));
        }
        if self.inner.layers.has(chain) {
            tracing::Span::current().record("present", true);
            report_present(source, desc);
            return Ok(());
        }
        let fetch = async {
            let _permit = downloads
                .acquire()
                .await
                .map_err(|e| Error::Internal(e.to_string()))?;
            self.ensure_blob(source, desc)
                .instrument(info_span!(target: TRACE_TARGET, "layer.fetch"))
                .await
        };
        tokio::select! {
            fetched = fetch => fetched?,
            () = cancel.cancelled() => return Err(Error::Internal("cancelled".to_string())),
        }
        let blob = self.inner.content.open_blob(&desc.digest)?;
        let layers = self.inner.layers.clone();
        let (chain, diff_id, label) = (chain.clone(), diff_id.clone(), desc.digest.to_string());
        let privileged = self.inner.privileged;
        let flag = cancel.flag;
        let span = info_span!(target: TRACE_TARGET, "layer.unpack");
        tokio::task::spawn_blocking(move || {
            span.in_scope(|| layers.unpack(&chain, blob, &diff_id, &label, privileged, &flag))
        })
        .await
        .map_err(|e| Error::Internal(format!("unpack task: {e}")))?
    }

    /// Writes the image record, moving its names off other images.
    async fn record(&self, image: Image, names: Names) -> Result<Image> {
        let _index = self.inner.index_lock.lock().await;
        let images = self.inner.store.list::<Image>()?;
        let id = image.id.clone();
        let changes = index::add_image(&images, image, &names.tags, &names.digests);
        let stored = changes
            .put
            .iter()
            .find(|i| i.id == id)
            .cloned()
            .ok_or_else(|| Error::Internal("image record lost".to_string()))?;
        let deleted = !changes.delete.is_empty();
        self.apply(changes)?;
        if deleted {
            self.gc_locked().await?;
        }
        Ok(stored)
    }

    fn apply(&self, changes: Changes) -> Result<()> {
        self.inner.store.write(|tx| {
            for img in &changes.put {
                tx.put(img)?;
            }
            for id in &changes.delete {
                tx.delete::<Image>(id)?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Every image (ListImages).
    pub fn list(&self) -> Result<Vec<Image>> {
        Ok(self.inner.store.list::<Image>()?)
    }

    /// Looks an image up by ID, ID prefix, tag or digest reference
    /// (ImageStatus); `Ok(None)` when there is none.
    pub fn get(&self, query: &str) -> Result<Option<Image>> {
        let images = self.list()?;
        Ok(index::find(&images, query)?.map(|(i, _)| i.clone()))
    }

    /// RemoveImage: removes the image the query names (by ID, ID prefix,
    /// tag or digest reference) with all its tags and digests, as containerd
    /// does and as crictl and critest expect ("removing image by one tag
    /// should remove all tags"). Returns false when nothing matched (not an
    /// error: removal is idempotent). Layers a container leases stay until
    /// it is released.
    pub async fn remove(&self, query: &str) -> Result<bool> {
        let _index = self.inner.index_lock.lock().await;
        let images = self.list()?;
        let Some((image, _)) = index::find(&images, query)? else {
            return Ok(false);
        };
        let leases = Leases::load(&self.inner.store)?;
        if let Some((holder, _)) = leases
            .by_container
            .iter()
            .find(|(_, l)| l.volume && l.image_id == image.id)
        {
            return Err(Error::InUse(format!(
                "image {} is mounted as an image volume by {holder}",
                image.id
            )));
        }
        self.apply(Changes {
            put: vec![],
            delete: vec![image.id.clone()],
        })?;
        self.gc_locked().await?;
        Ok(true)
    }

    /// Removes every image no container uses and that is not pinned;
    /// returns the removed images.
    pub async fn prune(&self) -> Result<Vec<Image>> {
        let _index = self.inner.index_lock.lock().await;
        let leases = Leases::load(&self.inner.store)?;
        let used: HashSet<&str> = leases
            .by_container
            .values()
            .map(|l| l.image_id.as_str())
            .collect();
        let gone: Vec<Image> = self
            .list()?
            .into_iter()
            .filter(|i| !i.pinned && !used.contains(i.id.as_str()))
            .collect();
        self.apply(Changes {
            put: vec![],
            delete: gone.iter().map(|i| i.id.clone()).collect(),
        })?;
        self.gc_locked().await?;
        Ok(gone)
    }

    /// Pins or unpins an image (pinned images survive prune, and CRI
    /// reports them so kubelet's GC leaves them alone).
    pub async fn set_pinned(&self, query: &str, pinned: bool) -> Result<Image> {
        let _index = self.inner.index_lock.lock().await;
        let images = self.list()?;
        let (image, _) = index::find(&images, query)?
            .ok_or_else(|| Error::NotFound(format!("image {}", quote(query))))?;
        let mut image = image.clone();
        image.pinned = pinned;
        self.inner.store.put(&image)?;
        Ok(image)
    }

    /// The image's layer dirs, bottom layer first (overlayfs wants
    /// `lowerdir=` top first: reverse them).
    pub fn layer_dirs(&self, image: &Image) -> Vec<PathBuf> {
        image
            .chain_ids
            .iter()
            .map(|c| self.inner.layers.diff_path(c))
            .collect()
    }

    /// Records that `container_id` uses `image`'s layers, so they outlive
    /// the image's removal until [`Self::release`]; returns the layer dirs
    /// (bottom first). Leasing again replaces the container's lease.
    pub async fn lease(&self, container_id: &str, image: &str) -> Result<Vec<PathBuf>> {
        self.lease_as(container_id, image, false).await
    }

    /// As [`Self::lease`] for an image mounted as an image volume: the
    /// image itself, not only its layers, stays until the lease is
    /// released ([`Self::remove`] refuses it; prune keeps it). `holder` is
    /// the lease's key (one per container and volume).
    pub async fn lease_volume(&self, holder: &str, image: &str) -> Result<Vec<PathBuf>> {
        self.lease_as(holder, image, true).await
    }

    async fn lease_as(
        &self,
        container_id: &str,
        image: &str,
        volume: bool,
    ) -> Result<Vec<PathBuf>> {
        if container_id.is_empty() {
            return Err(Error::InvalidArgument("container ID is empty".to_string()));
        }
        let _index = self.inner.index_lock.lock().await;
        let images = self.list()?;
        let (image, _) = index::find(&images, image)?
            .ok_or_else(|| Error::NotFound(format!("image {}", quote(image))))?;
        if let Some(missing) = image.chain_ids.iter().find(|c| !self.inner.layers.has(c)) {
            return Err(Error::NotFound(format!(
                "layer {missing} of image {} (pull the image again)",
                image.id
            )));
        }
        self.inner.store.put(&LeaseRecord {
            container_id: container_id.to_string(),
            lease: Lease {
                image_id: image.id.clone(),
                chain_ids: image.chain_ids.clone(),
                volume,
            },
        })?;
        Ok(self.layer_dirs(image))
    }

    /// Drops a container's lease (idempotent) and frees layers nothing
    /// else uses.
    pub async fn release(&self, container_id: &str) -> Result<()> {
        self.release_with(&[container_id], |_| Ok(())).await
    }

    /// Drops the leases of `holders` and of every holder whose key starts
    /// with one of `prefixes`, and commits `also` (the caller's own
    /// changes, e.g. deleting the container's record) in the same
    /// transaction: one durable write instead of one per change. Then
    /// removes the layers only those leases held (nothing else can have
    /// lost its last reference: leases hold layers only, and the layers
    /// images hold stay).
    pub async fn release_with(
        &self,
        holders: &[&str],
        also: impl FnOnce(&mut crust_store::Txn) -> crust_store::Result<()>,
    ) -> Result<()> {
        self.release_prefixed_with(holders, &[], also).await
    }

    /// [`ImageService::release_with`], with the holders under `prefixes`
    /// found in the same transaction (a range read of the keys).
    pub async fn release_prefixed_with(
        &self,
        holders: &[&str],
        prefixes: &[&str],
        also: impl FnOnce(&mut crust_store::Txn) -> crust_store::Result<()>,
    ) -> Result<()> {
        let _index = self.inner.index_lock.lock().await;
        let released = self.inner.store.write(|tx| {
            let mut keys: Vec<String> = holders.iter().map(|h| h.to_string()).collect();
            for p in prefixes {
                keys.extend(tx.keys_with_prefix::<LeaseRecord>(p)?);
            }
            let mut released = Vec::new();
            for key in &keys {
                if let Some(r) = tx.get::<LeaseRecord>(key)? {
                    tx.delete::<LeaseRecord>(key)?;
                    released.push(r.lease);
                }
            }
            also(tx)?;
            Ok(released)
        })?;
        if released.is_empty() {
            return Ok(());
        }
        let images = self.list()?;
        let kept: HashSet<&Digest> = images.iter().flat_map(|i| &i.chain_ids).collect();
        if released
            .iter()
            .flat_map(|l| &l.chain_ids)
            .all(|c| kept.contains(c))
        {
            return Ok(());
        }
        self.gc_locked().await
    }

    /// Current leases by container ID, for the daemon's reconciliation.
    pub fn leases(&self) -> Result<Vec<(String, Lease)>> {
        Ok(Leases::load(&self.inner.store)?
            .by_container
            .into_iter()
            .collect())
    }

    /// The image's config blob as stored (for ImageStatus verbose info).
    pub fn config_json(&self, image: &Image) -> Result<Vec<u8>> {
        let digest = Digest::parse(&image.id)?;
        self.inner.content.read(&digest, MAX_CONFIG_BYTES)
    }

    /// Bytes and inodes the image store uses (ImageFsInfo).
    pub async fn fs_usage(&self) -> Result<FsUsage> {
        let dirs = [
            self.inner.content.blobs_dir().to_path_buf(),
            self.inner.content.ingest_dir().to_path_buf(),
            self.inner.layers.dir().to_path_buf(),
        ];
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
            usage(&refs)
        })
        .await
        .map_err(|e| Error::Internal(format!("usage task: {e}")))?
    }

    /// The dir holding content and layers (ImageFsInfo's mountpoint is the
    /// filesystem holding it).
    pub fn layers_dir(&self) -> &Path {
        self.inner.layers.dir()
    }

    /// Removes blobs and layers nothing references.
    pub async fn gc(&self) -> Result<()> {
        let _index = self.inner.index_lock.lock().await;
        self.gc_locked().await
    }

    async fn gc_locked(&self) -> Result<()> {
        self.collect_locked(false).await.map(drop)
    }

    /// What nothing references and no operation in flight pins now (what
    /// GC would remove), with the bytes each takes (`crust check`); with
    /// `remove`, removes it too, as GC does.
    pub async fn orphans(&self, remove: bool) -> Result<Vec<OrphanContent>> {
        let index = self.inner.index_lock.lock().await;
        if remove {
            return self.collect_locked(true).await;
        }
        let images = self.list()?;
        let leases = Leases::load(&self.inner.store)?;
        let (blobs, layers) = unreferenced(
            &images,
            leases.by_container.values(),
            self.inner.content.list()?,
            self.inner.layers.list()?,
        );
        let mut found = Vec::new();
        {
            let pins = self.inner.pins.guard();
            for d in blobs {
                if !pins.is_pinned(&blob_key(&d)) {
                    found.push((
                        ContentKind::Blob,
                        d.to_string(),
                        self.inner.content.path(&d),
                    ));
                }
            }
            for c in layers {
                if !pins.is_pinned(&layer_key(&c)) {
                    let path = self.inner.layers.dir().join(c.hex());
                    found.push((ContentKind::Layer, c.to_string(), path));
                }
            }
        }
        // Measured without the lock: walking big layers must not hold up
        // pulls and container creations. What went meanwhile is no orphan.
        drop(index);
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for (kind, name, path) in found {
                if std::fs::symlink_metadata(&path).is_ok() {
                    out.push(measured(kind, name, path)?);
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| Error::Internal(format!("measuring orphans: {e}")))?
    }

    /// Removes the blobs and layers nothing references and nothing pins;
    /// returns them, with their bytes if `measure`. The caller holds the
    /// index lock.
    async fn collect_locked(&self, measure: bool) -> Result<Vec<OrphanContent>> {
        let images = self.list()?;
        let leases = Leases::load(&self.inner.store)?;
        let mut out = Vec::new();
        let landed = self.inner.content.exclusive().await;
        let (blobs, _) = unreferenced(
            &images,
            leases.by_container.values(),
            self.inner.content.list()?,
            vec![],
        );
        for d in blobs {
            let pins = self.inner.pins.guard();
            if pins.is_pinned(&blob_key(&d)) {
                continue;
            }
            if measure {
                out.push(measured(
                    ContentKind::Blob,
                    d.to_string(),
                    self.inner.content.path(&d),
                )?);
            }
            self.inner.content.remove(&d)?;
        }
        drop(landed);
        let (_, layers) = unreferenced(
            &images,
            leases.by_container.values(),
            vec![],
            self.inner.layers.list()?,
        );
        let mut trash = Vec::new();
        for c in layers {
            let pins = self.inner.pins.guard();
            if !pins.is_pinned(&layer_key(&c))
                && let Some(t) = self.inner.layers.trash(&c)?
            {
                trash.push((c, t));
            }
        }
        if trash.is_empty() {
            return Ok(out);
        }
        tracing::debug!(layers = trash.len(), "removing unused layers");
        let dir = self.inner.layers.dir().to_path_buf();
        tokio::task::spawn_blocking(move || {
            for (chain, t) in trash {
                if measure {
                    let mut o = measured(ContentKind::Layer, chain.to_string(), t.clone())?;
                    o.path = dir.join(chain.hex());
                    out.push(o);
                }
                remove_dir(&t)?;
            }
            Ok(out)
        })
        .await
        .map_err(|e| Error::Internal(format!("gc task: {e}")))?
    }

    /// Installs an image whose documents and blobs are already in the
    /// content store (import), tagged `tags`. Imported images get no repo
    /// digests, as with containerd.
    pub(crate) async fn install_local(
        &self,
        top: &Digest,
        tags: Vec<String>,
        pins: &mut PinSet,
    ) -> Result<Image> {
        let mut digest = top.clone();
        let mut docs = Vec::new();
        let host = manifest::host_platform();
        for _ in 0..=MAX_INDEX_DEPTH {
            pins.add([blob_key(&digest)]);
            let bytes = self.inner.content.read(&digest, MAX_MANIFEST_BYTES)?;
            docs.push(digest.clone());
            match manifest::parse_document(&bytes)? {
                Document::Manifest(m) => {
                    let names = Names {
                        tags,
                        digests: vec![],
                    };
                    return self
                        .install(Source::Local, &m, &digest, &docs, names, pins)
                        .await;
                }
                Document::Index(index) => {
                    digest = manifest::select_manifest(&index, &host)?.digest.clone();
                }
            }
        }
        Err(Error::Unsupported(format!(
            "indexes nested deeper than {MAX_INDEX_DEPTH}"
        )))
    }

    pub(crate) fn content(&self) -> &ContentStore {
        &self.inner.content
    }

    pub(crate) fn pins(&self) -> &Arc<Pins> {
        &self.inner.pins
    }
}

/// Cancels the layer jobs of one install: triggered by the first failure,
/// or by drop when the caller goes away.
struct Cancel {
    flag: Arc<AtomicBool>,
    tx: watch::Sender<bool>,
}

struct CancelToken {
    flag: Arc<AtomicBool>,
    rx: watch::Receiver<bool>,
}

impl Cancel {
    fn new() -> Self {
        Cancel {
            flag: Arc::new(AtomicBool::new(false)),
            tx: watch::Sender::new(false),
        }
    }

    fn token(&self) -> CancelToken {
        CancelToken {
            flag: self.flag.clone(),
            rx: self.tx.subscribe(),
        }
    }

    fn trigger(&self) {
        self.flag.store(true, Ordering::Relaxed);
        self.tx.send_replace(true);
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        self.trigger();
    }
}

impl CancelToken {
    async fn cancelled(&mut self) {
        // Err = the Cancel is gone, which cancels too.
        let _ = self.rx.wait_for(|c| *c).await;
    }
}

/// Tells a progress watcher that a blob is already here (complete at once),
/// so it can show every layer of the image, shared ones included.
fn report_present(source: Source<'_>, desc: &Descriptor) {
    if let Source::Registry(_, Some(report)) = source {
        report(crate::registry::Progress {
            digest: desc.digest.clone(),
            done: desc.size,
            total: desc.size,
            present: true,
        });
    }
}

fn check_size(desc: &Descriptor, max: u64) -> Result<()> {
    if desc.size > max {
        return Err(Error::verification(
            desc.digest.to_string(),
            format!("{} bytes is over the {max} byte limit", desc.size),
        ));
    }
    Ok(())
}

/// Same reference, same credentials and same signature policy = the same
/// pull.
fn flight_key(reference: &Reference, creds: &Credentials, policy: Option<&Path>) -> String {
    let mut h = Sha256::new();
    for part in [
        &creds.username,
        &creds.password,
        &creds.auth,
        &creds.server_address,
        &creds.identity_token,
        &creds.registry_token,
    ] {
        h.update(part.len().to_le_bytes());
        h.update(part.as_bytes());
    }
    let policy = policy.map(|p| p.as_os_str().as_encoded_bytes());
    h.update([u8::from(policy.is_some())]);
    h.update(policy.unwrap_or_default());
    format!("{reference} {}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon spawns these from tonic handlers: they must be Send.
    #[allow(dead_code)]
    fn public_futures_are_send(svc: &ImageService, creds: &Credentials) {
        fn send<T: Send>(_: T) {}
        send(svc.pull("x", creds));
        send(svc.pull_with_progress("x", creds, None));
        send(svc.pull_checked("x", creds, None, Some("ns")));
        send(svc.remove("x"));
        send(svc.prune());
        send(svc.set_pinned("x", true));
        send(svc.lease("c", "x"));
        send(svc.release("c"));
        send(svc.fs_usage());
        send(svc.gc());
        send(svc.orphans(true));
        send(svc.import(Path::new("x")));
    }

    #[test]
    fn flight_keys_differ_by_credentials() {
        let r = Reference::parse("busybox").unwrap();
        let anon = Credentials::default();
        let alice = Credentials {
            username: "alice".into(),
            ..Credentials::default()
        };
        assert_eq!(flight_key(&r, &anon, None), flight_key(&r, &anon, None));
        assert_ne!(flight_key(&r, &anon, None), flight_key(&r, &alice, None));
        let p = Path::new("/p.json");
        assert_ne!(flight_key(&r, &anon, None), flight_key(&r, &anon, Some(p)));
    }
}
