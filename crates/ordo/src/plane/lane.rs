//! A lane: one peer's work in one direction, kept in arrival order while the crypto of its
//! batches runs on any worker, in any order.
//!
//! This is where Ordo avoids execution order inversion (Mounah et al., "The Impact of Kernel Asynchronous APIs on the
//! Performance of a Kernel VPN", SYSTOR 2025). The dispatcher takes a
//! ticket for each batch as it arrives. A worker that finishes a batch files it under its
//! ticket; if that ticket is the lane's head and nobody is delivering, the same worker becomes
//! the deliverer and delivers every consecutive finished batch, then checks once more for
//! batches finished meanwhile. No thread waits for the head, no separate delivery thread runs
//! ahead of the crypto, and delivery starts only when there is something to deliver: a
//! "wasted wake-up" cannot happen by construction, and is still counted if it ever does.

use std::collections::BTreeMap;
use std::sync::Mutex;

struct State<T> {
    /// Next ticket to hand out.
    next_ticket: u64,
    /// Ticket of the next batch to deliver.
    head: u64,
    /// Finished batches waiting for the ones before them.
    finished: BTreeMap<u64, T>,
    /// A worker is delivering this lane now.
    delivering: bool,
}

pub struct Lane<T> {
    state: Mutex<State<T>>,
}

impl<T> Default for Lane<T> {
    fn default() -> Self {
        Lane {
            state: Mutex::new(State {
                next_ticket: 0,
                head: 0,
                finished: BTreeMap::new(),
                delivering: false,
            }),
        }
    }
}

/// The outcome of finishing a batch.
pub enum Finish<T> {
    /// The caller is now the lane's deliverer: deliver these, in order, then call
    /// [`Lane::continue_delivery`] until it returns None.
    Deliver(Vec<T>),
    /// Someone else delivers (or an earlier batch is still in crypto): nothing to do.
    Filed,
}

impl<T> Lane<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket for the next batch, taken in arrival order.
    pub fn ticket(&self) -> u64 {
        let mut s = self.lock();
        let t = s.next_ticket;
        s.next_ticket += 1;
        t
    }

    fn take_run(s: &mut State<T>) -> Vec<T> {
        let mut run = Vec::new();
        while let Some(item) = s.finished.remove(&s.head) {
            run.push(item);
            s.head += 1;
        }
        run
    }

    /// Files a finished batch under its ticket.
    pub fn finish(&self, ticket: u64, item: T) -> Finish<T> {
        let mut s = self.lock();
        s.finished.insert(ticket, item);
        if s.delivering || ticket != s.head {
            return Finish::Filed;
        }
        s.delivering = true;
        Finish::Deliver(Self::take_run(&mut s))
    }

    /// After delivering a run: the batches that finished meanwhile, or None (and the caller
    /// is no longer the deliverer).
    pub fn continue_delivery(&self) -> Option<Vec<T>> {
        let mut s = self.lock();
        let run = Self::take_run(&mut s);
        if run.is_empty() {
            s.delivering = false;
            None
        } else {
            Some(run)
        }
    }

    /// Files a finished batch without becoming its deliverer: for a lane with a dedicated
    /// delivery thread (the threaded model), which collects with [`Lane::take_ready`].
    pub fn file(&self, ticket: u64, item: T) {
        self.lock().finished.insert(ticket, item);
    }

    /// The finished batches at the head, in order (empty if the head is still in crypto).
    /// Only for a lane whose single deliverer is a dedicated thread.
    pub fn take_ready(&self) -> Vec<T> {
        Self::take_run(&mut self.lock())
    }

    /// Batches that were ticketed and not yet delivered.
    pub fn in_flight(&self) -> u64 {
        let s = self.lock();
        s.next_ticket - s.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn out_of_order_finishes_deliver_in_order() {
        let lane = Lane::default();
        let t: Vec<u64> = (0..4).map(|_| lane.ticket()).collect();
        assert!(matches!(lane.finish(t[2], 'c'), Finish::Filed));
        assert!(matches!(lane.finish(t[1], 'b'), Finish::Filed));
        match lane.finish(t[0], 'a') {
            Finish::Deliver(run) => assert_eq!(run, vec!['a', 'b', 'c']),
            Finish::Filed => panic!("the head's finisher delivers"),
        }
        // While 'a'..'c' are being delivered, 'd' finishes: it is filed, and picked up by the
        // deliverer's next check rather than by a second deliverer.
        assert!(matches!(lane.finish(t[3], 'd'), Finish::Filed));
        assert_eq!(lane.continue_delivery(), Some(vec!['d']));
        assert_eq!(lane.continue_delivery(), None);
        assert_eq!(lane.in_flight(), 0);
    }

    #[test]
    fn a_delivery_thread_takes_only_the_ready_head() {
        let lane = Lane::default();
        let (t0, t1) = (lane.ticket(), lane.ticket());
        lane.file(t1, 'b');
        assert!(lane.take_ready().is_empty(), "the head is still in crypto");
        lane.file(t0, 'a');
        assert_eq!(lane.take_ready(), vec!['a', 'b']);
        assert_eq!(lane.in_flight(), 0);
    }

    /// Many workers finishing in random order: every item is delivered exactly once, in ticket
    /// order, and never by two deliverers at the same time.
    #[test]
    fn concurrent_workers_keep_order_and_one_deliverer() {
        let lane = Arc::new(Lane::default());
        let tickets: Vec<u64> = (0..20_000).map(|_| lane.ticket()).collect();
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let delivering = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let work = Arc::new(Mutex::new(tickets));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (lane, delivered, delivering, overlaps, work) = (
                    lane.clone(),
                    delivered.clone(),
                    delivering.clone(),
                    overlaps.clone(),
                    work.clone(),
                );
                std::thread::spawn(move || loop {
                    // Take tickets from either end so finishes arrive out of order.
                    let t = {
                        let mut w = work.lock().unwrap();
                        if w.is_empty() {
                            return;
                        }
                        if w.len() % 3 == 0 { w.pop() } else { Some(w.remove(0)) }.unwrap()
                    };
                    if let Finish::Deliver(mut run) = lane.finish(t, t) {
                        loop {
                            if delivering.swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            delivered.lock().unwrap().extend(run.drain(..));
                            delivering.store(false, Ordering::SeqCst);
                            match lane.continue_delivery() {
                                Some(r) => run = r,
                                None => break,
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let d = delivered.lock().unwrap();
        assert_eq!(d.len(), 20_000);
        assert!(d.windows(2).all(|w| w[0] + 1 == w[1]), "delivered in ticket order");
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    }
}
