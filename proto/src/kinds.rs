//! The contract's closed sets on the wire: [`Provider`] ⇄
//! `StorageProvider`, [`ConnectorKind`] ⇄ `ConnectorKind`, in one place.
//! Messages carry the enum and, for agents that predate it, the name;
//! readers prefer the enum and fall back to the name.

use warren_core::kinds::{ConnectorKind, Provider};

use crate::agent as pb;

impl From<Provider> for pb::StorageProvider {
    fn from(p: Provider) -> pb::StorageProvider {
        match p {
            Provider::S3 => pb::StorageProvider::S3,
            Provider::Azure => pb::StorageProvider::Azure,
            Provider::Gcs => pb::StorageProvider::Gcs,
            Provider::Local => pb::StorageProvider::Local,
            Provider::Volume => pb::StorageProvider::Volume,
        }
    }
}

impl From<ConnectorKind> for pb::ConnectorKind {
    fn from(k: ConnectorKind) -> pb::ConnectorKind {
        match k {
            ConnectorKind::Postgres => pb::ConnectorKind::Postgresql,
            ConnectorKind::Mysql => pb::ConnectorKind::Mysql,
            ConnectorKind::Redis => pb::ConnectorKind::Redis,
            ConnectorKind::Mongo => pb::ConnectorKind::Mongodb,
            ConnectorKind::BigQuery => pb::ConnectorKind::Bigquery,
            ConnectorKind::S3 => pb::ConnectorKind::S3,
            ConnectorKind::Gcs => pb::ConnectorKind::Gcs,
            ConnectorKind::Azure => pb::ConnectorKind::Azure,
            ConnectorKind::GitHub => pb::ConnectorKind::Github,
        }
    }
}

/// A mount's provider: the enum, or the name an older sender set; `None`
/// when neither is one this agent knows.
pub(crate) fn provider(kind: i32, name: &str) -> Option<Provider> {
    match pb::StorageProvider::try_from(kind) {
        Ok(pb::StorageProvider::S3) => Some(Provider::S3),
        Ok(pb::StorageProvider::Azure) => Some(Provider::Azure),
        Ok(pb::StorageProvider::Gcs) => Some(Provider::Gcs),
        Ok(pb::StorageProvider::Local) => Some(Provider::Local),
        Ok(pb::StorageProvider::Volume) => Some(Provider::Volume),
        Ok(pb::StorageProvider::Unspecified) => Provider::parse(name),
        Err(_) => None,
    }
}

/// A connector's kind: the enum, or the name an older sender set; `None`
/// when neither is one this agent knows.
pub(crate) fn connector_kind(kind: i32, name: &str) -> Option<ConnectorKind> {
    match pb::ConnectorKind::try_from(kind) {
        Ok(pb::ConnectorKind::Postgresql) => Some(ConnectorKind::Postgres),
        Ok(pb::ConnectorKind::Mysql) => Some(ConnectorKind::Mysql),
        Ok(pb::ConnectorKind::Redis) => Some(ConnectorKind::Redis),
        Ok(pb::ConnectorKind::Mongodb) => Some(ConnectorKind::Mongo),
        Ok(pb::ConnectorKind::Bigquery) => Some(ConnectorKind::BigQuery),
        Ok(pb::ConnectorKind::S3) => Some(ConnectorKind::S3),
        Ok(pb::ConnectorKind::Gcs) => Some(ConnectorKind::Gcs),
        Ok(pb::ConnectorKind::Azure) => Some(ConnectorKind::Azure),
        Ok(pb::ConnectorKind::Github) => Some(ConnectorKind::GitHub),
        Ok(pb::ConnectorKind::Unspecified) => ConnectorKind::parse(name),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_and_kind_survives_the_wire_both_ways() {
        for p in Provider::ALL {
            assert_eq!(provider(pb::StorageProvider::from(p) as i32, ""), Some(p), "{p:?} by enum");
            assert_eq!(provider(0, p.as_str()), Some(p), "{p:?} by the name an older gateway sends");
        }
        for k in ConnectorKind::ALL {
            assert_eq!(connector_kind(pb::ConnectorKind::from(k) as i32, ""), Some(k), "{k:?} by enum");
            assert_eq!(connector_kind(0, k.as_str()), Some(k), "{k:?} by name");
        }
    }

    #[test]
    fn the_enum_wins_and_unknown_values_are_refused() {
        assert_eq!(provider(pb::StorageProvider::Gcs as i32, "s3"), Some(Provider::Gcs));
        assert_eq!(connector_kind(pb::ConnectorKind::Redis as i32, "mysql"), Some(ConnectorKind::Redis));
        assert_eq!(provider(99, "s3"), None, "a newer sender's provider is not guessed from the name");
        assert_eq!(connector_kind(99, "redis"), None);
        assert_eq!((provider(0, "ftp"), connector_kind(0, "ftp"), provider(0, "")), (None, None, None));
    }
}
