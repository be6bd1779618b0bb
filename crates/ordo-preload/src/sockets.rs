//! The tunnel's sockets this process holds, by the inode of the Unix socket that stands in
//! for each. Keyed by inode, not by descriptor number: a dup'ed or inherited descriptor is the
//! same socket, and a closed number reused for another file is not (no hook on close needed).

use std::cell::Cell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Sockets remembered; the oldest is forgotten beyond (only its names are lost: reads and
/// writes go through the kernel descriptor whatever the table says).
const MAX: usize = 4096;
/// The table is pruned of sockets the process no longer holds (there is no hook on close)
/// when it reaches this length, and again each time it doubles since: a program that opens
/// and closes connections for ever keeps a table of about what it holds, each look-up (a
/// scan) short, and pays for a prune (a look at each of its descriptors) rarely.
const PRUNE_FROM: usize = 64;
/// The table's length after its last prune.
static PRUNED_TO: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy)]
pub struct TunnelSocket {
    pub inode: u64,
    /// The family the application created the socket with (names are reported in it).
    pub family: i32,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
    /// A non-blocking connect not yet answered: the connection to the service its answer
    /// will come on (the table owns it; closed once the answer is read).
    pub pending: Option<i32>,
    /// The failed connect's errno, for SO_ERROR once, when the answer was read before the
    /// program asked for it (0: none).
    pub error: i32,
    /// A listening socket: accept takes connections from the service over it.
    pub listening: bool,
    /// A UDP socket: its stand-in's records are its datagrams.
    pub datagram: bool,
    /// An unconnected UDP socket (bound in the stack): its records carry addresses, those the
    /// program sends starting with this marker (`ordo_attach::SendHeader`).
    pub marker: Option<[u8; ordo_attach::MARKER_LEN]>,
    /// Such a socket bound to 0.0.0.0 or :: that has its kernel socket too (the service
    /// relays it): it reaches the host's networks as well as the tunnel.
    pub host: bool,
}

impl TunnelSocket {
    /// A connected (or connecting) socket's entry, of the family the program made it with;
    /// the other fields as most sockets have them (struct update syntax sets the rest).
    pub fn new(inode: u64, family: i32, local: Option<SocketAddr>, remote: Option<SocketAddr>) -> TunnelSocket {
        TunnelSocket {
            inode,
            family,
            local,
            remote,
            pending: None,
            error: 0,
            listening: false,
            datagram: false,
            marker: None,
            host: false,
        }
    }
}

/// Kernel sockets bound to a tunnel address, not yet listening: the kernel never saw the
/// bind (the address is not the host's), so it is kept here until listen.
static BOUND: Mutex<Vec<(u64, SocketAddr)>> = Mutex::new(Vec::new());

pub fn bound(inode: u64, addr: SocketAddr) {
    let mut b = BOUND.lock().unwrap_or_else(|p| p.into_inner());
    b.retain(|(i, _)| *i != inode);
    if b.len() >= MAX {
        b.remove(0);
    }
    b.push((inode, addr));
}

/// The tunnel address the socket of `inode` was bound to.
pub fn bound_to(inode: u64) -> Option<SocketAddr> {
    let b = BOUND.lock().unwrap_or_else(|p| p.into_inner());
    b.iter().find(|(i, _)| *i == inode).map(|(_, a)| *a)
}

pub fn forget_bound(inode: u64) {
    BOUND
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(i, _)| *i != inode);
}

static TABLE: Mutex<Vec<TunnelSocket>> = Mutex::new(Vec::new());

thread_local! {
    /// Whether this thread holds the table's lock: a hook that a signal handler runs on it
    /// then must not wait for the lock, which would never come free.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// The table under its lock, this thread marked as holding it from before it asks for the
/// lock until after it has let go (so that no signal handler on it finds the mark off while
/// the lock is this thread's).
struct Table(Option<std::sync::MutexGuard<'static, Vec<TunnelSocket>>>);

impl Table {
    fn lock() -> Table {
        HOLDING.with(|h| h.set(true));
        Table(Some(TABLE.lock().unwrap_or_else(|p| p.into_inner())))
    }

    /// The table, unless this thread holds it already (a signal handler's hook, run inside
    /// one of this module's own calls).
    fn lock_unless_held() -> Option<Table> {
        if HOLDING.with(|h| h.get()) {
            return None;
        }
        Some(Table::lock())
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        self.0 = None;
        HOLDING.with(|h| h.set(false));
    }
}

impl std::ops::Deref for Table {
    type Target = Vec<TunnelSocket>;
    fn deref(&self) -> &Vec<TunnelSocket> {
        self.0.as_deref().expect("the guard lives until the drop")
    }
}

impl std::ops::DerefMut for Table {
    fn deref_mut(&mut self) -> &mut Vec<TunnelSocket> {
        self.0.as_deref_mut().expect("the guard lives until the drop")
    }
}

/// The table, if its lock is free: for an exec hook, which must neither wait nor allocate
/// (between fork and exec, a lock another thread held at the fork stays held). None when
/// another thread holds it.
pub fn try_table() -> Option<std::sync::MutexGuard<'static, Vec<TunnelSocket>>> {
    match TABLE.try_lock() {
        Ok(t) => Some(t),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// The inode of `fd` if it is a socket.
pub fn socket_inode(fd: i32) -> Option<u64> {
    // SAFETY: stat is plain data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return None;
    }
    Some(st.st_ino)
}

/// How many of the table's entries are UDP sockets, kept with the table under its lock: the
/// send and receive hooks skip the look-up (a system call) while there are none, as for a
/// program that has only kernel sockets.
static DATAGRAMS: AtomicUsize = AtomicUsize::new(0);

/// Whether the table holds any UDP socket.
pub fn any_datagram() -> bool {
    DATAGRAMS.load(Ordering::Acquire) > 0
}

/// Keeps [`DATAGRAMS`] true to the table after `f` changed it.
fn counted<R>(t: &mut Vec<TunnelSocket>, f: impl FnOnce(&mut Vec<TunnelSocket>) -> R) -> R {
    let r = f(t);
    DATAGRAMS.store(t.iter().filter(|e| e.datagram).count(), Ordering::Release);
    r
}

/// Descriptor numbers below which [`ADDRESSED`] keeps a slot each.
const NUMBERED: usize = 4096;

/// A descriptor number's unconnected tunnel UDP socket: the inode of the socket last put
/// there (0: none) and its family.
struct Slot {
    inode: AtomicU64,
    family: AtomicI32,
}

/// Descriptor numbers that may be unconnected tunnel UDP sockets (set when one is put in
/// place; a number closed and reused keeps its slot, and the inode then differs). read and
/// recv, which every program calls on every kind of file, look at a number's slot, without
/// a lock and without allocating: they may run in a signal handler, which may have
/// interrupted this very thread inside the table's lock. A copy made by dup, dup2, dup3 or
/// fcntl gets the original's slot from those hooks; higher numbers are looked up in the
/// table while any such socket exists.
static ADDRESSED: [Slot; NUMBERED] = [const {
    Slot {
        inode: AtomicU64::new(0),
        family: AtomicI32::new(0),
    }
}; NUMBERED];
static ANY_ADDRESSED: AtomicUsize = AtomicUsize::new(0);

fn slot(fd: i32) -> Option<&'static Slot> {
    usize::try_from(fd).ok().and_then(|n| ADDRESSED.get(n))
}

/// Marks `fd` as an unconnected tunnel UDP socket, the one of `inode`, made with `family`.
pub fn mark_addressed(fd: i32, inode: u64, family: i32) {
    ANY_ADDRESSED.fetch_add(1, Ordering::Release);
    if let Some(slot) = slot(fd) {
        // The family first: whoever reads the new inode reads its family.
        slot.family.store(family, Ordering::Release);
        slot.inode.store(inode, Ordering::Release);
    }
}

/// `copy` made from `fd` (a dup): marked as `fd` is. (A slot left from a closed socket is
/// copied harmlessly: the copy's inode is not the one in it.)
pub fn mark_copy(fd: i32, copy: i32) {
    if ANY_ADDRESSED.load(Ordering::Acquire) == 0 {
        return;
    }
    let (inode, family) = match slot(fd) {
        Some(from) => (from.inode.load(Ordering::Acquire), from.family.load(Ordering::Acquire)),
        None => match lookup(fd).filter(|t| t.marker.is_some()) {
            Some(t) => (t.inode, t.family),
            None => return,
        },
    };
    if inode != 0 {
        mark_addressed(copy, inode, family);
    }
}

/// What the receive hooks know of `fd` without the table.
pub enum Addressed {
    /// Not an unconnected tunnel UDP socket.
    No,
    /// One, made with this family.
    Family(i32),
    /// A number beyond the slots: ask the table.
    LookUp,
}

/// Whether `fd` is an unconnected tunnel UDP socket: a look at its slot and, if the slot is
/// set, fstat for the descriptor's inode. No lock, no allocation.
pub fn addressed(fd: i32) -> Addressed {
    if ANY_ADDRESSED.load(Ordering::Acquire) == 0 {
        return Addressed::No;
    }
    let Some(slot) = slot(fd) else {
        return if fd >= 0 { Addressed::LookUp } else { Addressed::No };
    };
    let inode = slot.inode.load(Ordering::Acquire);
    if inode == 0 || socket_inode(fd) != Some(inode) {
        return Addressed::No;
    }
    Addressed::Family(slot.family.load(Ordering::Acquire))
}

pub fn remember(s: TunnelSocket) {
    let len = Table::lock().len();
    if len >= PRUNE_FROM.max(2 * PRUNED_TO.load(Ordering::Relaxed)) {
        prune();
    }
    let mut t = Table::lock();
    counted(&mut t, |t| {
        t.retain(|e| e.inode != s.inode);
        if t.len() >= MAX {
            if let Some(control) = t.remove(0).pending {
                // SAFETY: the table owned this descriptor; it is forgotten with its entry.
                unsafe { libc::close(control) };
            }
        }
        t.push(s);
    });
}

/// Forgets the sockets the process no longer holds. Only entries already in the table
/// before the process's descriptors are looked at can go: one remembered meanwhile (by
/// another thread) is kept, held or not.
fn prune() {
    let before: HashSet<u64> = {
        let t = Table::lock();
        t.iter().map(|e| e.inode).collect()
    };
    // Without /proc, nothing is known to be closed.
    let Some(held) = held_sockets() else { return };
    let held: HashSet<u64> = held.into_iter().map(|(_, inode)| inode).collect();
    let mut t = Table::lock();
    counted(&mut t, |t| retain_held(t, &before, &held));
    PRUNED_TO.store(t.len(), Ordering::Relaxed);
}

/// Keeps the entries of `t` whose sockets are `held`, and those not in `before`.
fn retain_held(t: &mut Vec<TunnelSocket>, before: &HashSet<u64>, held: &HashSet<u64>) {
    t.retain(|e| {
        let keep = held.contains(&e.inode) || !before.contains(&e.inode);
        if let (false, Some(control)) = (keep, e.pending) {
            // SAFETY: the table owned this descriptor; it is forgotten with its entry.
            unsafe { libc::close(control) };
        }
        keep
    })
}

/// This process's open descriptors that are sockets, with their inodes; None if they cannot
/// be listed (no /proc).
pub fn held_sockets() -> Option<Vec<(i32, u64)>> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect();
    Some(fds.into_iter().filter_map(|fd| Some((fd, socket_inode(fd)?))).collect())
}

/// Forgets the socket of `inode` (the library's own, closed).
pub fn forget(inode: u64) {
    let mut t = Table::lock();
    counted(&mut t, |t| t.retain(|e| e.inode != inode));
}

/// The entry of `inode`, if any.
pub fn lookup_inode(inode: u64) -> Option<TunnelSocket> {
    let t = Table::lock_unless_held()?;
    t.iter().find(|e| e.inode == inode).copied()
}

/// The tunnel socket `fd` refers to, if any. None too from a signal handler that
/// interrupted this thread inside the table's lock (a connected tunnel UDP socket's source
/// is then not reported; an unconnected one's number below the slots needs no look-up).
pub fn lookup(fd: i32) -> Option<TunnelSocket> {
    let inode = socket_inode(fd)?;
    let t = Table::lock_unless_held()?;
    t.iter().find(|e| e.inode == inode).copied()
}

/// Runs `f` on the entry of `inode` under the table's lock (`f` must not call back into this
/// module); None if there is no such entry.
pub fn update<R>(inode: u64, f: impl FnOnce(&mut TunnelSocket) -> R) -> Option<R> {
    let mut t = Table::lock();
    counted(&mut t, |t| t.iter_mut().find(|e| e.inode == inode).map(f))
}

/// The entries still waiting for a connect's answer.
pub fn pending() -> Vec<TunnelSocket> {
    let t = Table::lock();
    t.iter().filter(|e| e.pending.is_some()).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// What a signal handler's read or recv needs: an unconnected tunnel socket known by its
    /// slot while this very thread holds the table's lock (where waiting would never end),
    /// and a look-up there that answers rather than waits.
    #[test]
    fn receive_look_ups_answer_inside_the_tables_lock() {
        let (udp, _service) = UnixStream::pair().unwrap();
        let (other, _o) = UnixStream::pair().unwrap();
        let fd = udp.as_raw_fd();
        let inode = socket_inode(fd).unwrap();
        remember(TunnelSocket {
            datagram: true,
            marker: Some([7; ordo_attach::MARKER_LEN]),
            ..TunnelSocket::new(inode, libc::AF_INET6, None, None)
        });
        mark_addressed(fd, inode, libc::AF_INET6);
        // SAFETY: dup of our own descriptor, closed below.
        let copy = unsafe { libc::dup(fd) };
        mark_copy(fd, copy);
        {
            let _held = Table::lock();
            assert!(matches!(addressed(fd), Addressed::Family(libc::AF_INET6)));
            assert!(matches!(addressed(copy), Addressed::Family(libc::AF_INET6)));
            assert!(matches!(addressed(other.as_raw_fd()), Addressed::No));
            assert!(lookup(fd).is_none(), "no wait for a lock this thread holds");
        }
        assert_eq!(lookup(fd).map(|t| t.inode), Some(inode));
        // The number closed and reused by another socket: its slot's inode is not the new one's.
        // SAFETY: our own copy, closed once.
        unsafe { libc::close(copy) };
        // SAFETY: dup2 onto the number just freed; closed below.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), copy) }, copy);
        assert!(matches!(addressed(copy), Addressed::No));
        // SAFETY: as above.
        unsafe { libc::close(copy) };
        forget(inode);
    }

    #[test]
    fn a_prune_keeps_what_is_held_and_what_came_meanwhile() {
        let (a, _a) = UnixStream::pair().unwrap();
        let (b, _b) = UnixStream::pair().unwrap();
        let (ia, ib) = (
            socket_inode(a.as_raw_fd()).unwrap(),
            socket_inode(b.as_raw_fd()).unwrap(),
        );
        let held: HashSet<u64> = held_sockets().unwrap().into_iter().map(|(_, i)| i).collect();
        assert!(
            held.contains(&ia) && held.contains(&ib),
            "the process's sockets are listed"
        );
        drop(b);
        let held: HashSet<u64> = held_sockets().unwrap().into_iter().map(|(_, i)| i).collect();
        assert!(held.contains(&ia) && !held.contains(&ib), "a closed one is not");
        let entry = |inode| TunnelSocket::new(inode, libc::AF_INET, None, None);
        // ib closed; 7 was never held but came after the look at the descriptors.
        let mut t = vec![entry(ia), entry(ib), entry(7)];
        let before: HashSet<u64> = [ia, ib].into();
        retain_held(&mut t, &before, &held);
        let left: Vec<u64> = t.iter().map(|e| e.inode).collect();
        assert_eq!(left, vec![ia, 7]);
    }
}
