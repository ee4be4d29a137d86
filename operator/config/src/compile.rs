//! Manifests → one [`EffectiveKey`] per valid ApiKey. Pure: no I/O, no clock.
//!
//! Every rule that makes a key unusable is reported as a [`ConfigError`]
//! naming file, object and field; valid keys are compiled regardless, so one
//! bad manifest does not take the others down.

use std::collections::{BTreeMap, HashMap};


use warren_core::bounds::{self, Bound};
use warren_core::{env, ids, path, quantity};

use crate::ceilings::Ceilings;
use crate::effective::{EffectiveKey, Limits};
use crate::error::ConfigError;
use crate::key::{self, KeyHash};
use crate::manifest::{self, Kind, Object, Source};
use crate::narrowing;
use warren_api::reasons;

use crate::storage::Connection;
use warren_core::contract;
use crate::types::{ApiKeySpec, EnvVar, Language, Network, SandboxSpec, SecretBody};

const GIB: u64 = 1 << 30;

/// Result of compiling a set of manifests.
#[derive(Debug, Default)]
pub struct Compiled {
    /// Usable keys.
    pub keys: Vec<EffectiveKey>,
    /// Everything wrong, in input order.
    pub errors: Vec<ConfigError>,
}

impl Compiled {
    /// True when some file could not be parsed at all.
    pub fn has_syntax_errors(&self) -> bool {
        self.errors.iter().any(|e| e.syntax)
    }
}

/// A validated Sandbox, before any key narrows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Root filesystem: `host` or an OCI reference.
    pub image: String,
    /// The digest the operator warmed the image at (see [`SandboxConfig::resolved`]).
    pub image_digest: Option<String>,
    /// Registry credentials from the pull secret.
    pub image_pull: Option<warren_core::secret::Credentials>,
    /// The `imagePullSecret` name (resolved into `image_pull` by the compiler or the operator).
    pub image_pull_secret: Option<String>,
    /// Languages offered.
    pub languages: Vec<Language>,
    /// Per-execution limits.
    pub limits: Limits,
    /// Longest timeout.
    pub max_timeout_seconds: u32,
    /// Network policy.
    pub network: Network,
    /// The egress allowlist (checked), with `Unrestricted`.
    pub egress: Option<Vec<warren_core::egress::Rule>>,
    /// Variables.
    pub env: Vec<EnvVar>,
    /// Thread retention.
    pub thread_retention: crate::types::ThreadRetention,
    /// Largest saved home of one thread.
    pub thread_max_bytes: u64,
    /// Versions a thread's history keeps.
    pub thread_history: u32,
    /// Storage mounts (validated syntactically).
    pub storage: Vec<crate::types::StorageMount>,
    /// Connector names.
    pub connectors: Vec<String>,
    /// Modules its warm interpreters load ahead of the call.
    pub warm: warren_core::warm::WarmModules,
}

impl SandboxConfig {
    /// True for an OCI image (not `host`).
    pub fn is_oci(&self) -> bool {
        self.image != "host"
    }

    /// This Sandbox as the operator warmed it: pinned to `digest`,
    /// offering `languages` (its status: the spec's within the image's),
    /// pulled with `pull`.
    pub fn warmed(mut self, digest: String, languages: Vec<Language>, pull: Option<warren_core::secret::Credentials>) -> SandboxConfig {
        self.image_digest = Some(digest);
        self.languages = languages;
        self.image_pull = pull;
        self
    }

}

/// Compiles `sources`.
pub fn compile(sources: &[Source<'_>]) -> Compiled {
    let (objects, mut errors) = manifest::parse(sources);
    let objects = dedupe(objects, &mut errors);
    let mut sandboxes = HashMap::new();
    let mut sandbox_at = HashMap::new();
    let mut secrets = HashMap::new();
    let mut connections: Map<crate::types::StorageConnectionSpec> = HashMap::new();
    let mut connectors: Map<crate::types::ConnectorSpec> = HashMap::new();
    let mut ceilings: HashMap<String, Result<Ceilings, String>> = HashMap::new();
    for o in objects.iter() {
        match o.kind {
            Kind::Sandbox => match sandbox(o) {
                Ok(s) => {
                    sandboxes.insert((o.namespace.clone(), o.name.clone()), s);
                    sandbox_at.insert((o.namespace.clone(), o.name.clone()), Where::of(o));
                }
                Err(e) => errors.push(e),
            },
            Kind::Secret => match typed::<SecretBody>(o) {
                Ok(s) => {
                    secrets.insert((o.namespace.clone(), o.name.clone()), s);
                }
                Err(e) => errors.push(e),
            },
            Kind::StorageConnection => match spec::<crate::types::StorageConnectionSpec>(o) {
                Ok(sc) => {
                    connections.insert((o.namespace.clone(), o.name.clone()), sc);
                }
                Err(e) => errors.push(e),
            },
            Kind::Connector => match spec::<crate::types::ConnectorSpec>(o) {
                Ok(c) => match crate::connector::check(&c) {
                    Ok(()) => {
                        connectors.insert((o.namespace.clone(), o.name.clone()), c);
                    }
                    Err((field, why)) => errors.push(Checker { at: &Where::of(o), reason: reasons::INVALID_SPEC }.err(field, why)),
                },
                Err(e) => errors.push(e),
            },
            Kind::Namespace => {
                ceilings.insert(o.name.clone(), Ceilings::from_annotations(&o.annotations));
            }
            Kind::ApiKey => {}
        }
    }
    resolve_pull_secrets(&mut sandboxes, &sandbox_at, &secrets, &mut errors);
    let mut keys = Vec::new();
    for o in objects.iter().filter(|o| o.kind == Kind::ApiKey) {
        let ceiling = ceilings.get(&o.namespace).cloned().unwrap_or(Ok(Ceilings::default()));
        match api_key(o, &sandboxes, &secrets, (&connections, &connectors), ceiling) {
            Ok(k) => keys.push((o, k)),
            Err(e) => errors.push(e),
        }
    }
    Compiled { keys: refuse_shared_secrets(keys, &mut errors), errors }
}

/// Reads each Sandbox's `imagePullSecret` (a dockerconfigjson Secret among
/// the manifests); a Sandbox whose secret is missing or unusable is
/// refused, so its keys are too.
fn resolve_pull_secrets(sandboxes: &mut Map<SandboxConfig>, at: &HashMap<(String, String), Where>, secrets: &Map<SecretBody>, errors: &mut Vec<ConfigError>) {
    let mut refused = Vec::new();
    for (id, sb) in sandboxes.iter_mut() {
        let Some(name) = sb.image_pull_secret.clone() else { continue };
        let config = secrets.get(&(id.0.clone(), name.clone())).and_then(|s| match s.string_data.get(".dockerconfigjson") {
            Some(v) => Some(v.as_bytes().to_vec()),
            None => s.data.get(".dockerconfigjson").cloned(),
        });
        let resolved = match config {
            None => Err(format!("Secret {name:?} with a .dockerconfigjson entry is not among the manifests")),
            Some(bytes) => crate::image::pull_credentials(&bytes, &sb.image),
        };
        match resolved {
            Ok(creds) => sb.image_pull = creds,
            Err(why) => {
                let c = Checker { at: &at[id], reason: reasons::INVALID_SPEC };
                errors.push(c.err("spec.imagePullSecret", why));
                refused.push(id.clone());
            }
        }
    }
    for id in refused {
        sandboxes.remove(&id);
    }
}

/// Drops later objects with the same kind, namespace and name.
fn dedupe(objects: Vec<Object>, errors: &mut Vec<ConfigError>) -> Vec<Object> {
    let mut seen: HashMap<(Kind, String, String), String> = HashMap::new();
    let mut out = Vec::new();
    for o in objects {
        let id = (o.kind, o.namespace.clone(), o.name.clone());
        if let Some(first) = seen.get(&id) {
            errors.push(ConfigError::invalid(&o.file, Some(o.id()), "metadata.name", format!("duplicate; first defined in {first}")));
            continue;
        }
        seen.insert(id, o.file.clone());
        out.push(o);
    }
    out
}

/// Two ApiKeys holding the same key value would make the binding
/// ambiguous. The first one (in manifest order) keeps it; every later one is
/// refused with the name of the key that holds it. Refusing both would let
/// anyone who can write an ApiKey switch off someone else's key by pointing
/// `secretRef` at its Secret.
fn refuse_shared_secrets(keys: Vec<(&Object, EffectiveKey)>, errors: &mut Vec<ConfigError>) -> Vec<EffectiveKey> {
    let mut holders: HashMap<KeyHash, String> = HashMap::new();
    let mut out = Vec::new();
    for (o, k) in keys {
        if let Some(holder) = holders.get(&k.hash) {
            errors.push(ConfigError::invalid(&o.file, Some(o.id()), "spec.secretRef", shared_key_message(holder)).because(reasons::SECRET_IN_USE));
        } else {
            holders.insert(k.hash, k.qualified_name());
            out.push(k);
        }
    }
    out
}

/// Why an ApiKey whose key another ApiKey already holds is refused.
pub fn shared_key_message(holder: &str) -> String {
    format!("ApiKey {holder} already holds this key value (the same Secret, or a copy of it); give every ApiKey its own Secret")
}

/// One ApiKey's claim on a key Secret, for [`secret_holder`].
#[derive(Debug, Clone, Copy)]
pub struct SecretClaim<'a> {
    /// The ApiKey's name.
    pub name: &'a str,
    /// Its spec.
    pub spec: &'a ApiKeySpec,
    /// Creation time (Unix seconds); the oldest claim wins, then the lowest name.
    pub created: i64,
}

/// The ApiKey (other than `me`) that holds the Secret entry `me` names, when
/// an older one names it too: then `me` is refused and the holder keeps
/// working. All claims are from one namespace.
pub fn secret_holder<'a>(me: &SecretClaim<'a>, others: &[SecretClaim<'a>]) -> Option<&'a str> {
    let mine = secret_ref(me.name, me.spec);
    others
        .iter()
        .filter(|o| o.name != me.name && secret_ref(o.name, o.spec) == mine)
        .filter(|o| (o.created, o.name) < (me.created, me.name))
        .min_by_key(|o| (o.created, o.name))
        .map(|o| o.name)
}

fn typed<T: serde::de::DeserializeOwned>(o: &Object) -> Result<T, ConfigError> {
    let value = serde_yaml::Value::Mapping(o.body.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        ConfigError::invalid(&o.file, Some(o.id()), &field, e.inner().to_string())
    })
}

fn spec<T: serde::de::DeserializeOwned>(o: &Object) -> Result<T, ConfigError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Envelope<T> {
        spec: T,
    }
    typed::<Envelope<T>>(o).map(|e| e.spec)
}

/// Where an object came from, for error messages: a file in
/// single-machine mode, empty when it came from the API server.
#[derive(Debug, Clone)]
pub struct Where {
    /// File name ("" for API objects).
    pub file: String,
    /// `Kind namespace/name`.
    pub object: String,
}

impl Where {
    fn of(o: &Object) -> Where {
        Where { file: o.file.clone(), object: o.id() }
    }
}

/// Builds field errors for one object.
struct Checker<'a> {
    at: &'a Where,
    /// Condition reason of this object's errors unless a check says otherwise.
    reason: &'static str,
}

impl Checker<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(&self.at.file, Some(self.at.object.clone()), field, message).because(self.reason)
    }

    fn range<T: PartialOrd + std::fmt::Display + Copy>(&self, field: &str, v: T, (lo, hi): (T, T)) -> Result<T, ConfigError> {
        if v < lo || v > hi {
            return Err(self.err(field, format!("{v} is outside {lo}–{hi}")));
        }
        Ok(v)
    }

    fn bound<T: PartialOrd + std::fmt::Display + Copy>(&self, field: &str, v: Option<T>, b: Bound<T>) -> Result<T, ConfigError> {
        self.range(field, v.unwrap_or(b.default), (b.min, b.max))
    }

    fn bytes(&self, field: &str, q: Option<&crate::types::Quantity>, default: u64, b: Bound<u64>) -> Result<u64, ConfigError> {
        let Some(q) = q else { return Ok(default) };
        let v = quantity::bytes(&q.text()).ok_or_else(|| self.err(field, "not a byte quantity (e.g. 512Mi, 1Gi)"))?;
        self.range(field, v, (b.min, b.max))
    }

    fn env(&self, field: &str, vars: &[EnvVar]) -> Result<(), ConfigError> {
        let mut seen = std::collections::HashSet::new();
        for (i, v) in vars.iter().enumerate() {
            let f = format!("{field}[{i}]");
            env::check_var(&v.name, v.value()).map_err(|e| self.err(&f, format!("{}: {e}", env::printable(&v.name))))?;
            if !seen.insert(v.name.as_str()) {
                return Err(self.err(&f, format!("{} is set twice", v.name)));
            }
        }
        if vars.len() > env::MAX_REQUEST_VARS {
            return Err(self.err(field, format!("at most {} variables", env::MAX_REQUEST_VARS)));
        }
        if env::total_bytes(vars.iter().map(|v| (v.name.as_str(), v.value()))) > env::MAX_TOTAL_BYTES {
            return Err(self.err(field, "names and values exceed 64 KiB in total"));
        }
        Ok(())
    }
}

fn sandbox(o: &Object) -> Result<SandboxConfig, ConfigError> {
    check_sandbox(&Where::of(o), &spec(o)?)
}

/// Validates a Sandbox on its own (ranges, quantities, env, offered features).
pub fn check_sandbox(at: &Where, s: &SandboxSpec) -> Result<SandboxConfig, ConfigError> {
    let c = Checker { at, reason: reasons::INVALID_SPEC };
    if s.image != "host" {
        crate::image::check_reference(&s.image).map_err(|why| c.err("spec.image", format!("not an OCI image reference or `host`: {why}")))?;
    }
    if s.image == "host" && s.image_pull_secret.is_some() {
        return Err(c.err("spec.imagePullSecret", "the `host` image is not pulled"));
    }
    let egress = check_egress(&c, s.network, s.egress.as_ref())?;
    let languages = match s.languages.clone() {
        Some(l) if l.is_empty() => return Err(c.err("spec.languages", "must list at least one language")),
        Some(mut l) => {
            l.sort();
            l.dedup();
            l
        }
        None => Language::ALL.to_vec(),
    };
    let limits = sandbox_limits(&c, s)?;
    // A Sandbox's own maximum defaults to the largest a request may ask for.
    let timeout = Bound { default: bounds::TIMEOUT_SECS.max, ..bounds::TIMEOUT_SECS };
    let max_timeout_seconds = c.bound("spec.maxTimeoutSeconds", s.max_timeout_seconds, timeout)?;
    c.env("spec.env", &s.env)?;
    let warm = warm_modules(&c, s.warm.as_ref())?;
    Ok(SandboxConfig {
        image: s.image.clone(),
        image_digest: None,
        image_pull: None,
        image_pull_secret: s.image_pull_secret.as_ref().map(|r| r.name.clone()),
        languages,
        limits,
        max_timeout_seconds,
        network: s.network,
        egress,
        env: s.env.clone(),
        thread_retention: s.thread_retention,
        thread_max_bytes: c.bytes("spec.threadMaxSize", s.thread_max_size.as_ref(), bounds::THREAD_BYTES.default, bounds::THREAD_BYTES)?,
        thread_history: c.bound("spec.threadHistory", s.thread_history, bounds::THREAD_HISTORY)?,
        storage: check_mounts(&c, &s.storage)?,
        connectors: s.connectors.iter().map(|r| r.name.clone()).collect(),
        warm,
    })
}

/// A Sandbox's `resources` and output cap, each within its bound.
fn sandbox_limits(c: &Checker<'_>, s: &SandboxSpec) -> Result<Limits, ConfigError> {
    let r = &s.resources;
    let cpu = match &r.cpu {
        None => None,
        Some(q) => Some(quantity::cpu_millis(&q.text()).ok_or_else(|| c.err("spec.resources.cpu", "not a CPU quantity (e.g. 500m, 2)"))?),
    };
    let cpu_bound = Bound { min: bounds::CPU_MILLIS.min.into(), max: bounds::CPU_MILLIS.max.into(), default: bounds::CPU_MILLIS.default.into() };
    let cpu = c.bound("spec.resources.cpu (millicores)", cpu, cpu_bound)?;
    // Memory scales with CPU (1 GiB per core) unless set.
    let memory = c.bytes("spec.resources.memory", r.memory.as_ref(), cpu * GIB / 1000, bounds::MEMORY_BYTES)?;
    let disk = bounds::DISK_BYTES;
    Ok(Limits {
        cpu_millis: cpu as u32,
        memory_bytes: memory,
        pids: c.bound("spec.resources.pids", r.pids, bounds::PIDS)?,
        tmp_bytes: c.bytes("spec.resources.tmpSize", r.tmp_size.as_ref(), disk.default, disk)?,
        home_bytes: c.bytes("spec.resources.homeSize", r.home_size.as_ref(), disk.default, disk)?,
        max_output_bytes: c.bytes("spec.maxOutputBytes", s.max_output_bytes.as_ref(), bounds::OUTPUT_BYTES.default, bounds::OUTPUT_BYTES)?,
        ..Limits::default()
    })
}

/// `spec.warm`: module names only (never paths), per language.
fn warm_modules(c: &Checker<'_>, warm: Option<&warren_api::sandbox::Warm>) -> Result<warren_core::warm::WarmModules, ConfigError> {
    let python = warm.and_then(|w| w.python.as_ref()).map(|p| p.imports.clone()).unwrap_or_default();
    let node = warm.and_then(|w| w.node.as_ref()).map(|n| n.modules.clone()).unwrap_or_default();
    warren_core::warm::check(Language::Python, &python).map_err(|why| c.err("spec.warm.python.imports", why))?;
    warren_core::warm::check(Language::Node, &node).map_err(|why| c.err("spec.warm.node.modules", why))?;
    Ok(warren_core::warm::WarmModules { python, node })
}

/// An egress section: only with `Unrestricted`, every rule well-formed and
/// able to reach something.
fn check_egress(c: &Checker<'_>, network: Network, egress: Option<&crate::types::Egress>) -> Result<Option<Vec<warren_core::egress::Rule>>, ConfigError> {
    match (network, egress) {
        (_, None) => Ok(None),
        (Network::Blocked, Some(_)) => Err(c.err("spec.egress", "an allowlist needs network: Unrestricted")),
        (Network::Unrestricted, Some(e)) => warren_core::egress::check_manifest_rules(&e.allow).map(Some).map_err(|why| c.err("spec.egress.allow", why)),
    }
}

fn check_mounts(c: &Checker<'_>, mounts: &[crate::types::StorageMount]) -> Result<Vec<crate::types::StorageMount>, ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        if !ids::is_dns_label(&m.name) || !seen.insert(m.name.as_str()) {
            return Err(c.err(&format!("spec.storage[{i}].name"), "must be a unique lower-case name (letters, digits, '-')"));
        }
        if m.prefix.as_deref().is_some_and(|p| path::segments(p).is_none()) {
            return Err(c.err(&format!("spec.storage[{i}].prefix"), "must be whole path segments without '.', '..', empty segments or encoding"));
        }
        match (&m.connection_ref, &m.volume) {
            (Some(_), None) => {}
            (None, Some(v)) if ids::is_dns_label(v) => {}
            (None, Some(_)) => return Err(c.err(&format!("spec.storage[{i}].volume"), "must be a lower-case name (letters, digits, '-')")),
            _ => return Err(c.err(&format!("spec.storage[{i}]"), "give exactly one of connectionRef and volume")),
        }
        let b = bounds::STORAGE_WRITE_BYTES;
        c.bytes(&format!("spec.storage[{i}].maxWriteBytes"), m.max_write_bytes.as_ref(), b.default, b)?;
    }
    Ok(mounts.to_vec())
}

type Map<T> = HashMap<(String, String), T>;

fn api_key(
    o: &Object,
    sandboxes: &Map<SandboxConfig>,
    secrets: &Map<SecretBody>,
    (connections, connectors): (&Map<crate::types::StorageConnectionSpec>, &Map<crate::types::ConnectorSpec>),
    ceilings: Result<Ceilings, String>,
) -> Result<EffectiveKey, ConfigError> {
    let k: ApiKeySpec = spec(o)?;
    let sb = sandboxes.get(&(o.namespace.clone(), k.sandbox_ref.name.clone()));
    let (secret_name, _) = secret_ref(&o.name, &k);
    let secret = secrets.get(&(o.namespace.clone(), secret_name));
    let ns = &o.namespace;
    let connection = |c: &str| {
        let spec = connections.get(&(ns.clone(), c.to_string()))?;
        let creds = spec.credentials_secret_ref.as_ref().and_then(|r| secrets.get(&(ns.clone(), r.name.clone())));
        Some(crate::storage::connection(spec, creds))
    };
    let connector = |c: &str| {
        let spec = connectors.get(&(ns.clone(), c.to_string()))?;
        let creds = secrets.get(&(ns.clone(), spec.credentials_secret_ref.name.clone()));
        Some(crate::connector::resolve(c, spec, creds))
    };
    effective_key(&Where::of(o), &o.namespace, &o.name, &k, sb, secret, Lookups { connection: &connection, connector: &connector }, ceilings)
}

/// The Secret (name, entry) holding an ApiKey's key.
pub fn secret_ref(api_key_name: &str, k: &ApiKeySpec) -> (String, String) {
    match &k.secret_ref {
        Some(r) => (r.name.clone(), r.key.clone()),
        None => (format!("{api_key_name}-key"), "key".to_string()),
    }
}

/// Compiles one ApiKey against its (validated) Sandbox and its Secret,
/// enforcing that the key only narrows the Sandbox and stays under its
/// namespace's ceilings (or their parse error). The operator calls this with
/// objects from the API server; `compile` with objects from files.
#[allow(clippy::too_many_arguments)]
// Long: every narrowing check of an ApiKey against its Sandbox, in the order their errors are reported.
pub fn effective_key(
    at: &Where,
    namespace: &str,
    name: &str,
    k: &ApiKeySpec,
    sandbox: Option<&SandboxConfig>,
    secret: Option<&SecretBody>,
    lookups: Lookups<'_>,
    ceilings: Result<Ceilings, String>,
) -> Result<EffectiveKey, ConfigError> {
    let c = Checker { at, reason: reasons::INVALID_NARROWING };
    let sb = sandbox.ok_or_else(|| {
        c.err("spec.sandboxRef.name", format!("no valid Sandbox {:?} in namespace {namespace}", k.sandbox_ref.name)).because(reasons::SANDBOX_NOT_FOUND)
    })?;
    // Only an admin's Namespace annotation lends the node's identity.
    let ambient = ceilings.as_ref().is_ok_and(|c| c.ambient_identity);
    let storage = effective_mounts(&c, namespace, k, sb, lookups.connection, ambient)?;
    let connectors = effective_connectors(&c, k, sb, lookups.connector)?;
    let max_timeout_seconds = match k.max_timeout_seconds {
        None => sb.max_timeout_seconds,
        Some(t) => c.range("spec.maxTimeoutSeconds", t, (bounds::TIMEOUT_SECS.min, sb.max_timeout_seconds))?,
    };
    let max_concurrency = c.bound("spec.maxConcurrency", k.max_concurrency, bounds::CONCURRENCY)?;
    let max_threads = c.bound("spec.maxThreads", k.max_threads, bounds::THREADS)?;
    let max_live_sandboxes = c.bound("spec.maxLiveSandboxes", k.max_live_sandboxes, bounds::LIVE_SANDBOXES)?;
    let max_live_seconds = c.bound("spec.maxLiveSeconds", k.max_live_seconds, bounds::LIVE_SECONDS)?;
    let b = bounds::LIVE_IDLE_SECONDS;
    let live_idle_seconds = k.live_idle_seconds.map(|v| c.range("spec.liveIdleSeconds", v, (b.min, b.max))).transpose()?.unwrap_or(b.default);
    // Narrowing only: Unrestricted may become Blocked, never the reverse.
    let network = sb
        .network
        .narrowed(k.network)
        .ok_or_else(|| c.err("spec.network", "Unrestricted would widen the Sandbox's Blocked network; a key may only narrow it"))?;
    let own = check_egress(&c, network, k.egress.as_ref())?;
    let egress = match network {
        Network::Blocked => None,
        Network::Unrestricted => warren_core::egress::narrow(sb.egress.as_deref(), own.as_deref()).map_err(|e| c.err("spec.egress.allow", e))?,
    };
    c.env("spec.env", &k.env)?;
    let mut env: BTreeMap<String, String> = sb.env.iter().map(|v| (v.name.clone(), v.value().to_string())).collect();
    env.extend(k.env.iter().map(|v| (v.name.clone(), v.value().to_string())));
    let webhook_secret = webhook_secret(&c, secret)?;
    let secret = secret_value(&c, namespace, name, k, secret)?;
    let key = EffectiveKey {
        namespace: namespace.to_string(),
        name: name.to_string(),
        sandbox: k.sandbox_ref.name.clone(),
        hash: KeyHash::of(&secret),
        e2b_hash: Some(KeyHash::of(&key::e2b_alias(&secret))),
        display_prefix: key::display_prefix(&secret),
        disabled: k.disabled,
        max_timeout_seconds,
        max_concurrency,
        max_threads,
        max_live_sandboxes,
        max_live_seconds,
        live_idle_seconds,
        public_ports: k.public_ports.unwrap_or(false),
        webhook_secret,
        audit_namespace: k.audit_scope == Some(warren_api::apikey::AuditScope::Namespace),
        image: sb.image.clone(),
        image_digest: sb.image_digest.clone(),
        image_pull: sb.image_pull.clone(),
        languages: sb.languages.clone(),
        limits: sb.limits,
        network,
        egress: egress.map(|rules| rules.iter().map(warren_core::egress::Rule::to_wire).collect()),
        env: env.into_iter().collect(),
        thread_retention: sb.thread_retention,
        thread_max_bytes: sb.thread_max_bytes,
        thread_history: sb.thread_history,
        storage,
        connectors,
        warm: sb.warm.clone(),
    };
    let over = Checker { at, reason: reasons::CEILING_EXCEEDED };
    match ceilings.map(|c| c.exceeded_by(&key)) {
        Err(why) => Err(over.err("metadata.namespace", why)),
        Ok(Some((field, why))) => Err(over.err(field, why)),
        Ok(None) => Ok(key),
    }
}

/// The key's mounts: every Sandbox mount on its connection, narrowed by
/// the key (prefixes only go deeper, by whole segments; modes only become
/// read-only). Connectors are checked to be a subset of the Sandbox's.
// Long: every check of a key's mount narrowing (prefix by whole segments, mode, connection, sub-path) per mount, in reporting order.
fn effective_mounts(
    c: &Checker<'_>,
    namespace: &str,
    k: &ApiKeySpec,
    sb: &SandboxConfig,
    connection: &dyn Fn(&str) -> Option<Result<Connection, String>>,
    ambient: bool,
) -> Result<Vec<contract::Mount>, ConfigError> {
    for (i, n) in k.storage.iter().enumerate() {
        if !sb.storage.iter().any(|m| m.name == n.name) {
            return Err(c.err(&format!("spec.storage[{i}].name"), format!("the Sandbox has no mount named {:?}", n.name)));
        }
    }
    let mut out = Vec::with_capacity(sb.storage.len());
    for m in &sb.storage {
        let field = match k.storage.iter().position(|n| n.name == m.name) {
            Some(i) => format!("spec.storage[{i}]"),
            None => "spec.sandboxRef.name".to_string(),
        };
        let (store, base) = match (&m.connection_ref, &m.volume) {
            (_, Some(volume)) => (None, crate::storage::volume_prefix(namespace, volume)),
            (Some(r), None) => {
                let conn = connection(&r.name)
                    .ok_or_else(|| c.err(&field, format!("StorageConnection {:?} of mount {:?} was not found", r.name, m.name)))?
                    .map_err(|why| c.err(&field, format!("StorageConnection {:?} of mount {:?}: {why}", r.name, m.name)))?;
                let base = conn.spec.prefix.clone().unwrap_or_default();
                (Some(conn), base)
            }
            (None, None) => return Err(c.err(&field, "the mount names neither a connection nor a volume")),
        };
        let full = |m: &crate::types::StorageMount| path::join(&base, m.prefix.as_deref().unwrap_or(""));
        let (prefix, mode) = match k.storage.iter().find(|n| n.name == m.name) {
            Some(n) => narrowing::narrow_mount(&sb.storage, full, n).map_err(|e| c.err(&field, e))?,
            None => (full(m), m.mode),
        };
        // Validated with the Sandbox.
        let max_write_bytes = m.max_write_bytes.as_ref().and_then(|q| quantity::bytes(&q.text())).unwrap_or(bounds::STORAGE_WRITE_BYTES.default);
        let read_only = mode == crate::types::MountMode::ReadOnly;
        out.push(match store {
            Some(conn) => contract::Mount {
                name: m.name.clone(),
                ambient_identity: ambient && conn.credentials.0.is_empty() && conn.spec.provider != crate::types::StorageProvider::Local,
                provider: crate::storage::provider(conn.spec.provider),
                bucket: conn.spec.bucket.clone(),
                prefix,
                read_only,
                endpoint: conn.spec.endpoint.clone(),
                region: conn.spec.region.clone(),
                credentials: conn.credentials,
                max_write_bytes,
            },
            None => contract::Mount {
                name: m.name.clone(),
                provider: warren_core::kinds::Provider::Volume,
                bucket: String::new(),
                prefix,
                read_only,
                endpoint: None,
                region: None,
                credentials: Default::default(),
                max_write_bytes,
                ambient_identity: false,
            },
        });
    }
    Ok(out)
}

/// Where a key's referenced objects come from: the manifests (`compile`)
/// or the API server (the operator).
pub struct Lookups<'a> {
    /// A StorageConnection with its credentials, by name.
    pub connection: &'a dyn Fn(&str) -> Option<Result<Connection, String>>,
    /// A Connector with its credentials, by name.
    pub connector: &'a dyn Fn(&str) -> Option<Result<contract::Connector, String>>,
}

/// The key's connectors: a subset of the Sandbox's (all of them unless the
/// key chooses), each found and with its credentials.
fn effective_connectors(
    c: &Checker<'_>,
    k: &ApiKeySpec,
    sb: &SandboxConfig,
    connector: &dyn Fn(&str) -> Option<Result<contract::Connector, String>>,
) -> Result<Vec<contract::Connector>, ConfigError> {
    let offered: Vec<&str> = sb.connectors.iter().map(String::as_str).collect();
    let chosen: Option<Vec<&str>> = k.connectors.as_ref().map(|l| l.iter().map(|r| r.name.as_str()).collect());
    let names = narrowing::narrow_connectors(&offered, chosen.as_deref()).map_err(|e| c.err("spec.connectors", e))?;
    let field = if k.connectors.is_some() { "spec.connectors" } else { "spec.sandboxRef.name" };
    let mut out: Vec<contract::Connector> = Vec::with_capacity(names.len());
    for name in names {
        if out.iter().any(|o| o.name == name) {
            continue;
        }
        let found = connector(name).ok_or_else(|| c.err(field, format!("Connector {name:?} was not found")))?;
        out.push(found.map_err(|why| c.err(field, format!("Connector {name:?}: {why}")))?);
    }
    Ok(out)
}

/// Reads the key from its Secret. The value is never put in an error.
/// The entry of the key's Secret that signs its webhooks.
pub const WEBHOOK_SECRET_ENTRY: &str = "webhook-secret";

/// The key's webhook signing secret, when its Secret has one.
fn webhook_secret(c: &Checker<'_>, s: Option<&SecretBody>) -> Result<Option<warren_core::secret::SigningSecret>, ConfigError> {
    let Some(s) = s else { return Ok(None) };
    let value = match (s.string_data.get(WEBHOOK_SECRET_ENTRY), s.data.get(WEBHOOK_SECRET_ENTRY)) {
        (Some(v), _) => v.clone(),
        (None, Some(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        (None, None) => return Ok(None),
    };
    let c = &Checker { at: c.at, reason: reasons::SECRET_INVALID };
    warren_core::secret::SigningSecret::new(&value)
        .map(Some)
        .ok_or_else(|| c.err("spec.secretRef", format!("entry {WEBHOOK_SECRET_ENTRY:?} must be 32–256 printable ASCII characters")))
}

fn secret_value(c: &Checker<'_>, namespace: &str, key_name: &str, k: &ApiKeySpec, s: Option<&SecretBody>) -> Result<String, ConfigError> {
    let (name, entry) = secret_ref(key_name, k);
    let field = "spec.secretRef";
    let c = &Checker { at: c.at, reason: reasons::SECRET_INVALID };
    let s = s.ok_or_else(|| c.err(field, format!("Secret {namespace}/{name} not found")))?;
    let value = match (s.string_data.get(&entry), s.data.get(&entry)) {
        (Some(v), _) => v.clone(),
        (None, Some(bytes)) => String::from_utf8(bytes.clone()).map_err(|_| c.err(field, format!("Secret {name} entry {entry:?} is not UTF-8")))?,
        (None, None) => return Err(c.err(field, format!("Secret {name} has no entry {entry:?}"))),
    };
    let value = value.trim().to_string();
    if !key::is_well_formed(&value) {
        return Err(c.err(field, format!("Secret {name} entry {entry:?} is not a Warren key ({}+ 32–128 letters and digits)", key::PREFIX)));
    }
    Ok(value)
}
