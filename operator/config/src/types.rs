//! The custom resources, from `warren-api` (kept here so compiler paths stay short).

pub use warren_api::*;
