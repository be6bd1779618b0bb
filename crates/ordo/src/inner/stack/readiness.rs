//! What wakes the stack, as one descriptor: an epoll set of everything the stack waits on
//! (the plane's inbox, the attach socket, each application's socket with what the stack
//! wants of it now) and a timer for the stack's next deadline. The plane's thread that runs
//! the stack waits on it with its other descriptors ([`crate::port::InnerRead::wait_fd`]).
//!
//! Registrations are level-triggered, and each says only what the stack can act on now (an
//! application's bytes while the send buffer has room), so that a ready descriptor the stack
//! cannot serve does not keep waking it. A descriptor the stack watches is removed from the
//! set before it is closed ([`Watched`]'s drop): the kernel keeps a registration while the
//! file lives, and an application holding another copy of the file would otherwise keep
//! waking the set with a descriptor the stack no longer has.

use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Events as poll and epoll both number them (EPOLLIN == POLLIN, EPOLLOUT == POLLOUT).
pub const READABLE: u32 = libc::EPOLLIN as u32;
pub const WRITABLE: u32 = libc::EPOLLOUT as u32;
/// Only the other end's hang-up (always reported once a descriptor is registered at all).
pub const HANG_UP: u32 = libc::EPOLLHUP as u32;

/// The epoll set and the stack's timer.
pub struct Readiness {
    epoll: Arc<OwnedFd>,
    timer: OwnedFd,
    /// When the timer fires, if armed.
    armed: Option<Instant>,
}

impl Readiness {
    pub fn new() -> io::Result<Readiness> {
        // SAFETY: epoll_create1 and timerfd_create have no memory-safety preconditions; the
        // results are checked before use.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made, owned by nothing else.
        let epoll = Arc::new(unsafe { OwnedFd::from_raw_fd(epoll) });
        // SAFETY: as above.
        let timer = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if timer < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        let timer = unsafe { OwnedFd::from_raw_fd(timer) };
        let readiness = Readiness {
            epoll,
            timer,
            armed: None,
        };
        readiness.add_lasting(readiness.timer.as_raw_fd())?;
        Ok(readiness)
    }

    /// The descriptor that is readable while anything registered is ready.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Registers `fd` for reading for as long as the set lives: for descriptors that outlive
    /// it (the plane's inboxes, the service's own).
    pub fn add_lasting(&self, fd: RawFd) -> io::Result<()> {
        ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, READABLE)
    }

    /// The descriptors ready now, and for what: a turn serves those (and the ones it could
    /// not register) instead of asking each of the stack's descriptors with a system call.
    pub fn ready(&self) -> Ready {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; READY_BATCH];
        // SAFETY: room for READY_BATCH events; no wait.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                READY_BATCH as libc::c_int,
                0,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return Ready::everything();
        };
        let mut fds: Vec<(RawFd, u32)> = events[..n].iter().map(|e| (e.u64 as RawFd, e.events)).collect();
        fds.sort_unstable();
        Ready {
            fds,
            // A full batch may have left some out.
            all: n == READY_BATCH,
        }
    }

    /// What registers descriptors in the set, for their owner to keep.
    pub fn watcher(&self) -> Watcher {
        Watcher {
            epoll: self.epoll.clone(),
        }
    }

    /// Makes the set readable at `deadline` (None: no deadline). The timer is set again only
    /// when the deadline comes before the one it is set for: a later one finds the set woken
    /// early, and sets it then.
    pub fn arm(&mut self, deadline: Option<Instant>) {
        let now = Instant::now();
        if self.armed.is_some_and(|a| a <= now) {
            // Due: disarmed, which also clears an expiry counted already (timerfd_settime
            // resets the count), rather than read: by the kernel's clock it may not have
            // fired yet, and an expiry after a read, with no timer set again, would leave
            // the set readable for ever.
            self.set(Duration::ZERO);
        }
        let Some(deadline) = deadline else { return };
        if self.armed.is_some_and(|a| a <= deadline) {
            return;
        }
        // At least a nanosecond: a zero time disarms the timer.
        let wait = deadline.saturating_duration_since(now).max(Duration::from_nanos(1));
        self.set(wait);
    }

    /// Sets the timer to fire once after `wait` (zero: disarms it).
    fn set(&mut self, wait: Duration) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: a valid itimerspec for our timerfd; the old value is not asked for.
        if unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } == 0 {
            self.armed = (!wait.is_zero()).then(|| Instant::now() + wait);
        }
    }
}

/// Ready descriptors taken from the set at once: beyond this, a turn asks every descriptor.
const READY_BATCH: usize = 256;

/// The descriptors the set found ready at the start of a turn. Registrations are
/// level-triggered, so one that becomes ready later wakes the set again.
pub struct Ready {
    /// Sorted by descriptor.
    fds: Vec<(RawFd, u32)>,
    /// Everything may be ready (the set could not say).
    all: bool,
}

impl Ready {
    /// Every descriptor may be ready: each is asked, as without a set.
    pub fn everything() -> Ready {
        Ready {
            fds: Vec::new(),
            all: true,
        }
    }

    /// Whether `fd` was found ready for any of `events`, or in a state that answers any call
    /// at once (an error, a hang-up).
    fn has(&self, fd: RawFd, events: u32) -> bool {
        if self.all {
            return true;
        }
        let always = (libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32;
        match self.fds.binary_search_by_key(&fd, |&(f, _)| f) {
            Ok(i) => self.fds[i].1 & (events | always) != 0,
            Err(_) => false,
        }
    }
}

/// Registers descriptors in a [`Readiness`] set.
#[derive(Clone)]
pub struct Watcher {
    epoll: Arc<OwnedFd>,
}

impl Watcher {
    /// Wraps `inner`, registered for nothing yet (see [`Watched::want`]).
    pub fn watch<T: AsRawFd>(&self, inner: T) -> Watched<T> {
        Watched {
            inner,
            epoll: self.epoll.clone(),
            events: 0,
        }
    }
}

/// A descriptor of the stack's, in the set with the events the stack wants of it now.
pub struct Watched<T: AsRawFd> {
    inner: T,
    epoll: Arc<OwnedFd>,
    /// The events registered; 0: not in the set.
    events: u32,
}

impl<T: AsRawFd> Watched<T> {
    /// Registers the descriptor for `events` (a system call only when they change). None at
    /// all takes it out of the set, so that not even its hang-up wakes the stack.
    pub fn want(&mut self, events: u32) {
        if events == self.events {
            return;
        }
        let op = match (self.events, events) {
            (0, _) => libc::EPOLL_CTL_ADD,
            (_, 0) => libc::EPOLL_CTL_DEL,
            _ => libc::EPOLL_CTL_MOD,
        };
        // A descriptor epoll cannot take (none the stack holds) stays out of the set: the
        // stack still serves it at each of its turns, woken by the others.
        if ctl(self.epoll.as_raw_fd(), op, self.inner.as_raw_fd(), events).is_ok() {
            self.events = events;
        }
    }
}

impl<T: AsRawFd> Watched<T> {
    /// Whether the descriptor may be ready for any of `events` now: found so at the turn's
    /// start, or not registered for them (then only a call can tell).
    pub fn may_be(&self, ready: &Ready, events: u32) -> bool {
        // A registered descriptor's hang-up is reported whatever it is registered for.
        let registered = if self.events == 0 { 0 } else { self.events | HANG_UP };
        registered & events != events || ready.has(self.inner.as_raw_fd(), events)
    }
}

impl<T: AsRawFd> Drop for Watched<T> {
    fn drop(&mut self) {
        // Before the descriptor closes (the fields drop after this): see the module's note.
        self.want(0);
    }
}

impl<T: AsRawFd> Deref for Watched<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsRawFd> DerefMut for Watched<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

impl<T: AsRawFd> AsRawFd for Watched<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

fn ctl(epoll: RawFd, op: libc::c_int, fd: RawFd, events: u32) -> io::Result<()> {
    let mut event = libc::epoll_event { events, u64: fd as u64 };
    // SAFETY: a valid epoll_event for the call (ignored by EPOLL_CTL_DEL).
    if unsafe { libc::epoll_ctl(epoll, op, fd, &mut event) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// Whether `fd` is readable within `ms` milliseconds (0: now).
    fn ready_within(fd: RawFd, ms: libc::c_int) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    fn readable(fd: RawFd) -> bool {
        ready_within(fd, 0)
    }

    #[test]
    fn the_set_is_readable_for_what_is_wanted_only() {
        let r = Readiness::new().unwrap();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut w = r.watcher().watch(ours);
        theirs.write_all(b"x").unwrap();
        assert!(!readable(r.fd()), "not registered yet");
        w.want(READABLE);
        assert!(readable(r.fd()));
        w.want(WRITABLE | HANG_UP);
        assert!(readable(r.fd()), "a socket with room is writable");
        w.want(0);
        assert!(!readable(r.fd()), "out of the set");
    }

    #[test]
    fn a_dropped_descriptor_leaves_the_set_though_its_file_lives_on() {
        let r = Readiness::new().unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let copy = ours.try_clone().unwrap();
        let mut w = r.watcher().watch(ours);
        w.want(HANG_UP);
        drop(theirs);
        assert!(readable(r.fd()), "hung up");
        drop(w);
        assert!(!readable(r.fd()), "the copy keeps the file, not the registration");
        drop(copy);
    }

    #[test]
    fn a_turn_sees_which_descriptors_are_ready_and_asks_those_it_could_not_register() {
        let r = Readiness::new().unwrap();
        let (a, mut a_peer) = UnixStream::pair().unwrap();
        let (b, _b_peer) = UnixStream::pair().unwrap();
        let (c, _c_peer) = UnixStream::pair().unwrap();
        let mut a = r.watcher().watch(a);
        let mut b = r.watcher().watch(b);
        let c = r.watcher().watch(c);
        a.want(READABLE);
        b.want(READABLE);
        a_peer.write_all(b"x").unwrap();
        let ready = r.ready();
        assert!(a.may_be(&ready, READABLE), "a has a byte");
        assert!(!a.may_be(&ready, HANG_UP), "and no hang-up");
        assert!(!b.may_be(&ready, READABLE), "b has nothing");
        assert!(c.may_be(&ready, READABLE), "c is not registered: only a read can tell");
        assert!(
            b.may_be(&Ready::everything(), READABLE),
            "a set that could not say: every one is asked"
        );
        drop(a_peer);
        let ready = r.ready();
        assert!(a.may_be(&ready, HANG_UP), "a's other end closed");
    }

    #[test]
    fn the_timer_wakes_the_set_at_the_earliest_deadline() {
        let mut r = Readiness::new().unwrap();
        r.arm(Some(Instant::now() + Duration::from_secs(60)));
        r.arm(Some(Instant::now() + Duration::from_millis(20)));
        assert!(!readable(r.fd()));
        assert!(ready_within(r.fd(), 5_000), "woken by the earlier deadline");
        r.arm(None);
        assert!(!readable(r.fd()), "read once it fired");
        r.arm(Some(Instant::now()));
        assert!(ready_within(r.fd(), 5_000), "a deadline now wakes it at once");
    }
}
