//! The load generator's figures: latency distributions, fairness, its own CPU time.

use serde::{Deserialize, Serialize};

/// A latency distribution in ns (HDR histogram, 3 significant digits, up to 60 s).
pub struct Latency {
    hist: hdrhistogram::Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    pub fn new() -> Latency {
        Latency {
            hist: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
        }
    }

    pub fn record(&mut self, ns: u64) {
        let _ = self.hist.record(ns.clamp(1, 60_000_000_000));
    }

    pub fn merge(&mut self, other: &Latency) {
        let _ = self.hist.add(&other.hist);
    }

    pub fn summary(&self) -> LatencySummary {
        let us = |q: f64| self.hist.value_at_quantile(q) as f64 / 1000.0;
        LatencySummary {
            count: self.hist.len(),
            p50_us: us(0.5),
            p99_us: us(0.99),
            p999_us: us(0.999),
            max_us: self.hist.max() as f64 / 1000.0,
        }
    }
}

#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// Jain's fairness index of `xs`: 1 when all are equal, 1/n when one has everything.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

/// One CPU's time over an interval, as shares of it (from /proc/stat).
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct CoreCpu {
    pub cpu: usize,
    pub user: f64,
    pub system: f64,
    pub softirq: f64,
    pub idle: f64,
}

/// Per-CPU jiffies: (user+nice, system, irq+softirq, idle+iowait, total).
pub fn proc_stat() -> Vec<[u64; 5]> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            let g = |i: usize| v.get(i).copied().unwrap_or(0);
            let total: u64 = v.iter().take(8).sum();
            [g(0) + g(1), g(2), g(5) + g(6), g(3) + g(4), total]
        })
        .collect()
}

/// Each CPU's shares between two [`proc_stat`] readings.
pub fn core_shares(before: &[[u64; 5]], after: &[[u64; 5]]) -> Vec<CoreCpu> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .map(|(cpu, (b, a))| {
            let d = |i: usize| a[i].saturating_sub(b[i]) as f64;
            let total = d(4).max(1.0);
            CoreCpu {
                cpu,
                user: d(0) / total,
                system: d(1) / total,
                softirq: d(2) / total,
                idle: d(3) / total,
            }
        })
        .collect()
}

/// CPU time (user + system) of a process, in seconds; None if it is gone.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64 / tick)
}

/// User plus system CPU time of this process, in seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid rusage to fill, for this process.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// CPU time of the calling thread, in seconds.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert!((jain(&[5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
    }

    #[test]
    fn machine_cpu_shares_add_up() {
        let before = proc_stat();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 50 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let shares = core_shares(&before, &proc_stat());
        assert!(!shares.is_empty());
        for c in &shares {
            let sum = c.user + c.system + c.softirq + c.idle;
            assert!(sum <= 1.0 + 1e-9, "{c:?}");
        }
        assert!(process_cpu_seconds(std::process::id()).is_some());
    }

    #[test]
    fn percentiles() {
        let mut l = Latency::new();
        for us in 1..=1000u64 {
            l.record(us * 1000);
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert!((s.p50_us - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p99_us - 990.0).abs() < 1.0, "{s:?}");
    }
}
