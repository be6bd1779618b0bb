//! The cross-platform configuration protocol (wireguard.com/xplatform): the text a `set=1`
//! request carries, parsed into a plan before anything is applied, so a request with a bad
//! line changes nothing. Errors carry the errno the protocol replies with.

use crate::secret_text::SecretText;
use ipnet::IpNet;
use ordo_proto::{PresharedKey, PrivateKey, PublicKey};
use std::net::SocketAddr;

/// Replies use negative errno values, as wireguard-go does and `wg` accepts.
pub const EINVAL: i32 = libc::EINVAL;
pub const EPROTO: i32 = libc::EPROTO;
pub const EADDRINUSE: i32 = libc::EADDRINUSE;
pub const EIO: i32 = libc::EIO;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UapiError {
    pub errno: i32,
    pub message: String,
}

impl UapiError {
    pub fn new(errno: i32, message: impl Into<String>) -> Self {
        UapiError {
            errno,
            message: message.into(),
        }
    }
    fn invalid(line: usize, message: impl std::fmt::Display) -> Self {
        UapiError::new(EINVAL, format!("line {line}: {message}"))
    }
    fn protocol(line: usize, message: impl std::fmt::Display) -> Self {
        UapiError::new(EPROTO, format!("line {line}: {message}"))
    }
}

/// The operations a connection may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Get,
    Set,
    /// Ordo's own: the `get` reply plus Ordo's counters (for `ordo show`).
    OrdoGet,
}

pub fn parse_operation(line: &str) -> Option<Operation> {
    match line {
        "get=1" => Some(Operation::Get),
        "set=1" => Some(Operation::Set),
        "ordo_get=1" => Some(Operation::OrdoGet),
        _ => None,
    }
}

/// A change to one allowed IP of a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedIpChange {
    Add(IpNet),
    Remove(IpNet),
}

#[derive(Debug, Clone)]
pub struct PeerPlan {
    pub public_key: PublicKey,
    pub remove: bool,
    pub update_only: bool,
    /// Boxed, like every key a plan or a view holds in a `Vec`: the `Vec` moves its items when
    /// it grows and frees the old buffer as it is, but a box moves only its pointer.
    pub preshared_key: Option<Box<PresharedKey>>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<AllowedIpChange>,
}

impl PeerPlan {
    /// A plan that names the peer and changes nothing yet (adds it if it is new).
    pub fn new(public_key: PublicKey) -> PeerPlan {
        PeerPlan {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// Everything one `set=1` request asks for, in order.
#[derive(Debug, Clone, Default)]
pub struct SetPlan {
    /// Some(None) removes the private key.
    pub private_key: Option<Option<PrivateKey>>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerPlan>,
}

fn parse_bool_true(line: usize, key: &str, v: &str) -> Result<bool, UapiError> {
    match v {
        "true" => Ok(true),
        _ => Err(UapiError::invalid(
            line,
            format!("{key} takes only \"true\", not {v:?}"),
        )),
    }
}

fn parse_num<T: std::str::FromStr>(line: usize, key: &str, v: &str) -> Result<T, UapiError> {
    v.parse()
        .map_err(|_| UapiError::invalid(line, format!("{key}: {v:?} is not a valid number")))
}

fn parse_allowed_ip(line: usize, v: &str) -> Result<AllowedIpChange, UapiError> {
    let (remove, text) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let net: IpNet = text
        .parse()
        .map_err(|_| UapiError::invalid(line, format!("allowed_ip: {v:?} is not an IP prefix")))?;
    Ok(if remove {
        AllowedIpChange::Remove(net.trunc())
    } else {
        AllowedIpChange::Add(net.trunc())
    })
}

/// Parses the key=value lines of a set request (without the `set=1` line and the blank
/// line that ends it).
pub fn parse_set<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<SetPlan, UapiError> {
    let mut plan = SetPlan::default();
    for (i, line) in lines.into_iter().enumerate() {
        let n = i + 2; // line 1 is "set=1"
        let (key, value) = line
            .split_once('=')
            // Not echoed: a line without '=' may be a key pasted whole, and errors are logged.
            .ok_or_else(|| {
                UapiError::protocol(n, format!("not key=value (a line of {} bytes without '=')", line.len()))
            })?;
        match (key, plan.peers.last_mut()) {
            ("private_key", None) => {
                let k = PrivateKey::from_hex(value)
                    .map_err(|_| UapiError::invalid(n, "private_key must be 64 lower-case hex digits"))?;
                plan.private_key = Some((!k.is_zero()).then_some(k));
            }
            ("listen_port", None) => plan.listen_port = Some(parse_num(n, key, value)?),
            ("fwmark", None) => plan.fwmark = Some(parse_num(n, key, value)?),
            ("replace_peers", None) => plan.replace_peers = parse_bool_true(n, key, value)?,
            ("public_key", _) => {
                let public_key = PublicKey::from_hex(value)
                    .map_err(|_| UapiError::invalid(n, "public_key must be 64 lower-case hex digits"))?;
                plan.peers.push(PeerPlan::new(public_key));
            }
            ("private_key" | "listen_port" | "fwmark" | "replace_peers", Some(_)) => {
                return Err(UapiError::protocol(
                    n,
                    format!("{key} is an interface key and must come before the first public_key"),
                ));
            }
            (_, None) => return Err(UapiError::invalid(n, format!("unknown or misplaced key {key:?}"))),
            (_, Some(peer)) => match key {
                "remove" => peer.remove = parse_bool_true(n, key, value)?,
                "update_only" => peer.update_only = parse_bool_true(n, key, value)?,
                "preshared_key" => {
                    peer.preshared_key =
                        Some(Box::new(PresharedKey::from_hex(value).map_err(|_| {
                            UapiError::invalid(n, "preshared_key must be 64 lower-case hex digits")
                        })?))
                }
                "endpoint" => {
                    peer.endpoint = Some(value.parse().map_err(|_| {
                        UapiError::invalid(n, format!("endpoint {value:?} is not IP:port or [IPv6]:port"))
                    })?)
                }
                "persistent_keepalive_interval" => peer.persistent_keepalive = Some(parse_num(n, key, value)?),
                "replace_allowed_ips" => peer.replace_allowed_ips = parse_bool_true(n, key, value)?,
                "allowed_ip" => peer.allowed_ips.push(parse_allowed_ip(n, value)?),
                "protocol_version" => {
                    if value != "1" {
                        return Err(UapiError::invalid(
                            n,
                            format!("protocol_version {value} is not supported (only 1)"),
                        ));
                    }
                }
                _ => return Err(UapiError::invalid(n, format!("unknown peer key {key:?}"))),
            },
        }
    }
    Ok(plan)
}

/// One peer as a `get` reply shows it.
pub struct PeerView {
    pub public_key: PublicKey,
    /// Boxed: see [`PeerPlan::preshared_key`].
    pub preshared_key: Box<PresharedKey>,
    pub endpoint: Option<SocketAddr>,
    pub last_handshake: Option<std::time::SystemTime>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<IpNet>,
}

/// The interface as a `get` reply shows it.
pub struct DeviceView {
    pub private_key: Option<PrivateKey>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerView>,
}

/// Formats a `get` reply body (without the final errno line).
pub fn format_get(d: &DeviceView) -> SecretText {
    use std::fmt::Write;
    // It carries the private key: no copy left behind as it grows, erased when dropped.
    let mut s = SecretText::new();
    if let Some(k) = &d.private_key {
        let _ = writeln!(s, "private_key={}", k.to_hex().as_str());
    }
    let _ = writeln!(s, "listen_port={}", d.listen_port);
    if d.fwmark != 0 {
        let _ = writeln!(s, "fwmark={}", d.fwmark);
    }
    for p in &d.peers {
        let _ = writeln!(s, "public_key={}", p.public_key.to_hex());
        if !p.preshared_key.is_zero() {
            let _ = writeln!(s, "preshared_key={}", p.preshared_key.to_hex().as_str());
        }
        let _ = writeln!(s, "protocol_version=1");
        if let Some(e) = p.endpoint {
            let _ = writeln!(s, "endpoint={e}");
        }
        let (sec, nsec) = p
            .last_handshake
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| (d.as_secs(), d.subsec_nanos()))
            .unwrap_or((0, 0));
        let _ = writeln!(s, "last_handshake_time_sec={sec}");
        let _ = writeln!(s, "last_handshake_time_nsec={nsec}");
        let _ = writeln!(s, "tx_bytes={}", p.tx_bytes);
        let _ = writeln!(s, "rx_bytes={}", p.rx_bytes);
        let _ = writeln!(s, "persistent_keepalive_interval={}", p.persistent_keepalive);
        for a in &p.allowed_ips {
            let _ = writeln!(s, "allowed_ip={a}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
    const K2: &str = "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33";

    #[test]
    fn parses_a_full_request() {
        let req = format!(
            "private_key={K1}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\npublic_key={K2}\n\
             preshared_key={K1}\nendpoint=[abcd:23::33%2]:51820\nreplace_allowed_ips=true\n\
             allowed_ip=192.168.4.4/32\nallowed_ip=-10.0.0.0/8\nprotocol_version=1\n\
             persistent_keepalive_interval=25\npublic_key={K1}\nremove=true"
        );
        let p = parse_set(req.lines()).unwrap();
        let scoped = "[abcd:23::33%2]:51820".parse().unwrap();
        assert_eq!(p.peers[0].endpoint, Some(scoped), "scoped (link-local) endpoints work");
        assert_eq!(p.listen_port, Some(51820));
        assert!(p.replace_peers);
        assert_eq!(p.peers.len(), 2);
        assert_eq!(p.peers[0].persistent_keepalive, Some(25));
        assert_eq!(
            p.peers[0].allowed_ips,
            vec![
                AllowedIpChange::Add("192.168.4.4/32".parse().unwrap()),
                AllowedIpChange::Remove("10.0.0.0/8".parse().unwrap())
            ]
        );
        assert!(p.peers[1].remove);
    }

    #[test]
    fn errors_carry_the_protocols_errno() {
        let e = |s: &str| parse_set(s.lines()).unwrap_err().errno;
        assert_eq!(e("listen_port=abc"), EINVAL);
        assert_eq!(e("listen_port=70000"), EINVAL);
        assert_eq!(e("bogus=1"), EINVAL);
        assert_eq!(e("no equals sign"), EPROTO);
        assert_eq!(e(&format!("public_key={K2}\nlisten_port=1")), EPROTO);
        assert_eq!(e(&format!("public_key={K2}\nallowed_ip=10.0.0.0/33")), EINVAL);
        assert_eq!(e(&format!("public_key={K2}\nprotocol_version=2")), EINVAL);
        assert_eq!(e(&format!("public_key={K2}\nremove=yes")), EINVAL);
        assert_eq!(e("public_key=00"), EINVAL);
        // A key pasted without its "private_key=" is not echoed into the error (errors are
        // logged).
        let pasted = parse_set([K1]).unwrap_err();
        assert_eq!(pasted.errno, EPROTO);
        assert!(!pasted.message.contains(&K1[..8]), "{}", pasted.message);
    }

    proptest::proptest! {
        /// Any text: a plan or an errno, never a panic.
        #[test]
        fn never_panics(lines in proptest::collection::vec("[a-z_]{0,12}=?[-0-9a-f.:/\\[\\]]{0,70}", 0..20)) {
            if let Err(e) = parse_set(lines.iter().map(String::as_str)) {
                proptest::prop_assert!(e.errno == EINVAL || e.errno == EPROTO);
            }
        }
    }

    #[test]
    fn zero_private_key_removes_it() {
        let p = parse_set([format!("private_key={}", "0".repeat(64)).as_str()]).unwrap();
        assert!(matches!(p.private_key, Some(None)));
    }

    #[test]
    fn get_reply_has_every_field() {
        let v = DeviceView {
            private_key: Some(PrivateKey::from_hex(K1).unwrap()),
            listen_port: 51820,
            fwmark: 7,
            peers: vec![PeerView {
                public_key: PublicKey::from_hex(K2).unwrap(),
                preshared_key: Box::default(),
                endpoint: Some("[::1]:9".parse().unwrap()),
                last_handshake: Some(std::time::UNIX_EPOCH + std::time::Duration::new(5, 6)),
                tx_bytes: 1,
                rx_bytes: 2,
                persistent_keepalive: 3,
                allowed_ips: vec!["10.0.0.0/8".parse().unwrap()],
            }],
        };
        let s = format_get(&v);
        for want in [
            &format!("private_key={K1}\n"),
            "listen_port=51820\n",
            "fwmark=7\n",
            &format!("public_key={K2}\n"),
            "endpoint=[::1]:9\n",
            "last_handshake_time_sec=5\nlast_handshake_time_nsec=6\n",
            "tx_bytes=1\nrx_bytes=2\npersistent_keepalive_interval=3\nallowed_ip=10.0.0.0/8\n",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{}", s.as_str());
        }
        assert!(!s.contains("preshared_key"), "a zero psk is not shown");
    }
}
