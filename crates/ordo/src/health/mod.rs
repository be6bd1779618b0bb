//! The data plane watching itself: once a second, what each
//! stage and thread did by Ordo's own clock, set beside what the OS charged each thread and
//! each CPU, and the detectors' verdicts over it ([`detect`]). `ordo show`, `ordo top` and the
//! metrics read the last [`Report`].
//!
//! Ordo's clock measures a stage from its start to its end, system calls included; the OS
//! charges a thread the CPU time it ran, and a CPU its time by kind (/proc/stat). The two
//! should agree within a margin once the time a thread waited for its CPU is taken out of
//! Ordo's figure; where they do not, the OS's figures are what mislead (softirq
//! work in interrupt context counted as idle), and the report says which way.

pub mod detect;
pub mod interval;

use crate::host::cpuload::{self, CpuTimes};
use crate::plane::stats::{Stage, Stats};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use detect::{Detector, Warning};
pub use interval::Interval;

/// How often the figures are taken.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// One thread's counters at a moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct ThreadSample {
    pub name: String,
    pub tid: i32,
    pub busy_ns: u64,
    /// Per stage (indexed like [`Stage::ALL`]).
    pub stages: [StageSample; 6],
    pub os_cpu_ns: u64,
    pub os_waited_ns: u64,
    pub last_cpu: Option<usize>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StageSample {
    pub packets: u64,
    pub batches: u64,
    pub busy_ns: u64,
    pub wakeups: u64,
    pub wasted: u64,
}

/// Everything read at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub at: Instant,
    pub threads: Vec<ThreadSample>,
    pub cpus: HashMap<usize, CpuTimes>,
}

impl Sample {
    pub fn read(stats: &Stats) -> Sample {
        let threads = (stats.threads().iter())
            .map(|t| {
                let os = t.os();
                let mut stages = [StageSample::default(); 6];
                for (i, s) in Stage::ALL.iter().enumerate() {
                    let st = t.stage(*s);
                    stages[i] = StageSample {
                        packets: st.packets.load(Relaxed),
                        batches: st.batches.load(Relaxed),
                        busy_ns: st.busy_ns.load(Relaxed),
                        wakeups: st.wakeups.load(Relaxed),
                        wasted: st.wasted_wakeups.load(Relaxed),
                    };
                }
                ThreadSample {
                    name: t.name.clone(),
                    tid: t.tid,
                    busy_ns: t.busy_ns.load(Relaxed),
                    stages,
                    os_cpu_ns: os.map_or(0, |o| o.cpu.as_nanos() as u64),
                    os_waited_ns: os.map_or(0, |o| o.waited.as_nanos() as u64),
                    last_cpu: os.map(|o| o.last_cpu),
                }
            })
            .collect();
        Sample {
            at: Instant::now(),
            threads,
            cpus: cpuload::cpu_times(),
        }
    }
}

/// The last interval's figures and what the detectors made of them.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub interval: Option<Interval>,
    pub warnings: Vec<Warning>,
}

/// Takes the samples and keeps the last report.
pub struct Monitor {
    /// The CPUs the data plane may use (a black hole is one of them carrying the work while
    /// another idles).
    cpus: Vec<usize>,
    last: Mutex<Option<Sample>>,
    report: Mutex<Report>,
}

impl Monitor {
    pub fn new(cpus: Vec<usize>) -> Monitor {
        Monitor {
            cpus,
            last: Mutex::new(None),
            report: Mutex::new(Report::default()),
        }
    }

    /// Takes a sample if an interval has passed since the last, and judges the interval;
    /// `active_peers`: how many peers carry traffic. Called by the timer thread, more often
    /// than [`INTERVAL`].
    pub fn observe(&self, stats: &Stats, active_peers: impl FnOnce() -> usize) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref().is_some_and(|s| s.at.elapsed() < INTERVAL) {
            return;
        }
        let now = Sample::read(stats);
        if let Some(before) = last.as_ref() {
            let interval = Interval::between(before, &now);
            let warnings = detect::all(&interval, &self.cpus, active_peers());
            *self.report.lock().unwrap_or_else(|p| p.into_inner()) = Report {
                interval: Some(interval),
                warnings,
            };
        }
        *last = Some(now);
    }

    /// The last interval's report (empty before the first full interval).
    pub fn report(&self) -> Report {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
