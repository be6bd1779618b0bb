//! The data plane's I/O through the kernel: a TUN device on the inner side, UDP sockets on
//! the outer side, and the threads that read them in batches.

use super::batch::{self, Datagram};
use super::offload;
use super::pipeline::{DataPlane, InboundBatch, Io, Job};
use super::tun::Tun;
use super::udp::Sockets;
use super::{canonical, Device, MAX_PACKET};
use ordo_proto::messages::DATA_HEADER_LEN;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

/// The inner packet of an accepted (batch, packet, length).
fn inner(run: &[InboundBatch], (bi, pi, len): (usize, usize, usize)) -> &[u8] {
    &run[bi].packets[pi].data[DATA_HEADER_LEN..DATA_HEADER_LEN + len]
}

pub struct KernelIo {
    pub tun: Tun,
    /// Replaced when the listen port changes.
    pub sockets: RwLock<Arc<Sockets>>,
}

impl KernelIo {
    pub fn sockets(&self) -> Arc<Sockets> {
        self.sockets.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Io for KernelIo {
    /// Segments of one TCP flow are coalesced into single writes where the device takes
    /// virtio-net headers.
    fn write_inner(&self, plane: &DataPlane<Self>, run: &mut [InboundBatch], accepted: &[(usize, usize, usize)]) {
        let c = &plane.counters;
        let write = |bytes: &[u8], packets: usize| {
            c.tun_writes.fetch_add(1, Ordering::Relaxed);
            if self.tun.write(bytes).is_err() {
                c.tun_write_errors.fetch_add(packets as u64, Ordering::Relaxed);
            }
        };
        if !self.tun.has_vnet_hdr() {
            for &a in accepted {
                write(inner(run, a), 1);
            }
            return;
        }
        let plan = {
            let packets: Vec<&[u8]> = accepted.iter().map(|&a| inner(run, a)).collect();
            offload::plan(&packets)
        };
        for w in plan {
            match w {
                offload::Write::Single(k) => {
                    let (bi, pi, len) = accepted[k];
                    // The message header before the packet is spent: the virtio-net header goes there.
                    let data = &mut run[bi].packets[pi].data;
                    let at = DATA_HEADER_LEN - offload::VNET_HDR_LEN;
                    offload::PLAIN.write(&mut data[at..DATA_HEADER_LEN]);
                    write(&data[at..DATA_HEADER_LEN + len], 1);
                }
                offload::Write::Coalesced(a, b) => {
                    let segments: Vec<&[u8]> = accepted[a..b].iter().map(|&x| inner(run, x)).collect();
                    c.tun_coalesced_packets.fetch_add((b - a) as u64, Ordering::Relaxed);
                    write(&offload::coalesce(&segments), b - a);
                }
            }
        }
    }

    fn send_outer(&self, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        let sockets = self.sockets();
        sockets
            .socket_for(to)
            .and_then(|(s, to)| batch::send_batch(s, to, payloads, &sockets.gso))
            .unwrap_or(0)
    }
}

/// The receive stage of one socket: batches of datagrams into the data plane.
pub fn receive_loop(device: Arc<Device>, sock_index: usize, generation: u64, jobs: crossbeam_channel::Sender<Job>) {
    let plane = device.plane.clone();
    let me = plane.stats.register_thread(&format!("receive{sock_index}"));
    let sockets = plane.io.sockets();
    let sock = if sock_index == 0 {
        &sockets.v4
    } else {
        sockets.v6.as_ref().expect("present")
    };
    let mut rx = batch::Receiver::new(MAX_PACKET);
    let mut datagrams: Vec<Datagram> = Vec::with_capacity(batch::BATCH);
    loop {
        datagrams.clear();
        let r = rx.recv(sock, &mut datagrams);
        if device.stopped() || device.socket_generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let Ok(truncated) = r else { continue };
        for d in &mut datagrams {
            d.src = canonical(d.src);
        }
        if !plane.dispatch_inbound(&mut datagrams, truncated, &jobs, &me) {
            return;
        }
    }
}

/// The read stage: batches of packets from the TUN device into the data plane.
pub fn read_loop(device: Arc<Device>, jobs: crossbeam_channel::Sender<Job>) {
    let plane = device.plane.clone();
    let me = plane.stats.register_thread("read");
    // A TSO read brings up to 64 KB behind its virtio-net header.
    let mut scratch = vec![0u8; MAX_PACKET + 1 + offload::VNET_HDR_LEN];
    let mut packets: Vec<Vec<u8>> = Vec::with_capacity(batch::BATCH);
    while !device.stopped() {
        packets.clear();
        if let Err(e) = plane
            .io
            .tun
            .read_batch(&mut scratch, &mut packets, batch::BATCH, DATA_HEADER_LEN)
        {
            device.shutdown(&format!("TUN device {} is gone ({e})", plane.io.tun.name()));
            return;
        }
        if !packets.is_empty() && !plane.dispatch_outbound(&mut packets, &jobs, &me) {
            return;
        }
    }
}
