//! OCI images on this node: the store, pulls a call waits for only so long,
//! tag → digest resolution kept off the hot path, and the collector.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{info, warn};
use warren_image::{Image, PullAuth, PullError, Store};


/// Why an image cannot serve a call (the executor maps it to its own
/// refusals).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The reference (or digest) is malformed.
    #[error("image: {0}")]
    Reference(String),
    /// Still being pulled to this node.
    #[error("image {0} is being pulled to this node; retry shortly")]
    Pulling(String),
    /// Could not be pulled, or is not served to the caller's credentials.
    #[error("image: {0}")]
    Unavailable(String),
    /// Its registry is an endpoint this node refuses.
    #[error("image: {0}")]
    Refused(String),
}

/// A tag resolved this long ago is re-resolved in the background (calls
/// keep using the known digest meanwhile).
const TAG_REFRESH: Duration = Duration::from_secs(300);
/// How long a registry's word that some credentials may pull an image
/// stands (revoked access ends within this).
const VERIFIED_FOR: Duration = Duration::from_secs(600);
/// Verdicts kept; past it the oldest half is forgotten.
const MAX_VERDICTS: usize = 4096;

fn fingerprint(auth: &PullAuth) -> [u8; 32] {
    auth.fingerprint()
}

/// (registry/repository, manifest digest, credentials).
type Verdict = (String, String, [u8; 32]);

/// The node's images.
pub struct Images {
    store: Arc<Store>,
    pull_wait: Duration,
    /// (Tag reference, credentials) → (manifest digest, when resolved):
    /// what a tag names under one tenant's credentials never answers
    /// another's.
    tags: Mutex<HashMap<(String, [u8; 32]), (String, Instant)>>,
    /// Who was shown to be able to pull what, and when.
    verified: Mutex<HashMap<Verdict, Instant>>,
    /// Checks under way: they go on when a call stops waiting (proving a
    /// large image's layers may take longer than one call waits), and a
    /// second call for the same verdict waits for the same check.
    checking: Mutex<HashMap<Verdict, Check>>,
}

/// A check's shared outcome.
type Check = futures_util::future::Shared<futures_util::future::BoxFuture<'static, Result<(), String>>>;

impl Images {
    /// Images from `store`; a call waits at most `pull_wait` for a pull.
    pub fn new(store: Arc<Store>, pull_wait: Duration) -> Images {
        Images { store, pull_wait, tags: Mutex::default(), verified: Mutex::default(), checking: Mutex::default() }
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn tags(&self) -> std::sync::MutexGuard<'_, HashMap<(String, [u8; 32]), (String, Instant)>> {
        self.tags.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashMap<Verdict, Instant>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, verdict: Verdict) {
        let mut v = self.verified();
        if v.len() >= MAX_VERDICTS {
            let mut ages: Vec<Instant> = v.values().copied().collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            v.retain(|_, at| *at > cut);
        }
        v.insert(verdict, Instant::now());
    }

    /// A warm image serves a caller only once the registry has served its
    /// manifest and every layer to the caller's credentials (kubelet's
    /// "ensure secret pulled images", with layers, since manifest bytes are
    /// easy to copy): naming a digest another tenant pulled — through a
    /// registry that does not exist, a repository that does not hold it, a
    /// registry serving only the manifest, or without the credentials —
    /// runs nothing. A call waits at most the pull wait (`wait`: `None`
    /// waits as long as the check takes, as warming does).
    async fn ensure_may_pull(&self, pinned: &str, digest: &str, auth: &PullAuth, wait: Option<Duration>) -> Result<(), ImageError> {
        let (registry, repository) = warren_image::repository(pinned).map_err(pull_error)?;
        let verdict = (format!("{registry}/{repository}"), digest.to_string(), fingerprint(auth));
        if self.verified().get(&verdict).is_some_and(|at| at.elapsed() < VERIFIED_FOR) {
            return Ok(());
        }
        let check = self.check(&verdict, registry, repository, auth);
        let outcome = match wait {
            Some(wait) => tokio::time::timeout(wait.max(Duration::from_secs(1)), check).await,
            None => Ok(check.await),
        };
        if outcome.is_ok() {
            self.checking.lock().unwrap_or_else(|p| p.into_inner()).remove(&verdict);
        }
        match outcome {
            Ok(Ok(())) => {
                self.record(verdict);
                Ok(())
            }
            Ok(Err(e)) => Err(ImageError::Unavailable(format!("{}@{digest} is not served to this Sandbox's pull credentials: {e}", verdict.0))),
            Err(_) => Err(ImageError::Pulling(pinned.to_string())),
        }
    }

    /// The check of `verdict` under way, or a new one, running on its own.
    fn check(&self, verdict: &Verdict, registry: String, repository: String, auth: &PullAuth) -> Check {
        use futures_util::FutureExt;
        let mut checking = self.checking.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = checking.get(verdict) {
            return c.clone();
        }
        if checking.len() >= MAX_VERDICTS {
            checking.clear();
        }
        let (store, digest, auth) = (self.store.clone(), verdict.1.clone(), auth.clone());
        let task = tokio::spawn(async move { store.verify(&registry, &repository, &digest, &auth).await.map_err(|e| e.to_string()) });
        let check = async move { task.await.unwrap_or_else(|e| Err(e.to_string())) }.boxed().shared();
        checking.insert(verdict.clone(), check.clone());
        check
    }

    /// The warm image for a call: `reference` pinned to `digest` when the
    /// control plane resolved one. A warm image costs a map lookup; a cold
    /// one is pulled, and a pull longer than the pull wait refuses the call
    /// with [`ImageError::Pulling`] while it goes on.
    pub async fn for_call(&self, reference: &str, digest: &str, auth: &PullAuth) -> Result<Arc<Image>, ImageError> {
        let pinned = pin(reference, digest)?;
        let fp = fingerprint(auth);
        let known = match pinned.rsplit_once('@') {
            Some((_, d)) => Some(d.to_string()),
            None => self.tags().get(&(pinned.clone(), fp)).map(|(d, at)| (d.clone(), at.elapsed() > TAG_REFRESH)).and_then(|(d, stale)| {
                if stale {
                    self.refresh_tag(&pinned, auth);
                }
                Some(d)
            }),
        };
        if let Some((d, image)) = known.and_then(|d| self.store.get(&d).map(|i| (d, i))) {
            self.ensure_may_pull(&pinned, &d, auth, Some(self.pull_wait)).await?;
            image.touch();
            return Ok(image);
        }
        self.pull(&pinned, auth, Some(self.pull_wait)).await
    }

    /// Pulls (unless warm) and waits for it, at most `wait` when given; the
    /// pull goes on in the background past the wait. The image is handed
    /// out only to credentials its registry proved it serves: by this pull
    /// (a verdict is recorded only then), or by a check of the warm copy.
    pub async fn pull(&self, reference: &str, auth: &PullAuth, wait: Option<Duration>) -> Result<Arc<Image>, ImageError> {
        let store = self.store.clone();
        let (r, a) = (reference.to_string(), auth.clone());
        let task = tokio::spawn(async move { store.pull(&r, &a).await });
        let joined = match wait {
            None => task.await,
            Some(wait) => tokio::time::timeout(wait, task).await.map_err(|_| ImageError::Pulling(reference.to_string()))?,
        };
        let pulled = joined.map_err(|e| ImageError::Unavailable(format!("pull task failed: {e}")))?.map_err(pull_error)?;
        let image = pulled.image;
        match pulled.proven {
            true => {
                if let Ok((registry, repository)) = warren_image::repository(reference) {
                    self.record((format!("{registry}/{repository}"), image.digest(), fingerprint(auth)));
                }
                if !reference.contains('@') {
                    self.tags().insert((reference.to_string(), fingerprint(auth)), (image.digest(), Instant::now()));
                }
            }
            // A warm digest taken without the network: the caller proves
            // access like any other.
            false => self.ensure_may_pull(reference, &image.digest(), auth, wait).await?,
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.collect(0));
        Ok(image)
    }

    fn refresh_tag(&self, reference: &str, auth: &PullAuth) {
        // Marked fresh now, so one call (not every call) starts the refresh.
        if let Some(entry) = self.tags().get_mut(&(reference.to_string(), fingerprint(auth))) {
            entry.1 = Instant::now();
        }
        let (store, r, a) = (self.store.clone(), reference.to_string(), auth.clone());
        tokio::spawn(async move {
            if let Err(e) = store.pull(&r, &a).await {
                warn!(reference = %r, error = %e, "re-resolving an image tag failed; calls keep the known digest");
            }
        });
    }
}

/// `reference` pinned to `digest` (`repo:tag@sha256:…`); a reference that
/// carries another digest is refused.
fn pin(reference: &str, digest: &str) -> Result<String, ImageError> {
    if reference.is_empty() || reference.len() > 512 || reference.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ImageError::Reference(format!("{reference:?} is not an image reference")));
    }
    if digest.is_empty() {
        return Ok(reference.to_string());
    }
    if !warren_image::digest::is_sha256(digest) {
        return Err(ImageError::Reference(format!("image_digest {digest:?} is not sha256:<64 hex>")));
    }
    match reference.rsplit_once('@') {
        Some((_, d)) if d == digest => Ok(reference.to_string()),
        Some(_) => Err(ImageError::Reference("image and image_digest name different digests".into())),
        None => Ok(format!("{reference}@{digest}")),
    }
}

fn pull_error(e: PullError) -> ImageError {
    match e {
        PullError::Reference(..) => ImageError::Reference(e.to_string()),
        PullError::Endpoint(_) => ImageError::Refused(e.to_string()),
        other => ImageError::Unavailable(other.to_string()),
    }
}

/// Keeps the store within its budget: images idle past `idle` lose their
/// pooled sandboxes (which hold them in use), then the collector runs.
pub async fn collect(images: &Images, pool: &crate::pool::Pool, idle: Duration) {
    for image in images.store.images() {
        if image.idle_for() > idle {
            pool.forget(&image.digest()).await;
        }
    }
    let store = images.store.clone();
    match tokio::task::spawn_blocking(move || store.collect(0)).await {
        Ok(r) if r.images > 0 => info!(images = r.images, layers = r.layers, bytes = r.bytes, "image collector pass"),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "image collector pass failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_pinned_to_the_control_planes_digest() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(pin("reg:5000/py:3.12", "").unwrap(), "reg:5000/py:3.12");
        assert_eq!(pin("reg:5000/py:3.12", &d).unwrap(), format!("reg:5000/py:3.12@{d}"));
        assert_eq!(pin(&format!("py@{d}"), &d).unwrap(), format!("py@{d}"));
        assert!(pin(&format!("py@sha256:{}", "b".repeat(64)), &d).is_err(), "two different digests");
        assert!(pin("py", "md5:00").is_err());
        assert!(pin("", "").is_err() && pin("a b", "").is_err() && pin(&"a".repeat(513), "").is_err());
    }
}
