//! Every timer of the whitepaper on a fake clock: keepalives, retransmits, the initiation rate
//! limit, rekeying, expiry, erased keys, persistent keepalives, a stepped wall clock.

mod common;

use common::*;

#[test]
fn keepalive_when_data_received_and_nothing_sent() {
    let mut n = established();
    let before = n.wire_from_b.len();
    n.advance(KEEPALIVE_TIMEOUT - Duration::from_millis(1));
    assert_eq!(n.wire_from_b.len(), before);
    n.advance(Duration::from_millis(1));
    let ka = &n.wire_from_b[before];
    assert_eq!((ka[0], ka.len()), (4, 32), "a keepalive is an empty data message");
}

#[test]
fn new_handshake_when_sent_data_goes_unanswered() {
    let mut n = established();
    n.advance(Duration::from_secs(30)); // quiet
    n.a_reachable = false; // B's answers are lost
    n.send(true, b"anyone?");
    let before = n.initiations_from_a();
    n.advance(KEEPALIVE_TIMEOUT + REKEY_TIMEOUT - Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), before);
    n.advance(Duration::from_millis(MAX_JITTER_MS + 1));
    assert_eq!(n.initiations_from_a(), before + 1);
}

#[test]
fn handshake_retransmits_then_gives_up() {
    let mut n = Net::new(None);
    n.b_reachable = false;
    n.send(true, b"x");
    assert_eq!(n.initiations_from_a(), 1);
    n.advance(REKEY_TIMEOUT - Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), 1, "no retry before REKEY_TIMEOUT");
    for _ in 0..200 {
        n.advance(Duration::from_millis(500));
    }
    assert_eq!(
        n.initiations_from_a(),
        1 + MAX_HANDSHAKE_ATTEMPTS as usize,
        "retries stop after REKEY_ATTEMPT_TIME"
    );
    assert_eq!(n.a.peer(n.pa).unwrap().staged_len(), 0, "what waited is dropped");
    assert_eq!(n.a.stats.dropped(DropReason::StagedOverflow), 1);
}

#[test]
fn handshakes_are_rate_limited_to_one_per_rekey_timeout() {
    let mut n = Net::new(None);
    n.b_reachable = false;
    for _ in 0..10 {
        n.send(true, b"x");
        n.now += Duration::from_millis(100);
    }
    assert_eq!(n.initiations_from_a(), 1);
    assert_eq!(n.a.peer(n.pa).unwrap().staged_len(), 10);
}

#[test]
fn initiator_rekeys_after_rekey_after_time_and_responder_does_not() {
    let mut n = established();
    n.send(false, b"confirm");
    n.now += REKEY_AFTER_TIME;
    let (ia, ib) = (n.initiations_from_a(), n.initiations_from_b());
    n.send(false, b"from responder");
    assert_eq!(n.initiations_from_b(), ib, "only the initiator rekeys on time");
    n.send(true, b"from initiator");
    assert_eq!(n.initiations_from_a(), ia + 1);
    assert_eq!(n.a.stats.handshakes_completed, 2);
    assert!(matches!(n.send(true, b"new keys"), Sent::Data { .. }));
    assert_eq!(&n.tun_b.last().unwrap()[20..], b"new keys");
}

/// The wall clock stepped back an hour (or forward) does not lock the initiator out: its next
/// initiation's timestamp is still newer than the last the responder accepted, so the rekey
/// goes through (the responder refused it as a replay for the hour before).
#[test]
fn a_wall_clock_stepped_by_an_hour_does_not_stop_the_rekey() {
    for (step, name) in [(-3600, "back"), (3600, "forward")] {
        let mut n = established();
        n.send(false, b"confirm");
        n.wall_step = step;
        n.now += REKEY_AFTER_TIME;
        n.send(true, b"from initiator");
        assert_eq!(n.a.stats.handshakes_completed, 2, "stepped {name}");
        assert_eq!(
            n.b.stats.drops.get(&DropReason::HandshakeReplay),
            None,
            "stepped {name}"
        );
        assert!(matches!(n.send(true, b"new keys"), Sent::Data { .. }));
        assert_eq!(&n.tun_b.last().unwrap()[20..], b"new keys", "stepped {name}");
    }
}

#[test]
fn receiving_side_of_an_old_initiator_session_rekeys_before_reject() {
    let mut n = established();
    // A initiated. A only receives (B sends) for REJECT - KEEPALIVE - REKEY_TIMEOUT.
    n.now += REKEY_ON_RECEIVE_AGE;
    let ia = n.initiations_from_a();
    n.send(false, b"late");
    assert_eq!(n.initiations_from_a(), ia + 1);
}

#[test]
fn sessions_expire_after_reject_after_time() {
    let mut n = established();
    n.b_reachable = false;
    n.send(true, b"old");
    let old = n.wire_from_a.last().unwrap().clone();
    n.now += REJECT_AFTER_TIME;
    assert_eq!(n.deliver(true, old), Received::Dropped(DropReason::ExpiredSession));
    n.b_reachable = true;
    assert!(
        matches!(n.send(true, b"x"), Sent::Staged(_)),
        "no sending on an expired session"
    );
}

#[test]
fn message_limits_force_rekey_then_refuse() {
    let mut n = established();
    n.a.set_send_counter_for_test(n.pa, REKEY_AFTER_MESSAGES + 1);
    n.now += REKEY_TIMEOUT; // past the handshake rate limit
    let ia = n.initiations_from_a();
    n.send(true, b"x");
    assert_eq!(n.initiations_from_a(), ia + 1, "rekey after 2^60 messages");
    n.a.set_send_counter_for_test(n.pa, REJECT_AFTER_MESSAGES);
    n.b_reachable = false;
    assert!(
        matches!(n.send(true, b"y"), Sent::Staged(_)),
        "no sending past REJECT_AFTER_MESSAGES"
    );
}

#[test]
fn keys_are_erased_after_three_reject_times() {
    let mut n = established();
    let id = n.pa;
    assert!(n.a.peer(id).unwrap().has_session(n.now));
    assert!(n.a.index_count() > 0);
    // Time passes a second at a time (one jump would fire unrelated timers together).
    for _ in 0..(REJECT_AFTER_TIME * 3).as_secs() - 1 {
        n.advance(Duration::from_secs(1));
    }
    assert!(n.a.index_count() > 0, "keys live until 3 x REJECT_AFTER_TIME");
    n.advance(Duration::from_secs(1));
    assert!(!n.a.peer(id).unwrap().has_session(n.now));
    assert_eq!(n.a.index_count(), 0, "all receiver indices are forgotten with the keys");
}

#[test]
fn persistent_keepalive_starts_a_handshake_and_then_keeps_the_path_warm() {
    let mut n = Net::new(None);
    n.a.set_persistent_keepalive(n.pa, 25, n.now);
    n.advance(Duration::from_millis(1));
    assert_eq!(n.a.stats.handshakes_completed, 1, "the first keepalive needs a session");
    let count = |n: &Net| n.wire_from_a.iter().filter(|d| d[0] == 4 && d.len() == 32).count();
    let k0 = count(&n);
    n.advance(Duration::from_secs(25));
    assert_eq!(count(&n), k0 + 1);
    n.advance(Duration::from_secs(25));
    assert_eq!(count(&n), k0 + 2);
}

/// The remote goes away (both directions lost) long enough for the keys to be erased
/// (3 x REJECT_AFTER_TIME), then returns: with PersistentKeepalive the tunnel is back within
/// 30 s with no traffic of our own; without it, with the first packet we send.
#[test]
fn the_tunnel_comes_back_after_the_remote_was_away_for_long() {
    for away in [Duration::from_secs(600), Duration::from_secs(3600)] {
        for keepalive in [true, false] {
            let mut n = established();
            if keepalive {
                n.a.set_persistent_keepalive(n.pa, 25, n.now);
            }
            n.a_reachable = false;
            n.b_reachable = false;
            let until = n.now + away;
            while n.now < until {
                n.advance(Duration::from_secs(1));
            }
            assert!(!n.a.peer(n.pa).unwrap().has_session(n.now), "{away:?}: keys erased");
            n.a_reachable = true;
            n.b_reachable = true;
            let completed = n.a.stats.handshakes_completed;
            if keepalive {
                let back = n.now + Duration::from_secs(30);
                while n.now < back && n.a.stats.handshakes_completed == completed {
                    n.advance(Duration::from_secs(1));
                }
                assert!(
                    n.a.stats.handshakes_completed > completed,
                    "{away:?}: a new session within 30 s"
                );
            }
            let delivered = n.tun_b.len();
            n.send(true, b"back");
            n.advance(Duration::from_millis(1));
            assert_eq!(
                n.tun_b.len(),
                delivered + 1,
                "{away:?}, keepalive {keepalive}: traffic flows"
            );
        }
    }
}

/// A persistent keepalive shorter than REKEY_TIMEOUT with no session: each firing asks for
/// a handshake, most are held back by the one-initiation-per-REKEY_TIMEOUT limit, and it
/// must go on firing all the same (one initiation each REKEY_TIMEOUT), long after the keys
/// were erased.
#[test]
fn a_short_persistent_keepalive_keeps_initiating_after_the_keys_are_erased() {
    let mut n = established();
    n.a.set_persistent_keepalive(n.pa, 1, n.now);
    n.b_reachable = false;
    let until = n.now + REJECT_AFTER_TIME * 3 + Duration::from_secs(120);
    while n.now < until {
        n.advance(Duration::from_secs(1));
    }
    let initiations = |n: &Net| n.wire_from_a.iter().filter(|d| d[0] == 1).count();
    let before = initiations(&n);
    for _ in 0..60 {
        n.advance(Duration::from_secs(1));
    }
    let sent = initiations(&n) - before;
    assert!((10..=12).contains(&sent), "{sent} initiations in a minute");
}

/// A session used up (REJECT_AFTER_MESSAGES) moments after its handshake: the packets that
/// follow wait for a new session, whose initiation the one-per-REKEY_TIMEOUT limit holds
/// back; it goes when the limit ends, without another packet to ask for it, and they arrive.
#[test]
fn packets_staged_while_the_initiation_limit_holds_go_when_it_ends() {
    let mut n = established();
    n.advance(Duration::from_secs(1));
    n.a.set_send_counter_for_test(n.pa, REJECT_AFTER_MESSAGES - 1);
    let delivered = n.tun_b.len();
    n.send(true, b"the last on the old session");
    n.send(true, b"waits");
    n.send(true, b"waits too");
    assert_eq!(n.tun_b.len(), delivered + 1, "the old session's last");
    let completed = n.a.stats.handshakes_completed;
    n.advance(REKEY_TIMEOUT);
    assert_eq!(
        n.a.stats.handshakes_completed,
        completed + 1,
        "a new session, once the limit ended"
    );
    assert_eq!(n.tun_b.len(), delivered + 3, "the staged packets, on it");
}
