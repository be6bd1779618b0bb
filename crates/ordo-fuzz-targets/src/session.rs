//! The stateful target: A and B exchanging traffic through an adversary the input scripts,
//! who drops, duplicates, replays, corrupts, truncates and redirects datagrams, steps time and
//! changes the configuration. Invariants, checked throughout: no panic; every datagram that
//! is not taken is counted under one drop reason; an endpoint moves only for an authentic
//! message; no sender uses a nonce twice in a session; each inner packet is delivered at most
//! once, and only one that the other side sent. Once the adversary stops, the tunnel comes
//! back both ways by itself.

use crate::proto::{addr, ipv4, receive_checked, Pair, ADDR_A, ADDR_B, ADDR_ELSEWHERE};
use ordo_proto::messages::TYPE_DATA;
use ordo_proto::{Received, Sent, SEND_HEADROOM};
use std::collections::{HashSet, VecDeque};
use std::time::Duration;

/// The simulated time a script may step: past every timer of the protocol (key erasure at
/// REJECT_AFTER_TIME * 3 = 540 s, a session's rekeys every REKEY_AFTER_TIME = 120 s) with
/// room to spare. Beyond it the timers only repeat, and a script that stepped hours made
/// dozens of handshakes per execution: most of the target's time.
const SCRIPTED_TIME: Duration = Duration::from_secs(900);

/// A datagram in flight.
#[derive(Clone)]
struct Datagram {
    to_b: bool,
    bytes: Vec<u8>,
}

struct World {
    pair: Pair,
    wire: VecDeque<Datagram>,
    /// Everything either side ever sent, for replays.
    history: Vec<Datagram>,
    /// (sender is A, receiver index, counter) of every data message sent.
    nonces: HashSet<(bool, [u8; 4], u64)>,
    /// Inner packet numbers sent by each side, and delivered at each side.
    sent_by_a: HashSet<u64>,
    sent_by_b: HashSet<u64>,
    delivered_at_a: HashSet<u64>,
    delivered_at_b: HashSet<u64>,
    next_id: u64,
}

impl World {
    fn new() -> World {
        World {
            pair: Pair::new(),
            wire: VecDeque::new(),
            history: Vec::new(),
            nonces: HashSet::new(),
            sent_by_a: HashSet::new(),
            sent_by_b: HashSet::new(),
            delivered_at_a: HashSet::new(),
            delivered_at_b: HashSet::new(),
            next_id: 0,
        }
    }

    /// A datagram leaves a side: its nonce must be new.
    fn emit(&mut self, to_b: bool, bytes: Vec<u8>) {
        if bytes.first() == Some(&TYPE_DATA) && bytes.len() >= 16 {
            let receiver: [u8; 4] = bytes[4..8].try_into().expect("4 bytes");
            let counter = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
            assert!(
                self.nonces.insert((!to_b, receiver, counter)),
                "nonce {counter} sent twice"
            );
        }
        let d = Datagram { to_b, bytes };
        self.history.push(d.clone());
        self.wire.push_back(d);
    }

    /// Whatever either side has queued for the network goes on the wire.
    fn collect(&mut self) {
        while let Some(t) = self.pair.a.poll_transmit() {
            self.emit(true, t.payload);
        }
        while let Some(t) = self.pair.b.poll_transmit() {
            self.emit(false, t.payload);
        }
    }

    fn send(&mut self, from_a: bool) {
        let id = self.next_id;
        self.next_id += 1;
        let inner = if from_a {
            ipv4([10, 0, 0, 1], [10, 0, 0, 2], &id.to_be_bytes())
        } else {
            ipv4([10, 0, 0, 2], [10, 0, 0, 1], &id.to_be_bytes())
        };
        let (now, wall) = (self.pair.now, self.pair.wall());
        let mut out = vec![0u8; inner.len() + SEND_HEADROOM];
        let side = if from_a { &mut self.pair.a } else { &mut self.pair.b };
        let sent = side.send(now, wall, &inner, &mut out);
        if from_a {
            &mut self.sent_by_a
        } else {
            &mut self.sent_by_b
        }
        .insert(id);
        if let Sent::Data { len, .. } = sent {
            out.truncate(len);
            self.emit(from_a, out);
        }
        self.collect();
    }

    fn deliver(&mut self, d: Datagram, from_elsewhere: bool) {
        let (now, wall) = (self.pair.now, self.pair.wall());
        let src = addr(match (from_elsewhere, d.to_b) {
            (true, _) => ADDR_ELSEWHERE,
            (false, true) => ADDR_A,
            (false, false) => ADDR_B,
        });
        let mut buf = d.bytes;
        let side = if d.to_b { &mut self.pair.b } else { &mut self.pair.a };
        if let Received::Packet { range, .. } = receive_checked(side, now, wall, src, &mut buf) {
            let p = &buf[range];
            let id = u64::from_be_bytes(p[20..28].try_into().expect("our packets carry an id"));
            let (sent, delivered) = if d.to_b {
                (&self.sent_by_a, &mut self.delivered_at_b)
            } else {
                (&self.sent_by_b, &mut self.delivered_at_a)
            };
            assert!(sent.contains(&id), "packet {id} was never sent");
            assert!(delivered.insert(id), "packet {id} delivered twice");
        }
        self.collect();
    }

    fn advance(&mut self, d: Duration) {
        self.pair.now += d;
        let (now, wall) = (self.pair.now, self.pair.wall());
        self.pair.a.tick(now, wall);
        self.pair.b.tick(now, wall);
        self.collect();
    }

    /// Time stepped by the script, up to [`SCRIPTED_TIME`] in all.
    fn script_advance(&mut self, d: Duration) {
        let left = SCRIPTED_TIME.saturating_sub(self.pair.now - self.pair.t0);
        if !left.is_zero() {
            self.advance(d.min(left));
        }
    }

    /// One step of the adversary's script.
    fn step(&mut self, op: u8, arg: u8) {
        match op % 12 {
            0 => self.send(true),
            1 => self.send(false),
            2 => {
                if let Some(d) = self.wire.pop_front() {
                    self.deliver(d, false);
                }
            }
            3 => {
                self.wire.pop_front();
            }
            4 => {
                if let Some(d) = self.wire.front().cloned() {
                    self.wire.push_back(d);
                }
            }
            5 => {
                if !self.history.is_empty() {
                    let d = self.history[arg as usize % self.history.len()].clone();
                    self.deliver(d, false);
                }
            }
            6 => {
                if let Some(d) = self.wire.front_mut().filter(|d| !d.bytes.is_empty()) {
                    let at = arg as usize * 7 % d.bytes.len();
                    d.bytes[at] ^= 1 << (arg % 8);
                }
            }
            7 => self.script_advance(Duration::from_millis(arg as u64 * 50)),
            8 => self.script_advance(Duration::from_secs(arg as u64 * 4)),
            9 => {
                if let Some(d) = self.wire.pop_front() {
                    self.deliver(d, true);
                }
            }
            10 => {
                // The configuration changes: B's peer entry at A removed and added again
                // (as `wg syncconf` may), or a persistent keepalive set.
                let now = self.pair.now;
                if arg.is_multiple_of(2) {
                    let p = &mut self.pair;
                    let key = p.a.peer(p.pa).expect("B is A's peer").public_key;
                    p.a.remove_peer(p.pa);
                    p.pa = p.a.add_peer(key).expect("re-added");
                    p.a.set_endpoint(p.pa, addr(ADDR_B));
                    p.a.add_allowed_ip(p.pa, "10.0.0.2/32".parse().expect("a net"));
                } else {
                    self.pair
                        .b
                        .set_persistent_keepalive(self.pair.pb, (arg % 30) as u16, now);
                }
            }
            _ => {
                if let Some(d) = self.wire.front_mut() {
                    d.bytes.truncate(arg as usize);
                }
            }
        }
    }

    /// The adversary is gone: every datagram arrives, and timers run.
    fn settle(&mut self, seconds: u64) {
        for _ in 0..seconds {
            while let Some(d) = self.wire.pop_front() {
                self.deliver(d, false);
            }
            self.advance(Duration::from_secs(1));
        }
        while let Some(d) = self.wire.pop_front() {
            self.deliver(d, false);
        }
    }

    /// Sends from one side until the other receives, within `seconds` of simulated time.
    fn comes_back(&mut self, from_a: bool, seconds: u64) -> bool {
        for _ in 0..seconds {
            let before = if from_a {
                self.delivered_at_b.len()
            } else {
                self.delivered_at_a.len()
            };
            self.send(from_a);
            self.settle(1);
            let after = if from_a {
                self.delivered_at_b.len()
            } else {
                self.delivered_at_a.len()
            };
            if after > before {
                return true;
            }
        }
        false
    }
}

/// Runs the script (pairs of bytes: operation, argument), then checks the tunnel recovers.
pub fn run(data: &[u8]) {
    let mut w = World::new();
    for s in data.chunks_exact(2).take(512) {
        w.step(s[0], s[1]);
    }
    // Within a few handshake attempts (REKEY_TIMEOUT 5 s, with jitter), a cookie round and
    // the 20 ms initiation spacing: a minute of simulated time is ample.
    assert!(w.comes_back(true, 60), "A->B did not come back");
    assert!(w.comes_back(false, 60), "B->A did not come back");
}

pub fn seeds() -> Vec<Vec<u8>> {
    vec![
        // A sends, everything is delivered, B answers.
        vec![0, 0, 2, 0, 2, 0, 2, 0, 1, 0, 2, 0],
        // The initiation is lost, two seconds pass, a retransmit after REKEY_TIMEOUT.
        vec![0, 0, 3, 0, 7, 40, 7, 80, 2, 0, 2, 0, 2, 0],
        // Duplicates and replays of every kind.
        vec![
            0, 0, 4, 0, 2, 0, 2, 0, 2, 0, 2, 0, 5, 0, 5, 1, 5, 2, 0, 0, 4, 0, 2, 0, 2, 0,
        ],
        // A message from elsewhere, then corrupted and truncated ones.
        vec![0, 0, 2, 0, 2, 0, 0, 0, 9, 0, 0, 0, 6, 3, 2, 0, 0, 0, 11, 40, 2, 0],
        // Long silence (key erasure), keepalives, a peer re-added.
        vec![
            0, 0, 2, 0, 2, 0, 2, 0, 8, 255, 8, 255, 10, 5, 8, 100, 10, 0, 0, 0, 2, 0, 2, 0,
        ],
    ]
}
