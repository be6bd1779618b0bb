//! The attach protocol (`ordo_attach`): what an application's preload library sends the stack
//! service, and what the service answers. The service reads requests from applications it
//! does not trust; the library reads replies and its environment.

use ordo_attach::{parse_routes, through_tunnel, Reply, Request, REPLY_LEN, REQUEST_LEN};

/// Any bytes as a request, a reply and a route list: a message or an error, never a panic;
/// a decoded message encodes back to the same bytes (nothing is read that is not kept).
pub fn run(data: &[u8]) {
    if let Ok(r) = Request::decode(data) {
        let again = Request::decode(&r.encode()).expect("an encoded request decodes");
        assert_eq!(again, r);
    }
    if let Ok(r) = Reply::decode(data) {
        assert_eq!(Reply::decode(&r.encode()), Ok(r));
    }
    if let Ok(a) = ordo_attach::Accepted::decode(data) {
        assert_eq!(ordo_attach::Accepted::decode(&a.encode()), Ok(a));
    }
    // A datagram's header on an unconnected UDP socket, either way, with the marker the
    // input starts with.
    if let Ok(src) = ordo_attach::Source::decode(data) {
        assert_eq!(ordo_attach::Source::decode(&src.encode()), Ok(src));
    }
    if let Some(marker) = data.get(..ordo_attach::MARKER_LEN) {
        let marker: [u8; ordo_attach::MARKER_LEN] = marker.try_into().expect("the marker's length");
        if let Some(Ok(h)) = ordo_attach::SendHeader::decode(marker, data) {
            assert_eq!(ordo_attach::SendHeader::decode(marker, &h.encode(marker)), Some(Ok(h)));
        }
    }
    // The first bytes of any input, padded or cut to a message's size, reach the fields.
    let mut req = [0u8; REQUEST_LEN];
    let n = data.len().min(REQUEST_LEN);
    req[..n].copy_from_slice(&data[..n]);
    req[..4].copy_from_slice(b"ORDA");
    req[4] = ordo_attach::VERSION;
    let _ = Request::decode(&req);
    let mut rep = [0u8; REPLY_LEN];
    let n = data.len().min(REPLY_LEN);
    rep[..n].copy_from_slice(&data[..n]);
    rep[..4].copy_from_slice(b"ORDA");
    rep[4] = ordo_attach::VERSION;
    let _ = Reply::decode(&rep);
    if let Ok(text) = std::str::from_utf8(data) {
        let routes = parse_routes(text);
        for r in &routes {
            assert!(
                through_tunnel(&routes, r.addr) || r.addr.is_loopback() || r.addr.is_unspecified() || {
                    // An IPv4-mapped IPv6 route is matched by its IPv4 address, not itself.
                    matches!(r.addr, std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())
                }
            );
        }
    }
}

pub fn seeds() -> Vec<Vec<u8>> {
    let request = Request {
        op: ordo_attach::Op::ConnectTcp,
        addr: "10.99.0.2:8000".parse().expect("an address"),
        nonblocking: Some(ordo_attach::Filler {
            filler: 4608,
            sndbuf: 212992,
        }),
        v6_only: false,
    };
    let reply = Reply {
        errno: 0,
        local: Some("[fd99::1]:49152".parse().expect("an address")),
        remote: Some("[fd99::2]:8000".parse().expect("an address")),
        marker: None,
    };
    let marker = *b"ordo-mk!";
    let mut send = ordo_attach::SendHeader::To("10.99.0.2:53".parse().expect("an address"))
        .encode(marker)
        .to_vec();
    send.extend_from_slice(b"payload");
    vec![
        request.encode().to_vec(),
        reply.encode().to_vec(),
        send,
        ordo_attach::Source("[fd99::2]:53".parse().expect("an address"))
            .encode()
            .to_vec(),
        b"10.99.0.0/24,fd99::/64,0.0.0.0/0".to_vec(),
    ]
}
