//! Sandbox status. A `host` Sandbox is Ready when its spec passes the
//! checks single-machine mode applies (`host` is warm on every node by
//! definition). An OCI Sandbox is Ready once its image is warm on at least
//! one node: the operator asks every node-agent to pull it (re-resolving
//! the tag at every resync, so a moved tag is warmed again) and records
//! the digest, the interpreters found and the nodes holding it.

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use warren_api::reasons;
use warren_api::sandbox::{Interpreter, WarmFailure};
use warren_api::{Sandbox, SandboxStatus};
use warren_config::types::Language;
use warren_config::Where;

use crate::context::{Context, Error};
use crate::status::{self, now, RESYNC};
use crate::warm;

/// Retry delay while no node has the image.
const RETRY_PULL: Duration = Duration::from_secs(30);

/// What the reconcile concluded.
struct Verdict {
    ok: bool,
    reason: &'static str,
    message: String,
    languages: Vec<Language>,
    interpreters: Vec<Interpreter>,
    image_digest: Option<String>,
    warm_nodes: Vec<String>,
    warm_failures: Vec<WarmFailure>,
    requeue: Duration,
}

impl Verdict {
    fn not_ready(reason: &'static str, message: String, requeue: Duration) -> Verdict {
        Verdict { ok: false, reason, message, languages: Vec::new(), interpreters: Vec::new(), image_digest: None, warm_nodes: Vec::new(), warm_failures: Vec::new(), requeue }
    }
}

/// Reconciles one Sandbox.
pub async fn sandbox(sb: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = sb.namespace().ok_or(Error::NoNamespace)?;
    let at = Where { file: String::new(), object: format!("Sandbox {ns}/{}", sb.name_any()) };
    let verdict = match warren_config::check_sandbox(&at, &sb.spec) {
        Err(e) => Verdict::not_ready(reasons::INVALID_SPEC, e.to_string(), RESYNC),
        Ok(c) if !c.is_oci() => {
            let pods = warm::agent_pods(&ctx).await?;
            let warm_failures = match (&ctx.agents, c.warm.is_empty()) {
                // The host's interpreters try the warm modules (any node's answer).
                (Some(access), false) => warm::summarise(warm::warm_everywhere(access, &pods, "host", None, &c.warm).await).map(|s| failures(s.warm_failures)).unwrap_or_default(),
                _ => Vec::new(),
            };
            let nodes = pods.into_iter().map(|p| p.node).collect();
            let message = format!("image {} is available on every node", c.image);
            Verdict { ok: true, reason: reasons::VALID, message, languages: c.languages, interpreters: Vec::new(), image_digest: None, warm_nodes: nodes, warm_failures, requeue: RESYNC }
        }
        Ok(c) => warm_image(&sb, &ns, &ctx, &c.warm).await?,
    };
    let old = sb.status.clone().unwrap_or_default();
    let conditions = status::ready(verdict.ok, verdict.reason, &verdict.message, sb.meta().generation, &old.conditions, now());
    let new = SandboxStatus {
        conditions,
        observed_generation: sb.meta().generation,
        languages: verdict.languages,
        interpreters: verdict.interpreters,
        image_digest: verdict.image_digest,
        warm_nodes: verdict.warm_nodes,
        warm_failures: verdict.warm_failures,
    };
    if status::differs(&old.conditions, &new.conditions)
        || old.languages != new.languages
        || old.observed_generation != new.observed_generation
        || old.warm_nodes != new.warm_nodes
        || old.image_digest != new.image_digest
        || old.interpreters != new.interpreters
        || old.warm_failures != new.warm_failures
    {
        status::patch(&Api::<Sandbox>::namespaced(ctx.client.clone(), &ns), &sb.name_any(), &new).await?;
        if status::ready_of(&old.conditions) != status::ready_of(&new.conditions) {
            ctx.event(sb.as_ref(), !verdict.ok, verdict.reason, verdict.message).await;
        }
    }
    Ok(Action::requeue(verdict.requeue))
}

/// Warms an OCI Sandbox's image on every node-agent.
async fn warm_image(sb: &Sandbox, ns: &str, ctx: &Context, warm_modules: &warren_core::warm::WarmModules) -> Result<Verdict, Error> {
    let image = &sb.spec.image;
    let Some(access) = &ctx.agents else {
        let why = "the operator has no node-agent credentials (--agent-tls-*), so it cannot warm images".to_string();
        return Ok(Verdict::not_ready(reasons::IMAGE_PULL_FAILED, why, RESYNC));
    };
    let pull = match warm::pull_secret(ctx, ns, sb.spec.image_pull_secret.as_ref().map(|r| r.name.as_str()), image).await? {
        Ok(pull) => pull,
        Err(why) => return Ok(Verdict::not_ready(reasons::IMAGE_PULL_FAILED, why, RETRY_PULL)),
    };
    let pods = warm::agent_pods(ctx).await?;
    let total = pods.len();
    let warm::Summary { digest, nodes, languages: found, warm_failures } = match warm::summarise(warm::warm_everywhere(access, &pods, image, pull.as_ref(), warm_modules).await) {
        Ok(summary) => summary,
        Err(why) => return Ok(Verdict::not_ready(reasons::IMAGE_PULL_FAILED, format!("image {image}: {why}"), RETRY_PULL)),
    };
    let interpreters: Vec<Interpreter> = found
        .iter()
        .filter_map(|(l, version)| Some(Interpreter { language: Language::try_from(*l).ok()?, version: version.clone() }))
        .collect();
    let has: Vec<Language> = interpreters.iter().map(|i| i.language).collect();
    let mut verdict = Verdict {
        ok: true,
        reason: reasons::VALID,
        message: String::new(),
        languages: Vec::new(),
        interpreters,
        image_digest: Some(digest.clone()),
        warm_nodes: nodes,
        warm_failures: failures(warm_failures),
        requeue: RESYNC,
    };
    match offered(&has, sb.spec.languages.as_deref()) {
        Ok(languages) => {
            verdict.languages = languages;
            verdict.message = format!("image {image} warm on {} of {total} nodes at {digest}", verdict.warm_nodes.len());
        }
        Err(missing) => {
            let names: Vec<&str> = missing.iter().map(|l| l.as_str()).collect();
            verdict.ok = false;
            verdict.reason = reasons::LANGUAGE_UNAVAILABLE;
            verdict.message = format!("spec.languages lists {} but image {image} has no such interpreter", names.join(", "));
        }
    }
    Ok(verdict)
}

/// The warm modules that did not load, for the status.
fn failures(list: Vec<warren_proto::agent::WarmFailure>) -> Vec<WarmFailure> {
    list.into_iter()
        .filter_map(|f| Some(WarmFailure { language: Language::try_from(f.language()).ok()?, module: f.module, message: f.message }))
        .collect()
}

/// The languages offered: the spec's (each must be in the image) or, when
/// the spec lists none, all the image has. Errs with the missing ones.
fn offered(has: &[Language], spec: Option<&[Language]>) -> Result<Vec<Language>, Vec<Language>> {
    let mut wanted = spec.map(<[Language]>::to_vec).unwrap_or_else(|| has.to_vec());
    wanted.sort();
    wanted.dedup();
    let missing: Vec<Language> = wanted.iter().copied().filter(|l| !has.contains(l)).collect();
    if missing.is_empty() {
        Ok(wanted)
    } else {
        Err(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_languages_are_the_spec_within_the_image() {
        let has = [Language::Python, Language::Bash];
        assert_eq!(offered(&has, None), Ok(vec![Language::Python, Language::Bash]));
        assert_eq!(offered(&has, Some(&[Language::Bash])), Ok(vec![Language::Bash]));
        assert_eq!(offered(&has, Some(&[Language::Node, Language::Python])), Err(vec![Language::Node]));
    }
}
