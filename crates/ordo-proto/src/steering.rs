//! Steering: which receive queue a message belongs on, read from the message itself.
//!
//! In the inline model every core has its own UDP socket and a peer's packets must arrive on
//! the core assigned to the peer. The kernel picks the socket by running a small program over
//! each datagram (the kernel UDP port's `steer.rs`); that program can read the message but not
//! look anything up, so the assignment is written into the one field we choose and the peer
//! echoes: our receiver index. Its low byte, modulo the number of queues, names the queue.
//! Changing a peer's queue takes effect by the rule with its next session (the core starts a
//! handshake); until then the device steers the peer's older indices by exception
//! (`Interface::steering_overrides`).

use crate::messages::{TYPE_COOKIE_REPLY, TYPE_DATA, TYPE_RESPONSE};

/// A receiver index steered to another queue than its own by the rule: a moved peer's index,
/// until its sessions of before the move are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SteeringException {
    pub receiver: u32,
    pub queue: u32,
}

/// Most queues the scheme can tell apart (one byte of the index).
pub const MAX_QUEUES: u32 = 256;

/// The queue our receiver index `index` steers to, among `queues`.
pub fn queue_of_index(index: u32, queues: u32) -> u32 {
    (index & 0xff) % queues.clamp(1, MAX_QUEUES)
}

/// Rewrites the low byte of a random index so that it steers to `queue` of `queues`, keeping
/// the byte as uniform as the modulus allows.
pub fn index_for_queue(random: u32, queue: u32, queues: u32) -> u32 {
    let queues = queues.clamp(1, MAX_QUEUES);
    let queue = queue % queues;
    let low = random & 0xff;
    let mut byte = low - low % queues + queue;
    if byte > 0xff {
        byte -= queues;
    }
    (random & !0xff) | byte
}

/// The offset of our receiver index in a message the peer sends us, by its type: data and
/// cookie replies carry it at 4, handshake responses at 8 (after the peer's sender index).
/// Initiations carry only the peer's own index: any queue may take them.
pub fn receiver_offset(message_type: u8) -> Option<usize> {
    match message_type {
        TYPE_DATA | TYPE_COOKIE_REPLY => Some(4),
        TYPE_RESPONSE => Some(8),
        _ => None,
    }
}

/// Our receiver index in a datagram a peer sent us: None for an initiation (it carries only
/// the peer's index) and for anything too short to say.
pub fn receiver_of_message(datagram: &[u8]) -> Option<u32> {
    let at = receiver_offset(*datagram.first()?)?;
    let bytes = datagram.get(at..at + 4)?;
    Some(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

/// The queue a datagram belongs on, as the kernel-side program computes it: None where any
/// queue will do.
pub fn queue_of_message(datagram: &[u8], queues: u32) -> Option<u32> {
    let at = receiver_offset(*datagram.first()?)?;
    let low = *datagram.get(at)?;
    Some(queue_of_index(low as u32, queues))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_for_a_queue_steers_to_it() {
        for queues in 1..=MAX_QUEUES {
            for queue in 0..queues {
                for random in [0, 0xff, 0x1234_56fe, u32::MAX, 0x8000_0080, 7 * queue + 3] {
                    let i = index_for_queue(random, queue, queues);
                    assert_eq!(queue_of_index(i, queues), queue, "{random:#x} {queue}/{queues}");
                    assert_eq!(i & !0xff, random & !0xff, "only the low byte changes");
                }
            }
        }
    }

    #[test]
    fn messages_steer_by_our_index() {
        let index = index_for_queue(0xdead_be00, 3, 4);
        let mut data = vec![TYPE_DATA, 0, 0, 0];
        data.extend_from_slice(&index.to_le_bytes());
        data.extend_from_slice(&[0; 40]);
        assert_eq!(queue_of_message(&data, 4), Some(3));
        let mut resp = vec![TYPE_RESPONSE, 0, 0, 0, 9, 9, 9, 9];
        resp.extend_from_slice(&index.to_le_bytes());
        assert_eq!(queue_of_message(&resp, 4), Some(3));
        assert_eq!(receiver_of_message(&resp), Some(index));
        assert_eq!(receiver_of_message(&[TYPE_RESPONSE, 0, 0, 0, 9, 9, 9, 9, 1]), None);
        assert_eq!(queue_of_message(&[1, 0, 0, 0, 3, 0, 0, 0], 4), None);
        assert_eq!(queue_of_message(&[TYPE_DATA, 0], 4), None);
        assert_eq!(queue_of_message(&[], 4), None);
    }
}
