//! One mount as the node-agent receives it, validated, and the store
//! client it needs.

use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;
use warren_core::contract::Mount;
use warren_core::reach::EndpointPolicy;

/// Most mounts one call may have.
pub const MAX_MOUNTS: usize = 16;
/// Default write volume of a mount for one call.
pub const DEFAULT_MAX_WRITE: u64 = 1 << 30;

/// A store that is down fails a file operation within seconds (EIO), not
/// after the client's default three minutes of retries.
const RETRY: object_store::RetryConfig = object_store::RetryConfig {
    backoff: object_store::BackoffConfig { init_backoff: std::time::Duration::from_millis(100), max_backoff: std::time::Duration::from_secs(2), base: 2.0 },
    max_retries: 3,
    retry_timeout: std::time::Duration::from_secs(10),
};
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// One request, a part of a multipart upload included.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the objects live (the execution contract's set).
pub use warren_core::kinds::Provider;

/// Secret values (they travel to the gateways inside the published key
/// Secret, and on to the node), never printed.
pub use warren_core::secret::Credentials;

/// A validated mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    /// `<name>` of `/data/<name>`.
    pub name: String,
    /// Store kind.
    pub provider: Provider,
    /// Bucket, or the Local directory.
    pub bucket: String,
    /// Scope inside the bucket (already narrowed by the control plane).
    pub prefix: String,
    /// Every change is refused.
    pub read_only: bool,
    /// Endpoint URL (S3-compatible).
    pub endpoint: Option<String>,
    /// Region (S3).
    pub region: Option<String>,
    /// `accessKeyId`/`secretAccessKey` for S3, `accountName`/`accountKey`
    /// for Azure, `serviceAccountJson` for GCS; none: unsigned requests, or
    /// the node's identity where `ambient_identity` says so.
    pub credentials: Credentials,
    /// An admin lent the node's cloud identity to this mount's namespace.
    pub ambient_identity: bool,
    /// Write volume for the call.
    pub max_write_bytes: u64,
}

/// Why a mount is refused (the field is named for the caller).
pub use warren_core::contract::SpecError;

fn err(i: usize, field: &str, message: &str) -> SpecError {
    SpecError::new(format!("mounts[{i}].{field}"), message)
}

/// Validates a call's mounts: names unique single segments under `/data`,
/// buckets and prefixes that cannot climb.
pub fn validate(mounts: Vec<Mount>) -> Result<Vec<MountSpec>, SpecError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(SpecError::new("mounts", "at most 16 mounts"));
    }
    let mut out: Vec<MountSpec> = Vec::with_capacity(mounts.len());
    for (i, m) in mounts.into_iter().enumerate() {
        if crate::name::segment(m.name.as_bytes()).is_err() {
            return Err(err(i, "mount_path", "must be /data/<name> with one plain path segment"));
        }
        if out.iter().any(|o| o.name == m.name) {
            return Err(err(i, "mount_path", "two mounts at the same path"));
        }
        let provider = m.provider;
        let bucket_ok = match provider {
            // The platform store is the agent's own: a volume names none.
            Provider::Volume => m.bucket.is_empty(),
            Provider::Local => m.bucket.starts_with('/') && m.bucket.len() <= 1024,
            Provider::S3 | Provider::Azure | Provider::Gcs => !m.bucket.is_empty() && m.bucket.len() <= 1024,
        };
        if !bucket_ok {
            return Err(err(i, "bucket", "required (for local, an absolute directory); empty for a volume"));
        }
        let segments = warren_core::path::segments(&m.prefix);
        if segments.is_none() {
            return Err(err(i, "prefix", "must be plain path segments"));
        }
        // The platform store also holds thread state: a volume mount stays
        // below volumes/<namespace>/<name>, whatever the caller sends.
        if provider == Provider::Volume && !segments.is_some_and(|s| s.len() >= 3 && s[0] == "volumes") {
            return Err(err(i, "prefix", "a volume lives below volumes/<namespace>/<name>"));
        }
        let ambient_identity = m.ambient_identity && m.credentials.0.is_empty();
        out.push(MountSpec {
            name: m.name,
            provider,
            bucket: m.bucket,
            prefix: m.prefix.trim_end_matches('/').to_string(),
            read_only: m.read_only,
            endpoint: m.endpoint.filter(|e| !e.is_empty()),
            region: m.region.filter(|r| !r.is_empty()),
            ambient_identity,
            credentials: m.credentials,
            max_write_bytes: if m.max_write_bytes == 0 { DEFAULT_MAX_WRITE } else { m.max_write_bytes },
        });
    }
    Ok(out)
}

impl MountSpec {
    /// The tree's root inside the store.
    pub fn root(&self) -> Path {
        Path::from(self.prefix.as_str())
    }

    /// A client for the mount's store (no request is made yet) that
    /// reaches only what `policy` permits.
    pub fn store(&self, policy: &Arc<EndpointPolicy>) -> Result<Arc<dyn ObjectStore>, String> {
        match self.provider {
            Provider::S3 => self.s3(None, policy).map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            Provider::Azure => self.azure(policy).map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            Provider::Gcs => self.gcs(policy).map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
            // Only beneath a root an admin allowed: see `warren_storage::local`.
            Provider::Local => Err("a local directory is served only beneath the agent's allowed roots".into()),
            Provider::Volume => Err("a volume is served from the agent's platform store".into()),
        }
    }
}

impl MountSpec {
    /// The endpoint (and `more` URLs the credentials name) may not be an
    /// address `policy` refuses.
    fn check_literals(&self, policy: &EndpointPolicy, more: &[Option<&str>]) -> Result<(), String> {
        let urls = self.endpoint.as_deref().into_iter().chain(more.iter().flatten().copied());
        urls.filter_map(|u| crate::guard::literal_refusal(policy, u)).next().map_or(Ok(()), Err)
    }

    fn connector(&self, policy: &Arc<EndpointPolicy>, allow_http: bool, pool_max_idle: Option<usize>) -> crate::guard::GuardedConnector {
        crate::guard::GuardedConnector { policy: policy.clone(), allow_http, pool_max_idle, connect_timeout: CONNECT_TIMEOUT, timeout: REQUEST_TIMEOUT }
    }

    /// An S3 client keeping `pool_max_idle` idle connections per host.
    pub fn s3(&self, pool_max_idle: Option<usize>, policy: &Arc<EndpointPolicy>) -> Result<object_store::aws::AmazonS3, String> {
        self.check_literals(policy, &[])?;
        let mut options = object_store::ClientOptions::new().with_connect_timeout(CONNECT_TIMEOUT).with_timeout(REQUEST_TIMEOUT);
        if let Some(n) = pool_max_idle {
            options = options.with_pool_max_idle_per_host(n);
        }
        let mut b = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(self.region.as_deref().unwrap_or("us-east-1"))
            .with_retry(RETRY)
            .with_client_options(options)
            .with_http_connector(self.connector(policy, self.endpoint.as_deref().is_some_and(|e| e.starts_with("http://")), pool_max_idle));
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://")).with_virtual_hosted_style_request(false);
        }
        let c = &self.credentials.0;
        if let (Some(id), Some(secret)) = (c.get("accessKeyId"), c.get("secretAccessKey")) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        } else if !self.ambient_identity {
            // Never the node's instance role or web identity unless lent.
            b = b.with_skip_signature(true);
        }
        // The store's own error text may echo configuration: keep only
        // that it failed.
        b.build().map_err(|_| "the S3 client could not be configured".to_string())
    }
}

impl MountSpec {
    /// An Azure Blob client. The account is `accountName` from the
    /// credentials, else the first label of an `https://<account>.blob…`
    /// endpoint; with no `accountKey` the node's managed identity signs.
    pub fn azure(&self, policy: &Arc<EndpointPolicy>) -> Result<object_store::azure::MicrosoftAzure, String> {
        self.check_literals(policy, &[])?;
        let c = &self.credentials.0;
        let from_endpoint = || {
            let host = self.endpoint.as_deref()?.strip_prefix("https://")?.split(['/', ':']).next()?;
            host.split_once(".blob.").map(|(account, _)| account.to_string())
        };
        let account = c.get("accountName").cloned().or_else(from_endpoint).ok_or("the Azure account is unknown: give accountName in the credentials Secret or an https://<account>.blob.core.windows.net endpoint")?;
        let options = object_store::ClientOptions::new().with_connect_timeout(CONNECT_TIMEOUT).with_timeout(REQUEST_TIMEOUT);
        let mut b = object_store::azure::MicrosoftAzureBuilder::new()
            .with_account(account)
            .with_container_name(&self.bucket)
            .with_retry(RETRY)
            .with_client_options(options)
            .with_http_connector(self.connector(policy, self.endpoint.as_deref().is_some_and(|e| e.starts_with("http://")), None));
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e.clone()).with_allow_http(e.starts_with("http://"));
        }
        if let Some(key) = c.get("accountKey") {
            b = b.with_access_key(key);
        } else if !self.ambient_identity {
            // Never the node's managed identity unless lent.
            b = b.with_skip_signature(true);
        }
        b.build().map_err(|_| "the Azure client could not be configured".to_string())
    }
}

impl MountSpec {
    /// A GCS client signed by the `serviceAccountJson` key, or with none by
    /// the node's identity (the metadata server: workload identity). GCS
    /// takes its endpoint from the key itself (`gcs_base_url`).
    pub fn gcs(&self, policy: &Arc<EndpointPolicy>) -> Result<object_store::gcp::GoogleCloudStorage, String> {
        let key = self.credentials.0.get("serviceAccountJson");
        let parsed = key.and_then(|k| serde_json::from_str::<serde_json::Value>(k).ok());
        let url_of = |field: &str| parsed.as_ref().and_then(|v| v.get(field)?.as_str().map(str::to_string));
        // The key names where its tokens and objects come from: held to the policy too.
        let (base, token) = (url_of("gcs_base_url"), url_of("token_uri"));
        self.check_literals(policy, &[base.as_deref(), token.as_deref()])?;
        // Plain HTTP only when the key itself names such an endpoint (an
        // emulator, a private gateway).
        let http = base.as_deref().is_some_and(|b| b.starts_with("http://"));
        let options = object_store::ClientOptions::new().with_connect_timeout(CONNECT_TIMEOUT).with_timeout(REQUEST_TIMEOUT).with_allow_http(http);
        let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
            .with_bucket_name(&self.bucket)
            .with_retry(RETRY)
            .with_client_options(options)
            .with_http_connector(self.connector(policy, http, None));
        if let Some(key) = key {
            b = b.with_service_account_key(key);
        } else if !self.ambient_identity {
            // Never the metadata server's (workload) identity unless lent.
            b = b.with_skip_signature(true);
        }
        b.build().map_err(|_| "the GCS client could not be configured (is serviceAccountJson a service account key?)".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(name: &str) -> Mount {
        Mount { prefix: "tenants/a".into(), ..Mount::new(name, Provider::S3, "b") }
    }

    #[test]
    fn mounts_are_single_names_under_data_with_plain_prefixes() {
        let ok = validate(vec![raw("in"), Mount { read_only: true, ..raw("ref") }]).unwrap();
        assert_eq!((ok[0].name.as_str(), ok[0].prefix.as_str(), ok[0].max_write_bytes), ("in", "tenants/a", DEFAULT_MAX_WRITE));
        assert!(ok[1].read_only);
        let field = |r: Vec<Mount>| validate(r).unwrap_err().field;
        for bad in ["", "a/b", "..", ".", "a\\b"] {
            assert_eq!(field(vec![raw(bad)]), "mounts[0].mount_path", "{bad}");
        }
        assert_eq!(field(vec![raw("x"), raw("x")]), "mounts[1].mount_path");
        assert_eq!(field(vec![Mount { prefix: "a/../b".into(), ..raw("x") }]), "mounts[0].prefix");
        assert_eq!(validate(vec![Mount { provider: Provider::Azure, ..raw("x") }]).unwrap()[0].provider, Provider::Azure);
        let volume = |prefix: &str, bucket: &str| Mount { provider: Provider::Volume, prefix: prefix.into(), bucket: bucket.into(), ..raw("x") };
        assert_eq!(validate(vec![volume("volumes/ns/v/sub", "")]).unwrap()[0].provider, Provider::Volume);
        for bad in ["threads/ns/key", "volumes/ns", "", "volumes"] {
            assert_eq!(field(vec![volume(bad, "")]), "mounts[0].prefix", "{bad}: thread state is not a volume");
        }
        assert_eq!(field(vec![volume("volumes/ns/v", "b")]), "mounts[0].bucket");
        assert_eq!(field(vec![Mount { provider: Provider::Local, bucket: "relative".into(), ..raw("x") }]), "mounts[0].bucket");
        assert_eq!(field((0..17).map(|i| raw(&format!("/data/m{i}"))).collect()), "mounts");
    }

    #[test]
    fn the_azure_account_comes_from_the_secret_or_the_endpoint() {
        let az = |endpoint: &str, creds: &[(&str, &str)]| {
            let raw = Mount {
                provider: Provider::Azure,
                endpoint: Some(endpoint.into()),
                credentials: Credentials(creds.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..raw("x")
            };
            validate(vec![raw]).unwrap().remove(0).azure(&Arc::new(EndpointPolicy::default())).map(|_| ())
        };
        assert!(az("https://acct.blob.core.windows.net", &[]).is_ok(), "ambient identity, account from the endpoint");
        assert!(az("http://10.0.0.7:10000/devstoreaccount1", &[("accountName", "devstoreaccount1"), ("accountKey", "a2V5")]).is_ok());
        let e = az("http://127.0.0.1:10000/devstoreaccount1", &[("accountName", "devstoreaccount1"), ("accountKey", "a2V5")]).unwrap_err();
        assert!(e.contains("loopback") && e.contains("--allow-endpoint"), "the node's loopback is refused without an admin's grant: {e}");
        let e = az("", &[]).unwrap_err();
        assert!(e.contains("accountName"), "{e}");
        let e = az("", &[("accountName", "a"), ("accountKey", "not base64 hunter2")]).unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn gcs_clients_come_from_a_service_account_key_or_the_node() {
        let gcs = |creds: &[(&str, &str)]| {
            let raw = Mount { provider: Provider::Gcs, credentials: Credentials(creds.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()), ..raw("x") };
            validate(vec![raw]).unwrap().remove(0).gcs(&Arc::new(EndpointPolicy::default())).map(|_| ())
        };
        assert!(gcs(&[]).is_ok(), "unsigned (or the node's identity with the admin's grant)");
        let key = r#"{"private_key": "k", "private_key_id": "id", "client_email": "sa@p.iam.gserviceaccount.com", "disable_oauth": true}"#;
        assert!(gcs(&[("serviceAccountJson", key)]).is_ok());
        let private = r#"{"private_key": "k", "private_key_id": "id", "client_email": "e", "disable_oauth": true, "gcs_base_url": "http://10.0.0.1:4443"}"#;
        assert!(gcs(&[("serviceAccountJson", private)]).is_ok(), "an endpoint named by the key");
        let metadata = r#"{"private_key": "k", "private_key_id": "id", "client_email": "e", "token_uri": "http://169.254.169.254/computeMetadata/v1/token"}"#;
        assert!(gcs(&[("serviceAccountJson", metadata)]).unwrap_err().contains("169.254.169.254"), "a key's token_uri is an endpoint too");
        let e = gcs(&[("serviceAccountJson", "not json hunter2")]).unwrap_err();
        assert!(e.contains("serviceAccountJson") && !e.contains("hunter2"), "{e}");
    }

    /// What a store sees of a mount without credentials: without the
    /// admin's grant the client never asks the node for an identity (the
    /// metadata server, web identity, managed identity) and signs nothing.
    #[tokio::test]
    async fn without_credentials_or_a_grant_requests_go_unsigned() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let mut heads = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap();
                heads.push(String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase());
                s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await.unwrap();
            }
            heads
        });
        let s3 = Mount { endpoint: Some(endpoint.clone()), ..raw("x") };
        let az = Mount { provider: Provider::Azure, endpoint: Some(format!("{endpoint}/acct")), credentials: Credentials([("accountName".to_string(), "acct".to_string())].into()), ..raw("y") };
        let specs = validate(vec![s3, az]).unwrap();
        assert!(specs.iter().all(|m| !m.ambient_identity));
        for m in &specs {
            let store = m.store(&Arc::new(EndpointPolicy::new(&["127.0.0.1".into()], vec![]).unwrap())).unwrap();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(20), store.head(&Path::from("tenants/a/x"))).await.expect("the request never reached the store: the client went for an identity first");
        }
        let heads = server.await.unwrap();
        assert_eq!(heads.len(), 2);
        for h in heads {
            assert!(!h.contains("\nauthorization:"), "signed with some identity: {h}");
        }
        let lent = validate(vec![Mount { ambient_identity: true, ..raw("x") }]).unwrap();
        assert!(lent[0].ambient_identity, "the admin's grant reaches the client");
        let with_keys = Mount { ambient_identity: true, credentials: Credentials([("accessKeyId".to_string(), "a".to_string())].into()), ..raw("x") };
        assert!(!validate(vec![with_keys]).unwrap()[0].ambient_identity, "credentials win over the grant");
    }

    #[test]
    fn credentials_never_print() {
        let c = Credentials([("secretAccessKey".to_string(), "hunter2".to_string())].into());
        let m = MountSpec { credentials: c, ..validate(vec![raw("x")]).unwrap().remove(0) };
        assert!(!format!("{m:?}").contains("hunter2"));
    }
}
