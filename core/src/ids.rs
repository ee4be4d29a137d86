//! Identifier rules and formats: thread ids, execution ids, object names.
//! Randomness is the caller's (this crate does no I/O): generators take
//! random bytes and turn them into text.

/// Longest thread id.
pub const MAX_THREAD_ID: usize = 128;

/// `^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$`: a thread id as requests carry it.
pub fn is_thread_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_THREAD_ID
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
}

/// Message for an invalid thread id.
pub const THREAD_ID_RULE: &str = "must match ^[a-zA-Z0-9][a-zA-Z0-9_-]*$ and be at most 128 characters";

/// `[a-zA-Z0-9_-]{1,64}`: an execution id (also a cgroup name part).
pub fn is_execution_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A Kubernetes object name as Warren uses them in paths and keys
/// (DNS subdomain: lower-case alphanumerics, `-` and `.`, no `..`).
pub fn is_object_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !s.contains("..")
}

/// RFC 1123 label: namespaces, mount names, object names in manifests.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// `len` base62 characters drawn from `random` without modulo bias (bytes
/// ≥ 248 are skipped). `None` when `random` holds too few usable bytes;
/// pass about `len * 1.1` bytes or more.
pub fn base62(random: &[u8], len: usize) -> Option<String> {
    let out: String = random.iter().filter(|&&b| b < 248).take(len).map(|&b| BASE62[(b % 62) as usize] as char).collect();
    (out.len() == len).then_some(out)
}

/// Length of the random part of trace and execution ids.
pub const ID_CHARS: usize = 20;

/// `prefix` + `len` random base62 characters, drawing bytes from `fill`
/// (the caller's randomness source: the core does no I/O) until enough are
/// usable. The one id generator every runtime uses.
pub fn random_id(prefix: &str, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> String {
    let mut bytes = vec![0u8; len + len / 2 + 8];
    loop {
        fill(&mut bytes);
        if let Some(s) = base62(&bytes, len) {
            return format!("{prefix}{s}");
        }
    }
}

/// `trc_` + 20 base62 characters: the id of one execution everywhere
/// (response, logs, cgroup name, audit record).
pub fn trace_id(fill: &mut dyn FnMut(&mut [u8])) -> String {
    random_id("trc_", ID_CHARS, fill)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_retry_until_enough_bytes_are_usable() {
        let mut calls = 0;
        // First draw: all bytes unusable (≥ 248); second: all zero.
        let id = random_id("exe_", 4, &mut |b: &mut [u8]| {
            calls += 1;
            b.fill(if calls == 1 { 255 } else { 0 });
        });
        assert_eq!((id.as_str(), calls), ("exe_0000", 2));
        assert!(trace_id(&mut |b: &mut [u8]| b.fill(1)).starts_with("trc_1"));
    }

    #[test]
    fn thread_ids() {
        for ok in ["a", "A1", "t-1_x", &"t".repeat(128)] {
            assert!(is_thread_id(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", "a/b", "a.b", "../x", &"t".repeat(129), "é"] {
            assert!(!is_thread_id(bad), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(is_object_name("agent.key") && is_object_name("team-a"));
        for bad in ["", "..", "A", "a.", ".a", "a..b", "a/b"] {
            assert!(!is_object_name(bad), "{bad}");
        }
        assert!(is_dns_label("a-1") && !is_dns_label("a.b") && !is_dns_label("-a") && !is_dns_label(&"a".repeat(64)));
        assert!(is_execution_id("trc_AbC") && !is_execution_id("../x") && !is_execution_id(""));
    }

    #[test]
    fn base62_is_unbiased_and_sized() {
        let all: Vec<u8> = (0..=255).collect();
        let s = base62(&all, 40).unwrap();
        assert_eq!(s.len(), 40);
        assert!(s.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(base62(&[250; 64], 1), None, "bytes that would bias the modulo are skipped");
        let t = trace_id(&mut |b: &mut [u8]| b.copy_from_slice(&all[..b.len()]));
        assert!(t.starts_with("trc_") && t.len() == 24 && is_execution_id(&t));
    }
}
