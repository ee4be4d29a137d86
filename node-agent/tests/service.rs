//! The agent's gRPC edge against a scripted backend: no root, no sandboxes.
//! What the wire promises (refusals with reasons and fields, the status
//! mapping, event order, a caller that stops reading or leaves, the bearer
//! token) is tested here; the root-only tests in `tests/` prove the real
//! sandboxes behind it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Code, Request, Status};
use warren_isolation::features::Features;
use warren_core::contract::{NodePolicy, Spec, SpecError, Thread};
use warren_isolation::spec::Language;
use warren_node_agent::executor::{Checked, ExecError, WarmedImage};
use warren_node_agent::sandbox::{Event, Failure, Outcome};
use warren_node_agent::service::{AgentService, Backend, NodeReport, TRACE_HEADER};
use warren_node_agent::threads::{ThreadError, ThreadKey};
use warren_proto::agent::{self as pb, execute_event::Event as PbEvent, node_agent_server::NodeAgent, RefusalReason as Reason};
use warren_proto::refusal::refusal_of;

/// What the double does with an admitted execution.
#[derive(Clone)]
enum Script {
    /// Refuse at admission.
    Refuse(fn() -> ExecError),
    /// Emit these events, then end with this outcome.
    Run(Vec<&'static str>, Outcome),
    /// Fail after admission, before anything ran.
    FailToStart,
    /// Print until the caller stops taking output; report how it ended.
    Flood,
}

#[derive(Default)]
struct Seen {
    admitted: Vec<Spec>,
    threads: Vec<Option<Thread>>,
    /// Set when the flood's sender found the stream gone (the execution is killed).
    flood_cut_off: bool,
    deleted: Vec<ThreadKey>,
    pull_auth: Vec<String>,
}

struct Double {
    script: Script,
    delete: fn() -> Result<(), ThreadError>,
    seen: Arc<Mutex<Seen>>,
}

impl Double {
    fn new(script: Script) -> (Arc<Double>, Arc<Mutex<Seen>>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        (Arc::new(Double { script, delete: || Ok(()), seen: seen.clone() }), seen)
    }
}

impl Backend for Double {
    type Admitted = Spec;

    /// Checks like the executor does, without a node.
    async fn admit(&self, spec: Spec, _wait: Duration) -> Result<Spec, ExecError> {
        Checked::of(spec.clone(), &NodePolicy::default())?;
        if let Script::Refuse(e) = &self.script {
            return Err(e());
        }
        let mut seen = self.seen.lock().unwrap();
        seen.admitted.push(spec.clone());
        seen.threads.push(spec.thread.clone());
        Ok(spec)
    }

    fn execution_id(a: &Spec) -> &str {
        &a.id
    }

    async fn execute(&self, _a: Spec, _received: Instant, events: mpsc::Sender<Event>) -> Result<Outcome, ExecError> {
        match &self.script {
            Script::Refuse(_) => unreachable!("refused at admission"),
            Script::FailToStart => Err(ExecError::Sandbox(warren_node_agent::sandbox::SandboxError::NoSlot)),
            Script::Run(lines, outcome) => {
                let _ = events.send(Event::Started { setup: Duration::from_micros(1500) }).await;
                for l in lines {
                    let ev = match l.strip_prefix("err:") {
                        Some(e) => Event::Stderr(e.as_bytes().to_vec()),
                        None => Event::Stdout(l.as_bytes().to_vec()),
                    };
                    let _ = events.send(ev).await;
                }
                Ok(outcome.clone())
            }
            Script::Flood => {
                let _ = events.send(Event::Started { setup: Duration::ZERO }).await;
                // Bounded: far more than the channels hold.
                for _ in 0..100_000 {
                    if events.send(Event::Stdout(vec![b'x'; 1024])).await.is_err() {
                        self.seen.lock().unwrap().flood_cut_off = true;
                        return Ok(Outcome { exit_code: 137, signal: 9, cancelled: true, ..Outcome::default() });
                    }
                }
                Ok(Outcome::default())
            }
        }
    }

    async fn delete_thread(&self, key: &ThreadKey) -> Result<(), ThreadError> {
        self.seen.lock().unwrap().deleted.push(key.clone());
        (self.delete)()
    }

    fn node_name(&self) -> &str {
        "node-7"
    }

    fn report(&self) -> NodeReport {
        NodeReport {
            node_name: "node-7".into(),
            features: Features { cgroup_version: 1, user_namespaces: true, seccomp: true, ..Features::default() },
            running: 3,
            max_executions: 32,
            languages: vec![Language::Python, Language::Bash],
            images: vec![("reg.example:5000/py:3.12".into(), format!("sha256:{}", "a".repeat(64)))],
            network: false,
            warm_sandboxes: 2,
            warm_starts: 5,
            idle: (2500, 1),
            warm_memory_bytes: 3 << 20,
        }
    }

    fn output_stall(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn warm_image(&self, reference: &str, auth: &warren_image::PullAuth, _warm: &warren_core::warm::WarmModules) -> Result<WarmedImage, ExecError> {
        self.seen.lock().unwrap().pull_auth.push(format!("{auth:?}"));
        match reference {
            "slow" => Err(ExecError::ImagePulling(reference.into())),
            "missing" => Err(ExecError::Image("registry: manifest unknown".into())),
            "BAD REF" => Err(ExecError::ImageReference("not a reference".into())),
            _ => Ok(WarmedImage { digest: format!("sha256:{}", "b".repeat(64)), languages: vec![(Language::Python, "3.12.1".into())], bytes: 42, warm_failures: vec![] }),
        }
    }
}

fn request(code: &str) -> pb::ExecuteRequest {
    pb::ExecuteRequest {
        execution_id: "trc_test".into(),
        language: pb::Language::Bash as i32,
        code: code.into(),
        timeout_ms: 5000,
        ..Default::default()
    }
}

fn thread(id: &str) -> pb::ThreadOptions {
    pb::ThreadOptions {
        r#ref: Some(pb::ThreadRef { namespace: "team".into(), key_name: "agent".into(), thread_id: id.into() }),
        max_bytes: 1 << 20,
        retention_seconds: 0,
        max_threads: 0,
        history_versions: 0,
    }
}

async fn collect(service: &AgentService<Double>, req: pb::ExecuteRequest) -> Result<Vec<PbEvent>, Status> {
    let mut stream = service.execute(full(req)).await?.into_inner();
    let mut events = vec![];
    while let Some(ev) = stream.next().await {
        events.push(ev?.event.expect("every event has a body"));
    }
    Ok(events)
}

fn assert_refused(status: &Status, code: Code, reason: Reason, field: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(refusal_of(status), (reason, field.to_string()), "{status:?}");
}

#[tokio::test]
async fn status_reports_the_backend() {
    let (double, _) = Double::new(Script::FailToStart);
    let status = AgentService::new(double).status(full(pb::StatusRequest {})).await.unwrap().into_inner();
    assert_eq!((status.node_name.as_str(), status.running_executions, status.max_executions, status.warm_sandboxes, status.warm_memory_bytes), ("node-7", 3, 32, 2, 3 << 20));
    assert_eq!(status.warm_starts, 5);
    assert_eq!((status.idle_cpu_ms, status.idle_discards), (2, 1), "the pool's idle cost, in milliseconds");
    assert_eq!(status.languages, [pb::Language::Python as i32, pb::Language::Bash as i32]);
    let f = status.features.unwrap();
    assert!(f.user_namespaces && f.seccomp && !f.overlayfs);
    assert_eq!(status.agent_version, env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn warm_image_answers_what_is_warm_and_maps_refusals() {
    let (double, seen) = Double::new(Script::FailToStart);
    let service = AgentService::new(double);
    let creds = |pairs: &[(&str, &str)]| Some(pb::Credentials { values: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() });
    let warm = |image: &str, image_pull| service.warm_image(full(pb::WarmImageRequest { image: image.into(), image_pull, warm: vec![] }));
    let ok = warm("reg.example:5000/py:3.12", creds(&[("username", "robot"), ("password", "hunter2")])).await.unwrap().into_inner();
    assert_eq!(ok.digest, format!("sha256:{}", "b".repeat(64)));
    assert_eq!(ok.languages, [pb::ImageLanguage { language: pb::Language::Python as i32, version: "3.12.1".into() }]);
    assert_eq!(seen.lock().unwrap().pull_auth, ["Basic(robot, <redacted>)"], "credentials reach the backend, never a log");
    assert_refused(&warm("slow", None).await.unwrap_err(), Code::Unavailable, Reason::ImagePulling, "image");
    assert_refused(&warm("missing", None).await.unwrap_err(), Code::FailedPrecondition, Reason::Image, "image");
    assert_refused(&warm("BAD REF", None).await.unwrap_err(), Code::InvalidArgument, Reason::InvalidField, "image");
    let extra = warm("x", creds(&[("username", "u"), ("password", "p"), ("token", "t")])).await.unwrap_err();
    assert_refused(&extra, Code::InvalidArgument, Reason::InvalidField, "image_pull");
    let status = service.status(full(pb::StatusRequest {})).await.unwrap().into_inner();
    assert_eq!(status.images, [pb::WarmImageInfo { reference: "reg.example:5000/py:3.12".into(), digest: format!("sha256:{}", "a".repeat(64)) }]);
}

#[tokio::test]
async fn what_this_agent_cannot_provide_or_cannot_accept_is_refused_before_admission() {
    type Tweak = fn(&mut pb::ExecuteRequest);
    let cases: [(Code, Reason, &str, Tweak); 4] = [
        (Code::FailedPrecondition, Reason::Unsupported, "network", |r| r.network = 99),
        // Providers this agent has no client for.
        (Code::FailedPrecondition, Reason::Unsupported, "mounts[0].provider", |r| {
            r.mounts.push(pb::StorageMount { mount_path: "/data/x".into(), provider: "ftp".into(), bucket: "b".into(), ..Default::default() })
        }),
        // An allowlist without Unrestricted, a connector without its kind.
        (Code::InvalidArgument, Reason::InvalidField, "egress", |r| r.egress.push(pb::EgressRule { host: "pypi.org".into(), ..Default::default() })),
        (Code::InvalidArgument, Reason::InvalidField, "connectors", |r| r.connectors.push(pb::ConnectorGrant { name: "db".into(), ..Default::default() })),
    ];
    let (double, seen) = Double::new(Script::Run(vec![], Outcome::default()));
    let service = AgentService::new(double);
    for (code, reason, field, tweak) in cases {
        let mut req = request("echo hi");
        tweak(&mut req);
        let err = collect(&service, req).await.unwrap_err();
        assert_refused(&err, code, reason, field);
    }
    assert!(seen.lock().unwrap().admitted.is_empty(), "nothing reached the backend");
}

#[tokio::test]
async fn malformed_thread_references_are_refused_with_their_field() {
    let (double, seen) = Double::new(Script::Run(vec![], Outcome::default()));
    let service = AgentService::new(double);
    let mut no_ref = request("true");
    no_ref.thread = Some(pb::ThreadOptions { r#ref: None, ..thread("t1") });
    assert_refused(&collect(&service, no_ref).await.unwrap_err(), Code::InvalidArgument, Reason::InvalidField, "thread.ref");
    let mut traversal = request("true");
    traversal.thread = Some(thread("../other"));
    assert_refused(&collect(&service, traversal).await.unwrap_err(), Code::InvalidArgument, Reason::InvalidField, "thread.ref");
    let mut unbounded = request("true");
    unbounded.thread = Some(pb::ThreadOptions { max_bytes: 0, ..thread("t1") });
    assert_refused(&collect(&service, unbounded).await.unwrap_err(), Code::InvalidArgument, Reason::InvalidField, "thread.max_bytes");
    assert!(seen.lock().unwrap().admitted.is_empty());
}

#[tokio::test]
async fn the_request_reaches_the_backend_as_the_domain_request() {
    let (double, seen) = Double::new(Script::Run(vec![], Outcome::default()));
    let service = AgentService::new(double);
    let mut req = request("echo $B");
    req.env = [("B".to_string(), "2".to_string()), ("A".to_string(), "1".to_string())].into();
    req.limits = Some(pb::Limits { memory_bytes: 64 << 20, pids: 0, ..Default::default() });
    req.thread = Some(pb::ThreadOptions { retention_seconds: 60, ..thread("t1") });
    collect(&service, req).await.unwrap();
    let seen = seen.lock().unwrap();
    let r = &seen.admitted[0];
    assert_eq!((r.id.as_str(), r.language, r.code.as_str(), r.timeout), ("trc_test", Language::Bash, "echo $B", Duration::from_secs(5)));
    assert_eq!(r.env, [("A".to_string(), "1".to_string()), ("B".into(), "2".into())].into(), "env is a map: maps have no order on the wire");
    assert_eq!((r.limits.memory_bytes, r.limits.pids), (Some(64 << 20), None), "zero means 'the node's default'");
    let t = seen.threads[0].as_ref().unwrap();
    assert_eq!((format!("{}/{}/{}", t.namespace, t.key_name, t.id), t.retention, t.max_bytes), ("team/agent/t1".to_string(), Some(Duration::from_secs(60)), 1 << 20));
}

#[tokio::test]
async fn admission_errors_map_to_their_codes_reasons_and_fields() {
    type Case = (fn() -> ExecError, Code, Reason, &'static str);
    let cases: [Case; 5] = [
        (|| ExecError::Invalid(SpecError::new("timeout", "must be greater than zero")), Code::InvalidArgument, Reason::InvalidField, "timeout"),
        (|| ExecError::LanguageUnavailable("node"), Code::InvalidArgument, Reason::LanguageUnavailable, "language"),
        (|| ExecError::MissingFeature("no user namespaces".into()), Code::FailedPrecondition, Reason::MissingFeature, ""),
        (|| ExecError::Busy(32), Code::ResourceExhausted, Reason::NodeBusy, ""),
        (|| ExecError::ThreadBusy, Code::Aborted, Reason::ThreadBusy, ""),
    ];
    for (e, code, reason, field) in cases {
        let (double, _) = Double::new(Script::Refuse(e));
        let err = collect(&AgentService::new(double), request("true")).await.unwrap_err();
        assert_refused(&err, code, reason, field);
    }
}

#[tokio::test]
async fn events_arrive_in_order_and_end_with_the_outcome() {
    let outcome = Outcome {
        exit_code: 137,
        signal: 9,
        timed_out: true,
        stdout_truncated: true,
        peak_memory_bytes: Some(4096),
        wall: Duration::from_millis(1200),
        failure: Some(Failure::ThreadTooLarge),
        ..Outcome::default()
    };
    let (double, _) = Double::new(Script::Run(vec!["a", "err:b", "c"], outcome));
    let events = collect(&AgentService::new(double), request("true")).await.unwrap();
    let [PbEvent::Started(s), PbEvent::Stdout(a), PbEvent::Stderr(b), PbEvent::Stdout(c), PbEvent::Exited(x)] = &events[..] else {
        panic!("unexpected sequence: {events:?}");
    };
    assert_eq!((s.execution_id.as_str(), s.node_name.as_str(), s.setup_micros), ("trc_test", "node-7", 1500));
    assert_eq!((&a.data[..], &b.data[..], &c.data[..]), (&b"a"[..], &b"b"[..], &b"c"[..]));
    assert_eq!((x.exit_code, x.signal, x.timed_out, x.stdout_truncated, x.peak_memory_bytes, x.wall_micros), (137, 9, true, true, Some(4096), 1_200_000));
    assert_eq!(x.failure, pb::Failure::ThreadTooLarge as i32);
}

#[tokio::test]
async fn a_failure_after_admission_ends_the_stream_with_a_status() {
    let (double, _) = Double::new(Script::FailToStart);
    let err = collect(&AgentService::new(double), request("true")).await.unwrap_err();
    assert_refused(&err, Code::ResourceExhausted, Reason::NodeBusy, "");
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_stops_reading_gets_its_execution_cut_off() {
    let (double, seen) = Double::new(Script::Flood);
    let service = AgentService::new(double);
    let mut stream = service.execute(full(request("yes"))).await.unwrap().into_inner();
    assert!(matches!(stream.next().await, Some(Ok(pb::ExecuteEvent { event: Some(PbEvent::Started(_)) }))));
    // Read nothing more; paused time runs through the stall at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !seen.lock().unwrap().flood_cut_off {
        assert!(tokio::time::Instant::now() < deadline, "the flood was never cut off");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(stream);
}

#[tokio::test]
async fn a_caller_that_leaves_gets_its_execution_cut_off() {
    let (double, seen) = Double::new(Script::Flood);
    let service = AgentService::new(double);
    let mut stream = service.execute(full(request("yes"))).await.unwrap().into_inner();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    // Real time, bounded: the cut-off follows the drop without any stall wait.
    let started = Instant::now();
    while !seen.lock().unwrap().flood_cut_off {
        assert!(started.elapsed() < Duration::from_secs(30), "the flood was never cut off");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn thread_deletion_maps_its_errors() {
    type Case = (fn() -> Result<(), ThreadError>, Option<(Code, Reason)>);
    let cases: [Case; 4] = [
        (|| Ok(()), None),
        (|| Err(ThreadError::NotFound), Some((Code::NotFound, Reason::ThreadNotFound))),
        (|| Err(ThreadError::Busy), Some((Code::Aborted, Reason::ThreadBusy))),
        (|| Err(ThreadError::Io { step: "listing", source: std::io::Error::other("disk on fire") }), Some((Code::Unavailable, Reason::ThreadStore))),
    ];
    for (result, expected) in cases {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let double = Arc::new(Double { script: Script::FailToStart, delete: result, seen: seen.clone() });
        let mut req = full(pb::DeleteThreadRequest { thread: thread("t9").r#ref });
        req.metadata_mut().insert(TRACE_HEADER, "req_1".parse().unwrap());
        let got = AgentService::new(double).delete_thread(req).await;
        match expected {
            None => assert!(got.is_ok()),
            Some((code, reason)) => {
                let status = got.unwrap_err();
                assert_refused(&status, code, reason, "");
                assert!(!status.message().contains("disk on fire"), "store details stay in the agent's log: {status:?}");
            }
        }
        assert_eq!(seen.lock().unwrap().deleted[0].rel(), "team/agent/t9");
    }
}

/// Over a real Unix socket, through the interceptor the agent installs.
#[tokio::test]
async fn the_bearer_token_guards_every_call_over_the_wire() {
    use warren_node_agent::auth::BearerAuth;
    use warren_proto::agent::node_agent_client::NodeAgentClient;
    use warren_proto::agent::node_agent_server::NodeAgentServer;
    use warren_proto::client::{lazy_channel, AgentAddress};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (double, seen) = Double::new(Script::Run(vec!["hi"], Outcome::default()));
    let server = NodeAgentServer::with_interceptor(AgentService::new(double), BearerAuth::new(Some("0123456789abcdef".into())));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async { stopped.await.unwrap_or(()) }),
    );
    let mut client = NodeAgentClient::new(lazy_channel(&AgentAddress::Unix(path), &None).unwrap());
    for token in [None, Some("Bearer 0123456789abcdeX"), Some("0123456789abcdef")] {
        let mut req = full(request("echo hi"));
        if let Some(t) = token {
            req.metadata_mut().insert("authorization", t.parse().unwrap());
        }
        assert_eq!(client.execute(req).await.unwrap_err().code(), Code::Unauthenticated, "{token:?}");
        assert_eq!(client.status(full(pb::StatusRequest {})).await.unwrap_err().code(), Code::Unauthenticated);
    }
    assert!(seen.lock().unwrap().admitted.is_empty(), "nothing ran without the token");
    let mut req = full(request("echo hi"));
    req.metadata_mut().insert("authorization", "Bearer 0123456789abcdef".parse().unwrap());
    let mut stream = client.execute(req).await.unwrap().into_inner();
    let mut out = vec![];
    while let Some(ev) = stream.message().await.unwrap() {
        if let Some(PbEvent::Stdout(c)) = ev.event {
            out.extend(c.data);
        }
    }
    assert_eq!(out, b"hi");
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn cancel_kills_a_running_execution_and_answers_once_it_has_ended() {
    let (double, seen) = Double::new(Script::Flood);
    let service = AgentService::new(double);
    // The caller keeps the stream but reads nothing more: only Cancel ends it.
    let mut stream = service.execute(full(request("yes"))).await.unwrap().into_inner();
    stream.next().await.unwrap().unwrap();
    let answer = service.cancel(full(pb::CancelRequest { execution_id: "trc_test".into() })).await.unwrap().into_inner();
    assert!(answer.was_running);
    assert!(seen.lock().unwrap().flood_cut_off, "the execution had ended when Cancel answered");
    let again = service.cancel(full(pb::CancelRequest { execution_id: "trc_test".into() })).await.unwrap().into_inner();
    assert!(!again.was_running, "an ended execution is not running");
    drop(stream);
}

#[tokio::test]
async fn a_second_execution_with_a_running_id_is_refused() {
    let (double, _seen) = Double::new(Script::Flood);
    let service = AgentService::new(double);
    let mut first = service.execute(full(request("yes"))).await.unwrap().into_inner();
    first.next().await.unwrap().unwrap();
    let err = service.execute(full(request("yes"))).await.unwrap_err();
    assert_refused(&err, Code::InvalidArgument, Reason::InvalidField, "execution_id");
    service.cancel(full(pb::CancelRequest { execution_id: "trc_test".into() })).await.unwrap();
}

fn key_slot(key: &str, limit: u32) -> Request<pb::KeySlotRequest> {
    full(pb::KeySlotRequest { key: key.into(), limit, wait_ms: 0 })
}

#[tokio::test]
async fn a_key_slot_is_held_while_its_stream_lives() {
    let (double, _) = Double::new(Script::Flood);
    let service = AgentService::new(double);
    let mut first = service.hold_key_slot(key_slot("team/agent", 1)).await.unwrap().into_inner();
    assert_eq!(first.next().await.unwrap().unwrap().held, 1, "the first event grants the slot");
    let err = service.hold_key_slot(key_slot("team/agent", 1)).await.err().expect("the limit holds");
    assert_refused(&err, Code::ResourceExhausted, Reason::KeyConcurrency, "");
    assert!(service.hold_key_slot(key_slot("team/other", 1)).await.is_ok(), "another key has its own slots");
    drop(first);
    let mut again = service.hold_key_slot(key_slot("team/agent", 1)).await.unwrap().into_inner();
    assert_eq!(again.next().await.unwrap().unwrap().held, 1, "a dropped stream returned its slot");
    for (req, field) in [(key_slot("no-slash", 1), "key"), (key_slot("team/agent", 0), "limit")] {
        let err = service.hold_key_slot(req).await.err().expect("malformed");
        assert_refused(&err, Code::InvalidArgument, Reason::InvalidField, field);
    }
}

/// Over a real socket: a caller that cancels the call (or loses its
/// connection) returns the slot without saying anything else.
#[tokio::test]
async fn a_cancelled_key_slot_call_returns_the_slot_over_the_wire() {
    use warren_proto::agent::node_agent_client::NodeAgentClient;
    use warren_proto::agent::node_agent_server::NodeAgentServer;
    use warren_proto::client::{lazy_channel, AgentAddress};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (double, _) = Double::new(Script::Flood);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeAgentServer::with_interceptor(AgentService::new(double), warren_node_agent::auth::BearerAuth::new(None)))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async { stopped.await.unwrap_or(()) }),
    );
    let mut client = NodeAgentClient::new(lazy_channel(&AgentAddress::Unix(path), &None).unwrap());
    let mut held = client.hold_key_slot(key_slot("team/agent", 1)).await.unwrap().into_inner();
    assert_eq!(held.message().await.unwrap().unwrap().held, 1);
    let err = client.hold_key_slot(key_slot("team/agent", 1)).await.unwrap_err();
    assert_refused(&err, Code::ResourceExhausted, Reason::KeyConcurrency, "");
    drop(held);
    // The reset reaches the server asynchronously; bounded, not timed.
    let mut regained = None;
    for _ in 0..2000 {
        if let Ok(r) = client.hold_key_slot(key_slot("team/agent", 1)).await {
            regained = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(regained.is_some(), "the slot never came back after the caller cancelled");
    drop(regained);
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_key_slot_taken_with_the_execution_is_held_until_it_has_ended() {
    let (double, seen) = Double::new(Script::Flood);
    let service = AgentService::new(double);
    let with_slot = || pb::ExecuteRequest { key_slot: Some(pb::KeySlotRequest { key: "team/agent".into(), limit: 1, wait_ms: 0 }), ..request("yes") };
    let mut running = service.execute(full(with_slot())).await.unwrap().into_inner();
    running.next().await.unwrap().unwrap();
    let err = service.hold_key_slot(key_slot("team/agent", 1)).await.err().expect("the execution holds the key's one slot");
    assert_refused(&err, Code::ResourceExhausted, Reason::KeyConcurrency, "");
    let second = pb::ExecuteRequest { execution_id: "trc_second".into(), ..with_slot() };
    assert_refused(&service.execute(full(second)).await.unwrap_err(), Code::ResourceExhausted, Reason::KeyConcurrency, "");
    assert_eq!(seen.lock().unwrap().admitted.len(), 1, "the refused execution was never admitted");
    // Cancel answers once the execution has ended: its slot is back by then.
    service.cancel(full(pb::CancelRequest { execution_id: "trc_test".into() })).await.unwrap();
    assert!(service.hold_key_slot(key_slot("team/agent", 1)).await.is_ok());
    drop(running);
}

/// A key at its limit: a hold carrying a wait queues and gets the slot
/// its holder returns; an `Execute` carrying one likewise waits, holding
/// nothing of the node, and runs once the slot is back.
#[tokio::test]
async fn a_key_slot_asked_with_a_wait_is_granted_once_one_returns() {
    let (double, seen) = Double::new(Script::Flood);
    let slots = Arc::new(warren_node_agent::keyslots::KeySlots::default());
    let service = Arc::new(AgentService::shared(double, slots.clone(), Arc::default()));
    let waiting = |n: usize| {
        let slots = slots.clone();
        async move {
            while slots.waiting() != n {
                tokio::task::yield_now().await;
            }
        }
    };
    let wait = |limit| pb::KeySlotRequest { key: "team/agent".into(), limit, wait_ms: 60_000 };
    let mut first = service.hold_key_slot(key_slot("team/agent", 1)).await.unwrap().into_inner();
    first.next().await.unwrap().unwrap();
    let s = service.clone();
    let queued = tokio::spawn(async move { s.hold_key_slot(full(wait(1))).await.map(|r| r.into_inner()) });
    waiting(1).await;
    drop(first);
    let mut granted = queued.await.unwrap().unwrap();
    assert_eq!(granted.next().await.unwrap().unwrap().held, 1, "the waiter got the returned slot");
    let s = service.clone();
    let run = tokio::spawn(async move { s.execute(full(pb::ExecuteRequest { key_slot: Some(wait(1)), ..request("yes") })).await.map(|r| r.into_inner()) });
    waiting(1).await;
    assert!(seen.lock().unwrap().admitted.is_empty(), "a waiting execution is not admitted");
    drop(granted);
    let mut running = run.await.unwrap().unwrap();
    running.next().await.unwrap().unwrap();
    assert_eq!((seen.lock().unwrap().admitted.len(), slots.held("team/agent"), slots.waiting()), (1, 1, 0));
    drop(running);
}

/// A request as the interceptor passes on the gateways' (full) token.
fn full<T>(message: T) -> Request<T> {
    let mut r = Request::new(message);
    r.extensions_mut().insert(warren_node_agent::auth::Caller::Full);
    r
}
