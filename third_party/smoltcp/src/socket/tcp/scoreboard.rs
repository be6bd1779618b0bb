//! The sender's record of the data the receiver has selectively acknowledged
//! (RFC 2018), from which loss recovery (RFC 6675) decides what is lost, what to
//! retransmit and how much data is still in the network.

use crate::wire::TcpSeqNumber;

/// How many disjoint SACKed blocks are remembered. A receiver reports at most four
/// per segment, but it reports different ones as recovery goes on; with more holes
/// than this, the highest blocks are forgotten first, which only makes the sender
/// more conservative (forgotten data counts as still in flight).
pub(super) const SCOREBOARD_LEN: usize = 32;

/// A range of sequence space, `start` included, `end` excluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(super) struct Block {
    pub start: TcpSeqNumber,
    pub end: TcpSeqNumber,
}

impl Block {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// Disjoint, non-adjacent SACKed blocks above the cumulative acknowledgement,
/// sorted by sequence number.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(super) struct Scoreboard {
    blocks: [Block; SCOREBOARD_LEN],
    len: usize,
}

impl Default for Scoreboard {
    fn default() -> Self {
        let empty = Block {
            start: TcpSeqNumber::default(),
            end: TcpSeqNumber::default(),
        };
        Scoreboard {
            blocks: [empty; SCOREBOARD_LEN],
            len: 0,
        }
    }
}

impl Scoreboard {
    fn blocks(&self) -> &[Block] {
        &self.blocks[..self.len]
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Records that the receiver holds `[start, end)`. Returns whether any of it
    /// was not known to be SACKed before.
    pub fn add(&mut self, start: TcpSeqNumber, end: TcpSeqNumber) -> bool {
        if start >= end {
            return false;
        }
        // The blocks the new one overlaps or touches merge with it.
        let first = self.blocks().partition_point(|b| b.end < start);
        let last = self.blocks().partition_point(|b| b.start <= end);
        let mut merged = Block { start, end };
        let mut known = 0;
        for b in &self.blocks[first..last] {
            merged.start = merged.start.min(b.start);
            merged.end = merged.end.max(b.end);
            known += b.len();
        }
        if merged.len() == known {
            return false;
        }
        let replaced = last - first;
        if replaced == 0 && self.len == SCOREBOARD_LEN {
            if first == SCOREBOARD_LEN {
                // Above everything remembered, and no room: forget it.
                return false;
            }
            // Forget the highest block to make room.
            self.len -= 1;
        }
        // Replace blocks[first..last] with the merged block.
        let tail = self.len - last;
        let new_len = self.len - replaced + 1;
        self.blocks.copy_within(last..self.len, first + 1);
        self.blocks[first] = merged;
        self.len = new_len;
        debug_assert_eq!(first + 1 + tail, new_len);
        true
    }

    /// Forgets everything below the cumulative acknowledgement `una`.
    pub fn prune(&mut self, una: TcpSeqNumber) {
        let gone = self.blocks().partition_point(|b| b.end <= una);
        self.blocks.copy_within(gone..self.len, 0);
        self.len -= gone;
        if let Some(first) = self.blocks[..self.len].first_mut() {
            first.start = first.start.max(una);
        }
    }

    /// Octets SACKed.
    pub fn sacked(&self) -> usize {
        self.blocks().iter().map(Block::len).sum()
    }

    /// The end of the highest SACKed block.
    pub fn highest(&self) -> Option<TcpSeqNumber> {
        self.blocks().last().map(|b| b.end)
    }

    /// Every octet below the returned sequence number that is not SACKed is deemed
    /// lost: RFC 6675's IsLost, true when more than `bytes` octets, or at least
    /// `blocks` discontiguous blocks, are SACKed above it. `una` when nothing is.
    pub fn lost_below(&self, una: TcpSeqNumber, bytes: usize, blocks: usize) -> TcpSeqNumber {
        let mut above = 0;
        for (count, b) in self.blocks().iter().rev().enumerate() {
            above += b.len();
            if above > bytes || count + 1 >= blocks {
                return b.start.max(una);
            }
        }
        una
    }

    /// Octets in `[from, to)` that are not SACKed.
    pub fn unsacked(&self, from: TcpSeqNumber, to: TcpSeqNumber) -> usize {
        if from >= to {
            return 0;
        }
        let covered: usize = self
            .blocks()
            .iter()
            .map(|b| {
                let start = b.start.max(from);
                let end = b.end.min(to);
                if start < end { end - start } else { 0 }
            })
            .sum();
        (to - from) - covered
    }

    /// The first run of octets at or above `from` that is not SACKed, if it starts
    /// below `before`. It ends at the next SACKed block, or at `limit`.
    pub fn next_hole(
        &self,
        from: TcpSeqNumber,
        before: TcpSeqNumber,
        limit: TcpSeqNumber,
    ) -> Option<Block> {
        let mut start = from;
        for b in self.blocks() {
            if b.end <= start {
                continue;
            }
            if b.start <= start {
                start = b.end;
                continue;
            }
            return (start < before).then_some(Block {
                start,
                end: b.start,
            });
        }
        (start < before && start < limit).then_some(Block { start, end: limit })
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn seq(n: i32) -> TcpSeqNumber {
        TcpSeqNumber(n)
    }

    fn blocks(s: &Scoreboard) -> Vec<(i32, i32)> {
        s.blocks().iter().map(|b| (b.start.0, b.end.0)).collect()
    }

    #[test]
    fn add_merges_overlapping_and_adjacent_blocks() {
        let mut s = Scoreboard::default();
        assert!(s.add(seq(30), seq(40)));
        assert!(s.add(seq(10), seq(20)));
        assert!(s.add(seq(50), seq(60)));
        assert_eq!(blocks(&s), [(10, 20), (30, 40), (50, 60)]);
        // Known already: nothing new.
        assert!(!s.add(seq(32), seq(38)));
        assert!(!s.add(seq(10), seq(20)));
        // Touching two blocks fills the gap between them.
        assert!(s.add(seq(20), seq(30)));
        assert_eq!(blocks(&s), [(10, 40), (50, 60)]);
        // Spanning several blocks.
        assert!(s.add(seq(5), seq(70)));
        assert_eq!(blocks(&s), [(5, 70)]);
        assert_eq!(s.sacked(), 65);
        assert!(!s.add(seq(8), seq(8)));
    }

    #[test]
    fn add_when_full_forgets_the_highest_block() {
        let mut s = Scoreboard::default();
        for i in 0..SCOREBOARD_LEN as i32 {
            assert!(s.add(seq(100 + i * 10), seq(105 + i * 10)));
        }
        let top = s.highest().unwrap();
        // Above everything: no room, ignored.
        assert!(!s.add(seq(10_000), seq(10_005)));
        assert_eq!(s.highest(), Some(top));
        // Below: kept, the highest block goes.
        assert!(s.add(seq(10), seq(15)));
        assert_eq!(s.len, SCOREBOARD_LEN);
        assert_eq!(blocks(&s)[0], (10, 15));
        assert!(s.highest().unwrap() < top);
        // Merging into an existing block needs no room.
        assert!(s.add(seq(15), seq(20)));
        assert_eq!(blocks(&s)[0], (10, 20));
    }

    #[test]
    fn add_across_sequence_wraparound() {
        let mut s = Scoreboard::default();
        assert!(s.add(seq(i32::MAX - 10), seq(i32::MAX)));
        assert!(s.add(seq(i32::MIN + 10), seq(i32::MIN + 20)));
        assert!(s.add(seq(i32::MAX), seq(i32::MIN + 10)));
        assert_eq!(blocks(&s), [(i32::MAX - 10, i32::MIN + 20)]);
        assert_eq!(s.sacked(), 31);
    }

    #[test]
    fn prune_forgets_and_trims_below_una() {
        let mut s = Scoreboard::default();
        s.add(seq(10), seq(20));
        s.add(seq(30), seq(40));
        s.add(seq(50), seq(60));
        s.prune(seq(35));
        assert_eq!(blocks(&s), [(35, 40), (50, 60)]);
        s.prune(seq(60));
        assert!(s.is_empty());
    }

    #[test]
    fn lost_below_follows_rfc6675_is_lost() {
        let mut s = Scoreboard::default();
        // una = 0, segments of 10: 10..20 and 40..50 SACKed.
        s.add(seq(10), seq(20));
        s.add(seq(40), seq(50));
        // 20 octets SACKed in 2 blocks: more than 30 octets or 3 blocks are needed.
        assert_eq!(s.lost_below(seq(0), 30, 3), seq(0));
        // More than 10 octets above 10: the hole below 10 is lost; the one at 20..40
        // has only 10 octets above it.
        assert_eq!(s.lost_below(seq(0), 10, 3), seq(10));
        // Three blocks are enough on their own.
        s.add(seq(60), seq(61));
        assert_eq!(s.lost_below(seq(0), 1000, 3), seq(10));
        assert_eq!(s.lost_below(seq(0), 1000, 2), seq(40));
    }

    #[test]
    fn holes_and_unsacked_octets() {
        let mut s = Scoreboard::default();
        s.add(seq(10), seq(20));
        s.add(seq(30), seq(40));
        let hole = |from, before, limit| {
            s.next_hole(seq(from), seq(before), seq(limit))
                .map(|b| (b.start.0, b.end.0))
        };
        assert_eq!(hole(0, 100, 100), Some((0, 10)));
        assert_eq!(hole(5, 100, 100), Some((5, 10)));
        assert_eq!(hole(10, 100, 100), Some((20, 30)));
        assert_eq!(hole(35, 100, 100), Some((40, 100)));
        // Holes starting at or above `before` are not offered.
        assert_eq!(hole(10, 20, 100), None);
        assert_eq!(hole(40, 100, 40), None);
        assert_eq!(s.unsacked(seq(0), seq(50)), 30);
        assert_eq!(s.unsacked(seq(15), seq(35)), 10);
        assert_eq!(s.unsacked(seq(35), seq(15)), 0);
    }
}
