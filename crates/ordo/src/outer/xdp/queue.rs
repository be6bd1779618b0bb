//! One AF_XDP socket with its UMEM and rings: the WireGuard datagrams of one NIC queue,
//! received from the frames the XDP program redirected and sent as frames Ordo writes.
//!
//! The UMEM holds [`FRAMES`] frames of 4 KB (32 MB a queue): half lent to the kernel for
//! receiving (the fill ring), half for sending.
//!
//! Wake-ups ([`Binding`]): in zero-copy mode the socket is bound with need_wakeup, and Ordo
//! makes the system call that wakes the driver only when the ring's flag asks for it
//! ([`RingFlags`]). In copy mode it is bound without: the kernel sends only inside a system
//! call anyway and takes fill-ring frames as it copies, and with need_wakeup every poll of
//! the socket (each wait for received frames) would also send what the TX ring holds, under
//! the socket mutex the sending thread takes (`xsk_poll`, net/xdp/xsk.c).

use super::frame::{header_len, parse, write_headers, Path};
use crate::port::Datagram;
use bytes::BytesMut;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use xdp::slab::{HeapSlab, Slab};

/// Frames in a queue's UMEM.
pub const FRAMES: u32 = 8192;
/// Frames kept in the fill ring for the kernel to receive into.
const RECEIVE_FRAMES: usize = FRAMES as usize / 2;
/// Frames received or sent per call.
const BATCH: usize = 64;
/// `SOL_XDP` options (include/uapi/linux/if_xdp.h).
const SOL_XDP: libc::c_int = 283;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;

/// What the kernel counts of a socket: frames it dropped before Ordo saw them
/// (`struct xdp_statistics`, include/uapi/linux/if_xdp.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Statistics {
    /// Dropped for other reasons (a frame longer than a UMEM frame, ...).
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    /// Dropped because the receive ring was full: Ordo did not read fast enough.
    pub rx_ring_full: u64,
    /// Dropped because the fill ring was empty: no frame to receive into.
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

/// Frames the kernel sends per wake-up in copy mode, where it allows more than its default
/// of 32 (`XDP_MAX_TX_SKB_BUDGET`).
const TX_BUDGET: u32 = BATCH as u32;
/// Wake-ups per send at most: enough to empty the ring at the default budget.
const KICKS: usize = 2048 / 32;

/// Has the kernel send what waits in the TX ring. In copy mode each wake-up sends at most a
/// budget of frames and answers EAGAIN while more wait, so it is repeated; in zero-copy mode
/// one starts the driver.
fn kick(fd: RawFd) {
    for _ in 0..KICKS {
        // SAFETY: a send of nothing, which AF_XDP takes as the wake-up; no memory is passed.
        let r = unsafe { libc::sendto(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        if r >= 0 {
            return;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::EINTR) => continue,
            // ENOBUFS and the like: the frames stay queued for the next send's wake-up.
            _ => return,
        }
    }
}

/// Wakes a zero-copy driver that stopped for want of fill-ring frames.
fn wake_fill(fd: RawFd) {
    // SAFETY: a receive of nothing, which AF_XDP takes as the wake-up; no memory is passed.
    unsafe {
        libc::recvfrom(
            fd,
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
}

/// How a socket is bound: the mode, and whether the kernel says when to wake it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub zero_copy: bool,
    pub need_wakeup: bool,
}

impl Binding {
    /// What Ordo binds where the driver allows it.
    pub const ZERO_COPY: Binding = Binding {
        zero_copy: true,
        need_wakeup: true,
    };
    /// What Ordo binds otherwise (see the module's comment).
    pub const COPY: Binding = Binding {
        zero_copy: false,
        need_wakeup: false,
    };
}

/// What a socket bound with need_wakeup asks for at the moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wakeups {
    /// A system call is needed for the kernel to send what the TX ring holds.
    pub tx: bool,
    /// A system call is needed for the driver to take new fill-ring frames.
    pub fill: bool,
}

/// The first page of one ring (producer, consumer and flags words), mapped a second time:
/// the `xdp` crate maps the rings but does not give the flags' address.
struct RingHead {
    base: *mut libc::c_void,
    len: usize,
    flags: *const AtomicU32,
}

impl RingHead {
    /// Maps the ring at `pgoff` of an AF_XDP socket not yet bound (the kernel maps rings
    /// only before the bind), up to its flags word at `flags_at`.
    fn map(fd: RawFd, pgoff: libc::off_t, flags_at: u64) -> io::Result<RingHead> {
        let len = flags_at as usize + std::mem::size_of::<u32>();
        // SAFETY: a new shared mapping of the ring's first bytes; nothing else is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(RingHead {
            base,
            len,
            // SAFETY: `flags_at` lies within the mapping, 4-byte aligned (the kernel's
            // struct xdp_ring puts it at a cache line of its own).
            flags: unsafe { base.byte_add(flags_at as usize) }.cast(),
        })
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: the mapping lives as long as self; the kernel writes the word atomically.
        let flags = unsafe { &*self.flags }.load(Ordering::Acquire);
        flags & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

impl Drop for RingHead {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The flags of the rings Ordo produces into, for a socket bound with need_wakeup.
struct RingFlags {
    fill: RingHead,
    tx: RingHead,
}

impl RingFlags {
    fn map(fd: RawFd) -> io::Result<RingFlags> {
        // SAFETY: xdp_mmap_offsets is plain data, zero a valid value.
        let mut offsets: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `offsets`, a struct of that size.
        let r = unsafe {
            libc::getsockopt(
                fd,
                SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut offsets as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RingFlags {
            fill: RingHead::map(fd, libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t, offsets.fr.flags)?,
            tx: RingHead::map(fd, libc::XDP_PGOFF_TX_RING, offsets.tx.flags)?,
        })
    }
}

/// The producer rings of either kind: the `xdp` crate binds with need_wakeup only a socket
/// whose rings it built as wakable. Ordo makes the wake-ups itself in both cases.
enum FillRing {
    Plain(xdp::FillRing),
    Wakable(xdp::WakableFillRing),
}

impl FillRing {
    /// # Safety
    /// As `xdp::FillRing::enqueue`: the UMEM outlives the socket.
    unsafe fn enqueue(&mut self, umem: &mut xdp::Umem, n: usize) -> usize {
        // SAFETY: as the caller promises.
        unsafe {
            match self {
                FillRing::Plain(r) => r.enqueue(umem, n),
                FillRing::Wakable(r) => r.enqueue(umem, n, false).unwrap_or(0),
            }
        }
    }
}

enum TxRing {
    Plain(xdp::TxRing),
    Wakable(xdp::WakableTxRing),
}

impl TxRing {
    /// # Safety
    /// As `xdp::TxRing::send`: the UMEM outlives the socket.
    unsafe fn send(&mut self, frames: &mut HeapSlab) -> usize {
        // SAFETY: as the caller promises.
        unsafe {
            match self {
                TxRing::Plain(r) => r.send(frames),
                TxRing::Wakable(r) => r.send(frames, false).unwrap_or(0),
            }
        }
    }
}

/// The socket, its rings and its memory, in drop order: the socket and rings go before the
/// UMEM they use.
pub struct XskQueue {
    socket: xdp::socket::XdpSocket,
    fill_ring: FillRing,
    rx_ring: xdp::RxRing,
    completion_ring: xdp::CompletionRing,
    tx_ring: TxRing,
    /// Where the kernel says whether it needs waking; None when bound without need_wakeup.
    ring_flags: Option<RingFlags>,
    umem: xdp::Umem,
    slab: HeapSlab,
    /// Frames given to the kernel to send and not yet given back.
    sending: usize,
    /// Whether a datagram may be a peer's GSO batch to cut ([`super::glued`]): in generic mode.
    split_batches: bool,
    /// Whether the driver fills the UMEM itself (zero-copy), rather than the kernel copying.
    zero_copy: bool,
    /// The frames of the batch being received (kept to spare an allocation a batch).
    received: Vec<xdp::Packet>,
}

// SAFETY: the raw pointers inside (the UMEM's and the rings' mappings, the ring heads Ordo
// maps itself, the frames of the slab and of `received`, which point into the UMEM) all point into memory this struct maps
// and owns; none is tied to a thread, and every access goes through `&mut self`, so the
// queue may move to another thread (the port keeps it behind a mutex). Tested by a queue
// that receives on one thread and sends on another (tests/xdp.rs).
unsafe impl Send for XskQueue {}

impl XskQueue {
    /// A socket on NIC queue `queue` of interface `ifindex`: zero-copy where the driver
    /// offers it, else copy mode.
    pub fn bind(ifindex: u32, queue: u32) -> io::Result<XskQueue> {
        XskQueue::bind_as(ifindex, queue, Binding::ZERO_COPY)
            .or_else(|_| XskQueue::bind_as(ifindex, queue, Binding::COPY))
    }

    /// A socket bound as `binding` says, or the kernel's refusal.
    pub fn bind_as(ifindex: u32, queue: u32, binding: Binding) -> io::Result<XskQueue> {
        let cfg = xdp::umem::UmemCfgBuilder {
            frame_count: FRAMES,
            ..Default::default()
        };
        let umem = xdp::Umem::map(cfg.build().map_err(io::Error::other)?)?;
        let mut builder = xdp::socket::XdpSocketBuilder::new().map_err(io::Error::other)?;
        // The receive side as deep as the frames lent to it: a burst the size of a kernel
        // socket's 4 MB buffer waits in the rings rather than being dropped.
        let rings_cfg = xdp::RingConfigBuilder {
            rx_count: RECEIVE_FRAMES as u32,
            fill_count: RECEIVE_FRAMES as u32,
            ..Default::default()
        }
        .build()
        .map_err(io::Error::other)?;
        let missing = || io::Error::other("the xdp crate built no RX or TX ring");
        let (fill_ring, rx_ring, completion_ring, tx_ring, ring_flags, mut flags) = if binding.need_wakeup {
            let (r, flags) = builder
                .build_wakable_rings(&umem, rings_cfg)
                .map_err(io::Error::other)?;
            let ring_flags = RingFlags::map(builder.as_raw_fd())?;
            let (rx, tx) = (r.rx_ring.ok_or_else(missing)?, r.tx_ring.ok_or_else(missing)?);
            (
                FillRing::Wakable(r.fill_ring),
                rx,
                r.completion_ring,
                TxRing::Wakable(tx),
                Some(ring_flags),
                flags,
            )
        } else {
            let (r, flags) = builder.build_rings(&umem, rings_cfg).map_err(io::Error::other)?;
            let (rx, tx) = (r.rx_ring.ok_or_else(missing)?, r.tx_ring.ok_or_else(missing)?);
            (
                FillRing::Plain(r.fill_ring),
                rx,
                r.completion_ring,
                TxRing::Plain(tx),
                None,
                flags,
            )
        };
        if binding.zero_copy {
            flags.force_zerocopy();
        } else {
            flags.force_copy();
        }
        let socket = builder
            .bind(xdp::nic::NicIndex::new(ifindex), queue, flags)
            .map_err(io::Error::other)?;
        let mut q = XskQueue {
            socket,
            fill_ring,
            rx_ring,
            completion_ring,
            tx_ring,
            ring_flags,
            umem,
            slab: HeapSlab::with_capacity(BATCH),
            sending: 0,
            split_batches: false,
            zero_copy: false,
            received: Vec::with_capacity(BATCH),
        };
        q.zero_copy = super::attach::zero_copy(q.socket.as_raw_fd()).unwrap_or(false);
        // SAFETY: the frames lent stay in this queue's UMEM, which outlives its socket.
        unsafe { q.fill_ring.enqueue(&mut q.umem, RECEIVE_FRAMES) };
        if q.wakeups().is_some_and(|w| w.fill) {
            wake_fill(q.socket.as_raw_fd());
        }
        // Older kernels do not know the option and send 32 frames a wake-up.
        let budget = TX_BUDGET;
        // SAFETY: the kernel reads a u32 of the size given.
        unsafe {
            libc::setsockopt(
                q.socket.as_raw_fd(),
                SOL_XDP,
                XDP_MAX_TX_SKB_BUDGET,
                (&budget as *const u32).cast(),
                4,
            )
        };
        Ok(q)
    }

    /// What the kernel asks of a socket bound with need_wakeup; None for one bound without.
    pub fn wakeups(&self) -> Option<Wakeups> {
        self.ring_flags.as_ref().map(|f| Wakeups {
            tx: f.tx.needs_wakeup(),
            fill: f.fill.needs_wakeup(),
        })
    }

    /// Has each received datagram checked for being several messages glued together (see
    /// [`super::glued`]): for a program in generic mode.
    pub fn split_batches(&mut self, on: bool) {
        self.split_batches = on;
    }

    /// The kernel's counts for this socket.
    pub fn statistics(&self) -> io::Result<Statistics> {
        let mut stats = Statistics::default();
        let mut len = std::mem::size_of::<Statistics>() as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `stats`, a struct of that size.
        let r = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                SOL_XDP,
                XDP_STATISTICS,
                (&mut stats as *mut Statistics).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stats)
    }

    /// Whether the socket runs zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Appends the datagrams received (each payload copied out of its frame, which goes back
    /// to the kernel); returns how many frames were not datagrams of ours (dropped).
    pub fn recv(&mut self, out: &mut Vec<Datagram>) -> usize {
        // SAFETY: the packets go back to this UMEM below, before it can go.
        let n = unsafe { self.rx_ring.recv(&self.umem, &mut self.slab) };
        // The payloads are copied into one buffer per batch, each datagram a slice of it (as
        // a GRO batch is over kernel UDP): one allocation a batch, not one a datagram.
        self.received.clear();
        while let Some(frame) = self.slab.pop_back() {
            self.received.push(frame);
        }
        let bytes = self.received.iter().map(|f| f.len()).sum();
        let mut buffer = BytesMut::with_capacity(bytes);
        let mut malformed = 0;
        for frame in self.received.drain(..) {
            match parse(&frame) {
                Some(r) => {
                    let payload = &frame[r.payload];
                    let mut push = |m: std::ops::Range<usize>| {
                        buffer.extend_from_slice(&payload[m]);
                        out.push(Datagram {
                            data: buffer.split(),
                            src: r.src,
                        });
                    };
                    if self.split_batches {
                        super::glued::messages(payload).for_each(&mut push);
                    } else {
                        push(0..payload.len());
                    }
                }
                None => malformed += 1,
            }
            self.umem.free_packet(frame);
        }
        if n > 0 {
            // SAFETY: as above.
            unsafe { self.fill_ring.enqueue(&mut self.umem, n) };
            // A zero-copy driver that ran out of frames to receive into sleeps until woken.
            if self.wakeups().is_some_and(|w| w.fill) {
                wake_fill(self.socket.as_raw_fd());
            }
        }
        malformed
    }

    /// Sends each payload to `path.to` in a frame of its own; returns how many went (fewer
    /// when the ring or the UMEM is full: the caller counts the rest as dropped).
    pub fn send(&mut self, path: &Path, payloads: &[&[u8]]) -> usize {
        self.complete();
        let hdr = header_len(path);
        let mut queued = 0;
        for chunk in payloads.chunks(BATCH) {
            for p in chunk {
                // SAFETY: the frame goes back to this UMEM through the completion ring, or
                // below when it cannot be sent.
                let Some(mut frame) = (unsafe { self.umem.alloc() }) else {
                    break;
                };
                if frame.adjust_tail((hdr + p.len()) as i32).is_err() {
                    self.umem.free_packet(frame);
                    continue;
                }
                frame[hdr..].copy_from_slice(p);
                if !write_headers(path, &mut frame) {
                    self.umem.free_packet(frame);
                    continue;
                }
                if let Some(back) = self.slab.push_front(frame) {
                    self.umem.free_packet(back);
                }
            }
            let ready = self.slab.len();
            // SAFETY: as above.
            let sent = unsafe { self.tx_ring.send(&mut self.slab) };
            queued += sent;
            self.sending += sent;
            // What the ring did not take goes back.
            while let Some(frame) = self.slab.pop_back() {
                self.umem.free_packet(frame);
            }
            if sent < ready {
                break;
            }
        }
        // Bound without need_wakeup (copy mode), the kernel sends only when asked; with it,
        // a zero-copy driver still busy with the ring needs no system call.
        if queued > 0 && self.wakeups().is_none_or(|w| w.tx) {
            kick(self.socket.as_raw_fd());
        }
        queued
    }

    /// Takes back the frames the kernel has sent.
    fn complete(&mut self) {
        if self.sending > 0 {
            let done = self.completion_ring.dequeue(&mut self.umem, self.sending);
            self.sending -= done;
        }
    }
}

impl AsRawFd for XskQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}
