//! `ordo show`: what `wg show` prints, plus Ordo's own counters, or all of it as JSON.

use crate::uapi::client;
use anyhow::Result;
use ordo_proto::PublicKey;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Serialize, Default)]
pub struct PeerShow {
    pub public_key: String,
    pub preshared_key: bool,
    pub endpoint: Option<String>,
    pub allowed_ips: Vec<String>,
    /// Seconds since the Unix epoch; 0 if never.
    pub latest_handshake: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub persistent_keepalive: u64,
    /// Where the peer runs in Ordo's data plane.
    pub placement: Option<Placement>,
}

/// A peer's place in the data plane (see `crate::placement`).
#[derive(Serialize, Default, Debug, PartialEq)]
pub struct Placement {
    /// Its receive queue (inline, auto) and that queue's CPU(s).
    pub queue: u64,
    pub cpu: String,
    /// The NUMA node of its work.
    pub node: u64,
    /// "inline" (crypto on its queue's core), "pool" (spread over the node's workers) or
    /// "pool+thread" (the threaded model's delivery thread).
    pub regime: String,
    /// Packets per second both ways, and the cores of crypto they took, last interval.
    pub pps: u64,
    pub millicores: u64,
}

/// Parses `KEY,queue=Q,cpu=C,node=N,regime=R,pps=P,millicores=M`. C is a CPU list, which
/// may hold commas itself ("0,2-3").
fn parse_placement(v: &str) -> Option<(String, Placement)> {
    let mut parts = v.split(',');
    let key = parts.next()?.to_string();
    let mut p = Placement::default();
    for kv in parts {
        let Some((k, v)) = kv.split_once('=') else {
            if p.cpu.is_empty() {
                return None;
            }
            p.cpu = format!("{},{kv}", p.cpu);
            continue;
        };
        let n = || v.parse::<u64>().unwrap_or(0);
        match k {
            "queue" => p.queue = n(),
            "cpu" => p.cpu = v.to_string(),
            "node" => p.node = n(),
            "regime" => p.regime = v.to_string(),
            "pps" => p.pps = n(),
            "millicores" => p.millicores = n(),
            _ => {}
        }
    }
    Some((key, p))
}

#[derive(Serialize, Default)]
pub struct InterfaceShow {
    pub name: String,
    pub public_key: Option<String>,
    pub listen_port: u16,
    pub fwmark: u32,
    /// Ordo's execution model.
    pub model: String,
    /// The outer path: `udp`, or `xdp on` its interfaces with their modes.
    pub outer: String,
    pub peers: Vec<PeerShow>,
    /// The queue threads' CPUs (models with queues).
    pub queues: Vec<QueueShow>,
    /// Ordo's counters: drops by reason and handshake figures.
    pub counters: BTreeMap<String, u64>,
    /// The last second's figures (`crate::health`): per stage, thread and CPU.
    pub stages: Vec<StageShow>,
    pub threads: Vec<ThreadShow>,
    pub cpus: Vec<CpuShow>,
    /// The detectors' findings over the last second, `DETECTOR: TEXT`.
    pub warnings: Vec<String>,
}

/// A queue thread and the CPU it is placed on.
#[derive(Serialize, Default, Debug, Clone, PartialEq)]
pub struct QueueShow {
    pub queue: u64,
    pub cpu: u64,
    /// Let off its CPU while other work contends for it (it then runs where the OS puts it).
    pub released: bool,
}

/// A stage over the last second.
#[derive(Serialize, Default, Debug, Clone, PartialEq)]
pub struct StageShow {
    pub name: String,
    pub millicores: u64,
    pub pps: u64,
    pub batches: u64,
    pub wakeups: u64,
    pub wasted: u64,
}

/// A data-plane thread over the last second: Ordo's clock beside the OS's charge.
#[derive(Serialize, Default, Debug, Clone, PartialEq)]
pub struct ThreadShow {
    pub name: String,
    pub tid: u64,
    pub cpu: Option<u64>,
    pub ordo_millicores: u64,
    pub os_millicores: u64,
    /// Permille of the second it waited for its CPU.
    pub waited_permille: u64,
}

/// A CPU over the last second: the OS's time by kind (permille), Ordo's threads there
/// (millicores, by Ordo's clock and as the OS charged them).
#[derive(Serialize, Default, Debug, Clone, PartialEq)]
pub struct CpuShow {
    pub cpu: u64,
    pub tasks: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
    pub idle: u64,
    pub ordo_clock: u64,
    pub ordo_os: u64,
}

/// A `NAME,k=v,k=v` line of `ordo_get`: the name and the values by key.
struct Fields {
    name: String,
    values: HashMap<String, String>,
}

impl Fields {
    fn parse(v: &str) -> Fields {
        let mut parts = v.split(',');
        let name = parts.next().unwrap_or_default().to_string();
        let values = (parts.filter_map(|p| p.split_once('=')))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Fields { name, values }
    }

    fn get(&self, key: &str) -> Option<u64> {
        self.values.get(key).and_then(|x| x.parse().ok())
    }

    /// The number at `key`, 0 when missing.
    fn n(&self, key: &str) -> u64 {
        self.get(key).unwrap_or(0)
    }
}

pub fn fetch(ifname: &str) -> Result<InterfaceShow> {
    let pairs = client::request(ifname, "ordo_get=1\n\n")?;
    let mut s = InterfaceShow {
        name: ifname.to_string(),
        ..Default::default()
    };
    for (k, mut v) in pairs {
        let num = || v.parse::<u64>().unwrap_or(0);
        match (k.as_str(), s.peers.last_mut()) {
            ("private_key", _) => {
                s.public_key = ordo_proto::PrivateKey::from_hex(&v)
                    .ok()
                    .map(|k| k.public_key().to_base64());
                zeroize::Zeroize::zeroize(&mut v);
            }
            ("listen_port", _) => s.listen_port = num() as u16,
            ("fwmark", None) => s.fwmark = num() as u32,
            ("public_key", _) => s.peers.push(PeerShow {
                public_key: PublicKey::from_hex(&v).map(|k| k.to_base64()).unwrap_or(v.clone()),
                ..Default::default()
            }),
            ("ordo_model", _) => s.model = v.clone(),
            ("ordo_outer", _) => s.outer = v.clone(),
            ("ordo_stage", _) => {
                let f = Fields::parse(&v);
                s.stages.push(StageShow {
                    millicores: f.n("millicores"),
                    pps: f.n("pps"),
                    batches: f.n("batches"),
                    wakeups: f.n("wakeups"),
                    wasted: f.n("wasted"),
                    name: f.name,
                });
            }
            ("ordo_thread", _) => {
                let f = Fields::parse(&v);
                s.threads.push(ThreadShow {
                    tid: f.n("tid"),
                    cpu: f.get("cpu"),
                    ordo_millicores: f.n("ordo"),
                    os_millicores: f.n("os"),
                    waited_permille: f.n("waited"),
                    name: f.name,
                });
            }
            ("ordo_cpu", _) => {
                let f = Fields::parse(&v);
                s.cpus.push(CpuShow {
                    cpu: f.name.parse().unwrap_or(0),
                    tasks: f.n("tasks"),
                    irq: f.n("irq"),
                    softirq: f.n("softirq"),
                    steal: f.n("steal"),
                    idle: f.n("idle"),
                    ordo_clock: f.n("ordo_clock"),
                    ordo_os: f.n("ordo_os"),
                });
            }
            ("ordo_warning", _) => s.warnings.push(v.clone()),
            ("ordo_queue", _) => {
                let f = Fields::parse(&v);
                s.queues.push(QueueShow {
                    queue: f.name.parse().unwrap_or(0),
                    cpu: f.n("cpu"),
                    released: f.n("released") == 1,
                });
            }
            ("ordo_peer", _) => {
                if let Some((hex, placement)) = parse_placement(&v) {
                    let key = PublicKey::from_hex(&hex).map(|k| k.to_base64()).unwrap_or(hex);
                    if let Some(p) = s.peers.iter_mut().find(|p| p.public_key == key) {
                        p.placement = Some(placement);
                    }
                }
            }
            (k, _) if k.starts_with("ordo_") => {
                s.counters.insert(k["ordo_".len()..].to_string(), num());
            }
            (_, Some(p)) => match k.as_str() {
                "preshared_key" => p.preshared_key = true,
                "endpoint" => p.endpoint = Some(v),
                "allowed_ip" => p.allowed_ips.push(v),
                "last_handshake_time_sec" => p.latest_handshake = num(),
                "rx_bytes" => p.rx_bytes = num(),
                "tx_bytes" => p.tx_bytes = num(),
                "persistent_keepalive_interval" => p.persistent_keepalive = num(),
                _ => {}
            },
            _ => {}
        }
    }
    Ok(s)
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn ago(epoch_secs: u64) -> String {
    let then = UNIX_EPOCH + Duration::from_secs(epoch_secs);
    let secs = SystemTime::now().duration_since(then).unwrap_or_default().as_secs();
    let parts: Vec<String> = [
        (secs / 86400, "day"),
        (secs / 3600 % 24, "hour"),
        (secs / 60 % 60, "minute"),
        (secs % 60, "second"),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, unit)| format!("{n} {unit}{}", if n == 1 { "" } else { "s" }))
    .collect();
    if parts.is_empty() {
        "Now".into()
    } else {
        format!("{} ago", parts.join(", "))
    }
}

pub fn render(s: &InterfaceShow) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "interface: {}", s.name);
    if let Some(k) = &s.public_key {
        let _ = writeln!(o, "  public key: {k}\n  private key: (hidden)");
    }
    let _ = writeln!(o, "  listening port: {}", s.listen_port);
    if s.fwmark != 0 {
        let _ = writeln!(o, "  fwmark: 0x{:x}", s.fwmark);
    }
    for p in &s.peers {
        let _ = writeln!(o, "\npeer: {}", p.public_key);
        if p.preshared_key {
            let _ = writeln!(o, "  preshared key: (hidden)");
        }
        if let Some(e) = &p.endpoint {
            let _ = writeln!(o, "  endpoint: {e}");
        }
        let ips = if p.allowed_ips.is_empty() {
            "(none)".to_string()
        } else {
            p.allowed_ips.join(", ")
        };
        let _ = writeln!(o, "  allowed ips: {ips}");
        if p.latest_handshake != 0 {
            let _ = writeln!(o, "  latest handshake: {}", ago(p.latest_handshake));
        }
        if p.rx_bytes + p.tx_bytes > 0 {
            let _ = writeln!(
                o,
                "  transfer: {} received, {} sent",
                bytes(p.rx_bytes),
                bytes(p.tx_bytes)
            );
        }
        if p.persistent_keepalive != 0 {
            let _ = writeln!(o, "  persistent keepalive: every {} seconds", p.persistent_keepalive);
        }
        if let Some(pl) = &p.placement {
            // A list: the pool models' I/O CPUs, or a queue released under contention.
            let list = pl.cpu.contains([',', '-']);
            let _ = writeln!(
                o,
                "  placement: {}, queue {} on CPU{} {}, node {}, {} packets/s, {:.2} cores",
                pl.regime,
                pl.queue,
                if list { "s" } else { "" },
                pl.cpu,
                pl.node,
                pl.pps,
                pl.millicores as f64 / 1000.0
            );
        }
    }
    let queues = s.counters.get("queues").copied().unwrap_or(1);
    let workers = s.counters.get("workers").copied().unwrap_or(0);
    let _ = writeln!(
        o,
        "\nordo: model {}, {queues} queue{}, {workers} crypto worker{}",
        s.model,
        if queues == 1 { "" } else { "s" },
        if workers == 1 { "" } else { "s" }
    );
    if !s.outer.is_empty() {
        let _ = writeln!(o, "  outer path: {}", s.outer);
    }
    let offloads: Vec<&str> = ["udp_gso", "udp_gro", "tun_tso", "tun_uso"]
        .into_iter()
        .filter(|k| s.counters.get(*k).is_some_and(|v| *v > 0))
        .collect();
    if !offloads.is_empty() {
        let _ = writeln!(o, "  offloads: {}", offloads.join(" ").replace('_', " "));
    }
    let busy: Vec<String> = (s.stages.iter())
        .filter(|st| st.millicores > 0)
        .map(|st| format!("{} {:.2}", st.name.replace('_', " "), st.millicores as f64 / 1000.0))
        .collect();
    if !s.stages.is_empty() {
        let _ = writeln!(
            o,
            "  cores by stage, last second: {}",
            if busy.is_empty() {
                "idle".to_string()
            } else {
                busy.join(", ")
            }
        );
    }
    let drops: Vec<String> = s
        .counters
        .iter()
        .filter(|(k, v)| k.starts_with("drop_") && **v > 0)
        .map(|(k, v)| format!("{}={v}", &k["drop_".len()..]))
        .collect();
    let _ = writeln!(
        o,
        "  drops: {}",
        if drops.is_empty() {
            "none".to_string()
        } else {
            drops.join(" ")
        }
    );
    if s.warnings.is_empty() {
        let _ = writeln!(o, "  warnings: none");
    } else {
        let _ = writeln!(o, "  warnings:");
        for w in &s.warnings {
            let _ = writeln!(o, "    {w}");
        }
    }
    o
}

/// [`render`], then every counter by name (`ordo show --all`).
pub fn render_all(s: &InterfaceShow) -> String {
    let mut o = render(s);
    let _ = writeln!(o, "  counters:");
    for (k, v) in &s.counters {
        let _ = writeln!(o, "    {}: {v}", k.replace('_', " "));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(3 << 30), "3.00 GiB");
    }

    #[test]
    fn render_lists_drops_by_reason() {
        let mut s = InterfaceShow {
            name: "wg0".into(),
            listen_port: 1,
            ..Default::default()
        };
        s.model = "inline".into();
        s.outer = "xdp on veth0 (native, copy, 1 socket)".into();
        s.counters.insert("drop_replay".into(), 3);
        s.counters.insert("drop_bad_mac1".into(), 0);
        s.peers.push(PeerShow {
            public_key: "k".into(),
            allowed_ips: vec!["10.0.0.2/32".into()],
            rx_bytes: 2048,
            tx_bytes: 1,
            ..Default::default()
        });
        let (_, placement) = parse_placement("00,queue=1,cpu=1,node=0,regime=inline,pps=1500,millicores=250").unwrap();
        s.peers[0].placement = Some(placement);
        let r = render(&s);
        assert!(r.contains("drops: replay=3\n"), "{r}");
        assert!(r.contains("ordo: model inline, 1 queue, 0 crypto workers\n"), "{r}");
        assert!(r.contains("warnings: none\n"), "{r}");
        assert!(!r.contains("counters:"), "every counter only with --all: {r}");
        s.warnings.push("black_hole: CPU 0 carries 95%".into());
        s.stages.push(StageShow {
            name: "decrypt".into(),
            millicores: 250,
            ..Default::default()
        });
        let r = render(&s);
        assert!(r.contains("  warnings:\n    black_hole: CPU 0 carries 95%\n"), "{r}");
        assert!(r.contains("cores by stage, last second: decrypt 0.25\n"), "{r}");
        assert!(render_all(&s).contains("    drop replay: 3\n"));
        assert!(
            r.contains("  outer path: xdp on veth0 (native, copy, 1 socket)\n"),
            "{r}"
        );
        assert!(
            r.contains("placement: inline, queue 1 on CPU 1, node 0, 1500 packets/s, 0.25 cores\n"),
            "{r}"
        );
        assert!(r.contains("transfer: 2.00 KiB received, 1 B sent"), "{r}");
        // A queue released under contention runs on a list of CPUs.
        let (_, placement) = parse_placement("00,queue=1,cpu=0-1,node=0,regime=inline,pps=1,millicores=0").unwrap();
        s.peers[0].placement = Some(placement);
        assert!(render(&s).contains("queue 1 on CPUs 0-1, node 0"), "{}", render(&s));
    }

    #[test]
    fn a_placement_on_a_list_of_cpus_parses_whole() {
        let (key, p) = parse_placement("ab,queue=0,cpu=0,2-3,node=1,regime=pool,pps=7,millicores=9").unwrap();
        assert_eq!(key, "ab");
        assert_eq!(
            (p.cpu.as_str(), p.node, p.regime.as_str(), p.pps),
            ("0,2-3", 1, "pool", 7)
        );
        assert!(
            parse_placement("ab,2,queue=0").is_none(),
            "a bare value with nothing before it"
        );
    }
}
