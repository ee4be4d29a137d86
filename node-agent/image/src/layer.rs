//! Unpacks one image layer (a tar stream, already decompressed) into a
//! directory that becomes an overlayfs lower layer.
//!
//! The layer is hostile. Every file operation is relative to a directory
//! opened with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (see [`warren_confined`]),
//! so no entry — `../x`, an absolute path, a path through a symlink the layer
//! itself planted, a hard link to a file outside it — can touch anything but
//! the layer's own directory. What is neutralised rather than refused:
//! device nodes and fifos (skipped), set-id bits (cleared), owners above
//! 65535 (shown as nobody), extended attributes (never applied, so no file
//! capabilities and no forged overlay whiteouts). Sizes and entry counts
//! are charged to a [`Budget`] shared by every layer of an image.

use std::io::{self, Read};

use rustix::fs::Mode;
use tar::{EntryType, PaxExtensions};

use warren_confined::{Dir, Marker, PathError, RelPath};

/// Largest GNU long-name or PAX header accepted (the tar crate would read
/// any size into memory).
const MAX_HEADER: u64 = 64 << 10;
/// Owners above this are shown as `nobody`.
const MAX_ID: u64 = 65_535;
const NOBODY: u32 = 65_534;

/// Why a layer could not be unpacked.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The layer does something no honest image does.
    #[error("layer refused: {0}")]
    Refused(String),
    /// A limit was reached.
    #[error("image exceeds the node's limit of {0}")]
    TooLarge(String),
    /// A tar feature Warren does not unpack.
    #[error("unsupported layer content: {0}")]
    Unsupported(String),
    /// Reading the stream or writing the store failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

impl LayerError {
    pub(crate) fn refused(why: impl Into<String>) -> LayerError {
        LayerError::Refused(why.into())
    }

    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> LayerError {
        let context = context.into();
        move |source| match source.get_ref().and_then(|e| e.downcast_ref::<OverBudget>()) {
            Some(OverBudget(what)) => LayerError::TooLarge(what.clone()),
            None => LayerError::Io { context, source },
        }
    }
}

impl From<PathError> for LayerError {
    fn from(e: PathError) -> LayerError {
        LayerError::Refused(e.0)
    }
}

/// An over-budget signal carried through `io::Error` out of the tar reader.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct OverBudget(pub String);

/// What an image may still use: shared by all its layers.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Uncompressed bytes left (tar stream, headers included).
    pub bytes: u64,
    /// Entries left.
    pub entries: u64,
}

/// What unpacking did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries applied (files, dirs, links, whiteouts).
    pub entries: u64,
    /// Entries skipped or altered for safety (devices, fifos, set-id bits, xattrs, high owners).
    pub neutralised: u64,
}

/// Entry metadata gathered from the header and any preceding extension headers.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    uid: Option<u64>,
    gid: Option<u64>,
    xattrs: bool,
}

/// Applies the tar stream `tar` to the empty directory `root`.
pub fn apply(tar: impl Read, root: &Dir, budget: &mut Budget) -> Result<LayerStats, LayerError> {
    let mut archive = tar::Archive::new(tar);
    let mut stats = LayerStats::default();
    let mut pending = Pending::default();
    // Raw mode: extension headers come to us, so their size is bounded here.
    for entry in archive.entries().map_err(LayerError::io("read layer"))?.raw(true) {
        let mut entry = entry.map_err(LayerError::io("read layer"))?;
        let kind = entry.header().entry_type();
        match kind {
            EntryType::GNULongName => pending.path = Some(read_header(&mut entry)?),
            EntryType::GNULongLink => pending.link = Some(read_header(&mut entry)?),
            EntryType::XHeader => read_pax(&read_header(&mut entry)?, &mut pending)?,
            EntryType::XGlobalHeader => {}
            EntryType::GNUSparse => return Err(LayerError::Unsupported("sparse files".into())),
            _ => {
                if budget.entries == 0 {
                    return Err(LayerError::TooLarge("entries per image".into()));
                }
                budget.entries -= 1;
                let meta = std::mem::take(&mut pending);
                apply_entry(root, &mut entry, meta, &mut stats)?;
            }
        }
    }
    Ok(stats)
}

fn read_header<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Vec<u8>, LayerError> {
    let size = entry.header().entry_size().map_err(LayerError::io("extension header"))?;
    if size > MAX_HEADER {
        return Err(LayerError::refused(format!("extension header of {size} bytes")));
    }
    let mut out = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut out).map_err(LayerError::io("extension header"))?;
    // GNU long names are NUL-terminated.
    while out.last() == Some(&0) {
        out.pop();
    }
    Ok(out)
}

fn read_pax(data: &[u8], pending: &mut Pending) -> Result<(), LayerError> {
    for ext in PaxExtensions::new(data) {
        let ext = ext.map_err(LayerError::io("PAX header"))?;
        let number = || ext.value().ok().and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| LayerError::refused("malformed PAX number"));
        match ext.key_bytes() {
            b"path" => pending.path = Some(ext.value_bytes().to_vec()),
            b"linkpath" => pending.link = Some(ext.value_bytes().to_vec()),
            b"uid" => pending.uid = Some(number()?),
            b"gid" => pending.gid = Some(number()?),
            // A PAX size would change where the next header starts, which the
            // raw reader does not follow; only > 8 GiB files need it.
            b"size" => return Err(LayerError::Unsupported("PAX size records (files over 8 GiB)".into())),
            k if k.starts_with(b"GNU.sparse") => return Err(LayerError::Unsupported("sparse files".into())),
            k if k.starts_with(b"SCHILY.xattr.") || k.starts_with(b"LIBARCHIVE.xattr.") => pending.xattrs = true,
            _ => {}
        }
    }
    Ok(())
}

// Long: one match arm per tar entry type, each confined beneath the layer root the same way.
fn apply_entry<R: Read>(root: &Dir, entry: &mut tar::Entry<'_, R>, meta: Pending, stats: &mut LayerStats) -> Result<(), LayerError> {
    let header = entry.header();
    let raw_path = meta.path.unwrap_or_else(|| header.path_bytes().into_owned());
    let path = RelPath::parse(&raw_path)?;
    let shown = path.display();
    let io_err = |what: &str| entry_error(format!("{what} {shown}"));
    let kind = header.entry_type();
    let mode = header.mode().map_err(io_err("mode of"))?;
    let (uid, clamped_uid) = owner(meta.uid.map_or_else(|| header.uid(), Ok).map_err(io_err("owner of"))?);
    let (gid, clamped_gid) = owner(meta.gid.map_or_else(|| header.gid(), Ok).map_err(io_err("group of"))?);
    let mtime = header.mtime().unwrap_or(0);
    if meta.xattrs || clamped_uid || clamped_gid {
        stats.neutralised += 1;
    }
    let Some((parent, name)) = path.split_last() else {
        // The layer's root: its attributes are Warren's, not the image's.
        stats.entries += 1;
        return Ok(());
    };
    match Marker::of(name).map_err(|_| LayerError::refused(format!("whiteout {shown} names no single file")))? {
        Some(Marker::Ignored) => return Ok(()),
        Some(Marker::Opaque) => {
            let dir = root.make_dirs(&parent).map_err(io_err("open dir of"))?;
            dir.set_opaque().map_err(io_err("mark opaque"))?;
            stats.entries += 1;
            return Ok(());
        }
        Some(Marker::Whiteout(hidden)) => {
            let dir = root.make_dirs(&parent).map_err(io_err("open dir of"))?;
            dir.whiteout(hidden).map_err(io_err("whiteout"))?;
            stats.entries += 1;
            return Ok(());
        }
        None => {}
    }
    let set_id = mode & 0o6000 != 0;
    let perm = Mode::from_raw_mode(mode & if kind.is_dir() { 0o1777 } else { 0o777 });
    let dir = root.make_dirs(&parent).map_err(io_err("open dir of"))?;
    if set_id && matches!(kind, EntryType::Directory | EntryType::Regular | EntryType::Continuous) {
        stats.neutralised += 1;
    }
    match kind {
        EntryType::Directory => dir.make_dir(name, perm, uid, gid).map_err(io_err("mkdir"))?,
        EntryType::Regular | EntryType::Continuous => {
            dir.write_file(name, entry, perm, (uid, gid), mtime).map_err(io_err("write"))?;
        }
        EntryType::Symlink => {
            let target = meta.link.unwrap_or_else(|| header.link_name_bytes().map(|c| c.into_owned()).unwrap_or_default());
            if target.is_empty() || target.len() > warren_confined::path::MAX_PATH || target.contains(&0) {
                return Err(LayerError::refused(format!("symlink {shown} has an invalid target")));
            }
            // Symlinks are only data here: nothing below follows them, and
            // inside the sandbox they resolve within its own root.
            dir.symlink(name, &target, (uid, gid), mtime).map_err(io_err("symlink"))?;
        }
        EntryType::Link => {
            let target = meta.link.unwrap_or_else(|| header.link_name_bytes().map(|c| c.into_owned()).unwrap_or_default());
            let target = RelPath::parse(&target)?;
            root.hard_link(&target, &dir, name).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => LayerError::refused(format!("hard link {shown} points outside the layer")),
                io::ErrorKind::InvalidInput => LayerError::refused(format!("hard link {shown} does not point to a file")),
                _ => io_err("hard link")(e),
            })?;
        }
        EntryType::Char | EntryType::Block | EntryType::Fifo => {
            stats.neutralised += 1;
            return Ok(());
        }
        other => return Err(LayerError::Unsupported(format!("tar entry type {other:?} at {shown}"))),
    }
    stats.entries += 1;
    Ok(())
}

/// Maps what a hostile layer provokes to a refusal, the rest to I/O errors.
fn entry_error(context: String) -> impl FnOnce(io::Error) -> LayerError {
    move |e| {
        let why = match rustix::io::Errno::from_io_error(&e) {
            Some(rustix::io::Errno::LOOP) => "passes through a symlink",
            Some(rustix::io::Errno::NOTDIR) => "passes through a symlink or file",
            Some(rustix::io::Errno::NOTEMPTY) => "replaces a non-empty directory",
            Some(rustix::io::Errno::XDEV) => "leaves the layer",
            _ => return LayerError::io(context)(e),
        };
        LayerError::Refused(format!("{context}: {why}"))
    }
}

fn owner(id: u64) -> (u32, bool) {
    if id > MAX_ID {
        (NOBODY, true)
    } else {
        (id as u32, false)
    }
}


#[cfg(test)]
#[path = "layer_tests.rs"]
mod tests;
