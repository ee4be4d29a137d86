//! Which Secrets the operator may use on a tenant's behalf (pure).
//!
//! A tenant names Secrets in its manifests (`credentialsSecretRef`,
//! `imagePullSecret`, an ApiKey's `secretRef`). Without a rule, any Secret in
//! the namespace — another application's database password, a token minted
//! for something else — could be named and its entries handed to code the
//! tenant controls (a confused deputy). So a Secret is used only when its
//! owner marked it for Warren with the label `warren.dev/consumable: "true"`
//! (or the operator generated it for the object naming it), and only in the
//! namespaces an admin made tenants of: the operator reads no Secret
//! anywhere else, Warren's own CA keys included.

use std::collections::{BTreeMap, BTreeSet};

/// The label that lets Warren use a Secret.
pub const LABEL: &str = "warren.dev/consumable";

/// Where the operator may read Secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretScope {
    /// Every namespace (RBAC cluster-wide: the chart never does this).
    Cluster,
    /// These namespaces only (the chart's `tenantNamespaces`).
    Namespaces(BTreeSet<String>),
}

impl SecretScope {
    /// Why the operator may not read Secrets in `ns`, if it may not.
    pub fn refusal(&self, ns: &str) -> Option<String> {
        match self {
            SecretScope::Namespaces(list) if !list.contains(ns) => Some(format!(
                "namespace {ns} is not a tenant namespace: the operator reads no Secret there (an admin adds it to the chart's tenantNamespaces, operator --tenant-namespace)"
            )),
            _ => None,
        }
    }
}

/// Why Secret `name` (with `labels`) may not be used, if it may not.
/// `generated_for_it`: the operator made it for the object naming it.
pub fn refusal(name: &str, labels: &BTreeMap<String, String>, generated_for_it: bool) -> Option<String> {
    if generated_for_it || labels.get(LABEL).is_some_and(|v| v == "true") {
        return None;
    }
    Some(format!("Secret {name} is not marked for Warren: label it {LABEL}: \"true\" to let Warren use its entries"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_labelled_or_generated_secrets_in_tenant_namespaces_are_used() {
        let labelled = BTreeMap::from([(LABEL.to_string(), "true".to_string())]);
        assert_eq!(refusal("creds", &labelled, false), None);
        let other = BTreeMap::from([(LABEL.to_string(), "yes".to_string())]);
        assert!(refusal("app-db", &other, false).unwrap().contains("warren.dev/consumable: \"true\""));
        assert!(refusal("app-db", &BTreeMap::new(), false).is_some());
        assert_eq!(refusal("key", &BTreeMap::new(), true), None, "what the operator generated for the object");
        let scope = SecretScope::Namespaces(BTreeSet::from(["team-a".to_string()]));
        assert_eq!(scope.refusal("team-a"), None);
        assert!(scope.refusal("warren-system").unwrap().contains("tenantNamespaces"));
        assert_eq!(SecretScope::Cluster.refusal("anything"), None);
    }
}
