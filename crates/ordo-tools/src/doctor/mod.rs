//! `ordo doctor`: what on this host slows or breaks a WireGuard gateway, each finding with
//! what was read, why it matters and the command that fixes it. The outer interfaces' own
//! settings ([`nic`]: offloads, steering, interrupts, NAPI, MTU, NUMA) and the host's
//! ([`host`]: conntrack, CPU frequency and SMT, the kernel's WireGuard module, and whether the
//! kernel accounts softirq time at all).
//!
//! With an Ordo interface named, its listen port, tunnel MTU, queue CPUs and drops are read
//! over its UAPI socket (as `ordo show` does); without, the checks that need them say so.

pub mod host;
pub mod nic;

use ordo::device::report::InterfaceReport;
use ordo::host::topology::Topology;
use serde::Serialize;
use std::fmt::Write;
use std::path::PathBuf;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// As it should be.
    Ok,
    /// Could not be checked here (no such file, no traffic to measure): said, not judged.
    Unknown,
    /// Costs performance; worth changing.
    Advice,
    /// Loses packets, or defeats a feature.
    Problem,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Unknown => "unknown",
            Severity::Advice => "advice",
            Severity::Problem => "problem",
        }
    }
}

/// One check's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The check, with the interface or CPU it is about: "offloads of eth0".
    pub check: String,
    pub severity: Severity,
    /// What was read, and where.
    pub read: String,
    /// Why it matters (empty when all is well).
    pub why: String,
    /// The command that fixes it.
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(check: impl Into<String>, read: impl Into<String>) -> Finding {
        Finding {
            check: check.into(),
            severity: Severity::Ok,
            read: read.into(),
            why: String::new(),
            fix: None,
        }
    }

    pub fn unknown(check: impl Into<String>, read: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Unknown,
            ..Finding::ok(check, read)
        }
    }

    pub fn flag(
        severity: Severity,
        check: impl Into<String>,
        read: impl Into<String>,
        why: impl Into<String>,
        fix: Option<String>,
    ) -> Finding {
        Finding {
            check: check.into(),
            severity,
            read: read.into(),
            why: why.into(),
            fix,
        }
    }
}

/// Where the checks read the kernel's settings under /proc and /sys: the root directory on a
/// host; in a test, a directory standing in for it, with settings a veth in a namespace
/// cannot have (a frequency governor, SMT, an interrupt's affinity, a NUMA node, the
/// WireGuard module). The softirq measurement reads the live kernel either way.
#[derive(Debug, Clone)]
pub struct Files {
    root: PathBuf,
}

impl Default for Files {
    fn default() -> Files {
        Files {
            root: PathBuf::from("/"),
        }
    }
}

impl Files {
    /// Files read under `root` instead of `/`.
    pub fn at(root: impl Into<PathBuf>) -> Files {
        Files { root: root.into() }
    }

    /// An absolute path as the checks name it (what they print), under the root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.path(path)).ok()
    }

    /// A file holding one number, as sysfs's do.
    pub fn number(&self, path: &str) -> Option<i64> {
        self.read(path)?.trim().parse().ok()
    }

    pub fn exists(&self, path: &str) -> bool {
        self.path(path).exists()
    }

    /// The NUMA nodes, from sysfs; one node of the allowed CPUs when it cannot be read.
    pub fn topology(&self) -> Topology {
        Topology::read(&self.path("/sys"))
    }
}

/// What the checks know of the Ordo interface and the host.
#[derive(Default)]
pub struct Context {
    /// The Ordo interface, as `ordo show` reads it.
    pub interface: Option<InterfaceReport>,
    /// Its tunnel MTU (/sys/class/net/IFNAME/mtu).
    pub tunnel_mtu: Option<u32>,
    /// The outer interfaces to check.
    pub outers: Vec<String>,
    /// The CPUs of the interface's queues and of its peers' placement.
    pub queue_cpus: Vec<usize>,
    /// Where the kernel's settings are read.
    pub files: Files,
}

impl Context {
    /// Reads what the checks need: the interface named (if any) and the outer interfaces
    /// given, else those of the default routes.
    pub fn read(ifname: Option<&str>, outers: Vec<String>) -> anyhow::Result<Context> {
        let interface = ifname.map(ordo::show::fetch).transpose()?;
        let files = Files::default();
        let tunnel_mtu = ifname.and_then(|n| files.number(&format!("/sys/class/net/{n}/mtu")).map(|m| m as u32));
        let outers = if outers.is_empty() {
            ordo::outer::xdp::route::Routes::open()
                .and_then(|r| r.outer_interfaces())
                .map(|v| v.into_iter().map(|i| i.name).collect())
                .unwrap_or_default()
        } else {
            outers
        };
        // The queues' CPUs, peers or not, and those the peers run on (the pool models'
        // workers, for instance).
        let mut queue_cpus: Vec<usize> = (interface.iter())
            .flat_map(|s| s.queues.iter())
            .map(|q| q.cpu as usize)
            .collect();
        queue_cpus.extend(
            (interface.iter())
                .flat_map(|s| s.peers.iter())
                .filter_map(|p| p.placement.as_ref())
                .flat_map(|p| ordo::host::topology::parse_cpu_list(&p.cpu).unwrap_or_default()),
        );
        queue_cpus.sort_unstable();
        queue_cpus.dedup();
        Ok(Context {
            interface,
            tunnel_mtu,
            outers,
            queue_cpus,
            files,
        })
    }

    /// The interface's listen port.
    pub fn port(&self) -> Option<u16> {
        self.interface.as_ref().map(|s| s.listen_port).filter(|p| *p != 0)
    }
}

/// Every check.
pub fn examine(ctx: &Context) -> Vec<Finding> {
    let mut f = Vec::new();
    if ctx.outers.is_empty() {
        f.push(Finding::unknown(
            "outer interfaces",
            "no default route and none given (ordo doctor --outer DEV)",
        ));
    }
    for dev in &ctx.outers {
        f.extend(nic::examine(dev, ctx));
    }
    f.extend(host::examine(ctx));
    f
}

/// The findings for a person: problems and advice in full, the rest a line each.
pub fn render(findings: &[Finding]) -> String {
    let mut o = String::new();
    let mut sorted: Vec<&Finding> = findings.iter().collect();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.severity));
    for f in &sorted {
        if f.severity >= Severity::Advice {
            let _ = writeln!(o, "[{}] {}", f.severity.label(), f.check);
            let _ = writeln!(o, "  read: {}", f.read);
            let _ = writeln!(o, "  why:  {}", f.why);
            if let Some(fix) = &f.fix {
                let _ = writeln!(o, "  fix:  {fix}");
            }
        } else {
            let _ = writeln!(o, "[{}] {}: {}", f.severity.label(), f.check, f.read);
        }
    }
    let problems = findings.iter().filter(|f| f.severity == Severity::Problem).count();
    let advice = findings.iter().filter(|f| f.severity == Severity::Advice).count();
    let _ = writeln!(
        o,
        "\n{} checks: {problems} problem{}, {advice} piece{} of advice",
        findings.len(),
        if problems == 1 { "" } else { "s" },
        if advice == 1 { "" } else { "s" }
    );
    o
}

/// A directory standing in for / in the checks' tests ([`Files::at`]), removed when dropped.
#[cfg(test)]
pub(crate) struct FakeRoot {
    root: PathBuf,
}

#[cfg(test)]
impl FakeRoot {
    /// `name` tells tests apart, which run at once.
    pub fn new(name: &str) -> FakeRoot {
        let root = std::env::temp_dir().join(format!("ordo-doctor-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        FakeRoot { root }
    }

    /// Writes `path` (absolute, as on the host) under the root, with its directories.
    pub fn write(&self, path: &str, text: &str) {
        let p = self.files().path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    pub fn mkdir(&self, path: &str) {
        std::fs::create_dir_all(self.files().path(path)).unwrap();
    }

    pub fn remove(&self, path: &str) {
        let p = self.files().path(path);
        let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
    }

    pub fn files(&self) -> Files {
        Files::at(&self.root)
    }
}

#[cfg(test)]
impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_come_first_with_their_fix() {
        let f = vec![
            Finding::ok("threaded NAPI of eth0", "on"),
            Finding::flag(
                Severity::Problem,
                "offloads of eth0",
                "generic-receive-offload: off",
                "one datagram per read",
                Some("ethtool -K eth0 gro on".into()),
            ),
        ];
        let r = render(&f);
        assert!(
            r.starts_with("[problem] offloads of eth0\n  read: generic-receive-offload: off\n"),
            "{r}"
        );
        assert!(r.contains("  fix:  ethtool -K eth0 gro on\n"), "{r}");
        assert!(r.contains("[ok] threaded NAPI of eth0: on\n"), "{r}");
        assert!(r.ends_with("2 checks: 1 problem, 0 pieces of advice\n"), "{r}");
    }
}
