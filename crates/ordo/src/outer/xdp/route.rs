//! How a datagram to a peer leaves this host, as the kernel would send it: the route's
//! interface, source address and next hop (`ip route get`), the interface's hardware
//! address, and the next hop's from the kernel's neighbour table. AF_XDP sends without the
//! kernel's IP layer, so Ordo writes what it would have. A next hop the kernel has not
//! resolved yet has no hardware address here: such a datagram goes through the kernel's UDP
//! socket, which makes the kernel resolve it.
//!
//! Each look-up asks the kernel over rtnetlink and blocks: for a thread that keeps the
//! answers, never for a thread that moves packets.

use futures::TryStreamExt;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, IpVersion};
use std::io;
use std::net::IpAddr;

/// What the kernel says about reaching a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    /// The interface the route leaves by.
    pub ifindex: u32,
    /// The address the kernel would send from.
    pub source: IpAddr,
    /// The destination itself on a directly attached network, else the gateway.
    pub next_hop: IpAddr,
    /// The interface's hardware address.
    pub from_mac: [u8; 6],
    /// The interface's MTU: the longest IP packet a frame on it may carry.
    pub mtu: u32,
    /// The next hop's, if the kernel has resolved it.
    pub to_mac: Option<[u8; 6]>,
}

/// A connection to the kernel's routing tables.
pub struct Routes {
    rt: tokio::runtime::Runtime,
    handle: Handle,
}

fn failed(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

impl Routes {
    pub fn open() -> io::Result<Routes> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            Ok::<_, io::Error>(handle)
        })?;
        Ok(Routes { rt, handle })
    }

    /// How a datagram to `to` leaves (see [`hop`]).
    pub fn hop(&self, to: IpAddr) -> io::Result<Option<Hop>> {
        self.rt.block_on(hop(self.handle.clone(), to))
    }

    /// The addresses of interface `ifindex`, both families.
    pub fn addresses(&self, ifindex: u32) -> io::Result<Vec<IpAddr>> {
        self.rt.block_on(addresses(self.handle.clone(), ifindex))
    }

    /// The index of the interface named `name`, if there is one.
    pub fn index_of(&self, name: &str) -> io::Result<Option<u32>> {
        self.rt.block_on(async {
            let mut links = self.handle.link().get().match_name(name.to_string()).execute();
            match links.try_next().await {
                Ok(l) => Ok(l.map(|l| l.header.index)),
                // The kernel answers ENODEV for a name it does not know.
                Err(rtnetlink::Error::NetlinkError(_)) => Ok(None),
                Err(e) => Err(failed("reading an interface", e)),
            }
        })
    }

    /// The interfaces a host's peers are most likely reached by, for `Outer = xdp` when none
    /// is named: those of its default routes (main table, both families); without a default
    /// route, every interface that is up, has an Ethernet address and an IP address.
    pub fn outer_interfaces(&self) -> io::Result<Vec<Interface>> {
        self.rt.block_on(outer_interfaces(self.handle.clone()))
    }
}

/// A network interface by index and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub index: u32,
    pub name: String,
}

async fn addresses(handle: Handle, ifindex: u32) -> io::Result<Vec<IpAddr>> {
    use rtnetlink::packet_route::address::AddressAttribute;
    let mut found = Vec::new();
    let mut all = handle.address().get().set_link_index_filter(ifindex).execute();
    while let Some(a) = all.try_next().await.map_err(|e| failed("reading addresses", e))? {
        // IPv4 names its own address Local (Address is the far end on a point-to-point
        // link); IPv6 has Address alone.
        let local = a.attributes.iter().find_map(|at| match at {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = a.attributes.iter().find_map(|at| match at {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = local.or(address) {
            found.push(ip);
        }
    }
    Ok(found)
}

async fn outer_interfaces(handle: Handle) -> io::Result<Vec<Interface>> {
    use rtnetlink::packet_route::link::{LinkFlags, LinkLayerType};
    let mut links = Vec::new();
    let mut all = handle.link().get().execute();
    while let Some(l) = all.try_next().await.map_err(|e| failed("reading interfaces", e))? {
        let usable = l.header.link_layer_type == LinkLayerType::Ether && l.header.flags.contains(LinkFlags::Up);
        let name = l.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        if let (true, Some(name)) = (usable, name) {
            links.push(Interface {
                index: l.header.index,
                name,
            });
        }
    }
    let mut defaults = Vec::new();
    for version in [IpVersion::V4, IpVersion::V6] {
        let mut query = RouteMessage::default();
        query.header.address_family = if version == IpVersion::V4 {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let mut routes = handle.route().get(query).execute();
        while let Some(r) = routes.try_next().await.map_err(|e| failed("reading routes", e))? {
            if r.header.destination_prefix_length != 0 || r.header.table != 254 {
                continue;
            }
            for a in &r.attributes {
                if let RouteAttribute::Oif(i) = a {
                    if !defaults.contains(i) {
                        defaults.push(*i);
                    }
                }
            }
        }
    }
    if defaults.iter().any(|i| links.iter().any(|l| l.index == *i)) {
        links.retain(|l| defaults.contains(&l.index));
        return Ok(links);
    }
    let mut addressed = Vec::new();
    for l in links {
        if !addresses(handle.clone(), l.index).await?.is_empty() {
            addressed.push(l);
        }
    }
    Ok(addressed)
}

/// How a datagram to `to` leaves; None when no route reaches it, or it leaves by an
/// interface without an Ethernet address (a tunnel, loopback), where AF_XDP has no say.
pub async fn hop(handle: Handle, to: IpAddr) -> io::Result<Option<Hop>> {
    let Some(route) = route_get(handle.clone(), to).await? else {
        return Ok(None);
    };
    let (mut ifindex, mut source, mut gateway) = (None, None, None);
    for a in &route.attributes {
        match a {
            RouteAttribute::Oif(i) => ifindex = Some(*i),
            RouteAttribute::PrefSource(s) => source = ip_of(s),
            RouteAttribute::Gateway(g) => gateway = ip_of(g),
            _ => {}
        }
    }
    let (Some(ifindex), Some(source)) = (ifindex, source) else {
        return Ok(None);
    };
    let Some(Link { mac: from_mac, mtu }) = link(handle.clone(), ifindex).await? else {
        return Ok(None);
    };
    let next_hop = gateway.unwrap_or(to);
    let to_mac = neighbour_mac(handle, ifindex, next_hop).await?;
    Ok(Some(Hop {
        ifindex,
        source,
        next_hop,
        from_mac,
        mtu,
        to_mac,
    }))
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some((*v4).into()),
        RouteAddress::Inet6(v6) => Some((*v6).into()),
        _ => None,
    }
}

fn mac_of(bytes: &[u8]) -> Option<[u8; 6]> {
    bytes.try_into().ok().filter(|m: &[u8; 6]| m.iter().any(|&b| b != 0))
}

/// `ip route get TO`: the route the kernel would take (one answer, not a dump).
async fn route_get(mut handle: Handle, to: IpAddr) -> io::Result<Option<RouteMessage>> {
    let mut query = RouteMessage::default();
    query.header.address_family = if to.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    query.header.destination_prefix_length = if to.is_ipv4() { 32 } else { 128 };
    query.attributes.push(RouteAttribute::Destination(to.into()));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetRoute(query));
    req.header.flags = NLM_F_REQUEST;
    let mut answers = handle.request(req).map_err(|e| failed("asking for a route", e))?;
    use futures::StreamExt;
    while let Some(m) = answers.next().await {
        match m.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(r)) => return Ok(Some(r)),
            // No route: ENETUNREACH and the like come back as an error message.
            NetlinkPayload::Error(_) => return Ok(None),
            _ => {}
        }
    }
    Ok(None)
}

/// An interface's hardware address and MTU.
struct Link {
    mac: [u8; 6],
    mtu: u32,
}

/// None for an interface without a hardware address.
async fn link(handle: Handle, ifindex: u32) -> io::Result<Option<Link>> {
    let mut links = handle.link().get().match_index(ifindex).execute();
    let Some(l) = links.try_next().await.map_err(|e| failed("reading an interface", e))? else {
        return Ok(None);
    };
    let mut mac = None;
    let mut mtu = 1500;
    for a in l.attributes {
        match a {
            LinkAttribute::Address(bytes) => mac = mac_of(&bytes),
            LinkAttribute::Mtu(m) => mtu = m,
            _ => {}
        }
    }
    Ok(mac.map(|mac| Link { mac, mtu }))
}

/// The hardware address the neighbour table holds for `ip` on `ifindex`, if the entry is
/// usable (reachable, or stale and being confirmed, or set by hand).
async fn neighbour_mac(handle: Handle, ifindex: u32, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
    let version = if ip.is_ipv4() { IpVersion::V4 } else { IpVersion::V6 };
    let mut entries = handle.neighbours().get().set_family(version).execute();
    while let Some(n) = entries
        .try_next()
        .await
        .map_err(|e| failed("reading the neighbour table", e))?
    {
        if n.header.ifindex != ifindex {
            continue;
        }
        let usable = matches!(
            n.header.state,
            NeighbourState::Reachable
                | NeighbourState::Stale
                | NeighbourState::Delay
                | NeighbourState::Probe
                | NeighbourState::Permanent
        );
        let mut dst = None;
        let mut mac = None;
        for a in &n.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => dst = Some(IpAddr::from(*v4)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => dst = Some(IpAddr::from(*v6)),
                NeighbourAttribute::LinkLocalAddress(l) => mac = mac_of(l),
                _ => {}
            }
        }
        if dst == Some(ip) && usable {
            return Ok(mac);
        }
    }
    Ok(None)
}
