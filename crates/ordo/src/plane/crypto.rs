//! The crypto stage: opening and sealing batches of data messages, on the dispatching thread
//! (inline) or on a pool worker of the peer's NUMA node (spread peers). Each finished batch
//! goes to its peer's lane (see `delivery`).

use super::peer::{InboundBatch, Opened, OutboundBatch};
use super::stats::Stage;
use super::{Ctx, DataPlane};
use crate::port::{InnerPort, OuterPort};
use ordo_proto::messages::DATA_HEADER_LEN;
use std::sync::Arc;
use std::time::Instant;

/// A work item for a pool: the per-peer batches of one dispatched batch. With many peers,
/// one item per peer would cost a queue hand-off per packet; one per dispatch keeps it per
/// batch.
pub enum Job {
    Inbound(Vec<InboundBatch>),
    Outbound(Vec<OutboundBatch>),
}

/// A pool worker: crypto for any peer of its node, then delivery of the lanes whose head
/// it finished.
pub(super) fn worker<I: InnerPort, O: OuterPort>(
    plane: Arc<DataPlane<I, O>>,
    jobs: crossbeam_channel::Receiver<Job>,
    ctx: Ctx,
) {
    for job in jobs {
        match job {
            Job::Inbound(batches) => plane.open(batches, &ctx),
            Job::Outbound(batches) => plane.seal(batches, &ctx),
        }
    }
}

impl<I: InnerPort, O: OuterPort> DataPlane<I, O> {
    /// Decrypts a set of batches (one dispatch's or one job's, of any peers), hands each to
    /// its lane, then delivers the lanes this thread became the deliverer of, all of them
    /// under one lock of the core: with many peers a batch holds one packet of each, and a
    /// lock (and a clock reading) per peer would cost more than the crypto.
    pub(super) fn open(self: &Arc<Self>, mut batches: Vec<InboundBatch>, ctx: &Ctx) {
        let start = Instant::now();
        let mut count = 0;
        for b in &mut batches {
            for p in &mut b.packets {
                p.opened = (b.session.open_in_place(&mut p.data).ok()).map(|(counter, len)| Opened { counter, len });
            }
            count += b.packets.len();
        }
        self.stats.record(Stage::Decrypt, &ctx.stats, count, start);
        self.finish(
            batches,
            |b| (&b.peer, b.ticket),
            |p| &p.inbound,
            |runs| self.deliver_inbound(runs, ctx),
        );
    }

    /// Encrypts a set of batches with their reserved counters, hands each to its lane, then
    /// delivers the lanes this thread became the deliverer of (see `open`).
    pub(super) fn seal(self: &Arc<Self>, mut batches: Vec<OutboundBatch>, ctx: &Ctx) {
        let start = Instant::now();
        let mut count = 0;
        for b in &mut batches {
            for (i, buf) in b.packets.iter_mut().enumerate() {
                let padded = ordo_proto::interface::padded_len(buf.packet().len(), b.mtu);
                buf.resize(DATA_HEADER_LEN + padded + ordo_proto::crypto::TAG_LEN);
                b.session
                    .seal_at(b.first_counter + i as u64, padded, buf.as_bytes_mut());
            }
            count += b.packets.len();
        }
        self.stats.record(Stage::Encrypt, &ctx.stats, count, start);
        self.finish(
            batches,
            |b| (&b.peer, b.ticket),
            |p| &p.outbound,
            |runs| self.deliver_outbound(runs, ctx),
        );
    }
}
