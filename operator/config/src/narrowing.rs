//! Narrowing rules for storage and connectors (pure). An ApiKey may only
//! confine its Sandbox further: deeper prefixes matched by whole path
//! segments (`warren_core::path`), ReadOnly over ReadWrite, a subset of
//! connectors.

use warren_core::path::within;

use crate::types::{MountMode, StorageMount, StorageNarrowing};

/// Checks one ApiKey storage narrowing against the Sandbox's mounts, given
/// the mount's full prefix (connection prefix joined with the mount's).
/// Returns the effective prefix and mode.
pub fn narrow_mount(mounts: &[StorageMount], full_prefix: impl Fn(&StorageMount) -> String, n: &StorageNarrowing) -> Result<(String, MountMode), String> {
    let m = mounts.iter().find(|m| m.name == n.name).ok_or_else(|| format!("the Sandbox has no mount named {:?}", n.name))?;
    let base = full_prefix(m);
    let prefix = match &n.prefix {
        None => base,
        Some(p) if within(&base, p) => p.trim_end_matches('/').to_string(),
        Some(p) => return Err(format!("{p:?} is not under the mount's prefix {base:?} (whole segments)")),
    };
    let mode = match (m.mode, n.mode) {
        (mode, None) => mode,
        (MountMode::ReadWrite, Some(mode)) => mode,
        (MountMode::ReadOnly, Some(MountMode::ReadOnly)) => MountMode::ReadOnly,
        (MountMode::ReadOnly, Some(MountMode::ReadWrite)) => return Err("ReadWrite would widen a ReadOnly mount".into()),
    };
    Ok((prefix, mode))
}

/// Checks that `chosen` connectors are all offered by the Sandbox.
pub fn narrow_connectors<'a>(offered: &[&'a str], chosen: Option<&[&'a str]>) -> Result<Vec<&'a str>, String> {
    match chosen {
        None => Ok(offered.to_vec()),
        Some(c) => match c.iter().find(|x| !offered.contains(x)) {
            Some(extra) => Err(format!("connector {extra:?} is not one of the Sandbox's")),
            None => Ok(c.to_vec()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LocalRef;
    use warren_core::path::join;

    fn mount(mode: MountMode) -> StorageMount {
        StorageMount { name: "data".into(), connection_ref: Some(LocalRef { name: "c".into() }), volume: None, mode, prefix: Some("acme".into()), max_write_bytes: None }
    }

    #[test]
    fn mounts_only_narrow() {
        let full = |m: &StorageMount| join("shared", m.prefix.as_deref().unwrap_or(""));
        let n = |prefix: Option<&str>, mode| StorageNarrowing { name: "data".into(), prefix: prefix.map(Into::into), mode };
        let rw = [mount(MountMode::ReadWrite)];
        assert_eq!(narrow_mount(&rw, full, &n(None, None)), Ok(("shared/acme".into(), MountMode::ReadWrite)));
        assert_eq!(narrow_mount(&rw, full, &n(Some("shared/acme/t1"), Some(MountMode::ReadOnly))), Ok(("shared/acme/t1".into(), MountMode::ReadOnly)));
        assert!(narrow_mount(&rw, full, &n(Some("shared/acmeX"), None)).is_err());
        assert!(narrow_mount(&rw, full, &n(Some("shared"), None)).is_err());
        let ro = [mount(MountMode::ReadOnly)];
        assert!(narrow_mount(&ro, full, &n(None, Some(MountMode::ReadWrite))).is_err());
        let other = StorageNarrowing { name: "nope".into(), prefix: None, mode: None };
        assert!(narrow_mount(&ro, full, &other).is_err());
    }

    #[test]
    fn connectors_are_a_subset() {
        assert_eq!(narrow_connectors(&["pg", "gh"], None), Ok(vec!["pg", "gh"]));
        assert_eq!(narrow_connectors(&["pg", "gh"], Some(&["gh"])), Ok(vec!["gh"]));
        assert!(narrow_connectors(&["pg"], Some(&["gh"])).is_err());
    }
}
