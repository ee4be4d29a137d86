//! Storage mounts as a key gets them: each Sandbox mount resolved against
//! its StorageConnection (bucket, endpoint, credentials) and narrowed by the
//! ApiKey, ready for the gateway to send to a node-agent.

use std::collections::BTreeMap;

use warren_core::kinds::Provider;

use crate::types::{SecretBody, StorageConnectionSpec, StorageProvider};

/// Secret values (they travel to the gateways inside the published key
/// Secret, and on to the node), never printed.
pub use warren_core::secret::Credentials;

/// A StorageConnection with its credentials read from its Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The store.
    pub spec: StorageConnectionSpec,
    /// Entries of the credentials Secret the provider needs; empty without
    /// a Secret (unsigned requests, or the node's identity where an admin
    /// lent it to the namespace).
    pub credentials: Credentials,
}

/// Resolves `spec`'s credentials from `secret` (the Secret its
/// `credentialsSecretRef` names, when it names one). The error names what
/// is missing, never a value.
pub fn connection(spec: &StorageConnectionSpec, secret: Option<&SecretBody>) -> Result<Connection, String> {
    let Some(r) = &spec.credentials_secret_ref else { return Ok(Connection { spec: spec.clone(), credentials: Credentials::default() }) };
    let values = secret_entries(&r.name, secret, spec.provider.secret_entries(), &[])?;
    Ok(Connection { spec: spec.clone(), credentials: Credentials(values) })
}

/// `entries` of the credentials Secret `name` (`secret`, when found), trimmed
/// except those in `verbatim`. The error names what is missing, never a value.
pub fn secret_entries(name: &str, secret: Option<&SecretBody>, entries: &[&str], verbatim: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let s = secret.ok_or_else(|| format!("its credentials Secret {name:?} was not found"))?;
    let mut values = BTreeMap::new();
    for entry in entries {
        let v = secret_entry(name, s, entry)?.ok_or_else(|| format!("its credentials Secret {name:?} has no entry {entry:?}"))?;
        let v = if verbatim.contains(entry) { v } else { v.trim().to_string() };
        values.insert((*entry).to_string(), v);
    }
    Ok(values)
}

/// Entry `entry` of Secret `name` (`stringData` first), if it has one.
pub fn secret_entry(name: &str, s: &SecretBody, entry: &str) -> Result<Option<String>, String> {
    match (s.string_data.get(entry), s.data.get(entry)) {
        (Some(v), _) => Ok(Some(v.clone())),
        (None, Some(b)) => String::from_utf8(b.clone()).map(Some).map_err(|_| format!("Secret {name:?} entry {entry:?} is not UTF-8")),
        (None, None) => Ok(None),
    }
}

/// Where managed volume `name` of `namespace` lives in the platform store.
pub fn volume_prefix(namespace: &str, name: &str) -> String {
    format!("volumes/{namespace}/{name}")
}

/// A StorageConnection's provider in the execution contract.
pub fn provider(p: StorageProvider) -> Provider {
    match p {
        StorageProvider::S3 => Provider::S3,
        StorageProvider::GCS => Provider::Gcs,
        StorageProvider::Azure => Provider::Azure,
        StorageProvider::Local => Provider::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LocalRef;

    fn s3(secret: Option<&str>) -> StorageConnectionSpec {
        StorageConnectionSpec {
            provider: StorageProvider::S3,
            bucket: "b".into(),
            prefix: None,
            endpoint: None,
            region: None,
            credentials_secret_ref: secret.map(|n| LocalRef { name: n.into() }),
        }
    }

    #[test]
    fn credentials_come_from_the_named_secret_and_never_print() {
        let body = SecretBody { string_data: [("accessKeyId".into(), "AK".into()), ("secretAccessKey".into(), " hunter2 ".into())].into(), ..SecretBody::default() };
        let c = connection(&s3(Some("creds")), Some(&body)).unwrap();
        assert_eq!(c.credentials.0["secretAccessKey"], "hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(connection(&s3(None), None).unwrap().credentials.0.is_empty(), "no Secret: the node's identity");
        let missing = connection(&s3(Some("creds")), None).unwrap_err();
        assert!(missing.contains("\"creds\" was not found"), "{missing}");
        let partial = SecretBody { string_data: [("accessKeyId".into(), "AK".into())].into(), ..SecretBody::default() };
        let e = connection(&s3(Some("creds")), Some(&partial)).unwrap_err();
        assert!(e.contains("secretAccessKey") && !e.contains("AK"), "{e}");
    }
}
