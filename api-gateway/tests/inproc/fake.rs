//! A scripted node-agent: the program text says what the "agent" does, so
//! each test reads as its own script. No sockets, no sandboxes, no root.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use tonic::{Code, Status};
use warren_api_gateway::exec::agent::{Agent, EventStream, HeldSlot};
use warren_api_gateway::nodes::agent::{LiveAgent, LiveStream, PortStream};
use warren_proto::agent::{self as pb, execute_event::Event, RefusalReason};
use warren_proto::refusal::refuse;

/// Marks the execution's stream as dropped.
struct Dropped(Arc<Mutex<Seen>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            s.dropped += 1;
        }
    }
}

/// What the fake did and saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Execution streams the gateway has let go of.
    pub dropped: usize,
    /// Every execute request, in order.
    pub executes: Vec<pb::ExecuteRequest>,
    /// Every delete request.
    pub deletes: Vec<pb::DeleteThreadRequest>,
    /// The trace id each delete carried.
    pub delete_traces: Vec<String>,
    /// Every cancel, by execution id.
    pub cancels: Vec<String>,
    /// Every live sandbox made.
    pub live_creates: Vec<pb::LiveCreateRequest>,
    /// Every live process started.
    pub live_starts: Vec<pb::LiveStartRequest>,
    /// Key slots held now, by key.
    pub key_slots: std::collections::HashMap<String, u32>,
    /// The most key slots each key held at once.
    pub peak_key_slots: std::collections::HashMap<String, u32>,
}

/// Returns a key slot when the gateway drops the call holding it, and
/// wakes requests waiting for one.
struct SlotGuard(Arc<Mutex<Seen>>, String, Arc<tokio::sync::Notify>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Ok(mut s) = self.0.lock() {
            if let Some(n) = s.key_slots.get_mut(&self.1) {
                *n -= 1;
            }
        }
        self.2.notify_waiters();
    }
}

/// The scripted agent.
#[derive(Debug, Clone, Default)]
pub struct FakeAgent {
    /// Shared record of calls.
    pub seen: Arc<Mutex<Seen>>,
    /// `Status` fails (the node looks down).
    pub down: bool,
    /// Capacity reported by `Status`.
    pub capacity: u32,
    /// Knows no thread: every delete answers NOT_FOUND.
    pub forgetful: bool,
    /// When set, `Cancel` answers only once a permit is added: the
    /// execution is still ending until then.
    pub cancel_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Node name `Status` reports (default `fake-node`).
    pub name: Option<&'static str>,
    /// Image references `Status` reports warm.
    pub images: Vec<&'static str>,
    /// Ignores a key slot request's wait and refuses at once, as an agent
    /// older than the wait does.
    pub old_key_slots: bool,
    /// Wakes requests waiting for a key slot.
    pub returned: Arc<tokio::sync::Notify>,
}

impl FakeAgent {
    /// Takes a slot of `key`, as the real agent's counter does; the guard
    /// returns it.
    fn take_slot(&self, key: &str, limit: u32) -> Result<SlotGuard, Status> {
        let mut seen = self.seen.lock().unwrap();
        let n = seen.key_slots.entry(key.to_string()).or_default();
        if *n >= limit {
            return Err(refuse(Code::ResourceExhausted, RefusalReason::KeyConcurrency, "", "at limit"));
        }
        *n += 1;
        let now = *n;
        let peak = seen.peak_key_slots.entry(key.to_string()).or_default();
        *peak = (*peak).max(now);
        Ok(SlotGuard(self.seen.clone(), key.to_string(), self.returned.clone()))
    }

    /// [`FakeAgent::take_slot`], waiting up to the request's `wait_ms` for
    /// a slot to return (in no particular order: the real agent's queue is
    /// tested in the agent's crate).
    fn take_slot_waiting(&self, k: &pb::KeySlotRequest) -> BoxFuture<'static, Result<SlotGuard, Status>> {
        let (fake, k) = (self.clone(), k.clone());
        let wait = if self.old_key_slots { Duration::ZERO } else { Duration::from_millis(k.wait_ms.into()) };
        async move {
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let returned = fake.returned.notified();
                tokio::pin!(returned);
                returned.as_mut().enable();
                match fake.take_slot(&k.key, k.limit) {
                    Ok(g) => return Ok(g),
                    Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                    Err(_) => {
                        let _ = tokio::time::timeout_at(deadline, returned).await;
                    }
                }
            }
        }
        .boxed()
    }
}

fn ev(e: Event) -> Result<pb::ExecuteEvent, Status> {
    Ok(pb::ExecuteEvent { event: Some(e) })
}

fn started() -> Result<pb::ExecuteEvent, Status> {
    ev(Event::Started(pb::Started { execution_id: "x".into(), node_name: "fake".into(), setup_micros: 1 }))
}

fn exited(x: pb::Exited) -> Result<pb::ExecuteEvent, Status> {
    ev(Event::Exited(x))
}

fn stdout(s: &str) -> Result<pb::ExecuteEvent, Status> {
    ev(Event::Stdout(pb::OutputChunk { data: s.as_bytes().to_vec() }))
}

/// The script `code` names.
fn script(code: &str) -> Result<EventStream, Status> {
    let ok = |events: Vec<Result<pb::ExecuteEvent, Status>>| Ok(futures_util::stream::iter(events).boxed());
    let refused = |code, reason, field: &str| Err(refuse(code, reason, field, format!("{field}: refused by the fake")));
    match code {
        "refuse:busy" => refused(Code::ResourceExhausted, RefusalReason::NodeBusy, ""),
        "refuse:field" => refused(Code::InvalidArgument, RefusalReason::InvalidField, "limits.pids"),
        "refuse:thread" => refused(Code::Aborted, RefusalReason::ThreadBusy, ""),
        "refuse:unsupported" => refused(Code::FailedPrecondition, RefusalReason::Unsupported, "network"),
        "refuse:transport" => Err(Status::unavailable("connection refused")),
        "refuse:pulling" => Err(refuse(Code::Unavailable, RefusalReason::ImagePulling, "image", "image x is being pulled to this node; retry shortly")),
        "refuse:image" => Err(refuse(Code::FailedPrecondition, RefusalReason::Image, "image", "image: registry: manifest unknown")),
        "lost" => ok(vec![started(), stdout("partial")]),
        "lost:error" => ok(vec![started(), Err(Status::internal("h2 reset"))]),
        "timeout" => ok(vec![started(), exited(pb::Exited { exit_code: 137, signal: 9, timed_out: true, ..Default::default() })]),
        "thread-mount" => ok(vec![exited(pb::Exited { exit_code: -1, failure: pb::Failure::ThreadMount as i32, ..Default::default() })]),
        "start-failed" => ok(vec![started(), exited(pb::Exited { exit_code: -1, failure: pb::Failure::Start as i32, failure_detail: "exec".into(), ..Default::default() })]),
        // Holds the execution open until the caller drops it.
        "hang" => Ok(futures_util::stream::iter(vec![started()]).chain(futures_util::stream::pending()).boxed()),
        // Output the client never takes: more lines than any buffer holds,
        // then silence; `dropped` turns true when the gateway lets go.
        "flood" => {
            let lines = (0..200).map(|i| stdout(&format!("line {i}\n")));
            Ok(futures_util::stream::iter(std::iter::once(started()).chain(lines)).chain(futures_util::stream::pending()).boxed())
        }
        // Output, 20 ms of work and the end.
        "nap" => {
            let end = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                exited(pb::Exited::default())
            });
            Ok(futures_util::stream::iter(vec![started(), stdout("napped\n")]).chain(end).boxed())
        }
        // 1 MiB of output in 64 KiB chunks, and the end.
        "mib" => {
            let chunks = (0..16).map(|_| ev(Event::Stdout(pb::OutputChunk { data: vec![b'x'; 64 << 10] })));
            ok(std::iter::once(started()).chain(chunks).chain(std::iter::once(exited(pb::Exited::default()))).collect())
        }
        // Output, a pause, more output and the end.
        "slow" => {
            let rest = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                stdout("two\n")
            });
            Ok(futures_util::stream::iter(vec![started(), stdout("one\n")]).chain(rest).chain(futures_util::stream::iter(vec![exited(pb::Exited::default())])).boxed())
        }
        // Silence longer than a keepalive period, then the end.
        "silent" => {
            let end = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_secs(25)).await;
                exited(pb::Exited::default())
            });
            Ok(futures_util::stream::iter(vec![started()]).chain(end).boxed())
        }
        "bad-utf8" => ok(vec![started(), ev(Event::Stdout(pb::OutputChunk { data: vec![b'a', 0xff, b'b'] })), exited(pb::Exited::default())]),
        "utf8-split" => {
            let euro = "€".as_bytes();
            let chunk = |b: &[u8]| ev(Event::Stdout(pb::OutputChunk { data: b.to_vec() }));
            ok(vec![started(), chunk(&euro[..1]), chunk(&euro[1..]), exited(pb::Exited::default())])
        }
        other => {
            let code = other.strip_prefix("exit:").and_then(|c| c.parse().ok()).unwrap_or(0);
            let err = ev(Event::Stderr(pb::OutputChunk { data: b"err\n".to_vec() }));
            ok(vec![started(), stdout(&format!("ran {other}\n")), err, exited(pb::Exited { exit_code: code, wall_micros: 2500, ..Default::default() })])
        }
    }
}

impl Agent for FakeAgent {
    fn execute(&self, req: pb::ExecuteRequest) -> BoxFuture<'static, Result<EventStream, Status>> {
        // A key slot sent with the call is taken first, like the real agent
        // (waiting as the request lets it).
        let slot = req.key_slot.as_ref().map(|k| self.take_slot_waiting(k));
        let fake = self.clone();
        async move {
            let slot = match slot {
                Some(waiting) => match waiting.await {
                    Ok(g) => Some(g),
                    Err(status) => {
                        fake.seen.lock().unwrap().executes.push(req);
                        return Err(status);
                    }
                },
                None => None,
            };
            let dropped = Dropped(fake.seen.clone());
            // The stream carries a guard that records when the gateway drops it
            // (which, on a real agent, kills the sandbox), and the key slot.
            let result = script(&req.code).map(|s| s.map(move |e| { let _ = (&dropped, &slot); e }).boxed());
            fake.seen.lock().unwrap().executes.push(req);
            result
        }
        .boxed()
    }

    fn delete_thread(&self, req: pb::DeleteThreadRequest, trace_id: &str) -> BoxFuture<'static, Result<(), Status>> {
        let id = req.thread.as_ref().map(|t| t.thread_id.clone()).unwrap_or_default();
        let mut seen = self.seen.lock().unwrap();
        seen.deletes.push(req);
        seen.delete_traces.push(trace_id.to_string());
        drop(seen);
        let result = match id.as_str() {
            _ if self.forgetful => Err(refuse(Code::NotFound, RefusalReason::ThreadNotFound, "", "no such thread")),
            "missing" => Err(refuse(Code::NotFound, RefusalReason::ThreadNotFound, "", "no such thread")),
            "running" => Err(refuse(Code::Aborted, RefusalReason::ThreadBusy, "", "busy")),
            "store-down" => Err(refuse(Code::Unavailable, RefusalReason::ThreadStore, "", "store down")),
            _ => Ok(()),
        };
        async move { result }.boxed()
    }

    fn cancel(&self, execution_id: &str) -> BoxFuture<'static, Result<bool, Status>> {
        self.seen.lock().unwrap().cancels.push(execution_id.to_string());
        let gate = self.cancel_gate.clone();
        async move {
            if let Some(g) = gate {
                let _ = g.acquire().await.map(|p| p.forget());
            }
            Ok(true)
        }
        .boxed()
    }

    fn hold_key_slot(&self, key: &str, limit: u32, wait_ms: u32) -> BoxFuture<'static, Result<HeldSlot, Status>> {
        if self.down {
            return async { Err(Status::unavailable("down")) }.boxed();
        }
        let taking = self.take_slot_waiting(&pb::KeySlotRequest { key: key.to_string(), limit, wait_ms });
        async move {
            let guard = taking.await?;
            Ok(futures_util::stream::pending()
                .map(move |e| {
                    let _ = &guard;
                    e
                })
                .boxed())
        }
        .boxed()
    }

    fn live(&self) -> Option<&dyn LiveAgent> {
        Some(self)
    }

    fn status(&self) -> BoxFuture<'static, Result<pb::StatusResponse, Status>> {
        let (down, capacity, name) = (self.down, self.capacity, self.name);
        let images = self.images.iter().map(|r| pb::WarmImageInfo { reference: r.to_string(), digest: format!("sha256:{}", "c".repeat(64)) }).collect();
        async move {
            if down {
                return Err(Status::unavailable("down"));
            }
            Ok(pb::StatusResponse { node_name: name.unwrap_or("fake-node").into(), max_executions: capacity, images, ..Default::default() })
        }
        .boxed()
    }
}

/// Live sandboxes that take every call: a process starts as pid 7 and
/// ends at once with exit 0, printing nothing.
impl LiveAgent for FakeAgent {
    fn create(&self, req: pb::LiveCreateRequest) -> BoxFuture<'static, Result<pb::LiveCreateResponse, Status>> {
        self.seen.lock().unwrap().live_creates.push(req);
        async { Ok(pb::LiveCreateResponse { node_name: String::new() }) }.boxed()
    }

    fn start(&self, req: pb::LiveStartRequest) -> BoxFuture<'static, Result<LiveStream, Status>> {
        self.seen.lock().unwrap().live_starts.push(req);
        let events = [pb::live_event::Event::Started(pb::live_event::Started { pid: 7 }), pb::live_event::Event::Ended(pb::live_event::Ended { exit_code: 0, signal: 0 })];
        async move { Ok(futures_util::stream::iter(events.map(|e| Ok(pb::LiveEvent { event: Some(e) }))).boxed()) }.boxed()
    }

    fn connect(&self, _req: pb::LiveProcessRequest) -> BoxFuture<'static, Result<LiveStream, Status>> {
        async { Err(refuse(Code::NotFound, RefusalReason::LiveNotFound, "pid", "no process")) }.boxed()
    }

    fn input(&self, _req: pb::LiveInputRequest) -> BoxFuture<'static, Result<(), Status>> {
        async { Ok(()) }.boxed()
    }

    fn signal(&self, _req: pb::LiveSignalRequest) -> BoxFuture<'static, Result<(), Status>> {
        async { Ok(()) }.boxed()
    }

    fn list(&self, _req: pb::LiveRef) -> BoxFuture<'static, Result<pb::LiveListResponse, Status>> {
        async { Ok(pb::LiveListResponse::default()) }.boxed()
    }

    fn update(&self, _req: pb::LiveUpdateRequest) -> BoxFuture<'static, Result<(), Status>> {
        async { Ok(()) }.boxed()
    }

    fn end(&self, _req: pb::LiveRef) -> BoxFuture<'static, Result<pb::LiveEndResponse, Status>> {
        async { Ok(pb::LiveEndResponse::default()) }.boxed()
    }

    fn port(&self, _first: pb::LivePortRequest, _rest: futures_util::stream::BoxStream<'static, pb::LivePortRequest>) -> BoxFuture<'static, Result<PortStream, Status>> {
        async { Err(refuse(Code::FailedPrecondition, RefusalReason::InvalidField, "port", "nothing listens")) }.boxed()
    }
}

/// Waits (bounded) until `f` holds; conditions here settle within a few
/// scheduler turns, the bound only turns a bug into a failure.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{what} never happened");
}
