//! Receiver indices steer a peer's datagrams to its queue; the two ends of a tunnel start on
//! different queues; a moved peer is rekeyed.

mod common;

use common::*;

/// Steering (steering.rs): every message B sends A (data, responses) carries a receiver index
/// that steers to the queue A assigned to B; moving B to another queue starts a handshake
/// whose session steers to the new one.
#[test]
fn receiver_indices_steer_to_the_peers_queue() {
    use ordo_proto::steering::queue_of_message;
    let mut n = Net::new(None);
    n.a.set_queues(4);
    assert!(n.a.set_peer_queue(n.pa, 2, n.now, n.wall()));
    n.send(true, b"one");
    n.send(false, b"two");
    assert_eq!(n.tun_a.len(), 1);
    let steered: Vec<Option<u32>> = n.wire_from_b.iter().map(|d| queue_of_message(d, 4)).collect();
    assert!(!steered.is_empty());
    assert!(steered.iter().all(|q| *q == Some(2)), "{steered:?}");

    n.advance(REKEY_TIMEOUT + Duration::from_millis(1));
    let before = n.initiations_from_a();
    let sent_before = n.wire_from_b.len();
    assert!(n.a.set_peer_queue(n.pa, 1, n.now, n.wall()));
    n.pump();
    assert_eq!(n.initiations_from_a(), before + 1, "moving the peer starts a handshake");
    n.send(true, b"three");
    n.send(false, b"four");
    assert_eq!(n.tun_a.len(), 2);
    let after: Vec<Option<u32>> = n.wire_from_b[sent_before..]
        .iter()
        .map(|d| queue_of_message(d, 4))
        .collect();
    assert!(after.iter().all(|q| *q == Some(1)), "{after:?}");
    assert!(!n.a.set_peer_queue(PeerId(999), 0, n.now, n.wall()));

    // New peers are spread over the queues round robin (from a random start).
    let queues: Vec<u32> = (0..6u8)
        .map(|i| {
            let id =
                n.a.add_peer(PrivateKey::from_bytes([0x40 + i; 32]).public_key())
                    .unwrap();
            n.a.peer(id).unwrap().queue
        })
        .collect();
    let expected: Vec<u32> = (0..6).map(|k| (queues[0] + k) % 4).collect();
    assert_eq!(queues, expected);
    // The start is random: sixteen interfaces of one peer each do not all use queue 0.
    let firsts: std::collections::BTreeSet<u32> = (0..16u64)
        .map(|seed| {
            let mut i = Interface::with_rng(n.now, ChaCha20Rng::seed_from_u64(seed));
            i.set_queues(2);
            let id = i.add_peer(PrivateKey::from_bytes([0x50; 32]).public_key()).unwrap();
            i.peer(id).unwrap().queue
        })
        .collect();
    assert_eq!(firsts.len(), 2, "both queues are used");
}

/// The two ends of a tunnel, configured each with the other as its first peer, take
/// different queues (of two): when they share a machine they start on different cores. Over
/// many tunnels both queues are used alike.
#[test]
fn the_two_ends_of_a_tunnel_start_on_different_queues() {
    let now = Instant::now();
    let mut first_queues = [0u32; 2];
    for seed in 1..=64u8 {
        let keys = [
            PrivateKey::from_bytes([seed; 32]),
            PrivateKey::from_bytes([seed ^ 0x80; 32]),
        ];
        let ends: Vec<u32> = (0..2)
            .map(|k| {
                let mut end = Interface::with_rng(now, ChaCha20Rng::seed_from_u64(seed as u64 * 2 + k as u64));
                end.set_queues(2);
                end.set_private_key(Some(keys[k].clone()));
                let peer = end.add_peer(keys[1 - k].public_key()).unwrap();
                let queue = end.peer(peer).unwrap().queue;
                // Only the first peer ever: one removed and added again takes the next queue.
                end.remove_peer(peer);
                let again = end.add_peer(keys[1 - k].public_key()).unwrap();
                assert_eq!(end.peer(again).unwrap().queue, (queue + 1) % 2);
                queue
            })
            .collect();
        assert_ne!(ends[0], ends[1], "tunnel {seed}");
        first_queues[ends[0] as usize] += 1;
    }
    assert!(first_queues.iter().all(|&n| n >= 16), "{first_queues:?}");
}

/// A peer moved right after a handshake (the placement acts as soon as traffic shows its
/// load) cannot initiate at once (one initiation per REKEY_TIMEOUT): the handshake that
/// moves its index comes when the limit allows, not at the next rekey two minutes later.
#[test]
fn a_peer_moved_during_the_rate_limit_is_rekeyed_when_it_ends() {
    use ordo_proto::steering::{queue_of_index, queue_of_message};
    let mut n = Net::new(None);
    n.a.set_queues(2);
    assert!(n.a.set_peer_queue(n.pa, 0, n.now, n.wall()));
    n.send(true, b"one");
    assert_eq!(n.tun_b.len(), 1, "the first handshake is done");
    assert_eq!(
        n.a.steering_overrides(),
        vec![],
        "every index steers to its peer's queue"
    );
    let before = n.initiations_from_a();
    n.advance(Duration::from_secs(1));
    assert!(n.a.set_peer_queue(n.pa, 1, n.now, n.wall()));
    n.pump();
    assert_eq!(n.initiations_from_a(), before, "still inside the rate limit");
    // Until then the device steers the session's index, of queue 0, to queue 1 by exception
    // (the kernel UDP port's steer.rs).
    let overrides = n.a.steering_overrides();
    assert_eq!(overrides.len(), 1, "{overrides:?}");
    assert_eq!((queue_of_index(overrides[0].receiver, 2), overrides[0].queue), (0, 1));
    n.advance(REKEY_TIMEOUT - Duration::from_secs(1) - Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), before, "not before the limit ends");
    n.advance(Duration::from_millis(1));
    assert_eq!(n.initiations_from_a(), before + 1, "the move's handshake");
    let sent_before = n.wire_from_b.len();
    n.send(false, b"two");
    assert_eq!(n.tun_a.len(), 1);
    let after: Vec<Option<u32>> = n.wire_from_b[sent_before..]
        .iter()
        .map(|d| queue_of_message(d, 2))
        .collect();
    assert_eq!(after, vec![Some(1)]);
    // Nothing more is owed: no further initiation on the next ticks.
    n.advance(REKEY_TIMEOUT * 2);
    assert_eq!(n.initiations_from_a(), before + 1);
}
