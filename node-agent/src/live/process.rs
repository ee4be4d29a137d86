//! One process of a live sandbox from the agent's side: the ends of its
//! stdio the agent keeps (pipes, or a terminal's master end from the
//! sandbox's own devpts), what it printed ([`Output`]) and its input.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::output::{Chunk, Output};
use super::LiveError;

/// Size of one output read.
const CHUNK: usize = 32 * 1024;

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// What a process is started with, besides the sandbox's own environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Start {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Its own variables, over the sandbox's.
    pub env: Vec<(String, String)>,
    /// Working directory (absolute); the home when `None`.
    pub cwd: Option<String>,
    /// Keep its stdin open for [`Process::input`] (else it reads nothing).
    pub stdin: bool,
    /// Run it on a terminal of this size.
    pub pty: Option<Size>,
    /// A name the caller gives it (E2B's `tag`).
    pub tag: Option<String>,
}

/// A started process.
pub struct Process {
    /// The sandbox's id for it (its pid inside, as callers name it).
    pub pid: i32,
    /// The agent's id for it (init's name for it).
    pub id: u64,
    /// How it was started.
    pub start: Start,
    /// Its output.
    pub output: Arc<Output>,
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    /// A terminal's master end (resizes go here).
    master: Option<OwnedFd>,
}

/// What a stream's bytes are.
type Kind = fn(Bytes) -> Chunk;

/// A process's stdio, before it starts.
pub struct Stdio {
    /// The process's stdin, stdout and stderr (sent to init).
    theirs: [OwnedFd; 3],
    ours: Ours,
}

/// The agent's ends of a process's stdio.
pub struct Ours {
    stdin: Option<pipe::Sender>,
    reads: Vec<(pipe::Receiver, Kind)>,
    master: Option<OwnedFd>,
}

fn os(e: impl Into<std::io::Error>) -> LiveError {
    LiveError::Io(e.into().to_string())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), LiveError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(os)
}

impl Stdio {
    /// Pipes: stdin (or /dev/null), stdout and stderr.
    pub fn pipes(stdin: bool) -> Result<Stdio, LiveError> {
        let (their_in, our_in) = match stdin {
            true => {
                let (r, w) = pipe()?;
                (r, Some(pipe::Sender::from_owned_fd(w).map_err(os)?))
            }
            false => (std::fs::File::open("/dev/null").map_err(os)?.into(), None),
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let reads = vec![(pipe::Receiver::from_owned_fd(out_r).map_err(os)?, Chunk::Stdout as Kind), (pipe::Receiver::from_owned_fd(err_r).map_err(os)?, Chunk::Stderr as Kind)];
        Ok(Stdio { theirs: [their_in, out_w, err_w], ours: Ours { stdin: our_in, reads, master: None } })
    }

    /// A terminal of the sandbox's own devpts (reached through init's
    /// root, so it is the sandbox's instance, not the node's).
    pub fn pty(init_pid: i32, size: Size) -> Result<Stdio, LiveError> {
        let (master, slave) = warren_isolation::sandbox::live::open_pty(init_pid).map_err(os)?;
        resize(&master, size)?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(os);
        let theirs = [dup(&slave)?, dup(&slave)?, slave];
        let reader = pipe::Receiver::from_owned_fd_unchecked(dup(&master)?).map_err(os)?;
        let writer = pipe::Sender::from_owned_fd_unchecked(dup(&master)?).map_err(os)?;
        Ok(Stdio { theirs, ours: Ours { stdin: Some(writer), reads: vec![(reader, Chunk::Pty as Kind)], master: Some(master) } })
    }

    /// The ends to send to init, and ours.
    pub fn split(self) -> ([OwnedFd; 3], Ours) {
        (self.theirs, self.ours)
    }
}

impl Ours {
    /// The process started as `pid` with `start`: its output is read from now on.
    pub fn started(self, id: u64, pid: i32, start: Start) -> Arc<Process> {
        let output = Arc::new(Output::new(self.reads.len() as u8));
        for (rx, kind) in self.reads {
            tokio::spawn(read(rx, kind, output.clone()));
        }
        Arc::new(Process { pid, id, start, output, stdin: tokio::sync::Mutex::new(self.stdin), master: self.master })
    }
}

fn resize(master: &OwnedFd, size: Size) -> Result<(), LiveError> {
    warren_isolation::sandbox::live::set_pty_size(master, size.rows, size.cols).map_err(os)
}

/// Reads one stream into `output` until its end. Once the process has
/// exited, what is already in the pipe is read and the stream ends: what
/// it left running may keep the pipe open, and its end is the process's.
async fn read(mut rx: pipe::Receiver, kind: Kind, output: Arc<Output>) {
    let mut buf = vec![0u8; CHUNK];
    let mut exit = output.watch();
    loop {
        if output.ended().is_some() {
            // A read(2) of its own: tokio's `try_read` trusts readiness it
            // may not have been told of yet, and would miss the last output.
            let mut left = super::output::REPLAY_BYTES;
            while let Ok(n) = nix::unistd::read(&rx, &mut buf) {
                if n == 0 || left == 0 {
                    break;
                }
                left = left.saturating_sub(n);
                output.push(kind(Bytes::copy_from_slice(&buf[..n])));
            }
            break;
        }
        tokio::select! {
            n = rx.read(&mut buf) => match n {
                Ok(n) if n > 0 => output.push(kind(Bytes::copy_from_slice(&buf[..n]))),
                // EOF, or EIO from a terminal whose last user is gone.
                _ => break,
            },
            _ = exit.changed() => {}
        }
    }
    output.close_stream();
}

impl Process {
    /// Writes `data` to its stdin (or terminal).
    pub async fn input(&self, data: &[u8]) -> Result<(), LiveError> {
        let mut stdin = self.stdin.lock().await;
        let Some(w) = stdin.as_mut() else { return Err(LiveError::NoStdin) };
        match tokio::time::timeout(super::INPUT_WAIT, w.write_all(data)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(LiveError::NoStdin),
            Err(_) => Err(LiveError::InputStalled),
        }
    }

    /// Closes its stdin (EOF); a terminal's stays open.
    pub async fn close_input(&self) -> Result<(), LiveError> {
        if self.master.is_some() {
            return Err(LiveError::NoStdin);
        }
        self.stdin.lock().await.take().map(drop).ok_or(LiveError::NoStdin)
    }

    /// Resizes its terminal.
    pub fn resize(&self, size: Size) -> Result<(), LiveError> {
        let master = self.master.as_ref().ok_or(LiveError::NotATerminal)?;
        resize(master, size)
    }
}
