//! The checks of one outer interface: offloads (ethtool), receive steering (RPS/RFS/XPS),
//! interrupts against Ordo's queue CPUs, threaded NAPI, the MTU against the tunnel's, the
//! NIC's NUMA node against Ordo's CPUs.

use super::{Context, Finding, Severity};
use std::process::Command;

pub fn examine(dev: &str, ctx: &Context) -> Vec<Finding> {
    let mut f = offloads(dev, ctx);
    f.push(steering(dev, ctx));
    f.push(interrupts(dev, ctx));
    f.push(threaded_napi(dev, ctx));
    f.push(mtu(dev, ctx));
    f.push(numa(dev, ctx));
    f
}

/// `ethtool -k DEV`'s features: name and whether on ("fixed" ones included).
fn features(dev: &str) -> Result<Vec<(String, bool)>, String> {
    let out = Command::new("ethtool")
        .args(["-k", dev])
        .output()
        .map_err(|e| format!("ethtool: {e} (apt-get install --no-install-recommends ethtool)"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(parse_features(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_features(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .filter_map(|l| {
            let (name, v) = l.trim().split_once(':')?;
            let v = v.trim();
            (v.starts_with("on") || v.starts_with("off")).then(|| (name.trim().to_string(), v.starts_with("on")))
        })
        .collect()
}

/// GRO and GSO, which Ordo's batches rely on; TSO; UDP GRO for forwarded datagrams.
fn offloads(dev: &str, ctx: &Context) -> Vec<Finding> {
    let check = format!("offloads of {dev}");
    let features = match features(dev) {
        Ok(f) => f,
        Err(e) => return vec![Finding::unknown(check, e)],
    };
    let on = |name: &str| features.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let mut out = Vec::new();
    // A virtual link (veth) passes a sender's GSO batch whole, GRO or not; turning GRO on
    // there changed neither throughput nor CPU, with a peer sending batches or one by one
    // (docs/benchmarks-log.md, "GRO on a veth"). From a wire, GRO alone makes batches.
    let virtual_link = !ctx.files.exists(&format!("/sys/class/net/{dev}/device"));
    // A feature's severity when off; none: off is fine, `why` says why.
    let mut off = |feature: &str, short: &str, severity: Option<Severity>, why: &str| match (on(feature), severity) {
        (Some(false), Some(severity)) => out.push(Finding::flag(
            severity,
            format!("{feature} of {dev}"),
            format!("ethtool -k {dev}: {feature}: off"),
            why,
            Some(format!("ethtool -K {dev} {short} on")),
        )),
        (Some(false), None) => out.push(Finding::ok(format!("{feature} of {dev}"), format!("off: {why}"))),
        (Some(true), _) => out.push(Finding::ok(format!("{feature} of {dev}"), "on")),
        (None, _) => out.push(Finding::unknown(format!("{feature} of {dev}"), "not listed by ethtool")),
    };
    let (gro_severity, gro_why) = if virtual_link {
        (None, "on a virtual link a peer's GSO batches cross it whole")
    } else {
        (
            Some(Severity::Problem),
            "without GRO the kernel hands Ordo's socket one datagram per read instead of a batch (UDP GRO \
             needs it), several times the receive cost",
        )
    };
    off("generic-receive-offload", "gro", gro_severity, gro_why);
    off(
        "generic-segmentation-offload",
        "gso",
        Some(Severity::Problem),
        "without GSO each of Ordo's sends becomes one datagram per system call instead of a 64 KB batch",
    );
    off(
        "tcp-segmentation-offload",
        "tso",
        Some(Severity::Advice),
        "the host's own TCP over this link segments in software",
    );
    off(
        "rx-udp-gro-forwarding",
        "rx-udp-gro-forwarding",
        Some(Severity::Advice),
        "UDP datagrams this host forwards (a gateway's inner UDP flows leaving the tunnel) are not \
         aggregated: a cost per datagram on the forwarding path",
    );
    out
}

/// RPS on an outer interface moves the receive softirq to other CPUs before Ordo's socket
/// steering does its own: a cross-CPU hop per datagram.
fn steering(dev: &str, ctx: &Context) -> Finding {
    let check = format!("receive steering (RPS) of {dev}");
    let Ok(dir) = std::fs::read_dir(ctx.files.path(&format!("/sys/class/net/{dev}/queues"))) else {
        return Finding::unknown(check, format!("no /sys/class/net/{dev}/queues"));
    };
    let mut on = Vec::new();
    for q in dir.flatten() {
        let name = q.file_name().to_string_lossy().to_string();
        if !name.starts_with("rx-") {
            continue;
        }
        let mask = std::fs::read_to_string(q.path().join("rps_cpus")).unwrap_or_default();
        if mask.trim().chars().any(|c| c != '0' && c != ',') {
            on.push(format!("{name}/rps_cpus: {}", mask.trim()));
        }
    }
    if on.is_empty() {
        return Finding::ok(check, "off (rps_cpus 0 on every receive queue)");
    }
    let why = if ctx.queue_cpus.is_empty() {
        "RPS moves each datagram's softirq to another CPU before Ordo's own steering hands it to its peer's \
         queue: an extra cross-CPU hop (a packet's whole path on one core costs fewer cycles and cache misses)"
            .to_string()
    } else {
        format!(
            "RPS moves each datagram's softirq to another CPU before Ordo's steering hands it to its peer's \
             queue (CPUs {}): an extra cross-CPU hop",
            ordo::host::topology::format_cpu_list(&ctx.queue_cpus)
        )
    };
    Finding::flag(
        Severity::Advice,
        check,
        format!("/sys/class/net/{dev}/queues/{}", on.join(", ")),
        why,
        Some(format!(
            "for q in /sys/class/net/{dev}/queues/rx-*; do echo 0 > $q/rps_cpus; done"
        )),
    )
}

/// The interface's interrupts against the CPUs of Ordo's queues: the receive softirq runs
/// where the interrupt lands.
fn interrupts(dev: &str, ctx: &Context) -> Finding {
    let check = format!("interrupts of {dev}");
    let text = ctx.files.read("/proc/interrupts").unwrap_or_default();
    let irqs: Vec<u32> = (text.lines())
        .filter(|l| {
            l.split_whitespace()
                .any(|w| w == dev || w.starts_with(&format!("{dev}-")))
        })
        .filter_map(|l| l.split(':').next()?.trim().parse().ok())
        .collect();
    if irqs.is_empty() {
        return Finding::ok(
            check,
            "none in /proc/interrupts (a virtual interface: softirq runs in the sender)",
        );
    }
    let mut cpus = Vec::new();
    for irq in &irqs {
        let list = (ctx.files.read(&format!("/proc/irq/{irq}/smp_affinity_list"))).unwrap_or_default();
        cpus.extend(ordo::host::topology::parse_cpu_list(&list).unwrap_or_default());
    }
    cpus.sort_unstable();
    cpus.dedup();
    let read = format!(
        "IRQs {:?} on CPUs {}",
        irqs,
        ordo::host::topology::format_cpu_list(&cpus)
    );
    if ctx.queue_cpus.is_empty() {
        return Finding::unknown(check, format!("{read}; Ordo's queue CPUs unknown (ordo doctor IFNAME)"));
    }
    let outside: Vec<usize> = cpus.iter().copied().filter(|c| !ctx.queue_cpus.contains(c)).collect();
    if outside.is_empty() {
        return Finding::ok(check, read);
    }
    Finding::flag(
        Severity::Advice,
        check,
        read,
        format!(
            "interrupts on CPUs {} where no Ordo queue runs: the receive softirq runs there, then each batch \
             crosses to its queue's CPU ({})",
            ordo::host::topology::format_cpu_list(&outside),
            ordo::host::topology::format_cpu_list(&ctx.queue_cpus)
        ),
        Some(format!(
            "for i in {}; do echo {} > /proc/irq/$i/smp_affinity_list; done  (irqbalance may undo it: set its \
             banned CPUs, or stop it)",
            irqs.iter().map(u32::to_string).collect::<Vec<_>>().join(" "),
            ordo::host::topology::format_cpu_list(&ctx.queue_cpus)
        )),
    )
}

/// Threaded NAPI lets the scheduler place each interface's poll; softirq polls of many
/// interfaces converge on one core (the black hole: Barone et al., "Revisiting WireGuard for
/// Line-rate, Scalable Tunneling", HPSR 2025).
fn threaded_napi(dev: &str, ctx: &Context) -> Finding {
    let check = format!("threaded NAPI of {dev}");
    let path = format!("/sys/class/net/{dev}/threaded");
    match ctx.files.number(&path) {
        Some(0) => Finding::flag(
            Severity::Advice,
            check,
            format!("{path}: 0"),
            "NAPI polls run as softirq on the CPU that took the interrupt; with several interfaces or queues \
             they converge on one core while others idle; threaded NAPI lets the scheduler spread them",
            Some(format!("echo 1 > {path}")),
        ),
        Some(_) => Finding::ok(check, format!("{path}: 1")),
        None => Finding::unknown(check, format!("no {path} (the driver has no NAPI to thread)")),
    }
}

/// The outer link must carry the tunnel's largest datagram: the tunnel MTU plus WireGuard's
/// 32 bytes, UDP's 8 and IP's 20 (IPv4) or 40 (IPv6).
fn mtu(dev: &str, ctx: &Context) -> Finding {
    let check = format!("MTU of {dev} against the tunnel's");
    let Some(link) = ctx.files.number(&format!("/sys/class/net/{dev}/mtu")).map(|m| m as u32) else {
        return Finding::unknown(check, format!("no /sys/class/net/{dev}/mtu"));
    };
    let Some(tunnel) = ctx.tunnel_mtu else {
        return Finding::unknown(
            check,
            format!("{dev}: {link}; the tunnel's unknown (ordo doctor IFNAME)"),
        );
    };
    let read = format!("{dev}: {link}, the tunnel: {tunnel}");
    if tunnel + 80 <= link {
        return Finding::ok(check, read);
    }
    let severity = if tunnel + 60 <= link {
        Severity::Advice
    } else {
        Severity::Problem
    };
    let name = ctx.interface.as_ref().map_or("IFNAME", |s| s.name.as_str());
    Finding::flag(
        severity,
        check,
        read,
        format!(
            "a full tunnel packet needs {} bytes over IPv4 and {} over IPv6 outside: longer datagrams are \
             fragmented (IPv4) or dropped (IPv6, or where fragments are filtered)",
            tunnel + 60,
            tunnel + 80
        ),
        Some(format!("ip link set {name} mtu {}", link.saturating_sub(80))),
    )
}

/// The NIC's NUMA node against the nodes of Ordo's CPUs (NUMA-local crypto gave +31% in Barone
/// et al., HPSR 2025).
fn numa(dev: &str, ctx: &Context) -> Finding {
    let check = format!("NUMA node of {dev}");
    let path = format!("/sys/class/net/{dev}/device/numa_node");
    let node = match ctx.files.number(&path) {
        None => return Finding::ok(check, "no device node (a virtual interface)"),
        Some(n) if n < 0 => return Finding::ok(check, format!("{path}: {n} (one node, or not known to the kernel)")),
        Some(n) => n as usize,
    };
    let topology = ctx.files.topology();
    let away: Vec<usize> = ctx
        .queue_cpus
        .iter()
        .copied()
        .filter(|&c| topology.node_of(c) != node)
        .collect();
    if away.is_empty() {
        return Finding::ok(check, format!("node {node}, Ordo's queue CPUs on it"));
    }
    Finding::flag(
        Severity::Problem,
        check,
        format!(
            "{dev} on node {node}; Ordo's queue CPUs {} on another",
            ordo::host::topology::format_cpu_list(&away)
        ),
        "every datagram crosses between NUMA nodes, and memory on the other node is slower to reach",
        Some(format!(
            "ordo {} --cores <the CPUs of node {node}> (or Cores = in its ordo up file)",
            ctx.interface.as_ref().map_or("IFNAME", |s| s.name.as_str())
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::FakeRoot;

    /// A NIC's interrupts and NUMA node, which a veth has not: judged against the queues' CPUs
    /// from an injected /proc and /sys (two nodes: CPUs 0 and 2, and 1 and 3).
    #[test]
    fn a_nics_interrupts_and_numa_node_are_judged_against_the_queue_cpus() {
        let root = FakeRoot::new("nic");
        root.write(
            "/proc/interrupts",
            "           CPU0       CPU1\n 35:   10   20  PCI-MSI 524288-edge      eth9-TxRx-0\n              36:    1    2  PCI-MSI 524289-edge      eth9-TxRx-1\n 40:    0    0  PCI-MSI 1-edge      nvme0q1\n",
        );
        root.write("/proc/irq/35/smp_affinity_list", "1\n");
        root.write("/proc/irq/36/smp_affinity_list", "0\n");
        root.write("/sys/devices/system/node/node0/cpulist", "0,2\n");
        root.write("/sys/devices/system/node/node1/cpulist", "1,3\n");
        root.write("/sys/class/net/eth9/device/numa_node", "1\n");
        let mut ctx = Context {
            files: root.files(),
            queue_cpus: vec![0],
            ..Default::default()
        };
        let i = interrupts("eth9", &ctx);
        assert_eq!(i.severity, Severity::Advice, "{i:?}");
        assert_eq!(i.read, "IRQs [35, 36] on CPUs 0-1");
        assert!(
            i.why.starts_with("interrupts on CPUs 1 where no Ordo queue runs"),
            "{i:?}"
        );
        assert!(i
            .fix
            .unwrap()
            .starts_with("for i in 35 36; do echo 0 > /proc/irq/$i/smp_affinity_list"));
        let n = numa("eth9", &ctx);
        assert_eq!(n.severity, Severity::Problem, "{n:?}");
        assert_eq!(n.read, "eth9 on node 1; Ordo's queue CPUs 0 on another");

        // The queues moved to the NIC's node, its interrupts with them.
        root.write("/proc/irq/36/smp_affinity_list", "1\n");
        ctx.queue_cpus = vec![1, 3];
        for f in [interrupts("eth9", &ctx), numa("eth9", &ctx)] {
            assert_eq!(f.severity, Severity::Ok, "{f:?}");
        }
    }

    #[test]
    fn ethtool_features_parse_with_their_fixed_marks() {
        let text = "Features for veth-a:\nrx-checksumming: on\ngeneric-receive-offload: off\n\
                    rx-udp-gro-forwarding: off [fixed]\nhighdma: on [fixed]\n";
        let f = parse_features(text);
        assert!(f.contains(&("generic-receive-offload".to_string(), false)));
        assert!(f.contains(&("rx-udp-gro-forwarding".to_string(), false)));
        assert!(f.contains(&("highdma".to_string(), true)));
        assert!(!f.iter().any(|(n, _)| n == "Features for veth-a"));
    }

    #[test]
    fn the_mtu_check_counts_the_outer_headers() {
        let mut ctx = Context {
            tunnel_mtu: Some(1420),
            ..Default::default()
        };
        // Only a link's sysfs gives the MTU: loopback is always there.
        assert_eq!(mtu("lo", &ctx).severity, Severity::Ok, "65536 carries anything");
        ctx.tunnel_mtu = Some(65_500);
        let f = mtu("lo", &ctx);
        assert_eq!(f.severity, Severity::Problem, "{f:?}");
        assert!(f.fix.unwrap().ends_with(&format!("mtu {}", 65536 - 80)));
    }
}
