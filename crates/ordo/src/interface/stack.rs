//! A stack interface in this process: an interface whose inner side is Ordo's own TCP/IP
//! stack (`Inner = stack`), configured from a wg-quick file, with the attach service that
//! programs reach it through. `ordo run` makes a private one ([`crate::run`]), `ordo up` a
//! shared one ([`crate::interface::shared`]).

use crate::config::{self, wgquick::WgQuickConfig};
use crate::device::Device;
use crate::inner::stack::service::Service;
use crate::inner::stack::{Attachers, StackSettings};
use crate::interface::settings::InterfaceSettings;
use crate::uapi;
use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use ordo_attach::Route;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;

/// A stack interface running in this process: its data plane and its attach service.
pub struct StackInterface {
    pub device: Arc<Device>,
    pub service: Service,
    /// What programs attached to it send through the tunnel.
    pub routes: Vec<Route>,
}

/// Starts a stack interface named `name` from the wg-quick file `cfg` (read from `source`),
/// serving the programs of `attachers` on `attach`.
pub fn start(
    cfg: &WgQuickConfig,
    source: &Path,
    name: &str,
    attach: UnixListener,
    attachers: Attachers,
) -> Result<StackInterface> {
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
    let settings = StackSettings {
        addresses: cfg.interface.addresses.clone(),
        mtu: cfg.interface.mtu.unwrap_or(1420) as usize,
        attachers,
    };
    let (device, stack) = Device::create_stack(name, &plane, settings.mtu).context("creating the stack interface")?;
    let request = config::set_request(cfg, None)?;
    // The request's lines after `set=1`, up to the blank line that ends it.
    uapi::protocol::parse_set(request.as_str().lines().skip(1).take_while(|l| !l.is_empty()))
        .and_then(|p| uapi::apply(&device, p))
        .map_err(|e| anyhow::anyhow!("{}: {}", source.display(), e.message))?;
    drop(request);
    device.start().context("starting the data plane")?;
    if let Some(address) = plane.metrics {
        crate::metrics::server::Endpoint::bind(address)?.serve(device.clone())?;
    }
    let service = Service::start(stack, &settings, attach).context("starting the stack")?;
    let peers_ips = cfg.peers.iter().flat_map(|p| p.allowed_ips.iter().copied());
    let routes = routes(&cfg.interface.addresses, peers_ips);
    Ok(StackInterface {
        device,
        service,
        routes,
    })
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
