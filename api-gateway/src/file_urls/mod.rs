//! Signed file URLs: the key they are signed with (`key`), what a token
//! allows (`token`), and how they are made and bounded ([`Settings`]).
//! Below the Files API and the shared state; knows no HTTP.

pub mod key;
pub mod token;

use std::time::Duration;

/// How file URLs are made and bounded.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Signs the URLs (shared by every replica).
    pub signing_key: std::sync::Arc<key::SigningKey>,
    /// Base of the URLs (`https://warren.example.com`); `None`: from the request's Host.
    pub public_url: Option<String>,
    /// How long a URL is valid.
    pub ttl: Duration,
    /// Largest upload.
    pub max_upload: u64,
}
