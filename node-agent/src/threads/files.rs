//! A thread's saved home from outside any sandbox (the Files API): list and
//! read its files from the warm copy, and write one file as a save of its
//! own, exactly as an execution's changes are saved (a new layer, the size
//! limit, compare-and-swap publication). Paths never leave the home: every
//! lookup goes through [`warren_confined::Dir`], which follows no symlink.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use warren_confined::dir::not_a_dir;
use warren_confined::{Dir, Kind};
use super::history::Produced;
use super::manifest::{new_id, ThreadOptions};
use super::{blocking, io_err, layer, mkdir_private, Restored, Saved, ThreadError, Threads};

/// One regular file of a home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeFile {
    /// Path relative to the home.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, Unix seconds.
    pub modified: i64,
}

/// A staged upload: a fresh upper directory holding one file.
#[derive(Debug)]
pub struct Staged {
    upper: PathBuf,
    /// Where the bytes go.
    pub file: File,
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.upper);
    }
}

/// Whether `rel` is a relative path of plain names (or empty).
pub fn is_plain(rel: &Path) -> bool {
    warren_confined::path::is_plain_relative(rel)
}

fn bad_path() -> ThreadError {
    ThreadError::Io { step: "resolving the path", source: io::Error::new(io::ErrorKind::InvalidInput, "not a plain relative path") }
}

impl Threads {
    /// The home as it is now; `NotFound` for a thread that does not exist.
    async fn existing(&self, options: ThreadOptions) -> Result<Restored, ThreadError> {
        let lock = self.lock(&options.key).await?;
        if self.manifest(&options.key).await?.0.is_none() {
            return Err(ThreadError::NotFound);
        }
        self.restore(options, lock).await
    }

    /// Regular files at or below `rel`, at most `max` (and whether more exist).
    pub async fn list_files(&self, options: ThreadOptions, rel: &Path, max: usize) -> Result<(Vec<HomeFile>, bool), ThreadError> {
        if !is_plain(rel) {
            return Err(bad_path());
        }
        let home = self.existing(options).await?;
        let (state, rel) = (home.state.clone(), rel.to_path_buf());
        blocking("listing the thread's files", move || list(&state, &rel, max)).await
    }

    /// The regular file at `rel`, open for reading (it stays readable after
    /// the thread moves on). `NotFound` when there is none.
    pub async fn open_file(&self, options: ThreadOptions, rel: &Path) -> Result<File, ThreadError> {
        if !is_plain(rel) || rel.as_os_str().is_empty() {
            return Err(bad_path());
        }
        let home = self.existing(options).await?;
        let (state, rel) = (home.state.clone(), rel.to_path_buf());
        blocking("opening the thread file", move || open(&state, &rel)).await?.ok_or(ThreadError::NotFound)
    }

    /// Deletes the regular file at `rel` as a save of its own: an upper
    /// directory holding only its whiteout, as overlayfs would leave had a
    /// program removed it. `NotFound` when there is no such file (a
    /// directory or a symlink is not one).
    pub async fn delete_file(&self, options: ThreadOptions, rel: &Path) -> Result<Saved, ThreadError> {
        if !is_plain(rel) || rel.as_os_str().is_empty() {
            return Err(bad_path());
        }
        let home = self.existing(options).await?;
        let (state, r) = (home.state.clone(), rel.to_path_buf());
        if blocking("finding the thread file", move || open(&state, &r)).await?.is_none() {
            return Err(ThreadError::NotFound);
        }
        let upper = self.spool.join(format!("delete-{}", new_id()));
        mkdir_private(&upper).map_err(io_err("staging the deletion"))?;
        let saved = match whiteout(&upper, rel).map_err(io_err("staging the deletion")) {
            Ok(()) => self.save_measured(&home, &upper, layer::IdMap::CANONICAL, Some(4096), Produced::files()).await,
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_dir_all(&upper);
        saved
    }

    /// A fresh upper directory with an empty file at `rel`, owned by the
    /// sandbox user, for [`Threads::save_staged`].
    pub fn stage(&self, rel: &Path) -> Result<Staged, ThreadError> {
        let name = rel.file_name().filter(|_| is_plain(rel)).ok_or_else(bad_path)?;
        let upper = self.spool.join(format!("upload-{}", new_id()));
        mkdir_private(&upper).map_err(io_err("staging the upload"))?;
        let staged = |upper: &Path| -> io::Result<File> {
            let path = parents(upper, rel)?.join(name);
            let f = File::create(&path)?;
            std::os::unix::fs::chown(&path, Some(1000), Some(1000))?;
            Ok(f)
        };
        let file = staged(&upper);
        let file = file.map_err(io_err("staging the upload"));
        match file {
            Ok(file) => Ok(Staged { upper, file }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&upper);
                Err(e)
            }
        }
    }

    /// Saves a staged file into the thread (creating it when new).
    pub async fn save_staged(&self, options: ThreadOptions, staged: Staged) -> Result<Saved, ThreadError> {
        let size = staged.file.metadata().map_err(io_err("sizing the upload"))?.len();
        let lock = self.lock(&options.key).await?;
        let home = self.restore(options, lock).await?;
        self.save_measured(&home, &staged.upper, layer::IdMap::CANONICAL, Some(size + 4096), Produced::files()).await
    }
}

/// `rel`'s parent directories below the fresh `upper`, owned by the
/// sandbox user as a program's would be; returns the innermost.
fn parents(upper: &Path, rel: &Path) -> io::Result<PathBuf> {
    let mut dir = upper.to_path_buf();
    for part in rel.parent().into_iter().flat_map(Path::components) {
        dir.push(part);
        std::fs::create_dir(&dir)?;
        std::os::unix::fs::chown(&dir, Some(1000), Some(1000))?;
    }
    Ok(dir)
}

/// An overlay whiteout (a 0/0 character device) for `rel` below `upper`.
fn whiteout(upper: &Path, rel: &Path) -> io::Result<()> {
    let name = rel.file_name().ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let at = parents(upper, rel)?.join(name);
    nix::sys::stat::mknod(&at, nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::empty(), 0).map_err(io::Error::from)
}

fn list(state: &Path, rel: &Path, max: usize) -> io::Result<(Vec<HomeFile>, bool)> {
    let tree = Dir::open(state)?;
    let mut out = Vec::new();
    let named = if rel.as_os_str().is_empty() { None } else { tree.stat_path(rel)? };
    if let Some(st) = named {
        if st.kind == Kind::File {
            out.push(HomeFile { path: rel.to_string_lossy().into_owned(), size: st.size, modified: st.mtime });
            return Ok((out, false));
        }
    }
    let dir = match tree.dir(rel) {
        Ok(d) => d,
        Err(e) if not_a_dir(&e) => return Ok((out, false)),
        Err(e) => return Err(e),
    };
    let truncated = walk(dir, rel, max, &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((out, truncated))
}

/// Adds the regular files below `dir` (at `rel`); true when `max` was reached.
fn walk(dir: Dir, rel: &Path, max: usize, out: &mut Vec<HomeFile>) -> io::Result<bool> {
    for name in dir.names()? {
        let Some(st) = dir.stat(&name)? else { continue };
        let path = rel.join(&name);
        match st.kind {
            Kind::File => {
                if out.len() >= max {
                    return Ok(true);
                }
                out.push(HomeFile { path: path.to_string_lossy().into_owned(), size: st.size, modified: st.mtime });
            }
            Kind::Dir => {
                if walk(dir.open_dir(&name)?, &path, max, out)? {
                    return Ok(true);
                }
            }
            Kind::Symlink | Kind::Other => {}
        }
    }
    Ok(false)
}

fn open(state: &Path, rel: &Path) -> io::Result<Option<File>> {
    let tree = Dir::open(state)?;
    let (dir, name): (_, &OsStr) = match tree.parent(rel) {
        Ok(p) => p,
        Err(e) if not_a_dir(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    match dir.stat(name)? {
        Some(st) if st.kind == Kind::File => dir.open_file(name).map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_and_opening_never_follow_links_out_of_the_home() {
        let home = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host").unwrap();
        std::fs::create_dir_all(home.path().join("work/sub")).unwrap();
        std::fs::write(home.path().join("work/a.txt"), "a").unwrap();
        std::fs::write(home.path().join("work/sub/b.txt"), "bb").unwrap();
        std::os::unix::fs::symlink(outside.path(), home.path().join("work/out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), home.path().join("work/link")).unwrap();
        let (files, more) = list(home.path(), Path::new("work"), 100).unwrap();
        let names: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        assert_eq!((names, more), (vec![("work/a.txt", 1), ("work/sub/b.txt", 2)], false));
        assert!(open(home.path(), Path::new("work/link")).unwrap().is_none(), "a symlink is not served");
        assert!(open(home.path(), Path::new("work/out/secret")).unwrap().is_none(), "nor a path through one");
        assert!(open(home.path(), Path::new("work/a.txt")).unwrap().is_some());
        assert_eq!(list(home.path(), Path::new("work/out"), 100).unwrap().0, vec![]);
        assert_eq!(list(home.path(), Path::new(""), 1).unwrap().1, true, "truncated at max");
        assert!(!is_plain(Path::new("../x")) && !is_plain(Path::new("/etc")) && is_plain(Path::new("a/b")));
    }
}
