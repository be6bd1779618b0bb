//! A fleet's settings (`Fleet =`, `FleetEtcd =` and the others of [`super::SETTINGS`]):
//! where its records live and how to reach etcd. Here, below the fleet's code, so that the
//! interface's settings need nothing of it.

use std::net::IpAddr;
use std::path::PathBuf;

/// Where the fleet's records live, and how to reach etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetSettings {
    /// The fleet's name (letters, digits, `.`, `_`, `-`): its records live under
    /// `/ordo/fleet/NAME/`. None: the interface is no fleet's.
    pub name: Option<String>,
    /// etcd's client URLs, `http://` or `https://` (empty: etcd's default on this machine,
    /// http://127.0.0.1:2379).
    pub etcd: Vec<String>,
    /// TLS: the CA that signed etcd's certificate, and this gateway's client certificate and
    /// key (PEM files), as etcd's `--trusted-ca-file` and `--client-cert-auth` expect.
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The table the return routes go in ([`routes`]; None: no return routes).
    pub route_table: Option<u32>,
    /// This gateway's id in the fleet, 1 to 255 (`FleetGateway =`): its receiver indices
    /// carry it, so that the other gateways can pass its clients' datagrams to it or, when it
    /// is down, take them over. None: sessions are not shared.
    pub gateway: Option<u8>,
    /// Where the other gateways reach this one with the datagrams they pass on (its own
    /// address, not the fleet's shared one), at the interface's listen port.
    pub address: Option<IpAddr>,
}

/// etcd's own default client URL.
pub const DEFAULT_ETCD: &str = "http://127.0.0.1:2379";

impl FleetSettings {
    /// The prefix of the fleet's records, ending in `/`.
    pub fn prefix(&self) -> Option<String> {
        self.name.as_ref().map(|n| format!("/ordo/fleet/{n}/"))
    }

    /// The endpoints to dial.
    pub fn endpoints(&self) -> Vec<String> {
        if self.etcd.is_empty() {
            vec![DEFAULT_ETCD.to_string()]
        } else {
            self.etcd.clone()
        }
    }
}

/// A fleet's name, checked: it becomes part of every key.
pub fn parse_name(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!(
            "a fleet's name is 1 to 64 letters, digits, '.', '_' or '-', not {value:?}"
        ))
    }
}

/// A routing table for the return routes: `main`, or a number other than the kernel's
/// local (255) and default (253); `off` for none.
pub fn parse_route_table(value: &str) -> Result<Option<u32>, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if value.eq_ignore_ascii_case("main") {
        return Ok(Some(254));
    }
    match value.parse::<u32>() {
        Ok(t) if t != 0 && ![253, 255].contains(&t) => Ok(Some(t)),
        _ => Err(format!(
            "a return-route table is main, a number other than 0, 253 and 255 (the kernel's), or off; not {value:?}"
        )),
    }
}

/// A gateway's id: 1 to 255 (it fills a byte of the receiver index; 0 is no gateway's).
pub fn parse_gateway(value: &str) -> Result<Option<u8>, String> {
    match value.parse::<u8>() {
        Ok(g) if g != 0 => Ok(Some(g)),
        _ => Err(format!("a gateway's id is a number from 1 to 255, not {value:?}")),
    }
}

/// A gateway's own address, where the others pass it datagrams.
pub fn parse_address(value: &str) -> Result<IpAddr, String> {
    value
        .parse()
        .map_err(|_| format!("a gateway's address is an IP address (10.0.1.2), not {value:?}"))
}

/// etcd endpoints, comma- or space-separated, each an http:// or https:// URL.
pub fn parse_endpoints(value: &str) -> Result<Vec<String>, String> {
    let urls: Vec<String> = value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    match urls
        .iter()
        .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
    {
        Some(bad) => Err(format!("an etcd endpoint is an http:// or https:// URL, not {bad:?}")),
        None => Ok(urls),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_endpoints_are_checked() {
        assert_eq!(parse_name("gw-eu.1"), Ok("gw-eu.1".into()));
        assert!(parse_name("a/b").is_err() && parse_name("").is_err());
        assert_eq!(
            parse_endpoints("http://10.0.0.1:2379, https://10.0.0.2:2379").unwrap(),
            ["http://10.0.0.1:2379", "https://10.0.0.2:2379"]
        );
        assert!(parse_endpoints("10.0.0.1:2379").unwrap_err().contains("URL"));
        let s = FleetSettings {
            name: Some("gw".into()),
            ..Default::default()
        };
        assert_eq!(s.prefix().as_deref(), Some("/ordo/fleet/gw/"));
        assert_eq!(s.endpoints(), [DEFAULT_ETCD]);
        assert_eq!(parse_route_table("100"), Ok(Some(100)));
        assert_eq!(parse_route_table("off"), Ok(None));
        assert_eq!(parse_route_table("main"), Ok(Some(254)));
        assert!(parse_route_table("255").is_err() && parse_route_table("local").is_err());
        assert_eq!(parse_gateway("7"), Ok(Some(7)));
        assert!(parse_gateway("0").is_err() && parse_gateway("256").is_err());
        assert!(parse_address("10.0.1.2").is_ok() && parse_address("10.0.1.2:51820").is_err());
    }
}
