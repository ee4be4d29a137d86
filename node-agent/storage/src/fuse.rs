//! The FUSE face of an [`ObjectTree`]: the node-agent serves it (outside
//! the sandbox) at a host path that the sandbox then sees at `/data/<name>`
//! — a session mounted ahead of the call ([`premount`], see
//! [`crate::pool`]) bound there, or one mounted for the call alone.
//!
//! Each kernel request becomes a task on the agent's runtime, so a slow
//! store never blocks the others; writes go to the staged file directly
//! (a local `pwrite`). Files and directories belong to the program's host
//! uid, owner-only (0600/0700), and the kernel checks permissions
//! (`default_permissions`), so no other user of the host reads a bucket
//! through the mount point; a read-only mount shows no write bits and
//! refuses every change with EROFS besides.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenAccMode, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::{Attr, FsError, Kind, ObjectTree};

/// How long the kernel may cache names and attributes: the tree is this
/// call's view (a second in-flight write from elsewhere shows on the next
/// lookup after this long).
const TTL: Duration = Duration::from_secs(1);

/// A mounted tree; unmounted when dropped.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    /// Where a pooled session was bound for its call (unmounted first).
    bound: Option<PathBuf>,
    /// The pool's mount point of the session (removed last).
    pool_dir: Option<PathBuf>,
}

impl Mounted {
    /// Unmounts and waits for the server thread.
    pub fn unmount(mut self) -> io::Result<()> {
        self.take_down()
    }

    fn take_down(&mut self) -> io::Result<()> {
        if let Some(at) = self.bound.take() {
            let _ = umount2(&at, MntFlags::MNT_DETACH);
        }
        let out = match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        };
        if let Some(dir) = self.pool_dir.take() {
            let _ = std::fs::remove_dir(dir);
        }
        out
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.take_down();
    }
}

/// A FUSE session mounted ahead of any call, serving nothing yet (its root
/// is an empty directory no one may enter). [`Premounted::serve`] gives it
/// a call's tree and binds it where the sandbox sees it: a bind is a
/// fraction of the cost of a FUSE mount, which the pool pays off the
/// request path.
pub struct Premounted {
    session: fuser::BackgroundSession,
    slot: Arc<OnceLock<Slot>>,
    at: PathBuf,
}

/// Mounts a session at `at` (an empty directory) whose tree comes later.
pub fn premount(at: &Path, rt: tokio::runtime::Handle) -> io::Result<Premounted> {
    let options = vec![MountOption::FSName("warren".into()), MountOption::Subtype("warren".into()), MountOption::DefaultPermissions, MountOption::NoDev, MountOption::NoSuid, MountOption::NoExec];
    let mut config = Config::default();
    config.mount_options = options;
    // The sandbox's program is not the mounting user.
    config.acl = SessionACL::All;
    let slot = Arc::new(OnceLock::new());
    let fs = MountFs { slot: slot.clone(), rt };
    Ok(Premounted { session: fuser::spawn_mount2(fs, at, &config)?, slot, at: at.to_path_buf() })
}

impl Premounted {
    /// Unmounts a session no call took, and removes its mount point.
    pub fn discard(self) -> io::Result<()> {
        let out = self.session.umount_and_join();
        let _ = std::fs::remove_dir(&self.at);
        out
    }

    /// Serves `tree` for files owned by host `uid`/`gid`, at `target` (an
    /// empty directory; `None`: where it was mounted). A read-only tree is
    /// also read-only at the mount, so the kernel refuses writes itself.
    pub fn serve(self, tree: Arc<ObjectTree>, uid: u32, gid: u32, target: Option<&Path>) -> io::Result<Mounted> {
        let read_only = tree.read_only();
        let _ = self.slot.set(Slot { view: AttrView { uid, gid }, tree });
        let mut mounted = Mounted { session: Some(self.session), bound: None, pool_dir: None };
        let at = match target {
            Some(t) => {
                mounted.pool_dir = Some(self.at.clone());
                mount(Some(&self.at), t, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(io::Error::from)?;
                mounted.bound = Some(t.to_path_buf());
                t.to_path_buf()
            }
            None => self.at.clone(),
        };
        if read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(None::<&str>, &at, None::<&str>, flags, None::<&str>).map_err(io::Error::from)?;
        }
        Ok(mounted)
    }
}

/// Serves `tree` at `at` (an empty directory) for files owned by host
/// `uid`/`gid`, on the runtime `rt`: a mount made for this call alone.
pub fn mount_tree(tree: Arc<ObjectTree>, at: &Path, uid: u32, gid: u32, rt: tokio::runtime::Handle) -> io::Result<Mounted> {
    premount(at, rt)?.serve(tree, uid, gid, None)
}

/// A call's tree and who owns its files.
struct Slot {
    tree: Arc<ObjectTree>,
    view: AttrView,
}

struct MountFs {
    slot: Arc<OnceLock<Slot>>,
    rt: tokio::runtime::Handle,
}

/// The root of a session that serves nothing yet: root's, closed to all.
fn unserved_root() -> FileAttr {
    let view = AttrView { uid: 0, gid: 0 };
    let mut a = view.attr(&Attr { ino: crate::ROOT, kind: Kind::Dir, size: 0, mtime: std::time::UNIX_EPOCH });
    a.perm = 0;
    a
}

/// The call's tree, or (before one is set) the error for the request.
macro_rules! served {
    ($self:ident, $reply:ident) => {
        match $self.slot.get() {
            Some(s) => (s.tree.clone(), s.view),
            None => return $reply.error(Errno::from_i32(libc::EACCES)),
        }
    };
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

impl MountFs {
    /// Runs `f` on the runtime, bounded by the call's deadline, and hands
    /// its result to `done`.
    fn spawn<T: Send + 'static>(&self, f: impl std::future::Future<Output = Result<T, FsError>> + Send + 'static, done: impl FnOnce(Result<T, FsError>) + Send + 'static) {
        let deadline = self.slot.get().and_then(|s| s.tree.deadline());
        self.rt.spawn(async move { done(crate::error::by_deadline(deadline, f).await) });
    }
}

fn name_of(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

impl Filesystem for MountFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> io::Result<()> {
        // Larger requests: fewer round trips through the kernel per MiB.
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (tree, me) = served!(self, reply);
        let name = name_of(name);
        self.spawn(async move { tree.lookup(parent.0, &name).await }, move |r| match r {
            Ok(a) => reply.entry(&TTL, &me.attr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(s) = self.slot.get() else {
            return match ino.0 {
                crate::ROOT => reply.attr(&Duration::ZERO, &unserved_root()),
                _ => reply.error(Errno::from_i32(libc::ENOENT)),
            };
        };
        match s.tree.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &s.view.attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (tree, me) = served!(self, reply);
        // Objects have no owners to change; modes and times are not kept.
        if uid.is_some_and(|u| u != me.uid) || gid.is_some_and(|g| g != me.gid) {
            return reply.error(Errno::from_i32(libc::EPERM));
        }
        self.spawn(
            async move {
                match size {
                    Some(size) => {
                        tree.open_write(ino.0, false).await?;
                        tree.truncate(ino.0, size)
                    }
                    None => tree.getattr(ino.0),
                }
            },
            move |r| match r {
                Ok(a) => reply.attr(&TTL, &me.attr(&a)),
                Err(e) => reply.error(errno(&e)),
            },
        );
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        let (tree, me) = served!(self, reply);
        let name = name_of(name);
        self.spawn(async move { tree.mkdir(parent.0, &name).await }, move |r| match r {
            Ok(a) => reply.entry(&TTL, &me.attr(&a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (tree, _) = served!(self, reply);
        let name = name_of(name);
        self.spawn(async move { tree.unlink(parent.0, &name).await }, move |r| empty(reply, r));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (tree, _) = served!(self, reply);
        let name = name_of(name);
        self.spawn(async move { tree.rmdir(parent.0, &name).await }, move |r| empty(reply, r));
    }

    fn rename(&self, _req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr, flags: RenameFlags, reply: ReplyEmpty) {
        // RENAME_EXCHANGE and RENAME_NOREPLACE need atomicity a store lacks.
        if flags.bits() != 0 {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let (tree, _) = served!(self, reply);
        let (name, newname) = (name_of(name), name_of(newname));
        self.spawn(async move { tree.rename(parent.0, &name, newparent.0, &newname).await }, move |r| empty(reply, r));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (tree, _) = served!(self, reply);
        if flags.acc_mode() == OpenAccMode::O_RDONLY {
            return reply.opened(FileHandle(0), FopenFlags::empty());
        }
        let truncate = flags.0 & libc::O_TRUNC != 0;
        self.spawn(async move { tree.open_write(ino.0, truncate).await }, move |r| match r {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, _flags: i32, reply: ReplyCreate) {
        let (tree, me) = served!(self, reply);
        let name = name_of(name);
        self.spawn(async move { tree.create(parent.0, &name).await }, move |r| match r {
            Ok(a) => reply.created(&TTL, &me.attr(&a), Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn read(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, size: u32, _flags: OpenFlags, _lock: Option<LockOwner>, reply: ReplyData) {
        let (tree, _) = served!(self, reply);
        self.spawn(async move { tree.read(ino.0, offset, size).await }, move |r| match r {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn write(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, data: &[u8], _wf: WriteFlags, _flags: OpenFlags, _lock: Option<LockOwner>, reply: ReplyWrite) {
        let (tree, _) = served!(self, reply);
        // A local pwrite: done here, without copying the data to a task.
        match tree.write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _lock: LockOwner, reply: ReplyEmpty) {
        // Each close() uploads what changed, so a failure reaches the program.
        let (tree, _) = served!(self, reply);
        self.spawn(async move { tree.flush(ino.0).await }, move |r| empty(reply, r));
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let (tree, _) = served!(self, reply);
        self.spawn(async move { tree.flush(ino.0).await }, move |r| empty(reply, r));
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let (tree, _) = served!(self, reply);
        self.spawn(async move { tree.readdir(ino.0).await }, move |r| match r {
            Ok(entries) => {
                let dots = [(ino.0, FileType::Directory, ".".to_string()), (ino.0, FileType::Directory, "..".to_string())];
                let all = dots.into_iter().chain(entries.into_iter().map(|(name, a)| {
                    let kind = if a.kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
                    (a.ino, kind, name)
                }));
                // The offset is the index of the next entry to send.
                for (i, (entry_ino, kind, name)) in all.enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(entry_ino), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // A bucket has no size: report plenty, in 1 MiB blocks.
        reply.statfs(1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 20, crate::name::NAME_MAX as u32, 1 << 20);
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// The attribute-building part of [`MountFs`], movable into tasks.
#[derive(Clone, Copy)]
struct AttrView {
    uid: u32,
    gid: u32,
}

impl AttrView {
    fn attr(&self, a: &Attr) -> FileAttr {
        // Owner-only: the mount point is visible in the host's mountinfo,
        // and no other host user may read the bucket through it.
        // A read-only tree is mounted read-only: its owner keeps the write
        // bit, as on any read-only filesystem, so a write fails at the mount
        // with EROFS ("Read-only file system") rather than a puzzling
        // EACCES; the server refuses it again with EROFS besides.
        let write = 0o200;
        let (kind, perm) = match a.kind {
            Kind::Dir => (FileType::Directory, 0o500 | write),
            Kind::File => (FileType::RegularFile, 0o400 | write),
        };
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: a.mtime,
            mtime: a.mtime,
            ctime: a.mtime,
            crtime: a.mtime,
            kind,
            perm,
            nlink: if a.kind == Kind::Dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }
}
