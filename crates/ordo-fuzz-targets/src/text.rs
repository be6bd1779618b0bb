//! Targets over what operators and tools write: UAPI requests, wg-quick files, CPU lists, and
//! the load generator's packets (what its clients send its sink through the tunnel).

use ordo::host::topology::{format_cpu_list, parse_cpu_list};
use ordo_tools::loadgen::wire::{self, Flow, Header, Kind, MIN_PACKET};
use std::net::Ipv4Addr;

/// Any text as the body of a UAPI `set=1` request: a plan or an errno, never a panic.
pub fn uapi_set(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = ordo::uapi::protocol::parse_set(text.lines()) {
        assert!(e.errno > 0, "an error without an errno: {e:?}");
    }
}

pub fn uapi_set_seeds() -> Vec<Vec<u8>> {
    let key = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
    let peer = "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33";
    vec![
        format!("private_key={key}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n").into_bytes(),
        format!(
            "public_key={peer}\npreshared_key={key}\nendpoint=[abcd:23::33%2]:51820\n\
             replace_allowed_ips=true\nallowed_ip=192.168.4.4/32\nallowed_ip=-10.0.0.0/8\n\
             persistent_keepalive_interval=25\nprotocol_version=1\n"
        )
        .into_bytes(),
        format!("public_key={peer}\nremove=true\npublic_key={peer}\nupdate_only=true\n").into_bytes(),
    ]
}

/// Any text as a wg-quick file: a config, or an error naming a line of it; never a panic.
pub fn wgquick(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = ordo::config::wgquick::parse(text, std::path::Path::new("fuzz.conf")) {
        assert!(e.line <= text.lines().count(), "an error past the last line: {e}");
    }
}

pub fn wgquick_seeds() -> Vec<Vec<u8>> {
    vec![
        b"[Interface]\nPrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\nListenPort = 51820\n\
Address = 10.0.0.1/24, fd00::1/64\nDNS = 10.0.0.53\nMTU = 1420\nTable = auto\nFwMark = 0x51\n\
PostUp = true\nModel = auto\nWorkers = 2\nCores = 0-1\n\n[Peer]\n\
PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n\
PresharedKey = /UwcSPg38hW/D9Y3tcS1FOV0K1wuURMbS0sesJEP5ak=\n\
AllowedIPs = 0.0.0.0/0, ::/0 # everything\nEndpoint = [2001:db8::1]:51820\nPersistentKeepalive = 25\n"
            .to_vec(),
    ]
}

/// Any bytes as a packet reaching the load generator's sink: parsed or refused, and what
/// parses writes back to the same bytes.
pub fn loadgen_wire(data: &[u8]) {
    // No IPv4 packet is longer.
    if data.len() > usize::from(u16::MAX) {
        return;
    }
    let Some((flow, header)) = wire::parse(data) else {
        return;
    };
    let mut again = vec![0u8; data.len()];
    wire::build(&mut again, data.len(), flow, &header);
    assert_eq!(
        wire::parse(&again),
        Some((flow, header)),
        "a parsed packet does not survive a rebuild"
    );
}

pub fn loadgen_wire_seeds() -> Vec<Vec<u8>> {
    let flow = Flow {
        src: Ipv4Addr::new(10, 200, 1, 2),
        sport: 40000,
        dst: Ipv4Addr::new(10, 200, 0, 1),
        dport: 9000,
    };
    [Kind::Data, Kind::Hello, Kind::Request, Kind::Response]
        .into_iter()
        .map(|kind| {
            let header = Header {
                kind,
                client: 7,
                seq: 99,
                sent_ns: 1_000_000,
                rate: 1000,
                size: 1400,
            };
            let mut b = vec![0u8; MIN_PACKET + 8];
            let len = b.len();
            wire::build(&mut b, len, flow, &header);
            b
        })
        .collect()
}

/// Any text as a CPU list (`Cores`, `--cores`): refused, or a sorted set of CPUs that formats
/// and parses back to itself.
pub fn cpu_list(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cpus) = parse_cpu_list(text) else { return };
    assert!(
        cpus.windows(2).all(|w| w[0] < w[1]),
        "not sorted and distinct: {cpus:?}"
    );
    assert_eq!(parse_cpu_list(&format_cpu_list(&cpus)).as_ref(), Ok(&cpus));
}

pub fn cpu_list_seeds() -> Vec<Vec<u8>> {
    vec![b"0-3,8,10-11".to_vec(), b" 1 , 5-5 ,".to_vec()]
}
