//! Warren's isolation layer: everything that touches the kernel to run one
//! piece of untrusted code.
//!
//! - [`spec`]: the validated execution spec (pure).
//! - [`cgroup`]: per-execution cgroups, v1 and v2 (translation is pure).
//! - [`seccomp`]: the syscall allowlist, compiled once to BPF.
//! - [`features`]: what this node supports.
//! - [`home`]: a thread's home, mounted on the host side (overlay over id-mapped saved state).
//! - [`probe`]: whether this kernel can mount thread homes, asked once at start.
//! - [`wire`]: agent ↔ supervisor/init messages.
//! - [`launch`]: starting supervisors (the agent's side of the spawner) and their descriptors.
//! - [`sandbox`]: the spawner, supervisor, init and program code run by `warren-sandbox`.

pub mod cgroup;
pub mod features;
pub mod home;
pub mod launch;
pub mod probe;
pub mod proc_mount;
pub mod sandbox;
pub mod seccomp;
pub mod spec;
pub mod wire;
