//! Return routes: the gateway that holds a client's session makes the client's inner
//! addresses reachable through itself, as routes through the interface in a table of the
//! fleet's choosing (`FleetRouteTable = main`, or a number), which the gateway's BGP daemon
//! announces, so that the LAN's traffic to a client reaches whichever gateway holds it. A
//! route is there while the peer's last handshake is less than REJECT_AFTER_TIME old (after
//! that its session is dead) and goes when the session ends, moves or the peer goes.
//!
//! The routes carry a protocol number of Ordo's own ([`PROTOCOL`]), by which they are told
//! from every other route in the table. In the main table they are ordinary forwarding
//! routes (the interface's prefix covers them already), and FRR announces them with
//! `redistribute kernel route-map R` (R matching the interface): when the daemon dies, its
//! interface goes, the kernel flushes the routes silently and zebra, which follows the
//! interface, withdraws them. FRR 8.4 keeps announcing a vanished interface's routes that
//! it took from another table with `ip import-table`, so a table of their own suits only
//! a gateway whose interface outlives its daemon.

use crate::device::peers::PeerCopy;
use anyhow::{anyhow, Context, Result};
use futures::TryStreamExt;
use ipnet::IpNet;
use ordo_proto::timers::REJECT_AFTER_TIME;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, RouteMessageBuilder};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::SystemTime;

/// The routes `peers` need at `now`: every allowed IP of each peer holding a session.
pub fn wanted(peers: &[PeerCopy], now: SystemTime) -> BTreeSet<IpNet> {
    let holds = |p: &&PeerCopy| {
        p.last_handshake
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age < REJECT_AFTER_TIME)
    };
    peers
        .iter()
        .filter(holds)
        .flat_map(|p| p.allowed_ips.iter().map(IpNet::trunc))
        .collect()
}

/// The routing protocol number of return routes (`ip route ... proto 79`): none of the
/// numbers iproute2 and the routing daemons have taken (`/etc/iproute2/rt_protos`).
pub const PROTOCOL: u8 = 79;

/// Removes every return route through `ifname` from `table`, on a runtime of its own: when
/// the interface ends, or its watch withdraws it. An interface that is gone has none left.
pub fn remove_all(ifname: &str, table: u32) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let Ok(mut routes) = ReturnRoutes::open(ifname, table).await else {
            return Ok(());
        };
        anyhow::ensure!(routes.sync(&BTreeSet::new()).await, "netlink refused");
        Ok(())
    })
}

/// The fleet's return routes through one interface, in one table.
pub struct ReturnRoutes {
    handle: Handle,
    index: u32,
    table: u32,
    /// Whether the last change failed (said once, not each second).
    failing: bool,
}

impl ReturnRoutes {
    /// Opens a netlink connection on the current (tokio) runtime.
    pub async fn open(ifname: &str, table: u32) -> Result<ReturnRoutes> {
        let (conn, handle, _) = rtnetlink::new_connection().context("opening netlink")?;
        tokio::spawn(conn);
        let mut links = handle.link().get().match_name(ifname.to_string()).execute();
        let index = match links.try_next().await {
            Ok(Some(l)) => l.header.index,
            Ok(None) => return Err(anyhow!("no interface named {ifname}")),
            Err(e) => return Err(anyhow!("looking up interface {ifname}: {e}")),
        };
        Ok(ReturnRoutes {
            handle,
            index,
            table,
            failing: false,
        })
    }

    /// Makes the table's return routes exactly `want`; false if it could not.
    pub async fn sync(&mut self, want: &BTreeSet<IpNet>) -> bool {
        let result = self.try_sync(want).await;
        let ok = result.is_ok();
        match result {
            Ok(changed) => {
                if changed > 0 {
                    log::debug!("fleet: {changed} return routes changed in table {}", self.table);
                }
                if self.failing {
                    log::info!("fleet: return routes in table {} are right again", self.table);
                }
                self.failing = false;
            }
            Err(e) if !self.failing => {
                log::warn!("fleet: return routes in table {}: {e:#}", self.table);
                self.failing = true;
            }
            Err(e) => log::debug!("fleet: return routes: {e:#}"),
        }
        ok
    }

    async fn try_sync(&self, want: &BTreeSet<IpNet>) -> Result<usize> {
        let have = self.routes().await?;
        let mut changed = 0;
        for (net, message) in &have {
            if !want.contains(net) {
                self.handle
                    .route()
                    .del(message.clone())
                    .execute()
                    .await
                    .with_context(|| format!("removing the route to {net}"))?;
                changed += 1;
            }
        }
        let present: BTreeSet<IpNet> = have.iter().map(|(n, _)| *n).collect();
        for net in want.difference(&present) {
            let message = RouteMessageBuilder::<IpAddr>::new()
                .destination_prefix(net.network(), net.prefix_len())
                .map_err(|e| anyhow!("route {net}: {e:?}"))?
                .output_interface(self.index)
                .table_id(self.table)
                .protocol(RouteProtocol::from(PROTOCOL))
                .build();
            self.handle
                .route()
                .add(message)
                .replace()
                .execute()
                .await
                .with_context(|| format!("adding the route to {net}"))?;
            changed += 1;
        }
        Ok(changed)
    }

    /// The table's return routes.
    async fn routes(&self) -> Result<Vec<(IpNet, RouteMessage)>> {
        let mut out = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut query = RouteMessage::default();
            query.header.address_family = family;
            let mut routes = self.handle.route().get(query).execute();
            while let Some(r) = routes.try_next().await.context("reading routes")? {
                let table = r
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        RouteAttribute::Table(t) => Some(*t),
                        _ => None,
                    })
                    .unwrap_or(u32::from(r.header.table));
                let through_us = r
                    .attributes
                    .iter()
                    .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == self.index));
                if table != self.table || !through_us || r.header.protocol != RouteProtocol::from(PROTOCOL) {
                    continue;
                }
                let destination = r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::from(*v4)),
                    RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::from(*v6)),
                    _ => None,
                });
                let Some(net) = destination.and_then(|d| IpNet::new(d, r.header.destination_prefix_length).ok()) else {
                    continue;
                };
                out.push((net, r));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::{PeerId, PrivateKey};
    use std::time::Duration;

    fn peer(seed: u8, ips: &[&str], handshake_ago: Option<u64>, now: SystemTime) -> PeerCopy {
        PeerCopy {
            id: PeerId(u64::from(seed)),
            last_handshake: handshake_ago.map(|s| now - Duration::from_secs(s)),
            allowed_ips: ips.iter().map(|n| n.parse().unwrap()).collect(),
            ..PeerCopy::bare(PrivateKey::from_bytes([seed; 32]).public_key())
        }
    }

    #[test]
    fn only_peers_holding_a_session_get_routes() {
        let now = SystemTime::now();
        let peers = [
            peer(1, &["10.7.0.2/32", "fd07::2/128"], Some(5), now),
            peer(2, &["10.7.0.3/32"], Some(179), now),
            peer(3, &["10.7.0.4/32"], Some(181), now),
            peer(4, &["10.7.0.5/32"], None, now),
            peer(5, &["10.7.1.9/24"], Some(1), now),
        ];
        let got: Vec<String> = wanted(&peers, now).iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            ["10.7.0.2/32", "10.7.0.3/32", "10.7.1.0/24", "fd07::2/128"],
            "a session's peers (the prefix as a route names it); not an expired one, not one never seen"
        );
    }
}
