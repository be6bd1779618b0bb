//! What the data plane measures about itself: per stage, packets, batches, wake-ups and the
//! time spent (our own clock); per thread, the same time beside the CPU time the OS reports
//! for it, so the two can be compared (kernel accounting can mislead: softirq work in interrupt
//! context counts as idle).

use crate::host::cpuload;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The stages a packet crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Reading datagrams from the UDP sockets and dispatching them.
    Receive,
    /// Decrypting a batch (any worker).
    Decrypt,
    /// In-order acceptance of a peer's decrypted batches and writing them to the TUN device.
    DeliverInbound,
    /// Reading packets from the TUN device and dispatching them.
    Read,
    /// Encrypting a batch (any worker).
    Encrypt,
    /// In-order sending of a peer's encrypted batches.
    DeliverOutbound,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Receive,
        Stage::Decrypt,
        Stage::DeliverInbound,
        Stage::Read,
        Stage::Encrypt,
        Stage::DeliverOutbound,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::Decrypt => "decrypt",
            Stage::DeliverInbound => "deliver_inbound",
            Stage::Read => "read",
            Stage::Encrypt => "encrypt",
            Stage::DeliverOutbound => "deliver_outbound",
        }
    }
}

/// One thread's counters for one stage. Only that thread writes them: counters shared by
/// threads would move their cache line between cores on every batch.
#[derive(Default)]
pub struct StageStats {
    pub packets: AtomicU64,
    pub batches: AtomicU64,
    pub busy_ns: AtomicU64,
    /// Times the stage started work (for delivery stages: became a lane's deliverer).
    pub wakeups: AtomicU64,
    /// Times it started and found nothing to do.
    pub wasted_wakeups: AtomicU64,
}

/// A stage's counters summed over the threads.
#[derive(Debug, Default, Clone, Copy)]
pub struct StageTotals {
    pub packets: u64,
    pub batches: u64,
    pub busy_ns: u64,
    pub wakeups: u64,
    pub wasted_wakeups: u64,
}

/// One data-plane thread. Aligned so that two threads' counters never share a cache line.
#[repr(align(128))]
pub struct ThreadStats {
    pub name: String,
    /// Linux thread id, to find the OS's own figures in /proc/self/task.
    pub tid: i32,
    pub busy_ns: AtomicU64,
    /// This thread's part of each stage (indexed like [`Stage::ALL`]).
    stages: [StageStats; 6],
}

impl ThreadStats {
    pub fn stage(&self, s: Stage) -> &StageStats {
        &self.stages[s as usize]
    }

    /// What the OS says of this thread, to set beside its own busy time; None once it has
    /// exited.
    pub fn os(&self) -> Option<OsThread> {
        let task = std::path::PathBuf::from(format!("/proc/self/task/{}", self.tid));
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        let (ticks, last_cpu) = cpuload::parse_task(&stat)?;
        let (sleeps, preemptions) = os_context_switches(self.tid)?;
        Some(OsThread {
            cpu: std::time::Duration::from_nanos(ticks * (1_000_000_000 / cpuload::clock_ticks_per_second())),
            last_cpu,
            waited: std::time::Duration::from_nanos(cpuload::run_delay_ns(&task)),
            sleeps,
            preemptions,
        })
    }
}

/// A thread as the OS accounts it (/proc/self/task/TID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OsThread {
    /// User plus system time charged to it.
    pub cpu: std::time::Duration,
    /// The CPU it ran on last.
    pub last_cpu: usize,
    /// Time it waited, runnable, for a CPU (schedstat's run delay).
    pub waited: std::time::Duration,
    /// Times it gave up its CPU to wait (voluntary switches).
    pub sleeps: u64,
    /// Times it was switched out while it could still run (involuntary switches).
    pub preemptions: u64,
}

#[derive(Default)]
pub struct Stats {
    threads: Mutex<Vec<Arc<ThreadStats>>>,
}

impl Stats {
    /// A stage's counters over all threads (a snapshot).
    pub fn stage(&self, s: Stage) -> StageTotals {
        let mut t = StageTotals::default();
        for th in self.threads.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let st = th.stage(s);
            t.packets += st.packets.load(Ordering::Relaxed);
            t.batches += st.batches.load(Ordering::Relaxed);
            t.busy_ns += st.busy_ns.load(Ordering::Relaxed);
            t.wakeups += st.wakeups.load(Ordering::Relaxed);
            t.wasted_wakeups += st.wasted_wakeups.load(Ordering::Relaxed);
        }
        t
    }

    /// Records one batch of `packets` through `stage` that took since `start`, on `thread`.
    pub fn record(&self, stage: Stage, thread: &ThreadStats, packets: usize, start: Instant) {
        let ns = start.elapsed().as_nanos() as u64;
        let st = thread.stage(stage);
        st.packets.fetch_add(packets as u64, Ordering::Relaxed);
        st.batches.fetch_add(1, Ordering::Relaxed);
        st.busy_ns.fetch_add(ns, Ordering::Relaxed);
        thread.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Registers the calling thread.
    pub fn register_thread(&self, name: &str) -> Arc<ThreadStats> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let t = Arc::new(ThreadStats {
            name: name.to_string(),
            tid,
            busy_ns: AtomicU64::new(0),
            stages: Default::default(),
        });
        self.threads.lock().unwrap_or_else(|p| p.into_inner()).push(t.clone());
        t
    }

    /// The registered threads.
    pub fn threads(&self) -> Vec<Arc<ThreadStats>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Each stage's totals over all threads, by name (`stage_NAME_packets` ...), for the
    /// interface's report.
    pub fn stage_counters(&self) -> Vec<(String, u64)> {
        let mut c = Vec::new();
        for s in Stage::ALL {
            let st = self.stage(s);
            let n = s.name();
            c.push((format!("stage_{n}_packets"), st.packets));
            c.push((format!("stage_{n}_batches"), st.batches));
            c.push((format!("stage_{n}_busy_us"), st.busy_ns / 1000));
            if matches!(s, Stage::DeliverInbound | Stage::DeliverOutbound) {
                c.push((format!("stage_{n}_wakeups"), st.wakeups));
                c.push((format!("stage_{n}_wasted_wakeups"), st.wasted_wakeups));
            }
        }
        c
    }

    /// [`Stats::stage_counters`], then each thread's figures flattened into names
    /// (`thread_NAME_TID_...`), for `ordo bench`'s report.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let mut c = self.stage_counters();
        for t in self.threads.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let key = format!("thread_{}_{}", t.name, t.tid);
            c.push((format!("{key}_busy_us"), t.busy_ns.load(Ordering::Relaxed) / 1000));
            for s in Stage::ALL {
                let n = t.stage(s).packets.load(Ordering::Relaxed);
                if n > 0 {
                    c.push((format!("{key}_{}_packets", s.name()), n));
                }
            }
            if let Some(os) = t.os() {
                c.push((format!("{key}_os_cpu_us"), os.cpu.as_micros() as u64));
                c.push((format!("{key}_os_sleeps"), os.sleeps));
                c.push((format!("{key}_os_preemptions"), os.preemptions));
            }
        }
        c
    }
}

/// How often the OS switched thread `tid` of this process out: because it waited for
/// something (voluntary switches: its sleeps), and while it could still run (involuntary:
/// preempted, e.g. by a thread it woke on its own CPU, as a TUN write wakes the application
/// reading the tunnel's traffic). Many preemptions of a queue thread mean it shares its core
/// with whatever it feeds.
fn os_context_switches(tid: i32) -> Option<(u64, u64)> {
    parse_context_switches(&std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?)
}

/// The voluntary and involuntary context switches of a /proc/PID/status text.
fn parse_context_switches(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((field("voluntary_ctxt_switches")?, field("nonvoluntary_ctxt_switches")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_reports_by_name() {
        let s = Stats::default();
        let t = s.register_thread("test");
        let start = Instant::now();
        // Burn a little CPU so both clocks move.
        let mut x = 0u64;
        while start.elapsed().as_millis() < 30 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        s.record(Stage::Decrypt, &t, 32, start);
        t.stage(Stage::DeliverInbound).wakeups.fetch_add(1, Ordering::Relaxed);
        // A second thread's part is summed in.
        let u = s.register_thread("other");
        s.record(Stage::Decrypt, &u, 8, Instant::now());
        let c: std::collections::HashMap<_, _> = s.counters().into_iter().collect();
        assert_eq!(c["stage_decrypt_packets"], 40);
        assert_eq!(c["stage_decrypt_batches"], 2);
        assert!(c["stage_decrypt_busy_us"] >= 30_000);
        assert_eq!(c["stage_deliver_inbound_wakeups"], 1);
        let busy = c[&format!("thread_test_{}_busy_us", t.tid)];
        assert!(busy >= 30_000);
        assert_eq!(c[&format!("thread_test_{}_decrypt_packets", t.tid)], 32);
        assert!(!c.contains_key(&format!("thread_test_{}_encrypt_packets", t.tid)));
        assert!(
            c.contains_key(&format!("thread_test_{}_os_cpu_us", t.tid)),
            "the OS's figure sits beside ours"
        );
    }

    /// Thread `t`'s counter `what` (e.g. "os_sleeps"), as `ordo show` would read it.
    fn thread_counter(s: &Stats, t: &ThreadStats, what: &str) -> u64 {
        let key = format!("thread_{}_{}_{what}", t.name, t.tid);
        s.counters().into_iter().find(|(k, _)| *k == key).expect("counted").1
    }

    #[test]
    fn counts_the_threads_sleeps() {
        let s = Stats::default();
        let t = s.register_thread("test");
        let before = thread_counter(&s, &t, "os_sleeps");
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            thread_counter(&s, &t, "os_sleeps") >= before + 5,
            "each sleep is a voluntary switch"
        );
    }

    #[test]
    fn counts_preemptions_by_a_thread_on_the_same_cpu() {
        use crate::host::topology;
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        let s = Stats::default();
        let t = s.register_thread("test");
        let preemptions = |s: &Stats| thread_counter(s, &t, "os_preemptions");
        let cpu = topology::allowed_cpus()[0];
        topology::pin_current_thread(&[cpu]).unwrap();
        let before = preemptions(&s);
        // A second busy thread on the same CPU: the scheduler must take turns between the two,
        // switching this one out while it could still run.
        let stop = Arc::new(AtomicBool::new(false));
        let rival = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                topology::pin_current_thread(&[cpu]).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            std::hint::spin_loop();
        }
        // Read before joining: the join may sleep, which is not a preemption.
        let after = preemptions(&s);
        stop.store(true, Ordering::Relaxed);
        rival.join().unwrap();
        assert!(after > before, "sharing a CPU with a busy thread preempts");
    }

    #[test]
    fn context_switches_parse_from_status() {
        let status = "Name:\tordo-queue0\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t4226\nnonvoluntary_ctxt_switches:\t7686\n";
        assert_eq!(parse_context_switches(status), Some((4226, 7686)));
        assert_eq!(parse_context_switches("Name:\tx\nvoluntary_ctxt_switches:\t1\n"), None);
        assert_eq!(
            parse_context_switches("voluntary_ctxt_switches:\tmany\nnonvoluntary_ctxt_switches:\t2\n"),
            None
        );
    }
}
