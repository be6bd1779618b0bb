//! The pool execution model: a fixed pool of workers, one per allowed core, all in the same
//! scheduling class, does the crypto of every peer; each peer's batches are delivered in
//! order through its [`Lane`]s by whichever worker finishes a lane's head.
//!
//! ```text
//!  UDP ─recvmmsg─▶ [receive] ─ticket, batch per peer─▶ ┐                ┌─▶ deliver inbound ─▶ TUN
//!                                                      ├─▶ [workers] ───┤   (in order, by the
//!  TUN ──read────▶ [read] ───ticket, batch per peer──▶ ┘   open / seal  └─▶ deliver outbound ─▶ UDP
//!                                                                           head's finisher)
//! ```
//!
//! The protocol core's lock is taken once per batch, for lookups before the crypto and for the
//! in-order bookkeeping after it (replay window, timers, roaming), never during the crypto.

use super::batch::{self, Datagram};
use super::lane::{Finish, Lane};
use super::offload;
use super::stats::{Stage, ThreadStats};
use super::Device;
use ordo_proto::messages::{self, Kind, DATA_HEADER_LEN};
use ordo_proto::session::Session;
use ordo_proto::{Accepted, DropReason, PeerId};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// One peer's two lanes.
#[derive(Default)]
pub struct PeerLanes {
    pub inbound: Lane<InboundBatch>,
    pub outbound: Lane<OutboundBatch>,
}

pub struct InboundPacket {
    pub data: Vec<u8>,
    pub src: SocketAddr,
    /// Set by the worker: the counter and plaintext length, or None if it did not open.
    pub opened: Option<(u64, usize)>,
}

/// Data messages of one peer, on one session, in arrival order.
pub struct InboundBatch {
    pub peer: PeerId,
    pub session: Arc<Session>,
    pub lanes: Arc<PeerLanes>,
    pub ticket: u64,
    pub packets: Vec<InboundPacket>,
}

/// Packets for one peer, sealed with consecutive counters from `first_counter`. Each buffer
/// holds the packet at `DATA_HEADER_LEN..` and, once sealed, the whole message.
pub struct OutboundBatch {
    pub peer: PeerId,
    pub session: Arc<Session>,
    pub lanes: Arc<PeerLanes>,
    pub ticket: u64,
    pub to: SocketAddr,
    pub mtu: usize,
    pub first_counter: u64,
    pub packets: Vec<Vec<u8>>,
}

pub enum Job {
    Inbound(InboundBatch),
    Outbound(OutboundBatch),
}

/// A worker: crypto for any peer, then delivery for the lanes whose head it finished.
pub fn worker(device: Arc<Device>, jobs: crossbeam_channel::Receiver<Job>, name: String) {
    let me = device.stats.register_thread(&name);
    for job in jobs {
        match job {
            Job::Inbound(mut b) => {
                let start = Instant::now();
                for p in &mut b.packets {
                    p.opened = b.session.open_in_place(&mut p.data).ok();
                }
                device.stats.record(Stage::Decrypt, &me, b.packets.len(), start);
                let (lanes, ticket) = (b.lanes.clone(), b.ticket);
                if let Finish::Deliver(run) = lanes.inbound.finish(ticket, b) {
                    deliver_inbound(&device, &lanes, run, &me);
                }
            }
            Job::Outbound(mut b) => {
                let start = Instant::now();
                for (i, buf) in b.packets.iter_mut().enumerate() {
                    let len = buf.len() - DATA_HEADER_LEN;
                    let padded = ordo_proto::interface::padded_len(len, b.mtu);
                    buf.resize(DATA_HEADER_LEN + padded + ordo_proto::crypto::TAG_LEN, 0);
                    b.session.seal_at(b.first_counter + i as u64, padded, buf);
                }
                device.stats.record(Stage::Encrypt, &me, b.packets.len(), start);
                let (lanes, ticket) = (b.lanes.clone(), b.ticket);
                if let Finish::Deliver(run) = lanes.outbound.finish(ticket, b) {
                    deliver_outbound(&device, &lanes, run, &me);
                }
            }
        }
    }
}

/// In order: the core accepts each opened message (replay window, timers, roaming, allowed
/// IPs), then the inner packets go to the TUN device.
fn deliver_inbound(device: &Device, lanes: &PeerLanes, mut run: Vec<InboundBatch>, me: &ThreadStats) {
    let st = device.stats.stage(Stage::DeliverInbound);
    loop {
        let start = Instant::now();
        st.wakeups.fetch_add(1, Ordering::Relaxed);
        if run.is_empty() {
            st.wasted_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let mut to_tun: Vec<(usize, usize, usize)> = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = device.core();
            for (bi, b) in run.iter().enumerate() {
                for (pi, p) in b.packets.iter().enumerate() {
                    let Some((counter, len)) = p.opened else {
                        core.count_drop(DropReason::DecryptFailed);
                        continue;
                    };
                    let plain = &p.data[DATA_HEADER_LEN..DATA_HEADER_LEN + len];
                    if let Ok(Accepted::Packet { len }) =
                        core.accept_data(now, wall, p.src, b.peer, &b.session, counter, p.data.len(), plain)
                    {
                        to_tun.push((bi, pi, len));
                    }
                }
            }
            Device::drain(&mut core)
        };
        write_to_tun(device, &mut run, &to_tun);
        device.send_transmits(transmits);
        device.stats.record(Stage::DeliverInbound, me, to_tun.len(), start);
        match lanes.inbound.continue_delivery() {
            Some(r) => run = r,
            None => return,
        }
    }
}

/// Writes accepted packets (batch, packet, length) to the TUN device: segments of one TCP
/// flow coalesced into single writes where the device takes virtio-net headers.
fn write_to_tun(device: &Device, run: &mut [InboundBatch], accepted: &[(usize, usize, usize)]) {
    let io = &device.io;
    let write = |bytes: &[u8], packets: usize| {
        io.tun_writes.fetch_add(1, Ordering::Relaxed);
        if device.tun.write(bytes).is_err() {
            io.tun_write_errors.fetch_add(packets as u64, Ordering::Relaxed);
        }
    };
    if !device.tun.has_vnet_hdr() {
        for &(bi, pi, len) in accepted {
            write(&run[bi].packets[pi].data[DATA_HEADER_LEN..DATA_HEADER_LEN + len], 1);
        }
        return;
    }
    let plan = {
        let packets: Vec<&[u8]> = accepted
            .iter()
            .map(|&(bi, pi, len)| &run[bi].packets[pi].data[DATA_HEADER_LEN..DATA_HEADER_LEN + len])
            .collect();
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
                let segments: Vec<&[u8]> = accepted[a..b]
                    .iter()
                    .map(|&(bi, pi, len)| &run[bi].packets[pi].data[DATA_HEADER_LEN..DATA_HEADER_LEN + len])
                    .collect();
                io.tun_coalesced_packets.fetch_add((b - a) as u64, Ordering::Relaxed);
                write(&offload::coalesce(&segments), b - a);
            }
        }
    }
}

/// In order: the sealed messages go out, then the core learns what was sent (timers, rekey).
fn deliver_outbound(device: &Device, lanes: &PeerLanes, mut run: Vec<OutboundBatch>, me: &ThreadStats) {
    let st = device.stats.stage(Stage::DeliverOutbound);
    loop {
        let start = Instant::now();
        st.wakeups.fetch_add(1, Ordering::Relaxed);
        if run.is_empty() {
            st.wasted_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        let sockets = device.sockets();
        let mut sent_packets = 0;
        for b in &run {
            let payloads: Vec<&[u8]> = b.packets.iter().map(Vec::as_slice).collect();
            let sent = sockets
                .socket_for(b.to)
                .and_then(|(s, to)| batch::send_batch(s, to, &payloads, &sockets.gso))
                .unwrap_or(0);
            if sent < payloads.len() {
                device
                    .io
                    .udp_send_errors
                    .fetch_add((payloads.len() - sent) as u64, Ordering::Relaxed);
            }
            sent_packets += sent;
        }
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = device.core();
            for b in &run {
                let bytes: usize = b.packets.iter().map(Vec::len).sum();
                core.after_send(now, wall, b.peer, &b.session, bytes as u64, b.packets.len() as u64);
            }
            Device::drain(&mut core)
        };
        device.send_transmits(transmits);
        device.stats.record(Stage::DeliverOutbound, me, sent_packets, start);
        match lanes.outbound.continue_delivery() {
            Some(r) => run = r,
            None => return,
        }
    }
}

/// Items of one batch grouped by (peer, session index), in order of first appearance.
type Groups<V> = Vec<((PeerId, u32), Vec<V>)>;

/// Groups items by a key in order of first appearance (batches are small: a linear scan).
fn group_push<K: PartialEq, V>(groups: &mut Vec<(K, Vec<V>)>, key: K, v: V) {
    match groups.iter_mut().find(|(k, _)| *k == key) {
        Some((_, vs)) => vs.push(v),
        None => groups.push((key, vec![v])),
    }
}

/// The receive stage for one socket: batches of datagrams become per-peer work items; the
/// rare handshake messages are handled here, under the core's lock.
pub fn receive_loop(device: Arc<Device>, sock_index: usize, generation: u64, jobs: crossbeam_channel::Sender<Job>) {
    let me = device.stats.register_thread(&format!("receive{sock_index}"));
    let sockets = device.sockets();
    let sock = if sock_index == 0 {
        &sockets.v4
    } else {
        sockets.v6.as_ref().expect("present")
    };
    let mut rx = batch::Receiver::new(super::MAX_PACKET);
    let mut datagrams: Vec<Datagram> = Vec::with_capacity(batch::BATCH);
    loop {
        datagrams.clear();
        let r = rx.recv(sock, &mut datagrams);
        if device.stopped() || device.socket_generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let Ok(truncated) = r else { continue };
        let start = Instant::now();
        let count = datagrams.len();
        let mut groups: Groups<InboundPacket> = Vec::new();
        let mut sessions: Vec<Arc<Session>> = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = device.core();
            for _ in 0..truncated {
                core.count_drop(DropReason::Malformed);
            }
            for mut d in datagrams.drain(..) {
                d.src = super::canonical(d.src);
                match messages::classify(&d.data) {
                    Some(Kind::Data) => {
                        let receiver = messages::DataHeader::parse(&d.data).receiver;
                        match core.receiving_session(receiver) {
                            Some((peer, session)) => {
                                if !sessions.iter().any(|s| s.local_index == receiver) {
                                    sessions.push(session);
                                }
                                group_push(
                                    &mut groups,
                                    (peer, receiver),
                                    InboundPacket {
                                        data: d.data,
                                        src: d.src,
                                        opened: None,
                                    },
                                );
                            }
                            None => core.count_drop(DropReason::UnknownReceiver),
                        }
                    }
                    // Handshake messages and anything malformed: the core handles and counts them.
                    _ => {
                        core.receive(now, wall, d.src, &mut d.data);
                    }
                }
            }
            Device::drain(&mut core)
        };
        device.send_transmits(transmits);
        for ((peer, receiver), packets) in groups {
            let session = sessions
                .iter()
                .find(|s| s.local_index == receiver)
                .expect("looked up")
                .clone();
            let lanes = device.lanes(peer);
            let ticket = lanes.inbound.ticket();
            let job = Job::Inbound(InboundBatch {
                peer,
                session,
                lanes,
                ticket,
                packets,
            });
            if jobs.send(job).is_err() {
                return;
            }
        }
        device.stats.record(Stage::Receive, &me, count, start);
    }
}

/// The read stage: packets from the TUN device become per-peer work items with their nonces
/// reserved; packets for peers without a session wait in the core for a handshake.
pub fn read_loop(device: Arc<Device>, jobs: crossbeam_channel::Sender<Job>) {
    let me = device.stats.register_thread("read");
    // A TSO read brings up to 64 KB behind its virtio-net header.
    let mut scratch = vec![0u8; super::MAX_PACKET + 1 + offload::VNET_HDR_LEN];
    let mut packets: Vec<Vec<u8>> = Vec::with_capacity(batch::BATCH);
    while !device.stopped() {
        packets.clear();
        if let Err(e) = device
            .tun
            .read_batch(&mut scratch, &mut packets, batch::BATCH, DATA_HEADER_LEN)
        {
            device.shutdown(&format!("TUN device {} is gone ({e})", device.tun.name()));
            return;
        }
        if packets.is_empty() {
            continue;
        }
        let start = Instant::now();
        let count = packets.len();
        let mut groups: Groups<Vec<u8>> = Vec::new();
        let mut targets: Vec<(Arc<Session>, SocketAddr)> = Vec::new();
        let (mtu, transmits) = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = device.core();
            for p in packets.drain(..) {
                let inner = &p[DATA_HEADER_LEN..];
                let peer = match core.route(inner) {
                    Ok(peer) => peer,
                    Err(r) => {
                        core.count_drop(r);
                        continue;
                    }
                };
                match core.sending_session(now, peer) {
                    Ok(Some((session, to))) => {
                        let idx = session.local_index;
                        if !targets.iter().any(|(s, _)| s.local_index == idx) {
                            targets.push((session, to));
                        }
                        group_push(&mut groups, (peer, idx), p);
                    }
                    Ok(None) => core.stage_and_initiate(now, wall, peer, inner.to_vec()),
                    Err(r) => core.count_drop(r),
                }
            }
            (core.mtu(), Device::drain(&mut core))
        };
        device.send_transmits(transmits);
        for ((peer, idx), packets) in groups {
            let (session, to) = targets
                .iter()
                .find(|(s, _)| s.local_index == idx)
                .expect("looked up")
                .clone();
            let Some(first_counter) = session.reserve(packets.len() as u64) else {
                // The session ran out of nonces: wait for the next one like any unsent packet.
                let (now, wall) = (Instant::now(), SystemTime::now());
                let mut core = device.core();
                for p in packets {
                    core.stage_and_initiate(now, wall, peer, p[DATA_HEADER_LEN..].to_vec());
                }
                continue;
            };
            let lanes = device.lanes(peer);
            let ticket = lanes.outbound.ticket();
            let job = Job::Outbound(OutboundBatch {
                peer,
                session,
                lanes,
                ticket,
                to,
                mtu,
                first_counter,
                packets,
            });
            if jobs.send(job).is_err() {
                return;
            }
        }
        device.stats.record(Stage::Read, &me, count, start);
    }
}
