//! Name resolution through the tunnel's name servers (`DNS =` of the wg-quick file), for
//! `getaddrinfo`. glibc's resolver opens its sockets through internal calls that a preload
//! library cannot see, so its queries would go to the host's servers by the kernel's route;
//! instead the hook asks the tunnel's servers itself, over a UDP socket connected the way any
//! of the program's would be (through the tunnel when the server is inside it). Names the
//! host's `/etc/hosts` knows stay the host's, as `files` before `dns` in nsswitch.conf has it.
//!
//! As glibc's stub resolver: a name with no dot is tried with each search domain first, one
//! with a dot as it is first; each server in turn, [`ATTEMPTS`] rounds of [`TIMEOUT`] each.
//! Reverse lookups (`getnameinfo`) ask the same servers for the address's PTR record, unless
//! `/etc/hosts` names the address; the older gethostbyname and gethostbyaddr family too
//! (`crate::hostent`). Not done: TCP when an answer is truncated (the addresses of a name fit
//! in a datagram).

use libc::c_int;
use ordo_attach::Dns;
use simple_dns::rdata::RData;
use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QTYPE, RCODE, TYPE};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one server has to answer one round of queries.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Rounds over the servers before giving up.
const ATTEMPTS: usize = 2;

/// The tunnel's name resolution, from the environment `ordo run` set; None: the host's.
pub fn settings() -> Option<&'static Dns> {
    static DNS: OnceLock<Option<Dns>> = OnceLock::new();
    DNS.get_or_init(|| {
        let dns = Dns::parse(&std::env::var(ordo_attach::ENV_DNS).ok()?).ok()?;
        (!dns.servers.is_empty()).then_some(dns)
    })
    .as_ref()
}

/// glibc's "name has no address of that family" (netdb.h, under _GNU_SOURCE), which the
/// libc crate does not define for Linux.
pub const EAI_NODATA: c_int = -5;

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    /// The name that answered (the last of a CNAME chain).
    pub canonical: String,
    pub addresses: Vec<IpAddr>,
    /// The names a PTR query found.
    pub pointers: Vec<String>,
}

/// The addresses of `name` of the families asked (AF_UNSPEC: IPv4 and IPv6), or
/// getaddrinfo's error: EAI_NONAME when no candidate name exists, EAI_NODATA when it exists
/// without such addresses, EAI_AGAIN when no server answered.
pub fn lookup(dns: &Dns, name: &str, family: c_int) -> Result<Found, c_int> {
    let types: &[TYPE] = match family {
        libc::AF_INET => &[TYPE::A],
        libc::AF_INET6 => &[TYPE::AAAA],
        _ => &[TYPE::A, TYPE::AAAA],
    };
    let mut answered = false;
    let mut exists = false;
    for candidate in candidates(dns, name) {
        match ask_servers(dns, &candidate, types) {
            Some(Answer::Found(found)) if !found.addresses.is_empty() => return Ok(found),
            Some(Answer::Found(_)) => {
                answered = true;
                exists = true;
            }
            Some(Answer::NoSuchName) => answered = true,
            None => {}
        }
    }
    Err(match (answered, exists) {
        (_, true) => EAI_NODATA,
        (true, false) => libc::EAI_NONAME,
        (false, false) => libc::EAI_AGAIN,
    })
}

/// The name of `ip` (its PTR record), or getnameinfo's error: EAI_NONAME when it has none,
/// EAI_AGAIN when no server answered.
pub fn reverse(dns: &Dns, ip: IpAddr) -> Result<String, c_int> {
    match ask_servers(dns, &arpa_name(ip), &[TYPE::PTR]) {
        Some(Answer::Found(found)) => (found.pointers.into_iter().next())
            .map(|n| n.trim_end_matches('.').to_string())
            .ok_or(libc::EAI_NONAME),
        Some(Answer::NoSuchName) => Err(libc::EAI_NONAME),
        None => Err(libc::EAI_AGAIN),
    }
}

/// The name a PTR query for `ip` asks about (RFC 1035 3.5, RFC 3596 2.5).
fn arpa_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut name = String::with_capacity(72);
            for b in v6.octets().iter().rev() {
                name.push_str(&format!("{:x}.{:x}.", b & 0x0f, b >> 4));
            }
            name.push_str("ip6.arpa");
            name
        }
    }
}

/// The name the host's `/etc/hosts` gives `ip`, if any (then the host's resolver answers).
pub fn hosts_name_of(ip: IpAddr) -> Option<String> {
    let text = std::fs::read_to_string("/etc/hosts").ok()?;
    hosts_name(&text, ip)
}

fn hosts_name(text: &str, ip: IpAddr) -> Option<String> {
    text.lines().map(|l| l.split('#').next().unwrap_or("")).find_map(|l| {
        let mut words = l.split_whitespace();
        let addr: IpAddr = words.next()?.parse().ok()?;
        (addr == ip).then(|| words.next().map(str::to_string)).flatten()
    })
}

/// The names to try for `name`, in order (glibc's with ndots:1).
pub fn candidates(dns: &Dns, name: &str) -> Vec<String> {
    if let Some(absolute) = name.strip_suffix('.') {
        return vec![absolute.to_string()];
    }
    let searched = dns.search.iter().map(|d| format!("{name}.{d}"));
    if name.contains('.') {
        std::iter::once(name.to_string()).chain(searched).collect()
    } else {
        searched.chain(std::iter::once(name.to_string())).collect()
    }
}

enum Answer {
    /// The name exists; its addresses of the types asked (maybe none).
    Found(Found),
    NoSuchName,
}

/// Asks each server in turn, for [`ATTEMPTS`] rounds; None when none answered.
fn ask_servers(dns: &Dns, name: &str, types: &[TYPE]) -> Option<Answer> {
    for _ in 0..ATTEMPTS {
        for server in &dns.servers {
            if let Some(a) = ask(SocketAddr::new(*server, 53), name, types) {
                return Some(a);
            }
        }
    }
    None
}

/// One query per type to `server` over one connected UDP socket; the answers merged. None if
/// the server did not answer them all within [`TIMEOUT`], or refused.
fn ask(server: SocketAddr, name: &str, types: &[TYPE]) -> Option<Answer> {
    let socket = query_socket(server)?;
    let mut ids = Vec::with_capacity(types.len());
    for ty in types {
        let id = random_id();
        let mut query = Packet::new_query(id);
        query.set_flags(PacketFlag::RECURSION_DESIRED);
        query.questions.push(Question::new(
            Name::new(name).ok()?,
            QTYPE::TYPE(*ty),
            CLASS::IN.into(),
            false,
        ));
        let bytes = query.build_bytes_vec().ok()?;
        // SAFETY: sending from a live buffer on our own socket.
        let sent = unsafe {
            libc::send(
                socket.0.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if sent != bytes.len() as isize {
            return None;
        }
        ids.push(id);
    }
    let deadline = Instant::now() + TIMEOUT;
    let mut found = Found {
        canonical: name.to_string(),
        addresses: Vec::new(),
        pointers: Vec::new(),
    };
    let mut buf = vec![0u8; 4096];
    while !ids.is_empty() {
        let n = recv_until(socket.0.as_raw_fd(), &mut buf, deadline)?;
        let Ok(reply) = Packet::parse(&buf[..n]) else { continue };
        // Only an answer to a question of ours, about this name.
        let Some(at) = ids.iter().position(|id| *id == reply.id()) else {
            continue;
        };
        if !reply
            .questions
            .iter()
            .any(|q| q.qname.to_string().eq_ignore_ascii_case(name))
        {
            continue;
        }
        ids.swap_remove(at);
        match reply.rcode() {
            RCODE::NoError => {}
            RCODE::NameError => return Some(Answer::NoSuchName),
            // A server failing or refusing: the next one may do better.
            _ => return None,
        }
        for record in &reply.answers {
            match &record.rdata {
                RData::A(a) => found.addresses.push(IpAddr::V4(Ipv4Addr::from(a.address))),
                RData::AAAA(a) => found.addresses.push(IpAddr::V6(Ipv6Addr::from(a.address))),
                RData::CNAME(c) => found.canonical = c.0.to_string(),
                RData::PTR(p) => found.pointers.push(p.0.to_string()),
                _ => {}
            }
        }
    }
    Some(Answer::Found(found))
}

/// A DNS message `query` (a whole query as res_send(3) takes it) sent to each server in turn,
/// for [`ATTEMPTS`] rounds; the first answer with the query's identifier. None when none
/// answered.
pub fn exchange(dns: &Dns, query: &[u8]) -> Option<Vec<u8>> {
    let id = query.get(..2)?;
    for _ in 0..ATTEMPTS {
        for server in &dns.servers {
            let Some(socket) = query_socket(SocketAddr::new(*server, 53)) else {
                continue;
            };
            // SAFETY: sending from a live buffer on our own socket.
            let sent = unsafe {
                libc::send(
                    socket.0.as_raw_fd(),
                    query.as_ptr().cast(),
                    query.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if sent != query.len() as isize {
                continue;
            }
            let deadline = Instant::now() + TIMEOUT;
            let mut buf = vec![0u8; 65_536];
            while let Some(n) = recv_until(socket.0.as_raw_fd(), &mut buf, deadline) {
                if n >= 12 && buf[..2] == *id {
                    buf.truncate(n);
                    return Some(buf);
                }
            }
        }
    }
    None
}

/// A UDP socket connected to `server`, through the program's own connect hook (a server
/// inside the tunnel is reached through the stack, one outside by the kernel).
fn query_socket(server: SocketAddr) -> Option<Query> {
    let family = if server.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: a descriptor socket(2) just returned, owned by nobody else.
    let socket = Query(unsafe { OwnedFd::from_raw_fd(raw) });
    let (storage, len) = crate::addr::to_storage(server, family);
    // SAFETY: `storage` holds a socket address of `len` bytes.
    let r = unsafe {
        crate::hooks::connect(
            socket.0.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    (r == 0).then_some(socket)
}

/// A query's socket: when it closes, the library's table forgets it (a resolver asked
/// thousands of times must not push the program's own sockets out of the table).
struct Query(OwnedFd);

impl Drop for Query {
    fn drop(&mut self) {
        if let Some(inode) = crate::sockets::socket_inode(self.0.as_raw_fd()) {
            crate::sockets::forget(inode);
        }
    }
}

/// One datagram into `buf` before `deadline`; None once it has passed.
fn recv_until(fd: c_int, buf: &mut [u8], deadline: Instant) -> Option<usize> {
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, left.as_millis().clamp(1, i32::MAX as u128) as c_int) };
        if r <= 0 {
            // A signal, or nothing yet: the deadline decides.
            continue;
        }
        // SAFETY: reading into `buf`, at most its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Some(n as usize);
        }
    }
}

/// A query's identifier, unpredictable (an off-path answer must guess it).
fn random_id() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: getrandom writes at most the 2 bytes of `b`.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    u16::from_ne_bytes(b)
}

/// Whether the host's `/etc/hosts` has `name` (then the host's resolver answers it).
pub fn in_hosts_file(name: &str) -> bool {
    let Ok(text) = std::fs::read_to_string("/etc/hosts") else {
        return false;
    };
    hosts_has(&text, name)
}

fn hosts_has(text: &str, name: &str) -> bool {
    let name = name.trim_end_matches('.');
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .any(|l| l.split_whitespace().skip(1).any(|n| n.eq_ignore_ascii_case(name)))
}

/// Where a DNS query to `dest` goes instead (ordo_attach::dns_redirect), with `DNS =`.
pub(crate) fn dns_redirect(s: &crate::Settings, dest: std::net::SocketAddr) -> Option<std::net::SocketAddr> {
    ordo_attach::dns_redirect(&s.routes, &settings()?.servers, dest)
}

/// Whether `name` is one for the tunnel's name servers: not numeric, not asked to be, not in
/// the hosts file.
pub(crate) fn resolved_by_tunnel(name: &str, hints: Option<&libc::addrinfo>) -> bool {
    let numeric_only = hints.is_some_and(|h| h.ai_flags & libc::AI_NUMERICHOST != 0);
    // Addresses in any form the C library parses (IPv6 with a scope, IPv4 with fewer
    // parts) are numbers: its own business.
    let numeric = name.contains(':') || name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    !numeric_only && !numeric && !name.is_empty() && !in_hosts_file(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_asked_for_numbers_stay_the_c_library_s() {
        // SAFETY: addrinfo is plain data; all zeros is "no hints".
        let mut numeric: libc::addrinfo = unsafe { std::mem::zeroed() };
        numeric.ai_flags = libc::AI_NUMERICHOST;
        for n in ["10.0.0.1", "127.1", "fe80::1%eth0", "::1", ""] {
            assert!(!resolved_by_tunnel(n, None), "{n}");
        }
        assert!(!resolved_by_tunnel("web.example", Some(&numeric)));
        assert!(resolved_by_tunnel("web.example", None));
        assert!(resolved_by_tunnel("10.0.0.1.example", None));
    }

    #[test]
    fn names_are_tried_as_glibc_tries_them() {
        let dns = Dns::parse("10.0.0.2, corp.example, lab").unwrap();
        assert_eq!(candidates(&dns, "web"), ["web.corp.example", "web.lab", "web"]);
        assert_eq!(
            candidates(&dns, "web.eu"),
            ["web.eu", "web.eu.corp.example", "web.eu.lab"]
        );
        assert_eq!(candidates(&dns, "web.example."), ["web.example"]);
    }

    #[test]
    fn reverse_names_are_the_arpa_forms() {
        assert_eq!(arpa_name("10.99.0.2".parse().unwrap()), "2.0.99.10.in-addr.arpa");
        assert_eq!(
            arpa_name("2001:db8::567:89ab".parse().unwrap()),
            "b.a.9.8.7.6.5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa"
        );
        let hosts = "127.0.0.1 localhost\n10.99.0.2 web web.lab # the web\n# 10.99.0.3 gone\n";
        assert_eq!(hosts_name(hosts, "10.99.0.2".parse().unwrap()), Some("web".into()));
        assert_eq!(hosts_name(hosts, "10.99.0.3".parse().unwrap()), None);
    }

    #[test]
    fn the_hosts_file_is_read_as_the_c_library_reads_it() {
        let text = "127.0.0.1 localhost\n# 10.0.0.9 hidden\n::1 ip6-localhost ip6-loopback # comment\n";
        assert!(hosts_has(text, "localhost"));
        assert!(hosts_has(text, "IP6-LOOPBACK"));
        assert!(!hosts_has(text, "hidden"));
        assert!(!hosts_has(text, "127.0.0.1"));
    }
}
