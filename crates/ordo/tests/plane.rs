//! The whole data plane over in-memory ports, in every execution model: two planes, A and B,
//! joined by a `MemoryOuter::pair`, each run by the threads `ordo::threads::start` starts
//! (the same as an interface's), exchanging packets through their inner ports, with faults
//! injected into what B receives. No root, no network: these check the plane's logic (order,
//! replay refusal, drops counted by reason, peers removed or moved under traffic, rekeying);
//! the interop suite checks it over a real kernel against real peers.

use ordo::inner::memory::{MemoryInner, Written};
use ordo::outer::faults::{FaultInjector, Faults};
use ordo::outer::memory::MemoryOuter;
use ordo::placement::model::{Model, PlacementSettings, Plan};
use ordo::plane::stats::Stage;
use ordo::plane::DataPlane;
use ordo::threads::{self, Stop};
use ordo_proto::timers::{REJECT_AFTER_MESSAGES, REKEY_AFTER_MESSAGES};
use ordo_proto::{DropReason, Interface, PeerId, PrivateKey};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

type Plane = DataPlane<MemoryInner, FaultInjector<MemoryOuter>>;

const MODELS: [Model; 4] = [Model::Pool, Model::Inline, Model::Threaded, Model::Auto];
/// Packets injected before waiting for them to arrive: several batches in flight at once
/// (across workers in the pool models), fewer than a memory port's queue holds, so that no
/// queue overflows and every loss in a test is one the test caused.
const WINDOW: u32 = 512;
/// Long enough for a handshake lost to a fault to be retried (REKEY_TIMEOUT is 5 s).
const PATIENCE: Duration = Duration::from_secs(30);
/// The sequence number of the packet that brings a tunnel up.
const HELLO: u32 = u32::MAX;

/// One end of the tunnel: a plane with its threads, and its one peer, the other end.
struct End {
    plane: Arc<Plane>,
    stop: Arc<Stop>,
    threads: Vec<JoinHandle<()>>,
    peer: PeerId,
    ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
}

impl Drop for End {
    fn drop(&mut self) {
        self.stop.request("the test is over");
        self.plane.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Side {
    key: PrivateKey,
    addr: SocketAddr,
    ip: Ipv4Addr,
}

/// A tunnel between A and B in `model`, not yet up; `faults` act on what B receives.
fn tunnel(model: Model, faults: Faults) -> (End, End) {
    let mut rng = ChaCha20Rng::seed_from_u64(faults.seed);
    let a = Side {
        key: PrivateKey::generate(&mut rng),
        addr: "192.0.2.1:51820".parse().unwrap(),
        ip: Ipv4Addr::new(10, 0, 0, 1),
    };
    let b = Side {
        key: PrivateKey::generate(&mut rng),
        addr: "192.0.2.2:51820".parse().unwrap(),
        ip: Ipv4Addr::new(10, 0, 0, 2),
    };
    let config = PlacementSettings {
        model,
        ..Default::default()
    };
    let (a_plan, b_plan) = (Plan::new(&config).unwrap(), Plan::new(&config).unwrap());
    let (a_outer, b_outer) = MemoryOuter::pair(a.addr, a_plan.queues.len(), b.addr, b_plan.queues.len()).unwrap();
    let a_end = end(&a, &b, a_plan, FaultInjector::new(a_outer, Faults::default()));
    let b_end = end(&b, &a, b_plan, FaultInjector::new(b_outer, faults));
    (a_end, b_end)
}

fn end(me: &Side, them: &Side, plan: Plan, outer: FaultInjector<MemoryOuter>) -> End {
    let mut core = Interface::new(Instant::now());
    core.set_mtu(1420);
    core.set_private_key(Some(me.key.clone()));
    let peer = core.add_peer(them.key.public_key()).unwrap();
    core.set_endpoint(peer, them.addr);
    core.add_allowed_ip(peer, ipnet::IpNet::from(IpAddr::from(them.ip)));
    let inner = MemoryInner::keeping(plan.queues.len()).unwrap();
    let plane = DataPlane::new(core, inner, outer, plan);
    plane.start();
    let stop = Arc::new(Stop::default());
    let threads = threads::start(&plane, &stop, || None).unwrap();
    End {
        plane,
        stop,
        threads,
        peer,
        ip: me.ip,
        peer_ip: them.ip,
    }
}

/// An IPv4/UDP packet carrying `seq`, with a payload that depends on it (so that a packet
/// delivered whole is told from one damaged on the way).
fn packet(src: Ipv4Addr, dst: Ipv4Addr, seq: u32) -> Vec<u8> {
    let len = 28 + 4 + (seq % 97) as usize;
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let sum = !fold(
        (0..20)
            .step_by(2)
            .map(|i| u16::from_be_bytes([p[i], p[i + 1]]) as u32)
            .sum(),
    );
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p[20..22].copy_from_slice(&4000u16.to_be_bytes());
    p[22..24].copy_from_slice(&4001u16.to_be_bytes());
    p[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    p[28..32].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in p[32..].iter_mut().enumerate() {
        *b = (seq as usize + i) as u8;
    }
    p
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

impl End {
    fn model(&self) -> Model {
        self.plane.plan.model
    }

    /// The inner queue this end reads its peer's packets on: its peer's queue where the model
    /// has queues (as the kernel keeps a flow on the TUN queue that last wrote it), else the
    /// read stage's.
    fn inner_queue(&self) -> usize {
        if !self.model().has_queues() {
            return 0;
        }
        self.plane.core().peer(self.peer).map_or(0, |p| p.queue as usize)
    }

    /// The host sends packets `seqs` into the tunnel, to the other end.
    fn send(&self, seqs: impl IntoIterator<Item = u32>) {
        let queue = self.inner_queue();
        for seq in seqs {
            let p = packet(self.ip, self.peer_ip, seq);
            let deadline = Instant::now() + PATIENCE;
            // A full queue is the host's backpressure, not a loss: wait for room.
            while !self.plane.inner.inject(queue, &p) {
                assert!(
                    Instant::now() < deadline,
                    "{}: the inner queue stayed full",
                    self.model()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Waits for `n` packets from the other end (at most `timeout`); returns every packet
    /// written meanwhile, checked byte for byte against the one its sequence number names.
    fn receive(&self, n: usize, timeout: Duration) -> Vec<(u32, usize)> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let written = self.plane.inner.wait_written(n - got.len(), left);
            if written.is_empty() && left.is_zero() {
                break;
            }
            got.extend(written.into_iter().map(|w| self.check(w)));
        }
        got
    }

    /// Every packet written so far and not yet taken, checked as [`End::receive`] does.
    fn take_written(&self) -> Vec<(u32, usize)> {
        let written = self.plane.inner.wait_written(0, Duration::ZERO);
        written.into_iter().map(|w| self.check(w)).collect()
    }

    fn check(&self, w: Written) -> (u32, usize) {
        assert!(
            w.packet.len() >= 32,
            "{}: a {}-byte packet",
            self.model(),
            w.packet.len()
        );
        let seq = u32::from_be_bytes(w.packet[28..32].try_into().unwrap());
        assert_eq!(
            w.packet,
            packet(self.peer_ip, self.ip, seq),
            "{}: packet {seq} damaged",
            self.model()
        );
        (seq, w.queue)
    }

    /// Brings the tunnel up from this end: a packet that waits for the handshake, and its
    /// arrival at the other end.
    fn connect(&self, other: &End) {
        self.send([HELLO]);
        let got = other.receive(1, PATIENCE);
        assert_eq!(
            got.first().map(|g| g.0),
            Some(HELLO),
            "{}: the tunnel did not come up",
            self.model()
        );
    }

    fn drops(&self) -> BTreeMap<DropReason, u64> {
        self.plane.core().stats.drops.clone()
    }

    fn received(&self) -> u64 {
        self.plane.stats.stage(Stage::Receive).packets
    }

    fn fault(&self, name: &str) -> u64 {
        use ordo::port::OuterPort;
        let counters = self.plane.outer.counters();
        counters.iter().find(|c| c.name == name).map_or(0, |c| c.value)
    }
}

/// Runs `test` in every execution model at once (each in a thread of its own: most of a test's
/// time is protocol timers), and fails with the models that failed.
fn in_every_model(models: &[Model], test: fn(Model)) {
    let runs: Vec<_> = (models.iter())
        .map(|&m| (m, std::thread::spawn(move || test(m))))
        .collect();
    let failed: Vec<String> = (runs.into_iter())
        .filter_map(|(m, h)| h.join().is_err().then(|| m.to_string()))
        .collect();
    assert!(failed.is_empty(), "failed in: {}", failed.join(", "));
}

/// Sends `n` packets each way at once, a window at a time; each end must get the other's,
/// each once and in the order sent.
fn exchange(a: &End, b: &End, n: u32) {
    std::thread::scope(|s| {
        for (from, to) in [(a, b), (b, a)] {
            s.spawn(move || {
                for start in (0..n).step_by(WINDOW as usize) {
                    let seqs = start..(start + WINDOW).min(n);
                    from.send(seqs.clone());
                    let got: Vec<u32> = to.receive(seqs.len(), PATIENCE).into_iter().map(|g| g.0).collect();
                    assert_eq!(got, seqs.collect::<Vec<_>>(), "{}: not each once, in order", to.model());
                }
            });
        }
    });
}

#[test]
fn each_peer_gets_its_packets_in_order_both_ways_across_workers() {
    in_every_model(&MODELS, |model| {
        let (a, b) = tunnel(model, Faults::default());
        a.connect(&b);
        exchange(&a, &b, 8 * WINDOW);
        for end in [&a, &b] {
            assert_eq!(end.drops(), BTreeMap::new(), "{model}: nothing dropped");
            // A delivery counts its packets once it has written them: the last may still be
            // counting when its packets are seen.
            let expected = 8 * WINDOW as u64 + (end.ip == b.ip) as u64;
            let deadline = Instant::now() + PATIENCE;
            let deliver = loop {
                let deliver = end.plane.stats.stage(Stage::DeliverInbound);
                if deliver.packets >= expected || Instant::now() > deadline {
                    break deliver;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(deliver.packets, expected, "{model}");
            assert!(
                deliver.wakeups > 0 && deliver.wakeups <= deliver.packets,
                "{model}: {deliver:?}"
            );
            // Whoever finishes a lane's head delivers it: no delivery starts before it can.
            // The threaded model rings its delivery thread on every batch instead, as
            // kernel WireGuard's NAPI does, and may find the head still in crypto.
            if model != Model::Threaded {
                assert_eq!(deliver.wasted_wakeups, 0, "{model}: {deliver:?}");
            }
        }
    });
}

/// Sends `n` packets from A once the tunnel is up, with `faults` on B from then on; waits
/// until B has received every datagram the faults let through and either delivered or
/// counted each. Returns the sequence numbers B delivered, in order.
fn through_faults(model: Model, faults: Faults, n: u32) -> (End, End, Vec<u32>) {
    let (a, b) = tunnel(model, Faults::default());
    a.connect(&b);
    let received_before = b.received();
    b.plane.outer.set_faults(faults);
    let mut delivered = Vec::new();
    for start in (0..n).step_by(WINDOW as usize) {
        a.send(start..(start + WINDOW).min(n));
        // Lost ones never arrive: take what came within a moment.
        delivered.extend(
            b.receive(WINDOW as usize, Duration::from_millis(300))
                .into_iter()
                .map(|g| g.0),
        );
    }
    let deadline = Instant::now() + PATIENCE;
    loop {
        let arrived = n as u64 - b.fault("fault_dropped") + b.fault("fault_duplicated");
        let received = b.received() - received_before;
        let dropped: u64 = b.drops().values().sum();
        delivered.extend(b.take_written().into_iter().map(|g| g.0));
        // Every datagram that came through the faults went into the plane, and every one of
        // them was delivered or counted under a reason.
        if received == arrived && delivered.len() as u64 + dropped == received {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{model}: {arrived} arrived, {received} received, {} delivered, {dropped} dropped",
            delivered.len()
        );
        delivered.extend(b.receive(1, Duration::from_millis(100)).into_iter().map(|g| g.0));
    }
    (a, b, delivered)
}

#[test]
fn duplicates_are_refused_as_replays_one_for_one() {
    in_every_model(&MODELS, |model| {
        let faults = Faults {
            seed: 11,
            duplicate: 0.2,
            ..Default::default()
        };
        let n = 4 * WINDOW;
        let (_a, b, delivered) = through_faults(model, faults, n);
        assert_eq!(delivered, (0..n).collect::<Vec<_>>(), "{model}: each once, in order");
        let duplicated = b.fault("fault_duplicated");
        assert!(duplicated > 100, "{model}: {duplicated}");
        let expected = BTreeMap::from([(DropReason::Replay, duplicated)]);
        assert_eq!(b.drops(), expected, "{model}");
    });
}

#[test]
fn truncated_datagrams_are_dropped_and_counted_one_for_one() {
    in_every_model(&MODELS, |model| {
        let faults = Faults {
            seed: 12,
            truncate: 0.1,
            ..Default::default()
        };
        let n = 4 * WINDOW;
        let (_a, b, delivered) = through_faults(model, faults, n);
        let truncated = b.fault("fault_truncated");
        assert!(truncated > 50, "{model}: {truncated}");
        assert_eq!(delivered.len() as u64, n as u64 - truncated, "{model}");
        assert!(delivered.windows(2).all(|w| w[0] < w[1]), "{model}: in order");
        let drops = b.drops();
        // Cut inside the header or short of the tag: malformed; otherwise the tag fails.
        let reasons = [DropReason::Malformed, DropReason::DecryptFailed];
        assert!(drops.keys().all(|r| reasons.contains(r)), "{model}: {drops:?}");
        assert_eq!(drops.values().sum::<u64>(), truncated, "{model}: {drops:?}");
    });
}

#[test]
fn reordering_delay_and_loss_deliver_each_packet_at_most_once() {
    in_every_model(&MODELS, |model| {
        let faults = Faults {
            seed: 13,
            drop: 0.05,
            duplicate: 0.05,
            reorder: 0.1,
            delay: 0.05,
            delay_by: Duration::from_millis(20),
            truncate: 0.05,
        };
        let n = 4 * WINDOW;
        let (_a, b, mut delivered) = through_faults(model, faults, n);
        for kind in [
            "fault_dropped",
            "fault_duplicated",
            "fault_reordered",
            "fault_delayed",
            "fault_truncated",
        ] {
            assert!(b.fault(kind) > 10, "{model}: {kind} {}", b.fault(kind));
        }
        // Every packet neither dropped nor cut arrives, once: the replay window takes what
        // came late (within its 8,128 messages) and refuses the copies.
        let lost = b.fault("fault_dropped") + b.fault("fault_truncated");
        assert_eq!(delivered.len() as u64, n as u64 - lost, "{model}");
        assert!(
            delivered.windows(2).any(|w| w[0] > w[1]),
            "{model}: some came out of order"
        );
        delivered.sort_unstable();
        delivered.dedup();
        assert_eq!(delivered.len() as u64, n as u64 - lost, "{model}: none twice");
        let drops = b.drops();
        let reasons = [DropReason::Replay, DropReason::Malformed, DropReason::DecryptFailed];
        assert!(drops.keys().all(|r| reasons.contains(r)), "{model}: {drops:?}");
        assert!(drops.get(&DropReason::Replay) >= Some(&1), "{model}: {drops:?}");
    });
}

#[test]
fn a_handshake_lost_on_the_way_is_retried() {
    in_every_model(&MODELS, |model| {
        let all = Faults {
            seed: 14,
            drop: 1.0,
            ..Default::default()
        };
        let (a, b) = tunnel(model, all);
        a.send([HELLO]);
        let deadline = Instant::now() + PATIENCE;
        while b.fault("fault_dropped") == 0 {
            assert!(Instant::now() < deadline, "{model}: no initiation reached B");
            std::thread::sleep(Duration::from_millis(10));
        }
        b.plane.outer.set_faults(Faults::default());
        let got = b.receive(1, PATIENCE);
        assert_eq!(
            got.first().map(|g| g.0),
            Some(HELLO),
            "{model}: the waiting packet, after the retry"
        );
        let initiated = a.plane.core().stats.handshakes_initiated;
        assert!(initiated >= 2, "{model}: {initiated} initiations");
    });
}

#[test]
fn a_rekey_under_traffic_loses_nothing() {
    in_every_model(&MODELS, |model| {
        let (a, b) = tunnel(model, Faults::default());
        a.connect(&b);
        // A's session nears REKEY_AFTER_MESSAGES: its next sends start a handshake (once the
        // one-initiation-per-REKEY_TIMEOUT limit lets it), while traffic goes on.
        a.plane
            .core()
            .set_send_counter_for_test(a.peer, REKEY_AFTER_MESSAGES - 100);
        let deadline = Instant::now() + PATIENCE;
        let mut seq = 0;
        let completed = || b.plane.core().stats.handshakes_completed;
        // Until B has taken the new session, and a few windows on it.
        let mut after = 0;
        while after < 4 {
            assert!(Instant::now() < deadline, "{model}: no rekey");
            a.send(seq..seq + WINDOW);
            let got: Vec<u32> = b.receive(WINDOW as usize, PATIENCE).into_iter().map(|g| g.0).collect();
            assert_eq!(
                got,
                (seq..seq + WINDOW).collect::<Vec<_>>(),
                "{model}: each once, in order"
            );
            seq += WINDOW;
            if completed() >= 2 {
                after += 1;
            } else {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        assert_eq!(a.drops(), BTreeMap::new(), "{model}");
        assert_eq!(b.drops(), BTreeMap::new(), "{model}");
    });
}

/// A session that reaches REJECT_AFTER_MESSAGES stops sending, whatever the batches its
/// nonces are reserved in: what follows waits for the new session (the rekey its use started)
/// and goes on it. No counter is used twice or past the limit: B would refuse either
/// (replay window), and refuses nothing.
#[test]
fn sending_stops_at_reject_after_messages_and_a_new_session_takes_over() {
    in_every_model(&MODELS, |model| {
        let (a, b) = tunnel(model, Faults::default());
        a.connect(&b);
        a.plane
            .core()
            .set_send_counter_for_test(a.peer, REJECT_AFTER_MESSAGES - 100);
        // Below the limit, then through it: fewer than a peer's 128 staged packets wait for
        // the new session.
        let n = 200;
        for start in (0..n).step_by(50) {
            a.send(start..start + 50);
            std::thread::sleep(Duration::from_millis(50));
        }
        let got: Vec<u32> = b.receive(n as usize, PATIENCE).into_iter().map(|g| g.0).collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "{model}: each once, in order");
        assert!(b.plane.core().stats.handshakes_completed >= 2, "{model}: a new session");
        assert_eq!(
            b.drops(),
            BTreeMap::new(),
            "{model}: no counter reused or past the limit"
        );
        assert_eq!(a.drops(), BTreeMap::new(), "{model}: nothing lost waiting");
    });
}

#[test]
fn a_peer_removed_in_flight_has_each_packet_delivered_or_counted_then_returns() {
    in_every_model(&MODELS, |model| {
        let (a, b) = tunnel(model, Faults::default());
        a.connect(&b);
        let received_before = b.received();
        let n = 3000;
        a.send(0..n / 2);
        let mut delivered = b.receive(200, PATIENCE).len() as u64;
        let key = a.plane.core().public_key().unwrap();
        b.plane.core().remove_peer(b.peer);
        a.send(n / 2..n);
        // Every datagram sent reaches B's plane; each is delivered or counted, whether it
        // was in crypto, waiting in its lane or not yet received when the peer went.
        let deadline = Instant::now() + PATIENCE;
        loop {
            delivered += b.take_written().len() as u64;
            let received = b.received() - received_before;
            let dropped: u64 = b.drops().values().sum();
            if received == n as u64 && delivered + dropped == received {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{model}: {received} received, {delivered} delivered, {dropped} dropped"
            );
            delivered += b.receive(1, Duration::from_millis(100)).len() as u64;
        }
        assert!(
            b.drops().contains_key(&DropReason::UnknownReceiver),
            "{model}: {:?}",
            b.drops()
        );
        // Taken back, it starts afresh: B's packet brings a new handshake, then both ways.
        let peer = {
            let mut core = b.plane.core();
            let p = core.add_peer(key).unwrap();
            core.set_endpoint(p, "192.0.2.1:51820".parse().unwrap());
            core.add_allowed_ip(p, ipnet::IpNet::from(IpAddr::from(a.ip)));
            p
        };
        let mut b = b;
        b.peer = peer;
        b.connect(&a);
        a.send(0..WINDOW);
        assert_eq!(b.receive(WINDOW as usize, PATIENCE).len(), WINDOW as usize, "{model}");
    });
}

#[test]
fn a_moved_peer_is_steered_to_its_new_queue() {
    in_every_model(&[Model::Inline, Model::Auto], |model| {
        let (a, b) = tunnel(model, Faults::default());
        let queues = b.plane.plan.queues.len();
        assert!(queues >= 2, "{model}: this test needs two CPUs, for two queues");
        a.connect(&b);
        let from = b.inner_queue();
        a.send(0..WINDOW);
        let got = b.receive(WINDOW as usize, PATIENCE);
        assert!(got.iter().all(|g| g.1 == from), "{model}: on queue {from}");

        let to = (from + 1) % queues;
        let receive_of = |name: &str| {
            let threads = b.plane.stats.threads();
            threads
                .iter()
                .filter(|t| t.name == name)
                .map(|t| {
                    t.stage(Stage::Receive)
                        .packets
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
                .sum::<u64>()
        };
        let before = receive_of(&format!("queue{to}"));
        let steered = b.plane.outer.port().steer_calls();
        assert!(b.plane.move_peer(b.peer, to as u32, Instant::now(), SystemTime::now()));
        assert_eq!(
            b.plane.outer.port().steer_calls(),
            steered + 1,
            "{model}: steering applied at once"
        );
        let exceptions = b.plane.outer.port().exceptions();
        assert!(
            exceptions.iter().any(|e| e.queue as usize == to),
            "{model}: {exceptions:?}"
        );
        assert_eq!(b.inner_queue(), to);

        a.send(WINDOW..2 * WINDOW);
        let got = b.receive(WINDOW as usize, PATIENCE);
        let seqs: Vec<u32> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            seqs,
            (WINDOW..2 * WINDOW).collect::<Vec<_>>(),
            "{model}: each once, in order"
        );
        assert!(got.iter().all(|g| g.1 == to), "{model}: written to queue {to}");
        let handled = receive_of(&format!("queue{to}")) - before;
        assert!(
            handled >= WINDOW as u64,
            "{model}: queue{to}'s thread received {handled}"
        );
    });
}
