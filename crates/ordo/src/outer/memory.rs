//! The outer port in memory. A port alone counts what the plane sends and takes datagrams
//! injected as if from the network (`ordo bench`); two ports made as a [`MemoryOuter::pair`]
//! are joined, so that what one sends to the other's address arrives there, from its own
//! (two planes talking, in tests). Datagrams are steered to a queue by receiver index and
//! the plane's steering exceptions, as the kernel UDP port's program does; each queue's
//! receive half waits on an eventfd.

use crate::host::wakeup::Inbox;
use crate::port::{Counter, Datagram, OuterPort, OuterReceive, SteeringException, BATCH, RECEIVE_WAIT};
use bytes::BytesMut;
use ordo_proto::steering::{queue_of_index, receiver_of_message};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Datagrams each queue holds for the plane before more are dropped (and counted), as a
/// socket's receive buffer would.
const INBOX: usize = 4096;

pub struct MemoryOuter {
    shared: Arc<Shared>,
}

struct Shared {
    addr: SocketAddr,
    queues: Vec<Inbox<Datagram>>,
    exceptions: Mutex<Vec<SteeringException>>,
    steer_calls: AtomicU64,
    /// The other end of a pair.
    link: OnceLock<Weak<Shared>>,
    sent: AtomicU64,
    sent_bytes: AtomicU64,
    /// Sent to an address nobody is at.
    unrouted: AtomicU64,
}

impl Shared {
    fn new(addr: SocketAddr, queues: usize) -> io::Result<Shared> {
        Ok(Shared {
            addr,
            queues: (0..queues.max(1))
                .map(|_| Inbox::new(INBOX))
                .collect::<io::Result<_>>()?,
            exceptions: Mutex::new(Vec::new()),
            steer_calls: AtomicU64::new(0),
            link: OnceLock::new(),
            sent: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
            unrouted: AtomicU64::new(0),
        })
    }

    /// The queue a datagram is steered to: by an exception for its receiver index, else by
    /// the rule; initiations (no index of ours) to queue 0.
    fn queue_of(&self, data: &[u8]) -> usize {
        let n = self.queues.len() as u32;
        let Some(receiver) = receiver_of_message(data) else {
            return 0;
        };
        let exceptions = self.exceptions.lock().unwrap_or_else(|p| p.into_inner());
        let queue = match exceptions.iter().find(|e| e.receiver == receiver) {
            Some(e) => e.queue % n,
            None => queue_of_index(receiver, n),
        };
        queue as usize
    }

    fn arrive(&self, from: SocketAddr, data: &[u8]) -> bool {
        let queue = self.queue_of(data);
        self.queues[queue].push(Datagram {
            data: BytesMut::from(data),
            src: from,
        })
    }
}

impl MemoryOuter {
    /// A port at `addr` with `queues` queues whose sends are only counted.
    pub fn new(addr: SocketAddr, queues: usize) -> io::Result<MemoryOuter> {
        Ok(MemoryOuter {
            shared: Arc::new(Shared::new(addr, queues)?),
        })
    }

    /// Two ports joined: what either sends to the other's address arrives there.
    pub fn pair(
        a: SocketAddr,
        a_queues: usize,
        b: SocketAddr,
        b_queues: usize,
    ) -> io::Result<(MemoryOuter, MemoryOuter)> {
        let (a, b) = (MemoryOuter::new(a, a_queues)?, MemoryOuter::new(b, b_queues)?);
        let _ = a.shared.link.set(Arc::downgrade(&b.shared));
        let _ = b.shared.link.set(Arc::downgrade(&a.shared));
        Ok((a, b))
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A datagram arrives from `from`, as from the network; false if its queue is full.
    pub fn inject(&self, from: SocketAddr, data: &[u8]) -> bool {
        self.shared.arrive(from, data)
    }

    /// Datagrams sent so far, and their bytes.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
    }

    pub fn sent_bytes(&self) -> u64 {
        self.shared.sent_bytes.load(Ordering::Relaxed)
    }

    /// How often the plane set steering exceptions, and the last it set.
    pub fn steer_calls(&self) -> u64 {
        self.shared.steer_calls.load(Ordering::Relaxed)
    }

    pub fn exceptions(&self) -> Vec<SteeringException> {
        self.shared.exceptions.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl OuterPort for MemoryOuter {
    type Receive = MemoryReceive;

    fn receivers(&self, queue: usize) -> Vec<MemoryReceive> {
        vec![MemoryReceive {
            shared: self.shared.clone(),
            queue: queue % self.shared.queues.len(),
        }]
    }

    fn send(&self, _queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        let s = &self.shared;
        s.sent.fetch_add(payloads.len() as u64, Ordering::Relaxed);
        let bytes: usize = payloads.iter().map(|p| p.len()).sum();
        s.sent_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if let Some(far) = s.link.get().and_then(Weak::upgrade) {
            if far.addr == to {
                // A full queue drops, as a full socket buffer does: sent all the same.
                for p in payloads {
                    far.arrive(s.addr, p);
                }
            } else {
                s.unrouted.fetch_add(payloads.len() as u64, Ordering::Relaxed);
            }
        }
        payloads.len()
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn steer(&self, exceptions: &[SteeringException]) {
        self.shared.steer_calls.fetch_add(1, Ordering::Relaxed);
        *self.shared.exceptions.lock().unwrap_or_else(|p| p.into_inner()) = exceptions.to_vec();
    }

    fn counters(&self) -> Vec<Counter> {
        let s = &self.shared;
        let overflows = s.queues.iter().map(|q| q.overflows.load(Ordering::Relaxed)).sum();
        vec![
            Counter::new("memory_outer_sent", self.sent()),
            Counter::new("drop_memory_outer_unrouted", s.unrouted.load(Ordering::Relaxed)),
            Counter::new("drop_memory_outer_inbox_full", overflows),
            Counter::level("queues", s.queues.len() as u64),
        ]
    }
}

/// One queue's inbox, read by one thread.
pub struct MemoryReceive {
    shared: Arc<Shared>,
    queue: usize,
}

impl OuterReceive for MemoryReceive {
    fn wait_fd(&mut self) -> Option<RawFd> {
        Some(self.shared.queues[self.queue].fd())
    }

    fn recv(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        self.shared.queues[self.queue].take(out, BATCH);
        Ok(0)
    }

    fn recv_waiting(&mut self, out: &mut Vec<Datagram>) -> io::Result<usize> {
        self.shared.queues[self.queue].take_waiting(out, BATCH, RECEIVE_WAIT);
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::messages::TYPE_DATA;
    use ordo_proto::steering::index_for_queue;

    fn data(receiver: u32) -> Vec<u8> {
        let mut m = vec![TYPE_DATA, 0, 0, 0];
        m.extend_from_slice(&receiver.to_le_bytes());
        m.extend_from_slice(&[0; 24]);
        m
    }

    #[test]
    fn a_pair_carries_datagrams_to_their_queue_and_steers_by_exception() {
        let (a_addr, b_addr) = ("192.0.2.1:1".parse().unwrap(), "192.0.2.2:2".parse().unwrap());
        let (a, b) = MemoryOuter::pair(a_addr, 1, b_addr, 4).unwrap();
        let mut halves: Vec<MemoryReceive> = (0..4).flat_map(|q| b.receivers(q)).collect();
        let index = index_for_queue(0x1234_5600, 2, 4);
        assert_eq!(a.send(0, b_addr, &[&data(index)]), 1);
        let mut got = Vec::new();
        halves[2].recv(&mut got).unwrap();
        assert_eq!((got.len(), got[0].src), (1, a_addr), "on the index's queue, from A");
        b.steer(&[SteeringException {
            receiver: index,
            queue: 3,
        }]);
        a.send(0, b_addr, &[&data(index)]);
        halves[3].recv(&mut got).unwrap();
        assert_eq!(got.len(), 2, "the exception wins");
        // Sent elsewhere: counted, not delivered.
        a.send(0, "192.0.2.9:9".parse().unwrap(), &[&data(index)]);
        assert!(a.counters().contains(&Counter::new("drop_memory_outer_unrouted", 1)));
        assert_eq!((a.sent(), b.steer_calls()), (3, 1));
    }
}
