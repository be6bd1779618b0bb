//! `ordo loadgen flood`: what an attacker without a key sends a WireGuard server, at a stated
//! rate, to measure what it costs the server and its established peers.
//!
//! - `junk`: datagrams of an initiation's length and type with random contents and a mac1
//!   made for another key: the least a server can spend on a datagram it reads. Its rate is
//!   the baseline the other kinds are measured against: the packets and the generator's own
//!   work per packet (a mac1 and a mac2, made or not sent) are the same, only the key differs.
//! - `initiation`: initiations with a valid mac1 for the server's public key (anyone who knows
//!   the key can make them) and random contents: without the cookie mechanism each would
//!   cost the server a Diffie-Hellman before it fails to decrypt.
//!
//! - `random`: datagrams of every message type and of none, of random lengths: each type's
//!   length, one byte short or over, empty, up to an MTU and past it (the kernel fragments
//!   and reassembles those, up to 9,000 bytes), reserved bytes set at times.
//! - `replay`: data messages of a real session, replayed: the generator first completes a
//!   handshake as a load-generator client (`--as-client I` of `ordo loadgen setup`'s keys),
//!   sends a few hundred data messages once, then floods with copies of them. Each carries a
//!   valid receiver index and tag and a counter the server has seen.
//!
//! With `--answer-cookies` the generator opens the cookie replies it gets (as a real client
//! does) and stamps every later initiation from that socket with mac2, proving a round trip
//! from its address: what is left is the server's per-source rate limit.
//!
//! Source addresses come from `--bind` (one socket each, any port); on a namespace of one's
//! own, add them to the interface first. Every datagram goes to `--server`; the report says
//! how many were sent (a full socket buffer refuses some), the cookie replies received and
//! opened, and the generator's CPU time.

use super::stats::cpu_seconds;
use anyhow::{bail, Context, Result};
use ordo_proto::cookie::CookieJar;
use ordo_proto::messages::{self, CookieReply, COOKIE_REPLY_LEN, INITIATION_LEN, TYPE_INITIATION};
use ordo_proto::{Interface, Sent};
use ordo_proto::{PrivateKey, PublicKey};
use ordo_udp::{send_batch, Receiver};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::Serialize;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant, SystemTime};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FloodKind {
    Junk,
    Initiation,
    Random,
    Replay,
}

#[derive(clap::Args, Debug)]
pub struct FloodArgs {
    /// The server's outer address.
    #[arg(long)]
    pub server: SocketAddr,
    /// The server's public key (base64); without it, the key `ordo loadgen setup --seed`
    /// gave the server.
    #[arg(long)]
    pub server_key: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_enum)]
    pub kind: FloodKind,
    /// Datagrams per second, all sources together.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub rate: u32,
    /// Seconds of flood.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Source addresses, one socket each, used in turn.
    #[arg(long, value_delimiter = ',', default_value = "0.0.0.0")]
    pub bind: Vec<IpAddr>,
    /// Open cookie replies and stamp later initiations with mac2 (with `--kind initiation`).
    #[arg(long)]
    pub answer_cookies: bool,
    /// With `--kind replay`: whose session to replay (a client of `ordo loadgen setup
    /// --seed S`, which the server must have).
    #[arg(long, default_value_t = 0)]
    pub as_client: u32,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug, Default, PartialEq)]
pub struct FloodReport {
    pub kind: Option<FloodKind>,
    pub sources: usize,
    pub seconds: f64,
    /// The rate asked for and the rate sent, datagrams per second.
    pub rate: u32,
    pub sent_per_second: f64,
    pub sent: u64,
    /// Datagrams the kernel refused (a full socket buffer): not sent.
    pub refused: u64,
    pub cookie_replies: u64,
    /// Cookie replies that opened (with --answer-cookies).
    pub cookies_opened: u64,
    /// Initiations sent with a mac2.
    pub sent_with_mac2: u64,
    /// With `--kind replay`: the data messages captured (each sent once before the flood)
    /// and their bytes, which with the initiation's are all the server should accept.
    pub captured: usize,
    pub captured_bytes: usize,
    /// The generator's CPU time over the flood, in cores.
    pub cores: f64,
}

/// The mac1s of this many recent initiations per socket are kept, by sender index, to open
/// the cookie replies to them.
const MAC1_RING: usize = 4096;
/// Datagrams per system call at most (sendmmsg).
const BATCH: usize = 64;
/// A flood that falls behind does not catch up with more than this much at once.
const MAX_BEHIND: Duration = Duration::from_millis(20);
/// Data messages captured for `--kind replay`.
const CAPTURED: usize = 256;
/// How long the replay flood's handshake may take.
const CAPTURE_HANDSHAKE: Duration = Duration::from_secs(10);

/// How often the sockets are read for cookie replies.
const REPLIES_EVERY: Duration = Duration::from_millis(10);

/// One source: a socket, and what it needs to answer cookies.
struct Source {
    sock: UdpSocket,
    /// Stamps mac1 (and mac2 once a cookie came): for the server's key, or for junk another.
    jar: CookieJar,
    /// (sender index, mac1) of recent initiations, at sender % MAC1_RING.
    mac1s: Vec<(u32, [u8; 16])>,
    /// The next sender index (initiations) or replay (replays).
    next_sender: u32,
    /// With `--kind replay`: the captured data messages.
    replays: std::sync::Arc<Vec<Vec<u8>>>,
}

fn check(a: &FloodArgs) -> Result<()> {
    if !(a.duration > 0.0 && a.duration <= 86_400.0) {
        bail!("--duration must be more than 0 and at most 86400 seconds");
    }
    if a.answer_cookies && a.kind != FloodKind::Initiation {
        bail!("--answer-cookies needs --kind initiation (junk gets no cookie reply)");
    }
    if let Some(b) = a
        .bind
        .iter()
        .find(|b| !b.is_unspecified() && b.is_ipv4() != a.server.is_ipv4())
    {
        bail!("--bind {b}: not of the address family of --server {}", a.server);
    }
    Ok(())
}

fn server_key(a: &FloodArgs) -> Result<PublicKey> {
    match &a.server_key {
        Some(k) => PublicKey::from_base64(k).map_err(|e| anyhow::anyhow!("--server-key: {e}")),
        None => Ok(super::keys(a.seed, 0).0.public_key()),
    }
}

impl Source {
    fn new(sock: UdpSocket, kind: FloodKind, server: &PublicKey) -> Source {
        let key = match kind {
            FloodKind::Initiation | FloodKind::Random | FloodKind::Replay => *server,
            // Any other key: a mac1 as costly to make, and wrong.
            FloodKind::Junk => PrivateKey::from_bytes([0x5a; 32]).public_key(),
        };
        Source {
            sock,
            jar: CookieJar::new(&key),
            mac1s: vec![(u32::MAX, [0; 16]); MAC1_RING],
            next_sender: 0,
            replays: Default::default(),
        }
    }
}

fn open_sources(a: &FloodArgs, server: &PublicKey) -> Result<Vec<Source>> {
    a.bind
        .iter()
        .map(|&ip| {
            let ip = match ip {
                ip if ip.is_unspecified() && a.server.is_ipv6() => IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
                ip => ip,
            };
            let sock = UdpSocket::bind(SocketAddr::new(ip, 0)).with_context(|| format!("cannot bind {ip}"))?;
            // A full buffer refuses (and is counted) instead of holding the pace back.
            sock.set_nonblocking(true)?;
            Ok(Source::new(sock, a.kind, server))
        })
        .collect()
}

/// Writes one datagram of the flood into `out` (resized to its length); true if it is an
/// initiation that carries a mac2.
fn make(kind: FloodKind, s: &mut Source, rng: &mut ChaCha20Rng, now: Instant, out: &mut Vec<u8>) -> bool {
    match kind {
        FloodKind::Junk | FloodKind::Initiation => {
            out.resize(INITIATION_LEN, 0);
            rng.fill_bytes(out);
            out[..4].copy_from_slice(&[TYPE_INITIATION, 0, 0, 0]);
            let sender = s.next_sender;
            s.next_sender = s.next_sender.wrapping_add(1);
            out[4..8].copy_from_slice(&sender.to_le_bytes());
            let mac1 = s.jar.stamp(out, now);
            s.mac1s[sender as usize % MAC1_RING] = (sender, mac1);
            let with_mac2 = kind == FloodKind::Initiation && ordo_proto::cookie::carries_mac2(out);
            if !with_mac2 {
                // The MAC a mac2 would have cost, thrown away: every kind costs the generator
                // a mac1 and a mac2, so the junk baseline carries its whole cost.
                let at = messages::mac2_offset(INITIATION_LEN);
                std::hint::black_box(ordo_proto::crypto::mac(&mac1, &[&out[..at]]));
            }
            with_mac2
        }
        FloodKind::Random => {
            random_datagram(rng, out);
            false
        }
        FloodKind::Replay => {
            let i = s.next_sender as usize;
            s.next_sender = s.next_sender.wrapping_add(1);
            out.clear();
            out.extend_from_slice(&s.replays[i % s.replays.len().max(1)]);
            false
        }
    }
}

/// A datagram of a random type (one of the four, or none) and a random length chosen to
/// reach every length check: the type's own, one short, one over, empty, small, up to an
/// MTU, past it.
fn random_datagram(rng: &mut ChaCha20Rng, out: &mut Vec<u8>) {
    use ordo_proto::messages::{DATA_MIN_LEN, RESPONSE_LEN};
    let r = rng.next_u32();
    let kind = (r % 6) as u8; // 0 and 5: no type of ours
    let exact = match kind {
        1 => INITIATION_LEN,
        2 => RESPONSE_LEN,
        3 => COOKIE_REPLY_LEN,
        _ => DATA_MIN_LEN + 16 * ((r >> 8) as usize % 90),
    };
    let len = match (r >> 16) % 8 {
        0..=2 => exact,
        3 => exact - 1,
        4 => exact + 1,
        5 => (r >> 20) as usize % 8,
        6 => (r >> 19) as usize % 1500,
        _ => 1500 + (r >> 19) as usize % 7500,
    };
    out.resize(len, 0);
    rng.fill_bytes(out);
    if let Some(b) = out.first_mut() {
        *b = kind;
    }
    // Mostly zero reserved bytes, as a real message's; at times not.
    if out.len() >= 4 && (r >> 28) != 0 {
        out[1..4].fill(0);
    }
}

/// Completes a handshake as load-generator client `--as-client` over `sock`, seals
/// [`CAPTURED`] data messages and sends each once, so that the server has seen their
/// counters, and returns them: what an eavesdropper on the path would have captured.
fn capture(a: &FloodArgs, server: &PublicKey, sock: &UdpSocket) -> Result<Vec<Vec<u8>>> {
    let client = a.as_client as usize;
    let (_, keys) = super::keys(a.seed, client + 1);
    let key = keys.into_iter().next_back().expect("client + 1 keys");
    let mut core = Interface::with_rng(Instant::now(), ChaCha20Rng::from_entropy());
    core.set_private_key(Some(key));
    let peer = core
        .add_peer(*server)
        .context("--as-client: that client's key is the server's")?;
    core.set_endpoint(peer, a.server);
    let target = *super::TARGET.ip();
    core.add_allowed_ip(peer, ipnet::IpNet::from(IpAddr::from(target)));
    // To the discard port: the server delivers each once, and nothing answers.
    let flow = super::wire::Flow {
        src: super::client_ip(client),
        sport: super::CLIENT_PORT,
        dst: target,
        dport: 9,
    };
    let mut header = super::wire::Header {
        kind: super::wire::Kind::Data,
        client: a.as_client,
        seq: 0,
        sent_ns: 0,
        rate: 0,
        size: 0,
    };
    let len = super::wire::MIN_PACKET;
    let mut packet = vec![0u8; len];
    let mut out = vec![0u8; len + 64];
    let mut buf = vec![0u8; 2048];
    let deadline = Instant::now() + CAPTURE_HANDSHAKE;
    super::wire::build(&mut packet, len, flow, &header);
    core.send(Instant::now(), SystemTime::now(), &packet, &mut out);
    let mut captured = Vec::with_capacity(CAPTURED + 1);
    loop {
        while let Some(t) = core.poll_transmit() {
            let _ = sock.send_to(&t.payload, t.to);
            // The packet that waited for the handshake goes out here: captured too.
            if messages::classify(&t.payload) == Some(messages::Kind::Data) {
                captured.push(t.payload);
            }
        }
        if core.peer(peer).is_some_and(|p| p.has_session(Instant::now())) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "--kind replay: no handshake with {} as client {client} within {:?} (is the server \
                 configured from `ordo loadgen setup --seed {}` with more than {client} clients?)",
                a.server,
                CAPTURE_HANDSHAKE,
                a.seed
            );
        }
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                core.receive(Instant::now(), SystemTime::now(), from, &mut buf[..n]);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
        core.tick(Instant::now(), SystemTime::now());
    }
    for seq in 1..=CAPTURED as u64 {
        header.seq = seq;
        super::wire::build(&mut packet, len, flow, &header);
        if let Sent::Data { len, to, .. } = core.send(Instant::now(), SystemTime::now(), &packet, &mut out) {
            let _ = sock.send_to(&out[..len], to);
            captured.push(out[..len].to_vec());
        }
    }
    if captured.is_empty() {
        bail!("--kind replay: the session sealed no data message");
    }
    Ok(captured)
}

/// Reads what came back to a source; opens cookie replies when `answer`.
fn collect_replies(s: &mut Source, rx: &mut Receiver, answer: bool, report: &mut FloodReport) {
    let mut got = Vec::new();
    while rx.recv_ready(&s.sock, &mut got).is_ok() && !got.is_empty() {
        for d in got.drain(..) {
            let Ok(bytes) = <&[u8; COOKIE_REPLY_LEN]>::try_from(&d.data[..]) else {
                continue;
            };
            if messages::classify(bytes) != Some(messages::Kind::CookieReply) {
                continue;
            }
            report.cookie_replies += 1;
            if !answer {
                continue;
            }
            let reply = CookieReply::parse(bytes);
            let (sender, mac1) = s.mac1s[reply.receiver as usize % MAC1_RING];
            if sender == reply.receiver && s.jar.consume_reply_to(&reply, &mac1, Instant::now()) {
                report.cookies_opened += 1;
            }
        }
    }
}

pub fn run(a: &FloodArgs) -> Result<FloodReport> {
    check(a)?;
    let key = server_key(a)?;
    let mut sources = open_sources(a, &key)?;
    let mut rng = ChaCha20Rng::from_entropy();
    let mut rx = Receiver::new(1500);
    let gso = ordo_udp::Gso::new(false);
    let mut report = FloodReport {
        kind: Some(a.kind),
        sources: sources.len(),
        rate: a.rate,
        ..Default::default()
    };
    if a.kind == FloodKind::Replay {
        let replays = std::sync::Arc::new(capture(a, &key, &sources[0].sock)?);
        report.captured = replays.len();
        report.captured_bytes = replays.iter().map(Vec::len).sum();
        for s in &mut sources {
            s.replays = replays.clone();
        }
    }
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(INITIATION_LEN)).collect();
    let (start, cpu0) = (Instant::now(), cpu_seconds());
    let end = start + Duration::from_secs_f64(a.duration);
    let mut turn = 0usize;
    let (mut due_base, mut base_at) = (0u64, start);
    let mut replies_read = start;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now.duration_since(replies_read) >= REPLIES_EVERY {
            replies_read = now;
            for s in sources.iter_mut() {
                collect_replies(s, &mut rx, a.answer_cookies, &mut report);
            }
        }
        // What the rate asks for by now, never more than MAX_BEHIND of it at once.
        let mut due = due_base + (now.duration_since(base_at).as_secs_f64() * a.rate as f64) as u64;
        let backlog = (MAX_BEHIND.as_secs_f64() * a.rate as f64).max(1.0) as u64;
        let offered = report.sent + report.refused;
        if due > offered + backlog {
            (due_base, base_at) = (offered + backlog, now);
            due = due_base;
        }
        let mut left = due.saturating_sub(offered) as usize;
        if left == 0 {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        while left > 0 {
            let at = turn % sources.len();
            let s = &mut sources[at];
            turn += 1;
            let n = left.min(BATCH);
            for b in &mut bufs[..n] {
                if make(a.kind, s, &mut rng, now, b) {
                    report.sent_with_mac2 += 1;
                }
            }
            let payloads: Vec<&[u8]> = bufs[..n].iter().map(|b| &b[..]).collect();
            let sent = send_batch(&s.sock, a.server, &payloads, &gso).unwrap_or(0);
            report.sent += sent as u64;
            report.refused += (n - sent) as u64;
            left -= n;
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.cores = (cpu_seconds() - cpu0) / report.seconds;
    report.sent_per_second = report.sent as f64 / report.seconds;
    // Replies still on their way.
    std::thread::sleep(Duration::from_millis(100));
    for s in sources.iter_mut() {
        collect_replies(s, &mut rx, a.answer_cookies, &mut report);
    }
    Ok(report)
}

pub fn render(r: &FloodReport) -> String {
    format!(
        "flood {:?} from {} sources: {:.0}/s for {:.1} s ({} sent, {} refused by the socket), \
         {} cookie replies ({} opened, {} initiations with mac2), generator {:.2} cores\n",
        r.kind.unwrap_or(FloodKind::Junk),
        r.sources,
        r.sent_per_second,
        r.seconds,
        r.sent,
        r.refused,
        r.cookie_replies,
        r.cookies_opened,
        r.sent_with_mac2,
        r.cores
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::cookie::CookieChecker;

    fn source(kind: FloodKind, server: &PublicKey) -> Source {
        Source::new(UdpSocket::bind("127.0.0.1:0").unwrap(), kind, server)
    }

    #[test]
    fn initiations_pass_mac1_and_junk_does_not() {
        let server = PrivateKey::generate(&mut ChaCha20Rng::seed_from_u64(7)).public_key();
        let checker = CookieChecker::new(&server);
        let (mut rng, now) = (ChaCha20Rng::seed_from_u64(1), Instant::now());
        let mut initiations = source(FloodKind::Initiation, &server);
        let mut junk = source(FloodKind::Junk, &server);
        let mut b = Vec::new();
        for _ in 0..100 {
            make(FloodKind::Initiation, &mut initiations, &mut rng, now, &mut b);
            assert_eq!(messages::classify(&b), Some(messages::Kind::Initiation));
            assert!(checker.mac1_valid(&b));
            make(FloodKind::Junk, &mut junk, &mut rng, now, &mut b);
            assert_eq!(messages::classify(&b), Some(messages::Kind::Initiation));
            assert!(!checker.mac1_valid(&b));
        }
    }

    /// Random datagrams reach every classification: each message type at its length, one
    /// short and one over (malformed), empty, small, and past an MTU.
    #[test]
    fn random_datagrams_reach_every_length_check() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let mut b = Vec::new();
        let (mut kinds, mut malformed, mut lens) = (std::collections::BTreeSet::new(), 0, Vec::new());
        for _ in 0..10_000 {
            random_datagram(&mut rng, &mut b);
            match messages::classify(&b) {
                Some(k) => {
                    kinds.insert(format!("{k:?}"));
                }
                None => malformed += 1,
            }
            lens.push(b.len());
        }
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        assert!(malformed > 3000, "{malformed}");
        assert!(lens.contains(&0) && lens.iter().any(|&l| l > 1500) && lens.iter().all(|&l| l <= 9000));
    }

    /// A cookie reply to an initiation sent a thousand messages earlier still opens, and
    /// every initiation after it carries a mac2 the server accepts from that source.
    #[test]
    fn a_reply_to_an_earlier_initiation_opens_and_mac2_follows() {
        let server = PrivateKey::generate(&mut ChaCha20Rng::seed_from_u64(7)).public_key();
        let mut checker = CookieChecker::new(&server);
        let (mut rng, now) = (ChaCha20Rng::seed_from_u64(1), Instant::now());
        let mut s = source(FloodKind::Initiation, &server);
        let src: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let mut first = Vec::new();
        make(FloodKind::Initiation, &mut s, &mut rng, now, &mut first);
        let mut b = Vec::new();
        for _ in 0..1000 {
            assert!(
                !make(FloodKind::Initiation, &mut s, &mut rng, now, &mut b),
                "no cookie yet"
            );
        }
        let reply = checker.reply(&first, &src, now, &mut rng);
        let (sender, mac1) = s.mac1s[reply.receiver as usize % MAC1_RING];
        assert_eq!(sender, 0);
        assert!(s.jar.consume_reply_to(&reply, &mac1, now));
        assert!(make(FloodKind::Initiation, &mut s, &mut rng, now, &mut b));
        assert!(checker.mac2_valid(&b, &src, now, &mut rng));
    }
}
