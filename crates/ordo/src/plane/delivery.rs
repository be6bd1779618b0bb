//! The delivery stage: each peer's lanes, in order, to the ports. Whoever finishes a lane's
//! head delivers it, with every lane it became the deliverer of in one pass (pool, inline,
//! auto); in the threaded model a delivery thread per peer is rung instead, as kernel
//! WireGuard's threaded NAPI does, and its wasted wake-ups are counted.

use super::lane::{Finish, Lane};
use super::peer::{InboundBatch, OutboundBatch, PeerPlane};
use super::stats::Stage;
use super::{drain, Ctx, DataPlane};
use crate::placement::model::Model;
use crate::port::{buffers, DeliveryRun, InnerPort, OuterPort, PacketBuf, HEADROOM};
use ordo_proto::messages::DATA_HEADER_LEN;
use ordo_proto::{Accepted, DropReason, OpenedMessage};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime};

/// A lane's batches that are ready, in order: what one wake-up of its deliverer delivers.
pub struct Run<B> {
    pub peer: Arc<PeerPlane>,
    pub batches: Vec<B>,
}

/// A packet the core accepted in a delivery: where it lies among the runs, and its inner
/// length.
struct AcceptedAt {
    run: usize,
    batch: usize,
    packet: usize,
    len: usize,
}

impl<I: InnerPort, O: OuterPort> DataPlane<I, O> {
    /// Files each done batch in its peer's lane (`key`: a batch's peer and ticket), then
    /// delivers every lane this thread became the deliverer of, together, until none has
    /// more. Threaded: rings each peer's delivery thread instead.
    pub(super) fn finish<B>(
        self: &Arc<Self>,
        batches: Vec<B>,
        key: impl Fn(&B) -> (&Arc<PeerPlane>, u64),
        lane: impl Fn(&PeerPlane) -> &Lane<B>,
        deliver: impl Fn(&mut [Run<B>]),
    ) {
        let mut runs = Vec::new();
        for b in batches {
            let (peer, ticket) = key(&b);
            let peer = peer.clone();
            if self.plan.model == Model::Threaded {
                lane(&peer).file(ticket, b);
                self.ring(&peer);
            } else if let Finish::Deliver(batches) = lane(&peer).finish(ticket, b) {
                runs.push(Run { peer, batches });
            }
        }
        while !runs.is_empty() {
            deliver(&mut runs);
            runs = runs
                .into_iter()
                .filter_map(|r| {
                    let batches = lane(&r.peer).continue_delivery()?;
                    Some(Run { peer: r.peer, batches })
                })
                .collect();
        }
    }

    /// Threaded model: wakes the peer's delivery thread, starting it on first use. Like
    /// `napi_schedule`, ringing an already rung bell does nothing more.
    fn ring(self: &Arc<Self>, peer: &Arc<PeerPlane>) {
        let bell = peer.doorbell.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let (plane, weak) = (self.clone(), Arc::downgrade(peer));
            let name = format!("deliver{}", peer.id.0);
            std::thread::Builder::new()
                .name(format!("ordo-{name}"))
                .stack_size(256 << 10)
                .spawn(move || {
                    let ctx = plane.register(&name, 0);
                    if plane.plan.delivery_fifo {
                        set_fifo_priority();
                    }
                    delivery_thread(plane, weak, rx, ctx)
                })
                .expect("spawn");
            tx
        });
        let _ = bell.try_send(());
    }

    /// In order, for each peer's run: the core accepts its packets (replay window, timers,
    /// roaming, allowed IPs; one lock for all the runs), then the inner port writes them. One
    /// wake-up per run: a lane this thread became the deliverer of.
    pub(super) fn deliver_inbound(&self, runs: &mut [Run<InboundBatch>], ctx: &Ctx) {
        let start = Instant::now();
        let st = ctx.stats.stage(Stage::DeliverInbound);
        st.wakeups.fetch_add(runs.len() as u64, Ordering::Relaxed);
        // Cannot happen by construction (see `lane`); counted if it ever does.
        let empty = runs.iter().filter(|r| r.batches.is_empty()).count();
        st.wasted_wakeups.fetch_add(empty as u64, Ordering::Relaxed);
        // The accepted packets of every run, one list (one allocation per delivery, not one
        // per peer); marked on the packets once the core's lock is released.
        let mut accepted: Vec<AcceptedAt> = Vec::new();
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for (ri, r) in runs.iter().enumerate() {
                for (bi, b) in r.batches.iter().enumerate() {
                    for p in b.packets.iter().filter(|p| p.opened.is_none()) {
                        core.count_drop_from(DropReason::DecryptFailed, p.src);
                    }
                    // The opened packets go to the core as one run; its verdicts come back in
                    // the same order, so `positions` walks the same packets beside them.
                    let opened = || b.packets.iter().enumerate().filter(|(_, p)| p.opened.is_some());
                    let messages = opened().filter_map(|(_, p)| {
                        let o = p.opened?;
                        Some(OpenedMessage {
                            counter: o.counter,
                            src: p.src,
                            datagram_len: p.data.len(),
                            plain: &p.data[DATA_HEADER_LEN..DATA_HEADER_LEN + o.len],
                        })
                    });
                    let mut positions = opened().map(|(pi, _)| pi);
                    core.accept_data_run(now, wall, b.peer.id, &b.session, messages, |verdict| {
                        let packet = positions.next().expect("one verdict per message");
                        if let Ok(Accepted::Packet { len }) = verdict {
                            accepted.push(AcceptedAt {
                                run: ri,
                                batch: bi,
                                packet,
                                len,
                            });
                        }
                    });
                }
            }
            drain(&mut core)
        };
        // Each peer's own queue, whoever delivers: the TUN device sends a flow's packets back
        // through the queue that last wrote it, so writing a peer's flows from one queue keeps
        // them on one reader (two readers would reorder them). `accepted` is in the runs'
        // order, so one walk beside the packets finds each.
        let mut next = accepted.iter().peekable();
        for (ri, r) in runs.iter_mut().enumerate() {
            let queue = r.peer.queue.load(Ordering::Relaxed);
            let mut buffers = Vec::new();
            for (bi, b) in r.batches.iter_mut().enumerate() {
                for (pi, p) in b.packets.iter_mut().enumerate() {
                    if let Some(a) = next.next_if(|a| (a.run, a.batch, a.packet) == (ri, bi, pi)) {
                        buffers.push(PacketBuf::borrowed(&mut p.data[..HEADROOM + a.len]));
                    }
                }
            }
            if !buffers.is_empty() {
                self.inner.write(queue, &mut DeliveryRun::new(buffers));
            }
        }
        self.send_transmits(runs[0].peer.queue.load(Ordering::Relaxed), transmits);
        self.stats
            .record(Stage::DeliverInbound, &ctx.stats, accepted.len(), start);
    }

    /// In order, for each peer's run: the sealed messages go out, then the core learns what
    /// was sent (timers, rekey; one lock for all the runs). The sent buffers go back to this
    /// thread's spares (`port::buffers`).
    pub(super) fn deliver_outbound(&self, runs: &mut [Run<OutboundBatch>], ctx: &Ctx) {
        let start = Instant::now();
        let st = ctx.stats.stage(Stage::DeliverOutbound);
        st.wakeups.fetch_add(runs.len() as u64, Ordering::Relaxed);
        // Cannot happen by construction (see `lane`); counted if it ever does.
        let empty = runs.iter().filter(|r| r.batches.is_empty()).count();
        st.wasted_wakeups.fetch_add(empty as u64, Ordering::Relaxed);
        let mut sent_packets = 0;
        for b in runs.iter().flat_map(|r| &r.batches) {
            let payloads: Vec<&[u8]> = b.packets.iter().map(PacketBuf::as_bytes).collect();
            sent_packets += self.outer.send(b.peer.queue.load(Ordering::Relaxed), b.to, &payloads);
        }
        let transmits = {
            let (now, wall) = (Instant::now(), SystemTime::now());
            let mut core = self.core();
            for b in runs.iter().flat_map(|r| &r.batches) {
                let bytes: usize = b.packets.iter().map(|p| p.as_bytes().len()).sum();
                core.after_send(now, wall, b.peer.id, &b.session, bytes as u64, b.packets.len() as u64);
            }
            drain(&mut core)
        };
        self.send_transmits(runs[0].peer.queue.load(Ordering::Relaxed), transmits);
        for b in runs.iter_mut().flat_map(|r| &mut r.batches) {
            buffers::give(std::mem::take(&mut b.packets));
        }
        self.stats
            .record(Stage::DeliverOutbound, &ctx.stats, sent_packets, start);
    }
}

/// Threaded model: one peer's delivery, woken on every finished batch whether or not it is
/// the head. A wake-up that finds the head still in crypto is wasted: counted, as the
/// measure of execution order inversion this model can suffer.
fn delivery_thread<I: InnerPort, O: OuterPort>(
    plane: Arc<DataPlane<I, O>>,
    peer: Weak<PeerPlane>,
    bell: crossbeam_channel::Receiver<()>,
    ctx: Ctx,
) {
    for () in bell {
        let Some(peer) = peer.upgrade() else { return };
        let inbound = peer.inbound.take_ready();
        let outbound = peer.outbound.take_ready();
        if inbound.is_empty() && outbound.is_empty() {
            let st = ctx.stats.stage(Stage::DeliverInbound);
            st.wakeups.fetch_add(1, Ordering::Relaxed);
            st.wasted_wakeups.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if !inbound.is_empty() {
            let batches = inbound;
            plane.deliver_inbound(
                &mut [Run {
                    peer: peer.clone(),
                    batches,
                }],
                &ctx,
            );
        }
        if !outbound.is_empty() {
            let batches = outbound;
            plane.deliver_outbound(
                &mut [Run {
                    peer: peer.clone(),
                    batches,
                }],
                &ctx,
            );
        }
    }
}

/// The lab's inversion scenario (lab/lab.sh inversion): the delivery thread above the
/// workers, as kernel WireGuard's softirq is. Needs CAP_SYS_NICE; without it the thread
/// stays at normal priority.
fn set_fifo_priority() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        log::warn!("cannot run delivery at SCHED_FIFO: {}", std::io::Error::last_os_error());
    }
}
