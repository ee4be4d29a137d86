//! Warren's API gateway: the HTTP front door.
//!
//! Authenticates API keys (hashes only, constant-time), validates execute
//! requests, applies the key's effective configuration, picks a node-agent
//! and relays its gRPC stream as one JSON result or NDJSON events. Stateless
//! apart from in-memory admission counters; run as many replicas as needed.

pub mod admission;
pub mod audit;
pub mod auth;
pub mod budget;
pub mod cluster_config;
pub mod console;
pub mod discovery;
pub mod e2b;
pub mod error;
pub mod exec;
pub mod exec_error;
pub mod execute;
pub mod file_urls;
pub mod files;
pub mod http;
mod json;
pub mod ndjson;
pub mod records;
pub mod request_id;
pub mod executions;
pub mod local_config;
pub mod mcp;
pub mod metrics;
pub mod multipart;
pub mod nodes;
pub mod request;
pub mod result;
pub mod terminal;
pub mod sandbase;
pub mod state;
pub mod threads;
pub mod traced;
mod unread;
pub mod uploads;
pub mod webhook;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use tokio::sync::watch;
use tracing::info;
use warren_proto::client::AgentAddress;

/// Command line of `warren-gateway`.
#[derive(Debug, Clone, Parser)]
#[command(name = "warren-gateway", version, about = "Warren API gateway")]
pub struct Args {
    /// Address to serve HTTP on.
    #[arg(long, env = "WARREN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Cluster mode: read the keys the operator publishes in `--keys-namespace`
    /// instead of manifest files.
    #[arg(long, env = "WARREN_CLUSTER")]
    pub cluster: bool,
    /// Warren's namespace, where the node-agent pods run (cluster mode).
    #[arg(long, env = "WARREN_NAMESPACE", default_value = "warren-system")]
    pub namespace: String,
    /// Namespace holding only the keys the operator publishes (cluster
    /// mode; defaults to `--namespace`). A dedicated namespace lets the
    /// gateway's RBAC grant it these Secrets and no others.
    #[arg(long, env = "WARREN_KEYS_NAMESPACE")]
    pub keys_namespace: Option<String>,
    /// Directory of Sandbox, ApiKey and Secret manifests (repeatable).
    #[arg(long = "manifests", env = "WARREN_MANIFESTS", value_delimiter = ',', default_value = "examples/local")]
    pub manifests: Vec<PathBuf>,
    /// Node-agent address, `unix:/path` or `https://host:port` (repeatable;
    /// TCP needs `--agent-tls-*` and the token).
    #[arg(long = "agent", env = "WARREN_AGENTS", value_delimiter = ',', default_value = "unix:/run/warren/agent.sock")]
    pub agents: Vec<AgentAddress>,
    /// Cluster mode: find node-agents as the running pods with these labels
    /// in `--namespace` (instead of `--agent`).
    #[arg(long, env = "WARREN_AGENT_SELECTOR")]
    pub agent_selector: Option<String>,
    /// Cluster mode: only pods this DaemonSet controls are node-agents (the
    /// chart sets it); without it the labels alone decide.
    #[arg(long, env = "WARREN_AGENT_DAEMONSET")]
    pub agent_daemonset: Option<String>,
    /// gRPC port of the discovered node-agent pods.
    #[arg(long, env = "WARREN_AGENT_PORT", default_value_t = 7443)]
    pub agent_port: u16,
    /// File holding the bearer token for TCP node-agents.
    #[arg(long, env = "WARREN_AGENT_TOKEN_FILE")]
    pub agent_token_file: Option<PathBuf>,
    /// The gateway's client certificate for TCP node-agents (PEM; issued by
    /// the gateway CA, the only CA agents accept callers from).
    #[arg(long, env = "WARREN_AGENT_TLS_CERT_FILE")]
    pub agent_tls_cert_file: Option<PathBuf>,
    /// The gateway's client private key (PEM).
    #[arg(long, env = "WARREN_AGENT_TLS_KEY_FILE")]
    pub agent_tls_key_file: Option<PathBuf>,
    /// CA bundle (PEM) agent certificates must chain to: the agent CA.
    #[arg(long, env = "WARREN_AGENT_TLS_CA_FILE")]
    pub agent_tls_ca_file: Option<PathBuf>,
    /// How often manifests are checked for changes, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub reload_interval_ms: u64,
    /// How often node-agents are health-checked, milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub health_interval_ms: u64,
    /// How long a request waits, in order, for capacity that frees as
    /// executions end (its key's concurrency slot, output memory, a node
    /// slot, a record database connection) before 429, milliseconds: a burst
    /// queues instead of failing. Under the SDKs' own request timeouts.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub queue_wait_ms: u64,
    /// Silence after which a stream gets a keepalive line, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub keepalive_ms: u64,
    /// How long a streaming client may read nothing before its execution is
    /// cancelled (its slot, thread and node lease released), milliseconds.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub stream_stall_ms: u64,
    /// Gateway memory for execution output, MiB: each execution reserves
    /// 64 KiB as it is admitted and more as its output arrives, 3 bytes per
    /// byte kept (as text and encoded), up to 6 × its key's maxOutputBytes;
    /// one key may hold half. Keep it well under the gateway's memory limit.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=1 << 20))]
    pub output_budget_mib: u64,
    /// Gateway memory for uploads held whole (E2B multipart forms and bodies
    /// without Content-Length), MiB: each reserves twice its bytes as they
    /// arrive; one key may hold half; past it an upload is refused (429).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=1 << 20))]
    pub upload_budget_mib: u64,
    /// Least average rate of an upload held whole, KiB per second, after
    /// `--body-timeout-ms` of grace; slower ones (and ones silent for the
    /// body timeout) are cut and their memory returned.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub upload_min_kib_per_sec: u64,
    /// The domain live sandboxes' ports are reached under by name:
    /// `<port>-<sandbox id>.<domain>` (point a wildcard DNS record at the
    /// gateway). E2B's `get_host(port)` names it. Without it, ports are
    /// reached by E2B's headers and by `/sandboxes/<id>/ports/<port>/`.
    #[arg(long)]
    pub sandbox_domain: Option<String>,
    /// Most HTTP connections open at once; more clients wait to be accepted.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Longest wait for a request's headers (and between requests on an idle
    /// kept-alive connection), milliseconds.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub header_timeout_ms: u64,
    /// Longest wait for a request's body once its headers arrived, milliseconds.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub body_timeout_ms: u64,
    /// Longest wait for in-flight requests at shutdown, seconds.
    #[arg(long, default_value_t = 3600)]
    pub shutdown_timeout_secs: u64,
    /// The execution record database: `sqlite:///path/records.db` (one
    /// machine; created when missing) or `postgres://user@host/db` (every
    /// replica shares it). The schema is migrated at start.
    #[arg(long, env = "WARREN_RECORDS", default_value = "sqlite:///var/lib/warren/gateway/records.db", hide_env_values = true)]
    pub records: String,
    /// How long execution records are kept after they end, hours.
    #[arg(long, default_value_t = 24 * 30, value_parser = clap::value_parser!(u64).range(1..=24 * 3650))]
    pub record_retention_hours: u64,
    /// How long their stdout, stderr and stream lines are kept, hours.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=24 * 3650))]
    pub output_retention_hours: u64,
    /// Most bytes of stdout (and of stderr) one record keeps.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(0..=64 << 20))]
    pub record_output_max_bytes: u64,
    /// A gateway whose heartbeat is older than this is gone: the executions
    /// it was running end as `failed` / `gateway_lost`, seconds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub record_lease_secs: u64,
    /// A webhook host allowed although it resolves to a private, loopback or
    /// link-local address (an internal receiver), and over http (repeatable).
    #[arg(long = "webhook-allow-host", env = "WARREN_WEBHOOK_ALLOW_HOSTS", value_delimiter = ',')]
    pub webhook_allow_hosts: Vec<String>,
    /// Extra CA certificates (PEM) webhook receivers may chain to (besides the public roots).
    #[arg(long, env = "WARREN_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: Option<PathBuf>,
    /// Webhook attempts before a delivery is `failed`.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=webhook::MAX_ATTEMPTS as i64))]
    pub webhook_attempts: u32,
    /// Delay before a webhook's second attempt, milliseconds; ×4 for each further one (at most an hour).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub webhook_retry_base_ms: u64,
    /// Longest one webhook attempt may take, seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub webhook_timeout_secs: u64,
    /// Public base URL of this gateway (`https://warren.example.com`) for
    /// signed file URLs; without it, the request's Host (and X-Forwarded-Proto).
    #[arg(long, env = "WARREN_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// File holding the key file URLs are signed with (every replica mounts
    /// the same one; created, 0600, when missing). Re-read when it changes:
    /// a rotation ends the URLs signed with the old key.
    #[arg(long, env = "WARREN_FILES_SIGNING_KEY_FILE")]
    pub files_signing_key_file: Option<std::path::PathBuf>,
    /// How long a signed file URL is valid, seconds.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub files_url_ttl_secs: u64,
    /// Largest file upload, MiB (a thread's own size limit also applies).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub files_max_upload_mib: u64,
    /// Serve the admin console on this address (no console without it).
    /// It signs users in with the OpenID provider `--console-oidc-issuer`.
    #[arg(long, env = "WARREN_CONSOLE_LISTEN")]
    pub console_listen: Option<SocketAddr>,
    /// The console's public URL (`https://warren-console.example.com`): the
    /// provider sends browsers back to `<it>/callback`.
    #[arg(long, env = "WARREN_CONSOLE_URL")]
    pub console_url: Option<String>,
    /// The OpenID provider's issuer URL, exactly as it names itself.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_ISSUER")]
    pub console_oidc_issuer: Option<String>,
    /// The console's client id at the provider.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_CLIENT_ID", default_value = "warren-console")]
    pub console_oidc_client_id: String,
    /// File holding the console's client secret at the provider.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_CLIENT_SECRET_FILE")]
    pub console_oidc_client_secret_file: Option<PathBuf>,
    /// Only members of these groups (as the console names them: the groups
    /// claim with its prefix) may sign in to the console (comma-separated;
    /// none: anyone the provider signs in).
    #[arg(long, env = "WARREN_CONSOLE_ALLOWED_GROUPS", value_delimiter = ',')]
    pub console_allowed_groups: Vec<String>,
    /// The ID token claim naming the console's user, as the API server's
    /// `--oidc-username-claim`; `email` counts only with `email_verified: true`.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_USERNAME_CLAIM", default_value = "email")]
    pub console_oidc_username_claim: String,
    /// Put before the username, as `--oidc-username-prefix`: unset, the
    /// issuer URL and `#` for a claim other than `email`; `-`, nothing.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_USERNAME_PREFIX")]
    pub console_oidc_username_prefix: Option<String>,
    /// The ID token claim holding the user's groups, as `--oidc-groups-claim`.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub console_oidc_groups_claim: String,
    /// Put before each group, as `--oidc-groups-prefix` (none by default).
    /// Groups named `system:…` after it are dropped.
    #[arg(long, env = "WARREN_CONSOLE_OIDC_GROUPS_PREFIX", default_value = "")]
    pub console_oidc_groups_prefix: String,
    /// How long a console sign-in's identity and groups are used before
    /// the browser goes through the provider again (which answers at once
    /// while its own session lasts), seconds: a group removed at the
    /// provider stops counting within this time.
    #[arg(long, env = "WARREN_CONSOLE_RECHECK_SECS", default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=28_800))]
    pub console_recheck_secs: u64,
    /// Proxies in front of the console (addresses or CIDR ranges,
    /// comma-separated; typically the ingress controller's pods) whose
    /// `X-Forwarded-For` names the client. Sign-ins under way are bounded
    /// per client; without this, per connecting address.
    #[arg(long, env = "WARREN_CONSOLE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub console_trusted_proxies: Vec<String>,
    /// Single-machine mode, instead of a provider: the local admin signs in
    /// with a one-time link the gateway writes to this file (private to
    /// its user; rewritten after each use).
    #[arg(long, env = "WARREN_CONSOLE_LINK_FILE", conflicts_with_all = ["console_oidc_issuer", "cluster"])]
    pub console_link_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, default_value = "json", value_parser = ["json", "plain"])]
    pub log_format: String,
    /// Export spans of each execution's phases (W3C trace context from the
    /// caller, or a new trace) to this OpenTelemetry collector, OTLP over
    /// gRPC (`http://HOST:4317`). Unset: no spans, no cost.
    #[arg(long, env = "WARREN_OTLP_ENDPOINT", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,
}

fn otlp_endpoint(s: &str) -> Result<String, String> {
    warren_telemetry::otlp::check_endpoint(s).map(|()| s.to_string())
}

/// The console's address and how users sign in, when `--console-listen`
/// asks for one; every other console flag it needs must be there too. A
/// one-time link (`--console-link-file`) is written here.
pub fn console_config(args: &Args) -> anyhow::Result<Option<(SocketAddr, console::app::SignIn)>> {
    let Some(listen) = args.console_listen else { return Ok(None) };
    if let Some(file) = &args.console_link_file {
        let base = args.console_url.clone().unwrap_or_else(|| format!("http://{listen}"));
        let link = console::link::LocalLink::new(file, &base).with_context(|| format!("writing the console's sign-in link to {}", file.display()))?;
        return Ok(Some((listen, console::app::SignIn::Link(link))));
    }
    let (Some(url), Some(issuer), Some(secret_file)) = (&args.console_url, &args.console_oidc_issuer, &args.console_oidc_client_secret_file) else {
        bail!("--console-listen needs --console-url, --console-oidc-issuer and --console-oidc-client-secret-file (or, on one machine, --console-link-file)");
    };
    let client_secret = std::fs::read_to_string(secret_file).with_context(|| format!("reading {}", secret_file.display()))?.trim().to_string();
    if client_secret.is_empty() {
        bail!("{} holds no client secret", secret_file.display());
    }
    let redirect_uri = format!("{}/callback", url.trim_end_matches('/'));
    let claims = console::oidc::ClaimMapping {
        username_claim: args.console_oidc_username_claim.trim().to_string(),
        username_prefix: args.console_oidc_username_prefix.clone(),
        groups_claim: args.console_oidc_groups_claim.trim().to_string(),
        groups_prefix: args.console_oidc_groups_prefix.clone(),
    };
    claims.check().map_err(|e| anyhow::anyhow!("--console-oidc-*-claim / -prefix: {e}"))?;
    let config = console::provider::ProviderConfig { issuer: issuer.clone(), client_id: args.console_oidc_client_id.clone(), client_secret, redirect_uri, claims };
    let allowed_groups: Vec<String> = args.console_allowed_groups.iter().map(|g| g.trim().to_string()).filter(|g| !g.is_empty()).collect();
    // Off a cluster there is no RBAC to ask: whoever signs in may do
    // everything, so who may sign in must be named.
    if !args.cluster && allowed_groups.is_empty() {
        bail!("on one machine the console's provider needs --console-allowed-groups (everyone who signs in is an admin there)");
    }
    Ok(Some((listen, console::app::SignIn::Oidc { config, allowed_groups })))
}

/// The console's bounds and trust: the gateway's body deadline, the
/// re-check interval, the trusted proxies.
pub fn console_settings(args: &Args) -> anyhow::Result<console::app::Settings> {
    let trusted_proxies = console::client::TrustedProxies::parse(&args.console_trusted_proxies).map_err(|e| anyhow::anyhow!("--console-trusted-proxies: {e}"))?;
    Ok(console::app::Settings { body_timeout: Duration::from_millis(args.body_timeout_ms), recheck: Duration::from_secs(args.console_recheck_secs), trusted_proxies })
}

/// Serves the console, when configured, until the task is aborted. In a
/// cluster, what a user sees is the cluster's RBAC's answer.
async fn console_server(args: &Args, limits: http::serve::HttpLimits, state: &state::AppState, client: Option<kube::Client>) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some((listen, sign_in)) = console_config(args)? else { return Ok(None) };
    let settings = console_settings(args)?;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding the console on {listen}"))?;
    let access = match client {
        Some(c) if args.cluster => console::access::Access::Cluster(console::access::ClusterAccess::new(c)),
        _ => console::access::Access::SignedIn,
    };
    info!(addr = %listener.local_addr()?, "console listening");
    let app = console::app::router(console::app::Console::with(sign_in, access, Some(state.clone()), settings));
    Ok(Some(tokio::spawn(http::serve::serve(listener, app, limits, std::future::pending(), Duration::ZERO))))
}

/// Runs the gateway until SIGTERM or Ctrl-C, then drains in-flight requests.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = if args.cluster || args.agent_selector.is_some() {
        Some(kube::Client::try_default().await.context("connecting to the Kubernetes API (cluster mode)")?)
    } else {
        None
    };
    let (nodes, health, discovery) = agents(&args, client.as_ref()).await?;
    let (rx, reload) = keys(&args, client.clone());
    let owner = warren_core::ids::random_id("gw_", 20, &mut |b: &mut [u8]| rand::fill(b));
    let store = open_records(&args.records, Duration::from_millis(args.queue_wait_ms)).await?;
    store.heartbeat(&owner, records::now_ms()).await.context("writing this gateway's heartbeat to the record database")?;
    let retention = records::Retention {
        records: Duration::from_secs(args.record_retention_hours * 3600),
        output: Duration::from_secs(args.output_retention_hours * 3600),
        lease: Duration::from_secs(args.record_lease_secs),
    };
    let files = file_urls(&args, &store).await?;
    let recorder = records::Recorder::start(store.clone(), &owner, args.record_output_max_bytes as usize);
    let tasks = tokio_util::task::TaskTracker::new();
    let webhooks = webhook::Webhooks::new(&webhook_settings(&args))?;
    let webhook_stop = webhooks.clone();
    let takeover = Arc::new(webhook::Takeover { webhooks: webhooks.clone(), recorder: recorder.clone(), keys: rx.clone(), tasks: tasks.clone() });
    let sweep = tokio::spawn(records::sweep_loop(store, owner.clone(), retention, takeover));
    let state = state::AppState {
        keys: rx,
        service: exec::ExecutionService {
            nodes,
            admission: Default::default(),
            budget: budget::OutputBudget::new(args.output_budget_mib << 20),
            metrics: Default::default(),
            queue_wait: Duration::from_millis(args.queue_wait_ms),
            records: recorder.clone(),
        },
        settings: settings(&args, retention.lease),
        uploads: uploads::UploadBudget::new(args.upload_budget_mib << 20),
        webhooks,
        files,
        tasks: tasks.clone(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    info!(addr = %listener.local_addr()?, agents = args.agents.len(), instance = %owner, "gateway listening");
    let limits = http::serve::HttpLimits { max_connections: args.max_connections as usize, header_timeout: Duration::from_millis(args.header_timeout_ms) };
    let stop = async {
        shutdown_signal().await;
        info!("shutting down: draining in-flight requests");
    };
    let drain = Duration::from_secs(args.shutdown_timeout_secs);
    let (console, e2b_sweep) = (console_server(&args, limits, &state, client).await?, tokio::spawn(e2b::sweep_loop(state.clone())));
    http::serve::serve(listener, http::app(state), limits, stop, drain).await;
    finish(webhook_stop, tasks, drain, recorder).await;
    for task in [Some(sweep), Some(e2b_sweep), Some(health), Some(reload), discovery, console].into_iter().flatten() {
        task.abort();
    }
    info!("gateway stopped");
    Ok(())
}

/// Timings of the HTTP edge, from the flags.
fn settings(args: &Args, record_lease: Duration) -> state::Settings {
    state::Settings {
        keepalive: Duration::from_millis(args.keepalive_ms),
        stream_stall: Duration::from_millis(args.stream_stall_ms),
        body_timeout: Duration::from_millis(args.body_timeout_ms),
        upload_min_rate: args.upload_min_kib_per_sec << 10,
        record_lease,
        sandbox_domain: args.sandbox_domain.clone().map(|d| d.trim_matches('.').to_ascii_lowercase()).filter(|d| !d.is_empty()),
    }
}

/// The node-agents: static addresses or, with `--agent-selector`, the
/// DaemonSet's pods as they come and go; health-checked in the background.
async fn agents(args: &Args, client: Option<&kube::Client>) -> anyhow::Result<(Arc<nodes::Nodes>, tokio::task::JoinHandle<()>, Option<tokio::task::JoinHandle<()>>)> {
    let token = match &args.agent_token_file {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?.trim().to_string()),
        None => None,
    };
    let static_agents = if args.agent_selector.is_some() { Vec::new() } else { args.agents.clone() };
    let tls = warren_proto::tls::TlsFiles::from_flags(args.agent_tls_cert_file.clone(), args.agent_tls_key_file.clone(), args.agent_tls_ca_file.clone())
        .map_err(anyhow::Error::msg)?
        .map(|f| f.client_config())
        .transpose()
        .context("loading the gateway's agent TLS files")?;
    if args.agent_selector.is_some() && tls.is_none() {
        bail!("--agent-selector finds TCP node-agents, which need --agent-tls-cert-file, --agent-tls-key-file and --agent-tls-ca-file");
    }
    let nodes = nodes::Nodes::new(&static_agents, token, tls)?;
    nodes.check_all().await;
    let health = tokio::spawn(nodes.clone().health_loop(Duration::from_millis(args.health_interval_ms)));
    let discovery = match (client, &args.agent_selector) {
        (Some(c), Some(sel)) => Some(tokio::spawn(discovery::watch_loop(c.clone(), args.namespace.clone(), sel.clone(), args.agent_daemonset.clone(), args.agent_port, nodes.clone()))),
        _ => None,
    };
    Ok((nodes, health, discovery))
}

/// The API keys: published by the operator (cluster mode) or compiled from
/// the manifest directories, kept current by a background task.
fn keys(args: &Args, client: Option<kube::Client>) -> (watch::Receiver<Arc<auth::KeyStore>>, tokio::task::JoinHandle<()>) {
    if let (true, Some(client)) = (args.cluster, client) {
        let (tx, rx) = watch::channel(Arc::new(auth::KeyStore::default()));
        (rx, tokio::spawn(cluster_config::watch_loop(client, args.keys_namespace.clone().unwrap_or_else(|| args.namespace.clone()), tx)))
    } else {
        let (tx, rx) = watch::channel(Arc::new(local_config::initial(&args.manifests)));
        (rx, tokio::spawn(local_config::watch_loop(args.manifests.clone(), Duration::from_millis(args.reload_interval_ms), tx)))
    }
}

/// Where and how webhooks are delivered.
fn webhook_settings(args: &Args) -> webhook::Settings {
    webhook::Settings {
        allowed: args.webhook_allow_hosts.clone(),
        ca_file: args.webhook_ca_file.clone(),
        attempts: args.webhook_attempts,
        retry_base: Duration::from_millis(args.webhook_retry_base_ms),
        timeout: Duration::from_secs(args.webhook_timeout_secs),
    }
}

/// How file URLs are signed and bounded.
async fn file_urls(args: &Args, store: &records::Store) -> anyhow::Result<Arc<file_urls::Settings>> {
    let signing_key = match &args.files_signing_key_file {
        Some(path) => file_urls::key::SigningKey::from_file(path).with_context(|| format!("the file URL signing key {}", path.display()))?,
        None => {
            tracing::warn!("no --files-signing-key-file: file URLs are signed with a key of this process only (they end with it, and other replicas refuse them)");
            file_urls::key::SigningKey::ephemeral()
        }
    };
    // Earlier releases kept the key in the record database: no longer.
    store.forget_setting("files-signing-key").await.context("removing the old file URL signing key from the record database")?;
    Ok(Arc::new(file_urls::Settings {
        signing_key: Arc::new(signing_key),
        public_url: args.public_url.clone(),
        ttl: Duration::from_secs(args.files_url_ttl_secs),
        max_upload: args.files_max_upload_mib << 20,
    }))
}

/// After the HTTP drain: asynchronous executions have no connection to
/// drain, so they are waited for too (webhooks waiting to retry are left to
/// the next gateway), then the records are flushed.
async fn finish(webhooks: webhook::Webhooks, tasks: tokio_util::task::TaskTracker, drain: Duration, recorder: records::Recorder) {
    webhooks.stop();
    tasks.close();
    if !tasks.is_empty() {
        info!(executions = tasks.len(), "waiting for asynchronous executions");
    }
    if tokio::time::timeout(drain, tasks.wait()).await.is_err() {
        tracing::warn!("asynchronous executions did not finish in time; they end as gateway_lost");
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), recorder.flush()).await;
}


/// Opens the record database, waiting up to a minute for it to accept
/// connections (a database started alongside the gateway may be slower);
/// its calls wait up to `acquire` (the queue wait) for a connection.
async fn open_records(url: &str, acquire: Duration) -> anyhow::Result<records::Store> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match records::Store::open_waiting(url, acquire).await {
            Ok(s) => return Ok(s),
            Err(e @ records::StoreError::Scheme) => return Err(e.into()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(anyhow::Error::new(e).context("opening the execution record database (--records)")),
            Err(e) => {
                tracing::warn!(error = %e, "the execution record database is not available yet; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod start_tests;
