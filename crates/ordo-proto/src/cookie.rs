//! MAC1, MAC2 and cookies (whitepaper section 5.4.4 and 5.4.7): the defence that lets a
//! responder under load demand proof of a round trip before it spends a Diffie-Hellman.

use crate::crypto::{hash, mac, xaead_open, xaead_seal};
use crate::keys::PublicKey;
use crate::messages::{mac1_offset, mac2_offset, CookieReply};
use crate::timers::COOKIE_SECRET_MAX_AGE;
use rand_core::{CryptoRng, RngCore};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";
/// A cookie is used for a little less than the secret lives, so it is not sent just as the
/// responder forgets the secret it was made from.
const COOKIE_USE_LIFETIME: Duration = Duration::from_secs(120 - 5);

fn mac1_key(of: &PublicKey) -> [u8; 32] {
    hash(&[LABEL_MAC1, &of.0])
}
fn cookie_key(of: &PublicKey) -> [u8; 32] {
    hash(&[LABEL_COOKIE, &of.0])
}

fn source_bytes(src: &SocketAddr) -> Vec<u8> {
    let mut v = match src.ip() {
        std::net::IpAddr::V4(a) => a.octets().to_vec(),
        std::net::IpAddr::V6(a) => a.octets().to_vec(),
    };
    v.extend_from_slice(&src.port().to_be_bytes());
    v
}

/// Our side as responder: checks MACs on incoming handshakes and makes cookie replies.
pub struct CookieChecker {
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    secret: Zeroizing<[u8; 32]>,
    secret_born: Option<Instant>,
}

impl CookieChecker {
    pub fn new(our_public: &PublicKey) -> Self {
        CookieChecker {
            mac1_key: mac1_key(our_public),
            cookie_key: cookie_key(our_public),
            secret: Zeroizing::new([0; 32]),
            secret_born: None,
        }
    }

    /// True if `msg` (a whole initiation or response) carries a valid mac1 for us.
    pub fn mac1_valid(&self, msg: &[u8]) -> bool {
        let at = mac1_offset(msg.len());
        constant_time_eq(&mac(&self.mac1_key, &[&msg[..at]]), &msg[at..at + 16])
    }

    fn cookie_for(&mut self, src: &SocketAddr, now: Instant, rng: &mut (impl RngCore + CryptoRng)) -> [u8; 16] {
        if self
            .secret_born
            .is_none_or(|b| now.saturating_duration_since(b) >= COOKIE_SECRET_MAX_AGE)
        {
            rng.fill_bytes(&mut self.secret[..]);
            self.secret_born = Some(now);
        }
        mac(&self.secret[..], &[&source_bytes(src)])
    }

    /// True if `msg` carries a mac2 made with the cookie we would give `src` now.
    pub fn mac2_valid(
        &mut self,
        msg: &[u8],
        src: &SocketAddr,
        now: Instant,
        rng: &mut (impl RngCore + CryptoRng),
    ) -> bool {
        // Not computing two MACs for a message without one halves what a flood with a valid
        // mac1 costs us beyond junk.
        if !carries_mac2(msg) {
            return false;
        }
        let at = mac2_offset(msg.len());
        let cookie = self.cookie_for(src, now, rng);
        constant_time_eq(&mac(&cookie, &[&msg[..at]]), &msg[at..at + 16])
    }

    /// A cookie reply to `msg` from `src`, sealed to the mac1 of `msg`.
    pub fn reply(
        &mut self,
        msg: &[u8],
        src: &SocketAddr,
        now: Instant,
        rng: &mut (impl RngCore + CryptoRng),
    ) -> CookieReply {
        let cookie = self.cookie_for(src, now, rng);
        let mut nonce = [0u8; 24];
        rng.fill_bytes(&mut nonce);
        let at = mac1_offset(msg.len());
        let encrypted_cookie = xaead_seal(&self.cookie_key, &nonce, &cookie, &msg[at..at + 16]);
        CookieReply {
            receiver: u32::from_le_bytes(msg[4..8].try_into().unwrap()),
            nonce,
            encrypted_cookie,
        }
    }
}

/// False if the handshake message's mac2 is zeros: its sender holds no cookie (whitepaper
/// 5.4.4). A MAC that is zeros by chance is a 2^-128 event.
pub fn carries_mac2(msg: &[u8]) -> bool {
    let at = mac2_offset(msg.len());
    msg[at..at + 16] != [0; 16]
}

/// Our side as initiator towards one peer: stamps MACs and keeps the cookie it gave us.
pub struct CookieJar {
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    last_mac1: Option<[u8; 16]>,
    cookie: Option<([u8; 16], Instant)>,
}

impl CookieJar {
    pub fn new(peer: &PublicKey) -> Self {
        CookieJar {
            mac1_key: mac1_key(peer),
            cookie_key: cookie_key(peer),
            last_mac1: None,
            cookie: None,
        }
    }

    /// Writes mac1 and, if we hold a fresh cookie, mac2 into a handshake message. Returns the
    /// mac1, which a cookie reply to this message is sealed to.
    pub fn stamp(&mut self, msg: &mut [u8], now: Instant) -> [u8; 16] {
        let at1 = mac1_offset(msg.len());
        let m1 = mac(&self.mac1_key, &[&msg[..at1]]);
        msg[at1..at1 + 16].copy_from_slice(&m1);
        self.last_mac1 = Some(m1);
        let at2 = mac2_offset(msg.len());
        let m2 = match self.cookie {
            Some((c, got)) if now.saturating_duration_since(got) < COOKIE_USE_LIFETIME => mac(&c, &[&msg[..at2]]),
            _ => [0; 16],
        };
        msg[at2..at2 + 16].copy_from_slice(&m2);
        m1
    }

    /// Accepts a cookie reply to the last message we stamped. False if it does not open.
    pub fn consume_reply(&mut self, reply: &CookieReply, now: Instant) -> bool {
        match self.last_mac1 {
            Some(m1) => self.consume_reply_to(reply, &m1, now),
            None => false,
        }
    }

    /// Accepts a cookie reply to an earlier message whose mac1 was `mac1` (a sender of many
    /// messages in flight, such as a load generator, keeps their mac1s by sender index).
    pub fn consume_reply_to(&mut self, reply: &CookieReply, mac1: &[u8; 16], now: Instant) -> bool {
        match xaead_open(&self.cookie_key, &reply.nonce, &reply.encrypted_cookie, mac1) {
            Some(c) => {
                self.cookie = Some((c, now));
                true
            }
            None => false,
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::PrivateKey;
    use crate::messages::INITIATION_LEN;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn cookie_round_trip_makes_mac2_valid() {
        let mut rng = StdRng::seed_from_u64(5);
        let responder = PrivateKey::from_bytes([3; 32]).public_key();
        let mut checker = CookieChecker::new(&responder);
        let mut jar = CookieJar::new(&responder);
        let src: SocketAddr = "192.0.2.1:51820".parse().unwrap();
        let now = Instant::now();

        let mut msg = [0u8; INITIATION_LEN];
        msg[0] = 1;
        jar.stamp(&mut msg, now);
        assert!(checker.mac1_valid(&msg));
        assert!(!checker.mac2_valid(&msg, &src, now, &mut rng), "no cookie yet");

        let reply = checker.reply(&msg, &src, now, &mut rng);
        assert!(jar.consume_reply(&reply, now));
        jar.stamp(&mut msg, now);
        assert!(checker.mac2_valid(&msg, &src, now, &mut rng));
        let other: SocketAddr = "192.0.2.2:51820".parse().unwrap();
        assert!(
            !checker.mac2_valid(&msg, &other, now, &mut rng),
            "cookie is bound to the source"
        );

        // The secret rotates: an old cookie stops working.
        let later = now + COOKIE_SECRET_MAX_AGE;
        assert!(!checker.mac2_valid(&msg, &src, later, &mut rng));
    }

    #[test]
    fn forged_reply_is_refused() {
        let mut rng = StdRng::seed_from_u64(6);
        let responder = PrivateKey::from_bytes([3; 32]).public_key();
        let mut checker = CookieChecker::new(&responder);
        let mut jar = CookieJar::new(&responder);
        let src: SocketAddr = "[2001:db8::1]:1".parse().unwrap();
        let mut msg = [0u8; INITIATION_LEN];
        jar.stamp(&mut msg, Instant::now());
        let mut reply = checker.reply(&msg, &src, Instant::now(), &mut rng);
        reply.encrypted_cookie[3] ^= 0x80;
        assert!(!jar.consume_reply(&reply, Instant::now()));
        msg[100] ^= 1;
        assert!(!checker.mac1_valid(&msg));
    }
}
