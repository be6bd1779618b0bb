//! The wg-quick configuration format: an [Interface] section and [Peer] sections of
//! `Key = Value` lines. Every error names the file, the line and what is wrong.

use crate::settings::{InterfaceSettings, SETTINGS};
use ipnet::IpNet;
use ordo_proto::{PresharedKey, PrivateKey, PublicKey};
use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
        }
    }
}
impl std::error::Error for ConfigError {}

/// Where routes for the allowed IPs go (`Table =`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Table {
    /// The main table (or, for a default route, wg-quick's fwmark policy routing).
    #[default]
    Auto,
    Off,
    Id(u32),
}

pub use crate::inner::InnerKind;

#[derive(Debug, Default)]
pub struct InterfaceSection {
    pub private_key: Option<PrivateKey>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub addresses: Vec<IpNet>,
    pub mtu: Option<u32>,
    pub table: Table,
    pub pre_up: Vec<String>,
    pub post_up: Vec<String>,
    pub pre_down: Vec<String>,
    pub post_down: Vec<String>,
    /// Ordo's data-plane settings (`Model`, `Workers`, `Cores`, `IoCores`, `DeliveryFifo`, `Placement`),
    /// by their command-line names, checked; they override the environment's.
    pub plane: Vec<(&'static str, String)>,
    /// `DNS =`: what `ordo run` resolves names with (`ordo up` leaves it to the host, as
    /// it does not run resolvconf), and the line it was on.
    pub dns: Option<(usize, ordo_attach::Dns)>,
    /// `Inner =` (Ordo's own key), if set.
    pub inner: Option<InnerKind>,
    /// `AttachUsers =` (Ordo's own key): who besides its own user may attach programs to a
    /// stack interface, each entry a user (name or uid) or `@group` (name or gid), with the
    /// line it was on. Resolved when the interface comes up.
    pub attach_users: Vec<(usize, String)>,
    /// Keys wg-quick knows that Ordo accepts but does not act on (SaveConfig).
    pub ignored: Vec<(usize, String)>,
}

#[derive(Debug)]
pub struct PeerSection {
    pub line: usize,
    pub public_key: PublicKey,
    pub preshared_key: Option<PresharedKey>,
    pub allowed_ips: Vec<IpNet>,
    /// As written: host or address, and port. Resolved when the interface comes up.
    pub endpoint: Option<(String, u16)>,
    pub persistent_keepalive: Option<u16>,
}

#[derive(Debug, Default)]
pub struct WgQuickConfig {
    pub interface: InterfaceSection,
    pub peers: Vec<PeerSection>,
}

/// Splits `host:port`, `[v6]:port`; the host may be a name.
pub fn parse_endpoint(v: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        let (h, p) = v.rsplit_once(':')?;
        if h.contains(':') {
            return None; // a bare IPv6 address needs brackets
        }
        (h, p)
    };
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port.parse().ok()?))
}

enum Section {
    None,
    Interface,
    Peer,
}

struct PeerBuilder {
    line: usize,
    public_key: Option<PublicKey>,
    preshared_key: Option<PresharedKey>,
    allowed_ips: Vec<IpNet>,
    endpoint: Option<(String, u16)>,
    persistent_keepalive: Option<u16>,
}

/// Parses the text of a wg-quick file; `file` is only used in error messages.
pub fn parse(text: &str, file: &Path) -> Result<WgQuickConfig, ConfigError> {
    let err = |line: usize, message: String| ConfigError {
        file: file.to_path_buf(),
        line,
        message,
    };
    let mut cfg = WgQuickConfig::default();
    let mut section = Section::None;
    let mut seen_interface = false;
    let mut peer: Option<PeerBuilder> = None;
    let finish = |p: PeerBuilder, cfg: &mut WgQuickConfig| -> Result<(), ConfigError> {
        let public_key = p
            .public_key
            .ok_or_else(|| err(p.line, "[Peer] has no PublicKey".into()))?;
        if cfg.peers.iter().any(|q| q.public_key == public_key) {
            return Err(err(p.line, format!("peer {public_key} appears twice")));
        }
        cfg.peers.push(PeerSection {
            line: p.line,
            public_key,
            preshared_key: p.preshared_key,
            allowed_ips: p.allowed_ips,
            endpoint: p.endpoint,
            persistent_keepalive: p.persistent_keepalive,
        });
        Ok(())
    };

    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            if let Some(p) = peer.take() {
                finish(p, &mut cfg)?;
            }
            match line.to_ascii_lowercase().as_str() {
                "[interface]" => {
                    if seen_interface {
                        return Err(err(n, "a second [Interface] section".into()));
                    }
                    seen_interface = true;
                    section = Section::Interface;
                }
                "[peer]" => {
                    section = Section::Peer;
                    peer = Some(PeerBuilder {
                        line: n,
                        public_key: None,
                        preshared_key: None,
                        allowed_ips: vec![],
                        endpoint: None,
                        persistent_keepalive: None,
                    });
                }
                _ => {
                    return Err(err(
                        n,
                        format!("unknown section {line}; expected [Interface] or [Peer]"),
                    ))
                }
            }
            continue;
        }
        let (key, value) = line
            .split_once('=')
            // Not echoed: a line without '=' may be a key pasted whole, and errors are logged.
            .ok_or_else(|| {
                err(
                    n,
                    format!(
                        "expected Key = Value, found a line of {} characters without '='",
                        line.chars().count()
                    ),
                )
            })?;
        let (key, value) = (key.trim(), value.trim());
        let lower = key.to_ascii_lowercase();
        let list = |v: &str| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let prefixes = |v: &str| -> Result<Vec<IpNet>, ConfigError> {
            list(v)
                .iter()
                .map(|s| {
                    s.parse::<IpNet>()
                        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
                        .map_err(|_| err(n, format!("{key}: {s:?} is not an IP address or prefix")))
                })
                .collect()
        };
        match section {
            Section::None => {
                return Err(err(
                    n,
                    format!("{key} appears before any [Interface] or [Peer] section"),
                ))
            }
            Section::Interface => {
                let iface = &mut cfg.interface;
                match lower.as_str() {
                    "privatekey" => {
                        iface.private_key =
                            Some(PrivateKey::from_base64(value).map_err(|e| err(n, format!("PrivateKey: {e}")))?)
                    }
                    "listenport" => {
                        iface.listen_port = Some(
                            value
                                .parse()
                                .map_err(|_| err(n, format!("ListenPort: {value:?} is not a port (0-65535)")))?,
                        )
                    }
                    "fwmark" => {
                        iface.fwmark = Some(if value == "off" {
                            0
                        } else if let Some(h) = value.strip_prefix("0x") {
                            u32::from_str_radix(h, 16)
                                .map_err(|_| err(n, format!("FwMark: {value:?} is not a number")))?
                        } else {
                            value
                                .parse()
                                .map_err(|_| err(n, format!("FwMark: {value:?} is not a number")))?
                        })
                    }
                    "address" => iface.addresses.extend(prefixes(value)?),
                    "mtu" => {
                        let m: u32 = value
                            .parse()
                            .map_err(|_| err(n, format!("MTU: {value:?} is not a number")))?;
                        if !(576..=65535).contains(&m) {
                            return Err(err(n, format!("MTU: {m} is outside 576..65535")));
                        }
                        iface.mtu = Some(m)
                    }
                    "table" => {
                        iface.table = match value {
                            "off" => Table::Off,
                            "auto" | "main" => Table::Auto,
                            v => Table::Id(
                                v.parse()
                                    .map_err(|_| err(n, format!("Table: {v:?} is not off, auto or a table number")))?,
                            ),
                        }
                    }
                    "preup" => iface.pre_up.push(value.to_string()),
                    "postup" => iface.post_up.push(value.to_string()),
                    "predown" => iface.pre_down.push(value.to_string()),
                    "postdown" => iface.post_down.push(value.to_string()),
                    "dns" => {
                        let more = ordo_attach::Dns::parse(value).map_err(|e| err(n, format!("DNS: {e}")))?;
                        let (_, dns) = iface.dns.get_or_insert_with(|| (n, Default::default()));
                        dns.servers.extend(more.servers);
                        dns.search.extend(more.search);
                    }
                    "saveconfig" => iface.ignored.push((n, key.to_string())),
                    "inner" => iface.inner = Some(value.parse().map_err(|e| err(n, format!("Inner: {e}")))?),
                    "attachusers" => {
                        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                            let name = entry.strip_prefix('@').unwrap_or(entry);
                            let valid = !name.is_empty()
                                && (name.bytes())
                                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'));
                            if !valid {
                                return Err(err(n, format!("AttachUsers: {entry:?} is not a user or @group")));
                            }
                            iface.attach_users.push((n, entry.to_string()));
                        }
                    }
                    _ => match SETTINGS.iter().find(|(_, k, _)| k.eq_ignore_ascii_case(&lower)) {
                        Some((name, k, _)) => {
                            InterfaceSettings::default()
                                .set(name, value)
                                .map_err(|e| err(n, format!("{k}: {e}")))?;
                            iface.plane.push((name, value.to_string()));
                        }
                        None => return Err(err(n, format!("unknown [Interface] key {}", shown_key(key)))),
                    },
                }
            }
            Section::Peer => {
                let p = peer.as_mut().expect("in a peer section");
                match lower.as_str() {
                    "publickey" => {
                        p.public_key =
                            Some(PublicKey::from_base64(value).map_err(|e| err(n, format!("PublicKey: {e}")))?)
                    }
                    "presharedkey" => {
                        p.preshared_key =
                            Some(PresharedKey::from_base64(value).map_err(|e| err(n, format!("PresharedKey: {e}")))?)
                    }
                    "allowedips" => p.allowed_ips.extend(prefixes(value)?),
                    "endpoint" => {
                        p.endpoint =
                            Some(parse_endpoint(value).ok_or_else(|| {
                                err(n, format!("Endpoint: {value:?} is not host:port or [IPv6]:port"))
                            })?)
                    }
                    "persistentkeepalive" => {
                        p.persistent_keepalive = Some(if value == "off" {
                            0
                        } else {
                            value.parse().map_err(|_| {
                                err(
                                    n,
                                    format!("PersistentKeepalive: {value:?} is not off or 0-65535 seconds"),
                                )
                            })?
                        })
                    }
                    _ => return Err(err(n, format!("unknown [Peer] key {}", shown_key(key)))),
                }
            }
        }
    }
    if let Some(p) = peer.take() {
        finish(p, &mut cfg)?;
    }
    if !seen_interface {
        return Err(err(0, "no [Interface] section".into()));
    }
    if cfg.interface.private_key.is_none() {
        return Err(err(0, "[Interface] has no PrivateKey".into()));
    }
    Ok(cfg)
}

/// A key name as an error may show it: quoted if it looks like one (letters, at most 32), else
/// only its length. A base64 key pasted on a line of its own ends in '=' and so parses as a
/// key name, and errors are printed and logged.
fn shown_key(key: &str) -> String {
    if key.len() <= 32 && key.chars().all(|c| c.is_ascii_alphabetic()) {
        format!("{key:?}")
    } else {
        format!("of {} characters (not shown: it may be a secret)", key.chars().count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIV: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const PUB: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

    fn p(text: &str) -> Result<WgQuickConfig, ConfigError> {
        parse(text, Path::new("/etc/wireguard/wg0.conf"))
    }

    /// A key pasted on a line of its own (no "PrivateKey =") is not echoed into the error:
    /// errors are printed and logged.
    #[test]
    fn a_line_without_equals_is_not_echoed() {
        // A base64 key ends in '=': it parses as an unknown key name.
        let e = p(&format!("[Interface]\n{PRIV}\n")).unwrap_err().to_string();
        assert!(e.contains("wg0.conf:2:"), "{e}");
        assert!(!e.contains(&PRIV[..8]), "{e}");
        let e = p("[Interface]\nhunter2hunter2\n").unwrap_err().to_string();
        assert!(e.contains("wg0.conf:2:") && !e.contains("hunter2"), "{e}");
        // A real key name is still named.
        let e = p("[Interface]\nPrivatKey = x\n").unwrap_err().to_string();
        assert!(e.contains("\"PrivatKey\""), "{e}");
    }

    #[test]
    fn parses_every_key() {
        let c = p(&format!(
            "# comment\n[Interface]\nPrivateKey = {PRIV}\nListenPort = 51820\nFwMark = 0x10\n\
             Address = 10.0.0.1/24, fd00::1/64\nMTU = 1400\nTable = off\nPostUp = echo %i # wg-quick strips this too\nDNS = 1.1.1.1\n\
             [Peer]\nPublicKey = {PUB}\nPresharedKey = {PRIV}\nAllowedIPs = 10.0.0.2/32, fd00::2\n\
             Endpoint = vpn.example.com:51820\nPersistentKeepalive = 25\n"
        ))
        .unwrap();
        let i = &c.interface;
        assert_eq!(
            (i.listen_port, i.fwmark, i.mtu, i.table),
            (Some(51820), Some(16), Some(1400), Table::Off)
        );
        assert_eq!(i.addresses.len(), 2);
        assert_eq!(i.post_up, vec!["echo %i".to_string()]);
        assert!(i.ignored.is_empty());
        assert_eq!(
            i.dns.as_ref().map(|(line, d)| (*line, d.format())),
            Some((10, "1.1.1.1".into()))
        );
        let peer = &c.peers[0];
        assert_eq!(
            peer.allowed_ips,
            vec!["10.0.0.2/32".parse::<IpNet>().unwrap(), "fd00::2/128".parse().unwrap()]
        );
        assert_eq!(peer.endpoint, Some(("vpn.example.com".into(), 51820)));
        assert_eq!(peer.persistent_keepalive, Some(25));
    }

    #[test]
    fn dns_and_inner_lines() {
        let c = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\nDNS = 10.0.0.2, corp.example\nDNS = fd00::2\nSaveConfig = true\n"
        ))
        .unwrap();
        let (line, dns) = c.interface.dns.unwrap();
        assert_eq!((line, dns.format()), (3, "10.0.0.2,fd00::2,corp.example".to_string()));
        assert_eq!(c.interface.ignored.len(), 1);
        assert_eq!(c.interface.inner, None);
        let c = p(&format!("[Interface]\nPrivateKey = {PRIV}\nInner = Stack\n")).unwrap();
        assert_eq!(c.interface.inner, Some(InnerKind::Stack));
        let c = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\nAttachUsers = alice, 1001,@staff\n"
        ))
        .unwrap();
        let users: Vec<&str> = c.interface.attach_users.iter().map(|(_, u)| u.as_str()).collect();
        assert_eq!(users, ["alice", "1001", "@staff"]);
        let e = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\nAttachUsers = alice, bob smith\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("AttachUsers: \"bob smith\""), "{e}");
        let e = p(&format!("[Interface]\nPrivateKey = {PRIV}\nInner = tap\n")).unwrap_err();
        assert!(e.line == 3 && e.message.contains("tap"), "{}", e.message);
        let e = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\nDNS = 10.0.0.2, not a name\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("not a name"), "{}", e.message);
    }

    #[test]
    fn errors_name_file_line_and_reason() {
        let e = p(&format!("[Interface]\nPrivateKey = {PRIV}\nListenPort = 99999\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/wireguard/wg0.conf:3: ListenPort: \"99999\" is not a port (0-65535)"
        );
        let e = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\n[Peer]\nAllowedIPs = 10.0.0.0/8\n"
        ))
        .unwrap_err();
        assert_eq!((e.line, e.message.as_str()), (3, "[Peer] has no PublicKey"));
        let e = p("[Interface]\nPrivateKey = nope\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = p(&format!("[Interface]\nPrivateKey = {PRIV}\nBogus = 1\n")).unwrap_err();
        assert!(e.message.contains("Bogus"));
        let e = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\n[Peer]\nPublicKey = {PUB}\nEndpoint = ::1:5\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, 5);
        assert!(p("[Interface]\n").unwrap_err().message.contains("PrivateKey"));
        assert!(p("ListenPort = 1\n").unwrap_err().message.contains("before any"));
    }

    proptest::proptest! {
        /// Any text: a config, or an error that points at a line of it.
        #[test]
        fn never_panics(text in "(\\[(Interface|Peer|x)\\]\n|[A-Za-z]{0,12} ?= ?[-A-Za-z0-9+/=.:,\\[\\]]{0,50}\n|#.*\n){0,12}") {
            if let Err(e) = parse(&text, Path::new("f.conf")) {
                proptest::prop_assert!(e.line <= text.lines().count());
            }
        }
    }

    #[test]
    fn data_plane_settings() {
        let c = p(&format!(
            "[Interface]\nPrivateKey = {PRIV}\nModel = inline\nCores = 0-1\nIoCores = 0\nWorkers = 2\n"
        ))
        .unwrap();
        let got: Vec<(&str, &str)> = c.interface.plane.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("model", "inline"),
                ("cores", "0-1"),
                ("io-cores", "0"),
                ("workers", "2")
            ]
        );
        let e = p(&format!("[Interface]\nPrivateKey = {PRIV}\n\nModel = turbo\n")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/wireguard/wg0.conf:4: Model: unknown model \"turbo\" (pool, inline, threaded or auto)"
        );
        let e = p(&format!("[Interface]\nPrivateKey = {PRIV}\nCores = 3-1\n")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/wireguard/wg0.conf:3: Cores: bad CPU range"),
            "{e}"
        );
    }

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("[fd00::1]:51820"), Some(("fd00::1".into(), 51820)));
        assert_eq!(parse_endpoint("1.2.3.4:1"), Some(("1.2.3.4".into(), 1)));
        assert_eq!(parse_endpoint("host"), None);
        assert_eq!(parse_endpoint(":1"), None);
    }
}
