//! What must change on the interface so that its fleet peers are what etcd says: a plan
//! (`uapi::apply`'s, as for a UAPI `set`: applied whole under one hold of the core's lock)
//! from the records, the peers the fleet put there, and the peers as they are.
//!
//! Level-triggered, as a Kubernetes controller is: the plan is made from the whole picture
//! each time, not from the last event, so that whatever else changed the peers (`wg set`,
//! `wg syncconf` of a file without the fleet's peers) is put right at the next pass, and a
//! missed event costs nothing once the records are read again.

use super::record::FleetPeer;
use crate::device::peers::PeerCopy;
use crate::uapi::protocol::{AllowedIpChange, PeerPlan, SetPlan};
use ordo_proto::PublicKey;
use std::collections::{BTreeMap, BTreeSet};

/// The plan that makes `current` agree with `desired`, and the fleet's peers once it is
/// applied. A peer the fleet put there and no record names any more is removed; a peer a
/// record names is added, or corrected where it differs: its allowed IPs (replaced whole),
/// its keepalive, and its endpoint only if it has none (a peer that roamed keeps where it
/// went). Peers of the interface that no record names and the fleet did not put there (a
/// file's [Peer] sections) are left alone. None when nothing differs.
pub fn plan(
    desired: &BTreeMap<PublicKey, FleetPeer>,
    owned: &BTreeSet<PublicKey>,
    current: &[PeerCopy],
) -> (Option<SetPlan>, BTreeSet<PublicKey>) {
    let now: BTreeMap<&PublicKey, &PeerCopy> = current.iter().map(|p| (&p.public_key, p)).collect();
    let mut peers = Vec::new();
    for key in owned
        .iter()
        .filter(|k| !desired.contains_key(*k) && now.contains_key(k))
    {
        peers.push(PeerPlan {
            remove: true,
            ..PeerPlan::new(*key)
        });
    }
    for (key, want) in desired {
        let mut p = PeerPlan::new(*key);
        let have = now.get(key);
        let same_ips = have.is_some_and(|h| {
            let a: BTreeSet<_> = h.allowed_ips.iter().collect();
            let b: BTreeSet<_> = want.allowed_ips.iter().collect();
            a == b
        });
        if !same_ips {
            p.replace_allowed_ips = true;
            p.allowed_ips = want.allowed_ips.iter().map(|n| AllowedIpChange::Add(*n)).collect();
        }
        let keepalive = want.persistent_keepalive.unwrap_or(0);
        if have.is_none_or(|h| h.persistent_keepalive != keepalive) {
            p.persistent_keepalive = Some(keepalive);
        }
        if have.is_none_or(|h| h.endpoint.is_none()) {
            p.endpoint = want.endpoint;
        }
        let changes = p.replace_allowed_ips || p.persistent_keepalive.is_some() || p.endpoint.is_some();
        if have.is_none() || changes {
            peers.push(p);
        }
    }
    let owned_after = desired.keys().copied().collect();
    let plan = (!peers.is_empty()).then(|| SetPlan {
        peers,
        ..SetPlan::default()
    });
    (plan, owned_after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_proto::PrivateKey;

    fn key(seed: u8) -> PublicKey {
        PrivateKey::from_bytes([seed; 32]).public_key()
    }

    fn record(ips: &[&str], keepalive: Option<u16>) -> FleetPeer {
        FleetPeer {
            allowed_ips: ips.iter().map(|n| n.parse().unwrap()).collect(),
            endpoint: None,
            persistent_keepalive: keepalive,
        }
    }

    fn copy(k: PublicKey, ips: &[&str], keepalive: u16) -> PeerCopy {
        PeerCopy {
            persistent_keepalive: keepalive,
            allowed_ips: ips.iter().map(|n| n.parse().unwrap()).collect(),
            ..PeerCopy::bare(k)
        }
    }

    #[test]
    fn records_become_peers_and_a_matching_interface_needs_nothing() {
        let desired = BTreeMap::from([(key(1), record(&["10.7.0.2/32"], Some(25)))]);
        let (plan, owned) = plan(&desired, &BTreeSet::new(), &[]);
        let plan = plan.expect("a new peer");
        assert_eq!(plan.peers.len(), 1);
        let p = &plan.peers[0];
        assert!(!p.remove && p.replace_allowed_ips && !plan.replace_peers);
        assert_eq!(p.allowed_ips, [AllowedIpChange::Add("10.7.0.2/32".parse().unwrap())]);
        assert_eq!(p.persistent_keepalive, Some(25));
        assert_eq!(owned, BTreeSet::from([key(1)]));
        let now = [copy(key(1), &["10.7.0.2/32"], 25)];
        assert!(super::plan(&desired, &owned, &now).0.is_none(), "nothing differs");
    }

    #[test]
    fn drift_is_corrected_and_a_deleted_record_removes_only_the_fleets_peer() {
        let owned = BTreeSet::from([key(1), key(2)]);
        let desired = BTreeMap::from([(key(1), record(&["10.7.0.2/32", "10.7.1.0/24"], None))]);
        let now = [
            copy(key(1), &["10.7.0.2/32"], 0),
            copy(key(2), &["10.7.0.3/32"], 0),
            copy(key(3), &["10.9.0.1/32"], 0),
        ];
        let (plan, owned) = plan(&desired, &owned, &now);
        let plan = plan.unwrap();
        let removed: Vec<_> = plan.peers.iter().filter(|p| p.remove).map(|p| p.public_key).collect();
        assert_eq!(
            removed,
            [key(2)],
            "the fleet's peer whose record went; the file's peer stays"
        );
        let fixed = plan.peers.iter().find(|p| p.public_key == key(1)).unwrap();
        assert!(fixed.replace_allowed_ips && fixed.allowed_ips.len() == 2);
        assert_eq!(fixed.persistent_keepalive, None, "unchanged, so not touched");
        assert_eq!(owned, BTreeSet::from([key(1)]));
    }

    #[test]
    fn a_peer_removed_behind_the_fleets_back_comes_back() {
        let desired = BTreeMap::from([(key(1), record(&["10.7.0.2/32"], None))]);
        let owned = BTreeSet::from([key(1)]);
        let plan = plan(&desired, &owned, &[]).0.expect("put back");
        assert!(!plan.peers[0].remove && plan.peers[0].replace_allowed_ips);
    }

    #[test]
    fn an_endpoint_is_set_only_on_a_peer_without_one() {
        let mut want = record(&[], None);
        want.endpoint = Some("192.0.2.7:51820".parse().unwrap());
        let desired = BTreeMap::from([(key(1), want)]);
        let mut roamed = copy(key(1), &[], 0);
        roamed.endpoint = Some("198.51.100.9:4000".parse().unwrap());
        assert!(
            plan(&desired, &BTreeSet::new(), &[roamed]).0.is_none(),
            "where it roamed to stays"
        );
        let fresh = plan(&desired, &BTreeSet::new(), &[]).0.unwrap();
        assert_eq!(fresh.peers[0].endpoint, Some("192.0.2.7:51820".parse().unwrap()));
    }
}
