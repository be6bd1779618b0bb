//! The dispatch stage: the receive and read threads' work for one batch. Each packet is
//! classified and looked up under one lock of the core, grouped per peer into a batch with a
//! ticket of the peer's lane, then handed to the crypto: on a pool for spread peers, here for
//! the others.

use super::crypto::Job;
use super::peer::{InboundBatch, InboundPacket, OutboundBatch, PeerPlane};
use super::stats::Stage;
use super::{drain, Ctx, DataPlane};
use crate::port::{Datagram, InnerPort, OuterPort, PacketBuf};
use bytes::Buf;
use ordo_proto::fleet;
use ordo_proto::interface::{ForeignData, HandshakeStep, PendingInitiation};
use ordo_proto::messages::{self, Kind};
use ordo_proto::session::Session;
use ordo_proto::{DropReason, PeerId};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// One session's items of a batch, in arrival order, with what was looked up for it once per
/// batch rather than once per packet.
struct Group<V> {
    peer: PeerId,
    session: Arc<Session>,
    /// The peer's queue, as the core has it.
    queue: u32,
    /// Outbound: where the peer is.
    to: Option<SocketAddr>,
    items: Vec<V>,
}

impl<I: InnerPort, O: OuterPort> DataPlane<I, O> {
    /// The receive stage's work for one batch of datagrams (sources canonical, as the outer
    /// port gives them): data messages become per-peer work items; the rare handshake
    /// messages, and anything malformed, are handled here under the core's lock. Returns
    /// false once the pool is gone.
    pub fn dispatch_inbound(self: &Arc<Self>, datagrams: &mut Vec<Datagram>, truncated: usize, ctx: &Ctx) -> bool {
        let start = Instant::now();
        let count = datagrams.len();
        let mut groups: Vec<Group<InboundPacket>> = Vec::new();
        let mut initiations = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for _ in 0..truncated {
                core.count_drop(DropReason::Malformed);
            }
            for mut d in datagrams.drain(..) {
                // An envelope from another gateway of the fleet: a client's datagram, taken as
                // if it had come from the client.
                let came_in_envelope = fleet::is_envelope(&d.data);
                if came_in_envelope {
                    match core.open_envelope(d.src, &d.data) {
                        Ok(opened) => {
                            d.data.advance(opened.datagram_at);
                            d.src = opened.client;
                        }
                        Err(_) => continue,
                    }
                }
                if messages::classify(&d.data) != Some(Kind::Data) {
                    // Handshake messages and anything malformed: the core handles and counts
                    // them, but for an initiation's Diffie-Hellman (see below).
                    if let HandshakeStep::Initiation(p) = core.begin_handshake(now, wall, d.src, &mut d.data) {
                        initiations.push(p);
                    }
                    continue;
                }
                let receiver = messages::DataHeader::parse(&d.data).receiver;
                let at = match groups.iter().position(|g| g.session.local_index == receiver) {
                    Some(at) => at,
                    None => match core.receiving_session(receiver) {
                        Some((peer, session)) => {
                            let queue = core.peer(peer).map_or(0, |p| p.queue);
                            groups.push(Group {
                                peer,
                                session,
                                queue,
                                to: None,
                                items: Vec::new(),
                            });
                            groups.len() - 1
                        }
                        None => {
                            // Counted; passed to its owner or taken over in a fleet.
                            let data = ForeignData {
                                src: d.src,
                                datagram: &d.data,
                                came_in_envelope,
                            };
                            core.foreign_data(now, wall, data);
                            continue;
                        }
                    },
                };
                groups[at].items.push(InboundPacket {
                    data: d.data,
                    src: d.src,
                    opened: None,
                });
            }
            drain(&mut core)
        };
        self.send_transmits(ctx.queue, transmits);
        let mut batches = Vec::with_capacity(groups.len());
        for g in groups {
            let peer = self.placed_peer(g.peer, g.queue);
            peer.rx_packets.fetch_add(g.items.len() as u64, Ordering::Relaxed);
            let ticket = peer.inbound.ticket();
            batches.push(InboundBatch {
                peer,
                session: g.session,
                ticket,
                packets: g.items,
            });
        }
        self.stats.record(Stage::Receive, &ctx.stats, count, start);
        let running = self.execute(
            batches,
            ctx,
            |b| &b.peer,
            Job::Inbound,
            |plane, batches, ctx| plane.open(batches, ctx),
        );
        self.open_initiations(initiations, ctx);
        running
    }

    /// Initiations that passed the core's checks, opened after the batch's data went on and
    /// without the core's lock, which every data packet takes: a Diffie-Hellman under it would
    /// stall every queue for its duration, and a flood from sources that answer cookies
    /// brings one per source up to its handshake rate.
    fn open_initiations(&self, initiations: Vec<PendingInitiation>, ctx: &Ctx) {
        for p in initiations {
            let opened = p.open(|key| self.core().static_static_of(key));
            let transmits = {
                let mut core = self.core();
                core.complete_initiation(Instant::now(), SystemTime::now(), p, opened);
                drain(&mut core)
            };
            self.send_transmits(ctx.queue, transmits);
        }
    }

    /// The read stage's work for one batch of inner packets: routed, nonces reserved, per-peer work items; packets for peers without a
    /// session wait in the core for a handshake. Returns false once the pool is gone.
    pub fn dispatch_outbound(self: &Arc<Self>, packets: &mut Vec<PacketBuf>, ctx: &Ctx) -> bool {
        let start = Instant::now();
        let count = packets.len();
        let mut groups: Vec<Group<PacketBuf>> = Vec::new();
        let (mtu, transmits) = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for p in packets.drain(..) {
                let inner = p.packet();
                let peer = match core.route(inner) {
                    Ok(peer) => peer,
                    Err(r) => {
                        core.count_drop(r);
                        continue;
                    }
                };
                if let Some(g) = groups.iter_mut().find(|g| g.peer == peer) {
                    g.items.push(p);
                    continue;
                }
                match core.sending_session(now, peer) {
                    Ok(Some((session, to))) => {
                        let queue = core.peer(peer).map_or(0, |p| p.queue);
                        groups.push(Group {
                            peer,
                            session,
                            queue,
                            to: Some(to),
                            items: vec![p],
                        });
                    }
                    Ok(None) => core.stage_and_initiate(now, wall, peer, inner.to_vec()),
                    Err(r) => core.count_drop(r),
                }
            }
            (core.mtu(), drain(&mut core))
        };
        self.send_transmits(ctx.queue, transmits);
        let mut batches = Vec::with_capacity(groups.len());
        for g in groups {
            let Some(first_counter) = g.session.reserve(g.items.len() as u64) else {
                // The session ran out of nonces: wait for the next one like any unsent packet.
                let (now, wall) = (Instant::now(), SystemTime::now());
                let mut core = self.core();
                for p in g.items {
                    core.stage_and_initiate(now, wall, g.peer, p.packet().to_vec());
                }
                continue;
            };
            let peer = self.placed_peer(g.peer, g.queue);
            peer.tx_packets.fetch_add(g.items.len() as u64, Ordering::Relaxed);
            let ticket = peer.outbound.ticket();
            batches.push(OutboundBatch {
                peer,
                session: g.session,
                ticket,
                to: g.to.expect("an outbound group has its endpoint"),
                mtu,
                first_counter,
                packets: g.items,
            });
        }
        self.stats.record(Stage::Read, &ctx.stats, count, start);
        self.execute(
            batches,
            ctx,
            |b| &b.peer,
            Job::Outbound,
            |plane, batches, ctx| plane.seal(batches, ctx),
        )
    }

    /// The peer's plane, told which queue the core has it on: deliveries go through that
    /// queue's halves of the ports, whichever thread runs them.
    fn placed_peer(&self, id: PeerId, queue: u32) -> Arc<PeerPlane> {
        let peer = self.peer(id);
        peer.queue.store(queue as usize, Ordering::Relaxed);
        peer
    }

    /// Sends spread batches to their pools and runs the others here, in that order so the
    /// pools start first. A full pool makes the dispatcher wait (rather than do the crypto
    /// itself, which would take the peer off its NUMA node). Returns false once the pools
    /// are gone.
    fn execute<B>(
        self: &Arc<Self>,
        batches: Vec<B>,
        ctx: &Ctx,
        peer_of: impl Fn(&B) -> &Arc<PeerPlane>,
        job: impl Fn(Vec<B>) -> Job,
        here: impl Fn(&Arc<Self>, Vec<B>, &Ctx),
    ) -> bool {
        let mut local = Vec::new();
        let mut jobs: Vec<Vec<B>> = Vec::new();
        for b in batches {
            let p = peer_of(&b);
            if p.spread.load(Ordering::Relaxed) {
                let pool = p.pool.load(Ordering::Relaxed);
                if jobs.len() <= pool {
                    jobs.resize_with(pool + 1, Vec::new);
                }
                jobs[pool].push(b);
            } else {
                local.push(b);
            }
        }
        if jobs.iter().any(|j| !j.is_empty()) {
            let pools = self.pools.read().unwrap_or_else(|p| p.into_inner()).clone();
            for (i, batches) in jobs.into_iter().enumerate().filter(|(_, j)| !j.is_empty()) {
                match pools.get(i).or(pools.first()) {
                    Some(tx) if tx.send(job(batches)).is_ok() => {}
                    _ => return false,
                }
            }
        }
        if !local.is_empty() {
            here(self, local, ctx);
        }
        true
    }
}
