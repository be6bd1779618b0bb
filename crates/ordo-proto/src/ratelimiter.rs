//! Per-source token buckets, consulted only while the interface is under load: one table for
//! the handshakes we compute ([`HANDSHAKES`], the whitepaper's and Linux's figures) and one
//! for the cookie replies we send ([`COOKIE_REPLIES`]). Each source address (an IPv6 /64
//! counts as one) has its bucket. A table is bounded; when full, stale entries go first (one
//! sweep per burst's refill time at most, so a flood of new sources costs no sweep per
//! datagram) and a source that still finds no room is refused, so a flood cannot grow memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A bucket's refill rate and size.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

/// Handshakes a source may make us compute: 20 a second, as the whitepaper and Linux, with a
/// burst of a second's worth (Linux: 5), so that the clients behind one NAT address, back
/// together after an outage and each with its cookie, are not held a retransmission round
/// (REKEY_TIMEOUT) per five of them. The long-run rate, which bounds a flood, is the same.
pub const HANDSHAKES: Rate = Rate {
    per_second: 20.0,
    burst: 20.0,
};

/// Cookie replies a source may get. More than handshakes: every client behind one NAT
/// address needs its own cookie (a cookie is for an address and port), and a burst of them
/// (an office back after an outage) must not wait a retransmission each.
pub const COOKIE_REPLIES: Rate = Rate {
    per_second: 100.0,
    burst: 64.0,
};

const MAX_ENTRIES: usize = 8192;

pub struct RateLimiter {
    rate: Rate,
    buckets: HashMap<IpAddr, Bucket>,
    last_sweep: Option<Instant>,
    sweeps: u64,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) & (u128::MAX << 64)).into()),
        v4 => v4,
    }
}

impl RateLimiter {
    pub fn new(rate: Rate) -> Self {
        RateLimiter {
            rate,
            buckets: HashMap::new(),
            last_sweep: None,
            sweeps: 0,
        }
    }

    /// How long an idle bucket takes to refill: after that it is no different from none.
    fn refill_time(&self) -> Duration {
        Duration::from_secs_f64(self.rate.burst / self.rate.per_second)
    }

    /// True if `ip` has a token (or no bucket yet); takes none. Lets a caller skip work whose
    /// outcome would be refused anyway.
    pub fn would_allow(&self, ip: IpAddr, now: Instant) -> bool {
        self.buckets.get(&key(ip)).is_none_or(|b| {
            b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * self.rate.per_second >= 1.0
        })
    }

    /// Takes a token for `ip`; false if it has none left.
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let k = key(ip);
        if !self.buckets.contains_key(&k) && self.buckets.len() >= MAX_ENTRIES {
            let horizon = self.refill_time();
            if self
                .last_sweep
                .is_none_or(|t| now.saturating_duration_since(t) >= horizon)
            {
                self.last_sweep = Some(now);
                self.sweeps += 1;
                self.buckets
                    .retain(|_, b| now.saturating_duration_since(b.last) < horizon);
            }
            if self.buckets.len() >= MAX_ENTRIES {
                return false;
            }
        }
        let Rate { per_second, burst } = self.rate;
        let b = self.buckets.entry(k).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        b.tokens = (b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * per_second).min(burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
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

    /// Times a full table was swept for stale entries.
    pub fn sweeps(&self) -> u64 {
        self.sweeps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let mut r = RateLimiter::new(HANDSHAKES);
        let t0 = Instant::now();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(r.would_allow(ip, t0));
        assert_eq!((0..30).filter(|_| r.allow(ip, t0)).count(), 20);
        assert!(!r.would_allow(ip, t0));
        let t1 = t0 + Duration::from_millis(50);
        assert!(r.would_allow(ip, t1), "one token back after 50 ms");
        assert!(r.would_allow(ip, t1), "asking takes none");
        assert!(r.allow(ip, t1));
        assert!(!r.allow(ip, t1));
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!((0..20).filter(|_| r.allow(a, t0)).count(), 20);
        assert!(!r.allow(b, t0), "same /64 shares a bucket");
    }

    #[test]
    fn table_stays_bounded() {
        let mut r = RateLimiter::new(HANDSHAKES);
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

    /// A flood of new sources against a full table of fresh ones is refused without a sweep
    /// of the table per datagram: one per refill time.
    #[test]
    fn a_full_table_is_swept_once_per_refill_time() {
        let mut r = RateLimiter::new(COOKIE_REPLIES);
        let t0 = Instant::now();
        for i in 0..MAX_ENTRIES as u32 {
            assert!(r.allow(IpAddr::V4(i.into()), t0));
        }
        let t1 = t0 + Duration::from_millis(1);
        let refused = (0..10_000u32)
            .filter(|i| !r.allow(IpAddr::V4((1 << 24 | i).into()), t1))
            .count();
        assert_eq!(refused, 10_000);
        assert_eq!(r.sweeps(), 1);
        let later = t1 + r.refill_time();
        assert!(r.allow(IpAddr::V4(0xffff_ffff.into()), later), "stale by then");
        assert_eq!(r.sweeps(), 2);
        assert_eq!(r.len(), 1);
    }
}
