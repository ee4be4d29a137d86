//! The `reason` values of the `Ready` condition, one bounded set per kind.
//! Status writers use these constants; users match on the strings.

/// Sandbox: the spec is valid and every node can run it.
pub const VALID: &str = "Valid";
/// Sandbox: the spec breaks a rule (field-level message).
pub const INVALID_SPEC: &str = "InvalidSpec";
/// Sandbox: valid, but asks for something this release does not offer.
pub const UNSUPPORTED: &str = "Unsupported";
/// Sandbox: no node could pull the image (or its pull secret is unusable).
pub const IMAGE_PULL_FAILED: &str = "ImagePullFailed";
/// Sandbox: `spec.languages` names a language the image does not have.
pub const LANGUAGE_UNAVAILABLE: &str = "LanguageUnavailable";

/// ApiKey: compiled and published for the gateways.
pub const PUBLISHED: &str = "Published";
/// ApiKey: published, but `spec.disabled` is set (requests get 403).
pub const DISABLED: &str = "Disabled";
/// ApiKey: `spec.sandboxRef` names no valid Sandbox.
pub const SANDBOX_NOT_FOUND: &str = "SandboxNotFound";
/// ApiKey: the Sandbox's image is not warm on any node yet (or its pull
/// secret is unusable).
pub const SANDBOX_NOT_READY: &str = "SandboxNotReady";
/// ApiKey: the key's Secret is missing or its entry is malformed.
pub const SECRET_INVALID: &str = "SecretInvalid";
/// ApiKey: the Secret is already used by an older ApiKey, which keeps it.
pub const SECRET_IN_USE: &str = "SecretInUse";
/// ApiKey: a field would widen the Sandbox.
pub const INVALID_NARROWING: &str = "InvalidNarrowing";
/// ApiKey: the key would get more than its namespace's `warren.dev/max-*`
/// annotations allow, or one of them is malformed.
pub const CEILING_EXCEEDED: &str = "CeilingExceeded";

/// StorageConnection, Connector: the credentials Secret is missing.
pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
/// StorageConnection, Connector, ApiKey, Sandbox: the named Secret is not
/// marked `warren.dev/consumable: "true"`, or its namespace is not a tenant
/// namespace (the operator reads no Secret there).
pub const SECRET_NOT_CONSUMABLE: &str = "SecretNotConsumable";
/// StorageConnection, Connector: the Secret lacks required entries.
pub const SECRET_INCOMPLETE: &str = "SecretIncomplete";
/// StorageConnection: a listing of its prefix succeeded.
pub const REACHABLE: &str = "Reachable";
/// StorageConnection: the bucket (container) does not exist.
pub const BUCKET_NOT_FOUND: &str = "BucketNotFound";
/// StorageConnection: the store refused the credentials.
pub const CREDENTIALS_REFUSED: &str = "CredentialsRefused";
/// StorageConnection: the store did not answer a listing in time.
pub const STORE_UNREACHABLE: &str = "StoreUnreachable";
