//! Shared bearer-token check for the agent's gRPC endpoints.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Checks `authorization: Bearer <token>` in constant time (for equal lengths).
#[derive(Clone)]
pub struct BearerAuth {
    expected: Option<Arc<Vec<u8>>>,
    warm: Option<Arc<Vec<u8>>>,
}

/// Who a call comes from, as the interceptor decided (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The gateways' token (or the Unix socket): every call.
    Full,
    /// The warming token (the operator's): `WarmImage` and `Status` only.
    WarmOnly,
}

impl BearerAuth {
    /// `None` accepts every caller (Unix socket only, protected by file mode).
    pub fn new(token: Option<String>) -> BearerAuth {
        BearerAuth { expected: token.map(|t| Arc::new(format!("Bearer {t}").into_bytes())), warm: None }
    }

    /// Also accepts `token` for warming images and reading status only.
    pub fn with_warm_token(mut self, token: Option<String>) -> BearerAuth {
        self.warm = token.map(|t| Arc::new(format!("Bearer {t}").into_bytes()));
        self
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            req.extensions_mut().insert(Caller::Full);
            return Ok(req);
        };
        let given = req.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        let full = bool::from(given.ct_eq(expected.as_slice()));
        let warm = self.warm.as_ref().is_some_and(|w| bool::from(given.ct_eq(w.as_slice())));
        let caller = match (full, warm) {
            (true, _) => Caller::Full,
            (false, true) => Caller::WarmOnly,
            (false, false) => return Err(Status::unauthenticated("missing or invalid bearer token")),
        };
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

/// Refuses a call the caller's credential does not cover: everything but
/// warming and status needs the gateways' token.
pub fn require_full<T>(req: &Request<T>) -> Result<(), Status> {
    match req.extensions().get::<Caller>() {
        Some(Caller::Full) => Ok(()),
        _ => Err(Status::permission_denied("this credential may only warm images and read status")),
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

    #[test]
    fn the_warm_token_covers_warming_and_status_only() {
        let mut auth = BearerAuth::new(Some("full-token".into())).with_warm_token(Some("warm-token".into()));
        let full = auth.call(with_header(Some("Bearer full-token"))).unwrap();
        assert!(require_full(&full).is_ok());
        let warm = auth.call(with_header(Some("Bearer warm-token"))).unwrap();
        assert_eq!(require_full(&warm).unwrap_err().code(), tonic::Code::PermissionDenied);
        assert!(auth.call(with_header(Some("Bearer warm-tokeX"))).is_err());
        assert!(require_full(&Request::new(())).is_err(), "no decision is no permission");
    }
}
