//! Which candidates become peers. Pure, and O(n log n): a peer list of
//! tens of thousands of nodes is checked in milliseconds.
use std::collections::{BTreeMap, HashMap, HashSet};

use ipnet::Ipv4Net;

use super::plan::Contents;
use crate::peer::{Peer, Rejection};

/// Accepted pod CIDRs as disjoint address intervals, keyed by first address.
#[derive(Default)]
struct Intervals(BTreeMap<u32, (u32, usize)>);

impl Intervals {
    fn bounds(net: Ipv4Net) -> (u32, u32) {
        (u32::from(net.network()), u32::from(net.broadcast()))
    }

    /// The accepted interval that overlaps `net`, if any. The intervals are
    /// disjoint, so of those starting at or before `net`'s last address only
    /// the one starting last can reach into it.
    fn overlapping(&self, net: Ipv4Net) -> Option<usize> {
        let (first, last) = Self::bounds(net);
        let (_, &(end, index)) = self.0.range(..=last).next_back()?;
        (end >= first).then_some(index)
    }

    fn insert(&mut self, net: Ipv4Net, index: usize) {
        let (first, last) = Self::bounds(net);
        self.0.insert(first, (last, index));
    }
}

/// Chooses which candidates become peers. A peer the dataplane already
/// holds (its subnet is in the LPM map with its public IP) keeps its place;
/// a newcomer whose subnet overlaps ours or an accepted peer's, or whose
/// public IP or name is taken, is rejected with the reason.
pub fn select(own: Ipv4Net, observed: &Contents, candidates: &[Peer]) -> (Vec<Peer>, Vec<Rejection>) {
    let established = |p: &Peer| observed.subnets.get(&p.subnet).is_some_and(|t| t.public_ip == p.public_ip);
    let mut ordered: Vec<&Peer> = candidates.iter().filter(|p| established(p)).collect();
    ordered.extend(candidates.iter().filter(|p| !established(p)));

    let mut accepted: Vec<Peer> = Vec::with_capacity(candidates.len());
    let mut rejected = Vec::new();
    let mut names: HashSet<&str> = HashSet::with_capacity(candidates.len());
    let mut ips: HashMap<std::net::Ipv4Addr, usize> = HashMap::with_capacity(candidates.len());
    let mut intervals = Intervals::default();
    for p in ordered {
        let reject = |reason: String| Rejection { node: p.node.clone(), reason };
        if names.contains(p.node.as_str()) {
            rejected.push(reject("the node is listed twice".into()));
        } else if own.contains(&p.subnet.network()) || p.subnet.contains(&own.network()) {
            rejected.push(reject(format!("pod CIDR {} overlaps our own {own}", p.subnet)));
        } else if let Some(a) = intervals.overlapping(p.subnet).map(|i| &accepted[i]) {
            rejected.push(reject(format!("pod CIDR {} overlaps {} of node {}", p.subnet, a.subnet, a.node)));
        } else if let Some(a) = ips.get(&p.public_ip).map(|&i| &accepted[i]) {
            rejected.push(reject(format!("public IP {} is already node {}'s", p.public_ip, a.node)));
        } else {
            names.insert(&p.node);
            ips.insert(p.public_ip, accepted.len());
            intervals.insert(p.subnet, accepted.len());
            accepted.push(p.clone());
        }
    }
    (accepted, rejected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::plan;
    use crate::reconcile::test_peer as peer;

    fn own() -> Ipv4Net {
        "10.244.1.0/24".parse().unwrap()
    }
    fn nothing() -> Contents {
        Contents::default()
    }

    #[test]
    fn overlap_with_own_subnet_is_rejected() {
        let (ok, bad) = select(
            own(),
            &nothing(),
            &[peer("x", "10.244.1.0/25", "198.18.0.9"), peer("y", "10.244.0.0/16", "198.18.0.8")],
        );
        assert!(ok.is_empty());
        assert_eq!(bad.len(), 2);
        assert!(bad[0].reason.contains("overlaps our own"));
    }

    #[test]
    fn established_peer_keeps_its_subnet_against_a_newcomer() {
        let old = peer("old", "10.244.2.0/24", "198.18.0.2");
        let observed = plan(std::slice::from_ref(&old), "10.244.0.0/16".parse().unwrap(), &Default::default());
        // the newcomer is listed first, but the one in the dataplane wins
        let (ok, bad) = select(own(), &observed, &[peer("new", "10.244.2.0/25", "198.18.0.3"), old.clone()]);
        assert_eq!(ok, vec![old]);
        assert_eq!(bad[0].node, "new");
        assert!(bad[0].reason.contains("of node old"), "{}", bad[0].reason);
    }

    #[test]
    fn duplicate_public_ip_and_name_are_rejected() {
        let (ok, bad) = select(
            own(),
            &nothing(),
            &[
                peer("a", "10.244.2.0/24", "198.18.0.2"),
                peer("b", "10.244.3.0/24", "198.18.0.2"),
                peer("a", "10.244.4.0/24", "198.18.0.4"),
            ],
        );
        assert_eq!(ok.len(), 1);
        assert!(bad.iter().any(|r| r.node == "b" && r.reason.contains("public IP")));
        assert!(bad.iter().any(|r| r.node == "a" && r.reason.contains("twice")));
    }

    /// The interval index gives the same verdicts as comparing every pair.
    #[test]
    fn overlap_index_agrees_with_the_pairwise_check() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let candidates: Vec<Peer> = (0..40)
                .map(|i| {
                    let r = next();
                    let len = 20 + (r % 9) as u8;
                    let addr = std::net::Ipv4Addr::from(0x0a00_0000 | ((r >> 8) as u32 & 0x00ff_ffff));
                    let net = Ipv4Net::new(addr, len).unwrap().trunc();
                    Peer {
                        node: format!("n{i}"),
                        subnet: net,
                        public_ip: [198, 18, 1, i as u8].into(),
                        vtep_mac: "02:00:00:00:00:01".parse().unwrap(),
                        any_inner_source: false,
                        v6: None,
                    }
                })
                .collect();
            let (ok, _) = select("192.168.0.0/24".parse().unwrap(), &nothing(), &candidates);
            // pairwise reference
            let mut want: Vec<&Peer> = Vec::new();
            for p in &candidates {
                if !want
                    .iter()
                    .any(|a| a.subnet.contains(&p.subnet.network()) || p.subnet.contains(&a.subnet.network()))
                {
                    want.push(p);
                }
            }
            assert_eq!(
                ok.iter().map(|p| &p.node).collect::<Vec<_>>(),
                want.iter().map(|p| &p.node).collect::<Vec<_>>()
            );
        }
    }
}
