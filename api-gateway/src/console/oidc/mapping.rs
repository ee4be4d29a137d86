//! From a checked ID token's claims to the identity the console asks the
//! cluster's RBAC about, by the rules of the API server's own OpenID
//! Connect flags (`--oidc-username-claim`, `--oidc-username-prefix`,
//! `--oidc-groups-claim`, `--oidc-groups-prefix`), so the console's user is
//! the user `kubectl` would be with the same provider, and the provider
//! cannot name a cluster identity it does not own:
//!
//! - the username is one claim (default `email`); an `email` counts only
//!   when the token says it was verified (`email_verified: true`);
//! - unless told otherwise, a username from a claim other than `email` is
//!   prefixed with the issuer and `#` (the API server's default), so two
//!   providers cannot name the same user; `-` turns the prefix off;
//! - groups (default claim `groups`, a list or one string) get the groups
//!   prefix (default none);
//! - a username in Kubernetes' reserved `system:` namespace refuses the
//!   sign-in; such groups (`system:masters`) are dropped.

use serde_json::{Map, Value};

use super::{TokenError, MAX_GROUPS, MAX_GROUP_BYTES};

/// Longest username kept.
pub const MAX_USER_BYTES: usize = 256;
/// The names Kubernetes reserves for itself.
const RESERVED: &str = "system:";

/// How claims become a username and groups (the gateway's
/// `--console-oidc-*-claim` and `-prefix` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMapping {
    /// The claim holding the username.
    pub username_claim: String,
    /// Put before the username. `None`: the API server's default (the
    /// issuer and `#`, except for `email`); `Some("-")`: nothing.
    pub username_prefix: Option<String>,
    /// The claim holding the groups.
    pub groups_claim: String,
    /// Put before each group.
    pub groups_prefix: String,
}

impl Default for ClaimMapping {
    /// `email` (verified), no prefix; `groups`, no prefix.
    fn default() -> ClaimMapping {
        ClaimMapping { username_claim: "email".into(), username_prefix: None, groups_claim: "groups".into(), groups_prefix: String::new() }
    }
}

impl ClaimMapping {
    /// A mapping that can name someone: claims named, and neither prefix
    /// itself in the reserved `system:` namespace.
    pub fn check(&self) -> Result<(), String> {
        if self.username_claim.is_empty() || self.groups_claim.is_empty() {
            return Err("the username and groups claims must be named".into());
        }
        if self.username_prefix.as_deref().is_some_and(|p| p.starts_with(RESERVED)) || self.groups_prefix.starts_with(RESERVED) {
            return Err(format!("a prefix must not start with {RESERVED:?} (Kubernetes reserves those names)"));
        }
        Ok(())
    }

    /// The username's prefix for tokens of `issuer`.
    fn prefix_for(&self, issuer: &str) -> String {
        match self.username_prefix.as_deref() {
            Some("-") => String::new(),
            Some(p) => p.to_string(),
            None if self.username_claim == "email" => String::new(),
            None => format!("{issuer}#"),
        }
    }

    /// The username `claims` give, refused when unverified, missing, too
    /// long, or reserved.
    pub fn username(&self, issuer: &str, claims: &Map<String, Value>) -> Result<String, TokenError> {
        let value = claims.get(&self.username_claim).and_then(Value::as_str).filter(|u| !u.is_empty()).ok_or(TokenError::Identity("the token carries no username claim"))?;
        if self.username_claim == "email" && claims.get("email_verified") != Some(&Value::Bool(true)) {
            return Err(TokenError::Identity("the provider does not say the email address is verified"));
        }
        let user = format!("{}{value}", self.prefix_for(issuer));
        if user.len() > MAX_USER_BYTES {
            return Err(TokenError::Identity("the username is too long"));
        }
        if user.starts_with(RESERVED) {
            return Err(TokenError::Identity("the username is a Kubernetes system name (system:…)"));
        }
        Ok(user)
    }

    /// The groups `claims` give, prefixed; empty, overlong and reserved
    /// ones dropped; at most [`MAX_GROUPS`].
    pub fn groups(&self, claims: &Map<String, Value>) -> Vec<String> {
        let names: Vec<&str> = match claims.get(&self.groups_claim) {
            Some(Value::String(g)) => vec![g.as_str()],
            Some(Value::Array(gs)) => gs.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        names
            .into_iter()
            .filter(|g| !g.is_empty() && g.len() <= MAX_GROUP_BYTES)
            .map(|g| format!("{}{g}", self.groups_prefix))
            .filter(|g| !g.starts_with(RESERVED))
            .take(MAX_GROUPS)
            .collect()
    }
}
