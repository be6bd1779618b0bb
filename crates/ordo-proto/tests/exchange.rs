//! Two protocol cores talking to each other through a fake network and a fake clock: the
//! handshake, transport, and every timer of the whitepaper, with no socket and no sleep.

use ordo_proto::messages::{DataHeader, DATA_HEADER_LEN};
use ordo_proto::timers::*;
use ordo_proto::{
    Accepted, DropReason, Interface, OpenedMessage, PeerId, PresharedKey, PrivateKey, Received, Sent, SEND_HEADROOM,
};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ADDR_A: &str = "192.0.2.1:51820";
const ADDR_B: &str = "192.0.2.2:51820";

fn ipv4(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p.extend_from_slice(payload);
    p
}

/// Side A (10.0.0.1) and side B (10.0.0.2), each the other's only peer.
struct Net {
    a: Interface,
    b: Interface,
    pa: PeerId, // B as A's peer
    pb: PeerId, // A as B's peer
    t0: Instant,
    now: Instant,
    /// Seconds both sides' wall clocks were stepped by (NTP, a restored VM).
    wall_step: i64,
    addr_a: SocketAddr,
    addr_b: SocketAddr,
    /// Data delivered to each side's TUN, in order.
    tun_a: Vec<Vec<u8>>,
    tun_b: Vec<Vec<u8>>,
    /// Datagrams sent by each side (to inspect or replay).
    wire_from_a: Vec<Vec<u8>>,
    wire_from_b: Vec<Vec<u8>>,
    /// While false, datagrams toward that side are lost.
    a_reachable: bool,
    b_reachable: bool,
}

impl Net {
    fn new(psk: Option<PresharedKey>) -> Net {
        let t0 = Instant::now();
        let mut a = Interface::with_rng(t0, ChaCha20Rng::seed_from_u64(1));
        let mut b = Interface::with_rng(t0, ChaCha20Rng::seed_from_u64(2));
        let ka = PrivateKey::from_bytes([0x11; 32]);
        let kb = PrivateKey::from_bytes([0x22; 32]);
        let (pub_a, pub_b) = (ka.public_key(), kb.public_key());
        a.set_private_key(Some(ka));
        b.set_private_key(Some(kb));
        let pa = a.add_peer(pub_b).unwrap();
        let pb = b.add_peer(pub_a).unwrap();
        let (addr_a, addr_b) = (ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap());
        a.set_endpoint(pa, addr_b);
        b.set_endpoint(pb, addr_a);
        a.add_allowed_ip(pa, "10.0.0.2/32".parse().unwrap());
        b.add_allowed_ip(pb, "10.0.0.1/32".parse().unwrap());
        if let Some(psk) = psk {
            a.set_preshared_key(pa, psk.clone());
            b.set_preshared_key(pb, psk);
        }
        Net {
            a,
            b,
            pa,
            pb,
            t0,
            now: t0,
            wall_step: 0,
            addr_a,
            addr_b,
            tun_a: vec![],
            tun_b: vec![],
            wire_from_a: vec![],
            wire_from_b: vec![],
            a_reachable: true,
            b_reachable: true,
        }
    }

    fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000_u64.saturating_add_signed(self.wall_step)) + (self.now - self.t0)
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        let w = self.wall();
        self.a.tick(self.now, w);
        self.b.tick(self.now, w);
        self.pump();
    }

    /// Delivers one datagram; returns what the receiver made of it.
    fn deliver(&mut self, to_b: bool, mut dgram: Vec<u8>) -> Received {
        let (now, wall) = (self.now, self.wall());
        let (rx, src, tun) = if to_b {
            (&mut self.b, self.addr_a, &mut self.tun_b)
        } else {
            (&mut self.a, self.addr_b, &mut self.tun_a)
        };
        let r = rx.receive(now, wall, src, &mut dgram);
        if let Received::Packet { range, .. } = &r {
            tun.push(dgram[range.clone()].to_vec());
        }
        r
    }

    /// Moves control messages between the sides until both are quiet.
    fn pump(&mut self) {
        for _ in 0..100 {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                assert_eq!(t.to, self.addr_b);
                self.wire_from_a.push(t.payload.clone());
                if self.b_reachable {
                    self.deliver(true, t.payload);
                }
                moved = true;
            }
            while let Some(t) = self.b.poll_transmit() {
                assert_eq!(t.to, self.addr_a);
                self.wire_from_b.push(t.payload.clone());
                if self.a_reachable {
                    self.deliver(false, t.payload);
                }
                moved = true;
            }
            if !moved {
                return;
            }
        }
        panic!("the two sides never went quiet");
    }

    /// A sends an inner packet to B (true) or B to A (false); returns what send said.
    fn send(&mut self, from_a: bool, payload: &[u8]) -> Sent {
        let (now, wall) = (self.now, self.wall());
        let packet = if from_a {
            ipv4([10, 0, 0, 1], [10, 0, 0, 2], payload)
        } else {
            ipv4([10, 0, 0, 2], [10, 0, 0, 1], payload)
        };
        let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
        let tx = if from_a { &mut self.a } else { &mut self.b };
        let sent = tx.send(now, wall, &packet, &mut out);
        if let Sent::Data { len, .. } = sent {
            out.truncate(len);
            if from_a {
                self.wire_from_a.push(out.clone());
                if self.b_reachable {
                    self.deliver(true, out);
                }
            } else {
                self.wire_from_b.push(out.clone());
                if self.a_reachable {
                    self.deliver(false, out);
                }
            }
        }
        self.pump();
        sent
    }

    fn initiations_from_a(&self) -> usize {
        self.wire_from_a.iter().filter(|d| d[0] == 1).count()
    }
    fn initiations_from_b(&self) -> usize {
        self.wire_from_b.iter().filter(|d| d[0] == 1).count()
    }
}

fn established() -> Net {
    let mut n = Net::new(None);
    assert!(matches!(n.send(true, b"hello"), Sent::Staged(_)));
    assert_eq!(
        n.tun_b.len(),
        1,
        "the staged packet went out once the handshake completed"
    );
    n
}

#[test]
fn handshake_then_data_both_ways() {
    let mut n = established();
    assert_eq!(&n.tun_b[0][20..], b"hello");
    assert!(
        matches!(n.send(false, b"world"), Sent::Data { .. }),
        "the responder's session is confirmed"
    );
    assert_eq!(&n.tun_a[0][20..], b"world");
    assert_eq!(n.a.stats.handshakes_completed, 1);
    assert_eq!(n.b.stats.handshakes_completed, 1);
    assert!(n.a.peer(n.pa).unwrap().last_handshake.is_some());
    let (a, b) = (n.a.peer(n.pa).unwrap(), n.b.peer(n.pb).unwrap());
    assert_eq!(a.tx_bytes, b.rx_bytes, "both ends count the same bytes");
    assert_eq!(a.rx_bytes, b.tx_bytes);
}

#[test]
fn preshared_key_must_match() {
    let mut n = Net::new(Some(PresharedKey::from_bytes([7; 32])));
    n.send(true, b"x");
    assert_eq!(n.tun_b.len(), 1);
    let mut n = Net::new(None);
    n.b.set_preshared_key(n.pb, PresharedKey::from_bytes([7; 32]));
    n.send(true, b"x");
    assert!(n.tun_b.is_empty());
    assert_eq!(
        n.a.stats.dropped(DropReason::HandshakeDecrypt),
        1,
        "A cannot open B's response"
    );
}

#[test]
fn data_is_padded_to_16_and_trimmed_on_arrival() {
    let mut n = established();
    n.send(true, b"abc"); // 23-byte packet
    let last = n.wire_from_a.last().unwrap();
    assert_eq!(last.len(), 16 + 32 + 16, "23 bytes pad to 32");
    assert_eq!(n.tun_b.last().unwrap().len(), 23);
}

#[test]
fn replayed_data_is_dropped() {
    let mut n = established();
    n.send(true, b"once");
    let copy = n.wire_from_a.last().unwrap().clone();
    assert_eq!(n.deliver(true, copy), Received::Dropped(DropReason::Replay));
    assert_eq!(n.tun_b.len(), 2);
}

#[test]
fn tampered_data_is_dropped_and_does_not_move_the_window() {
    let mut n = established();
    n.b_reachable = false;
    n.send(true, b"real");
    n.b_reachable = true;
    let real = n.wire_from_a.last().unwrap().clone();
    let mut forged = real.clone();
    *forged.last_mut().unwrap() ^= 1;
    assert_eq!(n.deliver(true, forged), Received::Dropped(DropReason::DecryptFailed));
    assert!(
        matches!(n.deliver(true, real), Received::Packet { .. }),
        "the authentic packet still arrives"
    );
}

/// The data plane's path: messages opened outside the core, accepted as one run. Each gets
/// its own verdict in order (replay window, allowed IPs, keepalive), the drops are counted
/// by reason, and the peer's part is done once: the endpoint roams to the run's last source,
/// the bytes of every authentic message are counted.
#[test]
fn a_run_of_opened_messages_gets_a_verdict_each() {
    let mut n = established();
    // A seals; nothing reaches B but through the run below.
    let seal = |n: &mut Net, src: [u8; 4], payload: &[u8]| {
        let (now, wall) = (n.now, n.wall());
        if payload.is_empty() {
            n.a.send_keepalive(n.pa, now, wall);
            return n.a.poll_transmit().expect("a keepalive").payload;
        }
        let packet = ipv4(src, [10, 0, 0, 2], payload);
        let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
        let Sent::Data { len, .. } = n.a.send(now, wall, &packet, &mut out) else {
            panic!("A has a session");
        };
        out.truncate(len);
        out
    };
    let mut good = seal(&mut n, [10, 0, 0, 1], b"fresh");
    let mut replayed = n.wire_from_a.last().unwrap().clone(); // "hello", delivered before
    let mut keepalive = seal(&mut n, [10, 0, 0, 1], b"");
    let mut spoofed = seal(&mut n, [10, 9, 9, 9], b"spoof");
    let (id, session) = n.b.receiving_session(DataHeader::parse(&good).receiver).unwrap();
    let roamed: SocketAddr = "198.51.100.7:4242".parse().unwrap();
    let rx_before = n.b.peer(n.pb).unwrap().rx_bytes;
    let drops_before = n.b.stats.dropped(DropReason::Replay);
    let mut opened = Vec::new();
    for m in [&mut good, &mut replayed, &mut keepalive, &mut spoofed] {
        let (counter, len) = session.open_in_place(m).unwrap();
        opened.push((counter, m.len(), len));
    }
    let bufs = [&good, &replayed, &keepalive, &spoofed];
    let moved: SocketAddr = "198.51.100.6:4242".parse().unwrap();
    let sources = [moved, moved, moved, roamed];
    let messages = opened
        .iter()
        .zip(bufs)
        .zip(sources)
        .map(|((&(counter, datagram_len, len), buf), src)| OpenedMessage {
            counter,
            src,
            datagram_len,
            plain: &buf[DATA_HEADER_LEN..DATA_HEADER_LEN + len],
        });
    let mut verdicts = Vec::new();
    let (now, wall) = (n.now, n.wall());
    n.b.accept_data_run(now, wall, id, &session, messages, |v| verdicts.push(v));
    assert_eq!(
        verdicts,
        vec![
            Ok(Accepted::Packet { len: 25 }),
            Err(DropReason::Replay),
            Ok(Accepted::Keepalive),
            Err(DropReason::AllowedIpsMismatch),
        ]
    );
    assert_eq!(n.b.stats.dropped(DropReason::Replay), drops_before + 1);
    assert_eq!(n.b.stats.dropped(DropReason::AllowedIpsMismatch), 1);
    let peer = n.b.peer(n.pb).unwrap();
    assert_eq!(peer.endpoint, Some(roamed), "the run's last source is the endpoint");
    let authentic = (good.len() + keepalive.len() + spoofed.len()) as u64;
    assert_eq!(
        peer.rx_bytes - rx_before,
        authentic,
        "every authentic message is counted"
    );
}

#[test]
fn inner_source_must_be_an_allowed_ip() {
    let mut n = established();
    n.b.clear_allowed_ips(n.pb);
    n.b.add_allowed_ip(n.pb, "10.9.9.9/32".parse().unwrap());
    n.send(true, b"spoof");
    assert_eq!(n.b.stats.dropped(DropReason::AllowedIpsMismatch), 1);
    assert_eq!(n.tun_b.len(), 1);
}

#[test]
fn no_route_and_no_endpoint_are_counted() {
    let mut n = established();
    let mut out = vec![0u8; 100];
    let p = ipv4([10, 0, 0, 1], [10, 5, 5, 5], b"");
    assert_eq!(
        n.a.send(n.now, n.wall(), &p, &mut out),
        Sent::Dropped(DropReason::NoRoute)
    );
    assert_eq!(
        n.a.send(n.now, n.wall(), b"\x45\x00", &mut out),
        Sent::Dropped(DropReason::OutgoingMalformed)
    );
}

#[test]
fn replayed_initiation_is_refused() {
    let mut n = established();
    let init = n.wire_from_a.iter().find(|d| d[0] == 1).unwrap().clone();
    n.advance(Duration::from_secs(1));
    assert_eq!(n.deliver(true, init), Received::Dropped(DropReason::HandshakeReplay));
}

#[test]
fn initiation_flood_is_refused_within_20ms() {
    let mut n = Net::new(None);
    n.b_reachable = false;
    n.send(true, b"x");
    let first = n.wire_from_a[0].clone();
    n.b_reachable = true;
    assert!(matches!(n.deliver(true, first), Received::Handshake(_)));
    // A second, newer initiation 1 ms later (built by a fresh A with the same keys).
    let mut n2 = Net::new(None);
    n2.now = n.now;
    n2.b_reachable = false;
    n.now += Duration::from_millis(1);
    n2.now = n.now + Duration::from_secs(1); // newer timestamp
    n2.send(true, b"x");
    let second = n2.wire_from_a[0].clone();
    assert_eq!(n.deliver(true, second), Received::Dropped(DropReason::HandshakeFlood));
}

#[test]
fn keepalive_when_data_received_and_nothing_sent() {
    let mut n = established();
    let before = n.wire_from_b.len();
    n.advance(KEEPALIVE_TIMEOUT - Duration::from_millis(1));
    assert_eq!(n.wire_from_b.len(), before);
    n.advance(Duration::from_millis(1));
    let ka = &n.wire_from_b[before];
    assert_eq!((ka[0], ka.len()), (4, 32), "a keepalive is an empty data message");
}

#[test]
fn new_handshake_when_sent_data_goes_unanswered() {
    let mut n = established();
    n.advance(Duration::from_secs(30)); // quiet
    n.a_reachable = false; // B's answers are lost
    n.send(true, b"anyone?");
    let before = n.initiations_from_a();
    n.advance(KEEPALIVE_TIMEOUT + REKEY_TIMEOUT - Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), before);
    n.advance(Duration::from_millis(MAX_JITTER_MS + 1));
    assert_eq!(n.initiations_from_a(), before + 1);
}

#[test]
fn handshake_retransmits_then_gives_up() {
    let mut n = Net::new(None);
    n.b_reachable = false;
    n.send(true, b"x");
    assert_eq!(n.initiations_from_a(), 1);
    n.advance(REKEY_TIMEOUT - Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), 1, "no retry before REKEY_TIMEOUT");
    for _ in 0..200 {
        n.advance(Duration::from_millis(500));
    }
    assert_eq!(
        n.initiations_from_a(),
        1 + MAX_HANDSHAKE_ATTEMPTS as usize,
        "retries stop after REKEY_ATTEMPT_TIME"
    );
    assert_eq!(n.a.peer(n.pa).unwrap().staged_len(), 0, "what waited is dropped");
    assert_eq!(n.a.stats.dropped(DropReason::StagedOverflow), 1);
}

#[test]
fn handshakes_are_rate_limited_to_one_per_rekey_timeout() {
    let mut n = Net::new(None);
    n.b_reachable = false;
    for _ in 0..10 {
        n.send(true, b"x");
        n.now += Duration::from_millis(100);
    }
    assert_eq!(n.initiations_from_a(), 1);
    assert_eq!(n.a.peer(n.pa).unwrap().staged_len(), 10);
}

#[test]
fn initiator_rekeys_after_rekey_after_time_and_responder_does_not() {
    let mut n = established();
    n.send(false, b"confirm");
    n.now += REKEY_AFTER_TIME;
    let (ia, ib) = (n.initiations_from_a(), n.initiations_from_b());
    n.send(false, b"from responder");
    assert_eq!(n.initiations_from_b(), ib, "only the initiator rekeys on time");
    n.send(true, b"from initiator");
    assert_eq!(n.initiations_from_a(), ia + 1);
    assert_eq!(n.a.stats.handshakes_completed, 2);
    assert!(matches!(n.send(true, b"new keys"), Sent::Data { .. }));
    assert_eq!(&n.tun_b.last().unwrap()[20..], b"new keys");
}

/// The wall clock stepped back an hour (or forward) does not lock the initiator out: its next
/// initiation's timestamp is still newer than the last the responder accepted, so the rekey
/// goes through (the responder refused it as a replay for the hour before).
#[test]
fn a_wall_clock_stepped_by_an_hour_does_not_stop_the_rekey() {
    for (step, name) in [(-3600, "back"), (3600, "forward")] {
        let mut n = established();
        n.send(false, b"confirm");
        n.wall_step = step;
        n.now += REKEY_AFTER_TIME;
        n.send(true, b"from initiator");
        assert_eq!(n.a.stats.handshakes_completed, 2, "stepped {name}");
        assert_eq!(
            n.b.stats.drops.get(&DropReason::HandshakeReplay),
            None,
            "stepped {name}"
        );
        assert!(matches!(n.send(true, b"new keys"), Sent::Data { .. }));
        assert_eq!(&n.tun_b.last().unwrap()[20..], b"new keys", "stepped {name}");
    }
}

#[test]
fn receiving_side_of_an_old_initiator_session_rekeys_before_reject() {
    let mut n = established();
    // A initiated. A only receives (B sends) for REJECT - KEEPALIVE - REKEY_TIMEOUT.
    n.now += REKEY_ON_RECEIVE_AGE;
    let ia = n.initiations_from_a();
    n.send(false, b"late");
    assert_eq!(n.initiations_from_a(), ia + 1);
}

#[test]
fn sessions_expire_after_reject_after_time() {
    let mut n = established();
    n.b_reachable = false;
    n.send(true, b"old");
    let old = n.wire_from_a.last().unwrap().clone();
    n.now += REJECT_AFTER_TIME;
    assert_eq!(n.deliver(true, old), Received::Dropped(DropReason::ExpiredSession));
    n.b_reachable = true;
    assert!(
        matches!(n.send(true, b"x"), Sent::Staged(_)),
        "no sending on an expired session"
    );
}

#[test]
fn message_limits_force_rekey_then_refuse() {
    let mut n = established();
    n.a.set_send_counter_for_test(n.pa, REKEY_AFTER_MESSAGES + 1);
    n.now += REKEY_TIMEOUT; // past the handshake rate limit
    let ia = n.initiations_from_a();
    n.send(true, b"x");
    assert_eq!(n.initiations_from_a(), ia + 1, "rekey after 2^60 messages");
    n.a.set_send_counter_for_test(n.pa, REJECT_AFTER_MESSAGES);
    n.b_reachable = false;
    assert!(
        matches!(n.send(true, b"y"), Sent::Staged(_)),
        "no sending past REJECT_AFTER_MESSAGES"
    );
}

#[test]
fn keys_are_erased_after_three_reject_times() {
    let mut n = established();
    let id = n.pa;
    assert!(n.a.peer(id).unwrap().has_session(n.now));
    assert!(n.a.index_count() > 0);
    // Time passes a second at a time (one jump would fire unrelated timers together).
    for _ in 0..(REJECT_AFTER_TIME * 3).as_secs() - 1 {
        n.advance(Duration::from_secs(1));
    }
    assert!(n.a.index_count() > 0, "keys live until 3 x REJECT_AFTER_TIME");
    n.advance(Duration::from_secs(1));
    assert!(!n.a.peer(id).unwrap().has_session(n.now));
    assert_eq!(n.a.index_count(), 0, "all receiver indices are forgotten with the keys");
}

#[test]
fn persistent_keepalive_starts_a_handshake_and_then_keeps_the_path_warm() {
    let mut n = Net::new(None);
    n.a.set_persistent_keepalive(n.pa, 25, n.now);
    n.advance(Duration::from_millis(1));
    assert_eq!(n.a.stats.handshakes_completed, 1, "the first keepalive needs a session");
    let count = |n: &Net| n.wire_from_a.iter().filter(|d| d[0] == 4 && d.len() == 32).count();
    let k0 = count(&n);
    n.advance(Duration::from_secs(25));
    assert_eq!(count(&n), k0 + 1);
    n.advance(Duration::from_secs(25));
    assert_eq!(count(&n), k0 + 2);
}

/// The remote goes away (both directions lost) long enough for the keys to be erased
/// (3 x REJECT_AFTER_TIME), then returns: with PersistentKeepalive the tunnel is back within
/// 30 s with no traffic of our own; without it, with the first packet we send.
#[test]
fn the_tunnel_comes_back_after_the_remote_was_away_for_long() {
    for away in [Duration::from_secs(600), Duration::from_secs(3600)] {
        for keepalive in [true, false] {
            let mut n = established();
            if keepalive {
                n.a.set_persistent_keepalive(n.pa, 25, n.now);
            }
            n.a_reachable = false;
            n.b_reachable = false;
            let until = n.now + away;
            while n.now < until {
                n.advance(Duration::from_secs(1));
            }
            assert!(!n.a.peer(n.pa).unwrap().has_session(n.now), "{away:?}: keys erased");
            n.a_reachable = true;
            n.b_reachable = true;
            let completed = n.a.stats.handshakes_completed;
            if keepalive {
                let back = n.now + Duration::from_secs(30);
                while n.now < back && n.a.stats.handshakes_completed == completed {
                    n.advance(Duration::from_secs(1));
                }
                assert!(
                    n.a.stats.handshakes_completed > completed,
                    "{away:?}: a new session within 30 s"
                );
            }
            let delivered = n.tun_b.len();
            n.send(true, b"back");
            n.advance(Duration::from_millis(1));
            assert_eq!(
                n.tun_b.len(),
                delivered + 1,
                "{away:?}, keepalive {keepalive}: traffic flows"
            );
        }
    }
}

/// A persistent keepalive shorter than REKEY_TIMEOUT with no session: each firing asks for
/// a handshake, most are held back by the one-initiation-per-REKEY_TIMEOUT limit, and it
/// must go on firing all the same (one initiation each REKEY_TIMEOUT), long after the keys
/// were erased.
#[test]
fn a_short_persistent_keepalive_keeps_initiating_after_the_keys_are_erased() {
    let mut n = established();
    n.a.set_persistent_keepalive(n.pa, 1, n.now);
    n.b_reachable = false;
    let until = n.now + REJECT_AFTER_TIME * 3 + Duration::from_secs(120);
    while n.now < until {
        n.advance(Duration::from_secs(1));
    }
    let initiations = |n: &Net| n.wire_from_a.iter().filter(|d| d[0] == 1).count();
    let before = initiations(&n);
    for _ in 0..60 {
        n.advance(Duration::from_secs(1));
    }
    let sent = initiations(&n) - before;
    assert!((10..=12).contains(&sent), "{sent} initiations in a minute");
}

/// A session used up (REJECT_AFTER_MESSAGES) moments after its handshake: the packets that
/// follow wait for a new session, whose initiation the one-per-REKEY_TIMEOUT limit holds
/// back; it goes when the limit ends, without another packet to ask for it, and they arrive.
#[test]
fn packets_staged_while_the_initiation_limit_holds_go_when_it_ends() {
    let mut n = established();
    n.advance(Duration::from_secs(1));
    n.a.set_send_counter_for_test(n.pa, REJECT_AFTER_MESSAGES - 1);
    let delivered = n.tun_b.len();
    n.send(true, b"the last on the old session");
    n.send(true, b"waits");
    n.send(true, b"waits too");
    assert_eq!(n.tun_b.len(), delivered + 1, "the old session's last");
    let completed = n.a.stats.handshakes_completed;
    n.advance(REKEY_TIMEOUT);
    assert_eq!(
        n.a.stats.handshakes_completed,
        completed + 1,
        "a new session, once the limit ended"
    );
    assert_eq!(n.tun_b.len(), delivered + 3, "the staged packets, on it");
}

#[test]
fn cookie_under_load_then_mac2_accepted() {
    let mut n = Net::new(None);
    n.b.force_under_load = true;
    n.send(true, b"x");
    assert_eq!(n.b.stats.cookie_replies_sent, 1);
    assert_eq!(n.a.stats.cookie_replies_accepted, 1);
    assert!(n.tun_b.is_empty());
    n.advance(REKEY_TIMEOUT + Duration::from_millis(MAX_JITTER_MS));
    assert_eq!(n.tun_b.len(), 1, "the retry carries mac2 and completes");
    assert_eq!(n.b.stats.cookie_replies_sent, 1);
}

/// Handshake messages that anyone can send without a key (a wrong mac1) do not put the
/// interface under load, so a peer's handshake needs no cookie round; those that pass mac1
/// count, past UNDER_LOAD_HANDSHAKES_PER_SECOND in a second.
#[test]
fn only_handshakes_that_pass_mac1_count_toward_load() {
    use ordo_proto::interface::UNDER_LOAD_HANDSHAKES_PER_SECOND;
    use ordo_proto::messages::INITIATION_LEN;
    let mut n = Net::new(None);
    let evil: SocketAddr = "203.0.113.66:1".parse().unwrap();
    let mut junk = vec![1u8, 0, 0, 0];
    junk.resize(INITIATION_LEN, 0x5a);
    for _ in 0..UNDER_LOAD_HANDSHAKES_PER_SECOND + 50 {
        let r = n.b.receive(n.now, n.wall(), evil, &mut junk.clone());
        assert_eq!(r, Received::Dropped(DropReason::BadMac1));
    }
    assert!(!n.b.under_load(n.now), "junk does not count");
    n.send(true, b"x");
    assert_eq!(n.b.stats.cookie_replies_sent, 0, "no cookie round");
    assert_eq!(n.tun_b.len(), 1, "the first handshake completes");

    // A's genuine initiation, replayed: each passes mac1 (and is then refused as a replay).
    let mut m = Net::new(None);
    m.b_reachable = false;
    m.send(true, b"lost");
    let initiation = m.wire_from_a.last().unwrap().clone();
    assert_eq!(initiation.len(), INITIATION_LEN);
    for i in 0..=UNDER_LOAD_HANDSHAKES_PER_SECOND {
        assert!(!m.b.under_load(m.now), "not yet, after {i}");
        m.b.receive(m.now, m.wall(), evil, &mut initiation.clone());
    }
    assert!(m.b.under_load(m.now), "one over the rate, all with a valid mac1");
}

/// Under load, initiations with a valid mac1 and no mac2 (anyone who knows B's public key
/// can make them) get cookie replies at a source's rate and no more (COOKIE_REPLIES: a burst
/// of 64, then 100 a second); the rest are dropped as rate limited. Another source still gets its cookie, and
/// a peer that answers it completes its handshake.
#[test]
fn cookie_replies_are_rate_limited_per_source() {
    let mut n = Net::new(None);
    n.b.force_under_load = true;
    // A's initiation, which B cannot answer (A never hears back): a valid mac1, no mac2.
    n.b_reachable = false;
    n.send(true, b"lost");
    n.b_reachable = true;
    let initiation = n.wire_from_a.last().unwrap().clone();
    let evil: SocketAddr = "203.0.113.66:1".parse().unwrap();
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..1000 {
        let r = n.b.receive(n.now, n.wall(), evil, &mut initiation.clone());
        *outcomes.entry(format!("{r:?}")).or_insert(0) += 1;
    }
    assert_eq!(outcomes["CookieSent"], 64, "{outcomes:?}");
    assert_eq!(outcomes["Dropped(RateLimited)"], 936, "{outcomes:?}");
    n.now += Duration::from_millis(100);
    let sent = (0..1000)
        .filter(|_| n.b.receive(n.now, n.wall(), evil, &mut initiation.clone()) == Received::CookieSent)
        .count();
    assert_eq!(sent, 10, "100 a second");
    n.now += Duration::from_secs(1);
    let sent = (0..1000)
        .filter(|_| n.b.receive(n.now, n.wall(), evil, &mut initiation.clone()) == Received::CookieSent)
        .count();
    assert_eq!(sent, 64, "refilled to the burst, no more");
    let before = n.b.stats.cookie_replies_sent;
    let other: SocketAddr = "203.0.113.67:1".parse().unwrap();
    assert_eq!(
        n.b.receive(n.now, n.wall(), other, &mut initiation.clone()),
        Received::CookieSent
    );
    assert_eq!(n.b.stats.cookie_replies_sent, before + 1);
    while n.b.poll_transmit().is_some() {}
    // The genuine peer still gets through: its retry gets a cookie, the next carries mac2.
    let replies = n.b.stats.cookie_replies_sent;
    for _ in 0..2 {
        n.advance(REKEY_TIMEOUT + Duration::from_millis(MAX_JITTER_MS));
    }
    assert_eq!(n.b.stats.cookie_replies_sent, replies + 1);
    assert_eq!(n.tun_b.len(), 1, "the staged packet, on A's new session");
}

/// Under load, a source that answers cookies (a valid mac2) has a second's worth of
/// handshakes computed (HANDSHAKES: 20), then none until its bucket refills: the rest are
/// refused before their mac2 is computed. A forger of its address with a made-up mac2 gets
/// cookie replies at most, and spends none of its handshakes.
#[test]
fn mac2_floods_stop_at_the_handshake_rate_and_forgers_spend_none_of_it() {
    let mut n = Net::new(None);
    n.b.force_under_load = true;
    n.send(true, b"x");
    assert_eq!(n.a.stats.cookie_replies_accepted, 1, "A holds a cookie");
    // A's retry carries a mac2; B does not hear it.
    n.b_reachable = false;
    n.advance(REKEY_TIMEOUT + Duration::from_millis(MAX_JITTER_MS));
    n.b_reachable = true;
    let stamped = n.wire_from_a.last().unwrap().clone();
    assert!(stamped[0] == 1 && ordo_proto::cookie::carries_mac2(&stamped));
    let mut forged = stamped.clone();
    *forged.last_mut().unwrap() ^= 1;
    let outcomes = |n: &mut Net, msg: &[u8], times: usize| {
        let mut o = std::collections::BTreeMap::new();
        for _ in 0..times {
            let r = n.b.receive(n.now, n.wall(), n.addr_a, &mut msg.to_vec());
            *o.entry(format!("{r:?}")).or_insert(0) += 1;
        }
        while n.b.poll_transmit().is_some() {}
        o
    };
    let o = outcomes(&mut n, &forged, 1000);
    assert_eq!(o.get("CookieSent"), Some(&64), "{o:?}");
    assert_eq!(o.get("Dropped(RateLimited)"), Some(&936), "{o:?}");
    let o = outcomes(&mut n, &stamped, 1);
    assert!(
        o.keys().all(|k| k.starts_with("Handshake")),
        "the genuine one passes: {o:?}"
    );
    // Replays of it: each computed (and refused as a replay) until the bucket is empty.
    let o = outcomes(&mut n, &stamped, 100);
    assert_eq!(o.get("Dropped(HandshakeReplay)"), Some(&19), "{o:?}");
    assert_eq!(o.get("Dropped(RateLimited)"), Some(&81), "{o:?}");
}

/// An initiation in steps (as the data plane handles it, the Diffie-Hellman without the
/// interface) completes the handshake as `receive` does; if the peer goes, or our key
/// changes, while it is opened, it is dropped and counted for that reason.
#[test]
fn an_initiation_in_steps_completes_or_is_dropped_for_what_changed_meanwhile() {
    use ordo_proto::interface::HandshakeStep;
    let initiation = |n: &mut Net| {
        n.b_reachable = false;
        n.send(true, b"x");
        n.b_reachable = true;
        n.wire_from_a.last().unwrap().clone()
    };
    let begin = |n: &mut Net, mut msg: Vec<u8>| match n.b.begin_handshake(n.now, n.wall(), n.addr_a, &mut msg) {
        HandshakeStep::Initiation(p) => p,
        HandshakeStep::Done(r) => panic!("not pending: {r:?}"),
    };

    let mut n = Net::new(None);
    let msg = initiation(&mut n);
    let p = begin(&mut n, msg);
    let opened = p.open(|k| n.b.static_static_of(k));
    assert_eq!(
        n.b.complete_initiation(n.now, n.wall(), p, opened),
        Received::Handshake(n.pb)
    );
    n.pump();
    assert!(n.a.peer(n.pa).unwrap().has_session(n.now), "A got the response");

    let mut n = Net::new(None);
    let msg = initiation(&mut n);
    let p = begin(&mut n, msg);
    let opened = p.open(|k| n.b.static_static_of(k));
    n.b.remove_peer(n.pb);
    let r = n.b.complete_initiation(n.now, n.wall(), p, opened);
    assert_eq!(r, Received::Dropped(DropReason::UnknownPeer));
    assert_eq!(n.b.stats.drops[&DropReason::UnknownPeer], 1);

    let mut n = Net::new(None);
    let msg = initiation(&mut n);
    let p = begin(&mut n, msg);
    let opened = p.open(|k| n.b.static_static_of(k));
    n.b.set_private_key(Some(PrivateKey::from_bytes([0x44; 32])));
    let r = n.b.complete_initiation(n.now, n.wall(), p, opened);
    assert_eq!(r, Received::Dropped(DropReason::BadMac1), "made for the key we had");
    assert!(n.b.poll_transmit().is_none(), "no response");
}

#[test]
fn roaming_follows_the_latest_authentic_source() {
    let mut n = established();
    n.addr_a = "198.51.100.7:4000".parse().unwrap();
    // B's replies now go to the new address; the fake network asserts that.
    n.send(true, b"from a new address");
    assert_eq!(n.b.peer(n.pb).unwrap().endpoint, Some(n.addr_a));
    n.send(false, b"reply");
    assert_eq!(n.tun_a.len(), 1);
}

#[test]
fn forged_datagrams_never_change_the_endpoint() {
    let mut n = established();
    let mut junk = vec![4u8, 0, 0, 0];
    junk.extend_from_slice(&[0u8; 60]);
    let before = n.b.peer(n.pb).unwrap().endpoint;
    let evil: SocketAddr = "203.0.113.66:1".parse().unwrap();
    let r = n.b.receive(n.now, n.wall(), evil, &mut junk);
    assert!(matches!(r, Received::Dropped(_)));
    assert_eq!(n.b.peer(n.pb).unwrap().endpoint, before);
}

#[test]
fn changing_the_private_key_drops_sessions() {
    let mut n = established();
    n.a.set_private_key(Some(PrivateKey::from_bytes([0x33; 32])));
    assert!(!n.a.peer(n.pa).unwrap().has_session(n.now));
    assert_eq!(n.a.index_count(), 0);
}

/// Steering (steering.rs): every message B sends A (data, responses) carries a receiver index
/// that steers to the queue A assigned to B; moving B to another queue starts a handshake
/// whose session steers to the new one.
#[test]
fn receiver_indices_steer_to_the_peers_queue() {
    use ordo_proto::steering::queue_of_message;
    let mut n = Net::new(None);
    n.a.set_queues(4);
    assert!(n.a.set_peer_queue(n.pa, 2, n.now, n.wall()));
    n.send(true, b"one");
    n.send(false, b"two");
    assert_eq!(n.tun_a.len(), 1);
    let steered: Vec<Option<u32>> = n.wire_from_b.iter().map(|d| queue_of_message(d, 4)).collect();
    assert!(!steered.is_empty());
    assert!(steered.iter().all(|q| *q == Some(2)), "{steered:?}");

    n.advance(REKEY_TIMEOUT + Duration::from_millis(1));
    let before = n.initiations_from_a();
    let sent_before = n.wire_from_b.len();
    assert!(n.a.set_peer_queue(n.pa, 1, n.now, n.wall()));
    n.pump();
    assert_eq!(n.initiations_from_a(), before + 1, "moving the peer starts a handshake");
    n.send(true, b"three");
    n.send(false, b"four");
    assert_eq!(n.tun_a.len(), 2);
    let after: Vec<Option<u32>> = n.wire_from_b[sent_before..]
        .iter()
        .map(|d| queue_of_message(d, 4))
        .collect();
    assert!(after.iter().all(|q| *q == Some(1)), "{after:?}");
    assert!(!n.a.set_peer_queue(PeerId(999), 0, n.now, n.wall()));

    // New peers are spread over the queues round robin (from a random start).
    let queues: Vec<u32> = (0..6u8)
        .map(|i| {
            let id =
                n.a.add_peer(PrivateKey::from_bytes([0x40 + i; 32]).public_key())
                    .unwrap();
            n.a.peer(id).unwrap().queue
        })
        .collect();
    let expected: Vec<u32> = (0..6).map(|k| (queues[0] + k) % 4).collect();
    assert_eq!(queues, expected);
    // The start is random: sixteen interfaces of one peer each do not all use queue 0.
    let firsts: std::collections::BTreeSet<u32> = (0..16u64)
        .map(|seed| {
            let mut i = Interface::with_rng(n.now, ChaCha20Rng::seed_from_u64(seed));
            i.set_queues(2);
            let id = i.add_peer(PrivateKey::from_bytes([0x50; 32]).public_key()).unwrap();
            i.peer(id).unwrap().queue
        })
        .collect();
    assert_eq!(firsts.len(), 2, "both queues are used");
}

/// The two ends of a tunnel, configured each with the other as its first peer, take
/// different queues (of two): when they share a machine they start on different cores. Over
/// many tunnels both queues are used alike.
#[test]
fn the_two_ends_of_a_tunnel_start_on_different_queues() {
    let now = Instant::now();
    let mut first_queues = [0u32; 2];
    for seed in 1..=64u8 {
        let keys = [
            PrivateKey::from_bytes([seed; 32]),
            PrivateKey::from_bytes([seed ^ 0x80; 32]),
        ];
        let ends: Vec<u32> = (0..2)
            .map(|k| {
                let mut end = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(seed as u64 * 2 + k as u64));
                end.set_queues(2);
                end.set_private_key(Some(keys[k].clone()));
                let peer = end.add_peer(keys[1 - k].public_key()).unwrap();
                let queue = end.peer(peer).unwrap().queue;
                // Only the first peer ever: one removed and added again takes the next queue.
                end.remove_peer(peer);
                let again = end.add_peer(keys[1 - k].public_key()).unwrap();
                assert_eq!(end.peer(again).unwrap().queue, (queue + 1) % 2);
                queue
            })
            .collect();
        assert_ne!(ends[0], ends[1], "tunnel {seed}");
        first_queues[ends[0] as usize] += 1;
    }
    assert!(first_queues.iter().all(|&n| n >= 16), "{first_queues:?}");
}

/// A peer moved right after a handshake (the placement acts as soon as traffic shows its
/// load) cannot initiate at once (one initiation per REKEY_TIMEOUT): the handshake that
/// moves its index comes when the limit allows, not at the next rekey two minutes later.
#[test]
fn a_peer_moved_during_the_rate_limit_is_rekeyed_when_it_ends() {
    use ordo_proto::steering::{queue_of_index, queue_of_message};
    let mut n = Net::new(None);
    n.a.set_queues(2);
    assert!(n.a.set_peer_queue(n.pa, 0, n.now, n.wall()));
    n.send(true, b"one");
    assert_eq!(n.tun_b.len(), 1, "the first handshake is done");
    assert_eq!(
        n.a.steering_overrides(),
        vec![],
        "every index steers to its peer's queue"
    );
    let before = n.initiations_from_a();
    n.advance(Duration::from_secs(1));
    assert!(n.a.set_peer_queue(n.pa, 1, n.now, n.wall()));
    n.pump();
    assert_eq!(n.initiations_from_a(), before, "still inside the rate limit");
    // Until then the device steers the session's index, of queue 0, to queue 1 by exception
    // (the kernel UDP port's steer.rs).
    let overrides = n.a.steering_overrides();
    assert_eq!(overrides.len(), 1, "{overrides:?}");
    assert_eq!((queue_of_index(overrides[0].receiver, 2), overrides[0].queue), (0, 1));
    n.advance(REKEY_TIMEOUT - Duration::from_secs(1) - Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), before, "not before the limit ends");
    n.advance(Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), before + 1, "the move's handshake");
    let sent_before = n.wire_from_b.len();
    n.send(false, b"two");
    assert_eq!(n.tun_a.len(), 1);
    let after: Vec<Option<u32>> = n.wire_from_b[sent_before..]
        .iter()
        .map(|d| queue_of_message(d, 2))
        .collect();
    assert_eq!(after, vec![Some(1)]);
    // Nothing more is owed: no further initiation on the next ticks.
    n.advance(REKEY_TIMEOUT * 2);
    assert_eq!(n.initiations_from_a(), before + 1);
}
