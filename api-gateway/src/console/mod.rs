//! The admin console (issue #29), built in pieces that stand on their own:
//! so far the sign-in's token rules ([`oidc`]), pure and unit-tested. No
//! route serves the console yet.

pub mod oidc;
