//! How busy each CPU is with work that is not the data plane's own: other processes,
//! interrupts, the hypervisor's steal. Read from /proc (the OS's view) at each placement
//! interval. The placement counts it beside the peers' own load, so that a queue pinned to a
//! core that something else keeps busy gives its peers to a freer one: two Ordo daemons on
//! one machine whose queues landed on the same core, or an application spinning there.
//! Without it, a pinned queue cannot escape a busy core (the kernel would move an unpinned
//! thread, but not a pinned one). Also read: how long each of our threads waited, runnable,
//! for its CPU (schedstat): a pinned queue thread that waits a lot shares its core with
//! something else pinned there.

use std::collections::HashMap;
use std::time::Duration;

/// One reading of /proc: each CPU's busy and total ticks, and each of our threads' ticks, the
/// CPU it last ran on, and its time spent waiting for a CPU.
#[derive(Default, Clone, Debug)]
pub struct Sample {
    cpus: HashMap<usize, (u64, u64)>,
    threads: HashMap<i32, Thread>,
}

#[derive(Default, Clone, Copy, Debug)]
struct Thread {
    ticks: u64,
    cpu: usize,
    wait_ns: u64,
}

/// What happened between two samples.
#[derive(Default, Debug)]
pub struct Figures {
    /// Per CPU, its load other than ours, in cores (0 to 1).
    pub other: HashMap<usize, f64>,
    /// Per CPU, the share of the time it was idle.
    pub idle: HashMap<usize, f64>,
    /// Per thread of ours, the share of the time it waited, runnable, for a CPU.
    pub wait: HashMap<i32, f64>,
}

impl Sample {
    /// Reads /proc/stat and /proc/self/task; what cannot be read is left out.
    pub fn read() -> Sample {
        let cpus = std::fs::read_to_string("/proc/stat")
            .map(|t| parse_stat(&t))
            .unwrap_or_default();
        let mut threads = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for entry in dir.flatten() {
                let Some(tid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                    continue;
                };
                let stat = std::fs::read_to_string(entry.path().join("stat"));
                let Some((ticks, cpu)) = stat.ok().and_then(|t| parse_task(&t)) else {
                    continue;
                };
                let wait_ns = run_delay_ns(&entry.path());
                threads.insert(tid, Thread { ticks, cpu, wait_ns });
            }
        }
        Sample { cpus, threads }
    }
}

/// The time task directory `task` (/proc/PID/task/TID) waited, runnable, for a CPU, in ns:
/// schedstat's second field (time on a CPU, time on a run queue, timeslices); 0 unread.
pub(crate) fn run_delay_ns(task: &std::path::Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The figures between two samples `elapsed` apart. A thread's ticks count on the CPU it ran
/// on last: exact for the pinned queue threads and workers, which are what the placement moves
/// work between. A CPU or thread missing from either sample is left out.
pub fn figures(before: &Sample, after: &Sample, elapsed: Duration) -> Figures {
    let mut ours: HashMap<usize, u64> = HashMap::new();
    let mut f = Figures::default();
    let elapsed_ns = elapsed.as_nanos().max(1) as f64;
    for (tid, t) in &after.threads {
        let was = before.threads.get(tid).copied().unwrap_or_default();
        *ours.entry(t.cpu).or_default() += t.ticks.saturating_sub(was.ticks);
        if before.threads.contains_key(tid) {
            f.wait.insert(
                *tid,
                (t.wait_ns.saturating_sub(was.wait_ns) as f64 / elapsed_ns).min(1.0),
            );
        }
    }
    for (&cpu, &(busy, total)) in &after.cpus {
        let Some(&(busy0, total0)) = before.cpus.get(&cpu) else {
            continue;
        };
        let Some(ticks) = total.checked_sub(total0).filter(|&t| t > 0) else {
            continue;
        };
        let busy = busy.saturating_sub(busy0);
        let others = busy.saturating_sub(ours.get(&cpu).copied().unwrap_or(0));
        f.other.insert(cpu, (others as f64 / ticks as f64).min(1.0));
        f.idle.insert(cpu, 1.0 - (busy as f64 / ticks as f64).min(1.0));
    }
    f
}

/// One CPU's time by kind, in clock ticks since boot (/proc/stat).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// User, nice and system: tasks, ours and others.
    pub tasks: u64,
    /// Hardware interrupts.
    pub irq: u64,
    /// Software interrupts (the network stack's receive and transmit work among them).
    pub softirq: u64,
    /// Taken by the hypervisor.
    pub steal: u64,
    /// Idle and waiting for I/O.
    pub idle: u64,
}

impl CpuTimes {
    pub fn total(&self) -> u64 {
        self.tasks + self.irq + self.softirq + self.steal + self.idle
    }
}

/// The kernel's clock ticks a second, the unit of /proc/stat and of a task's CPU time.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Each CPU's times, from /proc/stat (empty where it cannot be read).
pub fn cpu_times() -> HashMap<usize, CpuTimes> {
    std::fs::read_to_string("/proc/stat")
        .map(|t| parse_cpu_times(&t))
        .unwrap_or_default()
}

fn parse_cpu_times(text: &str) -> HashMap<usize, CpuTimes> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.take(8).map(|x| x.parse().unwrap_or(0)).collect();
            (v.len() == 8).then(|| {
                let t = CpuTimes {
                    tasks: v[0] + v[1] + v[2],
                    idle: v[3] + v[4],
                    irq: v[5],
                    softirq: v[6],
                    steal: v[7],
                };
                (cpu, t)
            })
        })
        .collect()
}

/// `cpuN user nice system idle iowait irq softirq steal ...` lines: (busy, total) ticks.
fn parse_stat(text: &str) -> HashMap<usize, (u64, u64)> {
    (parse_cpu_times(text).into_iter())
        .map(|(cpu, t)| (cpu, (t.total() - t.idle, t.total())))
        .collect()
}

/// /proc/PID/task/TID/stat: (utime + stime, processor). The command name, in parentheses, may
/// hold spaces, so fields are counted after its closing parenthesis (field 3 is the first).
pub(crate) fn parse_task(text: &str) -> Option<(u64, usize)> {
    let rest: Vec<&str> = text.get(text.rfind(')')? + 1..)?.split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).and_then(|x| x.parse::<u64>().ok());
    Some((field(14)? + field(15)?, field(39)? as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  300 0 200 1000 0 0 0 0 0 0\n\
                        cpu0 100 0 100 500 0 0 0 0 0 0\n\
                        cpu1 200 0 100 500 0 0 0 0 0 0\n\
                        intr 12345\n";

    #[test]
    fn proc_stat_lines_give_busy_and_total_ticks_per_cpu() {
        let c = parse_stat(STAT);
        assert_eq!(c.len(), 2, "the all-CPU line and other lines are skipped");
        assert_eq!(c[&0], (200, 700));
        assert_eq!(c[&1], (300, 800));
        // irq, softirq and steal are busy; iowait is idle.
        let c = parse_stat("cpu3 1 2 3 4 5 6 7 8 0 0\n");
        assert_eq!(c[&3], (1 + 2 + 3 + 6 + 7 + 8, 36));
        let t = parse_cpu_times("cpu3 1 2 3 4 5 6 7 8 0 0\n")[&3];
        assert_eq!((t.tasks, t.idle, t.irq, t.softirq, t.steal), (6, 9, 6, 7, 8));
        assert_eq!(t.total(), 36);
    }

    #[test]
    fn task_stat_survives_a_name_with_spaces_and_parentheses() {
        let mut fields: Vec<String> = (4..=52).map(|n| n.to_string()).collect();
        fields[14 - 4] = "70".into();
        fields[15 - 4] = "30".into();
        fields[39 - 4] = "1".into();
        let text = format!("4242 (ordo (queue) 1) S {}", fields.join(" "));
        assert_eq!(parse_task(&text), Some((100, 1)));
        assert_eq!(parse_task("4242 (x"), None);
    }

    #[test]
    fn our_own_ticks_are_not_counted_as_other_load() {
        let sample = |cpu0_busy, cpu1_busy, total, ours_on_1, wait_ns| Sample {
            cpus: HashMap::from([(0, (cpu0_busy, total)), (1, (cpu1_busy, total))]),
            threads: HashMap::from([(
                7,
                Thread {
                    ticks: ours_on_1,
                    cpu: 1,
                    wait_ns,
                },
            )]),
        };
        let before = sample(0, 0, 0, 0, 1_000_000_000);
        // 100 ticks each: CPU 0 fully busy with others; CPU 1 busy 90, of which 80 are ours;
        // our thread waited 0.25 s of the second for its CPU.
        let after = sample(100, 90, 100, 80, 1_250_000_000);
        let f = figures(&before, &after, Duration::from_secs(1));
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(f.other[&0], 1.0) && near(f.other[&1], 0.1), "{f:?}");
        assert!(near(f.idle[&0], 0.0) && near(f.idle[&1], 0.1), "{f:?}");
        assert!(near(f.wait[&7], 0.25), "{f:?}");
        // A CPU that went away or a first sample gives nothing rather than nonsense.
        let f = figures(&Sample::default(), &after, Duration::from_secs(1));
        assert!(f.other.is_empty() && f.idle.is_empty() && f.wait.is_empty());
    }

    #[test]
    fn this_process_is_found_in_proc() {
        let s = Sample::read();
        assert!(!s.cpus.is_empty());
        // The main thread's id is the process id.
        let main = std::process::id() as i32;
        assert!(s.threads.contains_key(&main), "our own threads are listed");
        // Busy for a while: the CPUs' counters move, and the figures stay in range.
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            std::hint::black_box(t0.elapsed());
        }
        let f = figures(&s, &Sample::read(), t0.elapsed());
        assert!(
            !f.idle.is_empty() && f.idle.values().all(|i| (0.0..=1.0).contains(i)),
            "{f:?}"
        );
        assert!(f.wait.contains_key(&main), "{f:?}");
    }
}
