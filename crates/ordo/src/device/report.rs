//! What the device tells people and tools about its peers (the UAPI's Ordo lines, the
//! metrics endpoint): each peer without its secrets, and where in the data plane it runs.

use super::Device;
use crate::placement::model::Model;
use ipnet::IpNet;
use ordo_proto::interface::{Interface, Stats};
use ordo_proto::{PeerId, PublicKey};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

/// A peer as `wg show` shows it, without its preshared key.
pub struct PeerReport {
    pub public_key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    pub allowed_ips: Vec<IpNet>,
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub placement: Placement,
}

/// Where a peer's work runs (see `crate::placement`).
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// Its receive queue (0 in models without queues).
    pub queue: usize,
    /// The CPUs its queue's thread may run on (the I/O CPUs in models without queues).
    pub cpus: Vec<usize>,
    /// The NUMA node of its work.
    pub node: usize,
    pub regime: Regime,
    /// Packets per second both ways, last interval.
    pub pps: f64,
    /// Cores of crypto it took, last interval.
    pub cores: f64,
}

/// How a peer's crypto runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// On its queue's core.
    Inline,
    /// Spread over its node's workers.
    Pool,
    /// The threaded model's: workers, then a delivery thread.
    PoolThread,
}

impl Regime {
    pub fn name(self) -> &'static str {
        match self {
            Regime::Inline => "inline",
            Regime::Pool => "pool",
            Regime::PoolThread => "pool+thread",
        }
    }
}

/// The device as a scrape reports it: what it needs from the core, copied under one hold of
/// the core's lock.
pub struct DeviceReport {
    pub public_key: Option<PublicKey>,
    pub peers: Vec<PeerReport>,
    pub stats: Stats,
    pub under_load: bool,
    pub mtu: usize,
}

/// The peers as the core holds them, before their placement is read.
struct CorePeers {
    peers: Vec<(PeerId, u32, PeerReport)>,
    prefixes: Vec<(IpNet, PeerId)>,
}

impl CorePeers {
    fn copy(core: &Interface) -> CorePeers {
        let prefixes: Vec<(IpNet, PeerId)> = core.allowed_ips().entries().collect();
        let peers: Vec<_> = (core.peers())
            .map(|(id, p)| {
                let report = PeerReport {
                    public_key: p.public_key,
                    endpoint: p.endpoint,
                    allowed_ips: Vec::new(),
                    last_handshake: p.last_handshake,
                    rx_bytes: p.rx_bytes,
                    tx_bytes: p.tx_bytes,
                    placement: Placement {
                        queue: 0,
                        cpus: Vec::new(),
                        node: 0,
                        regime: Regime::Inline,
                        pps: 0.0,
                        cores: 0.0,
                    },
                };
                (id, p.queue, report)
            })
            .collect();
        CorePeers { peers, prefixes }
    }
}

impl Device {
    /// Every peer, in the core's order. The core's lock, which forwarding needs too, is held
    /// only to copy the peers and the allowed IPs out.
    pub fn peer_reports(&self) -> Vec<PeerReport> {
        let copied = CorePeers::copy(&self.core());
        self.placed(copied)
    }

    /// The device's key, peers and figures, with one hold of the core's lock.
    pub fn report(&self) -> DeviceReport {
        let (copied, public_key, stats, under_load, mtu) = {
            let core = self.core();
            (
                CorePeers::copy(&core),
                core.private_key().map(|k| k.public_key()),
                core.stats.clone(),
                core.under_load(Instant::now()),
                core.mtu(),
            )
        };
        DeviceReport {
            public_key,
            peers: self.placed(copied),
            stats,
            under_load,
            mtu,
        }
    }

    /// The peers with their allowed IPs and where the plane runs them.
    fn placed(&self, copied: CorePeers) -> Vec<PeerReport> {
        let CorePeers { peers, prefixes } = copied;
        let mut allowed: HashMap<PeerId, Vec<IpNet>> = HashMap::new();
        for (net, id) in prefixes {
            allowed.entry(id).or_default().push(net);
        }
        let plan = &self.plane.plan;
        let planes: HashMap<PeerId, _> = self.plane.peer_planes().into_iter().map(|p| (p.id, p)).collect();
        let affinity = self.plane.queue_affinity();
        (peers.into_iter())
            .map(|(id, peer_queue, report)| {
                let plane = planes.get(&id);
                let spread = plane.map_or(matches!(plan.model, Model::Pool | Model::Threaded), |x| {
                    x.spread.load(Ordering::Relaxed)
                });
                let pool = plane.map_or(0, |x| x.pool.load(Ordering::Relaxed));
                let load = plane.map(|x| x.load()).unwrap_or_default();
                let (queue, cpus) = if plan.model.has_queues() {
                    let q = peer_queue as usize % plan.queues.len();
                    let released = affinity.get(q).is_some_and(|a| a.is_released());
                    (q, plan.queue_thread_cpus(q, released))
                } else {
                    (0, plan.io_cpus.clone())
                };
                let node = if spread {
                    plan.pools.get(pool).map_or(0, |(n, _)| *n)
                } else {
                    plan.topology.node_of(plan.queues[queue])
                };
                let regime = match (plan.model, spread) {
                    (Model::Threaded, _) => Regime::PoolThread,
                    (_, true) => Regime::Pool,
                    (_, false) => Regime::Inline,
                };
                PeerReport {
                    allowed_ips: allowed.remove(&id).unwrap_or_default(),
                    placement: Placement {
                        queue,
                        cpus,
                        node,
                        regime,
                        pps: load.pps,
                        cores: load.cores,
                    },
                    ..report
                }
            })
            .collect()
    }
}
