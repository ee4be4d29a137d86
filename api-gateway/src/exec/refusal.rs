//! The gateway's one reader of agent statuses: a status becomes an
//! [`AgentRefusal`] here and nowhere else, and what each call makes of it
//! (execute, delete a thread, hold a key's slot, a file operation) sits
//! beside it, so a reason added to the contract is read in one file.

use tonic::Code;
use warren_proto::agent::RefusalReason as Reason;
use warren_proto::refusal::refusal_of;

use super::ExecError;

/// An agent's non-OK answer, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRefusal {
    /// The gRPC code (transport failures have one too).
    pub code: Code,
    /// The structured reason; `Unspecified` for a transport failure or an
    /// agent of another version.
    pub reason: Reason,
    /// The offending field, when the reason names one.
    pub field: String,
    /// The agent's message (safe for callers: internals stay in its log).
    pub message: String,
}

/// How a file operation's refusal reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRefusal {
    /// No such file or thread.
    NotFound,
    /// An execution holds the thread.
    ThreadBusy,
    /// The path (or a size) is invalid.
    Invalid,
    /// The thread's saved home would exceed its size limit.
    TooLarge,
    /// A new thread beyond the key's limit.
    ThreadLimit,
    /// The node or its store failed; retry.
    Unavailable,
}

impl AgentRefusal {
    /// Reads `status`.
    pub fn read(status: &tonic::Status) -> AgentRefusal {
        let (reason, field) = refusal_of(status);
        AgentRefusal { code: status.code(), reason, field, message: status.message().to_string() }
    }

    /// An `Execute` refusal (nothing ran); the second value is true when
    /// the node itself looks broken.
    pub fn of_execute(&self, thread_id: Option<&str>, key_limit: u32) -> (ExecError, bool) {
        let e = match self.reason {
            // The gateway validated first, so gateway and agent disagree on a
            // limit: the agent names the field.
            Reason::InvalidField | Reason::LanguageUnavailable => {
                let text = self.message.strip_prefix(&format!("{}: ", self.field)).unwrap_or(&self.message);
                ExecError::invalid(if self.field.is_empty() { "request" } else { &self.field }, text)
            }
            // It waited for a slot up to the queue wait the call carried (an
            // older agent only briefly): capacity, not a broken node.
            Reason::NodeBusy => ExecError::Busy("the node was at capacity"),
            // Another gateway replica runs this thread on the same node.
            Reason::ThreadBusy => ExecError::ThreadBusy(thread_id.unwrap_or_default().to_string()),
            Reason::MissingFeature => ExecError::NodeRefused("the node cannot provide the required isolation"),
            Reason::Unsupported => ExecError::NodeRefused("the node does not offer a capability this sandbox needs"),
            Reason::ShuttingDown => return (ExecError::NodeRefused("the node is shutting down"), true),
            Reason::SandboxSetup => return (ExecError::NodeRefused("the node could not set up a sandbox"), true),
            // The key's slot was taken with the execution, on its counting agent.
            Reason::KeyConcurrency => ExecError::KeyConcurrency(key_limit),
            Reason::ImagePulling => ExecError::ImagePulling,
            Reason::Image => ExecError::ImageUnavailable(self.message.strip_prefix("image: ").unwrap_or(&self.message).to_string()),
            Reason::ThreadStore | Reason::ThreadNotFound | Reason::LiveNotFound | Reason::Unspecified => return (ExecError::NodeRefused("the node-agent could not be reached"), true),
        };
        (e, false)
    }

    /// A `DeleteThread` refusal.
    pub fn of_delete(&self, thread_id: &str) -> ExecError {
        match self.reason {
            Reason::ThreadNotFound => ExecError::ThreadNotFound(thread_id.to_string()),
            Reason::ThreadBusy => ExecError::ThreadBusy(thread_id.to_string()),
            Reason::ThreadStore => ExecError::ThreadStore,
            _ => ExecError::NodeRefused("the thread could not be deleted right now"),
        }
    }

    /// A `ForkThread`/`RestoreThread`/`ThreadHistory` refusal; `thread_id`
    /// is the thread the call named, `target` a fork's first new id.
    pub fn of_version(&self, thread_id: &str, target: &str) -> ExecError {
        match (self.code, self.reason) {
            (Code::NotFound, _) if self.field == "at" => ExecError::VersionNotFound(thread_id.to_string()),
            (Code::NotFound, _) => ExecError::ThreadNotFound(thread_id.to_string()),
            (Code::AlreadyExists, _) => ExecError::ThreadExists(target.to_string()),
            (Code::Aborted, _) => ExecError::ThreadBusy(thread_id.to_string()),
            (Code::FailedPrecondition, Reason::ThreadStore) => ExecError::ThreadLimit,
            (Code::ResourceExhausted, Reason::ThreadStore) => ExecError::ThreadTooLarge,
            (Code::InvalidArgument, _) => ExecError::invalid(self.field.clone(), self.message.clone()),
            (Code::Unimplemented, _) => ExecError::NodeRefused("the thread's node is older than this gateway"),
            _ => ExecError::ThreadStore,
        }
    }

    /// A `HoldKeySlot` refusal that decides the request; `None` when the
    /// agent failed and another may answer.
    pub fn of_key_slot(&self, limit: u32) -> Option<ExecError> {
        match (self.code, self.reason) {
            (Code::ResourceExhausted, Reason::KeyConcurrency) => Some(ExecError::KeyConcurrency(limit)),
            (Code::ResourceExhausted, Reason::NodeBusy) => Some(ExecError::NodeRefused("the key's counting agent holds its maximum of slots")),
            (Code::InvalidArgument, _) => Some(ExecError::invalid("key", &self.message)),
            // Mid-upgrade, an agent older than the gateway: retryable, and the
            // node is not down.
            (Code::Unimplemented, _) => Some(ExecError::NodeRefused("the key's counting agent is older than this gateway")),
            _ => None,
        }
    }

    /// A file operation's refusal (read by code: agents before structured
    /// file refusals answer with the same codes).
    pub fn of_files(&self) -> FileRefusal {
        match self.code {
            Code::NotFound => FileRefusal::NotFound,
            Code::Aborted => FileRefusal::ThreadBusy,
            Code::InvalidArgument => FileRefusal::Invalid,
            Code::ResourceExhausted => FileRefusal::TooLarge,
            Code::FailedPrecondition => FileRefusal::ThreadLimit,
            _ => FileRefusal::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Status;
    use warren_proto::refusal::refuse;

    use super::*;

    fn read(s: Status) -> AgentRefusal {
        AgentRefusal::read(&s)
    }

    #[test]
    fn execute_refusals_name_the_field_and_spot_broken_nodes() {
        let r = read(refuse(Code::InvalidArgument, Reason::InvalidField, "limits.pids", "limits.pids: too many"));
        assert_eq!(r.of_execute(None, 0), (ExecError::invalid("limits.pids", "too many"), false));
        let r = read(refuse(Code::Aborted, Reason::ThreadBusy, "", "busy"));
        assert_eq!(r.of_execute(Some("t-1"), 0), (ExecError::ThreadBusy("t-1".into()), false));
        assert_eq!(read(refuse(Code::ResourceExhausted, Reason::KeyConcurrency, "", "")).of_execute(None, 3).0, ExecError::KeyConcurrency(3));
        assert_eq!(read(refuse(Code::FailedPrecondition, Reason::Image, "image", "image: manifest unknown")).of_execute(None, 0).0, ExecError::ImageUnavailable("manifest unknown".into()));
        assert!(read(refuse(Code::Internal, Reason::SandboxSetup, "", "x")).of_execute(None, 0).1, "a node that cannot set up sandboxes is broken");
        assert!(read(Status::unavailable("connection refused")).of_execute(None, 0).1, "an unreachable node is broken");
        assert!(!read(refuse(Code::ResourceExhausted, Reason::NodeBusy, "", "")).of_execute(None, 0).1, "a busy node is not");
    }

    #[test]
    fn delete_refusals() {
        assert_eq!(read(refuse(Code::NotFound, Reason::ThreadNotFound, "", "")).of_delete("t"), ExecError::ThreadNotFound("t".into()));
        assert_eq!(read(refuse(Code::Aborted, Reason::ThreadBusy, "", "")).of_delete("t"), ExecError::ThreadBusy("t".into()));
        assert_eq!(read(refuse(Code::Unavailable, Reason::ThreadStore, "", "")).of_delete("t"), ExecError::ThreadStore);
        assert!(matches!(read(Status::unavailable("down")).of_delete("t"), ExecError::NodeRefused(_)));
    }

    #[test]
    fn only_transport_failures_ask_the_next_counting_agent() {
        assert_eq!(read(refuse(Code::ResourceExhausted, Reason::KeyConcurrency, "", "at limit")).of_key_slot(4), Some(ExecError::KeyConcurrency(4)));
        assert!(matches!(read(refuse(Code::ResourceExhausted, Reason::NodeBusy, "", "full")).of_key_slot(4), Some(ExecError::NodeRefused(_))));
        assert!(matches!(read(refuse(Code::InvalidArgument, Reason::InvalidField, "key", "bad")).of_key_slot(4), Some(ExecError::Invalid { .. })));
        assert_eq!(read(Status::unavailable("connection refused")).of_key_slot(4), None);
        assert!(matches!(read(Status::unimplemented("an older agent")).of_key_slot(4), Some(ExecError::NodeRefused(_))), "an older agent is not marked down");
    }

    #[test]
    fn file_refusals_read_by_code() {
        let cases = [
            (Code::NotFound, FileRefusal::NotFound),
            (Code::Aborted, FileRefusal::ThreadBusy),
            (Code::InvalidArgument, FileRefusal::Invalid),
            (Code::ResourceExhausted, FileRefusal::TooLarge),
            (Code::FailedPrecondition, FileRefusal::ThreadLimit),
            (Code::Unavailable, FileRefusal::Unavailable),
            (Code::Internal, FileRefusal::Unavailable),
        ];
        for (code, want) in cases {
            assert_eq!(read(Status::new(code, "x")).of_files(), want, "{code:?}");
        }
    }
}
