//! The live-sandbox RPCs over [`LiveSandboxes`]: proto in, domain call,
//! proto out (the gRPC adapter's half for live sandboxes; `crate::service`
//! calls it). Creation goes through the backend's admission (in
//! `crate::service`); everything else is here.

use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tonic::Status;
use warren_proto::agent::{self as pb, live_event::Event as Ev};

use crate::live::output::{Chunk, Item};
use crate::live::{Attached, LiveError, LiveSandbox, LiveSandboxes, Process, Size, Start};
use crate::refusal::{self, invalid};

/// The agent's longest live-sandbox lifetime.
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// A live sandbox's name (`<namespace>/<key>/<id>`), checked.
pub fn name(r: Option<pb::LiveRef>) -> Result<String, Status> {
    let r = r.and_then(|r| r.r#ref).ok_or_else(|| invalid("live.ref", "required"))?;
    let key = crate::convert::thread_key(Some(r))?;
    Ok(key.rel())
}

/// A lifetime in milliseconds, within 1 ms..=[`MAX_LIFETIME`].
pub fn lifetime(ms: u64) -> Result<Duration, Status> {
    let d = Duration::from_millis(ms);
    if ms == 0 || d > MAX_LIFETIME {
        return Err(invalid("lifetime_ms", &format!("from 1 to {} ms", MAX_LIFETIME.as_millis())));
    }
    Ok(d)
}

fn size(p: &pb::PtySize) -> Result<Size, Status> {
    let c = |v: u32| u16::try_from(v).map_err(|_| invalid("pty", "rows and cols from 1 to 1000"));
    Ok(Size { rows: c(p.rows)?, cols: c(p.cols)? })
}

fn sandbox(all: &LiveSandboxes, r: Option<pb::LiveRef>) -> Result<Arc<LiveSandbox>, Status> {
    all.get(&name(r)?).map_err(|e| refusal::status(&e))
}

fn status(e: LiveError) -> Status {
    refusal::status(&e)
}

/// The event of an output item.
fn event(item: Item) -> pb::LiveEvent {
    let ev = match item {
        Item::Data(Chunk::Stdout(b)) => Ev::Stdout(b.to_vec()),
        Item::Data(Chunk::Stderr(b)) => Ev::Stderr(b.to_vec()),
        Item::Data(Chunk::Pty(b)) => Ev::Pty(b.to_vec()),
        Item::End(e) => Ev::Ended(pb::live_event::Ended { exit_code: e.code, signal: e.signal }),
    };
    pb::LiveEvent { event: Some(ev) }
}

/// A process's stream: `started`, then its output from `cursor` to its end.
/// A caller that goes away only stops reading; the process runs on.
pub type Events = std::pin::Pin<Box<dyn Stream<Item = Result<pb::LiveEvent, Status>> + Send>>;

/// Follows `p` while the stream lives (the sandbox is not idle meanwhile).
fn follow(attached: Attached, p: Arc<Process>, mut cursor: u64) -> Events {
    Box::pin(async_stream::stream! {
        let _attached = attached;
        yield Ok(pb::LiveEvent { event: Some(Ev::Started(pb::live_event::Started { pid: p.pid })) });
        loop {
            let item = p.output.next(&mut cursor).await;
            let end = matches!(item, Item::End(_));
            yield Ok(event(item));
            if end {
                return;
            }
        }
    })
}

/// `LiveStart`.
pub async fn start(all: &LiveSandboxes, req: pb::LiveStartRequest) -> Result<Events, Status> {
    let s = sandbox(all, req.live)?;
    let start = Start {
        argv: req.argv,
        env: req.env.into_iter().collect(),
        cwd: Some(req.cwd).filter(|c| !c.is_empty()),
        stdin: req.stdin,
        pty: req.pty.as_ref().map(size).transpose()?,
        tag: Some(req.tag).filter(|t| !t.is_empty()),
    };
    let p = s.start(start).await.map_err(status)?;
    Ok(follow(s.attach(), p, 0))
}

/// `LiveConnect`.
pub fn connect(all: &LiveSandboxes, req: pb::LiveProcessRequest) -> Result<Events, Status> {
    let s = sandbox(all, req.live)?;
    let p = s.process(req.pid).map_err(status)?;
    Ok(follow(s.attach(), p, 0))
}

/// `LiveInput`.
pub async fn input(all: &LiveSandboxes, req: pb::LiveInputRequest) -> Result<pb::LiveAck, Status> {
    use pb::live_input_request::Input;
    let p = sandbox(all, req.live)?.process(req.pid).map_err(status)?;
    match req.input {
        Some(Input::Data(d)) => p.input(&d).await,
        Some(Input::Close(true)) => p.close_input().await,
        Some(Input::Resize(s)) => p.resize(size(&s)?),
        Some(Input::Close(false)) | None => return Err(invalid("input", "data, close or resize")),
    }
    .map_err(status)?;
    Ok(pb::LiveAck {})
}

/// `LiveSignal`.
pub async fn signal(all: &LiveSandboxes, req: pb::LiveSignalRequest) -> Result<pb::LiveAck, Status> {
    sandbox(all, req.live)?.signal(req.pid, req.signal).await.map_err(status)?;
    Ok(pb::LiveAck {})
}

/// `LiveList`.
pub fn list(all: &LiveSandboxes, req: pb::LiveRef) -> Result<pb::LiveListResponse, Status> {
    let processes = sandbox(all, Some(req))?
        .processes()
        .into_iter()
        .map(|p| pb::LiveProcess {
            pid: p.pid,
            argv: p.start.argv.clone(),
            env: p.start.env.iter().cloned().collect(),
            cwd: p.start.cwd.clone().unwrap_or_default(),
            tag: p.start.tag.clone().unwrap_or_default(),
            pty: p.start.pty.is_some(),
        })
        .collect();
    Ok(pb::LiveListResponse { processes })
}

/// `LiveUpdate`.
pub fn update(all: &LiveSandboxes, req: pb::LiveUpdateRequest) -> Result<pb::LiveAck, Status> {
    let life = lifetime(req.lifetime_ms)?;
    sandbox(all, req.live)?.set_lifetime(life);
    Ok(pb::LiveAck {})
}

/// `LiveEnd`.
pub async fn end(all: &LiveSandboxes, req: pb::LiveRef) -> Result<pb::LiveEndResponse, Status> {
    let report = sandbox(all, Some(req))?.end().await;
    Ok(pb::LiveEndResponse { save_failed: report.save_failed.is_some(), cpu_micros: report.cpu_micros })
}

/// `LivePort`: the first message names the sandbox and port; bytes flow
/// both ways until either side ends.
pub async fn port(all: &LiveSandboxes, mut input: tonic::Streaming<pb::LivePortRequest>) -> Result<PortStream, Status> {
    let first = input.message().await?.ok_or_else(|| invalid("live", "the first message names the sandbox"))?;
    let port = u16::try_from(first.port).ok().filter(|p| *p > 0).ok_or_else(|| invalid("port", "from 1 to 65535"))?;
    let s = sandbox(all, first.live)?;
    let conn = s.dial(port).await.map_err(status)?;
    let attached = s.attach();
    let (mut rd, mut wr) = conn.into_split();
    // Caller → sandbox, on a task of its own; its end half-closes the connection.
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        if !first.data.is_empty() && wr.write_all(&first.data).await.is_err() {
            return;
        }
        while let Ok(Some(m)) = input.message().await {
            if wr.write_all(&m.data).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    Ok(Box::pin(async_stream::stream! {
        use tokio::io::AsyncReadExt;
        let _attached = attached;
        // Connected: said at once, so the caller knows before any byte.
        yield Ok(pb::LivePortData { data: Vec::new() });
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => yield Ok(pb::LivePortData { data: buf[..n].to_vec() }),
            }
        }
    }))
}

/// The node's live sandboxes and those that ended lately, for its status.
pub fn summaries(all: &LiveSandboxes) -> (Vec<pb::LiveSummary>, Vec<pb::LiveEnded>) {
    let live_ref = |name: &str| {
        let mut parts = name.splitn(3, '/');
        let (namespace, key_name, thread_id) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        Some(pb::LiveRef { r#ref: Some(pb::ThreadRef { namespace: namespace.into(), key_name: key_name.into(), thread_id: thread_id.into() }) })
    };
    let live = all
        .summaries()
        .into_iter()
        .map(|s| pb::LiveSummary { live: live_ref(&s.name), idle_ms: s.idle.as_millis().min(u128::from(u64::MAX)) as u64, busy: s.busy })
        .collect();
    let ended = all.ended().into_iter().map(|(name, why)| pb::LiveEnded { live: live_ref(&name), reason: why.as_str().into() }).collect();
    (live, ended)
}

/// What a port connection sends back.
pub type PortStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::LivePortData, Status>> + Send>>;
