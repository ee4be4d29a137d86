//! Connectors as a key publishes them: checked, with their credentials read
//! from the named Secret (pure).

use warren_core::endpoint::{is_host, url_host_port};
use warren_core::contract;
use warren_core::secret::Credentials;

use crate::types::{ConnectorSpec, ConnectorType, PasswordMethod, SecretBody, TlsMode};

/// Checks a Connector on its own: `(field, why)` for the first problem.
pub fn check(spec: &ConnectorSpec) -> Result<(), (&'static str, String)> {
    use ConnectorType::*;
    let needs_host = matches!(spec.kind, PostgreSQL | MySQL | Redis | MongoDB);
    match (&spec.host, needs_host) {
        (None, true) => return Err(("spec.host", format!("{:?} needs the service's host", spec.kind))),
        (Some(h), _) if !is_host(h) => return Err(("spec.host", format!("{h:?} is not a DNS name or an IPv4 address (no scheme, no port)"))),
        _ => {}
    }
    if spec.port.is_some() && !needs_host {
        return Err(("spec.port", format!("{:?} has no port to set", spec.kind)));
    }
    if matches!(spec.kind, PostgreSQL | MySQL | MongoDB) && spec.username.is_none() {
        return Err(("spec.username", format!("{:?} needs a user name", spec.kind)));
    }
    if spec.custody == Some(true) && spec.kind != PostgreSQL {
        return Err(("spec.custody", "credential custody is offered for PostgreSQL only".into()));
    }
    if spec.custody != Some(true) {
        if spec.tls.is_some() {
            return Err(("spec.tls", "TLS settings apply to custody (spec.custody: true) only".into()));
        }
        if spec.allow_password_methods.is_some() {
            return Err(("spec.allowPasswordMethods", "password methods apply to custody (spec.custody: true) only".into()));
        }
    }
    if let Some(tls) = &spec.tls {
        match (&tls.server_name, tls.mode.unwrap_or_default()) {
            (Some(_), TlsMode::Disable) => return Err(("spec.tls.serverName", "a server name with TLS disabled".into())),
            (Some(n), _) if !is_host(n) => return Err(("spec.tls.serverName", format!("{n:?} is not a DNS name or an IPv4 address"))),
            _ => {}
        }
    }
    if let Some(e) = &spec.endpoint {
        if spec.kind != S3 {
            return Err(("spec.endpoint", "only S3 connectors take an endpoint".into()));
        }
        if url_host_port(e).is_none() {
            return Err(("spec.endpoint", format!("{e:?} is not an http(s)://host[:port] URL")));
        }
    }
    if spec.region.is_some() && spec.kind != S3 {
        return Err(("spec.region", "only S3 connectors take a region".into()));
    }
    for (field, v) in [("spec.database", &spec.database), ("spec.username", &spec.username), ("spec.project", &spec.project), ("spec.region", &spec.region)] {
        if let Some(v) = v {
            if v.is_empty() || v.len() > 128 || v.chars().any(|c| c.is_control() || c.is_whitespace() || c == ':' || c == '\\') {
                return Err((field, format!("{v:?}: 1–128 characters, no spaces, control characters, ':' or '\\'")));
            }
        }
    }
    Ok(())
}

/// The connector `name` with its credentials from `secret`. The error names
/// what is missing, never a value.
pub fn resolve(name: &str, spec: &ConnectorSpec, secret: Option<&SecretBody>) -> Result<contract::Connector, String> {
    check(spec).map_err(|(field, why)| format!("{field}: {why}"))?;
    // Keys and tokens never carry meaningful edge whitespace; JSON keeps its own.
    let values = crate::storage::secret_entries(&spec.credentials_secret_ref.name, secret, spec.kind.secret_entries(), &["serviceAccountJson"])?;
    Ok(contract::Connector {
        name: name.to_string(),
        kind: spec.kind.contract(),
        host: spec.host.clone(),
        port: spec.port.or(spec.kind.default_port()),
        database: spec.database.clone(),
        username: spec.username.clone(),
        project: spec.project.clone(),
        endpoint: spec.endpoint.clone(),
        region: spec.region.clone(),
        custody: spec.custody == Some(true),
        tls_disabled: custody_tls(spec) == Some(TlsMode::Disable),
        tls_ca_pem: match custody_tls(spec) {
            Some(TlsMode::VerifyFull) => ca_bundle(&spec.credentials_secret_ref.name, secret)?,
            _ => None,
        },
        tls_server_name: spec.tls.as_ref().and_then(|t| t.server_name.clone()),
        weak_auth: spec.allow_password_methods.iter().flatten().map(|m| match m { PasswordMethod::Md5 => "md5", PasswordMethod::Cleartext => "cleartext" }.to_string()).collect(),
        credentials: Credentials(values),
    })
}

/// Custody's TLS mode (`None`: no custody).
fn custody_tls(spec: &ConnectorSpec) -> Option<TlsMode> {
    (spec.custody == Some(true)).then(|| spec.tls.as_ref().and_then(|t| t.mode).unwrap_or_default())
}

/// The credentials Secret's optional `ca.crt` entry, checked to hold a
/// certificate.
fn ca_bundle(name: &str, secret: Option<&SecretBody>) -> Result<Option<String>, String> {
    let Some(pem) = secret.map(|s| crate::storage::secret_entry(name, s, "ca.crt")).transpose()?.flatten() else { return Ok(None) };
    if !pem.contains("-----BEGIN CERTIFICATE-----") || pem.len() > 256 * 1024 {
        return Err(format!("Secret {name:?} entry \"ca.crt\" is not a PEM certificate bundle (at most 256 KiB)"));
    }
    Ok(Some(pem))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LocalRef;

    fn spec(kind: ConnectorType) -> ConnectorSpec {
        ConnectorSpec {
            kind,
            host: Some("db.internal".into()),
            port: None,
            database: Some("app".into()),
            username: Some("agent".into()),
            project: None,
            endpoint: None,
            region: None,
            custody: None,
            tls: None,
            allow_password_methods: None,
            credentials_secret_ref: LocalRef { name: "pg-creds".into() },
        }
    }

    #[test]
    fn connectors_resolve_with_defaults_and_their_secrets_entries() {
        let secret = SecretBody { string_data: [("password".to_string(), " s3cret\n".to_string())].into(), ..Default::default() };
        let c = resolve("pg", &spec(ConnectorType::PostgreSQL), Some(&secret)).unwrap();
        assert_eq!((c.kind.as_str(), c.port, c.credentials.0.get("password").map(String::as_str)), ("postgresql", Some(5432), Some("s3cret")));
        assert!(!format!("{c:?}").contains("s3cret"), "credentials never print");
        assert!(resolve("pg", &spec(ConnectorType::PostgreSQL), None).unwrap_err().contains("\"pg-creds\" was not found"));
        let e = resolve("pg", &spec(ConnectorType::S3), Some(&secret)).unwrap_err();
        assert!(e.contains("no entry \"accessKeyId\"") || e.contains("spec.port") || e.contains("username"), "{e}");
    }

    #[test]
    fn custody_takes_tls_and_password_methods_and_nothing_else_does() {
        use crate::types::{ConnectorTls, PasswordMethod, TlsMode};
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let secret = SecretBody { string_data: [("password".to_string(), "pw".to_string()), ("ca.crt".to_string(), pem.to_string())].into(), ..Default::default() };
        let custody = ConnectorSpec { custody: Some(true), ..spec(ConnectorType::PostgreSQL) };
        let c = resolve("pg", &custody, Some(&secret)).unwrap();
        assert_eq!((c.tls_disabled, c.tls_ca_pem.as_deref(), c.weak_auth.len()), (false, Some(pem), 0), "verified TLS and SCRAM only by default");
        let old = ConnectorSpec { tls: Some(ConnectorTls { mode: Some(TlsMode::Disable), server_name: None }), allow_password_methods: Some(vec![PasswordMethod::Md5]), ..custody.clone() };
        let c = resolve("pg", &old, Some(&secret)).unwrap();
        assert_eq!((c.tls_disabled, c.tls_ca_pem, c.weak_auth), (true, None, vec!["md5".to_string()]));
        let bad_ca = SecretBody { string_data: [("password".to_string(), "pw".to_string()), ("ca.crt".to_string(), "junk".to_string())].into(), ..Default::default() };
        assert!(resolve("pg", &custody, Some(&bad_ca)).unwrap_err().contains("ca.crt"));
        let plain = spec(ConnectorType::PostgreSQL);
        assert_eq!(check(&ConnectorSpec { tls: Some(ConnectorTls::default()), ..plain.clone() }).unwrap_err().0, "spec.tls");
        assert_eq!(check(&ConnectorSpec { allow_password_methods: Some(vec![]), ..plain }).unwrap_err().0, "spec.allowPasswordMethods");
        let named = ConnectorSpec { tls: Some(ConnectorTls { mode: Some(TlsMode::Disable), server_name: Some("db".into()) }), ..custody };
        assert_eq!(check(&named).unwrap_err().0, "spec.tls.serverName");
    }

    #[test]
    fn fields_are_checked_per_type() {
        use ConnectorType::*;
        let bad = |f: &dyn Fn(&mut ConnectorSpec)| {
            let mut s = spec(PostgreSQL);
            f(&mut s);
            check(&s).unwrap_err().0
        };
        assert_eq!(bad(&|s| s.host = None), "spec.host");
        assert_eq!(bad(&|s| s.host = Some("db.internal:5432".into())), "spec.host");
        assert_eq!(bad(&|s| s.host = Some("http://db".into())), "spec.host");
        assert_eq!(bad(&|s| s.username = None), "spec.username");
        assert_eq!(bad(&|s| s.database = Some("a b".into())), "spec.database");
        assert_eq!(bad(&|s| s.endpoint = Some("http://minio:9000".into())), "spec.endpoint");
        let mut redis = spec(Redis);
        redis.custody = Some(true);
        assert_eq!(check(&redis).unwrap_err().0, "spec.custody");
        let s3 = ConnectorSpec { host: None, username: None, database: None, endpoint: Some("http://127.0.0.1:9000".into()), region: Some("us-east-1".into()), ..spec(S3) };
        assert_eq!(check(&s3), Ok(()));
        assert_eq!(check(&ConnectorSpec { endpoint: Some("ftp://x".into()), ..s3.clone() }).unwrap_err().0, "spec.endpoint");
        assert_eq!(check(&ConnectorSpec { port: Some(1), ..s3 }).unwrap_err().0, "spec.port");
    }
}
