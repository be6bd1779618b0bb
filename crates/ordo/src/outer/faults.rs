//! Fault injection for any outer port: [`FaultInjector`] wraps a port and, in each of its
//! receive halves, drops, duplicates, reorders, delays and truncates what arrives, each with
//! its own probability, from a seeded generator so that a failing run can be replayed.
//! The faults can be changed while the port runs ([`FaultInjector::set_faults`]), so that a
//! test can let a handshake through and then count every fault against what the plane did.
//! Sending and steering pass through untouched. Delayed datagrams come out at the half's
//! first receive after they are due; a thread that is idle looks within its idle wait.

use crate::port::{Counter, Datagram, OuterPort, OuterReceive, SteeringException};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to do to received datagrams: each a probability per datagram, from 0 to 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub seed: u64,
    pub drop: f64,
    pub duplicate: f64,
    /// Swapped with the datagram after it in the same receive.
    pub reorder: f64,
    /// Held back for [`Faults::delay_by`].
    pub delay: f64,
    pub delay_by: Duration,
    /// Cut to a random shorter length.
    pub truncate: f64,
}

/// What the injector did, by kind.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub dropped: AtomicU64,
    pub duplicated: AtomicU64,
    pub reordered: AtomicU64,
    pub delayed: AtomicU64,
    pub truncated: AtomicU64,
}

pub struct FaultInjector<P> {
    port: P,
    /// The seed the receive halves' generators start from.
    seed: u64,
    faults: Arc<Mutex<Faults>>,
    counts: Arc<FaultCounts>,
}

impl<P: OuterPort> FaultInjector<P> {
    pub fn new(port: P, faults: Faults) -> Self {
        FaultInjector {
            port,
            seed: faults.seed,
            faults: Arc::new(Mutex::new(faults)),
            counts: Arc::default(),
        }
    }

    /// Changes the faults from each half's next receive on; the generators go on from where
    /// they are (the seed is the first one's).
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
    }

    /// The wrapped port.
    pub fn port(&self) -> &P {
        &self.port
    }

    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }
}

impl<P: OuterPort> OuterPort for FaultInjector<P> {
    type Receive = FaultyReceive<P::Receive>;

    fn receivers(&self, queue: usize) -> Vec<Self::Receive> {
        (self.port.receivers(queue).into_iter().enumerate())
            .map(|(i, inner)| FaultyReceive {
                inner,
                faults: self.faults.clone(),
                // One stream per half, so that halves do not share (and race for) one.
                rng: ChaCha20Rng::seed_from_u64(self.seed ^ ((queue as u64) << 8 | i as u64)),
                held: Vec::new(),
                counts: self.counts.clone(),
            })
            .collect()
    }

    fn send(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        self.port.send(queue, to, payloads)
    }

    fn steer(&self, exceptions: &[SteeringException]) {
        self.port.steer(exceptions)
    }

    fn listen_port(&self) -> u16 {
        self.port.listen_port()
    }

    fn rebind(&self, port: u16, fwmark: u32) -> io::Result<()> {
        self.port.rebind(port, fwmark)
    }

    fn set_fwmark(&self, mark: u32, old: u32) -> io::Result<()> {
        self.port.set_fwmark(mark, old)
    }

    fn shutdown(&self) {
        self.port.shutdown()
    }

    fn describe(&self) -> String {
        format!("{} with faults", self.port.describe())
    }

    fn counters(&self) -> Vec<Counter> {
        let c = &self.counts;
        let mut v = self.port.counters();
        for (name, n) in [
            ("fault_dropped", &c.dropped),
            ("fault_duplicated", &c.duplicated),
            ("fault_reordered", &c.reordered),
            ("fault_delayed", &c.delayed),
            ("fault_truncated", &c.truncated),
        ] {
            v.push(Counter::new(name, n.load(Ordering::Relaxed)));
        }
        v
    }
}

/// A datagram held back until `due`.
struct Held {
    due: Instant,
    datagram: Datagram,
}

pub struct FaultyReceive<R> {
    inner: R,
    faults: Arc<Mutex<Faults>>,
    rng: ChaCha20Rng,
    held: Vec<Held>,
    counts: Arc<FaultCounts>,
}

impl<R> FaultyReceive<R> {
    /// True with probability `p`.
    fn roll(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

impl<R: OuterReceive> OuterReceive for FaultyReceive<R> {
    fn wait_fd(&mut self) -> Option<RawFd> {
        self.inner.wait_fd()
    }

    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        let mut arrived = Vec::new();
        let truncated = self.inner.recv(&mut arrived)?;
        self.apply(arrived, out);
        Ok(truncated)
    }

    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        let mut arrived = Vec::new();
        // Held datagrams due soon must not wait behind an idle half.
        let truncated = if self.held.is_empty() {
            self.inner.recv_waiting(&mut arrived)?
        } else {
            self.inner.recv(&mut arrived)?
        };
        self.apply(arrived, out);
        Ok(truncated)
    }
}

impl<R> FaultyReceive<R> {
    /// Puts what `arrived` into `out` through the faults, with the held datagrams now due.
    fn apply(&mut self, arrived: Vec<Datagram>, out: &mut Vec<Datagram>) {
        let f = *self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let c = self.counts.clone();
        let now = Instant::now();
        let from = out.len();
        for mut d in arrived {
            if self.roll(f.drop) {
                c.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.roll(f.truncate) && !d.data.is_empty() {
                let len = self.rng.next_u32() as usize % d.data.len();
                d.data.truncate(len);
                c.truncated.fetch_add(1, Ordering::Relaxed);
            }
            if self.roll(f.delay) {
                c.delayed.fetch_add(1, Ordering::Relaxed);
                self.held.push(Held {
                    due: now + f.delay_by,
                    datagram: d,
                });
                continue;
            }
            if self.roll(f.duplicate) {
                c.duplicated.fetch_add(1, Ordering::Relaxed);
                out.push(Datagram {
                    data: d.data.clone(),
                    src: d.src,
                });
            }
            out.push(d);
        }
        for i in from..out.len().saturating_sub(1) {
            if self.roll(f.reorder) {
                c.reordered.fetch_add(1, Ordering::Relaxed);
                out.swap(i, i + 1);
            }
        }
        let (due, still): (Vec<Held>, Vec<Held>) = self.held.drain(..).partition(|h| h.due <= now);
        self.held = still;
        out.extend(due.into_iter().map(|h| h.datagram));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outer::memory::MemoryOuter;

    fn run(faults: Faults) -> (Vec<Vec<u8>>, Vec<Counter>) {
        let (a_addr, b_addr) = ("192.0.2.1:1".parse().unwrap(), "192.0.2.2:2".parse().unwrap());
        let (a, b) = MemoryOuter::pair(a_addr, 1, b_addr, 1).unwrap();
        let b = FaultInjector::new(b, faults);
        let mut half = b.receivers(0).remove(0);
        let payloads: Vec<Vec<u8>> = (0..200u8).map(|i| vec![1, i, i, i]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        a.send(0, b_addr, &refs);
        let mut got = Vec::new();
        for _ in 0..20 {
            half.recv(&mut got).unwrap();
        }
        (got.into_iter().map(|d| d.data.to_vec()).collect(), b.counters())
    }

    fn count(counters: &[Counter], name: &str) -> u64 {
        counters.iter().find(|c| c.name == name).map_or(0, |c| c.value)
    }

    #[test]
    fn faults_happen_as_often_as_asked_and_replay_with_the_seed() {
        let none = run(Faults::default()).0;
        assert_eq!(none.len(), 200, "no faults: everything, in order");
        assert!(none.windows(2).all(|w| w[0][1] < w[1][1]));
        let faults = Faults {
            seed: 7,
            drop: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            truncate: 0.1,
            ..Default::default()
        };
        let (got, c) = run(faults);
        for kind in [
            "fault_dropped",
            "fault_duplicated",
            "fault_reordered",
            "fault_truncated",
        ] {
            assert!((5..=40).contains(&count(&c, kind)), "{kind}: {}", count(&c, kind));
        }
        let expected = 200 - count(&c, "fault_dropped") + count(&c, "fault_duplicated");
        assert_eq!(got.len() as u64, expected);
        assert!(got.iter().any(|d| d.len() < 4), "some were truncated");
        assert!(got
            .windows(2)
            .any(|w| w[0].len() == 4 && w[1].len() == 4 && w[0][1] > w[1][1]));
        assert_eq!(run(faults).0, got, "the same seed, the same faults");
        // Delayed ones come out once due, after those that were not.
        let delayed = Faults {
            seed: 1,
            delay: 0.5,
            delay_by: Duration::ZERO,
            ..Default::default()
        };
        let (got, c) = run(delayed);
        assert_eq!(got.len(), 200);
        assert!(count(&c, "fault_delayed") > 50);
        assert!(got.windows(2).any(|w| w[0][1] > w[1][1]), "held ones arrive later");
    }
}
