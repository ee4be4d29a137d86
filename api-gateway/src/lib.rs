//! Warren's HTTP API gateway. The execute API is built on the node-agent's
//! `warren.agent.v1.NodeAgent/Execute` contract; this crate is the home of that
//! work (not yet implemented).
#![forbid(unsafe_code)]
