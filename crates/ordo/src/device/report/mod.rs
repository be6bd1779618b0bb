//! What an interface reports about itself: one typed structure, [`InterfaceReport`], that the
//! device builds (`build.rs`) and every view renders: `ordo show` (text, and its JSON, which
//! is this structure), `ordo top`, `ordo doctor`, the metrics endpoint. The UAPI carries it
//! to them whole, as JSON in one `ordo_report=` line of an `ordo_get` reply, so nothing is
//! formatted into text by one side and parsed back by the other. No secret is in it.
//!
//! Figures of the last second are in whole thousandths (millicores, permille) so that the
//! JSON stays exact and stable.

mod build;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An interface, as it stands and as it fared over the last second.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct InterfaceReport {
    pub name: String,
    pub public_key: Option<String>,
    pub listen_port: u16,
    pub fwmark: u32,
    /// Ordo's execution model.
    pub model: String,
    /// The outer path: `udp`, or `xdp on` its interfaces with their modes.
    pub outer: String,
    pub peers: Vec<PeerReport>,
    /// The queue threads (models with queues).
    pub queues: Vec<QueueReport>,
    /// Every figure of the interface as a whole by name, counts and levels alike: drops by
    /// reason (`drop_*`, the kernel's as `drop_os_*`), handshakes, the ports' own figures,
    /// `mtu`, `under_load`, `uptime_sec`, `workers`, and each stage's totals (`stage_*`).
    pub counters: BTreeMap<String, u64>,
    /// Which of `counters` are the ports' own (`Device::port_counters`), and whether each
    /// says how things stand (an offload on, how many sockets) rather than counts events.
    pub port_figures: Vec<PortFigure>,
    /// Peers moved by the load-aware placement, by kind of move.
    pub moves: Moves,
    /// Each data-plane thread's totals since it started.
    pub thread_totals: Vec<ThreadTotals>,
    /// The last second (`crate::health`): per stage, thread and CPU.
    pub stages: Vec<StageShow>,
    pub threads: Vec<ThreadShow>,
    pub cpus: Vec<CpuShow>,
    /// The detectors' findings over the last second.
    pub warnings: Vec<WarningReport>,
    /// The figures of parts beside the data plane (the fleet's agent), each part's own.
    #[serde(default)]
    pub parts: Vec<PartReport>,
}

/// A part beside the data plane and its figures (see `Device::add_part`).
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct PartReport {
    pub part: String,
    pub figures: Vec<PartFigure>,
}

#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct PartFigure {
    pub name: String,
    pub value: u64,
    /// A level (a gauge), not a count of events.
    pub level: bool,
}

/// A peer as `wg show` shows it, without its preshared key, and where Ordo runs it.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct PeerReport {
    pub public_key: String,
    pub preshared_key: bool,
    pub endpoint: Option<String>,
    pub allowed_ips: Vec<String>,
    /// Seconds since the Unix epoch; 0 if never.
    pub latest_handshake: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub persistent_keepalive: u64,
    pub placement: Option<PlacementReport>,
}

/// A peer's place in the data plane (see `crate::placement`).
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct PlacementReport {
    /// Its receive queue (inline, auto) and that queue's CPU list.
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

/// A queue thread, the CPU it is placed on, and how that CPU fared.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct QueueReport {
    pub queue: u64,
    pub cpu: u64,
    /// Let off its CPU while other work contends for it (it then runs where the OS puts it).
    pub released: bool,
    /// Times it was released.
    pub releases: u64,
    /// Its CPU at the last placement interval (none before the first).
    pub last_interval: Option<QueueLoad>,
}

/// A queue's CPU over a placement interval (`host::cpuload`).
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct QueueLoad {
    /// Other work on the CPU: other processes, the kernel's softirq work.
    pub other_millicores: u64,
    pub idle_permille: u64,
    /// How long the queue's thread waited to run.
    pub thread_wait_permille: u64,
}

/// One of the ports' own figures, named as in `counters`.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct PortFigure {
    pub name: String,
    /// A level (a gauge), not a count of events.
    pub level: bool,
}

/// Peers moved by the placement.
#[derive(Serialize, Deserialize, Default, Debug, Clone, Copy, PartialEq)]
pub struct Moves {
    /// To another queue.
    pub queue: u64,
    /// Their crypto to another NUMA node's pool.
    pub pool: u64,
    /// Their crypto between their queue and the pool.
    pub spread: u64,
}

/// A data-plane thread since it started: Ordo's clock, the OS's charge, and its stages.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct ThreadTotals {
    pub name: String,
    pub tid: u64,
    pub busy_us: u64,
    /// As the OS accounts it (None where /proc did not say).
    pub os: Option<OsTotals>,
    /// The stages it ran.
    pub stages: Vec<StageTotals>,
}

/// What the OS charged a thread.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct OsTotals {
    pub cpu_us: u64,
    /// Switched out because it waited (voluntary switches).
    pub sleeps: u64,
    /// Switched out while it could still run (involuntary switches).
    pub preemptions: u64,
}

/// A thread's part of a stage.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct StageTotals {
    pub stage: String,
    pub packets: u64,
    pub batches: u64,
    pub busy_us: u64,
    /// Delivery stages: times it became a lane's deliverer, and those that found nothing.
    pub wakeups: Option<u64>,
    pub wasted_wakeups: Option<u64>,
}

/// A stage over the last second.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct StageShow {
    pub name: String,
    pub millicores: u64,
    pub pps: u64,
    pub batches: u64,
    pub wakeups: u64,
    pub wasted: u64,
}

/// A data-plane thread over the last second: Ordo's clock beside the OS's charge.
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
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
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
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

/// A detector's finding (`crate::health::detect`).
#[derive(Serialize, Deserialize, Default, Debug, Clone, PartialEq)]
pub struct WarningReport {
    /// The detector's name (`inversion`, `black_hole`, `accounting`).
    pub detector: String,
    pub text: String,
}

impl std::fmt::Display for WarningReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.detector, self.text)
    }
}

/// Whole thousandths of `x` (cores to millicores, a share to permille).
pub(crate) fn milli(x: f64) -> u64 {
    (x * 1000.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report crosses the UAPI as JSON and comes back the same, every field.
    #[test]
    fn a_report_round_trips_through_json() {
        let r = InterfaceReport {
            name: "wg0".into(),
            public_key: Some("k".into()),
            listen_port: 51820,
            model: "auto".into(),
            outer: "udp".into(),
            peers: vec![PeerReport {
                public_key: "p".into(),
                endpoint: Some("192.0.2.1:51820".into()),
                allowed_ips: vec!["10.0.0.2/32".into()],
                placement: Some(PlacementReport {
                    cpu: "0,2-3".into(),
                    regime: "pool".into(),
                    millicores: 250,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            queues: vec![QueueReport {
                queue: 1,
                cpu: 1,
                released: true,
                releases: 2,
                last_interval: Some(QueueLoad {
                    other_millicores: 300,
                    idle_permille: 10,
                    thread_wait_permille: 400,
                }),
            }],
            counters: [("drop_replay".to_string(), 3), ("udp_gro".to_string(), 1)].into(),
            port_figures: vec![PortFigure {
                name: "udp_gro".into(),
                level: true,
            }],
            moves: Moves {
                queue: 1,
                pool: 0,
                spread: 2,
            },
            thread_totals: vec![ThreadTotals {
                name: "queue0".into(),
                tid: 7,
                busy_us: 9,
                os: Some(OsTotals {
                    cpu_us: 10,
                    sleeps: 1,
                    preemptions: 2,
                }),
                stages: vec![StageTotals {
                    stage: "deliver_inbound".into(),
                    packets: 5,
                    batches: 1,
                    busy_us: 3,
                    wakeups: Some(1),
                    wasted_wakeups: Some(0),
                }],
            }],
            warnings: vec![WarningReport {
                detector: "black_hole".into(),
                text: "CPU 0 carries 95%".into(),
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains('\n'), "one line of the UAPI's reply");
        assert_eq!(serde_json::from_str::<InterfaceReport>(&json).unwrap(), r);
        assert_eq!(r.warnings[0].to_string(), "black_hole: CPU 0 carries 95%");
    }
}
