//! Wake-ups for backends that have no descriptor of their own: an eventfd that becomes
//! readable when work is queued, so that a thread can wait on it beside real sockets, and a
//! bounded inbox built on it (the in-memory ports' queues).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// An eventfd: [`WakeUp::ring`] makes it readable, [`WakeUp::clear`] not.
pub struct WakeUp {
    fd: OwnedFd,
}

impl WakeUp {
    pub fn new() -> io::Result<WakeUp> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(WakeUp {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes the 8 bytes of a live u64 to our eventfd. It can only fail if the
        // counter is about to overflow, when it is readable anyway.
        unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Waits until rung (it may have been before), at most `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(libc::c_int::MAX as u128) as libc::c_int;
        // SAFETY: one live pollfd, of the length passed.
        unsafe { libc::poll(&mut p, 1, ms) };
    }

    pub fn clear(&self) {
        let mut n = 0u64;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN (not rung) is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), &mut n as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl AsRawFd for WakeUp {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A bounded queue whose wake-up is readable while it holds anything (or once closed).
pub struct Inbox<T> {
    items: Mutex<VecDeque<T>>,
    capacity: usize,
    wakeup: WakeUp,
    closed: AtomicBool,
    /// Items refused because the inbox was full.
    pub overflows: AtomicU64,
}

impl<T> Inbox<T> {
    pub fn new(capacity: usize) -> io::Result<Inbox<T>> {
        Ok(Inbox {
            items: Mutex::new(VecDeque::new()),
            capacity,
            wakeup: WakeUp::new()?,
            closed: AtomicBool::new(false),
            overflows: AtomicU64::new(0),
        })
    }

    /// Queues `item`; false (counted) if the inbox is full. Only the first item into an
    /// empty inbox rings its wake-up: the others find it readable already, and a busy inbox
    /// saves a system call per item.
    pub fn push(&self, item: T) -> bool {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if items.len() >= self.capacity {
            self.overflows.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        items.push_back(item);
        if items.len() == 1 {
            self.wakeup.ring();
        }
        true
    }

    /// Moves up to `max` items into `out`; the wake-up stays readable while items remain.
    /// Under the lock, as in [`Inbox::push`], the wake-up is readable exactly when items wait
    /// (or the inbox is closed): so only a take that empties it clears it.
    pub fn take(&self, out: &mut Vec<T>, max: usize) {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if items.is_empty() {
            return;
        }
        let n = max.min(items.len());
        out.extend(items.drain(..n));
        if items.is_empty() && !self.is_closed() {
            self.wakeup.clear();
        }
    }

    /// As [`Inbox::take`], but when the inbox is empty, waits for an item (or the close) at
    /// most `timeout` first.
    pub fn take_waiting(&self, out: &mut Vec<T>, max: usize, timeout: Duration) {
        let from = out.len();
        self.take(out, max);
        if out.len() == from && !self.is_closed() {
            self.wakeup.wait(timeout);
            self.take(out, max);
        }
    }

    /// Closes the inbox: its wake-up stays readable, so waiters notice.
    pub fn close(&self) {
        // Under the lock: a take that empties the inbox must not clear this ring.
        let _items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.store(true, Ordering::SeqCst);
        self.wakeup.ring();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    pub fn fd(&self) -> RawFd {
        self.wakeup.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn the_wakeup_is_readable_exactly_while_items_wait() {
        let inbox = Inbox::new(3).unwrap();
        assert!(!readable(inbox.fd()));
        assert!(inbox.push(1) && inbox.push(2) && inbox.push(3));
        assert!(!inbox.push(4), "bounded");
        assert_eq!(inbox.overflows.load(Ordering::Relaxed), 1);
        assert!(readable(inbox.fd()));
        let mut out = Vec::new();
        inbox.take(&mut out, 2);
        assert_eq!(out, [1, 2]);
        assert!(readable(inbox.fd()), "one is left");
        inbox.take(&mut out, 2);
        assert_eq!(out, [1, 2, 3]);
        assert!(!readable(inbox.fd()));
        let t = std::time::Instant::now();
        inbox.take_waiting(&mut out, 2, Duration::from_millis(50));
        assert!(
            out.len() == 3 && t.elapsed() >= Duration::from_millis(40),
            "waited, in vain"
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                inbox.push(4);
            });
            inbox.take_waiting(&mut out, 2, Duration::from_secs(10));
        });
        assert_eq!(out, [1, 2, 3, 4], "woken by the push");
        inbox.close();
        assert!(readable(inbox.fd()) && inbox.is_closed());
    }
}
