//! The executor's lifecycle against a recording double of the sandboxes and
//! the resources: what it decides, without root, a kernel or a sandbox.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use warren_isolation::spec::{ExecSpec, Language, Limits, NodePolicy};
use warren_isolation::wire::Go;

use super::seam::{self, ClaimedSandbox, Planned, SandboxTeardown, Sandboxes};
use super::ExecError;
use crate::lifecycle::{Resource, Resources, SandboxView};
use crate::sandbox::{Event, Failure, Outcome, Rootfs, SandboxError, Shape};

/// What happened, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn note(&self, what: impl Into<String>) {
        self.0.lock().unwrap().push(what.into());
    }
    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// How the double's program ends.
#[derive(Clone, Copy)]
enum Program {
    /// Exits with this code.
    Exits(i32),
    /// Runs until its events' receiver goes away (the caller left or
    /// `Cancel` named it), then reports itself killed.
    UntilCancelled,
    /// Never ends.
    Hangs,
}

/// The sandboxes double.
struct Double {
    log: Log,
    claim_fails: bool,
    program: Program,
    /// Notified when a program starts.
    started: Arc<Notify>,
    /// Teardowns wait for this when set.
    teardown_gate: Option<Arc<Notify>>,
    /// Warm sandboxes hold more than any call's memory limit allows.
    warm_too_big: bool,
}

impl Double {
    fn new(log: &Log, program: Program) -> Double {
        Double { log: log.clone(), claim_fails: false, program, started: Arc::new(Notify::new()), teardown_gate: None, warm_too_big: false }
    }
}

struct FakeSandbox {
    log: Log,
    program: Program,
    started: Arc<Notify>,
    teardown_gate: Option<Arc<Notify>>,
    /// Not yet run or discarded: dropping it is abandoning it.
    live: bool,
    /// Its warm interpreter does not fit the call.
    too_big: bool,
}

struct FakeTeardown {
    log: Log,
    gate: Option<Arc<Notify>>,
}

impl Sandboxes for Double {
    type Claimed = FakeSandbox;

    async fn claim(&self, shape: Shape, _limits: &Limits) -> Result<FakeSandbox, SandboxError> {
        if self.claim_fails {
            self.log.note("claim failed");
            return Err(SandboxError::NoSlot);
        }
        self.log.note(if shape.warm.is_some() { "claim warm" } else { "claim" });
        let too_big = self.warm_too_big && shape.warm.is_some();
        Ok(FakeSandbox { log: self.log.clone(), program: self.program, started: self.started.clone(), teardown_gate: self.teardown_gate.clone(), live: true, too_big })
    }
}

impl ClaimedSandbox for FakeSandbox {
    type Teardown = FakeTeardown;

    fn view<'a>(&'a self, spec: &'a ExecSpec) -> SandboxView<'a> {
        SandboxView {
            id: "sbx-double",
            userns: None,
            host_id: 100_000,
            home_target: "/nonexistent/home".into(),
            data_dir: "/nonexistent/data".into(),
            conn_dir: "/nonexistent/conn".into(),
            init_pid: 0,
            dns_statics: None,
            spec,
        }
    }

    async fn run(mut self, _spec: &ExecSpec, go: Go, _received: Instant, events: &mpsc::Sender<Event>) -> (Outcome, FakeTeardown) {
        self.live = false;
        self.log.note(format!("run {}", go.env.iter().any(|(k, _)| k == "SHAPED")));
        self.started.notify_one();
        let outcome = match self.program {
            Program::Exits(code) => {
                let _ = events.send(Event::Stdout(b"hi\n".to_vec())).await;
                Outcome { exit_code: code, ..Outcome::default() }
            }
            Program::UntilCancelled => {
                events.closed().await;
                Outcome { exit_code: 137, signal: 9, cancelled: true, ..Outcome::default() }
            }
            Program::Hangs => std::future::pending().await,
        };
        self.log.note("program ended");
        (outcome, FakeTeardown { log: self.log.clone(), gate: self.teardown_gate.clone() })
    }

    async fn discard(mut self) {
        self.live = false;
        self.log.note("discard");
    }

    fn fits(&self, _spec: &ExecSpec) -> bool {
        !self.too_big
    }
}

impl Drop for FakeSandbox {
    fn drop(&mut self) {
        if self.live {
            self.log.note("sandbox dropped");
        }
    }
}

impl SandboxTeardown for FakeTeardown {
    async fn run(self) {
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        self.log.note("teardown");
    }
}

/// A resource double; `fails` names the phase that fails.
struct Probe {
    name: &'static str,
    fails: &'static str,
    log: Log,
}

impl Probe {
    fn boxed(name: &'static str, fails: &'static str, log: &Log) -> Box<dyn Resource> {
        Box::new(Probe { name, fails, log: log.clone() })
    }
    fn phase(&self, phase: &str) -> Result<(), Failure> {
        self.log.note(format!("{phase} {}", self.name));
        match self.fails == phase {
            true => Err(Failure::StorageMount(format!("{} failed to {phase}", self.name))),
            false => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl Resource for Probe {
    async fn acquire(&mut self) -> Result<(), Failure> {
        self.phase("acquire")
    }
    async fn prepare(&mut self, sandbox: &SandboxView<'_>) -> Result<(), Failure> {
        assert_eq!(sandbox.id, "sbx-double", "prepared for the claimed sandbox");
        self.phase("prepare")
    }
    fn shape(&self, go: &mut Go) {
        go.env.push(("SHAPED".into(), self.name.into()));
    }
    async fn finish(&mut self, outcome: &mut Outcome) {
        self.log.note(format!("finish {}", self.name));
        if self.fails == "finish" {
            // What a thread home does when its save fails.
            outcome.failure = Some(Failure::ThreadSave);
        }
    }
    async fn release(self: Box<Self>) {
        self.log.note(format!("release {}", self.name));
    }
}

/// What an execution holds to the end (its node slot, its thread lock);
/// says when it is let go.
struct Held {
    log: Log,
    gone: Option<oneshot::Sender<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.log.note("held dropped");
        if let Some(tx) = self.gone.take() {
            let _ = tx.send(());
        }
    }
}

fn plan(log: &Log) -> (Planned<Held>, oneshot::Receiver<()>) {
    let spec = ExecSpec::check(&mut warren_core::contract::Spec::new(Language::Python, "print(1)", Duration::from_secs(5)), &NodePolicy::default()).unwrap();
    let shape = Shape::of(&spec.limits, Rootfs::Host, None);
    let go = super::go_for(&spec, "/usr/bin/python3", &[]);
    let (tx, rx) = oneshot::channel();
    (Planned { spec, shape, go, held: Held { log: log.clone(), gone: Some(tx) }, trace: None }, rx)
}

fn resources(probes: Vec<Box<dyn Resource>>) -> Resources {
    let mut r = Resources::default();
    for p in probes {
        r.push(p);
    }
    r
}

/// Waits until the execution let go of what it held (bounded only so a bug
/// fails the test instead of hanging it).
async fn let_go(rx: oneshot::Receiver<()>) {
    tokio::time::timeout(Duration::from_secs(30), rx).await.expect("the execution never let go of its slot").unwrap();
}

async fn execute(double: &Double, probes: Vec<Box<dyn Resource>>, log: &Log) -> (Result<Outcome, ExecError>, Vec<Vec<u8>>, oneshot::Receiver<()>) {
    let (plan, gone) = plan(log);
    let (tx, mut rx) = mpsc::channel(16);
    let result = seam::run(double, resources(probes), plan, Instant::now(), tx).await;
    let mut out = Vec::new();
    while let Ok(Event::Stdout(d)) = rx.try_recv() {
        out.push(d);
    }
    (result, out, gone)
}

#[tokio::test]
async fn a_run_finishes_before_the_answer_and_releases_after_it() {
    let log = Log::default();
    let double = Double::new(&log, Program::Exits(3));
    let (result, out, gone) = execute(&double, vec![Probe::boxed("home", "", &log), Probe::boxed("mounts", "", &log)], &log).await;
    let outcome = result.unwrap();
    assert_eq!((outcome.exit_code, outcome.failure), (3, None));
    assert_eq!(out, vec![b"hi\n".to_vec()]);
    let at_answer = log.entries();
    assert_eq!(
        at_answer[..8],
        ["acquire home", "acquire mounts", "claim", "prepare home", "prepare mounts", "run true", "program ended", "finish mounts"].map(String::from)
    );
    assert_eq!(at_answer[8], "finish home", "finish runs last to first, before the answer");
    let_go(gone).await;
    assert_eq!(log.entries()[9..], ["release mounts", "release home", "teardown", "held dropped"].map(String::from), "released, torn down, then the slot");
}

/// A warm sandbox whose interpreter holds more than the call may use is
/// thrown away and the call starts cold (it would fail at the limit).
#[tokio::test]
async fn a_warm_sandbox_that_does_not_fit_the_call_gives_a_cold_start() {
    let log = Log::default();
    let double = Double { warm_too_big: true, ..Double::new(&log, Program::Exits(0)) };
    let (mut plan, gone) = plan(&log);
    plan.shape = plan.shape.warmed(warren_isolation::spec::warm_start(Language::Python, "/usr/bin/python3", &[], &[]));
    assert!(plan.shape.warm.is_some(), "the plan asks for a warm interpreter");
    let (tx, _rx) = mpsc::channel(16);
    let outcome = seam::run(&double, Resources::default(), plan, Instant::now(), tx).await.unwrap();
    assert_eq!(outcome.exit_code, 0);
    let_go(gone).await;
    let entries = log.entries();
    assert_eq!(entries[..3], ["claim warm", "claim", "run false"].map(String::from), "a cold claim runs the program: {entries:?}");
    // The discard is a task spawned before the teardown's: done by now.
    assert!(entries.contains(&"discard".to_string()), "the warm sandbox is thrown away: {entries:?}");
}

#[tokio::test]
async fn no_resources_means_no_prepare_and_the_program_is_not_reshaped() {
    let log = Log::default();
    let (result, _, gone) = execute(&Double::new(&log, Program::Exits(0)), vec![], &log).await;
    assert_eq!(result.unwrap().exit_code, 0);
    let_go(gone).await;
    assert_eq!(log.entries(), ["claim", "run false", "program ended", "teardown", "held dropped"].map(String::from));
}

#[tokio::test]
async fn a_failed_acquire_runs_nothing_claims_nothing_and_releases_everything() {
    let log = Log::default();
    let probes = vec![Probe::boxed("home", "", &log), Probe::boxed("mounts", "acquire", &log), Probe::boxed("conn", "", &log)];
    let (result, out, gone) = execute(&Double::new(&log, Program::Exits(0)), probes, &log).await;
    let outcome = result.unwrap();
    assert_eq!(outcome.exit_code, -1, "never ran");
    assert_eq!(outcome.failure, Some(Failure::StorageMount("mounts failed to acquire".into())));
    assert!(out.is_empty());
    assert!(log.entries().contains(&"release home".to_string()), "released before the answer (a thread is free when its caller hears nothing ran)");
    let_go(gone).await;
    assert_eq!(
        log.entries(),
        ["acquire home", "acquire mounts", "release conn", "release mounts", "release home", "held dropped"].map(String::from),
        "no sandbox claimed; every resource released, even the one never acquired"
    );
}

#[tokio::test]
async fn a_failed_prepare_discards_the_sandbox_and_releases_everything() {
    let log = Log::default();
    let probes = vec![Probe::boxed("home", "prepare", &log), Probe::boxed("mounts", "", &log)];
    let (result, out, gone) = execute(&Double::new(&log, Program::Exits(0)), probes, &log).await;
    let outcome = result.unwrap();
    assert_eq!((outcome.exit_code, outcome.failure), (-1, Some(Failure::StorageMount("home failed to prepare".into()))));
    assert!(out.is_empty(), "nothing ran");
    let at_answer = log.entries();
    assert_eq!(at_answer[3..], ["prepare home", "release mounts", "release home"].map(String::from), "released before the answer: {at_answer:?}");
    let_go(gone).await;
    let entries = log.entries();
    assert!(!entries.iter().any(|e| e.starts_with("run") || e == "teardown"), "{entries:?}");
    assert_eq!(
        entries[3..],
        ["prepare home", "release mounts", "release home", "discard", "held dropped"].map(String::from),
        "the half-prepared sandbox is discarded, never reused"
    );
}

#[tokio::test]
async fn a_failed_claim_is_an_error_and_still_releases_before_letting_go() {
    let log = Log::default();
    let mut double = Double::new(&log, Program::Exits(0));
    double.claim_fails = true;
    let (result, _, gone) = execute(&double, vec![Probe::boxed("home", "", &log)], &log).await;
    assert!(matches!(result, Err(ExecError::Sandbox(SandboxError::NoSlot))), "{result:?}");
    assert_eq!(log.entries(), ["acquire home", "claim failed", "release home", "held dropped"].map(String::from), "released before the error is answered");
    let_go(gone).await;
    assert_eq!(log.entries(), ["acquire home", "claim failed", "release home", "held dropped"].map(String::from));
}

#[tokio::test]
async fn a_failed_thread_save_marks_the_outcome_and_still_releases() {
    let log = Log::default();
    let (result, _, gone) = execute(&Double::new(&log, Program::Exits(0)), vec![Probe::boxed("home", "finish", &log)], &log).await;
    let outcome = result.unwrap();
    assert_eq!((outcome.exit_code, outcome.failure), (0, Some(Failure::ThreadSave)), "the program ran; the save's failure is on the answer");
    let_go(gone).await;
    assert_eq!(log.entries()[5..], ["finish home", "release home", "teardown", "held dropped"].map(String::from));
}

#[tokio::test]
async fn a_cancelled_execution_ends_finishes_and_releases_as_usual() {
    let log = Log::default();
    let double = Double::new(&log, Program::UntilCancelled);
    let (plan, gone) = plan(&log);
    let (tx, rx) = mpsc::channel(16);
    let started = double.started.clone();
    let running = seam::run(&double, resources(vec![Probe::boxed("home", "", &log)]), plan, Instant::now(), tx);
    let cancel = async {
        started.notified().await;
        // What `Cancel` and a departed caller both do: stop taking events.
        drop(rx);
    };
    let (result, ()) = tokio::join!(running, cancel);
    let outcome = result.unwrap();
    assert!(outcome.cancelled && outcome.exit_code == 137, "{outcome:?}");
    let_go(gone).await;
    assert_eq!(log.entries()[4..], ["program ended", "finish home", "release home", "teardown", "held dropped"].map(String::from));
}

#[tokio::test]
async fn an_abandoned_execution_still_releases_its_resources() {
    let log = Log::default();
    let double = Arc::new(Double::new(&log, Program::Hangs));
    let (plan, gone) = plan(&log);
    let (tx, _rx) = mpsc::channel(16);
    let started = double.started.clone();
    let task = tokio::spawn({
        let double = double.clone();
        let log = log.clone();
        async move { seam::run(&*double, resources(vec![Probe::boxed("home", "", &log)]), plan, Instant::now(), tx).await }
    });
    started.notified().await;
    // Its task is dropped mid-run (a panic elsewhere, the runtime shutting a task down).
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let_go(gone).await;
    for _ in 0..1000 {
        if log.entries().contains(&"release home".to_string()) {
            break;
        }
        tokio::task::yield_now().await;
    }
    let entries = log.entries();
    assert!(entries.contains(&"release home".to_string()), "released in the background: {entries:?}");
    assert!(!entries.iter().any(|e| e.starts_with("finish")), "an abandoned run is not finished as if it ended: {entries:?}");
}

#[tokio::test]
async fn the_slot_is_held_until_the_sandbox_is_torn_down() {
    let log = Log::default();
    let mut double = Double::new(&log, Program::Exits(0));
    let gate = Arc::new(Notify::new());
    double.teardown_gate = Some(gate.clone());
    let permits = Arc::new(Semaphore::new(1));
    let permit = seam::admit_slot(&permits, 1, Duration::from_millis(10)).await.unwrap();
    let (plan, _) = plan(&log);
    let plan = Planned { spec: plan.spec, shape: plan.shape, go: plan.go, held: permit, trace: None };
    let (tx, _rx) = mpsc::channel(16);
    let outcome = seam::run(&double, Resources::default(), plan, Instant::now(), tx).await.unwrap();
    assert_eq!(outcome.exit_code, 0);
    assert_eq!(permits.available_permits(), 0, "answered, but the sandbox is not gone yet: the slot stays taken");
    gate.notify_one();
    let slot = tokio::time::timeout(Duration::from_secs(30), permits.clone().acquire_owned()).await.expect("the slot comes back after teardown");
    assert!(slot.is_ok());
    assert_eq!(log.entries().last().map(String::as_str), Some("teardown"));
}

#[tokio::test(start_paused = true)]
async fn a_full_node_waits_briefly_then_refuses_as_busy() {
    let permits = Arc::new(Semaphore::new(2));
    let a = seam::admit_slot(&permits, 2, super::ADMIT_WAIT).await.unwrap();
    let _b = seam::admit_slot(&permits, 2, super::ADMIT_WAIT).await.unwrap();
    let t = tokio::time::Instant::now();
    let refused = seam::admit_slot(&permits, 2, super::ADMIT_WAIT).await;
    assert!(matches!(refused, Err(ExecError::Busy(2))), "{refused:?}");
    assert_eq!(t.elapsed(), super::ADMIT_WAIT, "it waited for a slot first");
    // A slot freed while a request waits admits it.
    let waiting = tokio::spawn({
        let permits = permits.clone();
        async move { seam::admit_slot(&permits, 2, super::ADMIT_WAIT).await.map(drop) }
    });
    tokio::task::yield_now().await;
    drop(a);
    assert!(waiting.await.unwrap().is_ok());
}
