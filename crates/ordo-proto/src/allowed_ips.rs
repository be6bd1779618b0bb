//! Cryptokey routing (whitepaper section 2): a longest-prefix-match table from IP prefixes to
//! peers, used to pick the peer of an outgoing packet and to check the inner source of an
//! incoming one. One hash map per prefix length, probed from the longest length in use down;
//! a lookup touches only the lengths that hold entries, which are few in practice.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
// Lookups hash on every packet: a fast hasher, not SipHash. Keys are prefixes from the
// configuration; a packet can choose what it looks up but not what the table holds, so
// collisions cannot be forced.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::net::IpAddr;

#[derive(Clone)]
struct Family<T> {
    /// by_len[l] maps the masked address (as u128) of each /l prefix to its value.
    by_len: Vec<HashMap<u128, T>>,
    /// Prefix lengths that hold at least one entry, longest first.
    in_use: Vec<u8>,
}

impl<T: Copy + Eq> Family<T> {
    fn new(bits: usize) -> Self {
        Family {
            by_len: vec![HashMap::default(); bits + 1],
            in_use: Vec::new(),
        }
    }
    fn refresh_in_use(&mut self) {
        self.in_use = (0..self.by_len.len())
            .rev()
            .filter(|&l| !self.by_len[l].is_empty())
            .map(|l| l as u8)
            .collect();
    }
    fn insert(&mut self, key: u128, len: u8, v: T) {
        let was_empty = self.by_len[len as usize].is_empty();
        self.by_len[len as usize].insert(key, v);
        if was_empty {
            self.refresh_in_use();
        }
    }
    fn remove(&mut self, key: u128, len: u8) -> Option<T> {
        let r = self.by_len[len as usize].remove(&key);
        if r.is_some() && self.by_len[len as usize].is_empty() {
            self.refresh_in_use();
        }
        r
    }
    fn lookup(&self, addr: u128, mask: impl Fn(u128, u8) -> u128) -> Option<T> {
        self.in_use
            .iter()
            .find_map(|&l| self.by_len[l as usize].get(&mask(addr, l)).copied())
    }
    fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for m in &mut self.by_len {
            m.retain(|_, v| keep(v));
        }
        self.refresh_in_use();
    }
}

fn mask4(a: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        a & ((u32::MAX << (32 - len as u32)) as u128)
    }
}
fn mask6(a: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - len as u32))
    }
}

/// The table. `T` is the caller's peer handle.
#[derive(Clone)]
pub struct AllowedIps<T> {
    v4: Family<T>,
    v6: Family<T>,
}

impl<T: Copy + Eq> Default for AllowedIps<T> {
    fn default() -> Self {
        AllowedIps {
            v4: Family::new(32),
            v6: Family::new(128),
        }
    }
}

impl<T: Copy + Eq> AllowedIps<T> {
    /// Maps `net` (host bits cleared) to `v`, taking it from any peer that held it.
    pub fn insert(&mut self, net: IpNet, v: T) {
        match net.trunc() {
            IpNet::V4(n) => self.v4.insert(u32::from(n.addr()) as u128, n.prefix_len(), v),
            IpNet::V6(n) => self.v6.insert(u128::from(n.addr()), n.prefix_len(), v),
        }
    }

    /// Removes `net` if it maps to `v`; returns whether it did.
    pub fn remove(&mut self, net: IpNet, v: T) -> bool {
        let (fam, key, len) = match net.trunc() {
            IpNet::V4(n) => (&mut self.v4, u32::from(n.addr()) as u128, n.prefix_len()),
            IpNet::V6(n) => (&mut self.v6, u128::from(n.addr()), n.prefix_len()),
        };
        match fam.by_len[len as usize].get(&key) {
            Some(owner) if *owner == v => fam.remove(key, len).is_some(),
            _ => false,
        }
    }

    /// Removes every prefix of `v`.
    pub fn remove_value(&mut self, v: T) {
        self.v4.retain(|x| *x != v);
        self.v6.retain(|x| *x != v);
    }

    /// The value of the longest prefix containing `addr`.
    pub fn lookup(&self, addr: IpAddr) -> Option<T> {
        match addr {
            IpAddr::V4(a) => self.v4.lookup(u32::from(a) as u128, mask4),
            IpAddr::V6(a) => self.v6.lookup(u128::from(a), mask6),
        }
    }

    /// Every prefix of `v`, longest first within each family, IPv4 before IPv6.
    /// Every prefix with its value, longest first in each family: one pass over the table,
    /// where [`Self::prefixes_of`] for each of n values would be n passes.
    pub fn entries(&self) -> impl Iterator<Item = (IpNet, T)> + '_ {
        let v4 = (self.v4.in_use.iter()).flat_map(move |&l| {
            (self.v4.by_len[l as usize].iter())
                .map(move |(k, x)| (IpNet::V4(Ipv4Net::new((*k as u32).into(), l).unwrap()), *x))
        });
        let v6 = (self.v6.in_use.iter()).flat_map(move |&l| {
            (self.v6.by_len[l as usize].iter())
                .map(move |(k, x)| (IpNet::V6(Ipv6Net::new((*k).into(), l).unwrap()), *x))
        });
        v4.chain(v6)
    }

    pub fn prefixes_of(&self, v: T) -> Vec<IpNet> {
        let mut out = Vec::new();
        for &l in &self.v4.in_use {
            for (k, x) in &self.v4.by_len[l as usize] {
                if *x == v {
                    out.push(IpNet::V4(Ipv4Net::new((*k as u32).into(), l).unwrap()));
                }
            }
        }
        for &l in &self.v6.in_use {
            for (k, x) in &self.v6.by_len[l as usize] {
                if *x == v {
                    out.push(IpNet::V6(Ipv6Net::new((*k).into(), l).unwrap()));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn longest_prefix_wins() {
        let mut t = AllowedIps::default();
        t.insert(n("0.0.0.0/0"), 1);
        t.insert(n("10.0.0.0/8"), 2);
        t.insert(n("10.1.0.0/16"), 3);
        t.insert(n("10.1.2.3/32"), 4);
        t.insert(n("::/0"), 5);
        t.insert(n("fd00::/8"), 6);
        assert_eq!(t.lookup(a("10.1.2.3")), Some(4));
        assert_eq!(t.lookup(a("10.1.2.4")), Some(3));
        assert_eq!(t.lookup(a("10.2.0.1")), Some(2));
        assert_eq!(t.lookup(a("192.0.2.1")), Some(1));
        assert_eq!(t.lookup(a("fd12::1")), Some(6));
        assert_eq!(t.lookup(a("2001:db8::1")), Some(5));
    }

    #[test]
    fn host_bits_are_cleared_and_prefixes_move_between_peers() {
        let mut t = AllowedIps::default();
        t.insert(n("10.1.2.3/24"), 1);
        assert_eq!(t.prefixes_of(1), vec![n("10.1.2.0/24")]);
        t.insert(n("10.1.2.0/24"), 2);
        assert!(t.prefixes_of(1).is_empty());
        assert!(!t.remove(n("10.1.2.0/24"), 1), "only the owner removes");
        assert!(t.remove(n("10.1.2.0/24"), 2));
        assert_eq!(t.lookup(a("10.1.2.3")), None);
        t.insert(n("fd00::/64"), 7);
        t.insert(n("10.0.0.0/8"), 7);
        t.insert(n("10.9.0.0/16"), 8);
        let mut of_7: Vec<IpNet> = t.entries().filter(|e| e.1 == 7).map(|e| e.0).collect();
        of_7.sort();
        let mut want = t.prefixes_of(7);
        want.sort();
        assert_eq!(of_7, want, "entries holds what prefixes_of finds");
        assert_eq!(t.entries().count(), 3);
        t.remove_value(7);
        assert_eq!(t.lookup(a("fd00::1")), None);
        assert_eq!(t.lookup(a("10.0.0.1")), None);
    }

    proptest! {
        /// Against a linear scan for the longest containing prefix.
        #[test]
        fn matches_linear_scan(entries in proptest::collection::vec((any::<u32>(), 0u8..=32, 0u8..4), 0..40),
                               probes in proptest::collection::vec(any::<u32>(), 1..40)) {
            let mut t = AllowedIps::default();
            let mut model: Vec<(Ipv4Net, u8)> = Vec::new();
            for (addr, len, v) in entries {
                let net = Ipv4Net::new(addr.into(), len).unwrap().trunc();
                t.insert(IpNet::V4(net), v);
                model.retain(|(m, _)| *m != net);
                model.push((net, v));
            }
            for p in probes {
                let ip = std::net::Ipv4Addr::from(p);
                let want = model.iter().filter(|(m, _)| m.contains(&ip)).max_by_key(|(m, _)| m.prefix_len()).map(|(_, v)| *v);
                prop_assert_eq!(t.lookup(IpAddr::V4(ip)), want);
            }
        }
    }
}
