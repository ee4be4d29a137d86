//! Pulls an image into the store: manifest, config and every layer blob
//! verified against its digest, layers streamed through decompression into
//! the hardened unpacker without touching disk in between.

use std::io::Read;
use std::sync::Arc;

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::Reference;
use tracing::info;

use warren_confined::Dir;
use crate::config::{ImageConfig, MAX_CONFIG_BYTES};
use crate::digest::{is_sha256, Metered};
use crate::layer::{self, Budget, LayerError};
use crate::registry::Registry;
use crate::store::{Image, ImageRecord, LayerRecord, Store};

/// Registry credentials for one pull (from a dockerconfigjson Secret).
#[derive(Clone, Default)]
pub enum PullAuth {
    /// No credentials.
    #[default]
    Anonymous,
    /// User name and password (or token).
    Basic {
        /// User name.
        username: String,
        /// Password or token.
        password: String,
    },
}

impl PullAuth {
    /// Names the credentials without holding them: anonymous, or a digest
    /// of the username and password.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        match self {
            PullAuth::Anonymous => h.update(b"anonymous"),
            PullAuth::Basic { username, password } => {
                h.update(b"basic\0");
                h.update(username.as_bytes());
                h.update([0]);
                h.update(password.as_bytes());
            }
        }
        h.finalize().into()
    }
}

/// What a layer that would pass the node's image disk is refused for.
const DISK: &str = "the node's image disk (--image-disk), counting the layers being pulled now";

/// A layer's uncompressed stream, charged to the store's disk budget as it
/// is read: concurrent pulls share one budget, so two decompression bombs
/// cannot each fill it.
struct Charged<'a, R> {
    inner: R,
    used: &'a std::sync::atomic::AtomicU64,
    budget: u64,
    charged: &'a std::sync::atomic::AtomicU64,
}

impl<R: Read> Read for Charged<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::sync::atomic::Ordering;
        let n = self.inner.read(buf)?;
        let now = self.used.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        self.charged.fetch_add(n as u64, Ordering::Relaxed);
        if now > self.budget {
            return Err(std::io::Error::other(layer::OverBudget(DISK.into())));
        }
        Ok(n)
    }
}

/// Layer possession proofs kept; past it all are forgotten (and proven again).
const MAX_PROOFS: usize = 16_384;

impl std::fmt::Debug for PullAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PullAuth::Anonymous => f.write_str("Anonymous"),
            PullAuth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
        }
    }
}

/// What a pull hands back.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The warm image.
    pub image: Arc<Image>,
    /// Whether this pull fetched the manifest from the caller's registry
    /// with the caller's credentials and fetched or proved every layer: only
    /// then has the caller shown that it may use the image. A warm digest
    /// taken without the network is `false`.
    pub proven: bool,
}

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The reference does not parse.
    #[error("invalid image reference {0:?}: {1}")]
    Reference(String, String),
    /// The registry refused or failed (not found, unauthorized, unreachable).
    #[error("registry: {0}")]
    Registry(String),
    /// The registry, its token realm or a redirect is an endpoint the
    /// agent's policy refuses (the node itself); nothing was sent to it.
    #[error("registry endpoint refused: {0}")]
    Endpoint(String),
    /// The image is malformed, hostile, too large, or uses what Warren does not unpack.
    #[error("image {reference}: {source}")]
    Image {
        /// The reference pulled.
        reference: String,
        /// Cause.
        #[source]
        source: LayerError,
    },
}

fn bad(reference: &Reference, source: LayerError) -> PullError {
    PullError::Image { reference: reference.whole(), source }
}

fn refused(reference: &Reference, why: impl Into<String>) -> PullError {
    bad(reference, LayerError::Refused(why.into()))
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

fn compression(media_type: &str) -> Option<Compression> {
    let media = media_type.replace(".nondistributable", "");
    match media.as_str() {
        "application/vnd.oci.image.layer.v1.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip" | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Some(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

/// Whether `registry` (`host[:port]`) is on loopback.
fn is_loopback(registry: &str) -> bool {
    let host = registry.rsplit_once(':').map_or(registry, |(h, p)| if p.bytes().all(|b| b.is_ascii_digit()) { h } else { registry });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The repository `reference` names, as `auth` reaches it (plain HTTP on
/// loopback and for the admin's insecure registries only).
fn registry_for(store: &Store, reference: &Reference, auth: &PullAuth) -> Result<Registry, PullError> {
    let registry = reference.resolve_registry().to_string();
    let plain = is_loopback(&registry) || store.insecure.iter().any(|r| *r == registry);
    Registry::new(reference, plain, auth, &store.endpoints)
}

/// The registry and repository `reference` names (`docker.io` and
/// `library/` filled in as a pull would).
pub fn repository(reference: &str) -> Result<(String, String), PullError> {
    let parsed = Reference::try_from(reference).map_err(|e| PullError::Reference(reference.to_string(), e.to_string()))?;
    Ok((parsed.resolve_registry().to_string(), parsed.repository().to_string()))
}

impl Store {
    /// Whether `registry` serves the manifest `repository@digest` to `auth`:
    /// fetched with those credentials and hashed (a registry that only
    /// claims the digest proves nothing). A warm image is served to a new
    /// caller only after this.
    pub async fn verify(&self, registry: &str, repository: &str, digest: &str, auth: &PullAuth) -> Result<(), PullError> {
        let reference = Reference::with_digest(registry.to_string(), repository.to_string(), digest.to_string());
        // Fetched by digest: the body must hash to it, and is read bounded.
        let client = registry_for(self, &reference, auth)?;
        let served = client.image_manifest(digest).await?;
        self.prove_layers(&client, &reference, &served.body, auth).await
    }

    /// Manifest bytes are easy to copy; layers must be had. Every layer of
    /// the manifest `body` must be streamed to these credentials by their
    /// registry (each proven once, see [`Store::prove_possession`]).
    async fn prove_layers(&self, client: &Registry, reference: &Reference, body: &[u8], auth: &PullAuth) -> Result<(), PullError> {
        let manifest: OciImageManifest = serde_json::from_slice(body).map_err(|e| refused(reference, format!("malformed image manifest: {e}")))?;
        self.check_manifest(reference, &manifest)?;
        for blob in &manifest.layers {
            self.prove_possession(client, reference, blob, auth).await?;
        }
        Ok(())
    }

    /// The image `reference` names, pulled and mounted unless already warm.
    /// A reference with a digest that is warm needs no network at all, and
    /// so proves nothing about the caller (see [`Pulled::proven`]).
    pub async fn pull(self: &Arc<Self>, reference: &str, auth: &PullAuth) -> Result<Pulled, PullError> {
        let parsed = Reference::try_from(reference).map_err(|e| PullError::Reference(reference.to_string(), e.to_string()))?;
        if let Some(image) = parsed.digest().and_then(|d| self.get(d)) {
            image.touch();
            return Ok(Pulled { image, proven: false });
        }
        let gate = {
            let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
            pulls.entry(parsed.whole()).or_default().clone()
        };
        let result = {
            let _one_at_a_time = gate.lock().await;
            self.pull_locked(&parsed, auth).await
        };
        {
            let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
            if Arc::strong_count(&gate) == 2 {
                pulls.remove(&parsed.whole());
            }
        }
        let image = result?;
        image.touch();
        Ok(Pulled { image, proven: true })
    }

    /// Pulls through the registry: its manifest for `reference` fetched with
    /// these credentials, and every layer fetched or (already on the node)
    /// proven served to them. A tag or digest that resolves to a warm image
    /// is no shortcut: its layers are proven like any shared layer.
    async fn pull_locked(self: &Arc<Self>, reference: &Reference, auth: &PullAuth) -> Result<Arc<Image>, PullError> {
        let client = registry_for(self, reference, auth)?;
        let wanted = reference.digest().or(reference.tag()).unwrap_or("latest");
        let served = client.image_manifest(wanted).await?;
        let digest = served.digest;
        if let Some(image) = self.get(&digest) {
            self.prove_layers(&client, reference, &served.body, auth).await?;
            return Ok(image);
        }
        let manifest: OciImageManifest = serde_json::from_slice(&served.body).map_err(|e| refused(reference, format!("malformed image manifest: {e}")))?;
        self.check_manifest(reference, &manifest)?;
        let config = self.fetch_config(&client, reference, &manifest.config).await?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(refused(reference, "config and manifest disagree on the number of layers"));
        }
        if !config.os.is_empty() && config.os != "linux" {
            return Err(bad(reference, LayerError::Unsupported(format!("image for {}", config.os))));
        }
        let started = std::time::Instant::now();
        let mut budget = Budget { bytes: self.limits.max_image_bytes, entries: self.limits.max_entries };
        let mut layers = Vec::new();
        for (blob, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
            let hex = blob.digest.trim_start_matches("sha256:").to_string();
            let record = match self.layer_record(&hex) {
                Some(record) => {
                    self.prove_possession(&client, reference, blob, auth).await?;
                    record
                }
                None => {
                    self.make_room(reference, blob.size as u64)?;
                    let record = self.fetch_layer(&client, reference, blob, diff_id, budget.clone()).await?;
                    self.proven(reference, &blob.digest, auth, true);
                    record
                }
            };
            budget.bytes = budget.bytes.checked_sub(record.bytes).ok_or_else(|| bad(reference, LayerError::TooLarge("uncompressed bytes per image".into())))?;
            budget.entries = budget.entries.checked_sub(record.entries).ok_or_else(|| bad(reference, LayerError::TooLarge("entries per image".into())))?;
            layers.push(hex);
        }
        let bytes = self.limits.max_image_bytes - budget.bytes;
        let record = ImageRecord { reference: reference.whole(), digest: digest.clone(), layers, env: config.env(), bytes, interpreters: None };
        let store = self.clone();
        let image = tokio::task::spawn_blocking(move || store.commit_image(record))
            .await
            .map_err(|e| bad(reference, LayerError::Unsupported(e.to_string())))?
            .map_err(|e| bad(reference, LayerError::io("mount the image")(e)))?;
        info!(reference = %reference.whole(), %digest, bytes, elapsed_ms = started.elapsed().as_millis() as u64, "image pulled");
        Ok(image)
    }

    /// Whether these credentials were shown layer `digest` through the
    /// repository `reference` names (`record`: now they have been).
    fn proven(&self, reference: &Reference, digest: &str, auth: &PullAuth, record: bool) -> bool {
        let key = (format!("{}/{}", reference.resolve_registry(), reference.repository()), digest.to_string(), auth.fingerprint());
        let mut proofs = self.proofs.lock().unwrap_or_else(|p| p.into_inner());
        if !record {
            return proofs.contains(&key);
        }
        if proofs.len() >= MAX_PROOFS {
            proofs.clear();
        }
        proofs.insert(key)
    }

    /// A warm layer serves a new repository and credentials only once the
    /// registry has streamed its bytes to them and they hash to its digest:
    /// a manifest naming another tenant's private layer proves nothing. The
    /// bytes are hashed and dropped (nothing is unpacked or stored again).
    async fn prove_possession(&self, client: &Registry, reference: &Reference, blob: &OciDescriptor, auth: &PullAuth) -> Result<(), PullError> {
        use futures_util::StreamExt;
        use sha2::Digest;
        if self.proven(reference, &blob.digest, auth, false) {
            return Ok(());
        }
        let not_held = || refused(reference, format!("the registry does not serve layer {} to these credentials", blob.digest));
        let mut stream = std::pin::pin!(client.blob(&blob.digest).await.map_err(|_| not_held())?);
        let (mut hasher, mut len) = (sha2::Sha256::new(), 0u64);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| PullError::Registry(e.to_string()))?;
            len += chunk.len() as u64;
            if len > blob.size as u64 {
                return Err(not_held());
            }
            hasher.update(&chunk);
        }
        if format!("sha256:{:x}", hasher.finalize()) != blob.digest || len != blob.size as u64 {
            return Err(not_held());
        }
        self.proven(reference, &blob.digest, auth, true);
        Ok(())
    }

    /// Before a layer is fetched: room for at least its compressed size on
    /// the node's image disk, counting what every pull is unpacking now,
    /// after collecting unused images if needed.
    fn make_room(&self, reference: &Reference, compressed: u64) -> Result<(), PullError> {
        use std::sync::atomic::Ordering;
        let fits = || self.used.load(Ordering::Relaxed).saturating_add(compressed) <= self.budget();
        if !fits() {
            let in_flight = self.used.load(Ordering::Relaxed).saturating_sub(self.bytes());
            self.collect(in_flight.saturating_add(compressed));
        }
        match fits() {
            true => Ok(()),
            false => Err(bad(reference, LayerError::TooLarge(DISK.into()))),
        }
    }

    fn check_manifest(&self, reference: &Reference, manifest: &OciImageManifest) -> Result<(), PullError> {
        if manifest.layers.is_empty() {
            return Err(refused(reference, "image has no layers"));
        }
        if manifest.layers.len() > self.limits.max_layers {
            return Err(bad(reference, LayerError::TooLarge(format!("{} layers", self.limits.max_layers))));
        }
        for blob in manifest.layers.iter().chain([&manifest.config]) {
            if !is_sha256(&blob.digest) {
                return Err(refused(reference, format!("blob digest {:?} is not sha256", blob.digest)));
            }
            if blob.size < 0 {
                return Err(refused(reference, "negative blob size"));
            }
        }
        for blob in &manifest.layers {
            if compression(&blob.media_type).is_none() {
                return Err(bad(reference, LayerError::Unsupported(format!("layer media type {}", blob.media_type))));
            }
            if blob.size as u64 > self.limits.max_layer_bytes {
                return Err(bad(reference, LayerError::TooLarge(format!("{} compressed bytes per layer", self.limits.max_layer_bytes))));
            }
        }
        Ok(())
    }

    async fn fetch_config(&self, client: &Registry, reference: &Reference, blob: &OciDescriptor) -> Result<ImageConfig, PullError> {
        if blob.size > MAX_CONFIG_BYTES {
            return Err(bad(reference, LayerError::TooLarge("1 MiB of image config".into())));
        }
        // Read no further than the declared size (+1, to see it was passed).
        let body = client.small_blob(&blob.digest, blob.size as usize + 1).await?;
        let (digest, len) = Metered::new(&body[..], blob.size as u64, "declared config size").finish().map_err(|e| bad(reference, LayerError::io("config")(e)))?;
        if digest != blob.digest || len != blob.size as u64 {
            return Err(refused(reference, "config does not match its digest"));
        }
        serde_json::from_slice(&body).map_err(|e| refused(reference, format!("malformed image config: {e}")))
    }

    async fn fetch_layer(self: &Arc<Self>, client: &Registry, reference: &Reference, blob: &OciDescriptor, diff_id: &str, budget: Budget) -> Result<LayerRecord, PullError> {
        let stream = client.blob(&blob.digest).await?;
        let reader = tokio_util::io::StreamReader::new(stream);
        let reader = tokio_util::io::SyncIoBridge::new(reader);
        let store = self.clone();
        let (blob, diff_id) = (blob.clone(), diff_id.to_string());
        let whole = reference.whole();
        tokio::task::spawn_blocking(move || store.unpack_layer(reader, &blob, &diff_id, budget))
            .await
            .map_err(|e| PullError::Image { reference: whole.clone(), source: LayerError::Unsupported(e.to_string()) })?
            .map_err(|source| PullError::Image { reference: whole, source })
    }

    /// Unpacks one layer into a temporary dir, verifies both digests, then commits it.
    fn unpack_layer(&self, blob_stream: impl Read, blob: &OciDescriptor, diff_id: &str, mut budget: Budget) -> Result<LayerRecord, LayerError> {
        let hex = blob.digest.trim_start_matches("sha256:");
        let tmp = self.tmp_dir(hex);
        std::fs::create_dir(&tmp).map_err(LayerError::io("create layer dir"))?;
        let charged = std::sync::atomic::AtomicU64::new(0);
        let result = (|| {
            let root = Dir::open(&tmp).map_err(LayerError::io("open layer dir"))?;
            let mut compressed = Metered::new(blob_stream, blob.size as u64, "the layer's declared size");
            let entries_before = budget.entries;
            let (diff, bytes) = {
                let decoded: Box<dyn Read + '_> = match compression(&blob.media_type) {
                    Some(Compression::Gzip) => Box::new(flate2::read::MultiGzDecoder::new(&mut compressed)),
                    Some(Compression::Zstd) => Box::new(ruzstd::decoding::StreamingDecoder::new(&mut compressed).map_err(|e| LayerError::Refused(format!("zstd: {e}")))?),
                    _ => Box::new(&mut compressed),
                };
                let decoded = Charged { inner: decoded, used: &self.used, budget: self.budget(), charged: &charged };
                let mut tar = Metered::new(decoded, budget.bytes, "uncompressed bytes per image");
                layer::apply(&mut tar, &root, &mut budget)?;
                tar.finish().map_err(LayerError::io("read layer"))?
            };
            let (blob_digest, blob_len) = compressed.finish().map_err(LayerError::io("read layer blob"))?;
            if blob_digest != blob.digest || blob_len != blob.size as u64 {
                return Err(LayerError::Refused(format!("layer blob does not match its digest {}", blob.digest)));
            }
            if diff != diff_id {
                return Err(LayerError::Refused(format!("layer content does not match its diff id {diff_id}")));
            }
            let record = LayerRecord { bytes, entries: entries_before - budget.entries };
            if !self.commit_layer(&tmp, hex, record).map_err(LayerError::io("commit layer"))? {
                // Another pull's copy is kept: this one's bytes are not on disk.
                self.release(charged.swap(0, std::sync::atomic::Ordering::Relaxed));
            }
            Ok(record)
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
            self.release(charged.load(std::sync::atomic::Ordering::Relaxed));
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registries_and_media_types() {
        assert!(is_loopback("127.0.0.1:5000") && is_loopback("localhost:1") && is_loopback("[::1]:5000") && is_loopback("localhost"));
        assert!(!is_loopback("registry.example.com:5000") && !is_loopback("10.0.0.1:5000") && !is_loopback("docker.io"));
        assert_eq!(compression("application/vnd.docker.image.rootfs.diff.tar.gzip"), Some(Compression::Gzip));
        assert_eq!(compression("application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"), Some(Compression::Zstd));
        assert_eq!(compression("application/vnd.oci.image.layer.v1.tar"), Some(Compression::None));
        assert_eq!(compression("application/vnd.cncf.helm.chart.content.v1.tar+gzip"), None);
    }
}
