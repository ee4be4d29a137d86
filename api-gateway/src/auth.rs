//! API key authentication against the compiled configuration.

use std::sync::Arc;

use axum::http::HeaderMap;
use warren_config::key::{self, KeyHash};
use warren_config::EffectiveKey;

use crate::exec_error::ExecError;

/// The keys of one configuration generation. Swapped whole on reload;
/// requests keep the generation they started with.
#[derive(Debug, Default)]
pub struct KeyStore {
    keys: Vec<Arc<EffectiveKey>>,
    /// False until the source (files, or the cluster's published keys) was read once.
    loaded: bool,
}

impl KeyStore {
    /// Builds a store from compiled keys. Keys whose value is shared by two
    /// entries (possible across namespaces in a cluster) are refused: which
    /// configuration applies would be ambiguous.
    pub fn new(keys: Vec<EffectiveKey>) -> Self {
        let mut count = std::collections::HashMap::new();
        for k in &keys {
            *count.entry(k.hash).or_insert(0u32) += 1;
        }
        let keys = keys
            .into_iter()
            .filter(|k| {
                let unique = count[&k.hash] == 1;
                if !unique {
                    tracing::warn!(key = %k.qualified_name(), "another API key has the same value; both are refused");
                }
                unique
            })
            .map(Arc::new)
            .collect();
        KeyStore { keys, loaded: true }
    }

    /// True once the configuration source has been read (it may hold no key).
    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Number of usable keys.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Every usable key.
    pub fn keys(&self) -> &[Arc<EffectiveKey>] {
        &self.keys
    }

    /// The namespaces that hold keys, sorted: the tenants the console knows.
    pub fn namespaces(&self) -> Vec<String> {
        let set: std::collections::BTreeSet<&str> = self.keys.iter().map(|k| k.namespace.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// The ApiKey `namespace/name` (what a signed file URL names).
    pub fn named(&self, namespace: &str, name: &str) -> Option<Arc<EffectiveKey>> {
        self.keys.iter().find(|k| k.namespace == namespace && k.name == name).cloned()
    }

    /// Finds the key in `Authorization: Bearer …`.
    ///
    /// Every stored hash is compared, in constant time and without stopping at
    /// a match, so response time says nothing about which keys exist.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<EffectiveKey>, ExecError> {
        self.find(&KeyHash::of(bearer(headers)?), false)
    }

    /// Finds the key in the E2B SDKs' `X-API-KEY` header: its `e2b_…` alias
    /// or the key itself, compared like [`KeyStore::authenticate`].
    pub fn authenticate_e2b(&self, headers: &HeaderMap) -> Result<Arc<EffectiveKey>, ExecError> {
        self.find(&KeyHash::of(e2b_header(headers)?), true)
    }

    fn find(&self, hash: &KeyHash, alias: bool) -> Result<Arc<EffectiveKey>, ExecError> {
        let mut found = None;
        for k in &self.keys {
            let alias_match = alias && k.e2b_hash.is_some_and(|h| h.ct_eq(hash));
            if k.hash.ct_eq(hash) | alias_match {
                found = Some(k);
            }
        }
        let k = found.ok_or(ExecError::InvalidKey("the API key is not valid"))?;
        if k.disabled {
            return Err(ExecError::KeyDisabled);
        }
        Ok(k.clone())
    }
}

/// The E2B control plane's `X-API-KEY`: a key's `e2b_…` alias or the key itself.
fn e2b_header(headers: &HeaderMap) -> Result<&str, ExecError> {
    let mut values = headers.get_all("x-api-key").iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return Err(ExecError::MissingKey);
    };
    let v = v.to_str().map_err(|_| ExecError::InvalidKey("the API key is not valid"))?;
    if key::is_e2b_alias(v) || key::is_well_formed(v) {
        Ok(v)
    } else {
        Err(ExecError::InvalidKey("X-API-KEY must hold a Warren API key's e2b_ alias (or the key itself)"))
    }
}

fn bearer(headers: &HeaderMap) -> Result<&str, ExecError> {
    let mut values = headers.get_all(axum::http::header::AUTHORIZATION).iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return Err(ExecError::MissingKey);
    };
    let malformed = || ExecError::InvalidKey("the Authorization header must be Bearer followed by a Warren API key");
    let v = v.to_str().map_err(|_| malformed())?;
    let (scheme, token) = v.split_once(' ').ok_or_else(malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") || !key::is_well_formed(token) {
        return Err(malformed());
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const GOOD: &str = "sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

    fn store(disabled: bool) -> KeyStore {
        let compiled = warren_config::compile(&[warren_config::Source {
            file: "x",
            text: &format!(
                "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: sb}}\nspec: {{image: host}}\n---\n\
                 apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: k}}\nspec: {{sandboxRef: {{name: sb}}, disabled: {disabled}}}\n---\n\
                 apiVersion: v1\nkind: Secret\nmetadata: {{name: k-key}}\nstringData: {{key: {GOOD}}}\n"
            ),
        }]);
        assert!(compiled.errors.is_empty(), "{:?}", compiled.errors);
        KeyStore::new(compiled.keys)
    }

    fn auth(s: &KeyStore, value: Option<&str>) -> Result<String, (u16, String)> {
        let mut h = HeaderMap::new();
        if let Some(v) = value {
            h.insert("authorization", HeaderValue::from_str(v).unwrap());
        }
        s.authenticate(&h).map(|k| k.name.clone()).map_err(|e| { let e = crate::error::ApiError::from(e); (e.status.as_u16(), e.body.error) })
    }

    #[test]
    fn cases() {
        let s = store(false);
        assert_eq!(auth(&s, Some(&format!("Bearer {GOOD}"))), Ok("k".into()));
        assert_eq!(auth(&s, Some(&format!("bearer {GOOD}"))), Ok("k".into()));
        assert_eq!(auth(&s, None), Err((401, "missing_api_key".into())));
        assert_eq!(auth(&s, Some(GOOD)), Err((401, "invalid_api_key".into())));
        assert_eq!(auth(&s, Some(&format!("Basic {GOOD}"))), Err((401, "invalid_api_key".into())));
        assert_eq!(auth(&s, Some(&format!("Bearer {GOOD}x"))), Err((401, "invalid_api_key".into())));
        assert_eq!(auth(&s, Some("Bearer sk-wrn-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB")), Err((401, "invalid_api_key".into())));
        assert_eq!(auth(&store(true), Some(&format!("Bearer {GOOD}"))), Err((403, "api_key_disabled".into())));
        // The E2B alias is no bearer key.
        assert_eq!(auth(&s, Some(&format!("Bearer {}", key::e2b_alias(GOOD)))), Err((401, "invalid_api_key".into())));
    }

    fn auth_e2b(s: &KeyStore, value: &str) -> Result<String, u16> {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_str(value).unwrap());
        s.authenticate_e2b(&h).map(|k| k.name.clone()).map_err(|e| crate::error::ApiError::from(e).status.as_u16())
    }

    #[test]
    fn e2b_keys() {
        let s = store(false);
        assert_eq!(auth_e2b(&s, &key::e2b_alias(GOOD)), Ok("k".into()));
        assert_eq!(auth_e2b(&s, GOOD), Ok("k".into()));
        assert_eq!(auth_e2b(&s, &key::e2b_alias("sk-wrn-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB")), Err(401));
        assert_eq!(auth_e2b(&s, "e2b_nothex"), Err(401));
        assert_eq!(auth_e2b(&store(true), &key::e2b_alias(GOOD)), Err(403));
    }
}
