//! The activity log's entries for live sandboxes: who (a key, the
//! console's user, or Warren itself) did what to which sandbox.

use crate::records::{now_ms, Action, E2bSandbox};
use crate::state::AppState;

/// Who a call made with `key` was: the key (the console names its user instead).
pub fn by_key(key: &warren_config::EffectiveKey) -> String {
    format!("key {}", key.name)
}

/// Adds to the activity log: `who` did `action` to sandbox `s` (`detail`
/// says what, at most 200 characters; never a variable's value).
pub fn log(st: &AppState, s: &E2bSandbox, who: &str, action: &str, detail: &str) {
    let detail: String = detail.chars().take(200).collect();
    let object = match detail.is_empty() {
        true => format!("{}/{}", s.key_name, s.id),
        false => format!("{}/{}: {detail}", s.key_name, s.id),
    };
    st.service.records.action(Action { at_ms: now_ms(), user: who.chars().take(256).collect(), action: action.into(), namespace: s.namespace.clone(), object });
}
