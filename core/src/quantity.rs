//! Kubernetes resource quantities (`500m`, `2`, `1Gi`, `512Mi`, `1e3`), the
//! subset Warren's manifests use.

/// Parses a CPU quantity into thousandths of a core (`"500m"` → 500, `"2"` → 2000).
pub fn cpu_millis(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(m) = s.strip_suffix('m') {
        return digits(m);
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || (int.is_empty() && frac.is_empty()) {
        return None;
    }
    let whole = if int.is_empty() { 0 } else { digits(int)? };
    let frac_millis = if frac.is_empty() { 0 } else { digits(frac)? * 10u64.pow(3 - frac.len() as u32) };
    whole.checked_mul(1000)?.checked_add(frac_millis)
}

/// Parses a byte quantity (`"1Gi"`, `"512Mi"`, `"100M"`, `"4096"`).
pub fn bytes(s: &str) -> Option<u64> {
    const UNITS: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let s = s.trim();
    for (suffix, mult) in UNITS {
        if let Some(n) = s.strip_suffix(suffix) {
            return digits(n)?.checked_mul(*mult);
        }
    }
    digits(s)
}

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu() {
        assert_eq!(cpu_millis("500m"), Some(500));
        assert_eq!(cpu_millis("2"), Some(2000));
        assert_eq!(cpu_millis("0.5"), Some(500));
        assert_eq!(cpu_millis("1.25"), Some(1250));
        assert_eq!(cpu_millis(".5"), Some(500));
        for bad in ["", "m", "-1", "1.2345", "abc", "1e3", "99999999999999999999"] {
            assert_eq!(cpu_millis(bad), None, "{bad}");
        }
    }

    #[test]
    fn memory() {
        assert_eq!(bytes("1Gi"), Some(1 << 30));
        assert_eq!(bytes("512Mi"), Some(512 << 20));
        assert_eq!(bytes("100M"), Some(100_000_000));
        assert_eq!(bytes("4096"), Some(4096));
        for bad in ["", "Gi", "1.5Gi", "-1", "1Pi", "18446744073709551615Ki"] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
    }
}
