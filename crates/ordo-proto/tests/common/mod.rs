//! What the protocol's integration tests share: two protocol cores talking to each other
//! through a fake network and a fake clock, with no socket and no sleep. Each test file uses
//! part of it.
#![allow(dead_code, unused_imports)]

pub use ordo_proto::messages::{DataHeader, DATA_HEADER_LEN};
pub use ordo_proto::timers::*;
pub use ordo_proto::{
    Accepted, DropReason, Interface, OpenedMessage, PeerId, PresharedKey, PrivateKey, Received, Sent, SEND_HEADROOM,
};
pub use rand_chacha::ChaCha20Rng;
pub use rand_core::SeedableRng;
pub use std::net::SocketAddr;
pub use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const ADDR_A: &str = "192.0.2.1:51820";
pub const ADDR_B: &str = "192.0.2.2:51820";

pub fn ipv4(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
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
pub struct Net {
    pub a: Interface,
    pub b: Interface,
    pub pa: PeerId, // B as A's peer
    pub pb: PeerId, // A as B's peer
    pub t0: Instant,
    pub now: Instant,
    /// Seconds both sides' wall clocks were stepped by (NTP, a restored VM).
    pub wall_step: i64,
    pub addr_a: SocketAddr,
    pub addr_b: SocketAddr,
    /// Data delivered to each side's TUN, in order.
    pub tun_a: Vec<Vec<u8>>,
    pub tun_b: Vec<Vec<u8>>,
    /// Datagrams sent by each side (to inspect or replay).
    pub wire_from_a: Vec<Vec<u8>>,
    pub wire_from_b: Vec<Vec<u8>>,
    /// While false, datagrams toward that side are lost.
    pub a_reachable: bool,
    pub b_reachable: bool,
}

impl Net {
    pub fn new(psk: Option<PresharedKey>) -> Net {
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

    pub fn wall(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000_u64.saturating_add_signed(self.wall_step)) + (self.now - self.t0)
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        let w = self.wall();
        self.a.tick(self.now, w);
        self.b.tick(self.now, w);
        self.pump();
    }

    /// Delivers one datagram; returns what the receiver made of it.
    pub fn deliver(&mut self, to_b: bool, mut dgram: Vec<u8>) -> Received {
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
    pub fn pump(&mut self) {
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
    pub fn send(&mut self, from_a: bool, payload: &[u8]) -> Sent {
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

    pub fn initiations_from_a(&self) -> usize {
        self.wire_from_a.iter().filter(|d| d[0] == 1).count()
    }
    pub fn initiations_from_b(&self) -> usize {
        self.wire_from_b.iter().filter(|d| d[0] == 1).count()
    }
}

pub fn established() -> Net {
    let mut n = Net::new(None);
    assert!(matches!(n.send(true, b"hello"), Sent::Staged(_)));
    assert_eq!(
        n.tun_b.len(),
        1,
        "the staged packet went out once the handshake completed"
    );
    n
}
