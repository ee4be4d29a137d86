//! Filesystem errors, each with the errno the program sees.

/// Why a filesystem operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// No such entry.
    #[error("no such file or directory")]
    NotFound,
    /// A file was used as a directory.
    #[error("not a directory")]
    NotDir,
    /// A directory was used as a file.
    #[error("is a directory")]
    IsDir,
    /// A name no object key can hold (empty, `.`, `..`, `/`, control
    /// characters, backslash, longer than 255 bytes, not UTF-8).
    #[error("invalid name")]
    InvalidName,
    /// The tree holds its maximum number of entries.
    #[error("too many entries")]
    TooMany,
    /// A change on a read-only mount.
    #[error("read-only mount")]
    ReadOnly,
    /// The call's write limit is used up.
    #[error("the mount's write limit is used up")]
    NoSpace,
    /// A directory that is not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// The name exists.
    #[error("file exists")]
    Exists,
    /// An operation this mount does not offer (the text says which).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// The store failed; the text is for the agent's log only.
    #[error("storage: {0}")]
    Io(String),
}

impl From<warren_objects::name::InvalidName> for FsError {
    fn from(_: warren_objects::name::InvalidName) -> Self {
        FsError::InvalidName
    }
}

impl FsError {
    /// The errno a program sees.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::InvalidName => libc::EINVAL,
            FsError::TooMany => libc::ENFILE,
            FsError::ReadOnly => libc::EROFS,
            FsError::NoSpace => libc::ENOSPC,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Exists => libc::EEXIST,
            // EXDEV makes `mv` and friends fall back to copy and delete.
            FsError::Unsupported(_) => libc::EXDEV,
            FsError::Io(_) => libc::EIO,
        }
    }
}

impl From<object_store::Error> for FsError {
    fn from(e: object_store::Error) -> FsError {
        match e {
            object_store::Error::NotFound { .. } => FsError::NotFound,
            // Credentials and endpoints can appear in a store's error text:
            // keep only its kind for the log.
            other => {
                tracing::debug!(error = %other, "store request failed");
                FsError::Io(kind_of(&other).to_string())
            }
        }
    }
}

fn kind_of(e: &object_store::Error) -> &'static str {
    match e {
        object_store::Error::Generic { .. } => "backend error",
        object_store::Error::Precondition { .. } => "the object changed",
        object_store::Error::NotModified { .. } => "not modified",
        object_store::Error::PermissionDenied { .. } => "permission denied",
        object_store::Error::Unauthenticated { .. } => "credentials refused",
        _ => "store error",
    }
}

/// Runs `f` until `deadline` (if any); past it, an I/O error.
pub async fn by_deadline<T>(deadline: Option<std::time::Instant>, f: impl std::future::Future<Output = Result<T, FsError>>) -> Result<T, FsError> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), f).await.unwrap_or_else(|_| Err(FsError::Io("the store did not answer before the call's deadline".into()))),
        None => f.await,
    }
}
