//! What every stack interface (`Inner = stack`) takes from its wg-quick file: its settings,
//! and the routes its programs send through the tunnel. `ordo run` makes a private one
//! ([`crate::run`]), `ordo up` a shared one ([`super::shared`]); both come up through
//! [`super::lifecycle`].

use crate::config::wgquick::WgQuickConfig;
use crate::inner::stack::{Attachers, StackSettings};
use crate::settings::InterfaceSettings;
use anyhow::{bail, Result};
use ipnet::IpNet;
use ordo_attach::Route;
use std::path::Path;

/// A stack interface's settings from its wg-quick file (and the environment): where its
/// threads run and its outer path, and the stack's own (its addresses, MTU, who may attach).
pub fn settings(
    cfg: &WgQuickConfig,
    source: &Path,
    attachers: Attachers,
) -> Result<(InterfaceSettings, StackSettings)> {
    if cfg.interface.addresses.is_empty() {
        bail!(
            "{}: an Address is needed: it is the programs' address in the tunnel",
            source.display()
        );
    }
    let mut plane = InterfaceSettings::from_env().map_err(anyhow::Error::msg)?;
    for (name, value) in &cfg.interface.plane {
        plane.set(name, value).map_err(anyhow::Error::msg)?;
    }
    let stack = StackSettings {
        addresses: cfg.interface.addresses.clone(),
        mtu: cfg.interface.mtu.unwrap_or(1420) as usize,
        attachers,
    };
    Ok((plane, stack))
}

/// What goes through the tunnel: the interface's networks and the peers' allowed IPs.
pub fn routes(addresses: &[IpNet], allowed: impl Iterator<Item = IpNet>) -> Vec<Route> {
    let mut routes: Vec<Route> = (addresses.iter().map(IpNet::trunc))
        .chain(allowed)
        .map(|n| Route {
            addr: n.addr(),
            prefix: n.prefix_len(),
        })
        .collect();
    routes.dedup();
    routes
}
