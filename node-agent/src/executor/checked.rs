//! A spec checked against this node: the sandbox's part (program, limits,
//! environment) against the node's policy, and each resource a request
//! lends (thread, mounts, network, connectors, registry credentials) into
//! the form the executor serves. Pure: nothing here touches the node.

use warren_core::contract::{NodePolicy, Spec, SpecError, Thread};
use warren_core::secret::Credentials;
use warren_isolation::spec::ExecSpec;

use super::NetworkRequest;
use crate::threads::{ThreadKey, ThreadOptions};

/// Most characters of a registry user name, and of its password.
const MAX_PULL_USER: usize = 1024;
const MAX_PULL_PASSWORD: usize = 16384;

/// Everything one execution needs, checked.
#[derive(Debug)]
pub struct Checked {
    /// What the sandbox runs.
    pub run: ExecSpec,
    /// `host` (or empty) or an OCI reference.
    pub image: String,
    /// Digest the image reference is pinned to (empty: none).
    pub image_digest: String,
    /// Registry credentials for pulling the image.
    pub image_pull: warren_image::PullAuth,
    /// The thread whose home the program gets.
    pub thread: Option<ThreadOptions>,
    /// Storage mounted under `/data`.
    pub mounts: Vec<warren_storage::MountSpec>,
    /// Outbound network.
    pub network: NetworkRequest,
    /// Connectors whose credentials the program gets.
    pub connectors: Vec<crate::connectors::Grant>,
    /// Modules a warm interpreter for this call loads ahead of it.
    pub warm_modules: Vec<String>,
    /// The trace the call continues.
    pub trace: Option<warren_core::trace::Trace>,
}

impl Checked {
    /// Checks `spec` against `policy`; the first problem names its field.
    pub fn of(mut spec: Spec, policy: &NodePolicy) -> Result<Checked, SpecError> {
        let run = ExecSpec::check(&mut spec, policy)?;
        Ok(Checked {
            network: network(&spec)?,
            thread: spec.thread.map(thread_options).transpose()?,
            mounts: warren_storage::spec::validate(spec.mounts)?,
            connectors: connectors(spec.connectors)?,
            image_pull: pull_auth(spec.image.pull)?,
            image_digest: spec.image.digest.unwrap_or_default(),
            image: spec.image.reference,
            warm_modules: std::mem::take(&mut spec.warm_modules),
            trace: spec.trace.take(),
            run,
        })
    }
}

/// The network a spec asks for, its allowlist parsed (`Spec::check` has
/// refused an allowlist without `Unrestricted`).
fn network(spec: &Spec) -> Result<NetworkRequest, SpecError> {
    if spec.network == warren_core::Network::Blocked {
        return Ok(NetworkRequest::Blocked);
    }
    if spec.egress.is_empty() {
        return Ok(NetworkRequest::Unrestricted { allow: None });
    }
    let allow = warren_core::egress::parse_rules(&spec.egress).map_err(|e| SpecError::new("egress", e))?;
    Ok(NetworkRequest::Unrestricted { allow: Some(allow) })
}

/// A thread, its reference checked (it becomes paths and object keys).
pub fn thread_options(t: Thread) -> Result<ThreadOptions, SpecError> {
    let key = ThreadKey::new(&t.namespace, &t.key_name, &t.id).map_err(|e| SpecError::new("thread.ref", e.to_string()))?;
    Ok(ThreadOptions { key, retention: t.retention, max_bytes: t.max_bytes, max_threads: t.max_threads, history: t.history })
}

/// The connectors of a spec, checked and named once each.
fn connectors(list: Vec<warren_core::contract::Connector>) -> Result<Vec<crate::connectors::Grant>, SpecError> {
    let invalid = |msg: String| SpecError::new("connectors", msg);
    if list.len() > crate::connectors::MAX_CONNECTORS {
        return Err(invalid(format!("at most {}", crate::connectors::MAX_CONNECTORS)));
    }
    let grants: Vec<crate::connectors::Grant> = list.into_iter().map(crate::connectors::check).collect::<Result<_, String>>().map_err(invalid)?;
    for (i, g) in grants.iter().enumerate() {
        if grants[..i].iter().any(|o| o.name == g.name) {
            return Err(invalid(format!("{:?} is named twice", g.name)));
        }
    }
    Ok(grants)
}

/// Registry credentials: none, or exactly a `username` and a `password`.
pub fn pull_auth(c: Option<Credentials>) -> Result<warren_image::PullAuth, SpecError> {
    let Some(Credentials(mut c)) = c.filter(|c| !c.0.is_empty()) else { return Ok(warren_image::PullAuth::Anonymous) };
    match (c.remove("username"), c.remove("password")) {
        (Some(username), Some(password)) if c.is_empty() && username.len() <= MAX_PULL_USER && password.len() <= MAX_PULL_PASSWORD => {
            Ok(warren_image::PullAuth::Basic { username, password })
        }
        _ => Err(SpecError::new("image_pull", "must hold exactly a username and a password")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use warren_core::contract::{Connector, Mount};
    use warren_core::egress::EgressRule;
    use warren_core::kinds::{ConnectorKind, Provider};
    use warren_core::{Language, Network};

    fn spec() -> Spec {
        Spec::new(Language::Python, "x", Duration::from_secs(1))
    }

    fn field(s: Spec) -> String {
        Checked::of(s, &NodePolicy::default()).unwrap_err().field
    }

    fn redis(name: &str) -> Connector {
        Connector {
            host: Some("cache".into()),
            credentials: Credentials([("password".to_string(), "x".to_string())].into()),
            ..Connector::new(name, ConnectorKind::Redis)
        }
    }

    #[test]
    fn connectors_are_checked_and_named_once() {
        let ok = Checked::of(Spec { connectors: vec![redis("a"), redis("b")], ..spec() }, &NodePolicy::default()).unwrap();
        assert_eq!((ok.connectors.len(), ok.connectors[0].port), (2, 6379), "the kind's default port");
        for bad in [vec![redis("a"), redis("a")], vec![redis("A")], vec![Connector { custody: true, ..redis("a") }], (0..17).map(|i| redis(&format!("c{i}"))).collect()] {
            assert_eq!(field(Spec { connectors: bad, ..spec() }), "connectors");
        }
    }

    #[test]
    fn network_and_allowlists_are_checked() {
        let rule = |host: &str| EgressRule { host: host.into(), ports: vec![] };
        let net = |network, egress| Checked::of(Spec { network, egress, ..spec() }, &NodePolicy::default()).map(|c| c.network);
        assert_eq!(net(Network::Blocked, vec![]).unwrap(), NetworkRequest::Blocked);
        assert_eq!(net(Network::Unrestricted, vec![]).unwrap(), NetworkRequest::Unrestricted { allow: None });
        assert!(matches!(net(Network::Unrestricted, vec![rule("api.example.com")]).unwrap(), NetworkRequest::Unrestricted { allow: Some(r) } if r.len() == 1));
        for (network, host) in [(Network::Blocked, "api.example.com"), (Network::Unrestricted, "*"), (Network::Unrestricted, "fd00::/8")] {
            assert_eq!(net(network, vec![rule(host)]).unwrap_err().field, "egress", "{host}");
        }
    }

    #[test]
    fn mounts_are_validated() {
        let ok = Checked::of(Spec { mounts: vec![Mount::new("in", Provider::S3, "b"), Mount { read_only: true, ..Mount::new("ref", Provider::S3, "b") }], ..spec() }, &NodePolicy::default()).unwrap();
        assert_eq!((ok.mounts[0].read_only, ok.mounts[1].read_only), (false, true));
        assert_eq!(field(Spec { mounts: vec![Mount::new("..", Provider::S3, "b")], ..spec() }), "mounts[0].mount_path");
    }

    #[test]
    fn threads_are_validated() {
        let t = |ns: &str, id: &str| Thread { namespace: ns.into(), key_name: "k".into(), id: id.into(), retention: None, max_bytes: 10, max_threads: None, history: 50 };
        let ok = thread_options(Thread { retention: Some(Duration::from_secs(604800)), max_threads: Some(5), ..t("default", "t-1") }).unwrap();
        assert_eq!((ok.retention, ok.max_bytes, ok.max_threads, ok.key.rel().as_str()), (Some(Duration::from_secs(604800)), 10, Some(5), "default/k/t-1"));
        for bad in [t("default", "../x"), t("Bad", "t")] {
            assert_eq!(field(Spec { thread: Some(bad), ..spec() }), "thread.ref");
        }
    }

    #[test]
    fn registry_credentials_are_a_user_and_a_password() {
        let creds = |pairs: &[(&str, &str)]| Some(Credentials(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()));
        assert!(matches!(pull_auth(None), Ok(warren_image::PullAuth::Anonymous)));
        assert!(matches!(pull_auth(creds(&[])), Ok(warren_image::PullAuth::Anonymous)));
        assert!(matches!(pull_auth(creds(&[("username", "u"), ("password", "p")])), Ok(warren_image::PullAuth::Basic { .. })));
        for bad in [creds(&[("username", "u")]), creds(&[("username", "u"), ("password", "p"), ("token", "t")])] {
            assert_eq!(pull_auth(bad).unwrap_err().field, "image_pull");
        }
    }
}
