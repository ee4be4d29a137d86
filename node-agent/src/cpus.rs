//! Which of the node's CPUs a sandbox's program runs on: `ceil(cpu limit)`
//! of those the agent itself may use, so the CPU count a program reads to
//! size itself is its own (see `warren_isolation::sandbox::views`). The
//! CPU quota stays the limit; the affinity only tells the size. Sandboxes
//! take their CPUs in turn, so they spread over the node.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The agent's CPUs, handed out in turn.
#[derive(Debug)]
pub struct Cpus {
    allowed: Vec<u32>,
    next: AtomicUsize,
}

impl Cpus {
    /// The CPUs this process may run on (its affinity: a container's cpuset).
    pub fn of_this_process() -> Cpus {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .map(|set| (0..nix::sched::CpuSet::count() as u32).filter(|c| set.is_set(*c as usize).unwrap_or(false)).collect())
            .unwrap_or_default();
        Cpus::new(allowed)
    }

    /// Hands out `allowed` (none known: CPU 0).
    pub fn new(allowed: Vec<u32>) -> Cpus {
        let allowed = if allowed.is_empty() { vec![0] } else { allowed };
        Cpus { allowed, next: AtomicUsize::new(0) }
    }

    /// How many CPUs a limit of `cpu_millis` is: rounded up, at least one,
    /// at most the agent's.
    pub fn count(&self, cpu_millis: u32) -> usize {
        (cpu_millis.div_ceil(1000) as usize).clamp(1, self.allowed.len())
    }

    /// The next `count(cpu_millis)` CPUs in turn (all of them when the
    /// limit covers them all).
    pub fn take(&self, cpu_millis: u32) -> Vec<u32> {
        let n = self.count(cpu_millis);
        if n == self.allowed.len() {
            return self.allowed.clone();
        }
        let start = self.next.fetch_add(n, Ordering::Relaxed);
        let mut cpus: Vec<u32> = (0..n).map(|i| self.allowed[(start + i) % self.allowed.len()]).collect();
        cpus.sort_unstable();
        cpus
    }

    /// Whether `cpus` is what a limit of `cpu_millis` asks for (a pooled
    /// sandbox built for other limits gets new CPUs at its call).
    pub fn fits(&self, cpus: &[u32], cpu_millis: u32) -> bool {
        cpus.len() == self.count(cpu_millis) && cpus.iter().all(|c| self.allowed.contains(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_its_rounded_up_count_of_cpus_handed_out_in_turn() {
        let cpus = Cpus::new(vec![0, 1, 2, 3]);
        assert_eq!((cpus.count(500), cpus.count(1000), cpus.count(1001), cpus.count(64_000)), (1, 1, 2, 4));
        assert_eq!(cpus.take(1000), [0]);
        assert_eq!(cpus.take(1000), [1]);
        assert_eq!(cpus.take(2000), [2, 3]);
        assert_eq!(cpus.take(2000), [0, 1], "wraps around");
        assert_eq!(cpus.take(8000), [0, 1, 2, 3], "a limit over the node's CPUs gets them all");
        assert!(cpus.fits(&[3], 700) && !cpus.fits(&[3], 1500) && !cpus.fits(&[9], 1000));
        let restricted = Cpus::new(vec![4, 6]);
        assert_eq!(restricted.take(1000), [4], "only the agent's own CPUs");
        assert_eq!(Cpus::new(vec![]).take(4000), [0]);
    }
}
