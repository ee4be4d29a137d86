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
use warren_isolation::spec::ExecSpec;
use warren_isolation::wire::Go;

use super::ExecError;
use crate::lifecycle::{Resources, SandboxView};
use crate::pool::Pool;
use crate::sandbox::{Event, Outcome, Prepared, SandboxError, Shape, Teardown};

/// Where sandboxes come from.
pub trait Sandboxes: Send + Sync {
    /// A sandbox claimed for one execution.
    type Claimed: ClaimedSandbox;
    /// A ready sandbox of `shape`.
    fn claim(&self, shape: Shape) -> impl Future<Output = Result<Self::Claimed, SandboxError>> + Send;
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

    fn claim(&self, shape: Shape) -> impl Future<Output = Result<Prepared, SandboxError>> + Send {
        Pool::claim(self, shape)
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
    match sandboxes.claim(shape.clone()).await {
        Ok(sandbox) if !sandbox.fits(spec) => {
            tokio::spawn(sandbox.discard());
            sandboxes.claim(Shape { warm: None, ..shape.clone() }).await
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
/// A failed acquire or prepare answers `never_ran` and still releases
/// everything; a sandbox whose prepare failed is discarded, never reused.
pub async fn run<S: Sandboxes, H: Send + 'static>(sandboxes: &S, mut resources: Resources, plan: Planned<H>, received: Instant, events: mpsc::Sender<Event>) -> Result<Outcome, ExecError> {
    let Planned { spec, shape, mut go, held } = plan;
    let t0 = Instant::now();
    if let Err(failure) = resources.acquire().await {
        tokio::spawn(async move {
            resources.release().await;
            drop(held);
        });
        return Ok(Outcome::never_ran(failure));
    }
    let t_acquired = t0.elapsed();
    let sandbox = match claim_fitting(sandboxes, &shape, &spec).await {
        Ok(sandbox) => sandbox,
        Err(e) => {
            tokio::spawn(async move {
                resources.release().await;
                drop(held);
            });
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
        tokio::spawn(async move {
            resources.release().await;
            sandbox.discard().await;
            drop(held);
        });
        return Ok(Outcome::never_ran(failure));
    }
    let t_prepared = t0.elapsed();
    resources.shape(&mut go);
    let (mut outcome, teardown) = sandbox.run(&spec, go, received, &events).await;
    sandboxes.refill(shape);
    let t_ran = t0.elapsed();
    resources.finish(&mut outcome).await;
    let us = |d: Duration| d.as_micros() as u64;
    debug!(
        resources = !resources.is_empty(), acquire_us = us(t_acquired), claim_us = us(t_claimed - t_acquired), prepare_us = us(t_prepared - t_claimed),
        run_us = us(t_ran - t_prepared), finish_us = us(t0.elapsed() - t_ran), "execution phases"
    );
    tokio::spawn(async move {
        resources.release().await;
        teardown.run().await;
        drop(held);
    });
    Ok(outcome)
}
