//! Is a store usable? One listing of the connection's prefix (one page at
//! most), classified so a StorageConnection's `Ready` condition can say why
//! not without echoing the store's own error text (which may carry
//! endpoints or key ids).

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::ObjectStore;

/// How long a probe may take.
pub const PROBE_WAIT: Duration = Duration::from_secs(15);

/// Why a store is not usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeError {
    /// The bucket (container, directory) does not exist.
    BucketNotFound,
    /// The store refused the credentials (or the node's identity).
    CredentialsRefused,
    /// No answer, or an answer that is not one of the above.
    Unreachable,
}

impl ProbeError {
    /// For a condition message.
    pub fn describe(self) -> &'static str {
        match self {
            ProbeError::BucketNotFound => "the bucket does not exist",
            ProbeError::CredentialsRefused => "the store refused the credentials",
            ProbeError::Unreachable => "the store did not answer a listing",
        }
    }
}

/// Lists `prefix` once (bounded in time).
pub async fn probe(store: Arc<dyn ObjectStore>, prefix: &Path) -> Result<(), ProbeError> {
    use futures_util::StreamExt;
    let first = async move { store.list(Some(prefix)).next().await.transpose() };
    match tokio::time::timeout(PROBE_WAIT, first).await {
        Err(_) => Err(ProbeError::Unreachable),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(classify(&e)),
    }
}

fn classify(e: &object_store::Error) -> ProbeError {
    match e {
        object_store::Error::Unauthenticated { .. } | object_store::Error::PermissionDenied { .. } => ProbeError::CredentialsRefused,
        object_store::Error::NotFound { .. } => ProbeError::BucketNotFound,
        other => {
            // S3-compatible servers and Azure answer these codes in the body.
            let text = other.to_string();
            if text.contains("NoSuchBucket") || text.contains("ContainerNotFound") {
                ProbeError::BucketNotFound
            } else if ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "AuthenticationFailed", "403 Forbidden"].iter().any(|c| text.contains(c)) {
                ProbeError::CredentialsRefused
            } else {
                ProbeError::Unreachable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_directory_probes_by_existence() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        assert_eq!(probe(ok, &Path::from("")).await, Ok(()));
        assert_eq!(classify(&object_store::Error::NotFound { path: "b".into(), source: "x".into() }), ProbeError::BucketNotFound);
        let denied = object_store::Error::Generic { store: "S3", source: "<Code>SignatureDoesNotMatch</Code>".into() };
        assert_eq!(classify(&denied), ProbeError::CredentialsRefused);
    }
}
