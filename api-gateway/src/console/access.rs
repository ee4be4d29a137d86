//! What a console user may see and do, asked of the cluster's own RBAC:
//! for a signed-in user and their groups, a SubjectAccessReview per verb,
//! kind and namespace. Tenants see their namespaces, admins all of them;
//! nobody sees more than `kubectl` would let them. Answers are kept for a
//! short while (bounded), so a page does not ask the API server per row.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use super::oidc::Identity;

/// How long an answer is reused.
const TTL: Duration = Duration::from_secs(30);
/// Most answers kept.
const MAX_CACHED: usize = 4096;

/// The API group of Warren's kinds.
pub const GROUP: &str = "warren.dev";

/// One question: may `who` `verb` `resource` (a Warren kind's plural) in `namespace`?
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Question {
    user: String,
    groups: Vec<String>,
    verb: &'static str,
    resource: &'static str,
    namespace: String,
}

/// RBAC answers from the API server.
pub struct ClusterAccess {
    client: kube::Client,
    cache: Mutex<HashMap<Question, (bool, Instant)>>,
}

impl ClusterAccess {
    /// Asks through `client` (the gateway's service account, which may
    /// create SubjectAccessReviews).
    pub fn new(client: kube::Client) -> ClusterAccess {
        ClusterAccess { client, cache: Mutex::new(HashMap::new()) }
    }

    /// May `who` `verb` `resource` of `warren.dev` in `namespace`?
    pub async fn may(&self, who: &Identity, verb: &'static str, resource: &'static str, namespace: &str) -> Result<bool, kube::Error> {
        let q = Question { user: who.user.clone(), groups: who.groups.clone(), verb, resource, namespace: namespace.to_string() };
        let now = Instant::now();
        if let Some((allowed, at)) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&q) {
            if now.duration_since(*at) < TTL {
                return Ok(*allowed);
            }
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(q.user.clone()),
                groups: Some(q.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.into()),
                    resource: Some(resource.into()),
                    verb: Some(verb.into()),
                    namespace: Some(namespace.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        let allowed = answer.status.is_some_and(|s| s.allowed && !s.denied.unwrap_or(false));
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (_, at)| now.duration_since(*at) < TTL);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(q, (allowed, now));
        Ok(allowed)
    }

    /// The namespaces among `candidates` where `who` may list Sandboxes:
    /// the ones the console shows them.
    pub async fn visible(&self, who: &Identity, candidates: &[String]) -> Result<Vec<String>, kube::Error> {
        let mut out = Vec::new();
        for ns in candidates {
            if self.may(who, "list", "sandboxes", ns).await? {
                out.push(ns.clone());
            }
        }
        Ok(out)
    }
}

/// Who decides what a signed-in user may do.
pub enum Access {
    /// Single-machine mode: only the local admin (or the provider's
    /// allowed groups) can sign in, and may do everything.
    SignedIn,
    /// The cluster's RBAC.
    Cluster(ClusterAccess),
}

impl Access {
    /// May `who` `verb` `resource` of `warren.dev` in `namespace`?
    pub async fn may(&self, who: &Identity, verb: &'static str, resource: &'static str, namespace: &str) -> Result<bool, kube::Error> {
        match self {
            Access::SignedIn => Ok(true),
            Access::Cluster(c) => c.may(who, verb, resource, namespace).await,
        }
    }

    /// The API server's client, in a cluster (where the console's writes go).
    pub fn client(&self) -> Option<&kube::Client> {
        match self {
            Access::SignedIn => None,
            Access::Cluster(c) => Some(&c.client),
        }
    }

    /// The namespaces among `candidates` the console shows `who`.
    pub async fn visible(&self, who: &Identity, candidates: &[String]) -> Result<Vec<String>, kube::Error> {
        match self {
            Access::SignedIn => Ok(candidates.to_vec()),
            Access::Cluster(c) => c.visible(who, candidates).await,
        }
    }
}
