//! `ordo up` and `ordo down`: wg-quick's behaviour, with Ordo as the implementation. The
//! interface is started as `ordo IFNAME` would start it and then configured over its UAPI
//! socket, the same path `wg setconf` takes, so there is one way to configure a device.

use crate::config::wgquick::{InnerKind, Table, WgQuickConfig};
use crate::config::{self, set_request};
use crate::daemon::{self, privileges::Privileges};
use crate::firewall::{self, Family};
use crate::netconf::Netlink;
use crate::settings::InterfaceSettings;
use crate::uapi::client;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The table and fwmark wg-quick uses for a default route when none is set.
const DEFAULT_ROUTE_TABLE: u32 = 51820;

/// `NAME` means /etc/wireguard/NAME.conf; anything with a slash or ending in .conf is a path.
/// The interface is named after the file, as wg-quick does.
pub fn resolve(arg: &str) -> Result<(PathBuf, String)> {
    let path = if arg.contains('/') || arg.ends_with(".conf") {
        PathBuf::from(arg)
    } else {
        PathBuf::from(format!("/etc/wireguard/{arg}.conf"))
    };
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|n| {
            !n.is_empty() && n.len() < 16 && n.chars().all(|c| c.is_ascii_alphanumeric() || "_=+.-".contains(c))
        })
        .with_context(|| {
            format!(
                "{}: the file name must be a valid interface name (1-15 of a-z A-Z 0-9 _=+.-) followed by .conf",
                path.display()
            )
        })?;
    Ok((path.clone(), name.to_string()))
}

fn run_hooks(hooks: &[String], ifname: &str) -> Result<()> {
    for h in hooks {
        let cmd = h.replace("%i", ifname);
        eprintln!("[#] {cmd}");
        let status = Command::new("bash")
            .arg("-c")
            .arg(&cmd)
            .status()
            .context("running a hook")?;
        if !status.success() {
            bail!("hook failed ({status}): {cmd}");
        }
    }
    Ok(())
}

/// The environment variable choosing the inner side when neither the command line nor the
/// file does (`tun` or `stack`).
pub const INNER_ENV: &str = "ORDO_INNER";

pub fn up(arg: &str, privileges: &Privileges, inner: Option<InnerKind>, foreground: bool) -> Result<()> {
    let (path, ifname) = resolve(arg)?;
    let cfg = config::load(&path)?;
    let from_env = match std::env::var(INNER_ENV) {
        Ok(v) if !v.is_empty() => Some(
            v.parse::<InnerKind>()
                .map_err(|e| anyhow::anyhow!("{INNER_ENV}: {e}"))?,
        ),
        _ => None,
    };
    if inner.or(cfg.interface.inner).or(from_env).unwrap_or_default() == InnerKind::Stack {
        // No device, routes or firewall: programs attach to the stack.
        return if foreground {
            crate::interface::shared::serve(&cfg, &path, &ifname, privileges)
        } else {
            run_hooks(&cfg.interface.pre_up, &ifname)?;
            crate::interface::shared::up(&path, &ifname, privileges)?;
            run_hooks(&cfg.interface.post_up, &ifname)
        };
    }
    if foreground {
        bail!("--foreground is for stack interfaces (Inner = stack)");
    }
    if let Some((line, _)) = cfg.interface.attach_users.first() {
        bail!(
            "{}:{line}: AttachUsers is for stack interfaces (Inner = stack): programs attach to those",
            path.display()
        );
    }
    if let Some((line, _)) = &cfg.interface.dns {
        eprintln!(
            "warning: {}:{line}: DNS is not set up by ordo up (wg-quick runs resolvconf for it); \
             ordo run uses it",
            path.display()
        );
    }
    if client::list_interfaces().contains(&ifname) {
        bail!("{ifname} is already up");
    }
    run_hooks(&cfg.interface.pre_up, &ifname)?;
    let mut plane = InterfaceSettings::from_env().map_err(anyhow::Error::msg)?;
    for (name, value) in &cfg.interface.plane {
        plane.set(name, value).map_err(anyhow::Error::msg)?;
    }
    daemon::spawn_detached(&ifname, privileges, &plane.to_args())?;
    let result = configure(&cfg, &ifname);
    if result.is_err() {
        // Leave nothing half-configured behind.
        firewall::remove(&ifname);
        if let Ok(nl) = Netlink::open() {
            if let Ok(idx) = nl.link_index(&ifname) {
                let _ = nl.delete_link(idx);
            }
        }
    }
    result
}

fn configure(cfg: &WgQuickConfig, ifname: &str) -> Result<()> {
    let i = &cfg.interface;
    let default_route = i.table == Table::Auto
        && cfg
            .peers
            .iter()
            .flat_map(|p| &p.allowed_ips)
            .any(|n| n.prefix_len() == 0);
    // A default route through the tunnel needs the outer packets marked (wg-quick does the same).
    let fwmark = match (i.fwmark, default_route) {
        (Some(m), _) if m != 0 => Some(m),
        (_, true) => Some(DEFAULT_ROUTE_TABLE),
        (m, false) => m,
    };
    client::request(ifname, set_request(cfg, fwmark)?.as_str()).with_context(|| format!("configuring {ifname}"))?;
    let nl = Netlink::open()?;
    let idx = nl.link_index(ifname)?;
    for a in &i.addresses {
        nl.add_address(idx, *a)?;
    }
    nl.set_mtu_and_up(idx, i.mtu.unwrap_or(1420))?;
    let table = match i.table {
        Table::Off => None,
        Table::Auto => Some(254),
        Table::Id(t) => Some(t),
    };
    if let Some(table) = table {
        let mut nets: Vec<_> = cfg.peers.iter().flat_map(|p| p.allowed_ips.iter().copied()).collect();
        nets.sort_by_key(|n| std::cmp::Reverse(n.prefix_len()));
        for net in nets {
            if default_route && net.prefix_len() == 0 {
                let mark = fwmark.expect("set for a default route");
                nl.add_route(idx, net, mark)?;
                nl.add_default_route_rules(net.addr().is_ipv6(), mark, mark)?;
                if net.addr().is_ipv4() {
                    let _ = std::fs::write("/proc/sys/net/ipv4/conf/all/src_valid_mark", "1");
                }
                let family = Family::of(&net);
                if firewall::available() {
                    firewall::add(ifname, family, &i.addresses, mark)?;
                } else {
                    eprintln!(
                        "ordo: warning: no nft program: the tunnel's address is not guarded against packets \
                         from other interfaces (CVE-2019-14899) and strict rp_filter may drop replies \
                         (apt install nftables)"
                    );
                }
            } else {
                nl.add_route(idx, net, table)?;
            }
        }
    }
    run_hooks(&i.post_up, ifname)?;
    Ok(())
}

pub fn down(arg: &str) -> Result<()> {
    let (path, ifname) = resolve(arg)?;
    let cfg = config::load(&path)?;
    run_hooks(&cfg.interface.pre_down, &ifname)?;
    if crate::interface::shared::is_up(&ifname) {
        crate::interface::shared::down(&ifname)?;
        return run_hooks(&cfg.interface.post_down, &ifname);
    }
    let nl = Netlink::open()?;
    let idx = nl.link_index(&ifname).with_context(|| format!("{ifname} is not up"))?;
    let mark = cfg.interface.fwmark.filter(|m| *m != 0).unwrap_or(DEFAULT_ROUTE_TABLE);
    nl.delete_default_route_rules(mark)?;
    firewall::remove(&ifname);
    nl.delete_link(idx)?;
    // The daemon notices the interface is gone and exits; its socket goes with it.
    for _ in 0..50 {
        if !crate::uapi::socket_path(&ifname).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    run_hooks(&cfg.interface.post_down, &ifname)?;
    Ok(())
}
