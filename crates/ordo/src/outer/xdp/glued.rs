//! A peer's UDP GSO batch that reached an AF_XDP socket as one datagram. On a virtual link
//! (veth) a sender's GSO batch crosses as one buffer, one set of headers in front of several
//! WireGuard messages. In native mode veth splits it before the program (and turns off the
//! sender's GSO); in generic mode it does not, and the program cannot tell it from one
//! datagram. Batches longer than a frame the program passes to the kernel socket, which
//! splits them; the shorter ones land here, and are cut back into their messages.
//!
//! A batch's messages all have one length but the last, and each is a data message to the
//! same receiver: so the first message's length is the first offset where a data message
//! header with the first's receiver index begins. Within ciphertext that eight-byte match
//! comes by chance once in 2^64 offsets. Every offset is tried: messages are padded to 16
//! bytes but not beyond the MTU (WireGuard §5.4.6), so a full one may have any length.

use ordo_proto::messages::{DATA_HEADER_LEN, DATA_MIN_LEN, TYPE_DATA};

/// The length of each message (but the last) of a payload that is several data messages
/// glued together, or None for a payload that is one message (or not data).
pub fn segment_len(payload: &[u8]) -> Option<usize> {
    let header = payload.get(..8)?;
    if header[..4] != [TYPE_DATA, 0, 0, 0] {
        return None;
    }
    let last = payload.len().checked_sub(DATA_HEADER_LEN)?;
    (DATA_MIN_LEN..=last).find(|&at| payload[at] == TYPE_DATA && payload[at..at + 8] == *header)
}

/// Cuts `payload` into its messages: at each multiple of [`segment_len`], or whole.
pub fn messages(payload: &[u8]) -> impl Iterator<Item = std::ops::Range<usize>> {
    let len = payload.len();
    let step = segment_len(payload).unwrap_or(len.max(1));
    (0..len).step_by(step).map(move |start| start..(start + step).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(receiver: u32, counter: u64, body: usize) -> Vec<u8> {
        let mut m = vec![TYPE_DATA, 0, 0, 0];
        m.extend_from_slice(&receiver.to_le_bytes());
        m.extend_from_slice(&counter.to_le_bytes());
        // Ciphertext that happens to hold a data header of another receiver.
        let mut body = vec![0xa5; body];
        body[..8].copy_from_slice(&[TYPE_DATA, 0, 0, 0, 9, 9, 9, 9]);
        m.extend_from_slice(&body);
        m
    }

    #[test]
    fn a_batch_is_cut_at_its_messages_and_one_message_stays_whole() {
        let one = data(7, 1, 1408);
        assert_eq!(segment_len(&one), None);
        assert_eq!(messages(&one).collect::<Vec<_>>(), vec![0..one.len()]);
        // Three full messages and a shorter last one, as a GSO batch carries them; full ones
        // padded up to an MTU of 1420, not to 16.
        let mut batch = Vec::new();
        for (i, body) in [1436, 1436, 1436, 96].into_iter().enumerate() {
            batch.extend(data(7, 10 + i as u64, body));
        }
        let full = 16 + 1436;
        assert_eq!(segment_len(&batch), Some(full));
        let cuts: Vec<_> = messages(&batch).collect();
        assert_eq!(
            cuts,
            vec![0..full, full..2 * full, 2 * full..3 * full, 3 * full..batch.len()]
        );
        for c in &cuts {
            assert_eq!(batch[c.start..c.start + 8], [TYPE_DATA, 0, 0, 0, 7, 0, 0, 0]);
        }
        // Keepalives (empty data messages) glued: 32 bytes each.
        let keepalives: Vec<u8> = (0..4).flat_map(|i| data(3, i, 16)).collect();
        assert_eq!(messages(&keepalives).count(), 4);
        // Handshake messages and scraps are left alone.
        let mut initiation = vec![0u8; 148];
        initiation[0] = 1;
        assert_eq!(segment_len(&initiation), None);
        assert_eq!(segment_len(&[4, 0, 0]), None);
        assert_eq!(messages(&[]).count(), 0);
    }
}
