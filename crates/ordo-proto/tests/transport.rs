//! Two cores through a fake network: the handshake, data both ways, padding, replays and
//! tampering, runs of opened messages, allowed IPs, roaming, a new private key.

mod common;

use common::*;

#[test]
fn handshake_then_data_both_ways() {
    let mut n = established();
    assert_eq!(&n.tun_b[0][20..], b"hello");
    assert!(
        matches!(n.send(false, b"world"), Sent::Data { .. }),
        "the responder's session is confirmed"
    );
    assert_eq!(&n.tun_a[0][20..], b"world");
    assert_eq!(n.a.stats.handshakes_completed, 1);
    assert_eq!(n.b.stats.handshakes_completed, 1);
    assert!(n.a.peer(n.pa).unwrap().last_handshake.is_some());
    let (a, b) = (n.a.peer(n.pa).unwrap(), n.b.peer(n.pb).unwrap());
    assert_eq!(a.tx_bytes, b.rx_bytes, "both ends count the same bytes");
    assert_eq!(a.rx_bytes, b.tx_bytes);
}

#[test]
fn preshared_key_must_match() {
    let mut n = Net::new(Some(PresharedKey::from_bytes([7; 32])));
    n.send(true, b"x");
    assert_eq!(n.tun_b.len(), 1);
    let mut n = Net::new(None);
    n.b.set_preshared_key(n.pb, PresharedKey::from_bytes([7; 32]));
    n.send(true, b"x");
    assert!(n.tun_b.is_empty());
    assert_eq!(
        n.a.stats.dropped(DropReason::HandshakeDecrypt),
        1,
        "A cannot open B's response"
    );
}

#[test]
fn data_is_padded_to_16_and_trimmed_on_arrival() {
    let mut n = established();
    n.send(true, b"abc"); // 23-byte packet
    let last = n.wire_from_a.last().unwrap();
    assert_eq!(last.len(), 16 + 32 + 16, "23 bytes pad to 32");
    assert_eq!(n.tun_b.last().unwrap().len(), 23);
}

#[test]
fn replayed_data_is_dropped() {
    let mut n = established();
    n.send(true, b"once");
    let copy = n.wire_from_a.last().unwrap().clone();
    assert_eq!(n.deliver(true, copy), Received::Dropped(DropReason::Replay));
    assert_eq!(n.tun_b.len(), 2);
}

#[test]
fn tampered_data_is_dropped_and_does_not_move_the_window() {
    let mut n = established();
    n.b_reachable = false;
    n.send(true, b"real");
    n.b_reachable = true;
    let real = n.wire_from_a.last().unwrap().clone();
    let mut forged = real.clone();
    *forged.last_mut().unwrap() ^= 1;
    assert_eq!(n.deliver(true, forged), Received::Dropped(DropReason::DecryptFailed));
    assert!(
        matches!(n.deliver(true, real), Received::Packet { .. }),
        "the authentic packet still arrives"
    );
}

/// The data plane's path: messages opened outside the core, accepted as one run. Each gets
/// its own verdict in order (replay window, allowed IPs, keepalive), the drops are counted
/// by reason, and the peer's part is done once: the endpoint roams to the run's last source,
/// the bytes of every authentic message are counted.
#[test]
fn a_run_of_opened_messages_gets_a_verdict_each() {
    let mut n = established();
    // A seals; nothing reaches B but through the run below.
    let seal = |n: &mut Net, src: [u8; 4], payload: &[u8]| {
        let (now, wall) = (n.now, n.wall());
        if payload.is_empty() {
            n.a.send_keepalive(n.pa, now, wall);
            return n.a.poll_transmit().expect("a keepalive").payload;
        }
        let packet = ipv4(src, [10, 0, 0, 2], payload);
        let mut out = vec![0u8; packet.len() + SEND_HEADROOM];
        let Sent::Data { len, .. } = n.a.send(now, wall, &packet, &mut out) else {
            panic!("A has a session");
        };
        out.truncate(len);
        out
    };
    let mut good = seal(&mut n, [10, 0, 0, 1], b"fresh");
    let mut replayed = n.wire_from_a.last().unwrap().clone(); // "hello", delivered before
    let mut keepalive = seal(&mut n, [10, 0, 0, 1], b"");
    let mut spoofed = seal(&mut n, [10, 9, 9, 9], b"spoof");
    let (id, session) = n.b.receiving_session(DataHeader::parse(&good).receiver).unwrap();
    let roamed: SocketAddr = "198.51.100.7:4242".parse().unwrap();
    let rx_before = n.b.peer(n.pb).unwrap().rx_bytes;
    let drops_before = n.b.stats.dropped(DropReason::Replay);
    let mut opened = Vec::new();
    for m in [&mut good, &mut replayed, &mut keepalive, &mut spoofed] {
        let (counter, len) = session.open_in_place(m).unwrap();
        opened.push((counter, m.len(), len));
    }
    let bufs = [&good, &replayed, &keepalive, &spoofed];
    let moved: SocketAddr = "198.51.100.6:4242".parse().unwrap();
    let sources = [moved, moved, moved, roamed];
    let messages = opened
        .iter()
        .zip(bufs)
        .zip(sources)
        .map(|((&(counter, datagram_len, len), buf), src)| OpenedMessage {
            counter,
            src,
            datagram_len,
            plain: &buf[DATA_HEADER_LEN..DATA_HEADER_LEN + len],
        });
    let mut verdicts = Vec::new();
    let (now, wall) = (n.now, n.wall());
    n.b.accept_data_run(now, wall, id, &session, messages, |v| verdicts.push(v));
    assert_eq!(
        verdicts,
        vec![
            Ok(Accepted::Packet { len: 25 }),
            Err(DropReason::Replay),
            Ok(Accepted::Keepalive),
            Err(DropReason::AllowedIpsMismatch),
        ]
    );
    assert_eq!(n.b.stats.dropped(DropReason::Replay), drops_before + 1);
    assert_eq!(n.b.stats.dropped(DropReason::AllowedIpsMismatch), 1);
    let peer = n.b.peer(n.pb).unwrap();
    assert_eq!(peer.endpoint, Some(roamed), "the run's last source is the endpoint");
    let authentic = (good.len() + keepalive.len() + spoofed.len()) as u64;
    assert_eq!(
        peer.rx_bytes - rx_before,
        authentic,
        "every authentic message is counted"
    );
}

#[test]
fn inner_source_must_be_an_allowed_ip() {
    let mut n = established();
    n.b.clear_allowed_ips(n.pb);
    n.b.add_allowed_ip(n.pb, "10.9.9.9/32".parse().unwrap());
    n.send(true, b"spoof");
    assert_eq!(n.b.stats.dropped(DropReason::AllowedIpsMismatch), 1);
    assert_eq!(n.tun_b.len(), 1);
}

#[test]
fn no_route_and_no_endpoint_are_counted() {
    let mut n = established();
    let mut out = vec![0u8; 100];
    let p = ipv4([10, 0, 0, 1], [10, 5, 5, 5], b"");
    assert_eq!(
        n.a.send(n.now, n.wall(), &p, &mut out),
        Sent::Dropped(DropReason::NoRoute)
    );
    assert_eq!(
        n.a.send(n.now, n.wall(), b"\x45\x00", &mut out),
        Sent::Dropped(DropReason::OutgoingMalformed)
    );
}

#[test]
fn replayed_initiation_is_refused() {
    let mut n = established();
    let init = n.wire_from_a.iter().find(|d| d[0] == 1).unwrap().clone();
    n.advance(Duration::from_secs(1));
    assert_eq!(n.deliver(true, init), Received::Dropped(DropReason::HandshakeReplay));
}

#[test]
fn roaming_follows_the_latest_authentic_source() {
    let mut n = established();
    n.addr_a = "198.51.100.7:4000".parse().unwrap();
    // B's replies now go to the new address; the fake network asserts that.
    n.send(true, b"from a new address");
    assert_eq!(n.b.peer(n.pb).unwrap().endpoint, Some(n.addr_a));
    n.send(false, b"reply");
    assert_eq!(n.tun_a.len(), 1);
}

#[test]
fn forged_datagrams_never_change_the_endpoint() {
    let mut n = established();
    let mut junk = vec![4u8, 0, 0, 0];
    junk.extend_from_slice(&[0u8; 60]);
    let before = n.b.peer(n.pb).unwrap().endpoint;
    let evil: SocketAddr = "203.0.113.66:1".parse().unwrap();
    let r = n.b.receive(n.now, n.wall(), evil, &mut junk);
    assert!(matches!(r, Received::Dropped(_)));
    assert_eq!(n.b.peer(n.pb).unwrap().endpoint, before);
}

#[test]
fn changing_the_private_key_drops_sessions() {
    let mut n = established();
    n.a.set_private_key(Some(PrivateKey::from_bytes([0x33; 32])));
    assert!(!n.a.peer(n.pa).unwrap().has_session(n.now));
    assert_eq!(n.a.index_count(), 0);
}
