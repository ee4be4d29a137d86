//! The closed sets of the execution contract: where a mount's objects live
//! and what service a connector reaches. Their wire names are the ones the
//! published key configuration and older agents use.

use serde::{Deserialize, Serialize};

/// Where a mount's objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// S3 or any S3-compatible endpoint.
    S3,
    /// Azure Blob Storage (`bucket` is the container).
    Azure,
    /// Google Cloud Storage.
    Gcs,
    /// A directory on the node (`bucket` is its absolute path).
    Local,
    /// A managed volume in the agent's own platform store (the one holding
    /// thread state), below `volumes/<namespace>/<name>`.
    Volume,
}

impl Provider {
    /// Every provider.
    pub const ALL: [Provider; 5] = [Provider::S3, Provider::Azure, Provider::Gcs, Provider::Local, Provider::Volume];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::S3 => "s3",
            Provider::Azure => "azure",
            Provider::Gcs => "gcs",
            Provider::Local => "local",
            Provider::Volume => "volume",
        }
    }

    /// From the wire name.
    pub fn parse(s: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// The service a connector reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConnectorKind {
    /// PostgreSQL.
    #[serde(rename = "postgresql")]
    Postgres,
    /// MySQL / MariaDB.
    #[serde(rename = "mysql")]
    Mysql,
    /// Redis.
    #[serde(rename = "redis")]
    Redis,
    /// MongoDB.
    #[serde(rename = "mongodb")]
    Mongo,
    /// BigQuery.
    #[serde(rename = "bigquery")]
    BigQuery,
    /// S3.
    #[serde(rename = "s3")]
    S3,
    /// Google Cloud Storage.
    #[serde(rename = "gcs")]
    Gcs,
    /// Azure Storage.
    #[serde(rename = "azure")]
    Azure,
    /// GitHub.
    #[serde(rename = "github")]
    GitHub,
}

impl ConnectorKind {
    /// Every kind.
    pub const ALL: [ConnectorKind; 9] = [
        ConnectorKind::Postgres,
        ConnectorKind::Mysql,
        ConnectorKind::Redis,
        ConnectorKind::Mongo,
        ConnectorKind::BigQuery,
        ConnectorKind::S3,
        ConnectorKind::Gcs,
        ConnectorKind::Azure,
        ConnectorKind::GitHub,
    ];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectorKind::Postgres => "postgresql",
            ConnectorKind::Mysql => "mysql",
            ConnectorKind::Redis => "redis",
            ConnectorKind::Mongo => "mongodb",
            ConnectorKind::BigQuery => "bigquery",
            ConnectorKind::S3 => "s3",
            ConnectorKind::Gcs => "gcs",
            ConnectorKind::Azure => "azure",
            ConnectorKind::GitHub => "github",
        }
    }

    /// From the wire name.
    pub fn parse(s: &str) -> Option<ConnectorKind> {
        ConnectorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_parse_back_and_match_serde() {
        for p in Provider::ALL {
            assert_eq!(Provider::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        for k in ConnectorKind::ALL {
            assert_eq!(ConnectorKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        assert_eq!((Provider::parse("ftp"), ConnectorKind::parse("ftp"), ConnectorKind::parse("PostgreSQL")), (None, None, None));
    }
}
