//! The attach protocol: how an application's preload library asks a stack interface (an Ordo
//! interface whose inner side is its own TCP/IP stack) for a connection through the tunnel.
//!
//! The application keeps real kernel descriptors. To connect a socket through the tunnel the
//! library makes a Unix socket pair, sends one end to the service with a [`Request`] over a
//! fresh connection to the service's attach socket (SCM_RIGHTS beside the request's bytes),
//! and puts the other end in place of the application's descriptor. The bytes of the
//! connection then flow through that pair, and the service relays them to and from its
//! TCP/IP stack; poll, epoll, select, dup and fork keep their kernel semantics, and the
//! descriptor itself is the capability to the connection: nobody else holds it.
//!
//! Messages have a fixed size and layout (little-endian), so that both sides decode them
//! without allocating, and any bytes decode to a message or to an error, never a panic (the
//! service reads them from applications it does not trust).

pub mod rights;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The environment variable naming the attach socket, set by `ordo run` for the program.
pub const ENV_SOCKET: &str = "ORDO_ATTACH";
/// The environment variable listing the networks reached through the tunnel (comma
/// separated, `ADDR/PREFIX`), set by `ordo run` for the program.
pub const ENV_ROUTES: &str = "ORDO_ATTACH_ROUTES";
/// The environment variable carrying the interface's `DNS =` entries (comma separated, as
/// written: addresses are name servers, anything else a search domain), set by `ordo run`.
pub const ENV_DNS: &str = "ORDO_ATTACH_DNS";

/// A flag of the library's own sends (sendto, sendmsg, sendmmsg) whose destination it has
/// checked, or that have none: `ordo run`'s supervisor lets them by without stopping them.
/// A flag of receive calls (MSG_CMSG_CLOEXEC) that the kernel's send calls ignore, and that
/// no program gives them. A program that set it on purpose would slip by the supervisor,
/// as by the connect it lets by (crates/ordo/src/run/supervise.rs): the supervisor keeps
/// programs from leaking by accident, it is no sandbox.
pub const CHECKED_SEND: libc::c_int = libc::MSG_CMSG_CLOEXEC;

/// The fourth argument of the library's connect(2) system calls to Unix sockets (its own to
/// the attach socket, and a program's whose address is AF_UNIX): connect takes three, the
/// kernel ignores the fourth, and `ordo run`'s filter lets these by without stopping them.
/// An address's length does not tell them apart: a program's union of socket addresses may
/// be a sockaddr_un's size with an IPv4 address in it.
pub const CHECKED_CONNECT: u64 = u64::from_be_bytes(*b"ordo-unx");

const MAGIC: [u8; 4] = *b"ORDA";
/// The protocol's version: a service refuses requests of another.
pub const VERSION: u8 = 2;

/// Bytes of an encoded [`Request`].
pub const REQUEST_LEN: usize = 36;
/// Bytes of an encoded [`Reply`].
pub const REPLY_LEN: usize = 56;

/// What an application asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Connect a TCP stream to the address; the request carries the application's end of a
    /// socket pair, which becomes the stream.
    ConnectTcp,
    /// Listen for TCP connections on the address (one of the stack's, or the unspecified
    /// address of a family for all of them, and a port); the request carries the service's
    /// end of a socket pair whose other end becomes the application's listening socket. Each
    /// connection accepted comes over it as an [`Accepted`] with the connection's descriptor.
    /// On the unspecified address the request may carry, second, the application's kernel
    /// socket listening on the same port: a server bound to 0.0.0.0 or :: listens on the
    /// host's addresses and the tunnel's at once, as it would with a kernel tunnel device,
    /// and the service hands over the kernel's connections too (as they are: kernel sockets).
    ListenTcp,
    /// Connect a UDP socket to the address; the request carries the application's end of a
    /// Unix seqpacket pair, over which each record is one datagram, each way (payload only:
    /// the socket has one remote).
    ConnectUdp,
    /// Bind a UDP socket of the stack to the address (one of the stack's, or the
    /// unspecified address for all of them; port 0 for a free one): an unconnected socket,
    /// which sends to and receives from anyone through the tunnel. The request carries the
    /// service's end of a Unix seqpacket pair; each record on it is a datagram with its
    /// address: from the service, a [`Source`] and the payload; from the application, a
    /// [`SendHeader`] (which starts with the reply's [`Reply::marker`]) and the payload, or
    /// the payload alone, for the socket's remote once it is connected. On the unspecified
    /// address the request may carry, second, the application's kernel UDP socket bound to
    /// the same port: a server bound to 0.0.0.0 or :: receives from the host's addresses
    /// and the tunnel's at once, as with a kernel tunnel device. The service relays that
    /// socket too: what arrives on it comes over the pair with its source, and what the
    /// application sends to the host's networks ([`SendHeader::ToHost`]) leaves by it.
    BindUdp,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::ConnectTcp => 1,
            Op::ListenTcp => 2,
            Op::ConnectUdp => 3,
            Op::BindUdp => 4,
        }
    }

    fn from_code(c: u8) -> Option<Op> {
        match c {
            1 => Some(Op::ConnectTcp),
            2 => Some(Op::ListenTcp),
            3 => Some(Op::ConnectUdp),
            4 => Some(Op::BindUdp),
            _ => None,
        }
    }
}

/// A request from the library to the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// Where to connect.
    pub addr: SocketAddr,
    /// A non-blocking connect: the application has its stand-in already and was told
    /// EINPROGRESS. So that the stand-in becomes writable only once the connection is
    /// established (what the application waits for), the library filled the application's
    /// end with `filler` bytes under a minimal send buffer; the service discards exactly
    /// those, then gives the application's end its send buffer back (`sndbuf` bytes), through
    /// a copy of that end sent as a second descriptor. None: a blocking connect, answered
    /// when it is established or failed.
    pub nonblocking: Option<Filler>,
    /// [`Op::ListenTcp`] on `::`: the application's socket is IPV6_V6ONLY, so the listener
    /// takes IPv6 connections only (otherwise IPv4 ones too, as IPv4-mapped addresses).
    pub v6_only: bool,
}

/// What a non-blocking connect's stand-in was filled with (see [`Request::nonblocking`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filler {
    pub filler: u32,
    pub sndbuf: u32,
}

/// Fills `fd`'s send buffer with zeros until it takes no more: the bytes that went, the
/// [`Filler::filler`] of a non-blocking connect's stand-in. The caller shrinks the buffer
/// first, with its own setsockopt (the preload library's must not be its own hook).
pub fn fill_send_buffer(fd: std::os::fd::RawFd) -> std::io::Result<u32> {
    let zeros = [0u8; 512];
    let mut filler: u32 = 0;
    loop {
        // SAFETY: sending from a live buffer.
        let n = unsafe {
            libc::send(
                fd,
                zeros.as_ptr().cast(),
                zeros.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            filler += n as u32;
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(filler);
        }
        return Err(e);
    }
}

/// The service's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// 0, or the errno the application's call returns (ECONNREFUSED, ETIMEDOUT, ENETUNREACH...).
    pub errno: i32,
    /// The connection's local address in the tunnel (getsockname), when it has one.
    pub local: Option<SocketAddr>,
    /// The connection's remote address (getpeername), when it has one.
    pub remote: Option<SocketAddr>,
    /// For [`Op::BindUdp`]: the bytes that start each of the application's records that
    /// carries a [`SendHeader`], chosen at random by the service for the socket. A record
    /// that does not start with them is a payload alone; no payload can pass for a header
    /// unless its sender knows them.
    pub marker: Option<[u8; MARKER_LEN]>,
}

/// Bytes of a [`Reply::marker`].
pub const MARKER_LEN: usize = 8;
/// Bytes of an encoded [`Source`], before the payload of each record from the service on an
/// unconnected UDP socket.
pub const SOURCE_LEN: usize = 20;
/// Bytes of an encoded [`SendHeader`] with its marker, before the payload of a record from
/// the application on an unconnected UDP socket.
pub const SEND_HEADER_LEN: usize = MARKER_LEN + 20;

/// Where a datagram the service hands an unconnected UDP socket came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source(pub SocketAddr);

impl Source {
    pub fn encode(&self) -> [u8; SOURCE_LEN] {
        let mut b = [0u8; SOURCE_LEN];
        put_addr(&mut b[..19], Some(self.0));
        b
    }

    /// The source at the start of `record`.
    pub fn decode(record: &[u8]) -> Result<Source, DecodeError> {
        let b = record.get(..SOURCE_LEN).ok_or(DecodeError::Length)?;
        if b[19] != 0 {
            return Err(DecodeError::Flags);
        }
        Ok(Source(get_addr(&b[..19])?.ok_or(DecodeError::Family(0))?))
    }
}

/// What an application's marked record on an unconnected UDP socket says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendHeader {
    /// The payload after the header is a datagram to this address.
    To(SocketAddr),
    /// connect(2): from now on the socket receives from this address only, and a record
    /// without a header goes to it. No payload.
    Connect(SocketAddr),
    /// As [`SendHeader::To`], an address outside the tunnel: through the application's
    /// kernel socket (see [`Op::BindUdp`]).
    ToHost(SocketAddr),
    /// As [`SendHeader::Connect`], an address outside the tunnel.
    ConnectHost(SocketAddr),
    /// connect(2) with AF_UNSPEC: the socket has no remote any more. No payload.
    Disconnect,
}

impl SendHeader {
    pub fn encode(&self, marker: [u8; MARKER_LEN]) -> [u8; SEND_HEADER_LEN] {
        let mut b = [0u8; SEND_HEADER_LEN];
        b[..MARKER_LEN].copy_from_slice(&marker);
        let (kind, addr) = match self {
            SendHeader::To(a) => (1, Some(*a)),
            SendHeader::Connect(a) => (2, Some(*a)),
            SendHeader::ToHost(a) => (3, Some(*a)),
            SendHeader::ConnectHost(a) => (4, Some(*a)),
            SendHeader::Disconnect => (5, None),
        };
        b[MARKER_LEN] = kind;
        put_addr(&mut b[MARKER_LEN + 1..], addr);
        b
    }

    /// The header at the start of `record`: None if the record does not start with `marker`
    /// (a payload alone); an error if it does but what follows is not a header.
    pub fn decode(marker: [u8; MARKER_LEN], record: &[u8]) -> Option<Result<SendHeader, DecodeError>> {
        if record.get(..MARKER_LEN) != Some(&marker[..]) {
            return None;
        }
        let Some(b) = record.get(MARKER_LEN..SEND_HEADER_LEN) else {
            return Some(Err(DecodeError::Length));
        };
        if b[0] == 5 {
            return Some(if b[1..].iter().all(|x| *x == 0) {
                Ok(SendHeader::Disconnect)
            } else {
                Err(DecodeError::Flags)
            });
        }
        let addr = match get_addr(&b[1..]) {
            Ok(Some(a)) => a,
            Ok(None) => return Some(Err(DecodeError::Family(0))),
            Err(e) => return Some(Err(e)),
        };
        Some(match b[0] {
            1 => Ok(SendHeader::To(addr)),
            2 => Ok(SendHeader::Connect(addr)),
            3 => Ok(SendHeader::ToHost(addr)),
            4 => Ok(SendHeader::ConnectHost(addr)),
            k => Err(DecodeError::Op(k)),
        })
    }
}

/// Bytes of an encoded [`Accepted`].
pub const ACCEPTED_LEN: usize = 44;

/// A connection accepted on a listening socket, sent by the service over the listening
/// socket's pair with the connection's descriptor beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The connection came to the application's kernel listening socket (see
    /// [`Op::ListenTcp`]): its descriptor is the kernel's TCP socket, not the stack's.
    pub kernel: bool,
}

impl Accepted {
    pub fn encode(&self) -> [u8; ACCEPTED_LEN] {
        let mut b = [0u8; ACCEPTED_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        put_addr(&mut b[5..24], Some(self.local));
        put_addr(&mut b[24..43], Some(self.remote));
        b[43] = u8::from(self.kernel);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Accepted, DecodeError> {
        check_header(b, ACCEPTED_LEN)?;
        Ok(Accepted {
            local: get_addr(&b[5..24])?.ok_or(DecodeError::Family(0))?,
            remote: get_addr(&b[24..43])?.ok_or(DecodeError::Family(0))?,
            kernel: match b[43] {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::Flags),
            },
        })
    }
}

/// Why bytes are not a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    Length,
    Magic,
    Version(u8),
    Op(u8),
    Family(u8),
    /// Flags or reserved bytes that are not what this version writes.
    Flags,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Length => write!(f, "wrong length"),
            DecodeError::Magic => write!(f, "not an attach message"),
            DecodeError::Version(v) => write!(f, "protocol version {v}, expected {VERSION}"),
            DecodeError::Op(o) => write!(f, "unknown operation {o}"),
            DecodeError::Family(x) => write!(f, "unknown address family {x}"),
            DecodeError::Flags => write!(f, "unknown flags"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// An address as 19 bytes: family (0 none, 4, 6), port, 16 address bytes (IPv4 in the first 4).
fn put_addr(out: &mut [u8], a: Option<SocketAddr>) {
    out[..19].fill(0);
    let Some(a) = a else { return };
    out[1..3].copy_from_slice(&a.port().to_le_bytes());
    match a.ip() {
        IpAddr::V4(ip) => {
            out[0] = 4;
            out[3..7].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out[0] = 6;
            out[3..19].copy_from_slice(&ip.octets());
        }
    }
}

fn get_addr(b: &[u8]) -> Result<Option<SocketAddr>, DecodeError> {
    let port = u16::from_le_bytes([b[1], b[2]]);
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[3..19]);
    let ip = match b[0] {
        0 => return Ok(None),
        4 => IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])),
        6 => IpAddr::V6(Ipv6Addr::from(o)),
        f => return Err(DecodeError::Family(f)),
    };
    Ok(Some(SocketAddr::new(ip, port)))
}

fn check_header(b: &[u8], len: usize) -> Result<(), DecodeError> {
    if b.len() != len {
        return Err(DecodeError::Length);
    }
    if b[..4] != MAGIC {
        return Err(DecodeError::Magic);
    }
    if b[4] != VERSION {
        return Err(DecodeError::Version(b[4]));
    }
    Ok(())
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.op.code();
        put_addr(&mut b[6..25], Some(self.addr));
        if let Some(f) = self.nonblocking {
            b[25] = 1;
            b[26..30].copy_from_slice(&f.filler.to_le_bytes());
            b[30..34].copy_from_slice(&f.sndbuf.to_le_bytes());
        }
        b[34] = u8::from(self.v6_only);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Request, DecodeError> {
        check_header(b, REQUEST_LEN)?;
        let op = Op::from_code(b[5]).ok_or(DecodeError::Op(b[5]))?;
        let addr = get_addr(&b[6..25])?.ok_or(DecodeError::Family(0))?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let nonblocking = match b[25] {
            0 if b[26..34].iter().all(|x| *x == 0) => None,
            1 => Some(Filler {
                filler: word(26),
                sndbuf: word(30),
            }),
            _ => return Err(DecodeError::Flags),
        };
        let v6_only = match (b[34], b[35]) {
            (0, 0) => false,
            (1, 0) => true,
            _ => return Err(DecodeError::Flags),
        };
        Ok(Request {
            op,
            addr,
            nonblocking,
            v6_only,
        })
    }
}

impl Reply {
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5..9].copy_from_slice(&self.errno.to_le_bytes());
        put_addr(&mut b[9..28], self.local);
        put_addr(&mut b[28..47], self.remote);
        if let Some(m) = self.marker {
            b[47] = 1;
            b[48..56].copy_from_slice(&m);
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Reply, DecodeError> {
        check_header(b, REPLY_LEN)?;
        Ok(Reply {
            errno: i32::from_le_bytes([b[5], b[6], b[7], b[8]]),
            local: get_addr(&b[9..28])?,
            remote: get_addr(&b[28..47])?,
            marker: match b[47] {
                0 if b[48..].iter().all(|x| *x == 0) => None,
                1 => Some(b[48..56].try_into().expect("8 bytes")),
                _ => return Err(DecodeError::Flags),
            },
        })
    }
}

/// A network reached through the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Route {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let bits = u32::from(self.prefix.min(32));
                let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let bits = u32::from(self.prefix.min(128));
                let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Parses [`ENV_ROUTES`]: `ADDR/PREFIX` items separated by commas; an item that does not
/// parse is skipped (the library must not fail an application over its environment).
pub fn parse_routes(s: &str) -> Vec<Route> {
    s.split(',')
        .filter_map(|item| {
            let (addr, prefix) = item.trim().split_once('/')?;
            let addr: IpAddr = addr.parse().ok()?;
            let prefix: u8 = prefix.parse().ok()?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            (prefix <= max).then_some(Route { addr, prefix })
        })
        .collect()
}

/// Formats routes as [`parse_routes`] reads them.
pub fn format_routes(routes: &[Route]) -> String {
    let items: Vec<String> = routes.iter().map(|r| format!("{}/{}", r.addr, r.prefix)).collect();
    items.join(",")
}

/// Name resolution as a wg-quick file's `DNS =` asks for it: the name servers, and the
/// domains to search for a name without a dot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub servers: Vec<IpAddr>,
    pub search: Vec<String>,
}

impl Dns {
    /// Reads `DNS =` entries (comma separated, as wg-quick does: an entry that is an address
    /// is a name server, any other a search domain). An entry that is neither (empty, or not
    /// a domain name's characters) is an error naming it.
    pub fn parse(entries: &str) -> Result<Dns, String> {
        let mut dns = Dns::default();
        for e in entries.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Ok(ip) = e.parse::<IpAddr>() {
                dns.servers.push(ip);
            } else if is_domain(e) {
                dns.search.push(e.trim_end_matches('.').to_ascii_lowercase());
            } else {
                return Err(format!("{e:?} is neither an address nor a domain name"));
            }
        }
        Ok(dns)
    }

    /// As [`Dns::parse`] reads it.
    pub fn format(&self) -> String {
        let servers = self.servers.iter().map(IpAddr::to_string);
        servers.chain(self.search.iter().cloned()).collect::<Vec<_>>().join(",")
    }
}

/// Whether `s` is a domain name: dot-separated labels of letters, digits, `-` and `_`, each
/// 1 to 63 characters, 253 in all.
fn is_domain(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Whether a connection to `ip` goes through the tunnel: inside one of the routes, and not
/// loopback (which always stays with the kernel, whatever the routes say).
/// Where a connection or datagram to `dest` goes instead, if it is a DNS query (port 53) to a
/// server outside the tunnel while the tunnel has name servers of its own in it (`DNS =`,
/// `servers`): the first of those. None: it goes where it was sent (inside the tunnel, not
/// to port 53, no `DNS =`, or to one of the tunnel's own servers, routed through it or not).
pub fn dns_redirect(routes: &[Route], servers: &[IpAddr], dest: SocketAddr) -> Option<SocketAddr> {
    let ip = unmapped(dest.ip());
    if dest.port() != 53 || through_tunnel(routes, ip) || servers.contains(&ip) {
        return None;
    }
    let server = servers.iter().find(|a| through_tunnel(routes, **a))?;
    Some(SocketAddr::new(*server, 53))
}

/// Whether `ip` goes through the tunnel: in one of `routes`, and neither a loopback nor an
/// unspecified address (an IPv4-mapped IPv6 address as the IPv4 one it is).
pub fn through_tunnel(routes: &[Route], ip: IpAddr) -> bool {
    let ip = unmapped(ip);
    !ip.is_loopback() && !ip.is_unspecified() && routes.iter().any(|r| r.contains(ip))
}

/// An IPv4-mapped IPv6 address as the IPv4 address it stands for; any other as it is.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_queries_to_the_host_s_servers_go_to_the_tunnel_s() {
        let routes = [Route {
            addr: "10.99.0.0".parse().unwrap(),
            prefix: 24,
        }];
        let tunnel: Vec<IpAddr> = vec!["192.0.2.53".parse().unwrap(), "10.99.0.2".parse().unwrap()];
        let to = |s: &str| dns_redirect(&routes, &tunnel, s.parse().unwrap());
        let server = Some("10.99.0.2:53".parse().unwrap());
        assert_eq!(to("203.0.113.1:53"), server, "the host's server");
        assert_eq!(to("[::ffff:203.0.113.1]:53"), server, "mapped");
        assert_eq!(to("[2001:db8::1]:53"), server);
        assert_eq!(to("203.0.113.1:80"), None, "not DNS");
        assert_eq!(to("10.99.0.9:53"), None, "inside the tunnel already");
        assert_eq!(to("192.0.2.53:53"), None, "one of the tunnel's own servers");
        assert_eq!(
            dns_redirect(&routes, &[], "203.0.113.1:53".parse().unwrap()),
            None,
            "no DNS ="
        );
        let outside: Vec<IpAddr> = vec!["192.0.2.53".parse().unwrap()];
        assert_eq!(
            dns_redirect(&routes, &outside, "203.0.113.1:53".parse().unwrap()),
            None,
            "no server of the tunnel's in it"
        );
    }

    #[test]
    fn messages_round_trip() {
        let udp = Request {
            op: Op::ConnectUdp,
            addr: "10.0.0.2:53".parse().unwrap(),
            nonblocking: None,
            v6_only: false,
        };
        assert_eq!(Request::decode(&udp.encode()), Ok(udp));
        let listen = Request {
            op: Op::ListenTcp,
            addr: "[::]:8080".parse().unwrap(),
            nonblocking: None,
            v6_only: true,
        };
        assert_eq!(Request::decode(&listen.encode()), Ok(listen));
        for addr in ["10.0.0.2:80", "[fd00::2]:443"] {
            for nonblocking in [
                None,
                Some(Filler {
                    filler: 4608,
                    sndbuf: 212992,
                }),
            ] {
                let r = Request {
                    op: Op::ConnectTcp,
                    addr: addr.parse().unwrap(),
                    nonblocking,
                    v6_only: false,
                };
                assert_eq!(Request::decode(&r.encode()), Ok(r));
            }
        }
        let accepted = Accepted {
            local: "10.0.0.1:8000".parse().unwrap(),
            remote: "[fd00::2]:50000".parse().unwrap(),
            kernel: false,
        };
        assert_eq!(Accepted::decode(&accepted.encode()), Ok(accepted));
        let kernel = Accepted {
            kernel: true,
            ..accepted
        };
        assert_eq!(Accepted::decode(&kernel.encode()), Ok(kernel));
        let mut b = kernel.encode();
        b[43] = 2;
        assert_eq!(Accepted::decode(&b), Err(DecodeError::Flags));
        let reply = Reply {
            errno: 111,
            local: Some("10.0.0.1:40000".parse().unwrap()),
            remote: None,
            marker: None,
        };
        assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        let bound = Reply {
            errno: 0,
            local: Some("0.0.0.0:5353".parse().unwrap()),
            remote: None,
            marker: Some(*b"\x01\x02\x03\x04\x05\x06\x07\x08"),
        };
        assert_eq!(Reply::decode(&bound.encode()), Ok(bound));
        for a in ["10.0.0.2:53", "[fd00::2]:443"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(Source::decode(&Source(a).encode()), Ok(Source(a)));
            let marker = *b"ordo-mk!";
            for h in [
                SendHeader::To(a),
                SendHeader::Connect(a),
                SendHeader::ToHost(a),
                SendHeader::ConnectHost(a),
                SendHeader::Disconnect,
            ] {
                let mut record = h.encode(marker).to_vec();
                record.extend_from_slice(b"payload");
                assert_eq!(SendHeader::decode(marker, &record), Some(Ok(h)));
                assert_eq!(SendHeader::decode(*b"another!", &record), None);
            }
        }
    }

    #[test]
    fn bad_bytes_are_errors() {
        let good = Request {
            op: Op::ConnectTcp,
            addr: "10.0.0.2:80".parse().unwrap(),
            nonblocking: None,
            v6_only: false,
        }
        .encode();
        for (at, value) in [(25, 2), (30, 1), (34, 2), (35, 1)] {
            let mut b = good;
            b[at] = value;
            assert_eq!(Request::decode(&b), Err(DecodeError::Flags), "byte {at}");
        }
        assert_eq!(Request::decode(&good[..10]), Err(DecodeError::Length));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Request::decode(&b), Err(DecodeError::Magic));
        let mut b = good;
        b[4] = 9;
        assert_eq!(Request::decode(&b), Err(DecodeError::Version(9)));
        let mut b = good;
        b[5] = 77;
        assert_eq!(Request::decode(&b), Err(DecodeError::Op(77)));
        let mut b = good;
        b[6] = 5;
        assert_eq!(Request::decode(&b), Err(DecodeError::Family(5)));
        let mut b = good;
        b[6] = 0;
        assert_eq!(Request::decode(&b), Err(DecodeError::Family(0)));
    }

    #[test]
    fn bad_datagram_headers_are_errors() {
        let marker = *b"ordo-mk!";
        let good = SendHeader::To("10.0.0.2:53".parse().unwrap()).encode(marker);
        assert_eq!(SendHeader::decode(marker, b"payload"), None);
        assert_eq!(SendHeader::decode(marker, &good[..12]), Some(Err(DecodeError::Length)));
        let mut b = good;
        b[MARKER_LEN] = 9;
        assert_eq!(SendHeader::decode(marker, &b), Some(Err(DecodeError::Op(9))));
        let mut b = good;
        b[MARKER_LEN + 1] = 5;
        assert_eq!(SendHeader::decode(marker, &b), Some(Err(DecodeError::Family(5))));
        let mut b = SendHeader::Disconnect.encode(marker);
        b[MARKER_LEN + 3] = 1;
        assert_eq!(SendHeader::decode(marker, &b), Some(Err(DecodeError::Flags)));
        assert_eq!(Source::decode(&[4; 5]), Err(DecodeError::Length));
        let mut b = Source("10.0.0.2:53".parse().unwrap()).encode();
        b[19] = 1;
        assert_eq!(Source::decode(&b), Err(DecodeError::Flags));
        let mut r = Reply {
            errno: 0,
            local: None,
            remote: None,
            marker: None,
        }
        .encode();
        r[47] = 2;
        assert_eq!(Reply::decode(&r), Err(DecodeError::Flags));
    }

    #[test]
    fn dns_entries_are_servers_and_search_domains() {
        let dns = Dns::parse("10.99.0.2, fd99::2,corp.example., Lab").unwrap();
        assert_eq!(
            dns.servers,
            ["10.99.0.2".parse::<IpAddr>().unwrap(), "fd99::2".parse().unwrap()]
        );
        assert_eq!(dns.search, ["corp.example", "lab"]);
        assert_eq!(Dns::parse(&dns.format()), Ok(dns));
        assert!(Dns::parse("10.0.0.1, bad name").is_err());
        assert!(Dns::parse("a..b").is_err());
        assert_eq!(Dns::parse(" , "), Ok(Dns::default()));
    }

    #[test]
    fn routes_decide_what_goes_through_the_tunnel() {
        let routes = parse_routes("10.99.0.0/24, fd99::/64,bogus,1.2.3.4/33,0.0.0.0/0x");
        assert_eq!(routes.len(), 2);
        assert_eq!(parse_routes(&format_routes(&routes)), routes);
        assert!(through_tunnel(&routes, "10.99.0.2".parse().unwrap()));
        assert!(through_tunnel(&routes, "::ffff:10.99.0.2".parse().unwrap()));
        assert!(through_tunnel(&routes, "fd99::2".parse().unwrap()));
        assert!(!through_tunnel(&routes, "10.77.0.2".parse().unwrap()));
        let all = parse_routes("0.0.0.0/0,::/0");
        assert!(through_tunnel(&all, "192.0.2.1".parse().unwrap()));
        assert!(!through_tunnel(&all, "127.0.0.1".parse().unwrap()));
        assert!(!through_tunnel(&all, "::1".parse().unwrap()));
        assert!(!through_tunnel(&all, "0.0.0.0".parse().unwrap()));
    }
}
