//! A thread's history: the versions a restore or fork can return to, kept
//! in its manifest. Pure; unit-tested.
//!
//! A version is a list of layers. Layers are immutable and shared — a later
//! version names its predecessor's layers plus one, a fork names its
//! source's — so keeping a version costs a few indices, and only layers no
//! kept version names any more are garbage (see `super::gc`). Every layer a
//! manifest keeps is in `layers` (the current version's, in order) or `pool`
//! (those only older versions name); a version names them by index into the
//! two read as one list.

pub use super::manifest::{Keep, Kind, Version};
use super::manifest::{LayerRef, Manifest};

/// Most versions a thread may be asked to keep.
pub const MAX_KEPT: u32 = 1000;
/// Versions kept when nothing says otherwise.
pub const DEFAULT_KEPT: u32 = 50;



/// Who is producing a new version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Produced {
    /// The call's trace id.
    pub trace_id: String,
    /// What it is.
    pub kind: Kind,
    /// An execution's exit code.
    pub exit: Option<i32>,
}

impl Produced {
    /// A Files API write.
    pub fn files() -> Produced {
        Produced { trace_id: String::new(), kind: Kind::Files, exit: None }
    }
}



/// A version's layers, in order.
pub fn layers_of(m: &Manifest, v: &Version) -> Vec<LayerRef> {
    let all: Vec<&LayerRef> = m.all_layers().collect();
    v.layers.iter().filter_map(|&i| all.get(i as usize).map(|l| (*l).clone())).collect()
}

/// The newest version `trace_id` produced.
pub fn find<'m>(m: &'m Manifest, trace_id: &str) -> Option<&'m Version> {
    m.history.iter().rev().find(|v| !v.trace_id.is_empty() && v.trace_id == trace_id)
}

/// A version with its layers spelled out (before re-indexing).
struct Spelled {
    meta: Version,
    layers: Vec<LayerRef>,
}

/// The versions of `m` spelled out; a manifest from before histories gets
/// its current state as one version of unknown origin.
fn spelled(m: &Manifest) -> Vec<Spelled> {
    if m.history.is_empty() {
        let meta = Version { trace_id: String::new(), kind: Kind::Execution, at: m.updated_at, bytes: m.bytes, exit: None, layers: Vec::new() };
        return vec![Spelled { meta, layers: m.layers.clone() }];
    }
    m.history.iter().map(|v| Spelled { meta: v.clone(), layers: layers_of(m, v) }).collect()
}

/// Sets `out`'s history to `versions` (the last is the current one, whose
/// layers `out.layers` already are), trimmed to `keep`, and its pool to the
/// layers the kept older versions name beyond the current ones.
fn index(out: &mut Manifest, mut versions: Vec<Spelled>, keep: Keep, now: u64) {
    let count = keep.count.clamp(1, MAX_KEPT) as usize;
    if versions.len() > count {
        versions.drain(..versions.len() - count);
    }
    let last = versions.len().saturating_sub(1);
    let young = |v: &Spelled| keep.max_age.is_none_or(|age| v.meta.at.saturating_add(age) > now);
    let versions: Vec<Spelled> = versions.into_iter().enumerate().filter(|(i, v)| *i == last || young(v)).map(|(_, v)| v).collect();
    let mut pool: Vec<LayerRef> = Vec::new();
    let mut history = Vec::with_capacity(versions.len());
    for v in versions {
        let layers = v.layers.iter().map(|l| position(&out.layers, &mut pool, l)).collect();
        history.push(Version { layers, ..v.meta });
    }
    out.history = history;
    out.pool = pool;
}

fn position(current: &[LayerRef], pool: &mut Vec<LayerRef>, l: &LayerRef) -> u32 {
    if let Some(i) = current.iter().position(|c| c.key == l.key) {
        return i as u32;
    }
    let i = match pool.iter().position(|p| p.key == l.key) {
        Some(i) => i,
        None => {
            pool.push(l.clone());
            pool.len() - 1
        }
    };
    (current.len() + i) as u32
}

/// The manifest after a save or restore: `next` (whose `layers` and `bytes`
/// are the new state) gets `prev`'s history with one more version — or,
/// when `produced` is `None` (nothing changed), the same versions.
pub fn advance(prev: Option<&Manifest>, mut next: Manifest, produced: Option<Produced>, keep: Keep) -> Manifest {
    let mut versions = prev.map(spelled).unwrap_or_default();
    if let Some(p) = produced {
        let meta = Version { trace_id: p.trace_id, kind: p.kind, at: next.updated_at, bytes: next.bytes, exit: p.exit, layers: Vec::new() };
        versions.push(Spelled { meta, layers: next.layers.clone() });
    }
    let now = next.updated_at;
    index(&mut next, versions, keep, now);
    next
}

/// A fork of `source` at its version `at` (an index into its history;
/// `None`: the current one): that version's state, and the versions up to
/// it, trimmed to `keep`. `base` carries the fork's own id, time and
/// retention.
pub fn fork(source: &Manifest, at: Option<usize>, mut base: Manifest, keep: Keep) -> Manifest {
    let mut versions = spelled(source);
    let upto = at.map_or(versions.len(), |i| (i + 1).min(versions.len()));
    versions.truncate(upto);
    match versions.last() {
        Some(v) => {
            base.layers = v.layers.clone();
            base.bytes = v.meta.bytes;
        }
        None => {
            base.layers.clear();
            base.bytes = 0;
        }
    }
    let now = base.updated_at;
    index(&mut base, versions, keep, now);
    base
}

#[cfg(test)]
mod tests;
