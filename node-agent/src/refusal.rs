//! The agent's one mapping from its errors to gRPC statuses.
//!
//! Every refusal carries a structured [`warren_proto::agent::Refusal`]
//! (reason and field) in its details, so the gateway reads data, never a
//! message. Each error type says what it is ([`Refuses`]); [`status`] is
//! the only place a status is built from one, and the only place internals
//! that must not reach a caller are logged instead.

use tonic::{Code, Status};
use tracing::warn;
use warren_proto::agent::RefusalReason as Reason;
use warren_proto::refusal::refuse;

use warren_core::contract::SpecError;
use warren_proto::spec::WireError;

use crate::executor::ExecError;
use crate::files::FilesError;
use crate::keyslots::KeySlotError;
use crate::sandbox::SandboxError;
use crate::threads::ThreadError;

/// What an error says on the wire.
pub struct Class<'a> {
    code: Code,
    reason: Reason,
    field: &'a str,
    /// Said instead of the error's own text, which then goes to the log
    /// only (paths, store errors, a sandbox's failing step).
    public: Option<&'static str>,
}

impl<'a> Class<'a> {
    const fn new(code: Code, reason: Reason, field: &'a str) -> Class<'a> {
        Class { code, reason, field, public: None }
    }

    const fn private(code: Code, reason: Reason, public: &'static str) -> Class<'a> {
        Class { code, reason, field: "", public: Some(public) }
    }
}

/// An error the agent answers with.
pub trait Refuses: std::fmt::Display {
    /// Its code, reason and field.
    fn class(&self) -> Class<'_>;
}

/// The status answering `e`.
pub fn status<E: Refuses + ?Sized>(e: &E) -> Status {
    let class = e.class();
    match class.public {
        Some(public) => {
            warn!(error = %e, reason = ?class.reason, "refused: {public}");
            refuse(class.code, class.reason, class.field, public)
        }
        None => refuse(class.code, class.reason, class.field, e.to_string()),
    }
}

/// A request field that is invalid: `field: why`.
pub fn invalid(field: &str, why: &str) -> Status {
    refuse(Code::InvalidArgument, Reason::InvalidField, field, format!("{field}: {why}"))
}

/// A second execution with the id of one running here.
pub fn id_in_use() -> Status {
    invalid("execution_id", "another execution of this id runs here")
}

impl Refuses for ExecError {
    fn class(&self) -> Class<'_> {
        match self {
            ExecError::Invalid(s) => s.class(),
            ExecError::LanguageUnavailable(_) => Class::new(Code::InvalidArgument, Reason::LanguageUnavailable, "language"),
            ExecError::MissingFeature(_) => Class::new(Code::FailedPrecondition, Reason::MissingFeature, ""),
            ExecError::Busy(_) | ExecError::Sandbox(SandboxError::NoSlot) => Class::new(Code::ResourceExhausted, Reason::NodeBusy, ""),
            ExecError::Sandbox(_) => Class::private(Code::Internal, Reason::SandboxSetup, "sandbox setup failed on this node"),
            ExecError::ThreadBusy => Class::new(Code::Aborted, Reason::ThreadBusy, ""),
            ExecError::ImageReference(_) => Class::new(Code::InvalidArgument, Reason::InvalidField, "image"),
            ExecError::ImagePulling(_) => Class::new(Code::Unavailable, Reason::ImagePulling, "image"),
            ExecError::Image(_) => Class::new(Code::FailedPrecondition, Reason::Image, "image"),
            // A tenant's image named the node itself: refused, naming the field.
            ExecError::ImageRefused(_) => Class::new(Code::PermissionDenied, Reason::InvalidField, "image"),
            ExecError::ImagesDisabled => Class::new(Code::FailedPrecondition, Reason::Unsupported, "image"),
            ExecError::NetworkUnavailable => Class::new(Code::FailedPrecondition, Reason::Unsupported, "network"),
            // A tenant's manifest asked for a host path: refused, naming it.
            ExecError::MountRefused { field, .. } => Class::new(Code::PermissionDenied, Reason::InvalidField, field),
            ExecError::NotStarted(crate::sandbox::Failure::ThreadLimit) => Class::new(Code::FailedPrecondition, Reason::ThreadStore, "thread"),
            ExecError::NotStarted(_) => Class::private(Code::Internal, Reason::SandboxSetup, "the live sandbox's home, mounts or connectors could not be set up"),
            ExecError::LiveExists => Class::new(Code::AlreadyExists, Reason::InvalidField, "live"),
        }
    }
}

impl Refuses for crate::live::LiveError {
    fn class(&self) -> Class<'_> {
        use crate::live::LiveError as L;
        match self {
            L::NotFound | L::Gone => Class::new(Code::NotFound, Reason::LiveNotFound, ""),
            L::NoProcess(_) => Class::new(Code::NotFound, Reason::LiveNotFound, "pid"),
            L::NoListener(_) => Class::new(Code::FailedPrecondition, Reason::InvalidField, "port"),
            L::Exists => Class::new(Code::AlreadyExists, Reason::InvalidField, "live"),
            L::TooManyProcesses => Class::new(Code::ResourceExhausted, Reason::NodeBusy, ""),
            L::Invalid { field, .. } => Class::new(Code::InvalidArgument, Reason::InvalidField, field),
            L::StartFailed(_) => Class::new(Code::FailedPrecondition, Reason::InvalidField, "cmd"),
            L::NoStdin | L::NotATerminal => Class::new(Code::FailedPrecondition, Reason::InvalidField, "input"),
            L::InputStalled => Class::new(Code::ResourceExhausted, Reason::InvalidField, "input"),
            L::Io(_) => Class::private(Code::Internal, Reason::SandboxSetup, "the process's stdio could not be set up"),
        }
    }
}

impl Refuses for ThreadError {
    fn class(&self) -> Class<'_> {
        match self {
            ThreadError::Busy | ThreadError::Conflict => Class::new(Code::Aborted, Reason::ThreadBusy, ""),
            ThreadError::NotFound => Class::new(Code::NotFound, Reason::ThreadNotFound, ""),
            ThreadError::VersionNotFound => Class::new(Code::NotFound, Reason::ThreadNotFound, "at"),
            ThreadError::Exists => Class::new(Code::AlreadyExists, Reason::ThreadBusy, "thread_id"),
            ThreadError::TooLarge { .. } => Class::new(Code::ResourceExhausted, Reason::ThreadStore, ""),
            ThreadError::Limit { .. } => Class::new(Code::FailedPrecondition, Reason::ThreadStore, ""),
            ThreadError::Io { .. } | ThreadError::DiskLow { .. } => Class::private(Code::Unavailable, Reason::ThreadStore, "the thread store failed; retry shortly"),
        }
    }
}

impl Refuses for SpecError {
    fn class(&self) -> Class<'_> {
        Class::new(Code::InvalidArgument, Reason::InvalidField, &self.field)
    }
}

/// Malformed, or a part of the contract this agent does not offer (never
/// silently dropped).
impl Refuses for WireError {
    fn class(&self) -> Class<'_> {
        match self {
            WireError::Invalid(e) => e.class(),
            WireError::Unsupported(e) => Class::new(Code::FailedPrecondition, Reason::Unsupported, &e.field),
        }
    }
}

impl Refuses for KeySlotError {
    fn class(&self) -> Class<'_> {
        match self {
            KeySlotError::Key => Class::new(Code::InvalidArgument, Reason::InvalidField, "key"),
            KeySlotError::Limit => Class::new(Code::InvalidArgument, Reason::InvalidField, "limit"),
            KeySlotError::AtLimit(_) => Class::new(Code::ResourceExhausted, Reason::KeyConcurrency, ""),
            KeySlotError::Full => Class::new(Code::ResourceExhausted, Reason::NodeBusy, ""),
        }
    }
}

impl Refuses for FilesError {
    fn class(&self) -> Class<'_> {
        match self {
            FilesError::Invalid(_) => Class::new(Code::InvalidArgument, Reason::InvalidField, "path"),
            FilesError::NotFound => Class::new(Code::NotFound, Reason::ThreadNotFound, "path"),
            FilesError::Size { .. } => Class::new(Code::InvalidArgument, Reason::InvalidField, "size"),
            FilesError::Thread(t) => t.class(),
            FilesError::Store(_) => Class::private(Code::Unavailable, Reason::ThreadStore, "the store failed; retry shortly"),
        }
    }
}

#[cfg(test)]
mod tests {
    use warren_proto::refusal::refusal_of;

    use super::*;

    fn read(s: Status) -> (Code, Reason, String, String) {
        let (reason, field) = refusal_of(&s);
        (s.code(), reason, field, s.message().to_string())
    }

    #[test]
    fn execution_refusals_follow_the_contract() {
        let invalid = ExecError::Invalid(warren_isolation::spec::SpecError { field: "limits.pids".into(), message: "too many".into() });
        assert_eq!(read(status(&invalid)), (Code::InvalidArgument, Reason::InvalidField, "limits.pids".into(), "limits.pids: too many".into()));
        assert_eq!(read(status(&ExecError::Busy(4))).0, Code::ResourceExhausted);
        assert_eq!(read(status(&ExecError::Busy(4))).1, Reason::NodeBusy);
        assert_eq!(read(status(&ExecError::ThreadBusy)).0, Code::Aborted);
        let missing = read(status(&ExecError::MissingFeature("seccomp".into())));
        assert_eq!((missing.0, missing.1), (Code::FailedPrecondition, Reason::MissingFeature));
        assert!(missing.3.contains("seccomp"));
        let mount = read(status(&ExecError::MountRefused { field: "mounts[0].path".into(), why: "outside the allowed roots".into() }));
        assert_eq!((mount.0, mount.1, mount.2.as_str()), (Code::PermissionDenied, Reason::InvalidField, "mounts[0].path"));
    }

    #[test]
    fn internals_stay_in_the_log() {
        let setup = ExecError::Sandbox(SandboxError::Timeout);
        assert_eq!(read(status(&setup)), (Code::Internal, Reason::SandboxSetup, String::new(), "sandbox setup failed on this node".into()));
        let store = FilesError::Store("s3://bucket/secret-path: 403".into());
        let (code, reason, _, message) = read(status(&store));
        assert_eq!((code, reason), (Code::Unavailable, Reason::ThreadStore));
        assert!(!message.contains("secret-path"), "{message}");
        let disk = ThreadError::DiskLow { needed: 10, free: 1, reserve: 5 };
        assert!(!read(status(&disk)).3.contains("reserved"));
    }

    #[test]
    fn thread_and_file_refusals_keep_their_codes() {
        assert_eq!(read(status(&ThreadError::NotFound)).0, Code::NotFound);
        assert_eq!(read(status(&ThreadError::NotFound)).1, Reason::ThreadNotFound);
        assert_eq!(read(status(&ThreadError::Conflict)).1, Reason::ThreadBusy);
        assert_eq!(read(status(&FilesError::NotFound)).0, Code::NotFound);
        assert_eq!(read(status(&FilesError::Invalid("a path of plain names"))), (Code::InvalidArgument, Reason::InvalidField, "path".into(), "a path of plain names".into()));
        assert_eq!(read(status(&FilesError::Size { want: 2, got: 1 })).0, Code::InvalidArgument);
        assert_eq!(read(status(&KeySlotError::AtLimit(3))).1, Reason::KeyConcurrency);
        assert_eq!(read(status(&KeySlotError::Full)).1, Reason::NodeBusy);
    }
}
