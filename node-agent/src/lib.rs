//! Warren's node-agent: the gRPC service (`warren.agent.v1.NodeAgent`) that
//! runs untrusted code in a fresh sandbox per call. The kernel-facing parts
//! live in `warren-isolation`; this crate adds the async runtime around them:
//! the warm pool, output streaming, timeouts and the gRPC edge.
#![forbid(unsafe_code)]

pub mod auth;
pub mod connectors;
pub mod convert;
pub mod cpus;
pub mod executor;
pub mod files;
pub mod frames;
pub mod images;
pub mod keyslots;
pub mod lifecycle;
pub mod live;
pub mod live_rpc;
pub mod output;
pub mod pool;
pub mod refusal;
pub mod running;
pub mod sandbox;
pub mod service;
pub mod slots;
pub mod thread_rpc;
pub mod threads;
pub mod warm_counts;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tracing::{info, warn};
use warren_isolation::cgroup::CgroupLayout;
use warren_isolation::features::Features;
use warren_isolation::spec::NodePolicy;
use warren_proto::agent::node_agent_server::NodeAgentServer;

use crate::executor::{Executor, ExecutorConfig};
use crate::sandbox::SandboxEnv;

/// Command-line flags (each also readable from the environment).
#[derive(Debug, Parser)]
#[command(name = "warren-node-agent", version, about = "Runs untrusted code in fresh sandboxes (gRPC)")]
pub struct Args {
    /// Node name reported to callers (defaults to the hostname).
    #[arg(long, env = "WARREN_NODE_NAME")]
    pub node_name: Option<String>,
    /// Unix socket to serve on (mode 0600).
    #[arg(long, env = "WARREN_AGENT_SOCKET")]
    pub listen_unix: Option<PathBuf>,
    /// TCP address to serve on; requires a token and mutual TLS.
    #[arg(long, env = "WARREN_AGENT_LISTEN")]
    pub listen_tcp: Option<std::net::SocketAddr>,
    /// File holding the shared bearer token callers must present.
    #[arg(long, env = "WARREN_AGENT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// File holding a second token that may only warm images and read
    /// status (the operator's: it never runs code or reads files).
    #[arg(long, env = "WARREN_AGENT_WARM_TOKEN_FILE")]
    pub warm_token_file: Option<PathBuf>,
    /// The agent's TLS certificate (PEM; issued by the agent CA, naming
    /// `warren-node-agent`).
    #[arg(long, env = "WARREN_AGENT_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The agent's TLS private key (PEM).
    #[arg(long, env = "WARREN_AGENT_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA bundle (PEM) a caller's client certificate must chain to: the
    /// gateway CA, never the agent CA.
    #[arg(long, env = "WARREN_AGENT_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Agent state (sandbox mount point; thread state later). Created 0711.
    #[arg(long, env = "WARREN_STATE_DIR", default_value = "/var/lib/warren")]
    pub state_dir: PathBuf,
    /// Path of `warren-sandbox` (defaults to the agent binary's directory).
    #[arg(long, env = "WARREN_SANDBOX_BINARY")]
    pub sandbox_binary: Option<PathBuf>,
    /// Sandboxes kept ready per shape; 0 prepares every sandbox on demand.
    #[arg(long, env = "WARREN_POOL_SIZE", default_value_t = 2)]
    pub pool_size: usize,
    /// Start Python's interpreter in pooled sandboxes ahead of the call
    /// (single-use warm interpreters); `false` starts every program cold.
    #[arg(long, env = "WARREN_WARM_INTERPRETERS", default_value_t = true, action = clap::ArgAction::Set)]
    pub warm_interpreters: bool,
    /// Most memory the warm pool's idle sandboxes (and their interpreters)
    /// hold together (`512Mi`, `2Gi`); the pool stops growing there.
    #[arg(long, env = "WARREN_WARM_POOL_MEMORY", default_value = "1Gi", value_parser = parse_bytes)]
    pub warm_pool_memory: u64,
    /// Concurrent executions accepted; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "WARREN_MAX_EXECUTIONS", default_value_t = 32)]
    pub max_executions: u32,
    /// First host uid/gid used for sandboxes (two per concurrent sandbox).
    #[arg(long, env = "WARREN_UID_BASE", default_value_t = 1_000_000_000)]
    pub uid_base: u32,
    /// Default per-stream output cap in bytes.
    #[arg(long, env = "WARREN_MAX_OUTPUT_BYTES", default_value_t = 1 << 20)]
    pub max_output_bytes: u64,
    /// Name of the cgroup directory (under the agent's own cgroup) holding sandbox groups.
    #[arg(long, env = "WARREN_CGROUP_NAME", default_value = warren_isolation::cgroup::PARENT_NAME)]
    pub cgroup_name: String,
    /// Where threads are durable: `dir:PATH` (default `dir:<state>/thread-store`)
    /// or `s3://BUCKET` (endpoint and credentials from the standard `AWS_*` variables).
    #[arg(long, env = "WARREN_THREAD_STORE")]
    pub thread_store: Option<String>,
    /// S3 store: idle keep-alive connections kept per host (default: the
    /// HTTP client's). 0 opens a connection per request, which avoids ~40 ms
    /// stalls against servers that do not set TCP_NODELAY (s3s-fs).
    #[arg(long, env = "WARREN_S3_POOL_MAX_IDLE")]
    pub s3_pool_max_idle: Option<usize>,
    /// Seconds between thread collector passes (retention, leftovers, idle warm copies).
    #[arg(long, env = "WARREN_THREAD_GC_INTERVAL_SECS", default_value_t = 600)]
    pub thread_gc_interval_secs: u64,
    /// Warm thread copies unused this long are dropped from this node (the store keeps the thread).
    #[arg(long, env = "WARREN_THREAD_WARM_IDLE_SECS", default_value_t = 86400)]
    pub thread_warm_idle_secs: u64,
    /// Seconds a caller may take none of an execution's output before the
    /// execution is killed (its deadline never waits for the caller).
    #[arg(long, env = "WARREN_OUTPUT_STALL_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub output_stall_secs: u64,
    /// Free space thread data never uses on the state directory's disk
    /// (`512Mi`, `2Gi`; `0` turns the floor off). Idle warm copies are
    /// dropped to keep it; a call that still does not fit fails its thread
    /// step instead of filling the disk.
    #[arg(long, env = "WARREN_STATE_RESERVE", default_value = "1Gi", value_parser = parse_bytes)]
    pub state_reserve: u64,
    /// Bytes of object bodies storage mounts keep on the state disk, so a
    /// repeat read of an unchanged object downloads nothing (`0`: none).
    #[arg(long, env = "WARREN_STORAGE_CACHE", default_value = "2Gi", value_parser = parse_bytes)]
    pub storage_cache: u64,
    /// FUSE sessions kept mounted ahead of calls with storage mounts, so a
    /// call binds one instead of mounting (`0`: each call mounts its own).
    #[arg(long, env = "WARREN_STORAGE_FUSE_POOL", default_value_t = 4, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub storage_fuse_pool: u64,
    /// Where OCI images are unpacked (default `<state>/images`).
    #[arg(long, env = "WARREN_IMAGE_STORE")]
    pub image_store: Option<PathBuf>,
    /// Disk the image store keeps within: every pull's unpacking is charged
    /// to it as layers stream in (concurrent pulls share it; a layer that
    /// would pass it is refused), and least-recently-used images not in use
    /// are removed to make room (`0` turns OCI images off).
    #[arg(long, env = "WARREN_IMAGE_DISK", default_value = "20Gi", value_parser = parse_bytes)]
    pub image_disk: u64,
    /// Seconds a call waits for its image to be pulled to this node before
    /// it is refused with UNAVAILABLE (the pull goes on; a retry finds it).
    #[arg(long, env = "WARREN_IMAGE_PULL_WAIT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub image_pull_wait_secs: u64,
    /// Registries (`host:port`) pulled from over plain HTTP; loopback
    /// registries always are. Comma-separated.
    #[arg(long, env = "WARREN_INSECURE_REGISTRIES", value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    /// Address range of `Unrestricted` sandboxes' veths (a /31 each, NATed
    /// on the way out), or `off` to offer only `Blocked` sandboxes.
    #[arg(long, env = "WARREN_SANDBOX_NETWORK", default_value = "100.127.0.0/16")]
    pub sandbox_network: String,
    /// Resolver (`ip:port`) the sandboxes' DNS proxies ask (default: the
    /// first nameserver of the agent's /etc/resolv.conf).
    #[arg(long, env = "WARREN_DNS_UPSTREAM")]
    pub dns_upstream: Option<std::net::SocketAddr>,
    /// Names of this agent's nftables table (`inet warren_<prefix>`) and
    /// sandbox veths (`<prefix><slot>`); 1–6 of [a-z0-9]. One agent per node
    /// needs no other; agents sharing a network namespace need distinct ones.
    #[arg(long, env = "WARREN_NETWORK_PREFIX", default_value = "wrn")]
    pub network_prefix: String,
    /// Directories beneath which `Local` StorageConnections may be mounted
    /// (repeat or comma-separate). None by default: without an admin's
    /// grant no tenant's manifest reaches the node's files. Each must be a
    /// real directory away from the agent's state and the system's own.
    #[arg(long = "local-storage-root", env = "WARREN_LOCAL_STORAGE_ROOTS", value_delimiter = ',')]
    pub local_storage_roots: Vec<PathBuf>,
    /// Destinations (addresses or CIDRs; repeat or comma-separate) that
    /// tenant-named endpoints — Connector hosts, StorageConnection
    /// endpoints, image registries, their token realms and redirects — may
    /// reach although they are the node itself: loopback,
    /// link-local (the metadata service), the agent's and the node's own
    /// addresses. None by default.
    #[arg(long = "allow-endpoint", env = "WARREN_ALLOW_ENDPOINTS", value_delimiter = ',')]
    pub allow_endpoints: Vec<String>,
    /// The node's own address (the chart passes the pod's `status.hostIP`),
    /// refused to tenant endpoints like the agent's own: the kubelet and
    /// whatever else listens on the node.
    #[arg(long, env = "WARREN_NODE_IP")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Seconds a graceful stop (SIGTERM) waits for running executions;
    /// then they are killed (their callers get `node_lost`) and the agent
    /// cleans up and exits. Keep it under the pod's termination grace.
    #[arg(long, env = "WARREN_SHUTDOWN_TIMEOUT_SECS", default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub shutdown_timeout_secs: u64,
    /// Seconds a graceful stop keeps taking new calls before it drains: the
    /// gateways see the pod going (its deletion) and send new calls
    /// elsewhere meanwhile, so a rolling update fails no call that raced it
    /// (the chart sets it; 0, alone on a machine: drain at once).
    #[arg(long, env = "WARREN_SHUTDOWN_DELAY_SECS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=300))]
    pub shutdown_delay_secs: u64,
    /// Log format: `json` or `plain`.
    #[arg(long, env = "WARREN_LOG_FORMAT", default_value = "json", value_parser = ["json", "plain"])]
    pub log_format: String,
    /// Export spans of each execution's phases (W3C trace context from the
    /// caller, or a new trace) to this OpenTelemetry collector, OTLP over
    /// gRPC (`http://HOST:4317`). Unset: no spans, no cost.
    #[arg(long, env = "WARREN_OTLP_ENDPOINT", value_parser = otlp_endpoint)]
    pub otlp_endpoint: Option<String>,
    /// Threads running the agent's async work (gRPC, relaying output);
    /// 0: a quarter of the CPUs it may use, at least one. Setting up and
    /// tearing down sandboxes runs on blocking threads of its own.
    #[arg(long, env = "WARREN_WORKER_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub worker_threads: u16,
}

impl Args {
    /// The async worker threads to start: as asked, or by default a
    /// quarter of `cpus` (at least one). The agent's async side only
    /// relays: at saturation it is a small part of a node's work (the
    /// sandboxes are the rest), and on a small node fewer workers waking
    /// each other cost less CPU per call (see docs/src/benchmarks.md).
    pub fn worker_threads(&self, cpus: usize) -> usize {
        match self.worker_threads {
            0 => (cpus / 4).max(1),
            n => n.into(),
        }
    }
}

fn otlp_endpoint(s: &str) -> Result<String, String> {
    warren_telemetry::otlp::check_endpoint(s).map(|()| s.to_string())
}

/// Says where the state lives and warns when it shares the node's root
/// filesystem: a dedicated disk keeps sandboxes' data away from what the
/// node needs to run.
fn report_state_disk(state: &Path, reserve: u64) {
    let free = threads::disk::free_bytes(state).unwrap_or(0);
    match threads::disk::shares_root(state) {
        Ok(true) => warn!(
            state = %state.display(), free_bytes = free, reserve_bytes = reserve,
            "the state directory is on the root filesystem; give it a dedicated disk (see --state-dir) so thread data cannot crowd out the node"
        ),
        _ => info!(state = %state.display(), free_bytes = free, reserve_bytes = reserve, "state directory on its own filesystem"),
    }
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    warren_core::quantity::bytes(s).ok_or_else(|| format!("{s:?} is not a byte quantity (e.g. 512Mi, 2Gi, 0)"))
}

/// Runs the agent until SIGINT/SIGTERM.
// Long: the start sequence, read in order, destructuring every flag (one line each); each step with logic of its own is a function below.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        node_name,
        listen_unix,
        listen_tcp,
        token_file,
        warm_token_file,
        tls_cert_file,
        tls_key_file,
        tls_client_ca_file,
        state_dir,
        sandbox_binary,
        pool_size,
        warm_interpreters,
        warm_pool_memory,
        max_executions,
        uid_base,
        max_output_bytes,
        cgroup_name,
        thread_store,
        s3_pool_max_idle,
        thread_gc_interval_secs,
        thread_warm_idle_secs,
        output_stall_secs,
        state_reserve,
        storage_cache,
        storage_fuse_pool,
        image_store,
        image_disk,
        image_pull_wait_secs,
        insecure_registries,
        sandbox_network,
        dns_upstream,
        network_prefix,
        local_storage_roots,
        allow_endpoints,
        node_ip,
        shutdown_timeout_secs,
        shutdown_delay_secs,
        log_format: _,
        otlp_endpoint: _,
        worker_threads: _,
    } = args;
    if !nix::unistd::geteuid().is_root() {
        bail!("warren-node-agent must run as root: it creates namespaces, cgroups and id mappings");
    }
    if listen_unix.is_none() && listen_tcp.is_none() {
        bail!("nothing to listen on: pass --listen-unix and/or --listen-tcp");
    }
    let (auth, tcp) = callers(listen_tcp, token_file.as_deref(), warm_token_file.as_deref(), tls_cert_file, tls_key_file, tls_client_ca_file)?;
    // Configuration an admin can get wrong is checked before anything on
    // the node changes (no mount or cgroup is left by a refused start).
    let store_spec = thread_store.unwrap_or_else(|| format!("dir:{}", state_dir.join("thread-store").display()));
    let reserved: Vec<PathBuf> = [Some(state_dir.clone()), image_store.clone(), store_spec.strip_prefix("dir:").map(PathBuf::from), token_file, warm_token_file, sandbox_binary.clone(), std::env::current_exe().ok()]
        .into_iter()
        .flatten()
        .collect();
    // What no Local root may hold or lie inside: everything the agent keeps.
    let local_roots = warren_storage::local::LocalRoots::new(&local_storage_roots, &reserved).map_err(anyhow::Error::msg)?;
    let endpoints = endpoint_policy(&allow_endpoints, node_ip)?;
    for dir in std::iter::once(&state_dir).chain(image_store.as_ref()) {
        traversable(dir)?;
    }
    let (layout, _cgroup_claim, features) = detect(&cgroup_name)?;
    let dirs = prepare_state_dir(&state_dir)?;
    report_thread_homes(&dirs.work, &features.kernel);
    let fuse_pool_dir = state_dir.join("fuse-pool");
    let mounted_dirs = [dirs.homes.clone(), dirs.work.clone(), state_dir.join("proc"), fuse_pool_dir.clone()];
    let store = threads::store::open(&store_spec, s3_pool_max_idle).with_context(|| format!("opening the thread store {store_spec}"))?;
    let threads = Arc::new(threads::Threads::new(store, &state_dir.join("threads")).context("preparing the thread cache")?.with_reserve(state_reserve));
    report_state_disk(&state_dir, state_reserve);
    let supervisor_binary = match sandbox_binary {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("warren-sandbox"),
    };
    if !supervisor_binary.exists() {
        bail!("sandbox supervisor binary not found at {}", supervisor_binary.display());
    }
    let seccomp = warren_isolation::seccomp::compile_programs().context("compiling the seccomp policy")?;
    let mut policy = NodePolicy::default();
    policy.defaults.max_output_bytes = max_output_bytes;
    let slots = slots::Slots::new(max_executions as usize + 8 * pool_size + 8, uid_base);
    // In a container /proc/sys is read-only; the agent's own clean proc (if
    // it mounted one) is not.
    let proc_dir = if state_dir.join("proc/sys").exists() { state_dir.join("proc") } else { PathBuf::from("/proc") };
    let net = start_network(&sandbox_network, dns_upstream, &network_prefix, proc_dir).await?;
    let env = Arc::new(SandboxEnv {
        groups: Arc::new(warren_isolation::cgroup::recycle::Recycler::new(layout)),
        spawner: warren_isolation::launch::Spawner::new(&supervisor_binary, seccomp),
        mount_dir: dirs.mnt,
        host_root: dirs.host_root,
        homes_dir: dirs.homes,
        work_dir: dirs.work,
        slots,
        idle_limits: policy.defaults,
        output_stall: Duration::from_secs(output_stall_secs),
        net: net.clone(),
        warm_starts: Arc::default(),
        warm_failures_logged: Default::default(),
        cpus: Arc::new(cpus::Cpus::of_this_process()),
    });
    let node_name = node_name.unwrap_or_else(|| nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "node".into()));
    let endpoints = Arc::new(endpoints);
    let registries = warren_image::Registries { insecure: insecure_registries, endpoints: endpoints.clone() };
    let (stores, fuse_pool) = storage(&store_spec, s3_pool_max_idle, local_roots, endpoints, state_reserve, &state_dir, storage_cache, storage_fuse_pool, &fuse_pool_dir)?;
    let images = open_images(image_store.unwrap_or_else(|| state_dir.join("images")), image_disk, registries, Duration::from_secs(image_pull_wait_secs))?;
    // A warm start the kernel cannot make indistinguishable from a cold one
    // is not offered.
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    let warm_interpreters = warm_interpreters
        && warren_isolation::sandbox::warm_environ_available(yama.as_deref()).map_err(|why| tracing::warn!(%why, "warm interpreters are off")).is_ok();
    let config = ExecutorConfig { policy, max_executions, pool_size, warm_interpreters, warm_pool_memory, node_name: node_name.clone(), stores, images: images.clone() };
    let exec = Arc::new(Executor::new(env, features, threads.clone(), config));
    tokio::spawn(collect_threads(threads, Duration::from_secs(thread_gc_interval_secs.max(1)), Duration::from_secs(thread_warm_idle_secs)));
    if images.is_some() {
        tokio::spawn(collect_images(exec.clone()));
    }
    info!(node = %node_name, "node-agent starting");
    let served = serve(exec.clone(), listen_unix, tcp, auth, (Duration::from_secs(shutdown_delay_secs), Duration::from_secs(shutdown_timeout_secs))).await;
    stop(&exec, net, fuse_pool, &mounted_dirs, images).await;
    served
}

/// Who may call the agent: the bearer tokens, and the TCP listener with its
/// mutual TLS (never TCP without both).
fn callers(
    listen_tcp: Option<std::net::SocketAddr>,
    token_file: Option<&Path>,
    warm_token_file: Option<&Path>,
    tls_cert_file: Option<PathBuf>,
    tls_key_file: Option<PathBuf>,
    tls_client_ca_file: Option<PathBuf>,
) -> anyhow::Result<(auth::BearerAuth, Option<(std::net::SocketAddr, tonic::transport::ServerTlsConfig)>)> {
    let token = read_token(token_file)?;
    let warm_token = read_token(warm_token_file)?;
    if warm_token.is_some() && (token.is_none() || warm_token == token) {
        bail!("--warm-token-file needs --token-file, and a different token: it is the narrower credential");
    }
    if listen_tcp.is_some() && token.is_none() {
        bail!("--listen-tcp requires --token-file: the agent never serves TCP unauthenticated");
    }
    let tls = warren_proto::tls::TlsFiles::from_flags(tls_cert_file, tls_key_file, tls_client_ca_file).map_err(anyhow::Error::msg)?;
    let tcp = match (listen_tcp, tls) {
        (None, _) => None,
        (Some(addr), Some(tls)) => Some((addr, tls.server_config().context("loading the agent's TLS files")?)),
        (Some(_), None) => bail!(
            "--listen-tcp requires --tls-cert-file, --tls-key-file and --tls-client-ca-file: the agent serves TCP only with mutual TLS"
        ),
    };
    Ok((auth::BearerAuth::new(token).with_warm_token(warm_token), tcp))
}

/// Where tenant endpoints may not go: beyond the policy's fixed ranges,
/// this node's own addresses (every interface's, and `--node-ip`).
fn endpoint_policy(allow: &[String], node_ip: Option<std::net::IpAddr>) -> anyhow::Result<warren_core::reach::EndpointPolicy> {
    let own: Vec<std::net::IpAddr> = nix::ifaddrs::getifaddrs()
        .map(|addrs| addrs.filter_map(|a| a.address.and_then(|s| s.as_sockaddr_in().map(|v4| std::net::IpAddr::V4(v4.ip())).or_else(|| s.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))))).collect())
        .unwrap_or_default();
    warren_core::reach::EndpointPolicy::new(allow, own.into_iter().chain(node_ip).collect()).map_err(anyhow::Error::msg)
}

/// Refuses a directory sandboxes must reach but cannot: they run as
/// unprivileged users that must pass through every parent.
fn traversable(dir: &Path) -> anyhow::Result<()> {
    if let Some((blocked, mode)) = untraversable_ancestor(dir) {
        bail!(
            "sandboxes cannot reach {}: {} is mode {mode:04o}, and sandboxes run as unprivileged users that must pass through every parent \
             (chmod o+x {}, or choose a directory elsewhere)",
            dir.display(),
            blocked.display(),
            blocked.display()
        );
    }
    Ok(())
}

/// The stores storage mounts are served from, and the FUSE session pool
/// mounted ahead of calls (none without `/dev/fuse` or with a size of 0).
#[allow(clippy::too_many_arguments)] // one call site: the agent's flags, named
fn storage(
    store_spec: &str,
    s3_pool_max_idle: Option<usize>,
    local_roots: warren_storage::local::LocalRoots,
    endpoints: Arc<warren_core::reach::EndpointPolicy>,
    state_reserve: u64,
    state_dir: &Path,
    cache_bytes: u64,
    fuse_sessions: u64,
    fuse_pool_dir: &Path,
) -> anyhow::Result<(Arc<warren_storage::stores::Stores>, Option<Arc<warren_storage::pool::FusePool>>)> {
    // Storage mounts share the S3 connection setting of the thread store.
    let platform_bucket = store_spec.strip_prefix("s3://").map(|b| b.split('/').next().unwrap_or(b).to_string());
    let mut stores = warren_storage::stores::Stores::new(s3_pool_max_idle)
        .with_local_roots(local_roots)
        .with_platform_bucket(platform_bucket)
        .with_endpoint_policy(endpoints)
        .with_disk_reserve(state_reserve);
    if cache_bytes > 0 {
        let cache = warren_storage::cache::BodyCache::open(state_dir.join("storage-cache"), cache_bytes).context("preparing the storage cache")?;
        stores = stores.with_cache(Arc::new(cache));
    }
    let fuse_pool = match (fuse_sessions, Path::new("/dev/fuse").exists()) {
        (0, _) | (_, false) => None,
        (n, true) => {
            let left = warren_isolation::home::unmount_below(fuse_pool_dir).unwrap_or(0);
            if left > 0 {
                warn!(dir = %fuse_pool_dir.display(), mounts = left, "unmounted FUSE sessions an earlier run left");
            }
            // Without the pool each call mounts its own session: slower, not broken.
            warren_storage::pool::FusePool::new(fuse_pool_dir, n as usize, tokio::runtime::Handle::current())
                .inspect_err(|e| warn!(error = %e, "no FUSE session pool; calls with storage mount their own"))
                .ok()
        }
    };
    if let Some(pool) = &fuse_pool {
        stores = stores.with_fuse_pool(pool.clone());
    }
    stores = stores.with_platform(threads::store::volume_backend(store_spec, s3_pool_max_idle).context("opening the platform store for volumes")?);
    Ok((Arc::new(stores), fuse_pool))
}

/// A clean stop: running executions drained, networking and FUSE sessions
/// taken down, and every mount the agent made below its state removed.
async fn stop(exec: &Executor, net: Option<Arc<warren_network::NodeNet>>, fuse_pool: Option<Arc<warren_storage::pool::FusePool>>, mounted_dirs: &[PathBuf], images: Option<Arc<images::Images>>) {
    exec.shutdown().await;
    if let Some(net) = net {
        net.stop().await;
    }
    if let Some(pool) = fuse_pool {
        let _ = tokio::task::spawn_blocking(move || pool.drain()).await;
    }
    for dir in mounted_dirs {
        let _ = warren_isolation::home::unmount_below(dir);
    }
    if let Some(images) = images {
        images.store().unmount_all();
    }
}

/// Sets up sandbox networking. A node that cannot (no nftables, no
/// CAP_NET_ADMIN) still runs `Blocked` sandboxes and says why it offers no
/// more; a malformed flag is an error.
async fn start_network(range: &str, upstream: Option<std::net::SocketAddr>, prefix: &str, proc_dir: PathBuf) -> anyhow::Result<Option<Arc<warren_network::NodeNet>>> {
    if range == "off" {
        info!("sandbox networking off (--sandbox-network off): only Blocked sandboxes");
        return Ok(None);
    }
    let sandbox_net = parse_range(range).with_context(|| format!("--sandbox-network {range:?}"))?;
    let scope = warren_network::nft::Scope::new(prefix).with_context(|| format!("--network-prefix {prefix:?}: 1–6 of [a-z0-9], starting with a letter"))?;
    let upstream = match upstream {
        Some(u) => u,
        None => {
            let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            match warren_network::node::first_nameserver(&conf) {
                Some(u) => u,
                None => {
                    warn!("no nameserver in /etc/resolv.conf and no --dns-upstream: only Blocked sandboxes");
                    return Ok(None);
                }
            }
        }
    };
    match warren_network::NodeNet::start(warren_network::NodeNetConfig { sandbox_net, upstream_dns: upstream, scope, proc_dir }).await {
        Ok(net) => {
            info!(range, dns_upstream = %upstream, "sandbox networking ready: Unrestricted sandboxes offered");
            Ok(Some(Arc::new(net)))
        }
        Err(e) => {
            warn!(error = %e, "no sandbox networking: only Blocked sandboxes");
            Ok(None)
        }
    }
}

fn parse_range(range: &str) -> anyhow::Result<(std::net::Ipv4Addr, u8)> {
    let (addr, prefix) = range.split_once('/').context("expected an IPv4 CIDR such as 100.127.0.0/16")?;
    let addr: std::net::Ipv4Addr = addr.parse().context("not an IPv4 address")?;
    let prefix: u8 = prefix.parse().ok().filter(|p| (8..=30).contains(p)).context("prefix must be 8–30")?;
    if u32::from(addr) & !(u32::MAX << (32 - u32::from(prefix))) != 0 {
        bail!("host bits set");
    }
    Ok((addr, prefix))
}

/// Opens the image store (remounting what an earlier run left), or `None`
/// with OCI images turned off.
fn open_images(dir: PathBuf, disk: u64, registries: warren_image::Registries, pull_wait: Duration) -> anyhow::Result<Option<Arc<images::Images>>> {
    if disk == 0 {
        info!("OCI images turned off (--image-disk 0): sandboxes run the host image only");
        return Ok(None);
    }
    let store = warren_image::Store::open(&dir, warren_image::Limits::default(), disk, registries).with_context(|| format!("opening the image store {}", dir.display()))?;
    info!(dir = %dir.display(), images = store.images().len(), bytes = store.bytes(), budget_bytes = disk, "image store ready");
    Ok(Some(Arc::new(images::Images::new(Arc::new(store), pull_wait))))
}

/// Keeps the image store within its disk budget (every minute).
async fn collect_images(exec: Arc<Executor>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(images) = exec.images() {
            images::collect(images, exec.pool(), IMAGE_POOL_IDLE).await;
        }
    }
}

/// An image unused this long stops holding pooled sandboxes, so the
/// collector may remove it when the store is over budget.
const IMAGE_POOL_IDLE: Duration = Duration::from_secs(600);

fn read_token(path: Option<&Path>) -> anyhow::Result<Option<String>> {
    let Some(path) = path else { return Ok(None) };
    let token = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let token = token.trim().to_string();
    if token.len() < 16 {
        bail!("the agent token in {} is shorter than 16 characters", path.display());
    }
    Ok(Some(token))
}

/// The cgroup layout, this agent's claim on its parent groups (held for the
/// agent's life), and the isolation features.
fn detect(cgroup_name: &str) -> anyhow::Result<(CgroupLayout, nix::fcntl::Flock<std::fs::File>, Features)> {
    refuse_private_cgroup_namespace_in_a_container(cgroup_name)?;
    match CgroupLayout::detect(cgroup_name) {
        Ok(layout) => {
            // Before collecting garbage: what another live agent holds is not garbage.
            let claim = layout.claim()?;
            let removed = layout.collect_garbage();
            if removed > 0 {
                warn!(removed, "removed sandbox cgroups left by an earlier run");
            }
            let features = Features::detect(Ok(&layout));
            // A node that cannot run sandboxes is refused now, not call by call.
            if !features.can_run_sandboxes() {
                bail!("this node cannot run sandboxes: {}", features.missing.join("; "));
            }
            Ok((layout, claim, features))
        }
        Err(e) => bail!("no usable cgroup hierarchy: {e}"),
    }
}

/// In a container (masked /proc) whose cgroup namespace is private, the
/// agent's own cgroup reads as `/`: its sandbox groups would land at the root
/// of whatever cgroupfs is mounted (the host's, with the chart's hostPath),
/// outside the pod's limits. Refuse, naming the fix.
fn refuse_private_cgroup_namespace_in_a_container(cgroup_name: &str) -> anyhow::Result<()> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let masked = warren_isolation::proc_mount::proc_is_masked().unwrap_or(false);
    if private_cgroup_namespace_in_a_container(&mountinfo, &own, cgroup_name, masked) {
        bail!(
            "the agent runs in a container with a private cgroup namespace (masked /proc, its cgroup reads as /) and the node has cgroup v2, \
             so it cannot place sandbox cgroups under its own group in the host's tree: run it privileged (chart: nodeAgent.privileged=true; \
             the agent then delegates its own group) or with the host's cgroup namespace"
        );
    }
    Ok(())
}

/// The decision of [`refuse_private_cgroup_namespace_in_a_container`], pure:
/// only the unified hierarchy is placed by the agent's own path, and only a
/// container (masked /proc) is refused, so a v1 node is never affected.
fn private_cgroup_namespace_in_a_container(mountinfo: &str, self_cgroup: &str, cgroup_name: &str, proc_masked: bool) -> bool {
    // The host's cgroupfs seen from a private namespace shows groups above
    // the namespace's root, so no layout may come of it at all.
    let unified = match CgroupLayout::from_proc(mountinfo, self_cgroup, cgroup_name) {
        Ok(layout) => layout.version() == 2,
        Err(_) => warren_isolation::cgroup::parse::cgroup_mounts(mountinfo).iter().any(|m| m.v2),
    };
    unified && proc_masked && self_cgroup.lines().any(|l| l == "0::/")
}

/// Runs the thread collector every `interval`.
async fn collect_threads(threads: Arc<threads::Threads>, interval: Duration, warm_idle: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match threads.collect(warm_idle).await {
            Ok(r) if r != threads::CollectReport::default() => {
                info!(expired = r.expired, orphans = r.orphans, warm_removed = r.warm_removed, "thread collector pass")
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "thread collector pass failed"),
        }
    }
}

/// Asks the kernel once whether thread homes can be mounted here, so an
/// operator learns it at start rather than from a tenant's first call.
fn report_thread_homes(work: &Path, kernel: &str) {
    if let Err(e) = warren_isolation::probe::thread_homes(&work.join("probe")) {
        warn!(
            kernel,
            error = %e,
            "thread homes are unavailable on this node: they need id-mapped mounts of the state directory's filesystem \
             (ext4/xfs/btrfs: Linux 5.12+, tmpfs: 6.3+) under overlayfs (5.19+); calls with a thread_id end with thread_mount_error, \
             everything else works"
        );
    }
}

/// Directories of the agent's state.
struct StateDirs {
    mnt: PathBuf,
    host_root: PathBuf,
    homes: PathBuf,
    work: PathBuf,
}

/// The first existing directory on the way to `dir` (itself included) that
/// others may not pass through, and its mode: sandbox setup runs as the
/// sandbox's unprivileged ids and mounts and binds below the state and
/// image directories, so every call would fail there.
fn untraversable_ancestor(dir: &Path) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt as _;
    let absolute = std::path::absolute(dir).ok()?;
    let mut at = PathBuf::from("/");
    for part in absolute.components().skip(1) {
        at.push(part);
        let Ok(meta) = std::fs::metadata(&at) else { break };
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() && mode & 0o001 == 0 {
            return Some((at, mode));
        }
    }
    None
}

/// Creates `<state>/mnt`, the empty directory sandbox roots are mounted on
/// inside their own mount namespaces (nothing is ever mounted there on the
/// host), the prepared `host` root, and the (shared-mount) home and work dirs,
/// clearing whatever a killed agent left mounted there.
fn prepare_state_dir(state: &Path) -> anyhow::Result<StateDirs> {
    std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
    // Traversable (sandbox init must reach mnt/) but not listable.
    std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o711))?;
    let mnt = state.join("mnt");
    std::fs::create_dir_all(&mnt)?;
    std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o755))?;
    if std::fs::read_dir(&mnt)?.next().is_some() {
        bail!("{} must be empty", mnt.display());
    }
    // In a non-privileged container: a clean proc the sandboxes' own proc
    // mounts need (see warren_isolation::proc_mount).
    if warren_isolation::proc_mount::ensure_visible_proc(&state.join("proc")).context("mounting a visible proc for sandboxes")? {
        info!("/proc is masked (a container): mounted a clean proc for sandbox setup under the state directory");
    }
    let host_root = state.join("hostroot");
    warren_isolation::sandbox::rootfs::prepare_host_root(&host_root).with_context(|| format!("preparing {}", host_root.display()))?;
    // Where an earlier version kept the prepared /etc alone.
    let _ = std::fs::remove_dir_all(state.join("etc"));
    let (homes, work) = (state.join("homes"), state.join("work"));
    for dir in [&homes, &work] {
        let left = warren_isolation::home::unmount_below(dir).with_context(|| format!("reading mounts below {}", dir.display()))?;
        if left > 0 {
            warn!(dir = %dir.display(), mounts = left, "unmounted what an earlier run left");
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    }
    warren_isolation::home::make_shared_tmpfs(&homes).with_context(|| format!("mounting a shared tmpfs on {}", homes.display()))?;
    Ok(StateDirs { mnt, host_root, homes, work })
}

// Long: the Unix and TCP servers and their shared drain, which must see both.
async fn serve(
    exec: Arc<Executor>,
    unix: Option<PathBuf>,
    tcp: Option<(std::net::SocketAddr, tonic::transport::ServerTlsConfig)>,
    auth: auth::BearerAuth,
    (delay, drain_limit): (Duration, Duration),
) -> anyhow::Result<()> {
    let socket_path = unix.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let key_slots = Arc::new(keyslots::KeySlots::default());
    let running = Arc::new(running::Running::default());
    let svc = || NodeAgentServer::with_interceptor(service::AgentService::shared(exec.clone(), key_slots.clone(), running.clone()), auth.clone());
    if let Some(path) = unix {
        let _ = std::fs::remove_file(&path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        info!(socket = %path.display(), "serving gRPC on unix socket");
        let router = tonic::transport::Server::builder().add_service(svc());
        let stop = wait_stop(stop_rx.clone());
        tasks.spawn(async move { router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop).await });
    }
    if let Some((addr, tls)) = tcp {
        let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        info!(addr = %listener.local_addr()?, "serving gRPC on tcp (mutual TLS)");
        // Keepalives find a gateway that vanished without closing its
        // connection, so the key slots its streams held return.
        let router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(20)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .tcp_keepalive(Some(Duration::from_secs(60)))
            .tls_config(tls)
            .context("TLS configuration")?
            .add_service(svc());
        let stop = wait_stop(stop_rx.clone());
        tasks.spawn(async move { router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop).await });
    }
    shutdown_signal().await;
    if !delay.is_zero() {
        info!(delay_secs = delay.as_secs(), "stopping: still taking calls while the gateways see this pod go");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown_signal() => {}
        }
    }
    info!(running = exec.running(), "shutting down: draining in-flight executions");
    let _ = stop_tx.send(true);
    // Drain what runs, not what is connected: an idle client that never acks
    // HTTP/2's GOAWAY must not keep the agent alive; nor may an hour-long
    // execution.
    let drained = tokio::time::timeout(drain_limit, async {
        while exec.running() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    if drained.await.is_err() {
        warn!(running = exec.running(), limit_secs = drain_limit.as_secs(), "executions still running at the shutdown deadline are killed");
        running.cancel_all();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while exec.running() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        if ended.await.is_err() {
            warn!(running = exec.running(), "executions did not end after their kill; cleaning up regardless");
        }
    }
    let grace = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(r) = tasks.join_next().await {
            if let Ok(Err(e)) = r {
                warn!(error = %e, "server ended with an error");
            }
        }
    });
    if grace.await.is_err() {
        tasks.abort_all();
    }
    if let Some(path) = socket_path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

async fn wait_stop(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

#[cfg(test)]
mod tests {
    use super::private_cgroup_namespace_in_a_container as refused;

    #[test]
    fn async_workers_are_a_quarter_of_the_cpus_unless_asked() {
        use clap::Parser as _;
        let args = |extra: &[&str]| super::Args::try_parse_from([&["warren-node-agent"], extra].concat()).unwrap();
        for (cpus, want) in [(1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (64, 16)] {
            assert_eq!(args(&[]).worker_threads(cpus), want, "{cpus} CPUs");
        }
        assert_eq!(args(&["--worker-threads", "3"]).worker_threads(2), 3);
        assert!(super::Args::try_parse_from(["warren-node-agent", "--worker-threads", "257"]).is_err());
    }

    #[test]
    fn a_private_parent_of_the_state_directory_is_found() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(super::untraversable_ancestor(&private.join("state/not-yet")), Some((private.clone(), 0o700)));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(super::untraversable_ancestor(&private.join("state")), None);
    }

    const V2: &str = "30 25 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn only_a_container_in_a_private_unified_cgroup_namespace_is_refused() {
        assert!(refused(V2, "0::/\n", "warren", true), "container, private cgroupns");
        assert!(!refused(V2, "0::/\n", "warren", false), "a host whose agent sits at the root");
        assert!(!refused(V2, "0::/kubepods/pod1/c1\n", "warren", true), "container sharing the host's cgroupns");
        let v1 = "\
31 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
33 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
30 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        let own = "5:memory:/kubepods/c1\n4:pids:/kubepods/c1\n3:cpu,cpuacct:/kubepods/c1\n0::/\n";
        assert!(!refused(v1, own, "warren", true), "v1 controllers are placed by their own paths");
    }
}
