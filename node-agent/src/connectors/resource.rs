//! Connectors as a per-execution resource: before the program, the call's
//! credential files on a RAM-backed mount at `/run/warren/connectors`
//! (readable by the sandbox user only), forwarders on the sandbox's
//! loopback to each connector endpoint, and the endpoint names answered by
//! the sandbox's resolver; after the answer, all of it gone.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tonic::async_trait;
use tracing::{debug, warn};
use warren_isolation::wire::Go;
use warren_network::custody::PgLogin;
use warren_network::hashing::HashBudget;
use warren_network::dns::{DnsProxy, Statics};
use warren_core::reach::EndpointPolicy;
use warren_network::forward::{Endpoint, Forwarders};

use super::{render, Grant, Rendered};
use crate::lifecycle::{Resource, SandboxView};
use crate::sandbox::Failure;

/// The mount's size: credentials are small.
const MOUNT_OPTIONS: &str = "size=1m,nr_inodes=256,mode=0555,uid=0,gid=0";

/// One call's connectors.
pub struct ConnectorResource {
    grants: Vec<Grant>,
    rendered: Rendered,
    policy: Arc<EndpointPolicy>,
    mounted: Option<PathBuf>,
    forwarders: Option<Forwarders>,
    /// A `Blocked` sandbox's resolver, answering connector names only.
    dns: Option<DnsProxy>,
    /// An `Unrestricted` sandbox's resolver, and the names added to it.
    added: Option<(Statics, Vec<String>)>,
    /// The SCRAM hashing this sandbox's custody logins may cost the agent.
    hashing: Arc<HashBudget>,
}

impl ConnectorResource {
    /// The resource for `grants` (checked), whose endpoints reach only what
    /// `policy` permits.
    pub fn new(grants: Vec<Grant>, policy: Arc<EndpointPolicy>) -> ConnectorResource {
        let rendered = render(&grants);
        ConnectorResource { grants, rendered, policy, mounted: None, forwarders: None, dns: None, added: None, hashing: Arc::default() }
    }

    fn failure(&self, sandbox: &SandboxView<'_>, step: &str, e: impl std::fmt::Display) -> Failure {
        warn!(execution_id = %sandbox.spec.id, step, error = %e, "connectors could not be set up; nothing ran");
        Failure::CredentialMount(step.to_string())
    }

    /// The RAM-backed mount with the files, owned by the sandbox user.
    fn write_files(&mut self, dir: &Path, owner: u32) -> std::io::Result<()> {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        // `noswap` (Linux 6.4+) keeps credentials out of swap; older kernels mount without it.
        let noswap = format!("{MOUNT_OPTIONS},noswap");
        mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(noswap.as_str()))
            .or_else(|_| mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(MOUNT_OPTIONS)))
            .map_err(std::io::Error::from)?;
        self.mounted = Some(dir.to_path_buf());
        let uid = Some(nix::unistd::Uid::from_raw(owner));
        let gid = Some(nix::unistd::Gid::from_raw(owner));
        for (rel, content) in &self.rendered.files {
            let path = dir.join(rel);
            if let Some(parent) = path.parent().filter(|p| *p != dir) {
                std::fs::create_dir_all(parent)?;
                std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o500))?;
                nix::unistd::chown(parent, uid, gid)?;
            }
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o400).open(&path)?;
            f.write_all(content.as_bytes())?;
            nix::unistd::fchown(&f, uid, gid)?;
        }
        Ok(())
    }

    fn endpoints(&self) -> Vec<Endpoint> {
        self.rendered
            .forwards
            .iter()
            .map(|f| {
                let g = &self.grants[f.grant];
                let custody = g.custody.then(|| {
                    Arc::new(PgLogin {
                        user: g.username.clone().unwrap_or_default(),
                        password: g.credentials.get("password").cloned().unwrap_or_default(),
                        database: g.database.clone(),
                        weak: g.weak,
                        tls: g.tls.clone(),
                        hashing: self.hashing.clone(),
                    })
                });
                Endpoint { listen: f.listen, port: f.port, target_host: f.host.clone(), target_port: f.port, custody, policy: self.policy.clone() }
            })
            .collect()
    }
}

#[async_trait]
impl Resource for ConnectorResource {
    async fn prepare(&mut self, sandbox: &SandboxView<'_>) -> Result<(), Failure> {
        let t0 = std::time::Instant::now();
        // The program's uid inside is its slot's second host id.
        self.write_files(&sandbox.conn_dir, sandbox.host_id + 1).map_err(|e| self.failure(sandbox, "credential files", e))?;
        if self.rendered.forwards.is_empty() {
            return Ok(());
        }
        let netns = warren_network::link::open_netns(sandbox.init_pid).map_err(|e| self.failure(sandbox, "sandbox network namespace", e))?;
        let forwarders = Forwarders::start(&netns, self.endpoints()).await.map_err(|e| self.failure(sandbox, "connector forwarders", e))?;
        self.forwarders = Some(forwarders);
        if !self.rendered.names.is_empty() {
            let statics = match &sandbox.dns_statics {
                Some(s) => s.clone(),
                None => {
                    let bind = || std::net::UdpSocket::bind(warren_network::node::SANDBOX_RESOLVER);
                    let socket = warren_network::link::in_netns(&netns, bind).await.map_err(|e| self.failure(sandbox, "sandbox resolver", e))?;
                    let proxy = DnsProxy::spawn(socket, None).map_err(|e| self.failure(sandbox, "sandbox resolver", e))?;
                    let s = proxy.statics().clone();
                    self.dns = Some(proxy);
                    s
                }
            };
            statics.lock().unwrap_or_else(|p| p.into_inner()).extend(self.rendered.names.iter().map(|(k, v)| (k.clone(), *v)));
            self.added = Some((statics, self.rendered.names.keys().cloned().collect()));
        }
        debug!(execution_id = %sandbox.spec.id, connectors = self.grants.len(), forwarders = self.rendered.forwards.len(), setup_us = t0.elapsed().as_micros() as u64, "connectors ready");
        Ok(())
    }

    fn shape(&self, go: &mut Go) {
        go.env.extend(self.rendered.env.iter().cloned());
    }

    async fn release(self: Box<Self>) {
        let ConnectorResource { forwarders, dns, added, mounted, .. } = *self;
        drop(forwarders);
        drop(dns);
        if let Some((statics, names)) = added {
            let mut s = statics.lock().unwrap_or_else(|p| p.into_inner());
            for n in names {
                s.remove(&n);
            }
        }
        if let Some(dir) = mounted {
            // The sandbox is gone; nothing may still use the files.
            if let Err(e) = umount2(&dir, MntFlags::MNT_DETACH) {
                warn!(dir = %dir.display(), error = %e, "unmounting a call's connector files failed");
            }
        }
    }
}
