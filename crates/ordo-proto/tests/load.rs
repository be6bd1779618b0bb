//! Under load: initiation floods, cookie replies and mac2, what counts toward load, initiations
//! opened in steps.

mod common;

use common::*;

#[test]
fn initiation_flood_is_refused_within_20ms() {
    let mut n = Net::new(None);
    n.b_reachable = false;
    n.send(true, b"x");
    let first = n.wire_from_a[0].clone();
    n.b_reachable = true;
    assert!(matches!(n.deliver(true, first), Received::Handshake(_)));
    // A second, newer initiation 1 ms later (built by a fresh A with the same keys).
    let mut n2 = Net::new(None);
    n2.now = n.now;
    n2.b_reachable = false;
    n.now += Duration::from_millis(1);
    n2.now = n.now + Duration::from_secs(1); // newer timestamp
    n2.send(true, b"x");
    let second = n2.wire_from_a[0].clone();
    assert_eq!(n.deliver(true, second), Received::Dropped(DropReason::HandshakeFlood));
}

#[test]
fn cookie_under_load_then_mac2_accepted() {
    let mut n = Net::new(None);
    n.b.force_under_load = true;
    n.send(true, b"x");
    assert_eq!(n.b.stats.cookie_replies_sent, 1);
    assert_eq!(n.a.stats.cookie_replies_accepted, 1);
    assert!(n.tun_b.is_empty());
    n.advance(REKEY_TIMEOUT + Duration::from_millis(MAX_JITTER_MS));
    assert_eq!(n.tun_b.len(), 1, "the retry carries mac2 and completes");
    assert_eq!(n.b.stats.cookie_replies_sent, 1);
}

/// Handshake messages that anyone can send without a key (a wrong mac1) do not put the
/// interface under load, so a peer's handshake needs no cookie round; those that pass mac1
/// count, past UNDER_LOAD_HANDSHAKES_PER_SECOND in a second.
#[test]
fn only_handshakes_that_pass_mac1_count_toward_load() {
    use ordo_proto::interface::UNDER_LOAD_HANDSHAKES_PER_SECOND;
    use ordo_proto::messages::INITIATION_LEN;
    let mut n = Net::new(None);
    let evil: SocketAddr = "203.0.113.66:1".parse().unwrap();
    let mut junk = vec![1u8, 0, 0, 0];
    junk.resize(INITIATION_LEN, 0x5a);
    for _ in 0..UNDER_LOAD_HANDSHAKES_PER_SECOND + 50 {
        let r = n.b.receive(n.now, n.wall(), evil, &mut junk.clone());
        assert_eq!(r, Received::Dropped(DropReason::BadMac1));
    }
    assert!(!n.b.under_load(n.now), "junk does not count");
    n.send(true, b"x");
    assert_eq!(n.b.stats.cookie_replies_sent, 0, "no cookie round");
    assert_eq!(n.tun_b.len(), 1, "the first handshake completes");

    // A's genuine initiation, replayed: each passes mac1 (and is then refused as a replay).
    let mut m = Net::new(None);
    m.b_reachable = false;
    m.send(true, b"lost");
    let initiation = m.wire_from_a.last().unwrap().clone();
    assert_eq!(initiation.len(), INITIATION_LEN);
    for i in 0..=UNDER_LOAD_HANDSHAKES_PER_SECOND {
        assert!(!m.b.under_load(m.now), "not yet, after {i}");
        m.b.receive(m.now, m.wall(), evil, &mut initiation.clone());
    }
    assert!(m.b.under_load(m.now), "one over the rate, all with a valid mac1");
}

/// Under load, initiations with a valid mac1 and no mac2 (anyone who knows B's public key
/// can make them) get cookie replies at a source's rate and no more (COOKIE_REPLIES: a burst
/// of 64, then 100 a second); the rest are dropped as rate limited. Another source still gets its cookie, and
/// a peer that answers it completes its handshake.
#[test]
fn cookie_replies_are_rate_limited_per_source() {
    let mut n = Net::new(None);
    n.b.force_under_load = true;
    // A's initiation, which B cannot answer (A never hears back): a valid mac1, no mac2.
    n.b_reachable = false;
    n.send(true, b"lost");
    n.b_reachable = true;
    let initiation = n.wire_from_a.last().unwrap().clone();
    let evil: SocketAddr = "203.0.113.66:1".parse().unwrap();
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..1000 {
        let r = n.b.receive(n.now, n.wall(), evil, &mut initiation.clone());
        *outcomes.entry(format!("{r:?}")).or_insert(0) += 1;
    }
    assert_eq!(outcomes["CookieSent"], 64, "{outcomes:?}");
    assert_eq!(outcomes["Dropped(RateLimited)"], 936, "{outcomes:?}");
    n.now += Duration::from_millis(100);
    let sent = (0..1000)
        .filter(|_| n.b.receive(n.now, n.wall(), evil, &mut initiation.clone()) == Received::CookieSent)
        .count();
    assert_eq!(sent, 10, "100 a second");
    n.now += Duration::from_secs(1);
    let sent = (0..1000)
        .filter(|_| n.b.receive(n.now, n.wall(), evil, &mut initiation.clone()) == Received::CookieSent)
        .count();
    assert_eq!(sent, 64, "refilled to the burst, no more");
    let before = n.b.stats.cookie_replies_sent;
    let other: SocketAddr = "203.0.113.67:1".parse().unwrap();
    assert_eq!(
        n.b.receive(n.now, n.wall(), other, &mut initiation.clone()),
        Received::CookieSent
    );
    assert_eq!(n.b.stats.cookie_replies_sent, before + 1);
    while n.b.poll_transmit().is_some() {}
    // The genuine peer still gets through: its retry gets a cookie, the next carries mac2.
    let replies = n.b.stats.cookie_replies_sent;
    for _ in 0..2 {
        n.advance(REKEY_TIMEOUT + Duration::from_millis(MAX_JITTER_MS));
    }
    assert_eq!(n.b.stats.cookie_replies_sent, replies + 1);
    assert_eq!(n.tun_b.len(), 1, "the staged packet, on A's new session");
}

/// Under load, a source that answers cookies (a valid mac2) has a second's worth of
/// handshakes computed (HANDSHAKES: 20), then none until its bucket refills: the rest are
/// refused before their mac2 is computed. A forger of its address with a made-up mac2 gets
/// cookie replies at most, and spends none of its handshakes.
#[test]
fn mac2_floods_stop_at_the_handshake_rate_and_forgers_spend_none_of_it() {
    let mut n = Net::new(None);
    n.b.force_under_load = true;
    n.send(true, b"x");
    assert_eq!(n.a.stats.cookie_replies_accepted, 1, "A holds a cookie");
    // A's retry carries a mac2; B does not hear it.
    n.b_reachable = false;
    n.advance(REKEY_TIMEOUT + Duration::from_millis(MAX_JITTER_MS));
    n.b_reachable = true;
    let stamped = n.wire_from_a.last().unwrap().clone();
    assert!(stamped[0] == 1 && ordo_proto::cookie::carries_mac2(&stamped));
    let mut forged = stamped.clone();
    *forged.last_mut().unwrap() ^= 1;
    let outcomes = |n: &mut Net, msg: &[u8], times: usize| {
        let mut o = std::collections::BTreeMap::new();
        for _ in 0..times {
            let r = n.b.receive(n.now, n.wall(), n.addr_a, &mut msg.to_vec());
            *o.entry(format!("{r:?}")).or_insert(0) += 1;
        }
        while n.b.poll_transmit().is_some() {}
        o
    };
    let o = outcomes(&mut n, &forged, 1000);
    assert_eq!(o.get("CookieSent"), Some(&64), "{o:?}");
    assert_eq!(o.get("Dropped(RateLimited)"), Some(&936), "{o:?}");
    let o = outcomes(&mut n, &stamped, 1);
    assert!(
        o.keys().all(|k| k.starts_with("Handshake")),
        "the genuine one passes: {o:?}"
    );
    // Replays of it: each computed (and refused as a replay) until the bucket is empty.
    let o = outcomes(&mut n, &stamped, 100);
    assert_eq!(o.get("Dropped(HandshakeReplay)"), Some(&19), "{o:?}");
    assert_eq!(o.get("Dropped(RateLimited)"), Some(&81), "{o:?}");
}

/// An initiation in steps (as the data plane handles it, the Diffie-Hellman without the
/// interface) completes the handshake as `receive` does; if the peer goes, or our key
/// changes, while it is opened, it is dropped and counted for that reason.
#[test]
fn an_initiation_in_steps_completes_or_is_dropped_for_what_changed_meanwhile() {
    use ordo_proto::interface::HandshakeStep;
    let initiation = |n: &mut Net| {
        n.b_reachable = false;
        n.send(true, b"x");
        n.b_reachable = true;
        n.wire_from_a.last().unwrap().clone()
    };
    let begin = |n: &mut Net, mut msg: Vec<u8>| match n.b.begin_handshake(n.now, n.wall(), n.addr_a, &mut msg) {
        HandshakeStep::Initiation(p) => p,
        HandshakeStep::Done(r) => panic!("not pending: {r:?}"),
    };

    let mut n = Net::new(None);
    let msg = initiation(&mut n);
    let p = begin(&mut n, msg);
    let opened = p.open(|k| n.b.static_static_of(k));
    assert_eq!(
        n.b.complete_initiation(n.now, n.wall(), p, opened),
        Received::Handshake(n.pb)
    );
    n.pump();
    assert!(n.a.peer(n.pa).unwrap().has_session(n.now), "A got the response");

    let mut n = Net::new(None);
    let msg = initiation(&mut n);
    let p = begin(&mut n, msg);
    let opened = p.open(|k| n.b.static_static_of(k));
    n.b.remove_peer(n.pb);
    let r = n.b.complete_initiation(n.now, n.wall(), p, opened);
    assert_eq!(r, Received::Dropped(DropReason::UnknownPeer));
    assert_eq!(n.b.stats.drops[&DropReason::UnknownPeer], 1);

    let mut n = Net::new(None);
    let msg = initiation(&mut n);
    let p = begin(&mut n, msg);
    let opened = p.open(|k| n.b.static_static_of(k));
    n.b.set_private_key(Some(PrivateKey::from_bytes([0x44; 32])));
    let r = n.b.complete_initiation(n.now, n.wall(), p, opened);
    assert_eq!(r, Received::Dropped(DropReason::BadMac1), "made for the key we had");
    assert!(n.b.poll_transmit().is_none(), "no response");
}
