//! Conditions (pure) and status patches.
//!
//! A condition keeps its `lastTransitionTime` while its status stays the
//! same, and a status is only written when something other than timestamps
//! changed: re-applying the same manifests changes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Field manager of every write the operator makes.
pub const MANAGER: &str = "warren-operator";

/// How often a Ready status is rechecked without any change.
pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(300);

/// The current time, as conditions record it.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The `Ready` condition for `generation`, keeping the transition time of
/// `previous` when the status did not change.
pub fn ready(ok: bool, reason: &str, message: &str, generation: Option<i64>, previous: &[Condition], now: Time) -> Vec<Condition> {
    let status = if ok { "True" } else { "False" };
    let last = previous.iter().find(|c| c.type_ == "Ready");
    let since = match last {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now,
    };
    vec![Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.chars().take(1000).collect(),
        observed_generation: generation,
        last_transition_time: since,
    }]
}

/// True when `new` differs from `old` in anything but timestamps.
pub fn differs(old: &[Condition], new: &[Condition]) -> bool {
    let key = |c: &Condition| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone(), c.observed_generation);
    old.len() != new.len() || old.iter().zip(new).any(|(a, b)| key(a) != key(b))
}

/// The Ready condition's status and reason, if any.
pub fn ready_of(conditions: &[Condition]) -> Option<(String, String)> {
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| (c.status.clone(), c.reason.clone()))
}

/// Writes `status` through the status subresource (server-side apply).
pub async fn patch<K>(api: &Api<K>, name: &str, status: &impl Serialize) -> kube::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body)).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let first = ready(true, "Published", "ok", Some(1), &[], at(10));
        let same = ready(true, "Published", "ok", Some(1), &first, at(20));
        assert_eq!(same[0].last_transition_time, at(10));
        assert!(!differs(&first, &same));
        let flipped = ready(false, "Disabled", "off", Some(2), &same, at(30));
        assert_eq!(flipped[0].last_transition_time, at(30));
        assert!(differs(&same, &flipped));
        assert_eq!(ready_of(&flipped), Some(("False".into(), "Disabled".into())));
    }
}
