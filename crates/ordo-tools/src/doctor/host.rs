//! The host-wide checks: connection tracking of the UDP port, Ordo's socket buffers, the CPU
//! frequency governor and SMT, the kernel's WireGuard module, and whether the kernel counts
//! the softirq work it does (Zhang et al., "Understanding Linux Kernel-based Packet Switching on
//! WiFi Access Points").

use super::{Context, Finding, Severity};
use std::collections::HashMap;
use std::time::Duration;

pub fn examine(ctx: &Context) -> Vec<Finding> {
    vec![
        conntrack(ctx),
        socket_buffers(ctx),
        governor(ctx),
        smt(ctx),
        wireguard_module(ctx),
        softirq_accounting(),
    ]
}

/// Conntrack on the listen port: every datagram pays a table lookup, and a full table drops
/// new flows. The entries for the port show it tracks them (a `notrack` rule removes them).
fn conntrack(ctx: &Context) -> Finding {
    let check = "connection tracking of the UDP port";
    let Some(port) = ctx.port() else {
        return Finding::unknown(check, "the listen port is unknown (ordo doctor IFNAME)");
    };
    let Some(table) = ctx.files.read("/proc/net/nf_conntrack") else {
        return Finding::ok(
            check,
            "no conntrack in this network namespace (/proc/net/nf_conntrack absent)",
        );
    };
    let needle = (format!("dport={port} "), format!("sport={port} "));
    // Lines as "ipv4 2 udp 17 29 src=... dst=... sport=... dport=51820 ...".
    let tracked = (table.lines())
        .filter(|l| l.contains(" udp ") && (l.contains(&needle.0) || l.contains(&needle.1)))
        .count();
    if tracked == 0 {
        return Finding::ok(check, format!("no flow of udp/{port} in /proc/net/nf_conntrack"));
    }
    Finding::flag(
        Severity::Advice,
        check,
        format!("{tracked} flow(s) of udp/{port} in /proc/net/nf_conntrack"),
        "conntrack looks up every datagram of the tunnel and keeps an entry per peer; a full table drops new \
         peers' handshakes",
        Some(format!(
            "nft add table inet ordo_notrack; nft add chain inet ordo_notrack pre '{{ type filter hook prerouting \
             priority raw; }}'; nft add chain inet ordo_notrack out '{{ type filter hook output priority raw; }}'; \
             nft add rule inet ordo_notrack pre udp dport {port} notrack; nft add rule inet ordo_notrack out udp \
             sport {port} notrack"
        )),
    )
}

/// Ordo forces its sockets' buffers (SO_RCVBUFFORCE), so the system's limits do not cap it;
/// what tells is the kernel's own count of datagrams dropped for a full receive buffer.
fn socket_buffers(ctx: &Context) -> Finding {
    let check = "socket buffers";
    let limits = format!(
        "net.core.rmem_max {}, wmem_max {}",
        ctx.files.number("/proc/sys/net/core/rmem_max").unwrap_or(-1),
        ctx.files.number("/proc/sys/net/core/wmem_max").unwrap_or(-1)
    );
    let Some(s) = &ctx.interface else {
        return Finding::unknown(check, format!("{limits}; Ordo's drops unknown (ordo doctor IFNAME)"));
    };
    let dropped = s.counters.get("drop_os_udp_receive_buffer").copied().unwrap_or(0);
    if dropped == 0 {
        return Finding::ok(
            check,
            format!("{limits}; Ordo sets its own (SO_RCVBUFFORCE); the kernel dropped none for a full buffer"),
        );
    }
    Finding::flag(
        Severity::Problem,
        check,
        format!(
            "the kernel dropped {dropped} datagrams for {} for a full receive buffer",
            s.name
        ),
        "Ordo's receive threads did not keep up: the CPUs of its queues are busy with other work (ordo show \
         --all: what each queue's CPU did besides Ordo), or the queues are too few for the load",
        Some(format!("ordo show {} --all; ordo top {}", s.name, s.name)),
    )
}

/// A governor other than `performance` lowers the clock between bursts; the first packets of
/// each burst run slow.
fn governor(ctx: &Context) -> Finding {
    let check = "CPU frequency governor";
    let mut governors: HashMap<String, Vec<usize>> = HashMap::new();
    for cpu in 0..1024 {
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor");
        match ctx.files.read(&path) {
            Some(g) => governors.entry(g.trim().to_string()).or_default().push(cpu),
            None if cpu > 0 && !ctx.files.exists(&format!("/sys/devices/system/cpu/cpu{cpu}")) => break,
            None => {}
        }
    }
    if governors.is_empty() {
        return Finding::ok(check, "no cpufreq (a virtual machine, or a fixed clock)");
    }
    let slow: Vec<String> = (governors.iter())
        .filter(|(g, _)| g.as_str() != "performance")
        .map(|(g, cpus)| format!("{g} on CPUs {}", ordo::host::topology::format_cpu_list(cpus)))
        .collect();
    if slow.is_empty() {
        return Finding::ok(check, "performance on every CPU");
    }
    Finding::flag(
        Severity::Advice,
        check,
        slow.join("; "),
        "the clock drops between bursts and each burst's first packets run slow: latency and jitter",
        Some("cpupower frequency-set -g performance".into()),
    )
}

/// Two queues on the two threads of one core share its execution units.
fn smt(ctx: &Context) -> Finding {
    let check = "simultaneous multithreading (SMT)";
    match ctx.files.number("/sys/devices/system/cpu/smt/active") {
        Some(1) => Finding::flag(
            Severity::Advice,
            check,
            "/sys/devices/system/cpu/smt/active: 1",
            "two of Ordo's queues on sibling threads share one core's execution units and caches: the crypto \
             of each runs slower than on a core of its own",
            Some("ordo IFNAME --cores <one thread per core> (lscpu -e: the CORE column)".into()),
        ),
        Some(_) => Finding::ok(check, "off"),
        None => Finding::ok(check, "not offered by this CPU"),
    }
}

/// wg-quick uses the kernel's WireGuard whenever `ip link add type wireguard` succeeds, and
/// only falls back to WG_QUICK_USERSPACE_IMPLEMENTATION when it does not.
fn wireguard_module(ctx: &Context) -> Finding {
    let check = "the kernel's WireGuard module";
    if ctx.files.exists("/sys/module/wireguard") {
        return Finding::flag(
            Severity::Problem,
            check,
            "/sys/module/wireguard exists: loaded (or built in)",
            "wg-quick creates kernel WireGuard interfaces whenever it can and ignores \
             WG_QUICK_USERSPACE_IMPLEMENTATION=ordo",
            Some("modprobe -r wireguard (and blacklist it), or bring tunnels up with `ordo up`".into()),
        );
    }
    Finding::ok(
        check,
        "not loaded: wg-quick runs the userspace implementation it is given",
    )
}

/// Per CPU: NET_RX softirqs and the softirq time /proc/stat gives them over one second. Many
/// softirqs with no time counted: the kernel does not account the time spent in them (IRQ time
/// accounting off, or softirq run in interrupt context counted as idle), so
/// mpstat and top under-report the CPU that networking takes.
fn softirq_accounting() -> Finding {
    let check = "softirq time accounting";
    let config = kernel_config("CONFIG_IRQ_TIME_ACCOUNTING");
    let before = (net_rx_softirqs(), ordo::host::cpuload::cpu_times());
    std::thread::sleep(Duration::from_secs(1));
    let after = (net_rx_softirqs(), ordo::host::cpuload::cpu_times());
    let ticks = ordo::host::cpuload::clock_ticks_per_second() as f64;
    let mut busy = Vec::new();
    let mut unaccounted = Vec::new();
    for (cpu, n) in &after.0 {
        let count = n.saturating_sub(before.0.get(cpu).copied().unwrap_or(0));
        let time = (after.1.get(cpu).map_or(0, |t| t.softirq))
            .saturating_sub(before.1.get(cpu).map_or(0, |t| t.softirq)) as f64
            / ticks;
        if count >= 1_000 {
            busy.push(format!("CPU {cpu}: {count} NET_RX, {:.0}% softirq", time * 100.0));
            if time < 0.005 {
                unaccounted.push(*cpu);
            }
        }
    }
    let config_note = match config {
        Some(true) => "CONFIG_IRQ_TIME_ACCOUNTING=y",
        Some(false) => "CONFIG_IRQ_TIME_ACCOUNTING off",
        None => "the kernel's config not found",
    };
    if busy.is_empty() {
        return Finding::unknown(
            check,
            format!("{config_note}; no CPU ran 1,000 NET_RX softirqs in the second measured: run it under traffic"),
        );
    }
    busy.sort();
    if unaccounted.is_empty() {
        return Finding::ok(check, format!("{config_note}; {}", busy.join("; ")));
    }
    Finding::flag(
        Severity::Advice,
        check,
        format!("{config_note}; {}", busy.join("; ")),
        "the kernel runs the network's softirqs and counts no time for them: mpstat and top show those CPUs \
         idler than they are; trust Ordo's own figures (ordo top) and perf's",
        Some("a kernel with CONFIG_IRQ_TIME_ACCOUNTING=y; meanwhile perf stat -a -e cycles per CPU".into()),
    )
}

/// NET_RX softirqs per CPU since boot (/proc/softirqs).
fn net_rx_softirqs() -> HashMap<usize, u64> {
    let text = std::fs::read_to_string("/proc/softirqs").unwrap_or_default();
    parse_net_rx(&text)
}

fn parse_net_rx(text: &str) -> HashMap<usize, u64> {
    let mut lines = text.lines();
    let cpus: Vec<usize> = (lines.next().unwrap_or_default().split_whitespace())
        .filter_map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect();
    (lines.find(|l| l.trim_start().starts_with("NET_RX:")))
        .map(|l| {
            (l.split_whitespace().skip(1))
                .zip(&cpus)
                .filter_map(|(n, &cpu)| Some((cpu, n.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the running kernel was built with `option`, from /boot/config-RELEASE (not
/// /proc/config.gz, which needs a decompressor); None when that file is not there.
fn kernel_config(option: &str) -> Option<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let config = std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()?;
    Some(config.lines().any(|l| l == format!("{option}=y")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::FakeRoot;

    /// The governor, SMT and the WireGuard module, which no namespace can change: each named
    /// with its fix when injected under a stand-in root, and quiet once set right.
    #[test]
    fn host_settings_a_namespace_cannot_change_are_judged_from_an_injected_root() {
        let root = FakeRoot::new("host");
        root.write("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "powersave\n");
        root.write("/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "performance\n");
        root.write("/sys/devices/system/cpu/smt/active", "1\n");
        root.mkdir("/sys/module/wireguard");
        let ctx = Context {
            files: root.files(),
            ..Default::default()
        };
        let g = governor(&ctx);
        assert_eq!(g.severity, Severity::Advice, "{g:?}");
        assert_eq!(g.read, "powersave on CPUs 0");
        assert_eq!(g.fix.as_deref(), Some("cpupower frequency-set -g performance"));
        let s = smt(&ctx);
        assert_eq!(s.severity, Severity::Advice, "{s:?}");
        assert!(s.fix.unwrap().contains("--cores"));
        let w = wireguard_module(&ctx);
        assert_eq!(w.severity, Severity::Problem, "{w:?}");
        assert!(w.fix.unwrap().starts_with("modprobe -r wireguard"));

        root.write("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "performance\n");
        root.write("/sys/devices/system/cpu/smt/active", "0\n");
        root.remove("/sys/module/wireguard");
        for f in [governor(&ctx), smt(&ctx), wireguard_module(&ctx)] {
            assert_eq!(f.severity, Severity::Ok, "{f:?}");
        }
        // Neither cpufreq nor SMT offered (a virtual machine): nothing to judge.
        root.remove("/sys/devices/system/cpu");
        assert_eq!(governor(&ctx).read, "no cpufreq (a virtual machine, or a fixed clock)");
        assert_eq!(smt(&ctx).read, "not offered by this CPU");
    }

    #[test]
    fn net_rx_softirqs_per_cpu() {
        let text = "                    CPU0       CPU1\n          HI:          0          1\n      \
                    NET_TX:          5          6\n      NET_RX:     123456         78\n";
        let n = parse_net_rx(text);
        assert_eq!(n[&0], 123456);
        assert_eq!(n[&1], 78);
    }
}
