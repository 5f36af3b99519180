//! Which candidates become peers. Pure, and O(n log n): a peer list of
//! tens of thousands of nodes is checked in milliseconds.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
};

use ipnet::{Ipv4Net, Ipv6Net};

use super::plan::Contents;
use crate::{
    family::Family,
    peer::{Peer, Rejection},
};

/// Accepted pod CIDRs of one family as disjoint address intervals, keyed by
/// first address.
struct Intervals<A>(BTreeMap<A, (A, usize)>);

impl<A: Ord + Copy> Intervals<A> {
    fn new() -> Self {
        Intervals(BTreeMap::new())
    }

    /// The accepted interval that overlaps `[first, last]`, if any. The
    /// intervals are disjoint, so of those starting at or before `last`
    /// only the one starting last can reach into it.
    fn overlapping(&self, (first, last): (A, A)) -> Option<usize> {
        let (_, &(end, index)) = self.0.range(..=last).next_back()?;
        (end >= first).then_some(index)
    }

    fn insert(&mut self, (first, last): (A, A), index: usize) {
        self.0.insert(first, (last, index));
    }
}

/// A prefix's first and last address, as numbers.
fn bounds<N: Family>(net: N) -> (u128, u128) {
    (N::bits(net.network_addr()), net.last_bits())
}

fn overlaps<N: Family>(a: N, b: N) -> bool {
    a.covers(&b) || b.covers(&a)
}

/// Chooses which candidates become peers. A peer the dataplane already
/// holds (its subnet is in the LPM map with its public IP) keeps its place;
/// a newcomer whose subnet overlaps ours or an accepted peer's, or whose
/// public IP or name is taken, is rejected with the reason. The same holds
/// for a peer's IPv6 half (against `own6`, our IPv6 pod CIDR), and a peer
/// whose IPv6 half collides is rejected whole, as flannel treats a node as
/// one lease. `own` is `None` in an IPv6-only network, whose peers have
/// no IPv4 half.
pub fn select(
    own: Option<Ipv4Net>,
    own6: Option<Ipv6Net>,
    observed: &Contents,
    candidates: &[Peer],
) -> (Vec<Peer>, Vec<Rejection>) {
    let established =
        |p: &Peer| p.v4.is_some_and(|v4| observed.subnets.get(&v4.subnet).is_some_and(|t| t.public_ip == v4.public_ip));
    let mut ordered: Vec<&Peer> = candidates.iter().filter(|p| established(p)).collect();
    ordered.extend(candidates.iter().filter(|p| !established(p)));

    let mut accepted: Vec<Peer> = Vec::with_capacity(candidates.len());
    let mut rejected = Vec::new();
    let mut names: HashSet<&str> = HashSet::with_capacity(candidates.len());
    let mut ips: HashMap<IpAddr, usize> = HashMap::with_capacity(candidates.len());
    let mut intervals = Intervals::new();
    let mut intervals6 = Intervals::new();
    for p in ordered {
        let reject = |reason: String| Rejection { node: p.node.clone(), reason };
        let (v4, v6) = (p.v4.as_ref(), p.v6.as_ref());
        let ip6 = v6.map(|v6| IpAddr::V6(v6.public_ip));
        let subnet4 = |a: &Peer| a.v4.map(|a4| a4.subnet.to_string()).unwrap_or_default();
        if names.contains(p.node.as_str()) {
            rejected.push(reject("the node is listed twice".into()));
        } else if let Some((v4, own)) = v4.zip(own).filter(|(v4, own)| overlaps(v4.subnet, *own)) {
            rejected.push(reject(format!("pod CIDR {} overlaps our own {own}", v4.subnet)));
        } else if let Some((v4, a)) = v4.and_then(|v4| Some((v4, &accepted[intervals.overlapping(bounds(v4.subnet))?])))
        {
            rejected.push(reject(format!("pod CIDR {} overlaps {} of node {}", v4.subnet, subnet4(a), a.node)));
        } else if let Some((v4, a)) = v4.and_then(|v4| Some((v4, &accepted[*ips.get(&IpAddr::V4(v4.public_ip))?]))) {
            rejected.push(reject(format!("public IP {} is already node {}'s", v4.public_ip, a.node)));
        } else if let Some((v6, own6)) = v6.zip(own6).filter(|(v6, own6)| overlaps(v6.subnet, *own6)) {
            rejected.push(reject(format!("IPv6 pod CIDR {} overlaps our own {own6}", v6.subnet)));
        } else if let Some((v6, a)) =
            v6.and_then(|v6| Some((v6, &accepted[intervals6.overlapping(bounds(v6.subnet))?])))
        {
            let theirs = a.v6.map(|a6| a6.subnet.to_string()).unwrap_or_default();
            rejected.push(reject(format!("IPv6 pod CIDR {} overlaps {theirs} of node {}", v6.subnet, a.node)));
        } else if let Some((ip6, a)) = ip6.and_then(|ip6| Some((ip6, &accepted[*ips.get(&ip6)?]))) {
            rejected.push(reject(format!("public IPv6 {ip6} is already node {}'s", a.node)));
        } else if v4.is_none() && v6.is_none() {
            rejected.push(reject("neither an IPv4 nor an IPv6 half".into()));
        } else {
            names.insert(&p.node);
            if let Some(v4) = v4 {
                ips.insert(IpAddr::V4(v4.public_ip), accepted.len());
                intervals.insert(bounds(v4.subnet), accepted.len());
            }
            if let Some(v6) = v6 {
                ips.insert(IpAddr::V6(v6.public_ip), accepted.len());
                intervals6.insert(bounds(v6.subnet), accepted.len());
            }
            accepted.push(p.clone());
        }
    }
    (accepted, rejected)
}

/// The candidates that claim one of this node's own addresses (`own`:
/// address → where it is, read from the kernel) as their public IP, IPv4
/// or IPv6, with the reason. They are left out whole: VXLAN from that
/// "peer" would be accepted from whoever spoofs this node's address.
pub fn claiming_ours(candidates: &[Peer], own: &BTreeMap<IpAddr, String>) -> Vec<Rejection> {
    let claim = |p: &Peer| {
        let v4 = p.v4.map(|v4| IpAddr::V4(v4.public_ip));
        let v6 = p.v6.map(|v6| IpAddr::V6(v6.public_ip));
        [v4, v6].into_iter().flatten().find_map(|ip| Some((ip, own.get(&ip)?)))
    };
    candidates
        .iter()
        .filter_map(|p| {
            let (ip, what) = claim(p)?;
            Some(Rejection { node: p.node.clone(), reason: format!("public IP {ip} is this node's own ({what})") })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::plan;
    use crate::reconcile::test_peer as peer;

    fn own() -> Option<Ipv4Net> {
        Some("10.244.1.0/24".parse().unwrap())
    }
    fn nothing() -> Contents {
        Contents::default()
    }

    #[test]
    fn overlap_with_own_subnet_is_rejected() {
        let (ok, bad) = select(
            own(),
            None,
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
        let (ok, bad) = select(own(), None, &observed, &[peer("new", "10.244.2.0/25", "198.18.0.3"), old.clone()]);
        assert_eq!(ok, vec![old]);
        assert_eq!(bad[0].node, "new");
        assert!(bad[0].reason.contains("of node old"), "{}", bad[0].reason);
    }

    #[test]
    fn duplicate_public_ip_and_name_are_rejected() {
        let (ok, bad) = select(
            own(),
            None,
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
                    Peer::v4(&format!("n{i}"), net, [198, 18, 1, i as u8].into(), "02:00:00:00:00:01".parse().unwrap())
                })
                .collect();
            let (ok, _) = select(Some("192.168.0.0/24".parse().unwrap()), None, &nothing(), &candidates);
            // pairwise reference
            let mut want: Vec<&Peer> = Vec::new();
            let net = |p: &Peer| p.v4.unwrap().subnet;
            for p in &candidates {
                if !want.iter().any(|a| net(a).contains(&net(p).network()) || net(p).contains(&net(a).network())) {
                    want.push(p);
                }
            }
            assert_eq!(
                ok.iter().map(|p| &p.node).collect::<Vec<_>>(),
                want.iter().map(|p| &p.node).collect::<Vec<_>>()
            );
        }
    }

    /// Node `n` with 10.244.<n>.0/24 and `subnet6`, public 198.18.0.<n> and fd00:198:18::<ip6>.
    fn peer6(name: &str, n: u8, subnet6: &str, ip6: u8) -> Peer {
        let mut p = peer(name, &format!("10.244.{n}.0/24"), &format!("198.18.0.{n}"));
        p.v6 = Some(crate::peer::Half {
            subnet: subnet6.parse().unwrap(),
            public_ip: format!("fd00:198:18::{ip6}").parse().unwrap(),
            vtep_mac: "02:00:00:00:00:06".parse().unwrap(),
        });
        p
    }

    #[test]
    fn a_colliding_ipv6_half_rejects_the_peer_whole() {
        let own6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let (ok, bad) = select(
            own(),
            own6,
            &nothing(),
            &[
                peer6("a", 2, "fd00:10:244:2::/64", 2),
                peer6("ours", 3, "fd00:10:244:1:8000::/65", 3),
                peer6("inside", 4, "fd00:10:244:2:1::/80", 4),
                peer6("wide", 5, "fd00:10:244::/56", 5),
                peer6("sameip", 6, "fd00:10:244:6::/64", 2),
                peer("v4only", "10.244.7.0/24", "198.18.0.7"),
                peer6("b", 8, "fd00:10:244:8::/64", 8),
            ],
        );
        assert_eq!(ok.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["a", "v4only", "b"]);
        let reason = |n: &str| bad.iter().find(|r| r.node == n).map(|r| r.reason.clone()).unwrap_or_default();
        assert_eq!(reason("ours"), "IPv6 pod CIDR fd00:10:244:1:8000::/65 overlaps our own fd00:10:244:1::/64");
        assert_eq!(reason("inside"), "IPv6 pod CIDR fd00:10:244:2:1::/80 overlaps fd00:10:244:2::/64 of node a");
        assert!(reason("wide").contains("overlaps our own"), "{}", reason("wide"));
        assert_eq!(reason("sameip"), "public IPv6 fd00:198:18::2 is already node a's");
        // the rejected IPv6 halves did not take their IPv4 subnets: a later peer may have them
        let (ok, _) = select(
            own(),
            own6,
            &nothing(),
            &[peer6("x", 3, "fd00:10:244:1::/64", 3), peer("y", "10.244.3.0/24", "198.18.0.9")],
        );
        assert_eq!(ok.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["y"]);
    }

    #[test]
    fn ipv6_halves_are_checked_without_an_own_ipv6_subnet_too() {
        let (ok, bad) = select(
            own(),
            None,
            &nothing(),
            &[peer6("a", 2, "fd00:10:244:2::/64", 2), peer6("b", 3, "fd00:10:244:2::/64", 3)],
        );
        assert_eq!(ok.len(), 1);
        assert!(bad[0].reason.contains("of node a"), "{:?}", bad);
    }

    #[test]
    fn ipv6_only_peers_are_checked_by_their_ipv6_half() {
        let only6 = |name: &str, n: u8, subnet6: &str, ip6: u8| Peer { v4: None, ..peer6(name, n, subnet6, ip6) };
        let own6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let (ok, bad) = select(
            None,
            own6,
            &nothing(),
            &[
                only6("a", 2, "fd00:10:244:2::/64", 2),
                only6("ours", 3, "fd00:10:244:1::/64", 3),
                only6("inside", 4, "fd00:10:244:2::/80", 4),
                only6("sameip", 5, "fd00:10:244:5::/64", 2),
                only6("a", 6, "fd00:10:244:6::/64", 6),
                Peer { v6: None, ..only6("empty", 7, "fd00:10:244:7::/64", 7) },
                only6("b", 8, "fd00:10:244:8::/64", 8),
            ],
        );
        assert_eq!(ok.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let reason = |n: &str| bad.iter().find(|r| r.node == n).map(|r| r.reason.clone()).unwrap_or_default();
        assert!(reason("ours").contains("overlaps our own"), "{bad:?}");
        assert!(reason("inside").contains("of node a"), "{bad:?}");
        assert!(reason("sameip").contains("already node a's"), "{bad:?}");
        assert_eq!(reason("a"), "the node is listed twice");
        assert_eq!(reason("empty"), "neither an IPv4 nor an IPv6 half");
    }

    #[test]
    fn a_peer_claiming_an_address_of_this_node_is_named() {
        let own: BTreeMap<IpAddr, String> = [
            ("198.18.0.255".parse().unwrap(), "the broadcast address of eth0".to_string()),
            ("fd00::1".parse().unwrap(), "on cni0".to_string()),
        ]
        .into();
        let mut six = peer("c", "10.244.4.0/24", "198.18.0.4");
        six.v6 = Some(crate::peer::Half {
            subnet: "fd10:0:0:4::/64".parse().unwrap(),
            public_ip: "fd00::1".parse().unwrap(),
            vtep_mac: six.v4.unwrap().vtep_mac,
        });
        let peers = [peer("a", "10.244.2.0/24", "198.18.0.255"), peer("b", "10.244.3.0/24", "198.18.0.3"), six];
        let bad = claiming_ours(&peers, &own);
        let said: Vec<(&str, &str)> = bad.iter().map(|r| (r.node.as_str(), r.reason.as_str())).collect();
        assert_eq!(
            said,
            [
                ("a", "public IP 198.18.0.255 is this node's own (the broadcast address of eth0)"),
                ("c", "public IP fd00::1 is this node's own (on cni0)"),
            ]
        );
        assert!(claiming_ours(&peers, &BTreeMap::new()).is_empty());
    }
}
