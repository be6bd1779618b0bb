//! The device builds its [`InterfaceReport`]: what the core holds, copied out under one
//! hold of its lock (which forwarding needs too); where the plane runs each peer; what the
//! ports, the threads and the health monitor count.

use super::{
    milli, CpuShow, InterfaceReport, Moves, OsTotals, PartFigure, PartReport, PeerReport, PlacementReport, PortFigure,
    QueueLoad, QueueReport, StageShow, StageTotals, ThreadShow, ThreadTotals, WarningReport,
};
use crate::device::peers::CoreCopy;
use crate::device::Device;
use crate::host::topology::format_cpu_list;
use crate::placement::model::Model;
use crate::plane::stats::Stage;
use crate::port::CounterKind;
use ipnet::IpNet;
use ordo_proto::{DropReason, PeerId};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Instant, UNIX_EPOCH};

impl Device {
    /// The whole report: the core's part copied under one hold of its lock, the rest read
    /// after it is released.
    pub fn report(&self) -> InterfaceReport {
        let (copied, public_key, stats, under_load, mtu) = {
            let core = self.core();
            (
                CoreCopy::of(&core),
                core.private_key().map(|k| k.public_key().to_base64()),
                core.stats.clone(),
                core.under_load(Instant::now()),
                core.mtu(),
            )
        };
        let mut counters: Vec<(String, u64)> = DropReason::ALL
            .iter()
            .map(|r| (format!("drop_{}", r.name()), stats.dropped(*r)))
            .collect();
        // The ports' own: their errors, the drops the kernel counted before Ordo saw a
        // packet, the offloads in use.
        let mut port_figures = Vec::new();
        for c in self.port_counters() {
            port_figures.push(PortFigure {
                name: c.name.to_string(),
                level: c.kind == CounterKind::Level,
            });
            counters.push((c.name.to_string(), c.value));
        }
        counters.extend([
            ("handshakes_initiated".to_string(), stats.handshakes_initiated),
            ("handshakes_completed".to_string(), stats.handshakes_completed),
            ("cookie_replies_sent".to_string(), stats.cookie_replies_sent),
            ("cookie_replies_accepted".to_string(), stats.cookie_replies_accepted),
            ("fleet_forwarded".to_string(), stats.fleet_forwarded),
            ("fleet_takeovers".to_string(), stats.fleet_takeovers),
            ("fleet_envelopes_opened".to_string(), stats.fleet_envelopes_opened),
            ("under_load".to_string(), under_load as u64),
            ("mtu".to_string(), mtu as u64),
            ("uptime_sec".to_string(), self.uptime().as_secs()),
            ("workers".to_string(), self.workers() as u64),
        ]);
        counters.extend(self.stats().stage_counters());
        let moves = self.plane.moves();
        let mut report = InterfaceReport {
            name: self.name.clone(),
            public_key,
            listen_port: self.listen_port(),
            fwmark: self.fwmark(),
            model: self.model().name().to_string(),
            outer: self.outer_path(),
            peers: self.placed(copied),
            queues: self.queue_reports(),
            counters: counters.into_iter().collect(),
            port_figures,
            moves: Moves {
                queue: moves.queue,
                pool: moves.pool,
                spread: moves.spread,
            },
            thread_totals: self.thread_totals(),
            parts: (self.part_figures().into_iter())
                .map(|(part, figures)| PartReport {
                    part: part.to_string(),
                    figures: (figures.into_iter())
                        .map(|c| PartFigure {
                            name: c.name.to_string(),
                            value: c.value,
                            level: c.kind == CounterKind::Level,
                        })
                        .collect(),
                })
                .collect(),
            ..Default::default()
        };
        self.add_last_second(&mut report);
        report
    }

    /// Each queue thread: its CPU, whether it is released from it under contention and how
    /// often it was (`placement::affinity`), and how its CPU fared at the last placement
    /// (`host::cpuload`).
    fn queue_reports(&self) -> Vec<QueueReport> {
        let plan = &self.plane.plan;
        if !plan.model.has_queues() {
            return Vec::new();
        }
        let seen = self.plane.queues_last_seen();
        (self.plane.queue_affinity().iter().enumerate())
            .map(|(q, a)| QueueReport {
                queue: q as u64,
                cpu: plan.queues[q] as u64,
                released: a.is_released(),
                releases: a.releases,
                last_interval: seen.get(q).map(|s| QueueLoad {
                    other_millicores: milli(s.other),
                    idle_permille: milli(s.idle),
                    thread_wait_permille: milli(s.wait),
                }),
            })
            .collect()
    }

    /// Each data-plane thread's totals: Ordo's clock, the OS's charge, its stages.
    fn thread_totals(&self) -> Vec<ThreadTotals> {
        (self.stats().threads().iter())
            .map(|t| ThreadTotals {
                name: t.name.clone(),
                tid: t.tid as u64,
                busy_us: t.busy_ns.load(Ordering::Relaxed) / 1000,
                os: t.os().map(|o| OsTotals {
                    cpu_us: o.cpu.as_micros() as u64,
                    sleeps: o.sleeps,
                    preemptions: o.preemptions,
                }),
                stages: (Stage::ALL.into_iter())
                    .filter_map(|s| {
                        let st = t.stage(s);
                        let wakeups = st.wakeups.load(Ordering::Relaxed);
                        let batches = st.batches.load(Ordering::Relaxed);
                        // A stage this thread does not run.
                        if batches + wakeups == 0 {
                            return None;
                        }
                        let delivery = matches!(s, Stage::DeliverInbound | Stage::DeliverOutbound);
                        Some(StageTotals {
                            stage: s.name().to_string(),
                            packets: st.packets.load(Ordering::Relaxed),
                            batches,
                            busy_us: st.busy_ns.load(Ordering::Relaxed) / 1000,
                            wakeups: delivery.then_some(wakeups),
                            wasted_wakeups: delivery.then(|| st.wasted_wakeups.load(Ordering::Relaxed)),
                        })
                    })
                    .collect(),
            })
            .collect()
    }

    /// The last second as the health monitor judged it: stages, threads, CPUs, warnings.
    fn add_last_second(&self, report: &mut InterfaceReport) {
        let health = self.health.report();
        if let Some(i) = &health.interval {
            report.stages = (i.stages.iter())
                .map(|st| StageShow {
                    name: st.stage.name().to_string(),
                    millicores: milli(st.cores),
                    pps: st.packets_per_second.round() as u64,
                    batches: st.batches_per_second.round() as u64,
                    wakeups: st.wakeups_per_second.round() as u64,
                    wasted: st.wasted_per_second.round() as u64,
                })
                .collect();
            report.threads = (i.threads.iter())
                .map(|t| ThreadShow {
                    name: t.name.clone(),
                    tid: t.tid as u64,
                    cpu: t.cpu.map(|c| c as u64),
                    ordo_millicores: milli(t.ordo_cores),
                    os_millicores: milli(t.os_cores),
                    waited_permille: milli(t.waited),
                })
                .collect();
            report.cpus = (i.cpus.iter())
                .map(|c| CpuShow {
                    cpu: c.cpu as u64,
                    tasks: milli(c.tasks),
                    irq: milli(c.irq),
                    softirq: milli(c.softirq),
                    steal: milli(c.steal),
                    idle: milli(c.idle),
                    ordo_clock: milli(c.ordo_clock),
                    ordo_os: milli(c.ordo_os),
                })
                .collect();
        }
        report.warnings = (health.warnings.iter())
            .map(|w| WarningReport {
                detector: w.detector.name().to_string(),
                text: w.message.clone(),
            })
            .collect();
    }

    /// The peers with their allowed IPs and where the plane runs them.
    fn placed(&self, copied: CoreCopy) -> Vec<PeerReport> {
        let plan = &self.plane.plan;
        let planes: HashMap<PeerId, _> = self.plane.peer_planes().into_iter().map(|p| (p.id, p)).collect();
        let affinity = self.plane.queue_affinity();
        (copied.peers().into_iter())
            .map(|p| {
                let plane = planes.get(&p.id);
                let spread = plane.map_or(matches!(plan.model, Model::Pool | Model::Threaded), |x| {
                    x.spread.load(Ordering::Relaxed)
                });
                let pool = plane.map_or(0, |x| x.pool.load(Ordering::Relaxed));
                let load = plane.map(|x| x.load()).unwrap_or_default();
                let (queue, cpus) = if plan.model.has_queues() {
                    let q = p.queue as usize % plan.queues.len();
                    let released = affinity.get(q).is_some_and(|a| a.is_released());
                    (q, plan.queue_thread_cpus(q, released))
                } else {
                    (0, plan.io_cpus.clone())
                };
                let node = if spread {
                    plan.pools.get(pool).map_or(0, |(n, _)| *n)
                } else {
                    plan.topology.node_of(plan.queues[queue])
                };
                let regime = match (plan.model, spread) {
                    (Model::Threaded, _) => Regime::PoolThread,
                    (_, true) => Regime::Pool,
                    (_, false) => Regime::Inline,
                };
                let handshake = p.last_handshake.and_then(|t| t.duration_since(UNIX_EPOCH).ok());
                PeerReport {
                    public_key: p.public_key.to_base64(),
                    preshared_key: !p.preshared_key.is_zero(),
                    endpoint: p.endpoint.map(|e| e.to_string()),
                    allowed_ips: p.allowed_ips.iter().map(IpNet::to_string).collect(),
                    latest_handshake: handshake.map_or(0, |d| d.as_secs()),
                    rx_bytes: p.rx_bytes,
                    tx_bytes: p.tx_bytes,
                    persistent_keepalive: p.persistent_keepalive as u64,
                    placement: Some(PlacementReport {
                        queue: queue as u64,
                        cpu: format_cpu_list(&cpus),
                        node: node as u64,
                        regime: regime.name().to_string(),
                        pps: load.pps.round() as u64,
                        millicores: milli(load.cores),
                    }),
                }
            })
            .collect()
    }
}

/// How a peer's crypto runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// On its queue's core.
    Inline,
    /// Spread over its node's workers.
    Pool,
    /// The threaded model's: workers, then a delivery thread.
    PoolThread,
}

impl Regime {
    fn name(self) -> &'static str {
        match self {
            Regime::Inline => "inline",
            Regime::Pool => "pool",
            Regime::PoolThread => "pool+thread",
        }
    }
}
