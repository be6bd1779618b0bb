//! The threads that move packets from the ports into the data plane, and the one that runs
//! its timers. Each takes the plane and a [`Stop`] token, never the device, and returns why it
//! ended ([`Exit`]); [`start`] starts the ones the plane's plan asks for, whatever its ports.
//!
//! - [`queue_loop`] (inline, auto): one queue's outer and inner halves, waited on together on
//!   the queue's own CPU; every batch is dispatched and, for peers not spread, run to
//!   completion right here.
//! - [`receive_loop`] and [`read_loop`] (pool, threaded): one outer half, or the inner side,
//!   each feeding the pools.
//! - [`timer_loop`]: the protocol's timers and, once per placement interval, the rebalance.

use crate::placement::INTERVAL as PLACEMENT_INTERVAL;
use crate::plane::{pin, DataPlane};
use crate::port::{InnerPort, InnerRead, OuterPort, OuterReceive, PacketBuf, BATCH, RECEIVE_WAIT};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

/// Packets a queue thread reads from its inner queue in one turn: room for two whole TSO
/// packets of 64 KB (45 segments each) and a third begun, where [`BATCH`] stopped after the
/// first. Each turn costs a wait and a send call (BENCHMARKS.md, "Queue thread read batch").
/// The packets of one turn are sealed before the thread looks at its outer halves again.
pub const READ_BATCH: usize = 4 * BATCH;
/// Longest a thread waits for packets before it looks at its stop token again.
const IDLE_WAIT_MS: libc::c_int = RECEIVE_WAIT.as_millis() as libc::c_int;

/// Longest the timer thread sleeps, so that housekeeping (the inner side's MTU, the caller's
/// own checks) runs regularly.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(250);

/// Asks the threads to finish; they notice within [`IDLE_WAIT_MS`] at most. The first request
/// names why, for whoever waits on the stop to report.
#[derive(Default)]
pub struct Stop {
    requested: AtomicBool,
    reason: Mutex<Option<String>>,
    signal: (Mutex<bool>, Condvar),
}

impl Stop {
    /// Requests the stop because of `why`; true if this call was the first to.
    pub fn request(&self, why: &str) -> bool {
        if self.requested.swap(true, Ordering::SeqCst) {
            return false;
        }
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_string());
        let (m, c) = &self.signal;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
        c.notify_all();
        true
    }

    /// Why the stop was requested (None: it was not).
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Waits for the stop at most `timeout`; true if it was requested.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let (m, c) = &self.signal;
        let stopped = m.lock().unwrap_or_else(|p| p.into_inner());
        let (stopped, _) = (c.wait_timeout_while(stopped, timeout, |s| !*s)).unwrap_or_else(|p| p.into_inner());
        *stopped
    }

    /// Waits until the stop is requested.
    pub fn wait(&self) {
        let (m, c) = &self.signal;
        let stopped = m.lock().unwrap_or_else(|p| p.into_inner());
        let _stopped = c.wait_while(stopped, |s| !*s).unwrap_or_else(|p| p.into_inner());
    }
}

/// Why a thread ended.
#[derive(Debug)]
pub enum Exit {
    /// The stop was requested, or the plane's pools are gone (it is stopping).
    Stopped,
    /// The inner port failed for good (a TUN device deleted under us).
    InnerGone(io::Error),
}

/// Starts the threads the plane's plan asks for, each pinned where the plan puts it: a queue
/// thread per queue (inline, auto), or the read stage and a receive stage per outer half
/// (pool, threaded); and the timer thread, which runs `housekeeping` at least every
/// [`HOUSEKEEPING_INTERVAL`] and stops everything when it names a reason. A thread whose inner
/// side is gone requests the stop with that reason. The plane's pools must be started
/// (`DataPlane::start`); the handles end once the stop is requested and the pools stopped.
pub fn start<I: InnerPort, O: OuterPort>(
    plane: &Arc<DataPlane<I, O>>,
    stop: &Arc<Stop>,
    housekeeping: impl FnMut() -> Option<String> + Send + 'static,
) -> io::Result<Vec<JoinHandle<()>>> {
    let plan = &plane.plan;
    let mut threads = Vec::new();
    if plan.model.has_queues() {
        for (q, &cpu) in plan.queues.iter().enumerate() {
            threads.push(spawn_io(plane, stop, format!("queue{q}"), vec![cpu], move |p, s| {
                queue_loop(p, q, s)
            })?);
        }
    } else {
        let io_cpus = if plan.explicit {
            plan.io_cpus.clone()
        } else {
            Vec::new()
        };
        threads.push(spawn_io(plane, stop, "read".into(), io_cpus.clone(), read_loop)?);
        // One receive thread per outer half (address family): each follows the port to new
        // descriptors when they change (a new listen port).
        for (i, rx) in plane.outer.receivers(0).into_iter().enumerate() {
            let name = format!("receive{i}");
            threads.push(spawn_io(plane, stop, name.clone(), io_cpus.clone(), move |p, s| {
                receive_loop(p, rx, &name, s)
            })?);
        }
    }
    let (plane, stop) = (plane.clone(), stop.clone());
    threads.push(
        thread::Builder::new()
            .name("ordo-timers".into())
            .spawn(move || timer_loop(&plane, &stop, housekeeping))?,
    );
    Ok(threads)
}

/// Spawns the I/O thread `ordo-NAME` on `cpus` (none: wherever the scheduler puts it).
fn spawn_io<I: InnerPort, O: OuterPort>(
    plane: &Arc<DataPlane<I, O>>,
    stop: &Arc<Stop>,
    name: String,
    cpus: Vec<usize>,
    body: impl FnOnce(&Arc<DataPlane<I, O>>, &Stop) -> Exit + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let (plane, stop) = (plane.clone(), stop.clone());
    thread::Builder::new().name(format!("ordo-{name}")).spawn(move || {
        pin(&cpus);
        if let Exit::InnerGone(e) = body(&plane, &stop) {
            stop.request(&format!("the inner side is gone ({e})"));
        }
    })
}

/// The timer thread: the protocol's timers as they fall due, the placement once per
/// interval, and `housekeeping`, until the stop is requested or housekeeping requests it.
pub fn timer_loop<I: InnerPort, O: OuterPort>(
    plane: &Arc<DataPlane<I, O>>,
    stop: &Stop,
    mut housekeeping: impl FnMut() -> Option<String>,
) {
    let mut last_placement = Instant::now();
    loop {
        plane.tick(Instant::now(), SystemTime::now());
        if last_placement.elapsed() >= PLACEMENT_INTERVAL {
            last_placement = Instant::now();
            let transmits = plane.rebalance(last_placement, SystemTime::now());
            plane.send_transmits(0, transmits);
        }
        if let Some(why) = housekeeping() {
            stop.request(&why);
        }
        let wait = (plane.until_next_deadline())
            .unwrap_or(HOUSEKEEPING_INTERVAL)
            .min(HOUSEKEEPING_INTERVAL);
        if stop.wait_timeout(wait) {
            return;
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits until one of `fds` is readable or `timeout_ms` passed; returns how many are (their
/// `revents` set). With a timeout of 0 the kernel only looks, without putting the thread on
/// the descriptors' wait queues.
fn wait(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> usize {
    // SAFETY: a live array of pollfds of the length passed.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    rc.max(0) as usize
}

/// Which half of the queue a descriptor being waited on belongs to.
#[derive(Clone, Copy)]
enum Half {
    Outer(usize),
    Inner,
}

/// One queue of the inline and auto models, on its own CPU: its outer halves and its inner
/// half, waited on together; every batch is dispatched and (for peers not spread) decrypted
/// or encrypted and delivered right here, to this queue's halves of the ports.
pub fn queue_loop<I: InnerPort, O: OuterPort>(plane: &Arc<DataPlane<I, O>>, queue: usize, stop: &Stop) -> Exit {
    let ctx = plane.register(&format!("queue{queue}"), queue);
    let mut outer = plane.outer.receivers(queue);
    let mut inner = plane.inner.reader(queue);
    let mut packets: Vec<PacketBuf> = Vec::with_capacity(READ_BATCH);
    let mut datagrams = Vec::with_capacity(BATCH);
    let (mut fds, mut halves) = (Vec::new(), Vec::new());
    // Whether the last turn found work: then the next wait only looks (timeout 0) instead of
    // waiting. A busy queue thread so pays no wait-queue registration per turn, and packets
    // that arrive while it works wake nobody.
    let mut busy = false;
    while !stop.is_requested() {
        // Asked each turn: a port may replace its descriptors (a new listen port).
        fds.clear();
        halves.clear();
        for (i, rx) in outer.iter_mut().enumerate() {
            if let Some(fd) = rx.wait_fd() {
                fds.push(pollfd(fd));
                halves.push(Half::Outer(i));
            }
        }
        if let Some(fd) = inner.wait_fd() {
            fds.push(pollfd(fd));
            halves.push(Half::Inner);
        }
        let idle = !busy;
        let ready = wait(&mut fds, if busy { 0 } else { IDLE_WAIT_MS });
        busy = false;
        if ready == 0 && !idle {
            continue;
        }
        for (pfd, half) in fds.iter().zip(&halves) {
            // After an idle wait that found nothing, every half is asked all the same (once
            // per idle wait): a half may hold what no descriptor announces, as a fault
            // injector holds delayed datagrams until they are due.
            if pfd.revents == 0 && ready > 0 {
                continue;
            }
            match *half {
                Half::Outer(i) => {
                    datagrams.clear();
                    let Ok(truncated) = outer[i].recv(&mut datagrams) else {
                        continue;
                    };
                    if !datagrams.is_empty() || truncated > 0 {
                        busy = true;
                        if !plane.dispatch_inbound(&mut datagrams, truncated, &ctx) {
                            return Exit::Stopped;
                        }
                    }
                }
                Half::Inner => {
                    packets.clear();
                    if let Err(e) = inner.read(&mut packets, READ_BATCH) {
                        return Exit::InnerGone(e);
                    }
                    if !packets.is_empty() {
                        busy = true;
                        if !plane.dispatch_outbound(&mut packets, &ctx) {
                            return Exit::Stopped;
                        }
                    }
                }
            }
        }
    }
    Exit::Stopped
}

/// The receive stage of one outer half (pool models): batches of datagrams into the plane,
/// waiting inside the port's receive when nothing waits (one system call a turn with kernel
/// UDP, where a wait and a receive would be two).
pub fn receive_loop<I: InnerPort, O: OuterPort>(
    plane: &Arc<DataPlane<I, O>>,
    mut rx: O::Receive,
    name: &str,
    stop: &Stop,
) -> Exit {
    let ctx = plane.register(name, 0);
    let mut datagrams = Vec::with_capacity(BATCH);
    while !stop.is_requested() {
        datagrams.clear();
        let truncated = rx.recv_waiting(&mut datagrams).unwrap_or(0);
        if datagrams.is_empty() && truncated == 0 {
            continue;
        }
        if !plane.dispatch_inbound(&mut datagrams, truncated, &ctx) {
            return Exit::Stopped;
        }
    }
    Exit::Stopped
}

/// The read stage (pool models): batches of inner packets into the plane.
pub fn read_loop<I: InnerPort, O: OuterPort>(plane: &Arc<DataPlane<I, O>>, stop: &Stop) -> Exit {
    let ctx = plane.register("read", 0);
    let mut reader = plane.inner.reader(0);
    let mut packets: Vec<PacketBuf> = Vec::with_capacity(BATCH);
    while !stop.is_requested() {
        packets.clear();
        if let Err(e) = reader.read(&mut packets, BATCH) {
            return Exit::InnerGone(e);
        }
        if packets.is_empty() {
            idle(reader.wait_fd());
            continue;
        }
        if !plane.dispatch_outbound(&mut packets, &ctx) {
            return Exit::Stopped;
        }
    }
    Exit::Stopped
}

/// Waits for `fd` to become readable (or for nothing, when there is no descriptor), at most
/// [`IDLE_WAIT_MS`].
fn idle(fd: Option<RawFd>) {
    match fd {
        Some(fd) => {
            wait(&mut [pollfd(fd)], IDLE_WAIT_MS);
        }
        None => std::thread::sleep(Duration::from_millis(IDLE_WAIT_MS as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_stop_wakes_its_waiters_once() {
        let stop = Arc::new(Stop::default());
        assert!(!stop.wait_timeout(Duration::from_millis(10)));
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                stop.wait();
                t.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(stop.request("first"), "the first request");
        assert!(!stop.request("second"), "a second one changes nothing");
        assert!(waiter.join().unwrap() < Duration::from_secs(5));
        assert!(stop.is_requested() && stop.wait_timeout(Duration::from_secs(5)));
        assert_eq!(stop.reason().as_deref(), Some("first"));
    }
}
