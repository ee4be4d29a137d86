//! Per-execution resources and their lifecycle.
//!
//! Everything an execution holds besides its sandbox — a thread home today;
//! storage mounts, image layers, network and credentials next — is a
//! [`Resource`] with three phases:
//!
//! ```text
//! acquire   before a sandbox is claimed                              (may fail: nothing runs)
//! prepare   after the sandbox is claimed, before the program runs   (may fail: nothing runs)
//! finish    after the program, before the answer                     (save, flush; may mark the outcome)
//! release   after the answer                                          (unmount, delete; never fails)
//! ```
//!
//! Work that needs no sandbox (restoring a thread, fetching credentials or
//! image layers) belongs in `acquire`: claiming a warm sandbox starts its
//! replacement, which then competes for the CPU with whatever follows.
//!
//! [`Resources`] runs the phases in order (acquire and prepare first to last, finish and
//! release last to first), and guarantees release for every resource it was
//! given on every path: success, a failed prepare, a timeout or cancel (the
//! program ends, then finish and release run as usual), and an abandoned
//! execution (dropped without release → released in the background). An agent
//! crash skips all of that; what a resource leaves on the host must then be
//! recognisable and collected when the next agent starts (see
//! `prepare_state_dir` in the crate root for homes and work dirs).

pub mod storage;
pub mod thread_home;

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use tonic::async_trait;
use warren_isolation::spec::ExecSpec;
use warren_isolation::wire::Go;

use crate::sandbox::{Failure, Outcome};

/// What a resource may know of the sandbox it prepares for.
pub struct SandboxView<'a> {
    /// The sandbox's id (unique on the node; names per-sandbox host paths).
    pub id: &'a str,
    /// The sandbox's user namespace, for id-mapped mounts.
    pub userns: Option<&'a OwnedFd>,
    /// Host uid/gid of the sandbox's root; its user is `host_id + 1`.
    pub host_id: u32,
    /// Host path the sandbox sees as its home.
    pub home_target: PathBuf,
    /// Host directory the sandbox sees as `/data`.
    pub data_dir: PathBuf,
    /// Host directory the sandbox sees as `/run/warren/connectors`.
    pub conn_dir: PathBuf,
    /// Init's pid (host view): the way into the sandbox's namespaces.
    pub init_pid: i32,
    /// Names the sandbox's resolver answers itself (`Unrestricted` only).
    pub dns_statics: Option<warren_network::dns::Statics>,
    /// The admitted execution.
    pub spec: &'a ExecSpec,
}

/// One per-execution resource. See the module docs for the phases.
#[async_trait]
pub trait Resource: Send {
    /// Gets what needs no sandbox. An error means the program never runs.
    async fn acquire(&mut self) -> Result<(), Failure> {
        Ok(())
    }
    /// Makes the resource ready for this sandbox. An error means the program never runs.
    async fn prepare(&mut self, sandbox: &SandboxView<'_>) -> Result<(), Failure>;
    /// Adjusts how the program starts (called only after a successful prepare).
    fn shape(&self, _go: &mut Go) {}
    /// Work that must be done before the caller gets the answer.
    async fn finish(&mut self, _outcome: &mut Outcome) {}
    /// Gives back whatever the resource holds on the host. Called once,
    /// whatever happened before, including when `prepare` failed or never ran.
    async fn release(self: Box<Self>);
    /// A live sandbox's home as it is now, for a fork (thread homes only,
    /// once prepared).
    fn live_home(&self) -> Option<std::sync::Arc<crate::threads::LiveHome>> {
        None
    }
}

/// The resources of one execution.
#[derive(Default)]
pub struct Resources {
    list: Vec<Box<dyn Resource>>,
}

impl Resources {
    /// Adds a resource; it is prepared after those added before it.
    pub fn push(&mut self, r: Box<dyn Resource>) {
        self.list.push(r);
    }

    /// True when the execution holds nothing besides its sandbox.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Acquires every resource in order, stopping at the first failure.
    pub async fn acquire(&mut self) -> Result<(), Failure> {
        for r in &mut self.list {
            r.acquire().await?;
        }
        Ok(())
    }

    /// Prepares every resource in order, stopping at the first failure.
    pub async fn prepare(&mut self, sandbox: &SandboxView<'_>) -> Result<(), Failure> {
        for r in &mut self.list {
            r.prepare(sandbox).await?;
        }
        Ok(())
    }

    /// The thread home, once prepared (see [`Resource::live_home`]).
    pub fn live_home(&self) -> Option<std::sync::Arc<crate::threads::LiveHome>> {
        self.list.iter().find_map(|r| r.live_home())
    }

    /// Lets each resource adjust the program's start.
    pub fn shape(&self, go: &mut Go) {
        for r in &self.list {
            r.shape(go);
        }
    }

    /// Finishes every resource, last first.
    pub async fn finish(&mut self, outcome: &mut Outcome) {
        for r in self.list.iter_mut().rev() {
            r.finish(outcome).await;
        }
    }

    /// Releases every resource, last first.
    pub async fn release(mut self) {
        release_all(std::mem::take(&mut self.list)).await;
    }
}

async fn release_all(list: Vec<Box<dyn Resource>>) {
    for r in list.into_iter().rev() {
        r.release().await;
    }
}

impl Drop for Resources {
    /// An execution dropped without `release` (its task panicked, or it was
    /// abandoned on an error path) still gives everything back.
    fn drop(&mut self) {
        let list = std::mem::take(&mut self.list);
        if list.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(release_all(list));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Log = Arc<Mutex<Vec<String>>>;

    struct Probe {
        name: &'static str,
        fail_prepare: bool,
        log: Log,
    }

    impl Probe {
        fn boxed(name: &'static str, fail_prepare: bool, log: &Log) -> Box<dyn Resource> {
            Box::new(Probe { name, fail_prepare, log: log.clone() })
        }
        fn note(&self, phase: &str) {
            self.log.lock().unwrap().push(format!("{phase} {}", self.name));
        }
    }

    #[async_trait]
    impl Resource for Probe {
        async fn acquire(&mut self) -> Result<(), Failure> {
            self.note("acquire");
            Ok(())
        }
        async fn prepare(&mut self, _: &SandboxView<'_>) -> Result<(), Failure> {
            self.note("prepare");
            if self.fail_prepare {
                return Err(Failure::ThreadMount);
            }
            Ok(())
        }
        fn shape(&self, go: &mut Go) {
            go.env.push((self.name.into(), "1".into()));
        }
        async fn finish(&mut self, outcome: &mut Outcome) {
            self.note("finish");
            outcome.cpu_micros += 1;
        }
        async fn release(self: Box<Self>) {
            self.note("release");
        }
    }

    fn spec() -> ExecSpec {
        use warren_isolation::spec::{Language, NodePolicy};
        ExecSpec::check(&mut warren_core::contract::Spec::new(Language::Bash, "true", std::time::Duration::from_secs(1)), &NodePolicy::default()).unwrap()
    }

    fn view(spec: &ExecSpec) -> SandboxView<'_> {
        SandboxView {
            id: "s1",
            userns: None,
            host_id: 1000,
            home_target: PathBuf::from("/nonexistent"),
            data_dir: PathBuf::from("/nonexistent"),
            conn_dir: PathBuf::from("/nonexistent"),
            init_pid: 0,
            dns_statics: None,
            spec,
        }
    }

    fn taken(log: &Log) -> Vec<String> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[tokio::test]
    async fn phases_run_in_order_and_unwind_in_reverse() {
        let log = Log::default();
        let mut rs = Resources::default();
        rs.push(Probe::boxed("home", false, &log));
        rs.push(Probe::boxed("mount", false, &log));
        let spec = spec();
        rs.acquire().await.unwrap();
        rs.prepare(&view(&spec)).await.unwrap();
        let mut go = Go {
            interpreter: "/bin/sh".into(),
            script_name: "main.sh".into(),
            code: String::new(),
            env: vec![],
            open_files: 1,
            file_size_bytes: 1,
            max_processes: 1,
            home: warren_isolation::wire::Home::Tmpfs { bytes: 1 },
            warm: false,
            view: None,
            live: false,
        };
        rs.shape(&mut go);
        assert_eq!(go.env, [("home".to_string(), "1".to_string()), ("mount".into(), "1".into())]);
        let mut outcome = Outcome::default();
        rs.finish(&mut outcome).await;
        assert_eq!(outcome.cpu_micros, 2, "every finish saw the outcome");
        rs.release().await;
        assert_eq!(taken(&log), ["acquire home", "acquire mount", "prepare home", "prepare mount", "finish mount", "finish home", "release mount", "release home"]);
    }

    #[tokio::test]
    async fn a_failed_prepare_stops_there_and_everything_is_still_released() {
        let log = Log::default();
        let mut rs = Resources::default();
        for (name, fail) in [("a", false), ("b", true), ("c", false)] {
            rs.push(Probe::boxed(name, fail, &log));
        }
        let spec = spec();
        assert_eq!(rs.prepare(&view(&spec)).await, Err(Failure::ThreadMount));
        rs.release().await;
        assert_eq!(taken(&log), ["prepare a", "prepare b", "release c", "release b", "release a"]);
    }

    #[tokio::test]
    async fn an_abandoned_execution_is_released_in_the_background() {
        let log = Log::default();
        let mut rs = Resources::default();
        rs.push(Probe::boxed("home", false, &log));
        let spec = spec();
        rs.prepare(&view(&spec)).await.unwrap();
        drop(rs);
        // The release task runs on this (current-thread) runtime once we yield.
        for _ in 0..10 {
            if log.lock().unwrap().len() == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(taken(&log), ["prepare home", "release home"]);
    }
}
