//! The thread-version RPCs over [`Threads`]: proto in, domain call, proto
//! out (the gRPC adapter's half for forks, restores and histories;
//! `crate::service` calls it).

use tonic::Status;
use warren_proto::agent as pb;

use crate::live::LiveSandboxes;
use crate::refusal::{self, invalid};
use crate::threads::history::Version;
use crate::threads::{Kind, Produced, ThreadKey, Threads};

/// Most threads one fork makes.
pub use crate::threads::versions::MAX_FORKS;

/// `ForkThread`.
pub async fn fork(threads: &Threads, req: pb::ForkThreadRequest) -> Result<pb::ForkThreadResponse, Status> {
    let source = crate::convert::thread_options(req.source.ok_or_else(|| invalid("source", "required"))?)?;
    let targets = target_keys(&source.key, &req.targets)?;
    let at = (!req.at.is_empty()).then_some(req.at.as_str());
    threads.fork(&source, &targets, at).await.map_err(|e| refusal::status(&e))?;
    Ok(pb::ForkThreadResponse {})
}

/// `LiveFork`: the home of live sandbox `req.live` as it is now.
pub async fn live_fork(threads: &Threads, live: &LiveSandboxes, req: pb::LiveForkRequest, trace_id: String) -> Result<pb::ForkThreadResponse, Status> {
    let name = crate::live_rpc::name(req.live)?;
    let sandbox = live.get(&name).map_err(|e| refusal::status(&e))?;
    let home = sandbox.home().cloned().ok_or_else(|| invalid("live", "the sandbox has no thread home"))?;
    let targets = target_keys(&home.base.options.key, &req.targets)?;
    let produced = Produced { trace_id, kind: Kind::Fork, exit: None };
    threads.fork_live(&home, &targets, produced).await.map_err(|e| refusal::status(&e))?;
    Ok(pb::ForkThreadResponse {})
}

/// The new threads `ids` of `source`'s key: 1..=[`MAX_FORKS`], each once, none the source.
fn target_keys(source: &ThreadKey, ids: &[String]) -> Result<Vec<ThreadKey>, Status> {
    if ids.is_empty() || ids.len() > MAX_FORKS {
        return Err(invalid("targets", &format!("from 1 to {MAX_FORKS} thread ids")));
    }
    let mut targets = Vec::with_capacity(ids.len());
    for id in ids {
        let key = ThreadKey::new(&source.namespace, &source.key_name, id).map_err(|e| invalid("targets", &e.to_string()))?;
        if key == *source || targets.contains(&key) {
            return Err(invalid("targets", "each new thread id once, none the source's"));
        }
        targets.push(key);
    }
    Ok(targets)
}

/// `RestoreThread`.
pub async fn restore(threads: &Threads, req: pb::RestoreThreadRequest) -> Result<pb::RestoreThreadResponse, Status> {
    let options = crate::convert::thread_options(req.thread.ok_or_else(|| invalid("thread", "required"))?)?;
    if req.at.is_empty() {
        return Err(invalid("at", "required: the trace id of an execution"));
    }
    let produced = Produced { trace_id: req.trace_id, kind: Kind::Restore, exit: None };
    let v = threads.restore_version(&options, &req.at, produced).await.map_err(|e| refusal::status(&e))?;
    Ok(pb::RestoreThreadResponse { version: Some(version(&v, true)) })
}

/// `ThreadHistory`.
pub async fn history(threads: &Threads, req: pb::ThreadHistoryRequest) -> Result<pb::ThreadHistoryResponse, Status> {
    let key = crate::convert::thread_key(req.thread)?;
    let listed = threads.history(&key).await.map_err(|e| refusal::status(&e))?;
    Ok(pb::ThreadHistoryResponse { versions: listed.iter().map(|l| version(&l.version, l.current)).collect() })
}

fn version(v: &Version, current: bool) -> pb::ThreadVersion {
    pb::ThreadVersion { trace_id: v.trace_id.clone(), kind: v.kind.as_str().into(), at_unix: v.at, bytes: v.bytes, exit_code: v.exit, layers: v.layers.len() as u32, current }
}
