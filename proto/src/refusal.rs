//! Structured refusals: every non-OK status of the agent carries a
//! [`Refusal`] in its details, so the reason and the offending field travel
//! as data and the gateway never parses a message.

use prost::Message;
use tonic::{Code, Status};

use crate::agent::{Refusal, RefusalReason};

/// A status whose details say why.
pub fn refuse(code: Code, reason: RefusalReason, field: &str, message: impl Into<String>) -> Status {
    let details = Refusal { reason: reason as i32, field: field.to_string() }.encode_to_vec();
    Status::with_details(code, message, details.into())
}

/// The refusal a status carries; `Unspecified` with no field when it has
/// none (a transport error, or an agent of another version).
pub fn refusal_of(status: &Status) -> (RefusalReason, String) {
    match Refusal::decode(status.details()) {
        Ok(r) => (RefusalReason::try_from(r.reason).unwrap_or(RefusalReason::Unspecified), r.field),
        Err(_) => (RefusalReason::Unspecified, String::new()),
    }
}

impl std::fmt::Debug for crate::agent::Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials(<{} redacted values>)", self.values.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Credentials;

    #[test]
    fn a_refusal_survives_the_status_round_trip() {
        let s = refuse(Code::InvalidArgument, RefusalReason::InvalidField, "limits.pids", "limits.pids: too many");
        let mut headers = tonic::metadata::MetadataMap::new().into_headers();
        s.add_header(&mut headers).unwrap();
        let back = Status::from_header_map(&headers).unwrap();
        assert_eq!(refusal_of(&back), (RefusalReason::InvalidField, "limits.pids".to_string()));
        assert_eq!(refusal_of(&Status::unavailable("down")), (RefusalReason::Unspecified, String::new()));
    }

    #[test]
    fn credentials_never_print() {
        let c = Credentials { values: [("secret_access_key".to_string(), "hunter2".to_string())].into() };
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2") && shown.contains("redacted"), "{shown}");
    }
}
