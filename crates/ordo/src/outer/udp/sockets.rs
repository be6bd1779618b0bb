//! The outer UDP sockets: one IPv4 and one IPv6 socket on the same port, as the kernel
//! implementation and wireguard-go use, so each family works even where the other is off.

use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Socket buffers asked for; the kernel caps them at net.core.[rw]mem_max unless forced.
const SOCKET_BUFFER: usize = 4 << 20;

pub struct Sockets {
    pub v4: UdpSocket,
    pub v6: Option<UdpSocket>,
    pub port: u16,
    /// UDP GSO: on where the kernel offers it, off for the destinations whose route cannot
    /// take it (see ordo_udp::send_batch).
    pub gso: ordo_udp::Gso,
    /// Whether the kernel granted UDP GRO on the receive sockets.
    pub gro: bool,
}

/// Opens and binds one socket; `reuse`: it joins a SO_REUSEPORT group (one socket per queue).
fn open(domain: Domain, addr: SocketAddr, fwmark: u32, reuse: bool) -> io::Result<UdpSocket> {
    let s = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    if domain == Domain::IPV6 {
        s.set_only_v6(true)?;
    }
    if reuse {
        s.set_reuse_port(true)?;
    }
    // Larger buffers absorb bursts. The FORCE variants pass net.core.[rw]mem_max (they need
    // CAP_NET_ADMIN, which the daemon keeps); without it, the capped request still helps.
    if !force_buffer(&s, libc::SO_RCVBUFFORCE) {
        let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    }
    if !force_buffer(&s, libc::SO_SNDBUFFORCE) {
        let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    }
    if fwmark != 0 {
        s.set_mark(fwmark)?;
    }
    // A thread waiting in recvmmsg sees a stop within this even if no shutdown wakes it.
    s.set_read_timeout(Some(crate::port::RECEIVE_WAIT))?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

fn force_buffer(s: &Socket, option: libc::c_int) -> bool {
    ordo_udp::set_int_option(s, libc::SOL_SOCKET, option, SOCKET_BUFFER as libc::c_int)
}

/// Turns UDP GSO and GRO off when set to `off`: for measuring what they save
/// (`scripts/profile-flow.sh`), not for use.
pub const OFFLOADS_ENV: &str = "ORDO_UDP_OFFLOADS";

fn offloads_wanted() -> bool {
    std::env::var(OFFLOADS_ENV).map_or(true, |v| v != "off")
}

impl Sockets {
    fn new(v4: UdpSocket, v6: Option<UdpSocket>, port: u16) -> Sockets {
        let wanted = offloads_wanted();
        let gro = wanted && ordo_udp::enable_gro(&v4) & v6.as_ref().is_none_or(ordo_udp::enable_gro);
        let gso = ordo_udp::Gso::new(wanted && ordo_udp::gso_supported(&v4));
        Sockets { v4, v6, port, gso, gro }
    }

    /// Binds both families on `port` (0: any free port, the same for both).
    pub fn bind(port: u16, fwmark: u32) -> io::Result<Sockets> {
        Ok(Sockets::bind_queues(port, fwmark, 1)?.remove(0))
    }

    /// Binds `queues` socket pairs on one port (0: any free port, the same for all). With
    /// more than one, they form SO_REUSEPORT groups whose datagrams are steered to the
    /// queue that our receiver index names (see `steer`).
    pub fn bind_queues(port: u16, fwmark: u32, queues: usize) -> io::Result<Vec<Sockets>> {
        let queues = queues.max(1);
        let reuse = queues > 1;
        if reuse && port != 0 {
            // A SO_REUSEPORT group takes in any socket of the same user that asks to join:
            // another interface (another daemon, another `ordo run`) on this port would
            // silently get half of our datagrams. A plain bind first says whether anyone
            // holds the port, as a single socket's bind would.
            open(Domain::IPV4, (Ipv4Addr::UNSPECIFIED, port).into(), fwmark, false)?;
            match open(Domain::IPV6, (Ipv6Addr::UNSPECIFIED, port).into(), fwmark, false) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
                _ => {}
            }
        }
        let mut last_err = None;
        'attempt: for _ in 0..16 {
            let first = open(Domain::IPV4, (Ipv4Addr::UNSPECIFIED, port).into(), fwmark, reuse)?;
            let bound = first.local_addr()?.port();
            let mut v4 = vec![first];
            for _ in 1..queues {
                v4.push(open(Domain::IPV4, (Ipv4Addr::UNSPECIFIED, bound).into(), fwmark, true)?);
            }
            let mut v6 = Vec::new();
            for _ in 0..queues {
                match open(Domain::IPV6, (Ipv6Addr::UNSPECIFIED, bound).into(), fwmark, reuse) {
                    Ok(s) => v6.push(s),
                    Err(e) if e.kind() == io::ErrorKind::AddrInUse && port == 0 && v6.is_empty() => {
                        last_err = Some(e);
                        continue 'attempt;
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL)) => {
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if reuse {
                super::steer::attach(&v4[0], queues as u32, &[])?;
                if let Some(s) = v6.first() {
                    super::steer::attach(s, queues as u32, &[])?;
                }
            }
            let mut v6 = v6.into_iter();
            return Ok(v4.into_iter().map(|s4| Sockets::new(s4, v6.next(), bound)).collect());
        }
        Err(last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
    }

    /// The socket for the destination's family, and the destination as that socket wants it
    /// (an IPv4-mapped IPv6 address goes out on the IPv4 socket).
    pub fn socket_for(&self, to: SocketAddr) -> io::Result<(&UdpSocket, SocketAddr)> {
        match to {
            SocketAddr::V4(_) => Ok((&self.v4, to)),
            SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
                Some(v4) => Ok((&self.v4, SocketAddr::new(v4.into(), a.port()))),
                None => match &self.v6 {
                    Some(s) => Ok((s, to)),
                    None => Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
                },
            },
        }
    }

    /// Sends on the socket of the destination's family.
    pub fn send_to(&self, payload: &[u8], to: SocketAddr) -> io::Result<usize> {
        let (s, to) = self.socket_for(to)?;
        s.send_to(payload, to)
    }

    /// Marks both sockets; on failure, the first may be marked (the caller puts it back).
    pub fn set_fwmark(&self, mark: u32) -> io::Result<()> {
        for s in std::iter::once(&self.v4).chain(self.v6.as_ref()) {
            socket2::SockRef::from(s).set_mark(mark)?;
        }
        Ok(())
    }

    /// Wakes the threads blocked in receive so they can notice the sockets were replaced.
    pub fn shutdown(&self) {
        for s in std::iter::once(&self.v4).chain(self.v6.as_ref()) {
            let _ = socket2::SockRef::from(s).shutdown(std::net::Shutdown::Read);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As root, the forced size passes the sysctl cap (the kernel doubles what is asked).
    #[test]
    fn buffers_are_forced_past_the_cap_when_allowed() {
        let socks = Sockets::bind(0, 0).unwrap();
        let got = socket2::SockRef::from(&socks.v4).recv_buffer_size().unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert!(
                got >= SOCKET_BUFFER,
                "receive buffer {got}, want at least {SOCKET_BUFFER}"
            );
        } else {
            assert!(got > 0);
        }
        assert_ne!(socks.port, 0);
    }

    /// A port another interface of ours holds is refused, not shared through the
    /// SO_REUSEPORT group (which would split the datagrams between the two).
    #[test]
    fn a_port_held_by_another_group_is_in_use() {
        let first = Sockets::bind_queues(0, 0, 2).unwrap();
        let port = first[0].port;
        let second = Sockets::bind_queues(port, 0, 2);
        assert_eq!(second.err().map(|e| e.kind()), Some(io::ErrorKind::AddrInUse));
        let single = Sockets::bind(port, 0);
        assert_eq!(single.err().map(|e| e.kind()), Some(io::ErrorKind::AddrInUse));
        drop(first);
        assert!(
            Sockets::bind_queues(port, 0, 2).is_ok(),
            "free again once the first is gone"
        );
    }
}
