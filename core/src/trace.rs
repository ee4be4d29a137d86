//! W3C Trace Context (`traceparent`, `tracestate`): read from a caller,
//! handed to a program. Pure; unit-tested. A malformed header is not an
//! error anywhere: the call simply starts a new trace (or none).

/// One span's place in a trace, as `traceparent` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanRef {
    /// The trace, 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The span, 8 bytes, not all zero.
    pub span_id: [u8; 8],
    /// The caller sampled it (flag 01).
    pub sampled: bool,
}

/// The trace context a call carries to the program: the span its own spans
/// (and the program's) descend from, and the caller's `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The parent span.
    pub parent: SpanRef,
    /// The caller's `tracestate`, checked ([`state`]).
    pub state: Option<String>,
}

impl Trace {
    /// From the two headers; `None` when `traceparent` is absent or malformed.
    pub fn from_headers(traceparent: &str, tracestate: &str) -> Option<Trace> {
        SpanRef::parse(traceparent).map(|parent| Trace { parent, state: state(tracestate) })
    }
}

/// Longest `tracestate` kept (the spec's 32 members of at most 256
/// characters could be longer; vendors truncate at 512).
pub const MAX_STATE: usize = 512;

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl SpanRef {
    /// Reads a `traceparent` header: version `00` exactly, or a later
    /// version's first four fields (as the spec asks of a reader); `None`
    /// for anything malformed, version `ff`, or an all-zero id.
    pub fn parse(header: &str) -> Option<SpanRef> {
        let h = header.trim();
        let mut parts = h.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let version = hex::<1>(version)?[0];
        if version == 0xff || (version == 0 && (parts.next().is_some() || h.len() != 55)) {
            return None;
        }
        let (trace_id, span_id, flags) = (hex::<16>(trace)?, hex::<8>(span)?, hex::<1>(flags)?[0]);
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanRef { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The `traceparent` naming this span (version 00).
    pub fn header(&self) -> String {
        format!("00-{}-{}-{:02x}", to_hex(&self.trace_id), to_hex(&self.span_id), u8::from(self.sampled))
    }

    /// The trace id in lowercase hex (as tracing backends show it).
    pub fn trace_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The span id in lowercase hex.
    pub fn span_hex(&self) -> String {
        to_hex(&self.span_id)
    }

    /// A new span of the same trace, its id from `fill` (the caller's randomness).
    pub fn child(&self, fill: &mut dyn FnMut(&mut [u8])) -> SpanRef {
        SpanRef { span_id: new_span_id(fill), ..*self }
    }

    /// The root span of a new trace (sampled).
    pub fn root(fill: &mut dyn FnMut(&mut [u8])) -> SpanRef {
        let mut trace_id = [0u8; 16];
        while trace_id == [0; 16] {
            fill(&mut trace_id);
        }
        SpanRef { trace_id, span_id: new_span_id(fill), sampled: true }
    }
}

fn new_span_id(fill: &mut dyn FnMut(&mut [u8])) -> [u8; 8] {
    let mut id = [0u8; 8];
    while id == [0; 8] {
        fill(&mut id);
    }
    id
}

/// A `tracestate` header worth passing on: printable ASCII without
/// spaces around members, at most [`MAX_STATE`] characters and 32 members;
/// `None` drops it (as the spec allows), never an error.
pub fn state(header: &str) -> Option<String> {
    let h = header.trim();
    let members: Vec<&str> = h.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
    let ok = !members.is_empty()
        && members.len() <= 32
        && h.len() <= MAX_STATE
        && members.iter().all(|m| m.split_once('=').is_some_and(|(k, v)| !k.is_empty() && !v.is_empty() && m.bytes().all(|b| (0x21..=0x7e).contains(&b))));
    ok.then(|| members.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips_and_malformed_ones_are_ignored() {
        let r = SpanRef::parse(GOOD).unwrap();
        assert_eq!((r.trace_hex().as_str(), r.span_hex().as_str(), r.sampled), ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true));
        assert_eq!(r.header(), GOOD);
        assert!(!SpanRef::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled);
        // A later version: its first four fields, whatever follows.
        assert!(SpanRef::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").is_some());
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanRef::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn children_keep_the_trace_and_roots_start_one() {
        let mut n = 0u8;
        let mut fill = |b: &mut [u8]| {
            n += 1;
            b.fill(n)
        };
        let parent = SpanRef::parse(GOOD).unwrap();
        let child = parent.child(&mut fill);
        assert_eq!((child.trace_id, child.sampled), (parent.trace_id, true));
        assert_ne!(child.span_id, parent.span_id);
        let mut zero_then = {
            let mut calls = 0;
            move |b: &mut [u8]| {
                calls += 1;
                b.fill(if calls == 1 { 0 } else { 7 })
            }
        };
        let root = SpanRef::root(&mut zero_then);
        assert!(root.trace_id != [0; 16] && root.span_id != [0; 8] && root.sampled, "an all-zero draw is drawn again");
    }

    #[test]
    fn tracestate_is_passed_on_only_when_well_formed_and_bounded() {
        assert_eq!(state("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7").as_deref(), Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
        for bad in ["", "novalue", "a=b c", "=x", &"k=v,".repeat(40), &format!("k={}", "v".repeat(600)), "a=\u{7f}"] {
            assert_eq!(state(bad), None, "{bad:?}");
        }
    }
}
