//! Async framing for the supervisor and init control sockets (the sync side
//! lives in `warren_isolation::wire`). Reading is cancel-safe, so frames can be
//! awaited inside `tokio::select!` next to output pipes and timers.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use warren_isolation::wire;

/// A control socket with a receive buffer.
pub struct Channel {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Channel {
    /// Wraps a connected socket.
    pub fn new(stream: UnixStream) -> Self {
        Channel { stream, buf: Vec::new() }
    }

    /// Next frame; `Ok(None)` at end of stream. Cancel-safe: bytes read before a
    /// cancellation stay in the buffer.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> io::Result<Option<T>> {
        loop {
            if let Some(frame) = self.take_frame()? {
                return wire::decode(&frame).map(Some);
            }
            self.buf.reserve(4096);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }

    fn take_frame(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > wire::MAX_FRAME {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too large"));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let frame = self.buf[4..4 + len].to_vec();
        self.buf.drain(..4 + len);
        Ok(Some(frame))
    }

    /// Sends one frame.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> io::Result<()> {
        let mut out = Vec::new();
        wire::write_frame(&mut out, msg)?;
        self.stream.write_all(&out).await
    }

    /// Sends one frame with `fds` attached to its first bytes (`SCM_RIGHTS`):
    /// the receiver has them no later than the frame's first byte.
    pub async fn send_with_fds<T: Serialize>(&mut self, msg: &T, fds: &[RawFd]) -> io::Result<()> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let mut out = Vec::new();
        wire::write_frame(&mut out, msg)?;
        let raw = self.stream.as_raw_fd();
        let sent = loop {
            self.stream.writable().await?;
            let attempt = self.stream.try_io(tokio::io::Interest::WRITABLE, || {
                sendmsg::<()>(raw, &[io::IoSlice::new(&out)], &[ControlMessage::ScmRights(fds)], MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
            });
            match attempt {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        self.stream.write_all(&out[sent..]).await
    }
}
