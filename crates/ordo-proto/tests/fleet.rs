//! A fleet of two gateways sharing one static key, and a client: a data message that reaches
//! the gateway without its session is passed to the owner while the owner is up, and taken
//! over with a handshake from the other gateway when it is down; forged sources and foreign
//! envelopes are refused.

mod common;

use common::*;
use ordo_proto::fleet::{owner_of, GatewayId};
use ordo_proto::interface::{FleetView, Foreign, ForeignSession};
use ordo_proto::PublicKey;
use std::collections::HashMap;

const GW1: &str = "10.0.1.2:51820";
const GW2: &str = "10.0.2.2:51820";
const CLIENT: &str = "10.9.0.2:40000";

struct Fleet {
    g1: Interface,
    g2: Interface,
    client: Interface,
    /// The gateways as the client's peer, and the client as the gateways'.
    at_client: PeerId,
    now: Instant,
    client_addr: SocketAddr,
}

fn gateway(seed: u64, id: u8, key: &PrivateKey, client: PublicKey, now: Instant) -> Interface {
    let mut g = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(seed));
    g.set_private_key(Some(key.clone()));
    g.set_fleet_gateway(Some(GatewayId(id)));
    let p = g.add_peer(client).unwrap();
    g.add_allowed_ip(p, "10.7.0.2/32".parse().unwrap());
    g
}

impl Fleet {
    fn new() -> Fleet {
        let now = Instant::now();
        let fleet_key = PrivateKey::from_bytes([0x31; 32]);
        let client_key = PrivateKey::from_bytes([0x32; 32]);
        let g1 = gateway(1, 1, &fleet_key, client_key.public_key(), now);
        let g2 = gateway(2, 2, &fleet_key, client_key.public_key(), now);
        let mut client = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(3));
        client.set_private_key(Some(client_key));
        let at_client = client.add_peer(fleet_key.public_key()).unwrap();
        // The fleet's anycast address: which gateway gets it is the network's choice.
        client.set_endpoint(at_client, "198.51.100.1:51820".parse().unwrap());
        client.add_allowed_ip(at_client, "0.0.0.0/0".parse().unwrap());
        Fleet {
            g1,
            g2,
            client,
            at_client,
            now,
            client_addr: CLIENT.parse().unwrap(),
        }
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }

    fn gateway(&mut self, which: u8) -> &mut Interface {
        if which == 1 {
            &mut self.g1
        } else {
            &mut self.g2
        }
    }

    /// The client sends a packet; the network takes it (and all the client says until quiet)
    /// to gateway `to`. Returns what the gateway made of the data message.
    fn client_sends(&mut self, to: u8, payload: &[u8]) -> Vec<Received> {
        let (now, wall) = (self.now, self.wall());
        let packet = ipv4([10, 7, 0, 2], [10, 200, 0, 1], payload);
        let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
        let mut results = Vec::new();
        if let Sent::Data { len, .. } = self.client.send(now, wall, &packet, &mut out) {
            out.truncate(len);
            let src = self.client_addr;
            results.push(self.gateway(to).receive(now, wall, src, &mut out));
        }
        self.pump(to);
        results
    }

    /// Moves messages until quiet: the client's go to gateway `to`, a gateway's to the client
    /// or, in envelopes, to the other gateway. Returns the envelopes' outcomes.
    fn pump(&mut self, to: u8) -> Vec<Received> {
        let (now, wall) = (self.now, self.wall());
        let mut outcomes = Vec::new();
        for _ in 0..50 {
            let mut moved = false;
            while let Some(t) = self.client.poll_transmit() {
                let src = self.client_addr;
                let mut d = t.payload;
                self.gateway(to).receive(now, wall, src, &mut d);
                moved = true;
            }
            for which in [1, 2] {
                while let Some(t) = self.gateway(which).poll_transmit() {
                    moved = true;
                    let mut d = t.payload;
                    if t.to == GW1.parse().unwrap() || t.to == GW2.parse().unwrap() {
                        let other = if t.to == GW1.parse().unwrap() { 1 } else { 2 };
                        let from = if which == 1 { GW1 } else { GW2 };
                        outcomes.push(self.gateway(other).receive(now, wall, from.parse().unwrap(), &mut d));
                    } else {
                        assert_eq!(t.to, self.client_addr);
                        let from = "198.51.100.1:51820".parse().unwrap();
                        self.client.receive(now, wall, from, &mut d);
                    }
                }
            }
            if !moved {
                return outcomes;
            }
        }
        panic!("never quiet");
    }

    /// Gateway 1's current session index with the client.
    fn g1_index(&self) -> u32 {
        let indices = self.g1.peers().next().unwrap().1.session_indices();
        assert_eq!(indices.len(), 1, "one session");
        indices[0]
    }
}

fn delivered(r: &[Received]) -> bool {
    r.iter().any(|r| matches!(r, Received::Packet { .. }))
}

#[test]
fn a_gateway_passes_a_foreign_session_to_its_owner_while_the_owner_is_up() {
    let mut f = Fleet::new();
    assert!(
        !delivered(&f.client_sends(1, b"hello")),
        "the first packet waits for the handshake"
    );
    assert!(delivered(&f.client_sends(1, b"one")));
    let index = f.g1_index();
    assert_eq!(owner_of(index), GatewayId(1), "gateway 1's index names it: {index:#x}");

    // The network now takes the client to gateway 2 (ECMP re-hashed): gateway 1 is up.
    f.g2.set_fleet_view(FleetView {
        gateways: HashMap::from([(GatewayId(1), GW1.parse().unwrap())]),
        sessions: HashMap::new(),
    });
    let (now, wall) = (f.now, f.wall());
    let packet = ipv4([10, 7, 0, 2], [10, 200, 0, 1], b"two");
    let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
    let Sent::Data { len, .. } = f.client.send(now, wall, &packet, &mut out) else {
        panic!("the client has a session")
    };
    out.truncate(len);
    let src = f.client_addr;
    assert_eq!(
        f.g2.receive(now, wall, src, &mut out),
        Received::Foreign(Foreign::Forwarded(GatewayId(1)))
    );
    let outcomes = f.pump(2);
    assert!(
        matches!(outcomes[..], [Received::Packet { .. }]),
        "gateway 1 took it from the envelope: {outcomes:?}"
    );
    assert_eq!(
        f.g1.peers().next().unwrap().1.endpoint,
        Some(f.client_addr),
        "the client's own source"
    );
    assert_eq!(f.g2.stats.fleet_forwarded, 1);
    assert_eq!(f.g1.stats.fleet_envelopes_opened, 1);
    assert_eq!(f.g2.stats.handshakes_initiated, 0, "no handshake: the session stays");
    assert_eq!(f.g1.stats.handshakes_completed, 1);
    // An envelope passed on once is not passed again, even to a gateway that lost the session.
    let sealed = ordo_proto::fleet::seal_envelope(
        &ordo_proto::fleet::EnvelopeKey::of(&PrivateKey::from_bytes([0x31; 32])),
        f.client_addr,
        &out,
    );
    let mut again = sealed.clone();
    assert_eq!(
        f.g2.receive(now, wall, GW1.parse().unwrap(), &mut again),
        Received::Dropped(DropReason::UnknownReceiver)
    );
}

#[test]
fn a_gateway_takes_over_the_clients_of_a_gateway_that_is_down() {
    let mut f = Fleet::new();
    f.client_sends(1, b"hello");
    assert!(delivered(&f.client_sends(1, b"one")));
    let index = f.g1_index();
    let client_key = PrivateKey::from_bytes([0x32; 32]).public_key();
    // Gateway 1 is down; its session's record is known.
    f.g2.set_fleet_view(FleetView {
        gateways: HashMap::new(),
        sessions: HashMap::from([(
            index,
            ForeignSession {
                client: client_key,
                endpoint: f.client_addr,
            },
        )]),
    });
    f.now += Duration::from_secs(1);
    // A forged source is not taken for the client.
    let (now, wall) = (f.now, f.wall());
    let packet = ipv4([10, 7, 0, 2], [10, 200, 0, 1], b"forged");
    let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
    let Sent::Data { len, .. } = f.client.send(now, wall, &packet, &mut out) else {
        panic!()
    };
    out.truncate(len);
    let mut forged = out.clone();
    assert_eq!(
        f.g2.receive(now, wall, "203.0.113.9:1234".parse().unwrap(), &mut forged),
        Received::Dropped(DropReason::UnknownReceiver)
    );
    assert_eq!(f.g2.stats.handshakes_initiated, 0);
    assert!(f.g2.poll_transmit().is_none());

    // The client's own datagram: gateway 2 initiates at once, the client answers, and the
    // keepalive that confirms the session is on its way; the next packet gets through.
    let src = f.client_addr;
    assert!(matches!(
        f.g2.receive(now, wall, src, &mut out),
        Received::Foreign(Foreign::TakenOver(_))
    ));
    f.pump(2);
    assert_eq!(f.g2.stats.fleet_takeovers, 1);
    assert_eq!(
        f.g2.stats.handshakes_completed, 1,
        "the client took the fleet's initiation"
    );
    assert!(delivered(&f.client_sends(2, b"two")), "traffic flows through gateway 2");
    let id = f
        .client
        .peer_id(&PrivateKey::from_bytes([0x31; 32]).public_key())
        .unwrap();
    assert_eq!(id, f.at_client);
    // Its further datagrams go on to gateway 2's session: no second takeover.
    assert!(delivered(&f.client_sends(2, b"three")));
    assert_eq!(f.g2.stats.fleet_takeovers, 1);
}

#[test]
fn an_envelope_from_outside_the_fleet_is_refused() {
    let mut f = Fleet::new();
    f.client_sends(1, b"hello");
    let datagram = vec![4u8; 64];
    let outsider = ordo_proto::fleet::EnvelopeKey::of(&PrivateKey::from_bytes([0x77; 32]));
    let mut sealed = ordo_proto::fleet::seal_envelope(&outsider, f.client_addr, &datagram);
    let (now, wall) = (f.now, f.wall());
    assert_eq!(
        f.g1.receive(now, wall, GW2.parse().unwrap(), &mut sealed),
        Received::Dropped(DropReason::BadEnvelope)
    );
    assert_eq!(f.g1.stats.dropped(DropReason::BadEnvelope), 1);
    // Without a fleet an envelope is no message at all.
    let mut plain = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(9));
    plain.set_private_key(Some(PrivateKey::from_bytes([0x31; 32])));
    let mut sealed = ordo_proto::fleet::seal_envelope(&outsider, f.client_addr, &datagram);
    assert_eq!(
        plain.receive(now, wall, GW2.parse().unwrap(), &mut sealed),
        Received::Dropped(DropReason::Malformed)
    );
}

#[test]
fn a_restarted_gateway_takes_back_the_clients_its_records_name() {
    let mut f = Fleet::new();
    f.client_sends(1, b"hello");
    assert!(delivered(&f.client_sends(1, b"one")));
    let index = f.g1_index();
    // Gateway 1 starts again: same key and id, no sessions; its record of before is in etcd.
    let client_key = PrivateKey::from_bytes([0x32; 32]).public_key();
    f.g1 = gateway(11, 1, &PrivateKey::from_bytes([0x31; 32]), client_key, f.now);
    let record = ForeignSession {
        client: client_key,
        endpoint: f.client_addr,
    };
    f.g1.set_fleet_view(FleetView {
        gateways: HashMap::new(),
        sessions: HashMap::from([(index, record)]),
    });
    f.now += Duration::from_secs(1);
    let results = f.client_sends(1, b"two");
    assert!(
        matches!(results[..], [Received::Foreign(Foreign::TakenOver(_))]),
        "{results:?}"
    );
    assert_eq!(f.g1.stats.handshakes_completed, 1);
    assert!(delivered(&f.client_sends(1, b"three")), "the client is back");
}
