//! Warren's configuration compiler.
//!
//! Reads the same manifests `kubectl apply` takes (Sandbox, ApiKey, Secret)
//! and produces the effective configuration of each API key, enforcing that
//! an ApiKey may only narrow its Sandbox. Pure: the gateway feeds it files from
//! a directory (single-machine mode), the operator feeds it objects from the
//! API server. The rules every layer shares (environment variables, bounds,
//! ids, path scoping) live in `warren-core`.

pub mod ceilings;
pub mod compile;
pub mod connector;
pub mod consumable;
pub mod effective;
pub mod image;
mod error;
pub mod key;
pub mod manifest;
pub mod narrowing;
pub mod published;
pub mod storage;
pub mod types;
#[cfg(feature = "watch")]
pub mod watch;

pub use compile::{check_sandbox, compile, effective_key, secret_holder, secret_ref, shared_key_message, Compiled, SandboxConfig, SecretClaim, Where, WEBHOOK_SECRET_ENTRY};
pub use effective::{EffectiveKey, Limits};
pub use error::ConfigError;
pub use manifest::Source;
pub use types::{Network, SecretBody};
pub use warren_core::{env, quantity, Language};

#[cfg(test)]
mod tests;
