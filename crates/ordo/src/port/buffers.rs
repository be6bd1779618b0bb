//! Outbound packet buffers, recycled per thread. A TSO packet read from TUN becomes some 45
//! buffers, one per segment; they are sealed in place, sent, and used to be freed, so a
//! sending thread paid an allocation and a free per segment. In the inline model the thread
//! that sends a batch is the one that reads the next, and takes its buffers back from here.
//! Bounded: a thread keeps at most [`KEEP`] buffers of at most [`LARGEST`] bytes each, so a
//! pool worker that only ever gives (it seals what another thread read) holds at most that.

use std::cell::RefCell;

/// Buffers one thread keeps.
pub const KEEP: usize = 256;
/// Larger buffers (a non-segmented 64 KB packet) are freed, not kept.
pub const LARGEST: usize = 4096;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for `capacity` bytes: a recycled one when this thread has one.
pub fn take(capacity: usize) -> Vec<u8> {
    let spare = SPARE.with(|s| s.borrow_mut().pop());
    match spare {
        Some(mut b) if b.capacity() >= capacity => {
            b.clear();
            b
        }
        _ => Vec::with_capacity(capacity),
    }
}

/// Hands buffers back for this thread's next reads; keeps what fits, frees the rest.
pub fn give(buffers: impl IntoIterator<Item = Vec<u8>>) {
    SPARE.with(|s| {
        let mut spare = s.borrow_mut();
        for b in buffers {
            if spare.len() >= KEEP {
                break;
            }
            if b.capacity() <= LARGEST {
                spare.push(b);
            }
        }
    });
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
    fn a_given_buffer_comes_back_empty_and_without_a_new_allocation() {
        let mut b = take(1500);
        b.extend_from_slice(&[7; 1500]);
        let at = b.as_ptr();
        give([b]);
        let again = take(1400);
        assert_eq!(again.as_ptr(), at, "the same allocation");
        assert!(again.is_empty() && again.capacity() >= 1500);
    }

    #[test]
    fn too_small_and_too_large_buffers_are_not_reused() {
        give([Vec::with_capacity(100)]);
        assert!(take(1500).capacity() >= 1500);
        let before = kept();
        give([Vec::with_capacity(LARGEST + 1)]);
        assert_eq!(kept(), before);
    }

    #[test]
    fn a_thread_keeps_at_most_keep_buffers() {
        give((0..KEEP + 50).map(|_| Vec::with_capacity(64)));
        assert_eq!(kept(), KEEP);
    }
}
