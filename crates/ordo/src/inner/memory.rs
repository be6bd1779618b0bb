//! The inner port in memory: what a test (or `ordo bench`) injects is what the plane reads,
//! and what the plane writes is counted and, if asked, kept. Each queue's read half waits on
//! an eventfd, so the same threads drive it as drive a TUN device.

use crate::host::wakeup::Inbox;
use crate::port::{Counter, DeliveryRun, InnerPort, InnerRead, PacketBuf};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Packets each queue holds for the plane before an inject is refused.
const INBOX: usize = 4096;

/// A packet the plane wrote, and through which queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub queue: usize,
    pub packet: Vec<u8>,
}

pub struct MemoryInner {
    shared: Arc<Shared>,
}

struct Shared {
    queues: Vec<Inbox<PacketBuf>>,
    /// Whether written packets are kept (tests) or only counted (`ordo bench`).
    keep: bool,
    written: Mutex<Vec<Written>>,
    more_written: Condvar,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
}

impl MemoryInner {
    /// `queues` queues whose written packets are kept, to be taken with
    /// [`MemoryInner::wait_written`].
    pub fn keeping(queues: usize) -> io::Result<MemoryInner> {
        MemoryInner::new(queues, true)
    }

    /// `queues` queues whose written packets are only counted.
    pub fn counting(queues: usize) -> io::Result<MemoryInner> {
        MemoryInner::new(queues, false)
    }

    fn new(queues: usize, keep: bool) -> io::Result<MemoryInner> {
        Ok(MemoryInner {
            shared: Arc::new(Shared {
                queues: (0..queues.max(1))
                    .map(|_| Inbox::new(INBOX))
                    .collect::<io::Result<_>>()?,
                keep,
                written: Mutex::new(Vec::new()),
                more_written: Condvar::new(),
                delivered: AtomicU64::new(0),
                delivered_bytes: AtomicU64::new(0),
            }),
        })
    }

    /// Hands the plane `packet` on `queue`, as the host sending into the tunnel would; false
    /// if that queue is full.
    pub fn inject(&self, queue: usize, packet: &[u8]) -> bool {
        let queues = &self.shared.queues;
        queues[queue % queues.len()].push(PacketBuf::copy_of(packet))
    }

    /// The inner side goes away: the plane's readers fail, as with a deleted TUN device.
    pub fn close(&self) {
        self.shared.queues.iter().for_each(Inbox::close);
    }

    /// Packets written so far, and their bytes.
    pub fn delivered(&self) -> u64 {
        self.shared.delivered.load(Ordering::Relaxed)
    }

    pub fn delivered_bytes(&self) -> u64 {
        self.shared.delivered_bytes.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` written packets are kept or `timeout` passes; takes them all.
    pub fn wait_written(&self, n: usize, timeout: Duration) -> Vec<Written> {
        let deadline = Instant::now() + timeout;
        let mut written = self.shared.written.lock().unwrap_or_else(|p| p.into_inner());
        while written.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            written = (self.shared.more_written.wait_timeout(written, left))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        std::mem::take(&mut *written)
    }
}

impl InnerPort for MemoryInner {
    type Read = MemoryRead;

    fn shutdown(&self) {
        self.close()
    }

    fn reader(&self, queue: usize) -> MemoryRead {
        MemoryRead {
            shared: self.shared.clone(),
            queue: queue % self.shared.queues.len(),
        }
    }

    fn write(&self, queue: usize, run: &mut DeliveryRun<'_>) {
        let s = &self.shared;
        s.delivered.fetch_add(run.len() as u64, Ordering::Relaxed);
        let bytes: usize = run.packets().map(<[u8]>::len).sum();
        s.delivered_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if s.keep {
            let mut written = s.written.lock().unwrap_or_else(|p| p.into_inner());
            written.extend(run.packets().map(|p| Written {
                queue,
                packet: p.to_vec(),
            }));
            s.more_written.notify_all();
        }
    }

    fn counters(&self) -> Vec<Counter> {
        let overflows = self
            .shared
            .queues
            .iter()
            .map(|q| q.overflows.load(Ordering::Relaxed))
            .sum();
        vec![
            Counter::new("memory_inner_delivered", self.delivered()),
            Counter::new("drop_memory_inner_inbox_full", overflows),
        ]
    }
}

/// One queue's inbox, read by one thread.
pub struct MemoryRead {
    shared: Arc<Shared>,
    queue: usize,
}

impl InnerRead for MemoryRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        Some(self.shared.queues[self.queue].fd())
    }

    fn read(&mut self, out: &mut Vec<PacketBuf>, max: usize) -> io::Result<()> {
        let inbox = &self.shared.queues[self.queue];
        if inbox.is_closed() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the inner side was closed"));
        }
        inbox.take(out, max);
        Ok(())
    }
}
