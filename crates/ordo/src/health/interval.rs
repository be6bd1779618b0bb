//! One interval's figures, from two samples: per stage, per thread (Ordo's clock beside the
//! OS's charge), per CPU (the OS's time by kind beside Ordo's threads there). Rates are per
//! second; shares of time are from 0 to 1; work is in cores (1.0: one CPU's whole time).

use super::Sample;
use crate::plane::stats::Stage;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Interval {
    pub elapsed: Duration,
    /// Indexed like [`Stage::ALL`].
    pub stages: Vec<StageFigures>,
    pub threads: Vec<ThreadFigures>,
    /// By CPU number.
    pub cpus: Vec<CpuFigures>,
}

/// A stage over all threads.
#[derive(Debug, Clone, Copy)]
pub struct StageFigures {
    pub stage: Stage,
    /// Time spent in it, by Ordo's clock.
    pub cores: f64,
    pub packets_per_second: f64,
    pub batches_per_second: f64,
    /// Delivery stages: times a thread became a lane's deliverer, and those that found nothing.
    pub wakeups_per_second: f64,
    pub wasted_per_second: f64,
}

impl StageFigures {
    /// A stage that did nothing.
    pub fn idle(stage: Stage) -> StageFigures {
        StageFigures {
            stage,
            cores: 0.0,
            packets_per_second: 0.0,
            batches_per_second: 0.0,
            wakeups_per_second: 0.0,
            wasted_per_second: 0.0,
        }
    }

    /// Packets delivered per wake-up (delivery stages), None without wake-ups.
    pub fn packets_per_wakeup(&self) -> Option<f64> {
        (self.wakeups_per_second > 0.0).then(|| self.packets_per_second / self.wakeups_per_second)
    }

    /// Packets per batch, None without batches.
    pub fn packets_per_batch(&self) -> Option<f64> {
        (self.batches_per_second > 0.0).then(|| self.packets_per_second / self.batches_per_second)
    }

    /// The share of wake-ups that found nothing to deliver.
    pub fn wasted_share(&self) -> f64 {
        if self.wakeups_per_second > 0.0 {
            self.wasted_per_second / self.wakeups_per_second
        } else {
            0.0
        }
    }
}

/// One data-plane thread.
#[derive(Debug, Clone)]
pub struct ThreadFigures {
    pub name: String,
    pub tid: i32,
    /// The CPU it ran on last (where its time is counted).
    pub cpu: Option<usize>,
    /// Busy by Ordo's clock: the time inside its stages, waits for the CPU included.
    pub ordo_cores: f64,
    /// The CPU time the OS charged it.
    pub os_cores: f64,
    /// The share of the interval it waited, runnable, for its CPU.
    pub waited: f64,
    /// Its time in each stage (indexed like [`Stage::ALL`]), by Ordo's clock.
    pub stage_cores: [f64; 6],
}

impl ThreadFigures {
    /// Whether it worked in `stage` this interval.
    pub fn ran(&self, stage: Stage) -> bool {
        self.stage_cores[stage as usize] > 0.0
    }
}

impl ThreadFigures {
    /// Ordo's figure without the waits for the CPU: what it should have been charged for its
    /// stages (a thread preempted inside a stage is not running).
    pub fn ordo_running(&self) -> f64 {
        (self.ordo_cores - self.waited).max(0.0)
    }
}

/// One CPU: the OS's time by kind, as shares of the interval, and Ordo's threads on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuFigures {
    pub cpu: usize,
    pub tasks: f64,
    pub irq: f64,
    pub softirq: f64,
    pub steal: f64,
    pub idle: f64,
    /// Ordo's threads that ran there last: what the OS charged them, and their stages' time
    /// by Ordo's clock (waits taken out).
    pub ordo_os: f64,
    pub ordo_clock: f64,
}

impl CpuFigures {
    /// Everything but idle.
    pub fn busy(&self) -> f64 {
        1.0 - self.idle
    }
}

impl Interval {
    pub(crate) fn between(before: &Sample, after: &Sample) -> Interval {
        let elapsed = after
            .at
            .saturating_duration_since(before.at)
            .max(Duration::from_millis(1));
        let secs = elapsed.as_secs_f64();
        let ns = |n: u64| n as f64 / 1e9 / secs;
        let rate = |n: u64| n as f64 / secs;
        let mut stages: Vec<StageFigures> = Stage::ALL.iter().map(|&s| StageFigures::idle(s)).collect();
        let mut threads = Vec::new();
        for t in &after.threads {
            let was = before
                .threads
                .iter()
                .find(|b| b.tid == t.tid)
                .cloned()
                .unwrap_or_default();
            let mut stage_cores = [0.0; 6];
            for (i, s) in t.stages.iter().enumerate() {
                let w = was.stages[i];
                stage_cores[i] = ns(s.busy_ns.saturating_sub(w.busy_ns));
                stages[i].cores += ns(s.busy_ns.saturating_sub(w.busy_ns));
                stages[i].packets_per_second += rate(s.packets.saturating_sub(w.packets));
                stages[i].batches_per_second += rate(s.batches.saturating_sub(w.batches));
                stages[i].wakeups_per_second += rate(s.wakeups.saturating_sub(w.wakeups));
                stages[i].wasted_per_second += rate(s.wasted.saturating_sub(w.wasted));
            }
            threads.push(ThreadFigures {
                name: t.name.clone(),
                tid: t.tid,
                cpu: t.last_cpu,
                ordo_cores: ns(t.busy_ns.saturating_sub(was.busy_ns)),
                os_cores: ns(t.os_cpu_ns.saturating_sub(was.os_cpu_ns)),
                waited: ns(t.os_waited_ns.saturating_sub(was.os_waited_ns)).min(1.0),
                stage_cores,
            });
        }
        let mut cpus: Vec<CpuFigures> = (after.cpus.iter())
            .filter_map(|(&cpu, a)| {
                let b = before.cpus.get(&cpu)?;
                let total = a.total().checked_sub(b.total()).filter(|&t| t > 0)? as f64;
                let share = |x: u64, y: u64| x.saturating_sub(y) as f64 / total;
                Some(CpuFigures {
                    cpu,
                    tasks: share(a.tasks, b.tasks),
                    irq: share(a.irq, b.irq),
                    softirq: share(a.softirq, b.softirq),
                    steal: share(a.steal, b.steal),
                    idle: share(a.idle, b.idle),
                    ordo_os: 0.0,
                    ordo_clock: 0.0,
                })
            })
            .collect();
        cpus.sort_by_key(|c| c.cpu);
        for t in &threads {
            if let Some(c) = t.cpu.and_then(|cpu| cpus.iter_mut().find(|c| c.cpu == cpu)) {
                c.ordo_os += t.os_cores;
                c.ordo_clock += t.ordo_running();
            }
        }
        Interval {
            elapsed,
            stages,
            threads,
            cpus,
        }
    }

    pub fn stage(&self, s: Stage) -> &StageFigures {
        &self.stages[s as usize]
    }

    /// The data plane's work by Ordo's clock, all threads (waits for the CPU taken out).
    pub fn ordo_cores(&self) -> f64 {
        self.threads.iter().map(ThreadFigures::ordo_running).sum()
    }
}
