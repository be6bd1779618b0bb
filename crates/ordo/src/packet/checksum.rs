//! The Internet checksum (RFC 1071): summing, folding, and finishing a partial one.

use super::PartialChecksum;

/// One's-complement sum of `data` added to `sum` (RFC 1071), folded to 16 bits (as a u32,
/// so callers can keep adding). On CPUs with AVX2 the same loop runs four lanes to an
/// instruction (about half the time of the baseline build: BENCHMARKS.md, "Checksums");
/// headers take a plain loop.
pub fn sum16(sum: u32, data: &[u8]) -> u32 {
    if data.len() < SMALL {
        return sum16_small(sum, data);
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), all that `sum16_avx2` requires.
        return unsafe { sum16_avx2(sum, data) };
    }
    sum16_lanes(sum, data)
}

/// Below this many bytes (headers: IP, TCP, pseudo-header) a plain loop beats the lanes,
/// whose setup and fold cost more than the words themselves: splitting a TSO packet takes
/// four small sums and one large per segment (BENCHMARKS.md, "Checksums").
const SMALL: usize = 64;

/// [`sum16`] of a few bytes, a big-endian 32-bit word at a time.
#[inline]
fn sum16_small(sum: u32, data: &[u8]) -> u32 {
    let mut acc = sum as u64;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u32::from_be_bytes(w.try_into().expect("4 bytes")) as u64;
    }
    let mut pairs = words.remainder().chunks_exact(2);
    for w in &mut pairs {
        acc += u16::from_be_bytes([w[0], w[1]]) as u64;
    }
    if let [last] = pairs.remainder() {
        acc += (*last as u64) << 8;
    }
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    let mut x = (acc & 0xffff_ffff) as u32 + (acc >> 32) as u32;
    x = (x & 0xffff) + (x >> 16);
    (x & 0xffff) + (x >> 16)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum16_avx2(sum: u32, data: &[u8]) -> u32 {
    sum16_lanes(sum, data)
}

/// [`sum16`] in portable code. The sum does not depend on byte order up to a final swap
/// (RFC 1071 section 2): little-endian 32-bit words go into eight 64-bit lanes that cannot
/// overflow (that would take 2^32 words), so the loop has no carry chain and vectorizes; it
/// runs once per byte of every TSO segment a sender splits.
#[inline(always)]
fn sum16_lanes(sum: u32, data: &[u8]) -> u32 {
    let mut lanes = [0u64; 8];
    let mut blocks = data.chunks_exact(32);
    for block in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(block.chunks_exact(4)) {
            *lane += u32::from_le_bytes(w.try_into().expect("4 bytes")) as u64;
        }
    }
    let mut acc = lanes.iter().fold(0u64, |a, &l| {
        let (s, carry) = a.overflowing_add(l);
        s + carry as u64
    });
    let mut pairs = blocks.remainder().chunks_exact(2);
    for w in &mut pairs {
        acc += u16::from_le_bytes([w[0], w[1]]) as u64;
    }
    if let [last] = pairs.remainder() {
        acc += *last as u64;
    }
    // Fold 64 -> 16 bits, then back to big-endian order.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    let mut x = acc as u32;
    x = (x & 0xffff) + (x >> 16);
    x = (x & 0xffff) + (x >> 16);
    let mut total = sum + (x as u16).swap_bytes() as u32;
    total = (total & 0xffff) + (total >> 16);
    (total & 0xffff) + (total >> 16)
}

/// A sum of [`sum16`] folded to its 16 bits.
pub fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Completes a checksum left partial: the field at `start + offset` holds the pseudo-header
/// sum; the sum over the bytes from `start` on finishes it. False (nothing written) when the
/// offsets lie outside the packet.
pub fn complete(partial: PartialChecksum, packet: &mut [u8]) -> bool {
    let (start, at) = (partial.start as usize, partial.start as usize + partial.offset as usize);
    if at + 2 > packet.len() || start > packet.len() {
        return false;
    }
    let c = !fold(sum16(0, &packet[start..]));
    packet[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::fixtures::{seg, TCP_ACK};

    /// The wide sum equals the textbook one (pairs of bytes), for every length and offset.
    #[test]
    fn wide_checksum_matches_the_simple_one() {
        fn simple(mut sum: u32, data: &[u8]) -> u32 {
            for c in data.chunks(2) {
                sum += (c[0] as u32) << 8 | c.get(1).copied().unwrap_or(0) as u32;
            }
            sum
        }
        let data: Vec<u8> = (0..3100u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for len in (0..100).chain([1499, 1500, 2999]) {
            for start in 0..3 {
                let d = &data[start..start + len];
                for seed in [0u32, 0xffff, 0x1_2345] {
                    assert_eq!(fold(sum16(seed, d)), fold(simple(seed, d)), "len {len} start {start}");
                    assert_eq!(
                        fold(sum16_lanes(seed, d)),
                        fold(simple(seed, d)),
                        "len {len} start {start}"
                    );
                }
            }
        }
        assert_eq!(fold(sum16(0, &[0xff; 4096])), 0xffff);
        // The largest seed callers pass (two folded sums added) with the largest small input.
        assert_eq!(
            fold(sum16(0x1_fffe, &[0xff; SMALL - 1])),
            fold(simple(0x1_fffe, &[0xff; SMALL - 1]))
        );
        assert_eq!(
            fold(sum16(0xffff, &[0xff; 65_535])),
            fold(simple(0xffff, &[0xff; 65_535]))
        );
    }

    #[test]
    fn partial_checksums_are_completed() {
        let mut p = seg(1, &[9; 33], TCP_ACK);
        let tcp_len = (p.len() - 20) as u16;
        let pseudo = fold(sum16(sum16(sum16(0, &p[12..20]), &[0, 6]), &tcp_len.to_be_bytes()));
        p[36..38].copy_from_slice(&pseudo.to_be_bytes());
        let h = PartialChecksum { start: 20, offset: 16 };
        assert!(complete(h, &mut p));
        let check = fold(sum16(sum16(sum16(0, &p[12..20]), &[0, 6]), &tcp_len.to_be_bytes()) + sum16(0, &p[20..]));
        assert_eq!(check, 0xffff);
        let bad = PartialChecksum { start: 200, offset: 16 };
        assert!(!complete(bad, &mut p), "out-of-range offsets are refused, not trusted");
    }
}
