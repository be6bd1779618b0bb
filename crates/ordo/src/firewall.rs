//! The nftables rules wg-quick adds with a default route through the tunnel (its
//! `add_default`), through the `nft` program as wg-quick does:
//! - packets for the tunnel's own addresses that arrive on another interface from a
//!   non-local source are dropped, so that nobody on the outer network can probe for the
//!   tunnel's address (CVE-2019-14899);
//! - the fwmark of the tunnel's own outer UDP packets is saved in their conntrack entry and
//!   restored on the replies, so that hosts with strict reverse-path filtering accept them.
//!
//! One table per family and interface, `wg-quick-IFNAME` (wg-quick's name), removed whole
//! when the interface goes down.

use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

/// The IP family an nftables table is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    pub fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::Ip,
            IpNet::V6(_) => Family::Ip6,
        }
    }
}

fn table(ifname: &str) -> String {
    format!("wg-quick-{ifname}")
}

/// The `nft -f` script for `family`: the chains, a drop rule per interface address of that
/// family, and the mark's save and restore.
pub fn rules(ifname: &str, family: Family, addresses: &[IpNet], fwmark: u32) -> String {
    let (f, t) = (family.name(), table(ifname));
    let mut s = String::new();
    let _ = writeln!(s, "add table {f} {t}");
    let _ = writeln!(
        s,
        "add chain {f} {t} preraw {{ type filter hook prerouting priority -300; }}"
    );
    let _ = writeln!(
        s,
        "add chain {f} {t} premangle {{ type filter hook prerouting priority -150; }}"
    );
    let _ = writeln!(
        s,
        "add chain {f} {t} postmangle {{ type filter hook postrouting priority -150; }}"
    );
    for a in addresses.iter().filter(|a| Family::of(a) == family) {
        let _ = writeln!(
            s,
            "add rule {f} {t} preraw iifname != \"{ifname}\" {f} daddr {} fib saddr type != local drop",
            a.addr()
        );
    }
    let _ = writeln!(
        s,
        "add rule {f} {t} postmangle meta l4proto udp mark {fwmark} ct mark set mark"
    );
    let _ = writeln!(s, "add rule {f} {t} premangle meta l4proto udp meta mark set ct mark");
    s
}

/// Adds the rules for `family`.
pub fn add(ifname: &str, family: Family, addresses: &[IpNet], fwmark: u32) -> Result<()> {
    nft(&rules(ifname, family, addresses, fwmark)).with_context(|| {
        format!("adding wg-quick's nftables rules for {ifname} (needs the nft program: apt install nftables)")
    })
}

/// Removes the tables of `ifname`, if there are any.
pub fn remove(ifname: &str) {
    for f in [Family::Ip, Family::Ip6] {
        let _ = nft(&format!("delete table {} {}\n", f.name(), table(ifname)));
    }
}

/// Whether the `nft` program is there to run.
pub fn available() -> bool {
    Command::new("nft")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn nft(script: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft")?;
    child.stdin.take().expect("piped").write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_wg_quicks_for_each_family() {
        let addrs: Vec<IpNet> = vec!["10.0.0.2/24".parse().unwrap(), "fd00::2/64".parse().unwrap()];
        let v4 = rules("wg0", Family::Ip, &addrs, 51820);
        assert_eq!(
            v4,
            "add table ip wg-quick-wg0\n\
             add chain ip wg-quick-wg0 preraw { type filter hook prerouting priority -300; }\n\
             add chain ip wg-quick-wg0 premangle { type filter hook prerouting priority -150; }\n\
             add chain ip wg-quick-wg0 postmangle { type filter hook postrouting priority -150; }\n\
             add rule ip wg-quick-wg0 preraw iifname != \"wg0\" ip daddr 10.0.0.2 fib saddr type != local drop\n\
             add rule ip wg-quick-wg0 postmangle meta l4proto udp mark 51820 ct mark set mark\n\
             add rule ip wg-quick-wg0 premangle meta l4proto udp meta mark set ct mark\n"
        );
        let v6 = rules("wg0", Family::Ip6, &addrs, 51820);
        assert!(v6.contains("add rule ip6 wg-quick-wg0 preraw iifname != \"wg0\" ip6 daddr fd00::2 fib"));
        assert!(!v6.contains("10.0.0.2"));
    }
}
