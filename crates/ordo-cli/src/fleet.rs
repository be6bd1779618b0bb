//! `ordo fleet NAME add|remove|list`: a fleet's peers in etcd (`ordo::fleet::record` has the
//! layout, which any etcd client may write as well).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use ordo::fleet::admin::Admin;
use ordo::fleet::record::FleetPeer;
use ordo::settings::fleet::{self, FleetSettings};
use ordo_proto::PublicKey;
use std::path::PathBuf;

#[derive(Args)]
pub struct FleetArgs {
    /// The fleet's name: its records live under /ordo/fleet/NAME/ (an interface's `Fleet =`).
    name: String,
    /// etcd's client URLs, comma-separated (default: $ORDO_FLEET_ETCD, else
    /// http://127.0.0.1:2379).
    #[arg(long)]
    etcd: Option<String>,
    /// TLS: the CA of etcd's certificate, and a client certificate and key (PEM), as
    /// etcdctl's --cacert, --cert and --key.
    #[arg(long)]
    cacert: Option<PathBuf>,
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    #[command(subcommand)]
    action: FleetAction,
}

#[derive(Subcommand)]
enum FleetAction {
    /// Add a peer to every gateway of the fleet, or replace its record.
    Add {
        /// The peer's public key (base64).
        public_key: String,
        /// Its allowed IPs, comma-separated.
        #[arg(long, value_delimiter = ',')]
        allowed_ips: Vec<String>,
        /// Where to reach it before it sends (most clients need none: they are reached where
        /// they last sent from).
        #[arg(long)]
        endpoint: Option<std::net::SocketAddr>,
        /// Seconds between keepalives (0 or none: off).
        #[arg(long)]
        persistent_keepalive: Option<u16>,
    },
    /// Remove a peer from every gateway of the fleet.
    Remove { public_key: String },
    /// List the fleet's peers, and any record the gateways refuse.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Watch a gateway's data path with probes through its own tunnel, and announce the
    /// fleet's addresses (routes in the table its BGP daemon imports) only while it answers.
    Watch {
        /// The gateway's interface on this machine.
        ifname: String,
        /// The fleet's addresses to announce, comma-separated (198.51.100.1/32).
        #[arg(long, value_delimiter = ',', required = true)]
        announce: Vec<ipnet::IpNet>,
        /// The table the announcements go in (the gateway's FRR: `ip import-table N`).
        #[arg(long)]
        table: u32,
        /// The table of the gateway's return routes (its FleetRouteTable), from which they
        /// are removed when the gateway is withdrawn.
        #[arg(long, default_value = "main")]
        return_table: String,
        /// The probe's address inside the tunnel, within the interface's prefix.
        #[arg(long)]
        probe_from: std::net::Ipv4Addr,
        /// The gateway's inner address, which the probe pings.
        #[arg(long)]
        probe_to: std::net::Ipv4Addr,
        /// Milliseconds between probes.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// Probes in a row, answered or not, that change the verdict.
        #[arg(long, default_value_t = 3)]
        misses: u32,
    },
}

pub fn run(args: FleetArgs) -> Result<()> {
    let etcd = match args.etcd.or_else(|| std::env::var("ORDO_FLEET_ETCD").ok()) {
        Some(urls) => fleet::parse_endpoints(&urls).map_err(anyhow::Error::msg)?,
        None => Vec::new(),
    };
    let settings = FleetSettings {
        name: Some(fleet::parse_name(&args.name).map_err(anyhow::Error::msg)?),
        etcd,
        ca: args.cacert,
        cert: args.cert,
        key: args.key,
        ..FleetSettings::default()
    };
    let admin = Admin::new(&settings)?;
    let key = |text: &str| match PublicKey::from_base64(text) {
        Ok(k) => Ok(k),
        Err(_) => bail!("{text:?} is not a public key in base64"),
    };
    match args.action {
        FleetAction::Add {
            public_key,
            allowed_ips,
            endpoint,
            persistent_keepalive,
        } => {
            let mut ips = Vec::new();
            for ip in &allowed_ips {
                match ip.trim().parse() {
                    Ok(net) => ips.push(net),
                    Err(_) => bail!("{ip:?} is not an IP prefix (10.7.0.2/32)"),
                }
            }
            let peer = FleetPeer {
                allowed_ips: ips,
                endpoint,
                persistent_keepalive: persistent_keepalive.filter(|k| *k != 0),
            };
            admin.put(&key(&public_key)?, &peer)
        }
        FleetAction::Remove { public_key } => {
            if !admin.delete(&key(&public_key)?)? {
                bail!("fleet {} has no peer {public_key}", args.name);
            }
            Ok(())
        }
        FleetAction::Watch {
            ifname,
            announce,
            table,
            return_table,
            probe_from,
            probe_to,
            interval_ms,
            misses,
        } => {
            let return_table = fleet::parse_route_table(&return_table)
                .map_err(anyhow::Error::msg)?
                .unwrap_or(254);
            if fleet::parse_route_table(&table.to_string())
                .map_err(anyhow::Error::msg)?
                .is_none()
                || misses == 0
            {
                bail!("--table names a table and --misses is at least 1");
            }
            ordo::logging::init(&format!("fleet-watch-{ifname}"), log::LevelFilter::Info);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for signal in [libc::SIGTERM, libc::SIGINT] {
                signal_hook::flag::register(signal, stop.clone())?;
            }
            let settings = ordo::fleet::watch::WatchSettings {
                ifname,
                announce,
                table,
                return_table,
                probe_from,
                probe_to,
                interval: std::time::Duration::from_millis(interval_ms.max(10)),
                misses,
                fleet: settings.clone(),
            };
            ordo::fleet::watch::run(&settings, stop)
        }
        FleetAction::List { json } => {
            let listing = admin.list()?;
            if json {
                let peers: Vec<serde_json::Value> = (listing.peers.iter())
                    .map(|(k, p)| {
                        let mut v = serde_json::to_value(p).unwrap_or_default();
                        v["public_key"] = k.to_base64().into();
                        v
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&peers)?);
            } else {
                for (k, p) in &listing.peers {
                    let ips: Vec<String> = p.allowed_ips.iter().map(ToString::to_string).collect();
                    println!("peer: {}", k.to_base64());
                    println!(
                        "  allowed ips: {}",
                        if ips.is_empty() {
                            "(none)".into()
                        } else {
                            ips.join(", ")
                        }
                    );
                    if let Some(e) = p.endpoint {
                        println!("  endpoint: {e}");
                    }
                    if let Some(k) = p.persistent_keepalive {
                        println!("  persistent keepalive: every {k} seconds");
                    }
                }
            }
            for r in &listing.refused {
                eprintln!("refused by the gateways: {}: {}", r.key, r.reason);
            }
            Ok(())
        }
    }
}
