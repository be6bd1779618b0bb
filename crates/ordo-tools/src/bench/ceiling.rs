//! The AEAD ceilings a round is set beside: the same seal or open in a plain loop, on one core
//! and on every crypto thread's CPU at once, timed like the round.

use ordo::host::topology;
use ordo_proto::messages::DATA_HEADER_LEN;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The ceiling: `size`-byte packets sealed (or opened) in a plain loop, `each` packets on each
/// of `cpus` by a thread pinned there, all at once; Gbit/s of inner packets, timed like a
/// round of the pipeline (the same work split over its threads, until the last is done), so
/// that a thread slowed by a neighbour weighs on both sides alike.
pub(super) fn aead_ceiling(size: usize, open: bool, cpus: &[usize], each: usize) -> f64 {
    let ready = Barrier::new(cpus.len());
    let slowest = std::thread::scope(|scope| {
        let loops: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let ready = &ready;
                std::thread::Builder::new()
                    .name(format!("ceiling{cpu}"))
                    .spawn_scoped(scope, move || {
                        let _ = topology::pin_current_thread(&[cpu]);
                        aead_loop(size, open, each, ready)
                    })
                    .expect("spawn an AEAD loop")
            })
            .collect();
        loops
            .into_iter()
            .map(|l| l.join().expect("AEAD loop"))
            .max()
            .unwrap_or_default()
    });
    (cpus.len() * each * size * 8) as f64 / slowest.as_secs_f64().max(1e-9) / 1e9
}

/// One thread's AEAD loop over a single hot buffer, `count` packets; how long it took.
pub(super) fn aead_loop(size: usize, open: bool, count: usize, ready: &Barrier) -> Duration {
    let now = Instant::now();
    let keys = |s, r, we| ordo_proto::handshake::SessionKeys {
        send: zeroize::Zeroizing::new([s; 32]),
        recv: zeroize::Zeroizing::new([r; 32]),
        local_index: 1,
        remote_index: 1,
        we_initiated: we,
    };
    let (a, b) = (
        ordo_proto::session::Session::new(&keys(1, 2, true), now),
        ordo_proto::session::Session::new(&keys(2, 1, false), now),
    );
    let padded = ordo_proto::interface::padded_len(size, 65535);
    let mut buf = vec![0u8; DATA_HEADER_LEN + padded + 16];
    let sealed: Vec<u8> = {
        let mut m = buf.clone();
        a.seal_at(0, padded, &mut m);
        m
    };
    ready.wait();
    let start = Instant::now();
    for n in 0..count as u64 {
        if open {
            buf.copy_from_slice(&sealed);
            std::hint::black_box(b.open_in_place(&mut buf).ok());
        } else {
            a.seal_at(n, padded, &mut buf);
        }
    }
    start.elapsed()
}
