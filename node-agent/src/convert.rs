//! proto ⇄ domain conversions of the calls besides Execute, whose request
//! is read by the contract's wire edge (`warren_proto::spec`) and checked
//! in `crate::executor::Checked`. Errors become statuses in `crate::refusal`.

use tonic::Status;
use warren_core::contract::Thread;
use warren_core::secret::Credentials;
use warren_isolation::features::Features;
use warren_proto::agent as pb;

use crate::executor;
use crate::refusal::{self, invalid};
use crate::threads::{ThreadKey, ThreadOptions};

/// Registry credentials: none, or a `username` and `password`.
pub fn pull_auth(c: Option<pb::Credentials>) -> Result<warren_image::PullAuth, Status> {
    executor::pull_auth(c.map(|c| Credentials(c.values.into_iter().collect()))).map_err(|e| refusal::status(&e))
}

/// A warm image → proto.
pub fn warmed(w: crate::executor::WarmedImage) -> pb::WarmImageResponse {
    pb::WarmImageResponse {
        digest: w.digest,
        languages: w.languages.into_iter().map(|(l, version)| pb::ImageLanguage { language: pb::Language::from(l) as i32, version }).collect(),
        bytes: w.bytes,
        warm_failures: w
            .warm_failures
            .into_iter()
            .map(|(l, module, message)| pb::WarmFailure { language: pb::Language::from(l) as i32, module, message })
            .collect(),
    }
}

/// The modules a warm-image request tries, per language.
pub fn warm_modules(list: Vec<pb::WarmModules>) -> Result<warren_core::warm::WarmModules, Status> {
    let mut out = warren_core::warm::WarmModules::default();
    for w in list {
        let language = pb::Language::try_from(w.language).ok().and_then(|l| warren_core::Language::try_from(l).ok());
        let target = match language {
            Some(warren_core::Language::Python) => &mut out.python,
            Some(warren_core::Language::Node) => &mut out.node,
            _ => return Err(invalid("warm.language", "python or node")),
        };
        target.extend(w.modules);
    }
    for l in [warren_core::Language::Python, warren_core::Language::Node] {
        warren_core::warm::check(l, out.of(l)).map_err(|why| invalid("warm.modules", &why))?;
    }
    Ok(out)
}

/// The thread of a file request, checked.
pub fn thread_options(t: pb::ThreadOptions) -> Result<ThreadOptions, Status> {
    let thread = Thread::try_from(t).map_err(|e| refusal::status(&e))?;
    executor::thread_options(thread).map_err(|e| refusal::status(&e))
}

/// A thread reference, validated.
pub fn thread_key(r: Option<pb::ThreadRef>) -> Result<ThreadKey, Status> {
    let r = r.ok_or_else(|| invalid("thread.ref", "required"))?;
    ThreadKey::new(&r.namespace, &r.key_name, &r.thread_id).map_err(|e| invalid("thread.ref", &e.to_string()))
}

/// Features → proto.
pub fn features(f: &Features, network: bool) -> pb::IsolationFeatures {
    pb::IsolationFeatures {
        cgroup_version: f.cgroup_version,
        cgroup_controllers: f.cgroup_controllers.clone(),
        user_namespaces: f.user_namespaces,
        seccomp: f.seccomp,
        overlayfs: f.overlayfs,
        missing: f.missing.clone(),
        network,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;
    use warren_proto::agent::RefusalReason as Reason;
    use warren_proto::refusal::refusal_of;

    #[test]
    fn file_threads_are_read_and_checked() {
        let r = |ns: &str, id: &str| Some(pb::ThreadRef { namespace: ns.into(), key_name: "k".into(), thread_id: id.into() });
        let ok = thread_options(pb::ThreadOptions { r#ref: r("default", "t-1"), retention_seconds: 0, max_bytes: 10, max_threads: 0, history_versions: 0 }).unwrap();
        assert_eq!((ok.retention, ok.max_bytes, ok.max_threads, ok.key.rel().as_str()), (None, 10, None, "default/k/t-1"));
        for bad in [
            pb::ThreadOptions { r#ref: r("default", "../x"), retention_seconds: 0, max_bytes: 1, max_threads: 0, history_versions: 0 },
            pb::ThreadOptions { r#ref: r("default", "t"), retention_seconds: 0, max_bytes: 0, max_threads: 0, history_versions: 0 },
            pb::ThreadOptions { r#ref: None, retention_seconds: 0, max_bytes: 1, max_threads: 0, history_versions: 0 },
        ] {
            let s = thread_options(bad).unwrap_err();
            assert_eq!((s.code(), refusal_of(&s).0), (Code::InvalidArgument, Reason::InvalidField));
        }
    }

    #[test]
    fn registry_credentials_refusals_name_the_field() {
        let s = pull_auth(Some(pb::Credentials { values: [("token".to_string(), "t".to_string())].into() })).unwrap_err();
        assert_eq!((s.code(), refusal_of(&s)), (Code::InvalidArgument, (Reason::InvalidField, "image_pull".to_string())));
    }
}
