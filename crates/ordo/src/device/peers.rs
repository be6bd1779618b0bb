//! The peers as the core holds them, for what shows them (the UAPI's `get`, the report):
//! copied out under one hold of the core's lock, which forwarding needs too (one pass over
//! the peers and one over the allowed IPs, not one per peer), and put together with their
//! allowed IPs after it is released.

use ipnet::IpNet;
use ordo_proto::interface::Interface;
use ordo_proto::{PeerId, PresharedKey, PublicKey};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::SystemTime;

/// One peer, copied.
pub struct PeerCopy {
    pub id: PeerId,
    /// Its queue, as the core steers it.
    pub queue: u32,
    pub public_key: PublicKey,
    /// Boxed so that the key is not moved about (and left behind) as the copy moves; wiped
    /// on drop.
    pub preshared_key: Box<PresharedKey>,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<IpNet>,
    /// Our receiver indices of its sessions (a fleet's session records carry them).
    pub session_indices: Vec<u32>,
}

#[cfg(test)]
impl PeerCopy {
    /// A peer with nothing but its key, for tests to fill in.
    pub fn bare(public_key: PublicKey) -> PeerCopy {
        PeerCopy {
            id: PeerId(0),
            queue: 0,
            public_key,
            preshared_key: Box::default(),
            endpoint: None,
            last_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
            persistent_keepalive: 0,
            allowed_ips: Vec::new(),
            session_indices: Vec::new(),
        }
    }
}

/// What is copied under the lock: the peers and the allowed-IP table.
pub struct CoreCopy {
    peers: Vec<PeerCopy>,
    prefixes: Vec<(IpNet, PeerId)>,
}

impl CoreCopy {
    /// Copies the peers and the table out of `core` (the caller holds its lock).
    pub fn of(core: &Interface) -> CoreCopy {
        let prefixes = core.allowed_ips().entries().collect();
        let peers = (core.peers())
            .map(|(id, p)| PeerCopy {
                id,
                queue: p.queue,
                public_key: p.public_key,
                preshared_key: Box::new(p.preshared_key().clone()),
                endpoint: p.endpoint,
                last_handshake: p.last_handshake,
                rx_bytes: p.rx_bytes,
                tx_bytes: p.tx_bytes,
                persistent_keepalive: p.persistent_keepalive,
                allowed_ips: Vec::new(),
                session_indices: p.session_indices(),
            })
            .collect();
        CoreCopy { peers, prefixes }
    }

    /// The peers in the core's order, each with its allowed IPs in the table's order.
    pub fn peers(self) -> Vec<PeerCopy> {
        let mut allowed: HashMap<PeerId, Vec<IpNet>> = HashMap::new();
        for (net, id) in self.prefixes {
            allowed.entry(id).or_default().push(net);
        }
        (self.peers.into_iter())
            .map(|p| PeerCopy {
                allowed_ips: allowed.remove(&p.id).unwrap_or_default(),
                ..p
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::PrivateKey;
    use std::time::Instant;

    fn key(seed: u8) -> PublicKey {
        PrivateKey::from_bytes([seed; 32]).public_key()
    }

    #[test]
    fn each_peer_gets_its_own_allowed_ips_in_order() {
        let mut core = Interface::new(Instant::now());
        let (a, b) = (key(1), key(2));
        let ia = core.add_peer(a).unwrap();
        let ib = core.add_peer(b).unwrap();
        for (net, id) in [("10.0.0.0/24", ia), ("10.9.0.1/32", ib), ("fd00::/64", ia)] {
            core.add_allowed_ip(id, net.parse().unwrap());
        }
        let peers = CoreCopy::of(&core).peers();
        assert_eq!(peers.len(), 2);
        let of = |k: &PublicKey| peers.iter().find(|p| p.public_key == *k).unwrap();
        let nets = |p: &PeerCopy| p.allowed_ips.iter().map(ToString::to_string).collect::<Vec<_>>();
        let mut got_a = nets(of(&a));
        got_a.sort();
        assert_eq!(got_a, ["10.0.0.0/24", "fd00::/64"]);
        assert_eq!(nets(of(&b)), ["10.9.0.1/32"]);
        assert!(of(&a).preshared_key.is_zero());
    }
}
