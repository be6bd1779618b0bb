//! An interface's settings beyond WireGuard's own, by name: as `ordo up` files spell them
//! (`Model = inline`), as the command line does (`--model inline`) and the environment
//! (`ORDO_MODEL=inline`).

pub mod fleet;

use crate::host::topology::{self, format_cpu_list};
use crate::outer::xdp::attach::Mode as XdpMode;
use crate::outer::OuterKind;
use crate::placement::model::PlacementSettings;
use fleet::FleetSettings;

/// An interface's settings beyond WireGuard's own: where its threads run, which outer path
/// it takes, its metrics endpoint. The inner side is chosen by how the interface is brought
/// up (`ordo IFNAME`: TUN; a file with `Inner = stack`, `ordo run`: the stack).
#[derive(Clone, Debug, Default)]
pub struct InterfaceSettings {
    pub placement: PlacementSettings,
    /// The outer port: kernel UDP or AF_XDP.
    pub outer: OuterKind,
    /// The interfaces AF_XDP attaches to (empty: those of the default routes).
    pub xdp_interfaces: Vec<String>,
    /// Where the XDP program runs (None: natively where the driver can, else generic).
    pub xdp_mode: Option<XdpMode>,
    /// Where the metrics endpoint listens (None: no endpoint).
    pub metrics: Option<std::net::SocketAddr>,
    /// The fleet whose peers the interface takes from etcd (none by default).
    pub fleet: FleetSettings,
}

/// The settings by name, as `ordo up` files (`Model = inline`), the xplatform command line
/// (`--model inline`) and the environment (`ORDO_MODEL=inline`) spell them.
pub const SETTINGS: [(&str, &str, &str); 18] = [
    ("model", "Model", "ORDO_MODEL"),
    ("workers", "Workers", "ORDO_WORKERS"),
    ("cores", "Cores", "ORDO_CORES"),
    ("io-cores", "IoCores", "ORDO_IO_CORES"),
    ("delivery-fifo", "DeliveryFifo", "ORDO_DELIVERY_FIFO"),
    ("placement", "Placement", "ORDO_PLACEMENT"),
    ("outer", "Outer", "ORDO_OUTER"),
    ("xdp-interfaces", "XdpInterfaces", "ORDO_XDP_INTERFACES"),
    ("xdp-mode", "XdpMode", "ORDO_XDP_MODE"),
    ("metrics", "MetricsAddress", "ORDO_METRICS"),
    ("fleet", "Fleet", "ORDO_FLEET"),
    ("fleet-etcd", "FleetEtcd", "ORDO_FLEET_ETCD"),
    ("fleet-etcd-ca", "FleetEtcdCa", "ORDO_FLEET_ETCD_CA"),
    ("fleet-etcd-cert", "FleetEtcdCert", "ORDO_FLEET_ETCD_CERT"),
    ("fleet-etcd-key", "FleetEtcdKey", "ORDO_FLEET_ETCD_KEY"),
    ("fleet-route-table", "FleetRouteTable", "ORDO_FLEET_ROUTE_TABLE"),
    ("fleet-gateway", "FleetGateway", "ORDO_FLEET_GATEWAY"),
    ("fleet-address", "FleetAddress", "ORDO_FLEET_ADDRESS"),
];

impl InterfaceSettings {
    /// Sets one setting by its command-line name; the error says what is wrong with the value.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        match name {
            "model" => self.placement.model = value.parse()?,
            "workers" => {
                self.placement.workers = value
                    .parse()
                    .ok()
                    .filter(|w| *w <= 1024)
                    .ok_or_else(|| format!("workers must be a number of threads from 0 to 1024, not {value:?}"))?
            }
            "cores" => self.placement.cpus = Some(topology::parse_cpu_list(value)?),
            "io-cores" => self.placement.io_cpus = Some(topology::parse_cpu_list(value)?),
            "delivery-fifo" => {
                self.placement.delivery_fifo = match value {
                    "1" | "true" | "yes" | "on" => true,
                    "0" | "false" | "no" | "off" => false,
                    _ => return Err(format!("expected true or false, not {value:?}")),
                }
            }
            "placement" => {
                self.placement.fixed_placement = match value {
                    "load" => false,
                    "fixed" => true,
                    _ => return Err(format!("placement is load or fixed, not {value:?}")),
                }
            }
            "outer" => self.outer = value.parse()?,
            "xdp-interfaces" => {
                let names: Vec<String> = value
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect();
                if let Some(bad) = names.iter().find(|n| n.len() > 15 || n.contains('/')) {
                    return Err(format!("{bad:?} is not an interface name"));
                }
                self.xdp_interfaces = names;
            }
            "xdp-mode" => {
                self.xdp_mode = match value.to_ascii_lowercase().as_str() {
                    "auto" => None,
                    _ => Some(value.parse()?),
                }
            }
            "metrics" => self.metrics = parse_metrics_address(value)?,
            "fleet" => self.fleet.name = Some(fleet::parse_name(value)?),
            "fleet-etcd" => self.fleet.etcd = fleet::parse_endpoints(value)?,
            "fleet-etcd-ca" => self.fleet.ca = Some(value.into()),
            "fleet-etcd-cert" => self.fleet.cert = Some(value.into()),
            "fleet-etcd-key" => self.fleet.key = Some(value.into()),
            "fleet-route-table" => self.fleet.route_table = fleet::parse_route_table(value)?,
            "fleet-gateway" => self.fleet.gateway = fleet::parse_gateway(value)?,
            "fleet-address" => self.fleet.address = Some(fleet::parse_address(value)?),
            _ => return Err(format!("unknown data-plane setting {name:?}")),
        }
        Ok(())
    }

    /// The settings from the environment, for the forms of the command that wg-quick fixes.
    pub fn from_env() -> Result<InterfaceSettings, String> {
        let mut c = InterfaceSettings::default();
        for (name, _, env) in SETTINGS {
            if let Ok(v) = std::env::var(env) {
                if !v.is_empty() {
                    c.set(name, &v).map_err(|e| format!("{env}: {e}"))?;
                }
            }
        }
        Ok(c)
    }

    /// The settings as command-line flags (to hand to the detached daemon).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec!["--model".to_string(), self.placement.model.name().to_string()];
        a.extend(["--workers".to_string(), self.placement.workers.to_string()]);
        if let Some(c) = &self.placement.cpus {
            a.extend(["--cores".to_string(), format_cpu_list(c)]);
        }
        if let Some(c) = &self.placement.io_cpus {
            a.extend(["--io-cores".to_string(), format_cpu_list(c)]);
        }
        if self.placement.delivery_fifo {
            a.extend(["--delivery-fifo".to_string(), "true".to_string()]);
        }
        if self.placement.fixed_placement {
            a.extend(["--placement".to_string(), "fixed".to_string()]);
        }
        if self.outer != OuterKind::Udp {
            a.extend(["--outer".to_string(), self.outer.name().to_string()]);
        }
        if !self.xdp_interfaces.is_empty() {
            a.extend(["--xdp-interfaces".to_string(), self.xdp_interfaces.join(",")]);
        }
        if let Some(m) = self.xdp_mode {
            a.extend(["--xdp-mode".to_string(), m.to_string()]);
        }
        if let Some(m) = self.metrics {
            a.extend(["--metrics".to_string(), m.to_string()]);
        }
        let f = &self.fleet;
        if let Some(name) = &f.name {
            a.extend(["--fleet".to_string(), name.clone()]);
        }
        if !f.etcd.is_empty() {
            a.extend(["--fleet-etcd".to_string(), f.etcd.join(",")]);
        }
        if let Some(t) = f.route_table {
            a.extend(["--fleet-route-table".to_string(), t.to_string()]);
        }
        if let Some(g) = f.gateway {
            a.extend(["--fleet-gateway".to_string(), g.to_string()]);
        }
        if let Some(addr) = f.address {
            a.extend(["--fleet-address".to_string(), addr.to_string()]);
        }
        for (flag, path) in [
            ("--fleet-etcd-ca", &f.ca),
            ("--fleet-etcd-cert", &f.cert),
            ("--fleet-etcd-key", &f.key),
        ] {
            if let Some(p) = path {
                a.extend([flag.to_string(), p.display().to_string()]);
            }
        }
        a
    }
}

/// The metrics endpoint's address: `ADDRESS:PORT`, or a port alone for the loopback
/// address (`9586`: 127.0.0.1:9586); `off` or empty for none. Another address than the
/// loopback's is taken as asked, since the endpoint tells whoever reaches it about the peers.
fn parse_metrics_address(value: &str) -> Result<Option<std::net::SocketAddr>, String> {
    use std::net::{Ipv4Addr, SocketAddr};
    if value.is_empty() || value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if let Ok(port) = value.parse::<u16>() {
        return Ok(Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port))));
    }
    value
        .parse::<SocketAddr>()
        .map(Some)
        .map_err(|_| format!("a metrics address is ADDRESS:PORT (127.0.0.1:9586), a port, or off; not {value:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::model::Model;

    #[test]
    fn the_metrics_address_is_loopback_unless_given() {
        let mut c = InterfaceSettings::default();
        assert_eq!(c.metrics, None, "off by default");
        c.set("metrics", "9586").unwrap();
        assert_eq!(c.metrics, Some("127.0.0.1:9586".parse().unwrap()));
        c.set("metrics", "[::]:9100").unwrap();
        assert_eq!(c.metrics, Some("[::]:9100".parse().unwrap()));
        assert_eq!(c.to_args()[c.to_args().len() - 1], "[::]:9100", "handed to the daemon");
        c.set("metrics", "off").unwrap();
        assert_eq!(c.metrics, None);
        assert!(c.set("metrics", "localhost").unwrap_err().contains("ADDRESS:PORT"));
    }

    #[test]
    fn settings_parse_and_round_trip_as_flags() {
        let mut c = InterfaceSettings::default();
        c.set("model", "auto").unwrap();
        c.set("cores", "0-1").unwrap();
        c.set("io-cores", "0").unwrap();
        c.set("workers", "3").unwrap();
        c.set("placement", "fixed").unwrap();
        c.set("outer", "XDP").unwrap();
        c.set("xdp-interfaces", "eth0, eth1").unwrap();
        c.set("xdp-mode", "generic").unwrap();
        assert!(c.set("xdp-mode", "offload").unwrap_err().contains("native or generic"));
        assert!(c.set("outer", "dpdk").unwrap_err().contains("udp or xdp"));
        assert!(c.set("xdp-interfaces", "../etc").is_err());
        assert!(c.set("workers", "lots").unwrap_err().contains("\"lots\""));
        assert!(c.set("placement", "random").unwrap_err().contains("load or fixed"));
        assert!(c.set("speed", "1").is_err());
        let args = c.to_args();
        assert_eq!(
            args,
            [
                "--model",
                "auto",
                "--workers",
                "3",
                "--cores",
                "0-1",
                "--io-cores",
                "0",
                "--placement",
                "fixed",
                "--outer",
                "xdp",
                "--xdp-interfaces",
                "eth0,eth1",
                "--xdp-mode",
                "generic"
            ]
        );
        let mut fleet = InterfaceSettings::default();
        fleet.set("fleet", "gw").unwrap();
        fleet
            .set("fleet-etcd", "https://10.0.0.1:2379,https://10.0.0.2:2379")
            .unwrap();
        fleet.set("fleet-etcd-ca", "/etc/ordo/ca.pem").unwrap();
        fleet.set("fleet-route-table", "100").unwrap();
        assert!(fleet.set("fleet", "a b").is_err());
        let mut fleet_back = InterfaceSettings::default();
        for pair in fleet.to_args().chunks(2) {
            fleet_back.set(&pair[0][2..], &pair[1]).unwrap();
        }
        assert_eq!(fleet_back.fleet, fleet.fleet, "the fleet's settings reach the daemon");
        let mut back = InterfaceSettings::default();
        for pair in args.chunks(2) {
            back.set(&pair[0][2..], &pair[1]).unwrap();
        }
        let p = back.placement.clone();
        assert_eq!(
            (p.model, p.workers, p.cpus, p.io_cpus, p.fixed_placement),
            (Model::Auto, 3, Some(vec![0, 1]), Some(vec![0]), true)
        );
        assert_eq!(
            (back.outer, back.xdp_interfaces, back.xdp_mode),
            (
                OuterKind::Xdp,
                vec!["eth0".into(), "eth1".into()],
                Some(XdpMode::Generic)
            )
        );
    }
}
