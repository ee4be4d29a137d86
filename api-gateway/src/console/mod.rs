//! The admin console (issue #29), built in pieces that stand on their own:
//!
//! - [`access`]: what a user may see and do, asked of the cluster's RBAC
//!   (SubjectAccessReview);
//! - [`app`]: the console's routes on their own listener (sign-in, sign-out,
//!   assets, pages behind a session);
//! - `frame`: the console's state and what every page shares (the
//!   request's session, page and redirect helpers, the CSRF check);
//! - [`objects`]: Warren's kinds as the API server holds them (Ready,
//!   the manifest for Git, events), in a cluster;
//! - [`oidc`]: the sign-in's rules (PKCE, ID-token checks);
//! - `playground`: run code with a key the user may `use`, recorded as
//!   delivery `console` with the user;
//! - [`provider`]: the identity provider over HTTP (discovery, keys, the
//!   authorization request, the code exchange), bounded;
//! - [`session`]: sign-ins under way (single-use state bound to the
//!   browser, bounded per client), sessions, CSRF tokens, cookies, return
//!   paths that stay inside the console;
//! - `signin`: the sign-in's routes (start, callback, the local link);
//! - `terminal`: a shell in a live sandbox of a key the user may `use`,
//!   in the page (xterm.js) over the console's own WebSocket;
//! - `files`: a key's threads and managed volumes (list, download,
//!   delete a thread), through the Files API's node calls;
//! - [`html`]: pages escaped by construction, and the security headers;
//! - [`link`]: single-machine sign-in, the local admin's one-time link;
//! - `pages`: the pages behind a session, scoped to the namespaces the
//!   user may see;
//! - [`query`]: the audit log's filters, parsed strictly (pure);
//! - `writes`: the few changes a team clicks in an emergency (disable or
//!   enable a key), each needing its RBAC verb and audited with the user;
//! - [`views`]: records, nodes, keys and Sandboxes as pages (hostile data
//!   rendered inert).

pub mod access;
pub mod app;
mod frame;
mod body;
pub mod client;
mod files;
mod history;
pub mod html;
pub mod link;
pub mod objects;
pub mod oidc;
mod pages;
mod playground;
pub mod provider;
pub mod query;
pub mod session;
mod signin;
mod terminal;
pub mod views;
mod writes;
