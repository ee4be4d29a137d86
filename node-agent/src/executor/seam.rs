//! The seam under the executor: what it needs from sandboxes, and the one
//! lifecycle of an admitted execution written against it.
//!
//! Today's [`Pool`] and [`Prepared`] sandbox implement the traits; the unit
//! tests (`tests.rs`) implement them with a recording double, so the
//! executor's decisions — release on every path, discard after a failed
//! prepare, a failed save marking the outcome, an abandoned or cancelled
//! execution, admission at the node's limit — are tested without root.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tracing::debug;
use warren_isolation::spec::{ExecSpec, Limits};
use warren_isolation::wire::Go;

use super::ExecError;
use crate::lifecycle::{Resources, SandboxView};
use crate::pool::Pool;
use crate::sandbox::{Event, Outcome, Prepared, SandboxError, Shape, Teardown};

/// Where sandboxes come from.
pub trait Sandboxes: Send + Sync {
    /// A sandbox claimed for one execution.
    type Claimed: ClaimedSandbox;
    /// A ready sandbox of `shape`, for a call of `limits`.
    fn claim(&self, shape: Shape, limits: &Limits) -> impl Future<Output = Result<Self::Claimed, SandboxError>> + Send;
    /// The program that claimed a sandbox of `shape` ended: time to replace it.
    fn refill(&self, _shape: Shape) {}
}

/// A sandbox that waits for its program.
pub trait ClaimedSandbox: Send + 'static {
    /// What is left after its program: reaping and removal.
    type Teardown: SandboxTeardown;
    /// What the execution's resources may know of it.
    fn view<'a>(&'a self, spec: &'a ExecSpec) -> SandboxView<'a>;
    /// Runs the program, streaming `events`; dropping their receiver kills it.
    fn run(self, spec: &ExecSpec, go: Go, received: Instant, events: &mpsc::Sender<Event>) -> impl Future<Output = (Outcome, Self::Teardown)> + Send;
    /// Throws the sandbox away unused (its state may be tainted).
    fn discard(self) -> impl Future<Output = ()> + Send;
    /// Whether what waits in it for the call (a warm interpreter, its
    /// imports) fits under the call's memory limit; one that does not
    /// would fail the call (or crowd its program), which then starts cold.
    fn fits(&self, _spec: &ExecSpec) -> bool {
        true
    }
}

/// The end of a sandbox.
pub trait SandboxTeardown: Send + 'static {
    /// Reaps and removes everything of the sandbox.
    fn run(self) -> impl Future<Output = ()> + Send;
}

impl Sandboxes for Pool {
    type Claimed = Prepared;

    fn claim(&self, shape: Shape, limits: &Limits) -> impl Future<Output = Result<Prepared, SandboxError>> + Send {
        Pool::claim(self, shape, limits)
    }

    fn refill(&self, shape: Shape) {
        Pool::refill(self, shape)
    }
}

impl ClaimedSandbox for Prepared {
    type Teardown = Teardown;

    fn view<'a>(&'a self, spec: &'a ExecSpec) -> SandboxView<'a> {
        SandboxView {
            id: self.id(),
            userns: self.userns(),
            host_id: self.host_id(),
            home_target: self.home_target(),
            data_dir: self.data_dir(),
            conn_dir: self.conn_dir(),
            init_pid: self.init_pid(),
            dns_statics: self.dns_statics(),
            spec,
        }
    }

    fn run(self, spec: &ExecSpec, go: Go, received: Instant, events: &mpsc::Sender<Event>) -> impl Future<Output = (Outcome, Teardown)> + Send {
        Prepared::run(self, spec, go, received, events)
    }

    fn discard(self) -> impl Future<Output = ()> + Send {
        Prepared::discard(self)
    }

    fn fits(&self, spec: &ExecSpec) -> bool {
        self.warm_fits(spec.limits.memory_bytes)
    }
}

impl SandboxTeardown for Teardown {
    fn run(self) -> impl Future<Output = ()> + Send {
        Teardown::run(self)
    }
}

/// One admitted execution, ready to run: what the lifecycle needs.
pub struct Planned<H> {
    /// The validated spec.
    pub spec: ExecSpec,
    /// The sandbox it needs.
    pub shape: Shape,
    /// How its program starts (before the resources shape it).
    pub go: Go,
    /// Held until nothing of the execution is left (its node slot, its
    /// thread lock): dropped last, after release and teardown.
    pub held: H,
    /// The trace it continues.
    pub trace: Option<warren_core::trace::Trace>,
}

/// Takes one of the node's execution slots, waiting at most `wait` (the
/// previous execution's teardown usually frees one within milliseconds).
pub async fn admit_slot(permits: &Arc<Semaphore>, max: u32, wait: Duration) -> Result<OwnedSemaphorePermit, ExecError> {
    match tokio::time::timeout(wait, permits.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(ExecError::Busy(max)),
    }
}

/// Claims a sandbox of `shape`; one whose warm interpreter holds more than
/// the call may use is thrown away for a cold one.
async fn claim_fitting<S: Sandboxes>(sandboxes: &S, shape: &Shape, spec: &ExecSpec) -> Result<S::Claimed, SandboxError> {
    match sandboxes.claim(shape.clone(), &spec.limits).await {
        Ok(sandbox) if !sandbox.fits(spec) => {
            tokio::spawn(sandbox.discard());
            sandboxes.claim(Shape { warm: None, ..shape.clone() }, &spec.limits).await
        }
        other => other,
    }
}

/// Runs a planned execution. Errors are returned only when nothing ran.
///
/// The outcome is returned once every process of the program is gone and
/// every resource finished (a thread's save is durable); then the resources
/// are released and the sandbox torn down in the background while `held`
/// stays held, so the node counts an execution until nothing of it is left.
/// A failed acquire, claim or prepare releases the resources before it
/// answers (`never_ran`, or the claim's error), so a thread is free again
/// when its caller hears that nothing ran; a sandbox whose prepare failed
/// is then discarded in the background, never reused.
pub async fn run<S: Sandboxes, H: Send + 'static>(sandboxes: &S, mut resources: Resources, plan: Planned<H>, received: Instant, events: mpsc::Sender<Event>) -> Result<Outcome, ExecError> {
    let Planned { spec, shape, mut go, held, trace } = plan;
    let (t0, wall0) = (Instant::now(), std::time::SystemTime::now());
    if let Err(failure) = resources.acquire().await {
        resources.release().await;
        drop(held);
        return Ok(Outcome::never_ran(failure));
    }
    let t_acquired = t0.elapsed();
    let sandbox = match claim_fitting(sandboxes, &shape, &spec).await {
        Ok(sandbox) => sandbox,
        Err(e) => {
            resources.release().await;
            drop(held);
            return Err(e.into());
        }
    };
    let t_claimed = t0.elapsed();
    let prepared = match resources.is_empty() {
        true => Ok(()),
        false => resources.prepare(&sandbox.view(&spec)).await,
    };
    if let Err(failure) = prepared {
        sandboxes.refill(shape);
        resources.release().await;
        tokio::spawn(async move {
            sandbox.discard().await;
            drop(held);
        });
        return Ok(Outcome::never_ran(failure));
    }
    let t_prepared = t0.elapsed();
    resources.shape(&mut go);
    let program = trace.as_ref().map(|t| traced(t, &mut go));
    let (mut outcome, teardown) = sandbox.run(&spec, go, received, &events).await;
    sandboxes.refill(shape);
    let t_ran = t0.elapsed();
    resources.finish(&mut outcome).await;
    let us = |d: Duration| d.as_micros() as u64;
    debug!(
        resources = !resources.is_empty(), acquire_us = us(t_acquired), claim_us = us(t_claimed - t_acquired), prepare_us = us(t_prepared - t_claimed),
        run_us = us(t_ran - t_prepared), finish_us = us(t0.elapsed() - t_ran), "execution phases"
    );
    if let (Some(t), Some(program)) = (&trace, program) {
        let at = |d: Duration| wall0 + d;
        let saved = (!resources.is_empty()).then(|| (at(t_ran), at(t0.elapsed())));
        export_phases(t, program, &spec.id, [at(Duration::ZERO), at(t_claimed), at(t_prepared), at(t_ran)], saved, &outcome);
    }
    tokio::spawn(async move {
        resources.release().await;
        teardown.run().await;
        drop(held);
    });
    Ok(outcome)
}

/// Gives the program the trace it continues: `TRACEPARENT` naming its own
/// span when this node exports spans (else the caller's parent, so the
/// program still joins the caller's trace) and the caller's `TRACESTATE`;
/// what the request's variables said of either is replaced. The program's span.
fn traced(t: &warren_core::trace::Trace, go: &mut Go) -> warren_core::trace::SpanRef {
    let program = match warren_telemetry::otlp::enabled() {
        true => t.parent.child(&mut |b: &mut [u8]| rand::fill(b)),
        false => t.parent,
    };
    go.env.retain(|(k, _)| k != "TRACEPARENT" && k != "TRACESTATE");
    go.env.push(("TRACEPARENT".into(), program.header()));
    if let Some(state) = &t.state {
        go.env.push(("TRACESTATE".into(), state.clone()));
    }
    program
}

/// Exports the node's phases of an execution as spans under the caller's
/// parent: claim (the thread restored, a sandbox taken), sandbox start
/// (mounts, credentials), program and, with a thread or storage, save.
/// `marks` are the start, claimed, prepared and ran instants.
fn export_phases(t: &warren_core::trace::Trace, program: warren_core::trace::SpanRef, id: &str, marks: [std::time::SystemTime; 4], saved: Option<(std::time::SystemTime, std::time::SystemTime)>, outcome: &Outcome) {
    use warren_telemetry::otlp::Phase;
    if !warren_telemetry::otlp::enabled() {
        return;
    }
    let mut fill = |b: &mut [u8]| rand::fill(b);
    let parent = Some(t.parent.span_id);
    let ids = vec![("warren.execution_id", id.to_string())];
    let phase = |name, span, start, end, attributes| Phase { name, span, parent, start, end, server: false, attributes };
    let mut phases = vec![
        phase("claim", t.parent.child(&mut fill), marks[0], marks[1], ids.clone()),
        phase("sandbox start", t.parent.child(&mut fill), marks[1], marks[2], ids.clone()),
        phase("program", program, marks[2], marks[3], [ids.clone(), vec![("process.exit.code", outcome.exit_code.to_string()), ("warren.timed_out", outcome.timed_out.to_string())]].concat()),
    ];
    if let Some((start, end)) = saved {
        phases.push(phase("save", t.parent.child(&mut fill), start, end, ids));
    }
    warren_telemetry::otlp::export(phases);
}
