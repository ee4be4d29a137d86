//! Code that runs inside `warren-sandbox`: the spawner the node-agent
//! starts, and the per-sandbox supervisor it forks ahead of demand. Process
//! tree, per sandbox:
//!
//! ```text
//! node-agent (tokio, host)
//!  └─ warren-sandbox spawner      host namespaces, root; forks a supervisor per sandbox (`crate::launch`)
//!      └─ supervisor              writes id maps, joins cgroups, kills on demand
//!          └─ init (pid 1)        new user/pid/mount/net/ipc/uts/cgroup namespaces, uid 0 inside
//!              │                  (an unprivileged host uid), non-dumpable, reaps orphans
//!              └─ program         uid 1000 inside, no capabilities, no_new_privs, seccomp, rlimits
//! ```
//!
//! Everything up to "init waits for Go" happens before a request arrives, so
//! the request path costs a few cgroup writes, one message, one fork and the
//! exec. Killing init kills the whole pid namespace, which is how timeouts,
//! cancellation and "processes that outlive the main one" are handled.

mod environ;
mod init;
pub mod live;
mod program;
pub mod rootfs;
mod spawner;
mod stub;
mod supervisor;
pub mod sys;
pub mod views;
mod warm;

pub use environ::available as warm_environ_available;
pub use spawner::spawner_main;
