//! Warren's Kubernetes operator (CRDs and reconcilers); not yet implemented.
#![forbid(unsafe_code)]
