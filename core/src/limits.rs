//! Resolved per-execution resource limits: the one type the manifest
//! compiler publishes, the gateway sends and the sandbox enforces.

use serde::{Deserialize, Serialize};

use crate::bounds::{self, Bound};

/// Resource limits of one execution, every field set.
///
/// Serialized in camelCase (it is part of the published key configuration);
/// fields added after the first release default to their bounds' default so
/// older publications still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// CPU quota in thousandths of a core.
    pub cpu_millis: u32,
    /// Memory limit in bytes (RAM; swap is off).
    pub memory_bytes: u64,
    /// Most tasks (processes and threads).
    pub pids: u32,
    /// Size of `/tmp`.
    pub tmp_bytes: u64,
    /// Size of the home directory; with a thread, the most one call may write.
    pub home_bytes: u64,
    /// Per-stream output cap; output beyond it is drained and dropped.
    pub max_output_bytes: u64,
    /// `RLIMIT_NOFILE`.
    #[serde(default = "default_open_files")]
    pub open_files: u32,
    /// `RLIMIT_FSIZE`: the largest file the program may write.
    #[serde(default = "default_file_size")]
    pub file_size_bytes: u64,
}

fn default_open_files() -> u32 {
    bounds::OPEN_FILES.default
}

fn default_file_size() -> u64 {
    bounds::FILE_SIZE_BYTES.default
}

impl Limits {
    /// Limits made of one end of every shared bound (`|b| b.max` gives the
    /// largest limits any layer accepts).
    pub fn from_bounds(pick: impl Fn(Bound<u64>) -> u64) -> Limits {
        let wide = |b: Bound<u32>| Bound { min: u64::from(b.min), max: u64::from(b.max), default: u64::from(b.default) };
        // The u32 bounds were widened, so narrowing back cannot truncate.
        let narrow = |b: Bound<u32>| pick(wide(b)) as u32;
        Limits {
            cpu_millis: narrow(bounds::CPU_MILLIS),
            memory_bytes: pick(bounds::MEMORY_BYTES),
            pids: narrow(bounds::PIDS),
            tmp_bytes: pick(bounds::DISK_BYTES),
            home_bytes: pick(bounds::DISK_BYTES),
            max_output_bytes: pick(bounds::OUTPUT_BYTES),
            open_files: narrow(bounds::OPEN_FILES),
            file_size_bytes: pick(bounds::FILE_SIZE_BYTES),
        }
    }
}

impl Default for Limits {
    /// The defaults of the shared bounds.
    fn default() -> Self {
        Limits::from_bounds(|b| b.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publications_without_the_later_fields_still_read() {
        let old = r#"{"cpuMillis":1000,"memoryBytes":1,"pids":8,"tmpBytes":1,"homeBytes":1,"maxOutputBytes":1024}"#;
        let l: Limits = serde_json::from_str(old).unwrap();
        assert_eq!((l.open_files, l.file_size_bytes), (bounds::OPEN_FILES.default, bounds::FILE_SIZE_BYTES.default));
    }

    #[test]
    fn from_bounds_picks_one_end_of_each() {
        let max = Limits::from_bounds(|b| b.max);
        assert_eq!((max.pids, max.cpu_millis, max.memory_bytes), (bounds::PIDS.max, bounds::CPU_MILLIS.max, bounds::MEMORY_BYTES.max));
        assert_eq!(Limits::default().open_files, bounds::OPEN_FILES.default);
    }
}
