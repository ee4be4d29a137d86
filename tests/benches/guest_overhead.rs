//! `agent_overhead` inside the cgroup-v2 guest (Debian 12, kernel 6.1, only
//! cgroup2; tests/src/guest.rs), right after the same benchmark on the host.
//! The guest runs under emulation, so its absolute times are not a node's:
//! what compares is each side's ratio to a bare process in the same place.
//!
//! `cargo bench --profile dev -p warren-e2e --bench agent_overhead --bench guest_overhead`
//! (cargo runs them back to back; WARREN_BENCH_RUNS sets both, default 200
//! on the host and 30 in the guest; WARREN_GUEST_KERNEL=5.10 for the other kernel).

use std::path::PathBuf;

use warren_e2e::{guest, is_root};

/// The `agent_overhead` bench binary cargo built beside this one (newest first).
fn agent_overhead_binary() -> Option<PathBuf> {
    let deps = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&deps)
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("agent_overhead-") && !name.contains('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

fn main() {
    if !is_root() {
        eprintln!("SKIPPED guest_overhead: needs root");
        return;
    }
    let Some(bench) = agent_overhead_binary() else {
        eprintln!("SKIPPED guest_overhead: build it with --bench agent_overhead --bench guest_overhead");
        return;
    };
    let runs: usize = std::env::var("WARREN_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let kernel = std::env::var("WARREN_GUEST_KERNEL").unwrap_or_else(|_| "6.1".into());
    let dir = tempfile::tempdir().unwrap();
    let payload = guest::payload(dir.path(), &[(bench, "agent_overhead")]);
    let text = guest::boot(&guest::image(), &kernel, &payload, &dir.path().join("console.log"), &format!("warren.bench=agent_overhead warren.runs={runs}"));
    println!("agent overhead inside the cgroup-v2 guest (kernel {kernel}, emulated: compare ratios, not times)");
    for line in text.lines().filter_map(|l| l.trim_end_matches('\r').strip_prefix("WARREN-BENCH ")) {
        println!("{line}");
    }
}
