//! Per-source token buckets, consulted only while the interface is under load (one table for
//! the handshakes we compute, one for the cookie replies we send): each source address (an
//! IPv6 /64 counts as one) may have 20 a second with a burst of 5. The table is bounded; when full, stale entries go first and a
//! source that still finds no room is refused, so a flood cannot grow memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const PER_SECOND: f64 = 20.0;
const BURST: f64 = 5.0;
const MAX_ENTRIES: usize = 8192;

#[derive(Default)]
pub struct RateLimiter {
    buckets: HashMap<IpAddr, (f64, Instant)>,
}

fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) & (u128::MAX << 64)).into()),
        v4 => v4,
    }
}

impl RateLimiter {
    /// Takes a token for `ip`; false if it has none left.
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let k = key(ip);
        if !self.buckets.contains_key(&k) && self.buckets.len() >= MAX_ENTRIES {
            let horizon = Duration::from_secs_f64(BURST / PER_SECOND);
            self.buckets
                .retain(|_, (_, last)| now.saturating_duration_since(*last) < horizon);
            if self.buckets.len() >= MAX_ENTRIES {
                return false;
            }
        }
        let (tokens, last) = self.buckets.entry(k).or_insert((BURST, now));
        *tokens = (*tokens + now.saturating_duration_since(*last).as_secs_f64() * PER_SECOND).min(BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let mut r = RateLimiter::default();
        let t0 = Instant::now();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!((0..10).filter(|_| r.allow(ip, t0)).count(), 5);
        assert!(
            r.allow(ip, t0 + Duration::from_millis(50)),
            "one token back after 50 ms"
        );
        assert!(!r.allow(ip, t0 + Duration::from_millis(50)));
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!((0..5).filter(|_| r.allow(a, t0)).count(), 5);
        assert!(!r.allow(b, t0), "same /64 shares a bucket");
    }

    #[test]
    fn table_stays_bounded() {
        let mut r = RateLimiter::default();
        let t0 = Instant::now();
        for i in 0..(MAX_ENTRIES as u32 + 100) {
            r.allow(IpAddr::V4(i.into()), t0);
        }
        assert_eq!(r.len(), MAX_ENTRIES);
        assert!(
            r.allow(IpAddr::V4(0xffff_ffff.into()), t0 + Duration::from_secs(1)),
            "stale entries make room"
        );
    }
}
