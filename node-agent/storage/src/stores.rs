//! Store clients, kept across calls. Building one (an HTTP client with its
//! TLS roots) costs milliseconds; a call whose mounts it never touches must
//! not pay that. Clients are keyed by everything that configures them —
//! credentials by digest, never by value — and the oldest is dropped past
//! [`MAX_CLIENTS`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use object_store::list::PaginatedListStore;
use object_store::ObjectStore;
use sha2::Digest;

use crate::cache::BodyCache;
use crate::local::LocalRoots;
use warren_core::reach::EndpointPolicy;
use crate::pool::FusePool;
use crate::spec::{MountSpec, Provider};

/// Clients kept.
pub const MAX_CLIENTS: usize = 64;

/// A store client and, where the store has one, its paginated listing.
#[derive(Clone)]
pub struct Backend {
    /// Objects.
    pub store: Arc<dyn ObjectStore>,
    /// `max-keys` listings (S3).
    pub pager: Option<Arc<dyn PaginatedListStore>>,
    /// Names this client (its configuration and credentials) in the body
    /// cache.
    pub id: [u8; 32],
    /// Its bodies are worth keeping on this node (not a local directory).
    pub cacheable: bool,
}

/// The clients of this agent.
#[derive(Default)]
pub struct Stores {
    /// Idle connections kept per host (`None`: the HTTP client's default;
    /// 0 opens one per request, for servers without TCP_NODELAY).
    pool_max_idle: Option<usize>,
    kept: Mutex<VecDeque<([u8; 32], Backend)>>,
    /// The node's body cache, when it has one.
    cache: Option<Arc<BodyCache>>,
    /// The platform store, which managed volumes live in.
    platform: Option<Backend>,
    /// FUSE sessions mounted ahead of calls.
    fuse_pool: Option<Arc<FusePool>>,
    /// Where `Local` mounts may be (none unless an admin allowed some).
    local_roots: LocalRoots,
    /// The platform store's S3 bucket (thread state, volumes), never a
    /// tenant's mount.
    platform_bucket: Option<String>,
    /// What the mounts' endpoints may reach (not the node itself).
    endpoints: Arc<EndpointPolicy>,
    /// Free bytes write spools leave on the state disk.
    disk_reserve: u64,
}

fn identity(spec: &MountSpec) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for part in [format!("{:?}", spec.provider), spec.bucket.clone(), spec.endpoint.clone().unwrap_or_default(), spec.region.clone().unwrap_or_default()] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.update([u8::from(spec.ambient_identity)]);
    for (k, v) in &spec.credentials.0 {
        h.update(k.as_bytes());
        h.update([0u8]);
        h.update(v.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

impl Stores {
    /// A cache whose S3 clients keep `pool_max_idle` idle connections.
    pub fn new(pool_max_idle: Option<usize>) -> Stores {
        Stores { pool_max_idle, kept: Mutex::default(), cache: None, platform: None, fuse_pool: None, local_roots: LocalRoots::none(), platform_bucket: None, endpoints: Arc::default(), disk_reserve: 0 }
    }

    /// `Local` mounts may be beneath `roots`.
    pub fn with_local_roots(mut self, roots: LocalRoots) -> Stores {
        self.local_roots = roots;
        self
    }

    /// Write spools leave `bytes` free on the state disk.
    pub fn with_disk_reserve(mut self, bytes: u64) -> Stores {
        self.disk_reserve = bytes;
        self
    }

    /// Free bytes write spools leave on the state disk.
    pub fn disk_reserve(&self) -> u64 {
        self.disk_reserve
    }

    /// Mount endpoints reach only what `policy` permits.
    pub fn with_endpoint_policy(mut self, policy: Arc<EndpointPolicy>) -> Stores {
        self.endpoints = policy;
        self
    }

    /// What tenant-named endpoints may reach from this node.
    pub fn endpoint_policy(&self) -> &Arc<EndpointPolicy> {
        &self.endpoints
    }

    /// The platform store lives in S3 bucket `bucket`: no mount may name it.
    pub fn with_platform_bucket(mut self, bucket: Option<String>) -> Stores {
        self.platform_bucket = bucket;
        self
    }

    /// Why `spec` may not be mounted on this node, if it may not, with the
    /// mount's field it is about: a `Local` directory outside the allowed
    /// roots, the platform's own bucket (whatever endpoint or credentials
    /// the mount names), an endpoint address that is the node itself.
    pub fn refuses(&self, spec: &MountSpec) -> Option<(&'static str, String)> {
        match spec.provider {
            Provider::Local if !self.local_roots.admits(&spec.bucket) => Some((
                "bucket",
                format!("{} is not beneath a directory this node allows for local storage (an admin grants roots with --local-storage-root)", spec.bucket),
            )),
            Provider::S3 if self.platform_bucket.as_deref() == Some(spec.bucket.as_str()) => {
                Some(("bucket", "this is the platform's own bucket (thread state and volumes); no StorageConnection may mount it".into()))
            }
            Provider::S3 | Provider::Azure | Provider::Gcs => spec.endpoint.as_deref().and_then(|e| crate::guard::literal_refusal(&self.endpoints, e)).map(|why| ("endpoint", why)),
            _ => None,
        }
    }

    /// Mounts keep what they read in `cache`.
    pub fn with_cache(mut self, cache: Arc<BodyCache>) -> Stores {
        self.cache = Some(cache);
        self
    }

    /// Managed volumes live in `platform`.
    pub fn with_platform(mut self, platform: Backend) -> Stores {
        self.platform = Some(platform);
        self
    }

    /// The platform store's objects (managed volumes), when there is one.
    pub fn platform_store(&self) -> Option<Arc<dyn ObjectStore>> {
        self.platform.as_ref().map(|b| b.store.clone())
    }

    /// Mounts take sessions from `pool`.
    pub fn with_fuse_pool(mut self, pool: Arc<FusePool>) -> Stores {
        self.fuse_pool = Some(pool);
        self
    }

    /// Sessions mounted ahead of calls.
    pub fn fuse_pool(&self) -> Option<&Arc<FusePool>> {
        self.fuse_pool.as_ref()
    }

    /// The node's body cache.
    pub fn cache(&self) -> Option<&Arc<BodyCache>> {
        self.cache.as_ref()
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, VecDeque<([u8; 32], Backend)>> {
        // A push or a lookup: never half-done.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client for `spec`'s store, built on first use.
    pub fn get(&self, spec: &MountSpec) -> Result<Backend, String> {
        if spec.provider == Provider::Volume {
            return self.platform.clone().ok_or_else(|| "this node has no platform store for volumes".to_string());
        }
        let id = identity(spec);
        if let Some((_, b)) = self.kept().iter().find(|(k, _)| *k == id) {
            return Ok(b.clone());
        }
        let backend = match spec.provider {
            Provider::S3 => {
                let s3 = Arc::new(spec.s3(self.pool_max_idle, &self.endpoints)?);
                Backend { store: s3.clone(), pager: Some(s3), id, cacheable: true }
            }
            Provider::Gcs => {
                let gcs = Arc::new(spec.gcs(&self.endpoints)?);
                Backend { store: gcs.clone(), pager: Some(gcs), id, cacheable: true }
            }
            Provider::Azure => {
                let az = Arc::new(spec.azure(&self.endpoints)?);
                Backend { store: az.clone(), pager: Some(az), id, cacheable: true }
            }
            Provider::Local => Backend { store: Arc::new(self.local_roots.store(&spec.bucket)?), pager: None, id, cacheable: false },
            Provider::Volume => Backend { store: spec.store(&self.endpoints)?, pager: None, id, cacheable: false },
        };
        let mut kept = self.kept();
        if kept.len() >= MAX_CLIENTS {
            kept.pop_front();
        }
        kept.push_back((id, backend.clone()));
        Ok(backend)
    }

    /// Clients kept now.
    pub fn len(&self) -> usize {
        self.kept().len()
    }

    /// True when none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::validate;
    use warren_core::contract::Mount;

    fn spec(secret: &str) -> MountSpec {
        let raw = Mount {
            endpoint: Some("http://10.0.0.7:9".into()),
            credentials: crate::spec::Credentials([("accessKeyId".to_string(), "a".to_string()), ("secretAccessKey".to_string(), secret.to_string())].into()),
            ..Mount::new("x", crate::spec::Provider::S3, "b")
        };
        validate(vec![raw]).unwrap().remove(0)
    }

    #[test]
    fn one_client_per_configuration_and_credentials() {
        let stores = Stores::new(Some(0));
        let a = stores.get(&spec("one")).unwrap();
        let again = stores.get(&spec("one")).unwrap();
        assert!(Arc::ptr_eq(&a.store, &again.store), "reused");
        assert!(a.pager.is_some(), "S3 lists a page of one");
        let other = stores.get(&spec("two")).unwrap();
        assert!(!Arc::ptr_eq(&a.store, &other.store), "other credentials, another client");
        assert_eq!(stores.len(), 2);
        for i in 0..MAX_CLIENTS + 5 {
            stores.get(&spec(&format!("s{i}"))).unwrap();
        }
        assert_eq!(stores.len(), MAX_CLIENTS, "bounded");
    }

    #[test]
    fn the_platform_bucket_and_ungranted_directories_are_refused_and_a_grant_is_its_own_client() {
        let stores = Stores::new(Some(0)).with_platform_bucket(Some("warren-threads".into()));
        let mut m = spec("one");
        assert_eq!(stores.refuses(&m), None);
        m.bucket = "warren-threads".into();
        assert!(stores.refuses(&m).unwrap().1.contains("platform's own bucket"), "whatever its credentials");
        m.bucket = "b".into();
        m.endpoint = Some("http://169.254.169.254".into());
        assert_eq!(stores.refuses(&m).map(|r| r.0), Some("endpoint"), "the metadata service as an endpoint");
        let local = validate(vec![Mount::new("l", crate::spec::Provider::Local, "/srv/data")]).unwrap().remove(0);
        assert!(stores.refuses(&local).unwrap().1.contains("--local-storage-root"));
        let anonymous = validate(vec![Mount::new("x", crate::spec::Provider::S3, "b")]).unwrap().remove(0);
        let lent = MountSpec { ambient_identity: true, ..anonymous.clone() };
        assert_ne!(identity(&anonymous), identity(&lent), "an unsigned client never serves a mount signed by the node, nor the reverse");
    }
}
