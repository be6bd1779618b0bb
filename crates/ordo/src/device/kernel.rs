//! The data plane's I/O through the kernel: a TUN device on the inner side, UDP sockets on
//! the outer side, and the threads that read them in batches.

use super::batch::{self, Datagram};
use super::offload;
use super::pipeline::{DataPlane, InboundBatch, Io};
use super::tun::Tun;
use super::udp::Sockets;
use super::{canonical, Device, MAX_PACKET};
use ordo_proto::messages::DATA_HEADER_LEN;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock, Weak};

/// The inner packet of an accepted (batch, packet, length).
fn inner(run: &[InboundBatch], (bi, pi, len): (usize, usize, usize)) -> &[u8] {
    &run[bi].packets[pi].data[DATA_HEADER_LEN..DATA_HEADER_LEN + len]
}

pub struct KernelIo {
    /// The TUN device's queues, one per data-plane queue.
    pub tun: Vec<Tun>,
    /// The sockets of each queue; replaced when the listen port changes.
    pub sockets: RwLock<Arc<Vec<Sockets>>>,
    pub steered: Mutex<Steered>,
}

/// The steering exceptions attached last, and to which socket group (see `steer_exceptions`).
pub type Steered = (Weak<Vec<Sockets>>, Vec<(u32, u32)>);

impl KernelIo {
    pub fn sockets(&self) -> Arc<Vec<Sockets>> {
        self.sockets.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Io for KernelIo {
    /// Segments of one TCP flow are coalesced into single writes where the device takes
    /// virtio-net headers.
    fn write_inner(
        &self,
        plane: &DataPlane<Self>,
        queue: usize,
        run: &mut [InboundBatch],
        accepted: &[(usize, usize, usize)],
    ) {
        let c = &plane.counters;
        let tun = &self.tun[queue % self.tun.len()];
        let write = |bytes: &[u8], packets: usize| {
            c.tun_writes.fetch_add(1, Ordering::Relaxed);
            if tun.write(bytes).is_err() {
                c.tun_write_errors.fetch_add(packets as u64, Ordering::Relaxed);
            }
        };
        if !tun.has_vnet_hdr() {
            for &a in accepted {
                write(inner(run, a), 1);
            }
            return;
        }
        let plan = {
            let packets: Vec<&[u8]> = accepted.iter().map(|&a| inner(run, a)).collect();
            offload::plan(&packets, tun.has_uso())
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
                    let (head, hdr_len) = offload::coalesced_header(&segments);
                    let parts: Vec<IoSlice> = std::iter::once(IoSlice::new(&head))
                        .chain(segments.iter().map(|s| IoSlice::new(&s[hdr_len..])))
                        .collect();
                    c.tun_writes.fetch_add(1, Ordering::Relaxed);
                    if tun.write_vectored(&parts).is_err() {
                        c.tun_write_errors.fetch_add((b - a) as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Attaches a new steering program when the exceptions or the sockets changed since
    /// the last (new sockets start with none).
    fn steer_exceptions(&self, exceptions: &[(u32, u32)]) {
        let group = self.sockets();
        if group.len() < 2 {
            return;
        }
        let mut steered = self.steered.lock().unwrap_or_else(|p| p.into_inner());
        if steered.0.upgrade().is_some_and(|g| Arc::ptr_eq(&g, &group)) && steered.1 == exceptions {
            return;
        }
        let queues = group.len() as u32;
        let attached = super::steer::attach(&group[0].v4, queues, exceptions).and_then(|()| match &group[0].v6 {
            Some(s) => super::steer::attach(s, queues, exceptions),
            None => Ok(()),
        });
        // On failure the rule still holds: moved peers' datagrams reach their new queue with
        // the move's handshake, as without exceptions. Not retried until the list changes.
        if let Err(e) = attached {
            eprintln!("ordo: steering exceptions not attached: {e}");
        }
        *steered = (Arc::downgrade(&group), exceptions.to_vec());
    }

    fn send_outer(&self, queue: usize, to: SocketAddr, payloads: &[&[u8]]) -> usize {
        let group = self.sockets();
        let sockets = &group[queue % group.len()];
        sockets
            .socket_for(to)
            .and_then(|(s, to)| batch::send_batch(s, to, payloads, &sockets.gso))
            .unwrap_or(0)
    }
}

/// The receive stage of one socket (pool models): batches of datagrams into the data plane.
pub fn receive_loop(device: Arc<Device>, sock_index: usize, generation: u64) {
    let plane = device.plane.clone();
    let ctx = plane.register(&format!("receive{sock_index}"), 0);
    let group = plane.io.sockets();
    let sockets = &group[0];
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
        if !plane.dispatch_inbound(&mut datagrams, truncated, &ctx) {
            return;
        }
    }
}

/// The read stage (pool models): batches of packets from the TUN device into the data plane.
pub fn read_loop(device: Arc<Device>) {
    let plane = device.plane.clone();
    let ctx = plane.register("read", 0);
    // A TSO read brings up to 64 KB behind its virtio-net header.
    let mut scratch = vec![0u8; MAX_PACKET + 1 + offload::VNET_HDR_LEN];
    let mut packets: Vec<Vec<u8>> = Vec::with_capacity(batch::BATCH);
    while !device.stopped() {
        packets.clear();
        let tun = &plane.io.tun[0];
        if let Err(e) = tun.read_batch(&mut scratch, &mut packets, batch::BATCH, DATA_HEADER_LEN) {
            device.shutdown(&format!("TUN device {} is gone ({e})", tun.name()));
            return;
        }
        if !packets.is_empty() && !plane.dispatch_outbound(&mut packets, &ctx) {
            return;
        }
    }
}

/// One queue of the inline and auto models, on its own CPU: its UDP sockets and its TUN
/// queue, polled together; every batch is dispatched and (for peers not spread) decrypted
/// or encrypted and delivered right here, to this queue's TUN queue and sockets.
pub fn queue_loop(device: Arc<Device>, queue: usize) {
    let plane = device.plane.clone();
    let ctx = plane.register(&format!("queue{queue}"), queue);
    let tun = &plane.io.tun[queue];
    let mut scratch = vec![0u8; MAX_PACKET + 1 + offload::VNET_HDR_LEN];
    let mut packets: Vec<Vec<u8>> = Vec::with_capacity(batch::BATCH);
    let mut receivers = [batch::Receiver::new(MAX_PACKET), batch::Receiver::new(MAX_PACKET)];
    let mut datagrams: Vec<Datagram> = Vec::with_capacity(batch::BATCH);
    // Whether the last turn found work: then the next poll only looks (timeout 0, which the
    // kernel serves without putting the thread on the descriptors' wait queues) instead of
    // waiting. A busy queue thread so pays no wait-queue registration per turn, and packets
    // that arrive while it works wake nobody.
    let mut busy = false;
    while !device.stopped() {
        // Fetched each round: a new listen port replaces the sockets under us.
        let group = plane.io.sockets();
        let Some(sockets) = group.get(queue) else { return };
        let socks: Vec<&std::net::UdpSocket> = std::iter::once(&sockets.v4).chain(sockets.v6.as_ref()).collect();
        let mut fds: Vec<libc::pollfd> = socks
            .iter()
            .map(|s| s.as_raw_fd())
            .chain(std::iter::once(tun.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: a live array of pollfds of the length passed.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, if busy { 0 } else { 1000 }) };
        busy = false;
        if rc <= 0 {
            continue;
        }
        for (i, sock) in socks.iter().enumerate() {
            if fds[i].revents == 0 {
                continue;
            }
            datagrams.clear();
            let Ok(truncated) = receivers[i].recv_ready(sock, &mut datagrams) else {
                continue;
            };
            for d in &mut datagrams {
                d.src = canonical(d.src);
            }
            if !datagrams.is_empty() || truncated > 0 {
                busy = true;
                if !plane.dispatch_inbound(&mut datagrams, truncated, &ctx) {
                    return;
                }
            }
        }
        if fds[socks.len()].revents != 0 {
            packets.clear();
            if let Err(e) =
                tun.read_batch_waiting(&mut scratch, &mut packets, batch::READ_BATCH, DATA_HEADER_LEN, false)
            {
                device.shutdown(&format!("TUN device {} is gone ({e})", tun.name()));
                return;
            }
            if !packets.is_empty() {
                busy = true;
                if !plane.dispatch_outbound(&mut packets, &ctx) {
                    return;
                }
            }
        }
    }
}
