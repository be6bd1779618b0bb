//! One timed round of a phase (seal or open) through the plane, and the medians over the
//! rounds.

use super::ceiling::aead_ceiling;
use super::{place_while, wait_for, MemPlane, Options, Phase, SLOT_BYTES};
use anyhow::Result;
use ordo::host::topology;
use ordo::host::topology::Cpus;
use ordo::placement::model::Model;
use ordo::plane::Ctx;
use ordo::port::{Datagram, PacketBuf, BATCH};
use ordo::threads::READ_BATCH;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// One round's figures, with the ceilings measured right after it.
pub(super) fn phase(name: &'static str, o: &Options, crypto_threads: usize, took: Duration, cpus: &[usize]) -> Phase {
    let open = name == "open";
    // Each ceiling thread does what each crypto thread of the round did.
    let each = o.packets.div_ceil(cpus.len().max(1));
    let one = aead_ceiling(o.size, open, &cpus[..1.min(cpus.len())], each);
    let all = aead_ceiling(o.size, open, cpus, each);
    let secs = took.as_secs_f64();
    let gbps = (o.packets * o.size * 8) as f64 / secs / 1e9;
    let per_worker = gbps / crypto_threads.max(1) as f64;
    Phase {
        phase: name,
        packets: o.packets as u64,
        rounds: 1,
        seconds: secs,
        gbit_per_s: gbps,
        mpps: o.packets as f64 / secs / 1e6,
        gbit_per_s_per_worker: per_worker,
        aead_ceiling_gbit_per_s: one,
        per_worker_vs_ceiling: per_worker / one,
        vs_one_core_ceiling: gbps / one,
        aead_ceiling_all_threads_gbit_per_s: all,
        vs_all_threads_ceiling: gbps / all,
    }
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each figure's median over the rounds.
pub(super) fn median_phase(rounds: &[Phase]) -> Phase {
    let median = |f: fn(&Phase) -> f64| median(rounds.iter().map(f).collect());
    Phase {
        phase: rounds[0].phase,
        packets: rounds[0].packets,
        rounds: rounds.len(),
        seconds: median(|p| p.seconds),
        gbit_per_s: median(|p| p.gbit_per_s),
        mpps: median(|p| p.mpps),
        gbit_per_s_per_worker: median(|p| p.gbit_per_s_per_worker),
        aead_ceiling_gbit_per_s: median(|p| p.aead_ceiling_gbit_per_s),
        per_worker_vs_ceiling: median(|p| p.per_worker_vs_ceiling),
        vs_one_core_ceiling: median(|p| p.vs_one_core_ceiling),
        aead_ceiling_all_threads_gbit_per_s: median(|p| p.aead_ceiling_all_threads_gbit_per_s),
        vs_all_threads_ceiling: median(|p| p.vs_all_threads_ceiling),
    }
}

/// Runs one round: one dispatcher per queue (one in the pool models, on the I/O CPUs), each
/// pinned where the device pins that queue's thread and registered as it. Each first
/// `prepare`s its input on its own thread (so its buffers come from its own heap, as the
/// receive stage's slots do); the clock starts when all are ready and stops when `done` says
/// the plane has put out the round's last packet. The auto model's placement runs alongside,
/// as the device's timer thread runs it.
pub(super) fn round<T>(
    plane: &Arc<MemPlane>,
    count: usize,
    dispatcher_cpus: &[Cpus],
    prepare: impl Fn(usize) -> T + Sync,
    work: impl Fn(usize, &Ctx, T) + Sync,
    done: impl Fn() -> bool,
    what: &str,
) -> Result<Duration> {
    let ready = Barrier::new(count + 1);
    let placing = AtomicBool::new(plane.plan.model == Model::Auto);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|d| {
                let (prepare, work, ready) = (&prepare, &work, &ready);
                // Named, so that a profile (perf report --comm) tells the dispatchers apart.
                std::thread::Builder::new()
                    .name(format!("bench{d}"))
                    .spawn_scoped(scope, move || {
                        if let Some(cpus) = dispatcher_cpus.get(d) {
                            let _ = topology::pin_current_thread(cpus);
                        }
                        let ctx = plane.register(&format!("bench{d}"), d);
                        let input = prepare(d);
                        ready.wait();
                        work(d, &ctx, input);
                    })
                    .expect("spawn a dispatcher")
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        if placing.load(Ordering::Relaxed) {
            scope.spawn(|| place_while(plane, &placing));
        }
        handles.into_iter().for_each(|h| h.join().expect("dispatcher"));
        let took = wait_for(done, what).map(|()| start.elapsed());
        placing.store(false, Ordering::Relaxed);
        took
    })
}

/// Seals `o.packets` packets, round robin over the peers; each dispatcher reads for the
/// peers of its queue (copying each packet into a buffer of its thread's, as a read from TUN
/// does), as many per turn as the device's reader takes.
pub(super) fn seal_round(
    plane: &Arc<MemPlane>,
    o: &Options,
    (count, queue_of): (usize, &[usize]),
    dispatcher_cpus: &[Cpus],
    templates: &[Vec<u8>],
    done: impl Fn() -> bool,
) -> Result<Duration> {
    let prepare = |d: usize| {
        let own: Vec<usize> = (0..o.peers).filter(|&i| queue_of[i] == d).collect();
        let total = (0..o.packets).filter(|k| queue_of[k % o.peers] == d).count();
        (own, total)
    };
    // As many packets per read turn as the device's reading threads take: a queue thread's
    // turn (inline, auto) or the pool's read stage.
    let per_turn = if plane.plan.model.has_queues() {
        READ_BATCH
    } else {
        BATCH
    };
    let work = |_: usize, ctx: &Ctx, (own, total): (Vec<usize>, usize)| {
        let mut made = 0;
        let mut batch: Vec<PacketBuf> = Vec::with_capacity(per_turn);
        while made < total {
            for _ in 0..per_turn.min(total - made) {
                batch.push(PacketBuf::copy_of(&templates[own[made % own.len()]]));
                made += 1;
            }
            plane.dispatch_outbound(&mut batch, ctx);
        }
    };
    round(plane, count, dispatcher_cpus, prepare, work, done, "sealed messages")
}

/// Opens the messages, each dispatcher those of its queue, a batch at a time. Each first
/// copies its messages into buffers of its own: the peers' cores made them on one thread,
/// where neighbouring messages of two queues would share cache lines and heap pages. The
/// buffers are carved as the receive stage carves its slots ([`SLOT_BYTES`]): one
/// allocation per message cost two threads a page fault and a free per message, which
/// held two threads' open at 1.56x-1.77x one thread's while seal made 1.9x.
pub(super) fn open_round(
    plane: &Arc<MemPlane>,
    messages: Vec<Vec<Datagram>>,
    dispatcher_cpus: &[Cpus],
    done: impl Fn() -> bool,
) -> Result<Duration> {
    let lists: Vec<Mutex<Vec<Datagram>>> = messages.into_iter().map(Mutex::new).collect();
    let prepare = |d: usize| -> Vec<Datagram> {
        let made = std::mem::take(&mut *lists[d].lock().unwrap_or_else(|p| p.into_inner()));
        let mut slot = bytes::BytesMut::new();
        made.iter()
            .map(|m| {
                if slot.capacity() < m.data.len() {
                    slot = bytes::BytesMut::with_capacity(SLOT_BYTES);
                }
                slot.extend_from_slice(&m.data);
                Datagram {
                    data: slot.split(),
                    src: m.src,
                }
            })
            .collect()
    };
    let work = |_: usize, ctx: &Ctx, list: Vec<Datagram>| {
        let mut it = list.into_iter();
        loop {
            let mut batch: Vec<Datagram> = it.by_ref().take(BATCH).collect();
            if batch.is_empty() {
                break;
            }
            plane.dispatch_inbound(&mut batch, 0, ctx);
        }
    };
    round(
        plane,
        lists.len(),
        dispatcher_cpus,
        prepare,
        work,
        done,
        "opened messages",
    )
}
