//! The execution path of the gateway, independent of HTTP.
//!
//! ```text
//! adapter (HTTP JSON, NDJSON, later async/MCP)
//!    └─ ExecutionService::admit   key + request → ExecutionSpec, slots, lease
//!         (the key's slot is counted on an agent: `keyslot`)
//!    └─ ExecutionService::start   spec → agent (wire form in `convert`)
//!    └─ Run::next                 wire events → RunEvent
//! errors: ExecError → HTTP status in `crate::error` (one place)
//! ```

pub mod convert;
pub mod keyslot;
pub mod live;
pub mod output;
pub mod refusal;
pub mod request;
pub mod service;
pub mod spec;
pub mod versions;

pub use convert::RunEvent;
pub use warren_core::exit::{Exit, Failure};
pub use crate::exec_error::ExecError;
pub use crate::nodes::agent;
pub use request::ExecuteRequest;
pub use service::{Admitted, ExecutionService, Lost, Run};
pub use spec::{Delivery, ExecutionSpec};

/// `trc_` + 20 random base62 characters.
pub fn new_trace_id() -> String {
    warren_core::ids::trace_id(&mut |b: &mut [u8]| rand::fill(b))
}
