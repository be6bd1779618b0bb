//! The detectors, each a pure function of one interval's figures with its thresholds stated
//! here: execution order inversion (Mounah et al., "The Impact of Kernel Asynchronous APIs on
//! the Performance of a Kernel VPN", SYSTOR 2025), the black hole (Barone et al., "Revisiting
//! WireGuard for Line-rate, Scalable Tunneling", HPSR 2025), and where Ordo's clock and the
//! OS's accounting disagree (Zhang et al., "Understanding Linux Kernel-based Packet Switching
//! on WiFi Access Points").

use super::interval::Interval;
use crate::plane::stats::Stage;
use std::fmt;

/// Inversion is judged only on a delivery stage carrying at least this many packets a second:
/// below it, small deliveries are the traffic's, not a symptom.
pub const INVERSION_MIN_RATE: f64 = 2_000.0;
/// A delivery thread that waits for its CPU at most this share of the time...
pub const INVERSION_DELIVERY_WAIT: f64 = 0.05;
/// ...while the decryption it depends on waits at least this share: delivery preempts
/// decryption, as kernel WireGuard's softirq GRO stage does its decryption workqueue
/// (Mounah et al.). Read by hand in `ordo show --json` (threads' `waited_permille`) during the
/// `detectors` test's four-flow run: at SCHED_FIFO the delivery thread waited 0.1% and the
/// workers 61%; at equal priority 46% and 38%.
pub const INVERSION_DECRYPT_WAIT: f64 = 0.25;
/// Delivery wakes more often than decryption finishes batches: packets per delivery wake-up
/// below this share of packets per decryption batch (the papers' "batches collapse").
pub const INVERSION_BATCH_SHARE: f64 = 0.5;
/// The share of delivery wake-ups that found nothing, at or above which delivery runs ahead of
/// decryption (read by hand the same way: 8-14% at SCHED_FIFO, 3-5% at equal priority).
pub const INVERSION_WASTED_SHARE: f64 = 0.25;

/// The black hole is judged only with at least this many peers carrying traffic (one peer's
/// work is serial by design: its queue's CPU) ...
pub const BLACK_HOLE_MIN_PEERS: usize = 2;
/// ... and the data plane working at least this many cores (the CPU time the OS charged its
/// threads: under contention, the measure that does not shrink with the waits).
pub const BLACK_HOLE_MIN_CORES: f64 = 0.2;
/// The share of the data plane's work on one CPU at or above which it is a black hole...
pub const BLACK_HOLE_SHARE: f64 = 0.85;
/// ... when that CPU is at least this busy (saturated, by the OS's account) ...
pub const BLACK_HOLE_BUSY: f64 = 0.9;
/// ... while another CPU is at least this idle.
pub const BLACK_HOLE_IDLE: f64 = 0.5;

/// Ordo's clock and the OS disagree when they differ by more than this many cores and by more
/// than [`ACCOUNTING_RATIO`]: the kernel's figures are ticks (10 ms at 100 Hz), a thread's
/// clock includes the odd preemption the run delay misses.
pub const ACCOUNTING_MARGIN: f64 = 0.10;
pub const ACCOUNTING_RATIO: f64 = 1.25;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Detector {
    Inversion,
    BlackHole,
    Accounting,
}

impl Detector {
    pub const ALL: [Detector; 3] = [Detector::Inversion, Detector::BlackHole, Detector::Accounting];

    pub fn name(self) -> &'static str {
        match self {
            Detector::Inversion => "inversion",
            Detector::BlackHole => "black_hole",
            Detector::Accounting => "accounting",
        }
    }
}

/// A finding, in words for a person.
#[derive(Debug, Clone, PartialEq)]
pub struct Warning {
    pub detector: Detector,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.detector.name(), self.message)
    }
}

/// Every detector over `interval`; `cpus`: the CPUs the data plane may use; `active_peers`:
/// the peers that carried traffic in it.
pub fn all(interval: &Interval, cpus: &[usize], active_peers: usize) -> Vec<Warning> {
    let mut w = inversion(interval);
    if active_peers >= BLACK_HOLE_MIN_PEERS {
        w.extend(black_hole(interval, cpus));
    }
    w.extend(accounting(interval));
    w
}

/// Delivery that runs before decryption has anything for it: delivery threads that preempt
/// the decryption feeding them, delivery woken more often than batches finish, or many
/// wake-ups finding nothing; at a rate where batches should be large.
pub fn inversion(interval: &Interval) -> Vec<Warning> {
    let mut out = Vec::new();
    for (stage, crypto, what) in [
        (Stage::DeliverInbound, Stage::Decrypt, "inbound delivery"),
        (Stage::DeliverOutbound, Stage::Encrypt, "outbound delivery"),
    ] {
        let s = interval.stage(stage);
        let Some(per_wakeup) = s.packets_per_wakeup() else {
            continue;
        };
        if s.packets_per_second < INVERSION_MIN_RATE {
            continue;
        }
        // Threads that only deliver, and threads that only do the crypto they deliver.
        let mean_wait = |f: &dyn Fn(&super::interval::ThreadFigures) -> bool| {
            let t: Vec<f64> = interval.threads.iter().filter(|t| f(t)).map(|t| t.waited).collect();
            (!t.is_empty()).then(|| t.iter().sum::<f64>() / t.len() as f64)
        };
        let delivery_wait = mean_wait(&|t| t.ran(stage) && !t.ran(crypto));
        let crypto_wait = mean_wait(&|t| t.ran(crypto) && !t.ran(stage));
        let per_batch = interval.stage(crypto).packets_per_batch().unwrap_or(0.0);
        let wasted = s.wasted_share();
        let why = match (delivery_wait, crypto_wait) {
            (Some(d), Some(c)) if d <= INVERSION_DELIVERY_WAIT && c >= INVERSION_DECRYPT_WAIT => format!(
                "its threads waited {:.0}% of the time for a CPU while the {} feeding them waited {:.0}%: \
                 delivery preempts the crypto it waits for",
                d * 100.0,
                crypto.name(),
                c * 100.0
            ),
            _ if per_wakeup < per_batch * INVERSION_BATCH_SHARE => format!(
                "it hands over {per_wakeup:.1} packets a wake-up where {} finishes {per_batch:.1} a batch",
                crypto.name()
            ),
            _ if wasted >= INVERSION_WASTED_SHARE => {
                format!("{:.0}% of its wake-ups found nothing to deliver", wasted * 100.0)
            }
            _ => continue,
        };
        out.push(Warning {
            detector: Detector::Inversion,
            message: format!(
                "{what} runs ahead of {} at {:.0} packets/s: {why}; {:.0}% of its wake-ups \
                 found nothing. The inline, pool and auto models deliver without a thread of their own",
                crypto.name(),
                s.packets_per_second,
                wasted * 100.0
            ),
        });
    }
    out
}

/// One CPU carrying the data plane's work while another idles (to be judged with several
/// peers active). `cpus`: the CPUs the plane may use; an idle CPU outside them is named with
/// the setting that keeps the plane off it.
pub fn black_hole(interval: &Interval, cpus: &[usize]) -> Option<Warning> {
    let total: f64 = interval.cpus.iter().map(|c| c.ordo_os).sum();
    if total < BLACK_HOLE_MIN_CORES {
        return None;
    }
    let busiest = (interval.cpus.iter()).max_by(|a, b| a.ordo_os.total_cmp(&b.ordo_os))?;
    let share = busiest.ordo_os / total;
    if share < BLACK_HOLE_SHARE || busiest.busy() < BLACK_HOLE_BUSY {
        return None;
    }
    let idle = (interval.cpus.iter())
        .filter(|c| c.cpu != busiest.cpu)
        .max_by(|a, b| a.idle.total_cmp(&b.idle))
        .filter(|c| c.idle >= BLACK_HOLE_IDLE)?;
    let why = if cpus.is_empty() || cpus.contains(&idle.cpu) {
        "the peers' queues or threads are all on one CPU"
    } else {
        "the Cores setting keeps the data plane off the idle CPU"
    };
    Some(Warning {
        detector: Detector::BlackHole,
        message: format!(
            "CPU {} is {:.0}% busy and carries {:.0}% of the data plane's work ({total:.2} cores) while CPU {} \
             is {:.0}% idle: {why}",
            busiest.cpu,
            busiest.busy() * 100.0,
            share * 100.0,
            idle.cpu,
            idle.idle * 100.0
        ),
    })
}

fn disagree(a: f64, b: f64) -> bool {
    a > b + ACCOUNTING_MARGIN && a > b * ACCOUNTING_RATIO
}

/// Where the OS accounts less work than Ordo's clock measured: per thread (its stages' time,
/// its waits for the CPU taken out, against the CPU time charged to it) and per CPU (Ordo's
/// threads there against the time the OS counts the CPU busy). The other way, an OS charge
/// above the stages' time, is the rule and not reported: a thread's system calls that wait
/// (a blocking receive) and its loop lie outside its stages; both figures are in `ordo show
/// --json`, `ordo top` and the metrics.
pub fn accounting(interval: &Interval) -> Vec<Warning> {
    let mut out = Vec::new();
    for t in &interval.threads {
        let (ordo, os) = (t.ordo_running(), t.os_cores);
        if disagree(ordo, os) {
            out.push(Warning {
                detector: Detector::Accounting,
                message: format!(
                    "thread {} ({}): its stages took {ordo:.2} cores by Ordo's clock (waits for the CPU \
                     taken out), the OS charged it {os:.2}: {:.2} cores the OS counts elsewhere (as softirq \
                     or as idle)",
                    t.name,
                    t.tid,
                    ordo - os
                ),
            });
        }
    }
    for c in &interval.cpus {
        if disagree(c.ordo_clock, c.busy()) {
            out.push(Warning {
                detector: Detector::Accounting,
                message: format!(
                    "CPU {}: Ordo's threads ran {:.2} cores there by Ordo's clock, the OS counts it {:.2} busy: \
                     {:.2} cores counted as idle (softirq work in interrupt context)",
                    c.cpu,
                    c.ordo_clock,
                    c.busy(),
                    c.ordo_clock - c.busy()
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::interval::{CpuFigures, StageFigures, ThreadFigures};
    use std::time::Duration;

    fn interval() -> Interval {
        Interval {
            elapsed: Duration::from_secs(1),
            stages: Stage::ALL.iter().map(|&s| StageFigures::idle(s)).collect(),
            threads: Vec::new(),
            cpus: vec![
                CpuFigures {
                    cpu: 0,
                    idle: 0.5,
                    tasks: 0.5,
                    ..Default::default()
                },
                CpuFigures {
                    cpu: 1,
                    idle: 0.5,
                    tasks: 0.5,
                    ..Default::default()
                },
            ],
        }
    }

    fn delivery(i: &mut Interval, pps: f64, wakeups: f64, wasted: f64) {
        let s = &mut i.stages[Stage::DeliverInbound as usize];
        s.packets_per_second = pps;
        s.wakeups_per_second = wakeups;
        s.wasted_per_second = wasted;
    }

    fn thread(name: &str, stage: Stage, waited: f64) -> ThreadFigures {
        let mut stage_cores = [0.0; 6];
        stage_cores[stage as usize] = 0.3;
        ThreadFigures {
            name: name.into(),
            tid: 1,
            cpu: Some(0),
            ordo_cores: 0.3,
            os_cores: 0.3,
            waited,
            stage_cores,
        }
    }

    #[test]
    fn inversion_is_delivery_preempting_decryption_or_collapsed_or_wasted_wakeups() {
        let mut i = interval();
        i.stages[Stage::Decrypt as usize].packets_per_second = 100_000.0;
        i.stages[Stage::Decrypt as usize].batches_per_second = 2_000.0;
        delivery(&mut i, 100_000.0, 2_000.0, 0.0);
        i.threads = vec![
            thread("deliver1", Stage::DeliverInbound, 0.46),
            thread("worker0", Stage::Decrypt, 0.38),
        ];
        assert!(
            inversion(&i).is_empty(),
            "threads at equal priority, 50 packets a wake-up"
        );
        i.threads[0].waited = 0.001;
        i.threads[1].waited = 0.61;
        let w = inversion(&i);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].message
                .contains("waited 0% of the time for a CPU while the decrypt feeding them waited 61%"),
            "{}",
            w[0].message
        );
        // Delivery woken for every few packets of 50-packet batches.
        i.threads.clear();
        delivery(&mut i, 100_000.0, 40_000.0, 0.0);
        assert!(inversion(&i)[0]
            .message
            .contains("2.5 packets a wake-up where decrypt finishes 50.0 a batch"));
        delivery(&mut i, 100_000.0, 2_000.0, 600.0);
        assert!(inversion(&i)[0]
            .message
            .contains("30% of its wake-ups found nothing to deliver"));
        // A trickle delivers a packet at a time without anything wrong.
        delivery(&mut i, 500.0, 500.0, 0.0);
        assert!(inversion(&i).is_empty());
        // The inline model: one thread decrypts and delivers, whatever its waits.
        delivery(&mut i, 100_000.0, 2_000.0, 0.0);
        let mut both = thread("queue0", Stage::Decrypt, 0.0);
        both.stage_cores[Stage::DeliverInbound as usize] = 0.1;
        i.threads = vec![both];
        assert!(inversion(&i).is_empty());
    }

    #[test]
    fn a_black_hole_is_one_busy_cpu_beside_an_idle_one() {
        let mut i = interval();
        i.cpus[0].ordo_os = 0.38;
        i.cpus[0].idle = 0.0;
        i.cpus[1].ordo_os = 0.02;
        i.cpus[1].idle = 0.99;
        let w = black_hole(&i, &[0, 1]).expect("a black hole");
        assert!(
            w.message.starts_with("CPU 0 is 100% busy and carries 95%"),
            "{}",
            w.message
        );
        assert!(w.message.contains("CPU 1 is 99% idle"), "{}", w.message);
        // Not when the other CPU is busy too, nor when the busy one has room, nor when the
        // plane does little.
        i.cpus[1].idle = 0.2;
        assert!(black_hole(&i, &[0, 1]).is_none());
        i.cpus[1].idle = 0.99;
        i.cpus[0].idle = 0.3;
        assert!(black_hole(&i, &[0, 1]).is_none());
        i.cpus[0].idle = 0.0;
        i.cpus[0].ordo_os = 0.1;
        assert!(black_hole(&i, &[0, 1]).is_none());
        // An idle CPU the plane may not use: said, with the setting that keeps it off.
        i.cpus[0].ordo_os = 0.9;
        assert!(black_hole(&i, &[0]).unwrap().message.contains("the Cores setting"));
        // Spread work is healthy.
        i.cpus[0].ordo_os = 0.5;
        i.cpus[1].ordo_os = 0.5;
        assert!(black_hole(&i, &[0, 1]).is_none());
        // One peer's work is serial by design: not judged.
        i.cpus[0].ordo_os = 0.9;
        i.cpus[1].ordo_os = 0.0;
        assert!(all(&i, &[0, 1], 1).iter().all(|w| w.detector != Detector::BlackHole));
        assert!(all(&i, &[0, 1], 2).iter().any(|w| w.detector == Detector::BlackHole));
    }

    #[test]
    fn accounting_says_which_way_the_clocks_part() {
        let mut i = interval();
        let thread = |ordo: f64, waited: f64, os: f64| ThreadFigures {
            name: "queue0".into(),
            tid: 7,
            cpu: Some(0),
            ordo_cores: ordo,
            os_cores: os,
            waited,
            stage_cores: [0.0; 6],
        };
        i.threads = vec![thread(0.5, 0.0, 0.52)];
        assert!(accounting(&i).is_empty(), "agreeing within the margin");
        i.threads = vec![thread(0.9, 0.3, 0.6)];
        assert!(
            accounting(&i).is_empty(),
            "the waits for the CPU are not the OS's error"
        );
        i.threads = vec![thread(0.3, 0.0, 0.8)];
        assert!(
            accounting(&i).is_empty(),
            "an OS charge above the stages' time is the rule"
        );
        i.threads = vec![thread(0.9, 0.0, 0.4)];
        assert!(accounting(&i)[0].message.contains("0.50 cores the OS counts elsewhere"));
        // A CPU the OS calls idle while Ordo's threads ran there.
        i.threads.clear();
        i.cpus[0].ordo_clock = 0.8;
        i.cpus[0].idle = 0.6;
        let w = accounting(&i);
        assert!(
            w[0].message.contains("CPU 0: Ordo's threads ran 0.80 cores"),
            "{}",
            w[0].message
        );
        assert!(w[0].message.contains("0.40 cores counted as idle"), "{}", w[0].message);
    }
}
