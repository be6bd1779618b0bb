//! The buffer every inner packet lives in, [`PacketBuf`], whichever way it goes, and the
//! per-thread spares owned ones come from.
//!
//! Owned buffers are recycled per thread: a TSO packet read from TUN becomes some 45
//! buffers, one per segment; they are sealed in place and sent, and freeing them would cost
//! the sending thread an allocation and a free per segment. In the inline model the thread
//! that sends a batch is the one that reads the next, and takes its buffers back from here.
//! Bounded: a thread keeps at most [`KEEP`] buffers of at most [`LARGEST`] bytes each, so a
//! pool worker that only ever gives (it seals what another thread read) holds at most that.

use super::{HEADROOM, TAILROOM};
use std::cell::RefCell;

/// Buffers one thread keeps.
pub const KEEP: usize = 256;
/// Larger buffers (a non-segmented 64 KB packet) are freed, not kept.
pub const LARGEST: usize = 4096;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An inner packet with room in front of it: [`HEADROOM`] bytes, where sealing writes the
/// data message's header on the way out, where that header was on the way in, and where an
/// inner port may write a header of its own (TUN: the virtio-net header). Owned (`Vec<u8>`)
/// when read from the inner port, with [`TAILROOM`] spare capacity behind the packet for the
/// padding and tag sealing adds, so that sealing never reallocates; borrowed (`&mut [u8]`,
/// cut from the datagram it arrived in, not copied) when delivered to it.
pub struct PacketBuf<B = Vec<u8>> {
    bytes: B,
}

impl<B: AsRef<[u8]>> PacketBuf<B> {
    /// The packet.
    pub fn packet(&self) -> &[u8] {
        &self.bytes.as_ref()[HEADROOM..]
    }

    /// The room and the packet: once sealed, the data message.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> PacketBuf<B> {
    pub fn packet_mut(&mut self) -> &mut [u8] {
        &mut self.bytes.as_mut()[HEADROOM..]
    }

    /// The packet with the `room` bytes before it (at most [`HEADROOM`]), for a header
    /// written in front.
    pub fn with_room(&mut self, room: usize) -> &mut [u8] {
        &mut self.bytes.as_mut()[HEADROOM - room..]
    }

    /// The room and the packet, to seal in place.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.bytes.as_mut()
    }
}

impl<'a> PacketBuf<&'a mut [u8]> {
    /// The packet at [`HEADROOM`]`..` of `bytes`: a data message opened in place, cut to end
    /// where its packet ends.
    pub fn borrowed(bytes: &'a mut [u8]) -> Self {
        assert!(bytes.len() >= HEADROOM, "a packet buffer holds its room");
        PacketBuf { bytes }
    }
}

impl PacketBuf {
    /// An empty packet with capacity for `len` bytes and the tailroom: a recycled buffer
    /// when this thread has one.
    pub fn with_capacity(len: usize) -> PacketBuf {
        let capacity = HEADROOM + len + TAILROOM;
        let spare = SPARE.with(|s| s.borrow_mut().pop());
        let mut bytes = match spare {
            Some(mut b) if b.capacity() >= capacity => {
                b.clear();
                b
            }
            _ => Vec::with_capacity(capacity),
        };
        bytes.resize(HEADROOM, 0);
        PacketBuf { bytes }
    }

    /// A copy of `packet`.
    pub fn copy_of(packet: &[u8]) -> PacketBuf {
        let mut p = PacketBuf::with_capacity(packet.len());
        p.push(packet);
        p
    }

    /// A packet of `len` zero bytes, to be written in place.
    pub fn zeroed(len: usize) -> PacketBuf {
        let mut p = PacketBuf::with_capacity(len);
        p.bytes.resize(HEADROOM + len, 0);
        p
    }

    /// Appends `bytes` to the packet.
    pub fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// Makes room and packet `len` bytes together, the new ones zero: the padding and tag of
    /// sealing (within the tailroom), or a packet cut short.
    pub fn resize(&mut self, len: usize) {
        assert!(len >= HEADROOM, "a packet buffer keeps its room");
        self.bytes.resize(len, 0);
    }
}

/// Hands buffers back for this thread's next reads; keeps what fits, frees the rest.
/// The spares are borrowed per buffer, not across the iteration, so that an iterator which
/// itself takes buffers (a lazy map) works.
pub fn give(buffers: impl IntoIterator<Item = PacketBuf>) {
    for PacketBuf { bytes } in buffers {
        if bytes.capacity() > LARGEST {
            continue;
        }
        SPARE.with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < KEEP {
                spare.push(bytes);
            }
        });
    }
}

/// How many buffers this thread keeps now.
#[cfg(test)]
fn kept() -> usize {
    SPARE.with(|s| s.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_comes_back_empty_with_its_room_zero_and_without_a_new_allocation() {
        let mut b = PacketBuf::copy_of(&[7; 1500]);
        b.with_room(HEADROOM).fill(9);
        let at = b.as_bytes().as_ptr();
        give([b]);
        let again = PacketBuf::with_capacity(1400);
        assert_eq!(again.as_bytes().as_ptr(), at, "the same allocation");
        assert!(again.packet().is_empty());
        assert_eq!(again.as_bytes(), &[0; HEADROOM], "the room is zero again");
    }

    #[test]
    fn too_small_and_too_large_buffers_are_not_reused() {
        give([PacketBuf::with_capacity(10)]);
        assert!(PacketBuf::with_capacity(1500).bytes.capacity() >= HEADROOM + 1500 + TAILROOM);
        let before = kept();
        give([PacketBuf::with_capacity(LARGEST)]);
        assert_eq!(kept(), before);
    }

    #[test]
    fn a_thread_keeps_at_most_keep_buffers() {
        let many: Vec<PacketBuf> = (0..KEEP + 50).map(|_| PacketBuf::with_capacity(64)).collect();
        give(many);
        assert_eq!(kept(), KEEP);
        // An iterator that takes as it gives (the spares are not borrowed across it).
        give((0..10).map(|_| PacketBuf::with_capacity(64)));
        assert_eq!(kept(), KEEP);
    }

    #[test]
    fn sealing_within_the_tailroom_does_not_reallocate() {
        let mut b = PacketBuf::copy_of(&[1; 1400]);
        let at = b.as_bytes().as_ptr();
        b.resize(HEADROOM + 1400 + TAILROOM);
        assert_eq!(b.as_bytes().as_ptr(), at);
        assert_eq!(&b.packet()[..1400], &[1; 1400]);
    }

    #[test]
    fn a_borrowed_buffer_is_the_packet_behind_its_room() {
        let mut bytes = [0u8; HEADROOM + 3];
        bytes[HEADROOM..].copy_from_slice(b"abc");
        let mut b = PacketBuf::borrowed(&mut bytes);
        assert_eq!(b.packet(), b"abc");
        b.with_room(2)[..2].copy_from_slice(b"hd");
        assert_eq!(&bytes[HEADROOM - 2..], b"hdabc");
    }
}
