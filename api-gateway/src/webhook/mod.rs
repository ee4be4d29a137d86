//! Webhook delivery of asynchronous executions: once the execution's record
//! is final, its status object is POSTed to the caller's `webhook_url`,
//! signed with the key's webhook secret, retried with backoff, and the
//! outcome recorded (`webhook_delivery_status`).
//!
//! Receivers verify `Warren-Signature: v1=<hex>` = HMAC-SHA256(secret,
//! `"{Warren-Webhook-Timestamp}.{raw body}"`), and refuse old timestamps.

pub mod policy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use warren_core::secret::SigningSecret;

use crate::records::{Recorder, Row};
pub use policy::{Allowed, Refusal};

/// Most attempts allowed by `--webhook-attempts`.
pub const MAX_ATTEMPTS: u32 = 20;

/// How webhooks are sent.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Hosts allowed despite a private or loopback address (and over http).
    pub allowed: Vec<String>,
    /// Extra CA certificates (PEM) webhook servers may chain to.
    pub ca_file: Option<std::path::PathBuf>,
    /// Attempts before `failed`.
    pub attempts: u32,
    /// Delay before the second attempt; ×4 for each further one.
    pub retry_base: Duration,
    /// Longest one attempt may take.
    pub timeout: Duration,
}

/// The webhook sender; cheap to clone.
#[derive(Debug, Clone)]
pub struct Webhooks {
    client: reqwest::Client,
    allowed: Arc<Allowed>,
    attempts: u32,
    retry_base: Duration,
    /// Set when the gateway stops: deliveries waiting to retry leave their
    /// record `pending`, for the next gateway to take over.
    stopping: tokio_util::sync::CancellationToken,
}

/// A delivery to make once an execution ends.
#[derive(Debug, Clone)]
pub struct Hook {
    /// The checked URL.
    pub url: reqwest::Url,
    /// The key's signing secret.
    pub secret: SigningSecret,
}

impl Webhooks {
    /// A sender with `s`.
    pub fn new(s: &Settings) -> anyhow::Result<Webhooks> {
        let allowed = Arc::new(Allowed::new(&s.allowed));
        let guard = allowed.clone();
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 5 {
                return attempt.error(Refusal::Url("more than 5 redirects"));
            }
            match policy::check_url(attempt.url().as_str(), &guard) {
                Ok(_) => attempt.follow(),
                Err(r) => attempt.error(r),
            }
        });
        let mut b = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver(allowed.clone())))
            .redirect(redirects)
            .no_proxy()
            .timeout(s.timeout)
            .connect_timeout(s.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("warren-webhook/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &s.ca_file {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).context("--webhook-ca-file: not a PEM certificate bundle")? {
                b = b.add_root_certificate(cert);
            }
        }
        Ok(Webhooks {
            client: b.build().context("building the webhook client")?,
            allowed,
            attempts: s.attempts.clamp(1, MAX_ATTEMPTS),
            retry_base: s.retry_base,
            stopping: Default::default(),
        })
    }

    /// Stops waiting to retry (at shutdown): those records stay `pending`
    /// and another gateway (or this one's successor) delivers them.
    pub fn stop(&self) {
        self.stopping.cancel();
    }

    /// Checks a request's `webhook_url` at submit time.
    pub fn check(&self, url: &str) -> Result<reqwest::Url, Refusal> {
        policy::check_url(url, &self.allowed)
    }

    /// Delivers the final record of `trace_id` to `hook`, recording the
    /// outcome. Waits for the execution's end to be committed first.
    pub async fn deliver(&self, rec: Recorder, trace_id: String, hook: Hook) {
        rec.flush().await;
        let row = match rec.store().get(&trace_id).await {
            Ok(Some(row)) => row,
            other => {
                tracing::warn!(execution_id = %trace_id, error = ?other.err().map(|e| e.to_string()), "the record to deliver could not be read");
                rec.webhook(&trace_id, "failed", 0);
                return;
            }
        };
        let body = serde_json::to_vec(&crate::records::ExecutionStatus::of(Row { webhook_status: Some("pending".into()), ..row })).unwrap_or_default();
        let mut n = 0;
        let outcome = loop {
            n += 1;
            tokio::select! {
                () = tokio::time::sleep(policy::backoff(n, self.retry_base)) => {}
                () = self.stopping.cancelled() => {
                    tracing::info!(execution_id = %trace_id, "gateway stopping: the webhook stays pending for another gateway");
                    return;
                }
            }
            match self.attempt(&hook, &trace_id, &body).await {
                Attempt::Delivered => break "delivered",
                Attempt::Refused(why) => {
                    tracing::warn!(execution_id = %trace_id, reason = %why, "webhook destination refused");
                    break "refused";
                }
                Attempt::Final(why) => {
                    tracing::warn!(execution_id = %trace_id, reason = %why, "webhook rejected; not retried");
                    break "failed";
                }
                Attempt::Retry(why) if n >= self.attempts => {
                    tracing::warn!(execution_id = %trace_id, reason = %why, attempts = n, "webhook delivery failed");
                    break "failed";
                }
                Attempt::Retry(why) => {
                    tracing::info!(execution_id = %trace_id, reason = %why, attempt = n, "webhook attempt failed; retrying");
                    rec.webhook(&trace_id, "pending", n);
                }
            }
        };
        tracing::info!(execution_id = %trace_id, outcome, attempts = n, "webhook");
        rec.webhook(&trace_id, outcome, n);
    }

    async fn attempt(&self, hook: &Hook, trace_id: &str, body: &[u8]) -> Attempt {
        let ts = crate::records::now_ms() / 1000;
        let sent = self
            .client
            .post(hook.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Warren-Webhook-Id", trace_id)
            .header("Warren-Webhook-Timestamp", ts.to_string())
            .header("Warren-Signature", policy::signature(hook.secret.expose(), ts, body))
            .body(body.to_vec())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => Attempt::Delivered,
            // Redirects were followed (or refused) by the client already.
            Ok(r) if r.status().is_server_error() || r.status().as_u16() == 408 || r.status().as_u16() == 429 => Attempt::Retry(format!("HTTP {}", r.status().as_u16())),
            Ok(r) => Attempt::Final(format!("HTTP {}", r.status().as_u16())),
            Err(e) => match refusal(&e) {
                Some(r) => Attempt::Refused(r.to_string()),
                None => Attempt::Retry(if e.is_timeout() { "timed out".into() } else { "could not connect".into() }),
            },
        }
    }
}

/// Delivers the webhooks of gateways that stopped (their records say
/// `pending`; the sweeper hands them over).
pub struct Takeover {
    /// Sender.
    pub webhooks: Webhooks,
    /// Records.
    pub recorder: Recorder,
    /// Keys (for the signing secret).
    pub keys: tokio::sync::watch::Receiver<Arc<crate::auth::KeyStore>>,
    /// Where the deliveries run (shutdown waits for them).
    pub tasks: tokio_util::task::TaskTracker,
}

impl crate::records::Redeliver for Takeover {
    fn redeliver(&self, trace_id: String, url: String, namespace: String, key_name: String) {
        let secret = self.keys.borrow().named(&namespace, &key_name).and_then(|k| k.webhook_secret.clone());
        let (url, secret) = match (self.webhooks.check(&url), secret) {
            (Ok(url), Some(secret)) => (url, secret),
            (Err(_), _) => return self.recorder.webhook(&trace_id, "refused", 0),
            // The key (or its secret) is gone: nothing may be signed for it.
            (_, None) => return self.recorder.webhook(&trace_id, "failed", 0),
        };
        let (webhooks, rec) = (self.webhooks.clone(), self.recorder.clone());
        self.tasks.spawn(async move { webhooks.deliver(rec, trace_id, Hook { url, secret }).await });
    }
}

enum Attempt {
    Delivered,
    Refused(String),
    Final(String),
    Retry(String),
}

/// The SSRF refusal behind a client error, if that is what it was. A
/// redirect error can only come from the redirect policy, which refused the hop.
fn refusal(e: &reqwest::Error) -> Option<Refusal> {
    if e.is_redirect() {
        return Some(Refusal::Url("a redirect to a destination webhooks may not reach"));
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refusal>() {
            return Some(r.clone());
        }
        cur = err.source();
    }
    None
}

/// Resolves names and refuses the lot when any address is forbidden, so the
/// connection can only use addresses that were checked (no rebinding).
struct GuardedResolver(Arc<Allowed>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                policy::check_ip(a.ip(), &host, &allowed)?;
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}
