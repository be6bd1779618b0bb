//! The inner port over a TUN device: one descriptor per queue (IFF_MULTI_QUEUE), every packet
//! behind a virtio-net header ([`vnet`]) so that the kernel hands over TSO and USO packets
//! whole, which are split in user space, and takes coalesced ones (`crate::packet`). The
//! kernel's own drops for a full queue are read from /proc ([`drops`]).

pub mod device;
pub mod drops;
pub mod vnet;

use crate::packet::coalesce::{self, coalesced_header, Coalesced};
use crate::port::{Counter, DeliveryRun, InnerPort, InnerRead, PacketBuf, MAX_PACKET};
use device::Tun;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vnet::{VnetHdr, PLAIN, VNET_HDR_LEN};

/// Packets each TUN queue holds for its reader (the interface's txqueuelen): 2048 of 1420
/// bytes are 31 ms at 0.75 Gbit/s of standing queue at worst, for senders that do not back
/// off; TCP's TSO packets fill it far less (one entry per 64 KB). The kernel's default of 500
/// overflowed under bursts of small UDP packets while a queue thread waited for its CPU
/// (BENCHMARKS.md, "TUN queue length"). A larger queue set by the user is kept.
const TUN_QUEUE_LEN: u32 = 2048;
/// The MTU a new interface gets: room for the outer IPv6, UDP and WireGuard headers on a
/// 1500-byte link, as wg-quick sets by default.
const DEFAULT_MTU: u32 = 1420;

pub struct TunPort {
    queues: Vec<Arc<Tun>>,
    counters: TunCounters,
}

/// What the TUN port counts as it writes.
#[derive(Default)]
struct TunCounters {
    writes: AtomicU64,
    write_errors: AtomicU64,
    coalesced_packets: AtomicU64,
}

impl TunPort {
    /// Creates the TUN interface `name` with `queues` queues, its MTU and queue length set.
    pub fn create(name: &str, queues: usize) -> io::Result<TunPort> {
        let queues: Vec<Arc<Tun>> = Tun::create_queues(name, queues)?.into_iter().map(Arc::new).collect();
        let _ = queues[0].set_mtu(DEFAULT_MTU);
        if queues[0].tx_queue_len().is_ok_and(|n| n < TUN_QUEUE_LEN) {
            let _ = queues[0].set_tx_queue_len(TUN_QUEUE_LEN);
        }
        Ok(TunPort {
            queues,
            counters: TunCounters::default(),
        })
    }

    pub fn name(&self) -> &str {
        self.queues[0].name()
    }

    fn tun(&self, queue: usize) -> &Tun {
        &self.queues[queue % self.queues.len()]
    }

    /// Writes one packet (behind its virtio-net header where the device has one), counting it.
    fn write_one(&self, tun: &Tun, bytes: &[u8], packets: usize) {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        if tun.write(bytes).is_err() {
            self.counters.write_errors.fetch_add(packets as u64, Ordering::Relaxed);
        }
    }
}

impl InnerPort for TunPort {
    type Read = TunRead;

    fn reader(&self, queue: usize) -> TunRead {
        TunRead {
            tun: self.queues[queue % self.queues.len()].clone(),
            // A TSO read brings up to 64 KB behind its virtio-net header.
            scratch: vec![0u8; MAX_PACKET + 1 + VNET_HDR_LEN],
        }
    }

    /// Runs of one TCP or UDP flow are coalesced into single writes where the device takes
    /// virtio-net headers (UDP only where it took USO).
    fn write(&self, queue: usize, run: &mut DeliveryRun<'_>) {
        let tun = self.tun(queue);
        if !tun.has_vnet_hdr() {
            for i in 0..run.len() {
                self.write_one(tun, run.packet(i), 1);
            }
            return;
        }
        let plan = {
            let packets: Vec<&[u8]> = run.packets().collect();
            coalesce::plan(&packets, tun.has_uso())
        };
        for w in plan {
            match w {
                coalesce::Write::Single(k) => {
                    // The message header before the packet is spent: the virtio-net header
                    // goes there.
                    let bytes = run.with_room(k, VNET_HDR_LEN);
                    PLAIN.write(&mut bytes[..VNET_HDR_LEN]);
                    self.write_one(tun, bytes, 1);
                }
                coalesce::Write::Coalesced(a, b) => {
                    let segments: Vec<&[u8]> = (a..b).map(|i| run.packet(i)).collect();
                    let Coalesced { offload, head } = coalesced_header(&segments);
                    let mut vnet = [0u8; VNET_HDR_LEN];
                    VnetHdr::of(&offload).write(&mut vnet);
                    let from = offload.header_len as usize;
                    let parts: Vec<IoSlice> = [IoSlice::new(&vnet), IoSlice::new(&head)]
                        .into_iter()
                        .chain(segments.iter().map(|s| IoSlice::new(&s[from..])))
                        .collect();
                    let c = &self.counters;
                    c.coalesced_packets.fetch_add((b - a) as u64, Ordering::Relaxed);
                    c.writes.fetch_add(1, Ordering::Relaxed);
                    if tun.write_vectored(&parts).is_err() {
                        c.write_errors.fetch_add((b - a) as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    fn mtu(&self) -> Option<usize> {
        self.queues[0].mtu().ok().map(|m| m as usize)
    }

    fn counters(&self) -> Vec<Counter> {
        let c = &self.counters;
        let tun = &self.queues[0];
        vec![
            Counter::new("drop_tun_write_error", c.write_errors.load(Ordering::Relaxed)),
            Counter::new(
                "drop_tun_malformed",
                self.queues.iter().map(|q| q.malformed_reads()).sum(),
            ),
            // Counted by the kernel before Ordo saw the packet.
            Counter::new(
                "drop_os_tun_queue_full",
                drops::tun_queue_drops(tun.name()).unwrap_or(0),
            ),
            Counter::new("tun_writes", c.writes.load(Ordering::Relaxed)),
            Counter::new("tun_coalesced_packets", c.coalesced_packets.load(Ordering::Relaxed)),
            Counter::level("tun_tso", tun.has_tso() as u64),
            Counter::level("tun_uso", tun.has_uso() as u64),
        ]
    }
}

/// One queue's descriptor, read by one thread.
pub struct TunRead {
    tun: Arc<Tun>,
    scratch: Vec<u8>,
}

impl InnerRead for TunRead {
    fn wait_fd(&mut self) -> Option<RawFd> {
        Some(self.tun.as_raw_fd())
    }

    fn read(&mut self, out: &mut Vec<PacketBuf>, max: usize) -> io::Result<()> {
        self.tun.read_batch(&mut self.scratch, out, max)
    }
}
