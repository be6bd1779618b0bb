//! Where a stopped call would send, read from the program's memory as the kernel reads it
//! (net/ipv4/udp.c, net/ipv6/udp.c, net/ipv4/raw.c, net/ipv6/raw.c, net/ipv4/af_inet.c), and
//! why a call is refused: whatever cannot be read for certain is refused, never let by
//! (run/supervise.rs judges what is read).

use super::listener::Caller;
use std::mem::size_of;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The largest socket address read from a program.
const MAX_SOCKADDR: usize = 128;

/// Why a call that may send is refused: fail closed, whatever cannot be judged for certain
/// is refused rather than let by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Its destination is in the tunnel, and the call cannot be carried there.
    Tunnel(SocketAddr),
    /// Where it goes cannot be read: the process is not dumpable (it ran a program it may
    /// not read, or changed its credentials), or the address is not in its memory.
    Unreadable,
    /// An address of an IP family, or of none (AF_UNSPEC, which a send on an IPv4 socket
    /// takes as IPv4), too short to hold an address.
    Short { family: u16, len: usize },
    /// A DNS query from an unconnected socket to a name server outside the tunnel while the
    /// tunnel has its own (`DNS =`).
    Dns(SocketAddr),
    /// A DNS connect to `asked`, a name server outside the tunnel, sent to the tunnel's
    /// `server` instead (`DNS =`), which could not be carried there.
    DnsNotCarried { asked: SocketAddr, server: SocketAddr },
}

/// Which call gave an address: the kernel reads AF_UNSPEC differently for each.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Call {
    Connect,
    Send,
}

/// The IP destinations the kernel may send to for the socket address of `len` bytes at
/// `address` in the caller's memory (none: no address, or not an IP one); Err if it must be
/// refused unread.
pub fn read_destinations(caller: &Caller, address: u64, len: u64, call: Call) -> Result<Vec<SocketAddr>, Refusal> {
    // A null address, or one of no length, is none: the kernel reads nothing either.
    if address == 0 || len == 0 {
        return Ok(Vec::new());
    }
    if !caller.readable() {
        return Err(Refusal::Unreadable);
    }
    // Longer than a sockaddr_storage the kernel refuses (EINVAL); its start is read anyway.
    let len = (len as usize).min(MAX_SOCKADDR);
    let mut buf = [0u8; MAX_SOCKADDR];
    caller.read(address, &mut buf[..len]).ok_or(Refusal::Unreadable)?;
    destinations(&buf[..len], call)
}

/// The destinations of the message header at `address`.
pub fn message_destinations(caller: &Caller, address: u64) -> Result<Vec<SocketAddr>, Refusal> {
    let mut buf = [0u8; size_of::<libc::msghdr>()];
    if address == 0 {
        return Ok(Vec::new());
    }
    caller.read(address, &mut buf).ok_or(Refusal::Unreadable)?;
    // SAFETY: `buf` holds the bytes of a msghdr; every bit pattern is one.
    let header: libc::msghdr = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
    read_destinations(
        caller,
        header.msg_name as u64,
        u64::from(header.msg_namelen),
        Call::Send,
    )
}

/// The IP destinations a socket address's bytes may stand for, as the kernel reads them
/// (net/ipv4/udp.c, net/ipv6/udp.c, net/ipv4/raw.c, net/ipv6/raw.c, net/ipv4/af_inet.c):
/// AF_INET and AF_INET6 as themselves (an IPv4-mapped IPv6 address as IPv4, as it is sent);
/// AF_UNSPEC given to connect dissolves an association and reaches no one, given to a send
/// it is IPv4 on an IPv4 UDP or raw socket and IPv6 on an IPv6 raw one (both are returned);
/// any other family is refused by every IP socket. An IP family too short for its address
/// is refused here, as the kernel's IP sockets refuse it.
pub fn destinations(b: &[u8], call: Call) -> Result<Vec<SocketAddr>, Refusal> {
    let Some(family) = b.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]])) else {
        // Not even a family: the kernel's IP sockets take no destination from it.
        return Ok(Vec::new());
    };
    let short = Refusal::Short { family, len: b.len() };
    let v4 = |b: &[u8]| -> Option<SocketAddr> {
        let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
        let ip = <[u8; 4]>::try_from(b.get(4..8)?).ok()?;
        (b.len() >= size_of::<libc::sockaddr_in>()).then(|| SocketAddr::new(IpAddr::V4(ip.into()), port))
    };
    let v6 = |b: &[u8]| -> Option<SocketAddr> {
        let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(b.get(8..24)?).ok()?);
        Some(SocketAddr::new(
            ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
            port,
        ))
    };
    match i32::from(family) {
        libc::AF_INET => v4(b).map(|a| vec![a]).ok_or(short),
        libc::AF_INET6 => v6(b).map(|a| vec![a]).ok_or(short),
        libc::AF_UNSPEC if call == Call::Connect => Ok(Vec::new()),
        libc::AF_UNSPEC => {
            let as_v4 = v4(b).ok_or(short)?;
            Ok(std::iter::once(as_v4).chain(v6(b)).collect())
        }
        _ => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4], port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&a);
        b
    }

    fn v6(a: &str, port: u16, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; 28];
        b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[8..24].copy_from_slice(&a.parse::<Ipv6Addr>().unwrap().octets());
        b.truncate(len);
        b
    }

    fn with_family(mut b: Vec<u8>, family: i32) -> Vec<u8> {
        b[..2].copy_from_slice(&(family as u16).to_ne_bytes());
        b
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn destinations_are_read_as_the_kernel_reads_them() {
        for call in [Call::Connect, Call::Send] {
            assert_eq!(
                destinations(&v4([10, 1, 2, 3], 443), call),
                Ok(vec![addr("10.1.2.3:443")])
            );
            // Longer than the family needs: the kernel reads its start.
            let mut long = v4([10, 1, 2, 3], 443);
            long.resize(110, 0);
            assert_eq!(destinations(&long, call), Ok(vec![addr("10.1.2.3:443")]));
            // IPv6 of 28 bytes and of the older 24, a scope id or not; IPv4-mapped as IPv4.
            assert_eq!(
                destinations(&v6("fd00::1", 53, 28), call),
                Ok(vec![addr("[fd00::1]:53")])
            );
            assert_eq!(
                destinations(&v6("fd00::1", 53, 24), call),
                Ok(vec![addr("[fd00::1]:53")])
            );
            assert_eq!(
                destinations(&v6("::ffff:10.9.8.7", 53, 28), call),
                Ok(vec![addr("10.9.8.7:53")])
            );
            // Too short for an IP family: refused, not guessed.
            assert_eq!(
                destinations(&v4([10, 1, 2, 3], 443)[..8], call),
                Err(Refusal::Short { family: 2, len: 8 })
            );
            assert_eq!(
                destinations(&v6("fd00::1", 53, 20), call),
                Err(Refusal::Short { family: 10, len: 20 })
            );
            // Another family, or no family at all: no IP destination.
            assert_eq!(
                destinations(&with_family(v4([10, 1, 2, 3], 1), libc::AF_UNIX), call),
                Ok(vec![])
            );
            assert_eq!(destinations(&[2], call), Ok(vec![]));
        }
        // AF_UNSPEC: connect's way of dissolving an association, reaching no one; a send
        // on an IPv4 socket takes it as IPv4, on an IPv6 raw socket as IPv6: both judged.
        let unspec = with_family(v4([10, 1, 2, 3], 53), libc::AF_UNSPEC);
        assert_eq!(destinations(&unspec, Call::Connect), Ok(vec![]));
        assert_eq!(destinations(&unspec, Call::Send), Ok(vec![addr("10.1.2.3:53")]));
        let unspec6 = with_family(v6("fd00::1", 53, 28), libc::AF_UNSPEC);
        assert_eq!(
            destinations(&unspec6, Call::Send),
            Ok(vec![addr("0.0.0.0:53"), addr("[fd00::1]:53")])
        );
        assert_eq!(
            destinations(&unspec[..8], Call::Send),
            Err(Refusal::Short { family: 0, len: 8 })
        );
    }
}
