//! Shared bearer-token check for the agent's gRPC endpoints.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Checks `authorization: Bearer <token>` in constant time (for equal lengths).
#[derive(Clone)]
pub struct BearerAuth {
    expected: Option<Arc<Vec<u8>>>,
}

impl BearerAuth {
    /// `None` accepts every caller (Unix socket only, protected by file mode).
    pub fn new(token: Option<String>) -> BearerAuth {
        BearerAuth { expected: token.map(|t| Arc::new(format!("Bearer {t}").into_bytes())) }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else { return Ok(req) };
        let given = req.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        if bool::from(given.ct_eq(expected.as_slice())) {
            Ok(req)
        } else {
            Err(Status::unauthenticated("missing or invalid bearer token"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(v: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = v {
            r.metadata_mut().insert("authorization", v.parse().unwrap());
        }
        r
    }

    #[test]
    fn token_is_required_when_configured() {
        let mut auth = BearerAuth::new(Some("s3cret".into()));
        assert!(auth.call(with_header(Some("Bearer s3cret"))).is_ok());
        assert!(auth.call(with_header(Some("Bearer s3cre"))).is_err());
        assert!(auth.call(with_header(Some("s3cret"))).is_err());
        assert!(auth.call(with_header(None)).is_err());
        let mut open = BearerAuth::new(None);
        assert!(open.call(with_header(None)).is_ok());
    }
}
