//! Every bound a request, a manifest and a node-agent must agree on, defined
//! once. The gateway validates requests with them, the manifest compiler
//! validates Sandboxes and ApiKeys with them, and the node-agent refuses
//! anything outside them (defence in depth: it is reachable over gRPC).

/// An inclusive range with the value used when nothing is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound<T> {
    /// Smallest accepted value.
    pub min: T,
    /// Largest accepted value.
    pub max: T,
    /// Value used when unset.
    pub default: T,
}

impl<T: PartialOrd + Copy> Bound<T> {
    /// True when `v` lies within the range.
    pub fn contains(&self, v: T) -> bool {
        self.min <= v && v <= self.max
    }
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Largest program text, in bytes (1 MiB of UTF-8).
pub const MAX_CODE_BYTES: usize = MIB as usize;
/// Wall-clock timeout of one execution, seconds.
pub const TIMEOUT_SECS: Bound<u32> = Bound { min: 1, max: 3600, default: 60 };
/// CPU quota in thousandths of a core.
pub const CPU_MILLIS: Bound<u32> = Bound { min: 500, max: 4000, default: 1000 };
/// Memory limit (RAM, swap off). Manifests scale the default with CPU.
pub const MEMORY_BYTES: Bound<u64> = Bound { min: 32 * MIB, max: 4 * GIB, default: GIB };
/// Most tasks (processes and threads) of one execution.
pub const PIDS: Bound<u32> = Bound { min: 8, max: 4096, default: 256 };
/// Size of `/tmp` and of the home directory.
pub const DISK_BYTES: Bound<u64> = Bound { min: MIB, max: 4 * GIB, default: 512 * MIB };
/// Per-stream output cap.
pub const OUTPUT_BYTES: Bound<u64> = Bound { min: KIB, max: 64 * MIB, default: MIB };
/// What one call may write to one storage mount.
pub const STORAGE_WRITE_BYTES: Bound<u64> = Bound { min: MIB, max: 64 * GIB, default: GIB };
/// `RLIMIT_NOFILE`.
pub const OPEN_FILES: Bound<u32> = Bound { min: 32, max: 65536, default: 1024 };
/// `RLIMIT_FSIZE`: the largest file the program may write.
pub const FILE_SIZE_BYTES: Bound<u64> = Bound { min: MIB, max: 4 * GIB, default: 512 * MIB };
/// Largest saved home of one thread (file sizes + 512 bytes per entry).
pub const THREAD_BYTES: Bound<u64> = Bound { min: MIB, max: 100 * GIB, default: GIB };
/// Versions a thread's history keeps (restore and fork targets).
pub const THREAD_HISTORY: Bound<u32> = Bound { min: 1, max: 1000, default: 50 };
/// Executions one API key may run at once.
pub const CONCURRENCY: Bound<u32> = Bound { min: 1, max: 1024, default: 10 };
/// Live threads one API key keeps.
pub const THREADS: Bound<u32> = Bound { min: 1, max: 100_000, default: 1000 };
/// Live sandboxes (running, not paused) one API key holds at once.
pub const LIVE_SANDBOXES: Bound<u32> = Bound { min: 1, max: 10_000, default: 100 };
/// Longest life a live sandbox may be given, seconds (from now, each time).
pub const LIVE_SECONDS: Bound<u32> = Bound { min: 60, max: 86_400, default: 86_400 };
/// Idle seconds before a live sandbox is paused, when a key sets it (0: never).
pub const LIVE_IDLE_SECONDS: Bound<u32> = Bound { min: 30, max: 86_400, default: 0 };

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_lie_within_their_bounds() {
        assert!(TIMEOUT_SECS.contains(TIMEOUT_SECS.default));
        assert!(CPU_MILLIS.contains(CPU_MILLIS.default));
        assert!(MEMORY_BYTES.contains(MEMORY_BYTES.default));
        assert!(PIDS.contains(PIDS.default));
        assert!(DISK_BYTES.contains(DISK_BYTES.default));
        assert!(OUTPUT_BYTES.contains(OUTPUT_BYTES.default));
        assert!(OPEN_FILES.contains(OPEN_FILES.default));
        assert!(FILE_SIZE_BYTES.contains(FILE_SIZE_BYTES.default));
        assert!(THREAD_BYTES.contains(THREAD_BYTES.default));
        assert!(THREAD_HISTORY.contains(THREAD_HISTORY.default));
        assert!(CONCURRENCY.contains(CONCURRENCY.default));
        assert!(THREADS.contains(THREADS.default));
        assert!(!PIDS.contains(7) && !PIDS.contains(4097));
    }
}
