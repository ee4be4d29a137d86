//! A prepared sandbox gone live: init serves processes (see
//! `warren_isolation::sandbox::live`) until the agent lets go. One task per
//! live sandbox owns its supervisor and init sockets ([`drive`]); everyone
//! else talks to it through a [`Driver`].

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};
use warren_isolation::spec::ExecSpec;
use warren_isolation::wire::{Go, InitEvent, LiveCommand, Spawn, SupervisorCommand, SupervisorEvent};

use super::{Prepared, SandboxError, Teardown};

/// How long init may take to go live (a home tmpfs, a devpts mount).
const GO_LIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a live sandbox's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Exit status, or 128 + signal.
    pub code: i32,
    /// Killing signal, 0 if it exited.
    pub signal: i32,
}

/// What the driver is asked.
enum Ask {
    Spawn { spawn: Spawn, stdio: [OwnedFd; 3], started: oneshot::Sender<Result<i32, String>>, ended: oneshot::Sender<Ended> },
    Signal { id: u64, signal: i32 },
    End,
}

/// The way to a live sandbox's init. Dropping every clone ends the sandbox.
#[derive(Clone)]
pub struct Driver {
    asks: mpsc::Sender<Ask>,
}

/// The sandbox ended (killed, its init died, or the agent let go).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the live sandbox has ended")]
pub struct Gone;

impl Driver {
    /// Starts `spawn` with `stdio` (stdin, stdout, stderr); its pid inside
    /// once it exec'd, and a receiver of its end. `Err(Ok(why))`: it did
    /// not start (nothing of it ran).
    pub async fn spawn(&self, spawn: Spawn, stdio: [OwnedFd; 3]) -> Result<Result<(i32, oneshot::Receiver<Ended>), String>, Gone> {
        let (started, started_rx) = oneshot::channel();
        let (ended, ended_rx) = oneshot::channel();
        self.asks.send(Ask::Spawn { spawn, stdio, started, ended }).await.map_err(|_| Gone)?;
        match started_rx.await {
            Ok(Ok(pid)) => Ok(Ok((pid, ended_rx))),
            Ok(Err(why)) => Ok(Err(why)),
            Err(_) => Err(Gone),
        }
    }

    /// Sends `signal` to process `id`'s group.
    pub async fn signal(&self, id: u64, signal: i32) -> Result<(), Gone> {
        self.asks.send(Ask::Signal { id, signal }).await.map_err(|_| Gone)
    }

    /// Ends the sandbox: every process in it is killed.
    pub async fn end(&self) {
        let _ = self.asks.send(Ask::End).await;
    }

    /// True once the sandbox has ended.
    pub fn is_gone(&self) -> bool {
        self.asks.is_closed()
    }

    /// Resolves when the sandbox has ended.
    pub async fn gone(&self) {
        self.asks.closed().await
    }
}

impl Prepared {
    /// Takes the call's limits and home (as [`Prepared::run`] does) and
    /// makes the sandbox live. Returns the driver and a receiver that
    /// yields the sandbox's [`Teardown`] once it ended (after the last
    /// driver is dropped, or its init died). A sandbox that does not go
    /// live is returned with its teardown.
    pub async fn go_live(mut self, spec: &ExecSpec, mut go: Go) -> Result<(Driver, oneshot::Receiver<Teardown>), (SandboxError, Teardown)> {
        warren_isolation::spec::dedupe_env(&mut go.env);
        go.live = true;
        go.warm = false;
        go.view = self.view_for(&spec.limits);
        if let Err(e) = self.cgroup.set_limits(&spec.limits) {
            return Err((e.into(), Teardown(self)));
        }
        let live = async {
            self.init.send(&go).await.map_err(super::io("send go"))?;
            match self.init.recv::<InitEvent>().await.map_err(super::io("read init"))? {
                Some(InitEvent::Live) => Ok(()),
                Some(InitEvent::Failed { stage, message }) => Err(SandboxError::Setup { stage, message }),
                other => Err(SandboxError::Setup { stage: "live".into(), message: format!("unexpected {other:?}") }),
            }
        };
        match tokio::time::timeout(GO_LIVE_TIMEOUT, live).await.unwrap_or(Err(SandboxError::Timeout)) {
            Ok(()) => {}
            Err(e) => {
                let _ = self.supervisor.send(&SupervisorCommand::Kill).await;
                return Err((e, Teardown(self)));
            }
        }
        // The accounting of the sandbox's life starts now.
        let _ = self.cgroup.reset_usage();
        let (asks, rx) = mpsc::channel(64);
        let (done, done_rx) = oneshot::channel();
        tokio::spawn(async move {
            drive(&mut self, rx).await;
            let _ = done.send(Teardown(self));
        });
        Ok((Driver { asks }, done_rx))
    }

    /// The sandbox's CPU and memory use since it went live.
    pub fn usage(&self) -> Option<warren_isolation::cgroup::Usage> {
        self.cgroup.usage().ok()
    }
}

/// A process asked for and not yet reported started: who waits for its start and its end.
type Starting = (oneshot::Sender<Result<i32, String>>, oneshot::Sender<Ended>);

/// Serves the driver's asks and init's reports until the sandbox ends: every
/// driver dropped (init is then killed with the supervisor), or init gone.
// Long: one select loop; the asks, init's reports and the supervisor's must be polled together.
async fn drive(p: &mut Prepared, mut asks: mpsc::Receiver<Ask>) {
    let mut starting: HashMap<u64, Starting> = HashMap::new();
    let mut running: HashMap<u64, oneshot::Sender<Ended>> = HashMap::new();
    loop {
        tokio::select! {
            ask = asks.recv() => match ask {
                Some(Ask::Spawn { spawn, stdio, started, ended }) => {
                    let id = spawn.id;
                    let fds = [stdio[0].as_raw_fd(), stdio[1].as_raw_fd(), stdio[2].as_raw_fd()];
                    match p.init.send_with_fds(&LiveCommand::Spawn(spawn), &fds).await {
                        Ok(()) => {
                            starting.insert(id, (started, ended));
                        }
                        Err(e) => {
                            warn!(sandbox = %p.id, error = %e, "init of a live sandbox stopped listening");
                            break;
                        }
                    }
                    // Init has its copies; ours close now.
                    drop(stdio);
                }
                Some(Ask::Signal { id, signal }) => {
                    if p.init.send(&LiveCommand::Signal { id, signal }).await.is_err() {
                        break;
                    }
                }
                Some(Ask::End) | None => break,
            },
            ev = p.init.recv::<InitEvent>() => match ev {
                Ok(Some(InitEvent::Spawned { id, pid })) => {
                    if let Some((started, ended)) = starting.remove(&id) {
                        let _ = started.send(Ok(pid));
                        running.insert(id, ended);
                    }
                }
                Ok(Some(InitEvent::SpawnFailed { id, message })) => {
                    if let Some((started, _)) = starting.remove(&id) {
                        let _ = started.send(Err(message));
                    }
                }
                Ok(Some(InitEvent::ProcessExited { id, code, signal })) => {
                    if let Some(ended) = running.remove(&id) {
                        let _ = ended.send(Ended { code, signal });
                    }
                }
                other => {
                    debug!(sandbox = %p.id, event = ?other.ok().flatten(), "init of a live sandbox ended");
                    break;
                }
            },
            ev = p.supervisor.recv::<SupervisorEvent>() => {
                if !matches!(ev, Ok(Some(SupervisorEvent::InitExited { .. }))) {
                    p.cgroup.kill_all();
                }
                break;
            }
        }
    }
    // Whatever still runs is killed with init; each waiting caller sees
    // its process end by SIGKILL.
    let _ = p.supervisor.send(&SupervisorCommand::Kill).await;
    let killed = Ended { code: 128 + libc::SIGKILL, signal: libc::SIGKILL };
    for (_, ended) in running.drain() {
        let _ = ended.send(killed);
    }
    drop(starting);
}
