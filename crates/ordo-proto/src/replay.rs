//! The sliding anti-replay window of RFC 6479: a ring of 64-bit blocks, so sliding forward
//! clears whole blocks instead of shifting bits. 128 blocks give a window of 8,128 counters,
//! the figure the kernel implementation uses.

use crate::timers::REJECT_AFTER_MESSAGES;

const BLOCKS: usize = 128;
const BLOCK_BITS: u64 = 64;
/// How far behind the newest counter a packet may arrive and still be accepted.
pub const WINDOW: u64 = (BLOCKS as u64 - 1) * BLOCK_BITS;

#[derive(Clone)]
pub struct ReplayWindow {
    /// One more than the greatest counter accepted so far (0: none yet).
    next: u64,
    ring: [u64; BLOCKS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            next: 0,
            ring: [0; BLOCKS],
        }
    }
}

impl ReplayWindow {
    /// Accepts `counter` exactly once. Call only after the packet authenticated: a forged
    /// counter must never move the window.
    pub fn accept(&mut self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        let c = counter + 1; // shifted by one so that `next == 0` means "nothing seen"
        if c + WINDOW < self.next {
            return false; // too old: left of the window
        }
        let block = c / BLOCK_BITS;
        if c > self.next {
            let current = self.next / BLOCK_BITS;
            let advance = (block - current).min(BLOCKS as u64);
            for i in 1..=advance {
                self.ring[((current + i) % BLOCKS as u64) as usize] = 0;
            }
            self.next = c;
        }
        let slot = &mut self.ring[(block % BLOCKS as u64) as usize];
        let bit = 1u64 << (c % BLOCK_BITS);
        let fresh = *slot & bit == 0;
        *slot |= bit;
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn in_order_out_of_order_and_duplicates() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(2));
        assert!(w.accept(1));
        assert!(!w.accept(1));
        assert!(w.accept(10_000));
        assert!(w.accept(10_000 - WINDOW + 1), "oldest counter still inside the window");
        assert!(!w.accept(10_000 - WINDOW - 1), "left of the window");
        assert!(!w.accept(REJECT_AFTER_MESSAGES));
        assert!(w.accept(REJECT_AFTER_MESSAGES - 1));
        assert!(!w.accept(REJECT_AFTER_MESSAGES - 1));
    }

    #[test]
    fn window_is_at_least_8128() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(8128));
        assert!(w.accept(1), "8,127 behind is accepted");
    }

    proptest! {
        /// Against a model that remembers every counter: the window never accepts a repeat,
        /// and accepts every first-seen counter that lies within WINDOW of the greatest.
        #[test]
        fn matches_model(counters in proptest::collection::vec(0u64..20_000, 1..400)) {
            let mut w = ReplayWindow::default();
            let mut seen = HashSet::new();
            let mut greatest: Option<u64> = None;
            for c in counters {
                let got = w.accept(c);
                let too_old = matches!(greatest, Some(g) if c + WINDOW < g);
                let expect = !too_old && !seen.contains(&c);
                prop_assert_eq!(got, expect, "counter {}", c);
                if got {
                    seen.insert(c);
                    greatest = Some(greatest.map_or(c, |g| g.max(c)));
                }
            }
        }
    }
}
