//! A gateway's health judged from its data path, and the fleet's address announced only while
//! it is healthy: `ordo fleet NAME watch IFNAME`, a process beside the daemon (so that it
//! still acts when the daemon hangs).
//!
//! The watch is a WireGuard peer of the gateway it watches, with a key of its own made at
//! start and registered over the UAPI socket (a peer of this gateway only, never in etcd;
//! registered again, with the same key, when the gateway stops answering, in case it
//! restarted; removed when the watch ends).
//! Ten times a second it pings the gateway's own inner address through the tunnel: the echo
//! crosses the whole data path twice (outer socket, decryption, the inner device, the host's
//! stack, encryption, the outer socket), so a hung daemon, stuck threads or a broken inner
//! device all stop the replies, while a process that is merely alive does not make them. After
//! `misses` probes in a row without a reply the fleet's address is withdrawn (its route goes
//! from the fleet's table, so the gateway's BGP daemon stops announcing it, and the router's
//! ECMP sends the clients elsewhere); after as many answered in a row it is announced again.
//! Whole-machine failures are BFD's to notice.
//!
//! For a gateway that shares sessions (`FleetGateway =`, which its report names) the watch
//! also keeps the gateway's health record in etcd ([`super::gateways`]): put while the
//! gateway is announced, on a short lease of the watch's own, and deleted before the routes
//! are withdrawn, so that the other gateways take the gateway's clients over instead of
//! passing it their datagrams. On withdrawal it also removes the gateway's return routes
//! (`--return-table`): a frozen daemon cannot remove them itself, and the LAN's traffic for
//! its clients must go to whichever gateway takes them.

use super::gateways::{self, HealthRecord};
use super::store::{Dial, Lease};
use super::FleetSettings;
use crate::netconf::Netlink;
use crate::uapi::client;
use anyhow::{bail, Context, Result};
use etcd_client::{Client, PutOptions};
use ipnet::{IpNet, Ipv4Net};
use ordo_proto::fleet::GatewayId;
use ordo_proto::{Interface, PrivateKey, PublicKey, Received, Sent, SEND_HEADROOM};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Packet, Ipv4Repr};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What to watch and what to announce.
#[derive(Clone, Debug)]
pub struct WatchSettings {
    pub ifname: String,
    /// The fleet's addresses, announced while the gateway is healthy.
    pub announce: Vec<IpNet>,
    /// The table their routes go in (the one the gateway's BGP daemon imports).
    pub table: u32,
    /// The table of the gateway's return routes (`FleetRouteTable`), emptied on withdrawal.
    pub return_table: u32,
    /// Where the probe speaks from inside the tunnel (within the interface's prefix, so the
    /// gateway's replies go back into the tunnel), and the gateway's inner address it pings.
    pub probe_from: Ipv4Addr,
    pub probe_to: Ipv4Addr,
    pub interval: Duration,
    /// Probes in a row, answered or not, that change the verdict.
    pub misses: u32,
    /// The fleet and its etcd, for the health record.
    pub fleet: FleetSettings,
}

/// The gateway's health as the probes have it, with hysteresis: `misses` in a row change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub healthy: bool,
    streak: u32,
}

impl Verdict {
    pub fn new() -> Verdict {
        Verdict {
            healthy: false,
            streak: 0,
        }
    }

    /// Takes one probe's outcome; true if the verdict changed.
    pub fn record(&mut self, answered: bool, misses: u32) -> bool {
        if answered == self.healthy {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        if self.streak >= misses {
            self.healthy = answered;
            self.streak = 0;
            return true;
        }
        false
    }
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict::new()
    }
}

/// The probe: a WireGuard peer of the gateway on a loopback socket.
struct Probe {
    /// The gateway's id in the fleet, if it shares sessions (its report says).
    gateway: Option<GatewayId>,
    core: Interface,
    sock: UdpSocket,
    from: Ipv4Addr,
    to: Ipv4Addr,
    ident: u16,
    seq: u16,
    out: Vec<u8>,
    buf: Vec<u8>,
}

impl Probe {
    /// `key` registered as a peer of `ifname` allowed `from`; the gateway reached on the
    /// loopback address at its listen port.
    fn register(s: &WatchSettings, key: &PrivateKey) -> Result<Probe> {
        let report = crate::show::fetch(&s.ifname)?;
        let fleet_gateway = (report.parts.iter())
            .filter(|p| p.part == "fleet")
            .flat_map(|p| p.figures.iter())
            .find(|f| f.name == "gateway")
            .and_then(|f| u8::try_from(f.value).ok())
            .filter(|id| *id != 0)
            .map(GatewayId);
        let gateway_key = PublicKey::from_base64(report.public_key.as_deref().context("the gateway has no key yet")?)
            .map_err(|_| anyhow::anyhow!("the gateway's public key"))?;
        let body = format!(
            "set=1\npublic_key={}\nreplace_allowed_ips=true\nallowed_ip={}/32\n\n",
            key.public_key().to_hex(),
            s.probe_from
        );
        client::request(&s.ifname, &body).context("registering the probe as a peer")?;
        let now = Instant::now();
        let mut core = Interface::new(now);
        core.set_private_key(Some(key.clone()));
        let gateway = core.add_peer(gateway_key).context("the probe has the gateway's key")?;
        let at = SocketAddr::from((Ipv4Addr::LOCALHOST, report.listen_port));
        core.set_endpoint(gateway, at);
        core.add_allowed_ip(gateway, IpNet::V4(Ipv4Net::from(s.probe_to)));
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        sock.set_read_timeout(Some(Duration::from_millis(5)))?;
        Ok(Probe {
            gateway: fleet_gateway,
            core,
            sock,
            from: s.probe_from,
            to: s.probe_to,
            ident: (std::process::id() & 0xffff) as u16,
            seq: 0,
            out: vec![0; 2048 + SEND_HEADROOM],
            buf: vec![0; 65536],
        })
    }

    /// Sends the next echo request (the first starts a handshake; the core sends it then).
    fn send(&mut self) -> u16 {
        self.seq = self.seq.wrapping_add(1);
        let packet = echo_request(self.from, self.to, self.ident, self.seq);
        let (now, wall) = (Instant::now(), SystemTime::now());
        if let Sent::Data { len, to, .. } = self.core.send(now, wall, &packet, &mut self.out) {
            let _ = self.sock.send_to(&self.out[..len], to);
        }
        self.flush();
        self.seq
    }

    fn flush(&mut self) {
        while let Some(t) = self.core.poll_transmit() {
            let _ = self.sock.send_to(&t.payload, t.to);
        }
    }

    /// Reads until `until`; true once the reply to `seq` arrived.
    fn answered(&mut self, seq: u16, until: Instant) -> bool {
        let mut got = false;
        while Instant::now() < until {
            self.core.tick(Instant::now(), SystemTime::now());
            self.flush();
            let Ok((n, from)) = self.sock.recv_from(&mut self.buf) else {
                continue;
            };
            let (now, wall) = (Instant::now(), SystemTime::now());
            if let Received::Packet { range, .. } = self.core.receive(now, wall, from, &mut self.buf[..n]) {
                got |= is_reply(&self.buf[range], self.ident, seq);
            }
            self.flush();
        }
        got
    }
}

/// An ICMP echo request from `from` to `to`.
fn echo_request(from: Ipv4Addr, to: Ipv4Addr, ident: u16, seq_no: u16) -> Vec<u8> {
    let data = b"ordo fleet watch";
    let icmp = Icmpv4Repr::EchoRequest { ident, seq_no, data };
    let ip = Ipv4Repr {
        src_addr: from,
        dst_addr: to,
        next_header: IpProtocol::Icmp,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    let mut packet = vec![0u8; ip.buffer_len() + icmp.buffer_len()];
    let checksums = ChecksumCapabilities::default();
    let mut v4 = Ipv4Packet::new_unchecked(&mut packet[..]);
    ip.emit(&mut v4, &checksums);
    icmp.emit(&mut Icmpv4Packet::new_unchecked(v4.payload_mut()), &checksums);
    packet
}

/// Whether `packet` is the echo reply to `ident`/`seq`.
fn is_reply(packet: &[u8], ident: u16, seq: u16) -> bool {
    let Ok(v4) = Ipv4Packet::new_checked(packet) else {
        return false;
    };
    let Ok(icmp) = Icmpv4Packet::new_checked(v4.payload()) else {
        return false;
    };
    matches!(
        Icmpv4Repr::parse(&icmp, &ChecksumCapabilities::default()),
        Ok(Icmpv4Repr::EchoReply { ident: i, seq_no, .. }) if i == ident && seq_no == seq
    )
}

/// Announces or withdraws the fleet's addresses: routes through the loopback interface in
/// the fleet's table.
struct Announcer {
    netlink: Netlink,
    lo: u32,
    table: u32,
    prefixes: Vec<IpNet>,
}

impl Announcer {
    fn set(&self, announce: bool) -> Result<()> {
        for net in &self.prefixes {
            if announce {
                self.netlink.add_route(self.lo, *net, self.table)?;
            } else {
                self.netlink.delete_route(self.lo, *net, self.table)?;
            }
        }
        Ok(())
    }
}

/// The health record's lease: short, so that a watch that dies takes its gateway's health
/// with it within seconds (etcd grants no less than about 1.5 s with its default timings).
const HEALTH_TTL: Duration = Duration::from_secs(2);
/// Longest a write of the health record may hold up the probes.
const HEALTH_WRITE_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a healthy gateway's record is tried again while etcd does not answer: each try
/// may hold the probes up for HEALTH_WRITE_TIMEOUT.
const HEALTH_RETRY: Duration = Duration::from_secs(2);

/// The gateway's health record and its return routes, kept from the watch's own runtime
/// (one thread of its own drives the etcd connection between writes).
struct Standing {
    runtime: tokio::runtime::Runtime,
    dial: Dial,
    prefix: String,
    /// While etcd answers: the client and the lease the record is on.
    link: Option<(Client, Lease)>,
    renewed: Instant,
}

impl Standing {
    fn new(s: &WatchSettings) -> Result<Standing> {
        Ok(Standing {
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?,
            dial: Dial::prepare(&s.fleet)?,
            prefix: s.fleet.prefix().context("no fleet name")?,
            link: None,
            renewed: Instant::now(),
        })
    }

    /// Puts (healthy) or deletes gateway `id`'s health record.
    fn set(&mut self, id: GatewayId, healthy: bool) -> Result<()> {
        let key = gateways::health_key(&self.prefix, id);
        let (dial, link) = (&self.dial, &mut self.link);
        let result = self.runtime.block_on(async {
            tokio::time::timeout(HEALTH_WRITE_TIMEOUT, async {
                if link.is_none() {
                    let mut client = dial.connect().await?;
                    let lease = Lease::grant(&mut client, HEALTH_TTL).await?;
                    *link = Some((client, lease));
                }
                let (client, lease) = link.as_mut().expect("connected");
                if healthy {
                    let value = serde_json::to_vec(&HealthRecord::default())?;
                    client
                        .put(key, value, Some(PutOptions::new().with_lease(lease.id)))
                        .await?;
                } else {
                    client.delete(key, None).await?;
                }
                anyhow::Ok(())
            })
            .await
            .context("etcd did not answer in time")?
        });
        if result.is_err() {
            self.link = None;
        }
        self.renewed = Instant::now();
        result
    }

    /// Keeps a healthy gateway's record alive: renews its lease when due, and puts it again
    /// after etcd was lost.
    fn keep(&mut self, id: GatewayId) {
        let due = match &self.link {
            None => self.renewed.elapsed() >= HEALTH_RETRY,
            Some((_, lease)) => self.renewed.elapsed() >= lease.renew_every(),
        };
        if !due {
            return;
        }
        let renewed = match self.link.as_mut() {
            Some((_, lease)) => (self.runtime)
                .block_on(async { tokio::time::timeout(HEALTH_WRITE_TIMEOUT, lease.renew()).await })
                .map_err(anyhow::Error::from)
                .and_then(|r| r),
            None => Err(anyhow::anyhow!("not connected")),
        };
        self.renewed = Instant::now();
        if renewed.is_err() {
            self.link = None;
            if let Err(e) = self.set(id, true) {
                log::debug!("fleet watch: the health record: {e:#}");
            }
        }
    }
}

/// Watches until `stop` is set, then withdraws.
pub fn run(s: &WatchSettings, stop: Arc<AtomicBool>) -> Result<()> {
    if s.announce.is_empty() {
        bail!("nothing to announce");
    }
    let netlink = Netlink::open()?;
    let lo = netlink.link_index("lo")?;
    let announcer = Announcer {
        netlink,
        lo,
        table: s.table,
        prefixes: s.announce.clone(),
    };
    // Withdrawn until the probes say otherwise: a watch that starts beside a broken gateway
    // must not announce it.
    announcer.set(false)?;
    let mut standing = Standing::new(s)?;
    // The gateway whose health record this watch keeps, once its report names one.
    let mut gateway: Option<GatewayId> = None;
    let key = PrivateKey::generate(&mut rand_core::OsRng);
    let mut verdict = Verdict::new();
    let mut probe: Option<Probe> = None;
    let mut unanswered = 0u32;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if probe.is_none() {
            match Probe::register(s, &key) {
                Ok(p) => probe = Some(p),
                Err(e) => log::debug!("fleet watch: {e:#}"),
            }
        }
        next += s.interval;
        let answered = match probe.as_mut() {
            Some(p) => {
                let seq = p.send();
                p.answered(seq, next)
            }
            None => {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                false
            }
        };
        unanswered = if answered { 0 } else { unanswered + 1 };
        // A second without answers: the gateway may have restarted (a new key, a new port):
        // register again.
        let per_second = (1_000 / s.interval.as_millis().max(1) as u32).max(1);
        if unanswered > 0 && unanswered.is_multiple_of(per_second) {
            probe = None;
        }
        if verdict.record(answered, s.misses) {
            let addresses: Vec<String> = s.announce.iter().map(ToString::to_string).collect();
            if verdict.healthy {
                log::info!(
                    "fleet watch: {} answers through its tunnel: announcing {}",
                    s.ifname,
                    addresses.join(", ")
                );
            } else {
                log::warn!(
                    "fleet watch: {} left {} probes in a row unanswered: withdrawing {}",
                    s.ifname,
                    s.misses,
                    addresses.join(", ")
                );
            }
            if let Some(id) = gateway {
                // Down in etcd before the routes go: the others must not pass datagrams here
                // once the router stops sending clients here.
                if let Err(e) = standing.set(id, verdict.healthy) {
                    log::warn!("fleet watch: gateway {}'s health record: {e:#}", id.0);
                }
            }
            if !verdict.healthy {
                if let Err(e) = super::routes::remove_all(&s.ifname, s.return_table) {
                    log::warn!("fleet watch: removing {}'s return routes: {e:#}", s.ifname);
                }
            }
            if let Err(e) = announcer.set(verdict.healthy) {
                log::warn!("fleet watch: {e:#}");
            }
        }
        if let Some(p) = &probe {
            gateway = gateway.or(p.gateway);
        }
        if let (true, Some(id)) = (verdict.healthy, gateway) {
            standing.keep(id);
        }
        if Instant::now() > next + s.interval {
            next = Instant::now();
        }
    }
    if let Some(id) = gateway {
        if let Err(e) = standing.set(id, false) {
            log::warn!("fleet watch: gateway {}'s health record: {e:#}", id.0);
        }
    }
    announcer.set(false)?;
    let remove = format!("set=1\npublic_key={}\nremove=true\n\n", key.public_key().to_hex());
    if let Err(e) = client::request(&s.ifname, &remove) {
        log::debug!("fleet watch: removing the probe's peer: {e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_changes_only_after_a_run_of_the_other_outcome() {
        let mut v = Verdict::new();
        assert!(!v.record(true, 3) && !v.record(true, 3));
        assert!(v.record(true, 3) && v.healthy, "three answered: healthy");
        assert!(!v.record(false, 3) && !v.record(false, 3));
        assert!(!v.record(true, 3), "an answer between misses starts the count again");
        assert!(!v.record(false, 3) && !v.record(false, 3) && v.healthy);
        assert!(v.record(false, 3) && !v.healthy, "three missed in a row: unhealthy");
    }

    #[test]
    fn an_echo_request_is_well_formed_and_its_reply_is_recognised() {
        let from = Ipv4Addr::new(10, 99, 0, 254);
        let to = Ipv4Addr::new(10, 99, 0, 1);
        let req = echo_request(from, to, 7, 9);
        let v4 = Ipv4Packet::new_checked(&req[..]).unwrap();
        assert!(v4.verify_checksum());
        assert_eq!((v4.src_addr(), v4.dst_addr()), (from, to));
        assert!(!is_reply(&req, 7, 9), "a request is no reply");
        // The reply as the host's stack makes it: addresses swapped, type 0.
        let icmp = Icmpv4Repr::EchoReply {
            ident: 7,
            seq_no: 9,
            data: b"ordo fleet watch",
        };
        let ip = Ipv4Repr {
            src_addr: to,
            dst_addr: from,
            next_header: IpProtocol::Icmp,
            payload_len: icmp.buffer_len(),
            hop_limit: 64,
        };
        let mut reply = vec![0u8; ip.buffer_len() + icmp.buffer_len()];
        let mut p = Ipv4Packet::new_unchecked(&mut reply[..]);
        ip.emit(&mut p, &ChecksumCapabilities::default());
        icmp.emit(
            &mut Icmpv4Packet::new_unchecked(p.payload_mut()),
            &ChecksumCapabilities::default(),
        );
        assert!(is_reply(&reply, 7, 9));
        assert!(!is_reply(&reply, 7, 10), "another probe's reply");
        assert!(!is_reply(&reply[..20], 7, 9));
    }
}
