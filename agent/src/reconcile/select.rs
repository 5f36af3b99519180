//! Which candidates become peers. Pure, and O(n log n): a peer list of
//! tens of thousands of nodes is checked in milliseconds.
//!
//! A conflict is settled as the network would settle it, never by a
//! node's name or its place in the list: the same candidates in any order
//! give the same peers, on a node that has run for months and on one that
//! starts fresh (or from its cache) alike.
//! - Pod CIDRs that overlap each other are all taken: the LPM map (and the
//!   kernel's routes for IPv6) sends each address to the longest prefix
//!   holding it, as flannel's routes do, and the programs judge an inner
//!   source by that prefix's owner too.
//! - Two entries with the very same pod CIDR, or the same node name
//!   twice: the entry that appeared first ([`Peer::appeared`]: the Node's
//!   creationTimestamp, the etcd key's create revision) is kept. When that
//!   is unknown or a tie, none is: the subnet manager gave one CIDR twice.
//! - A shared public IP keeps every entry behind it, as flannel keeps both
//!   fdb entries.
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Display,
    hash::Hash,
    net::IpAddr,
};

use ipnet::{Ipv4Net, Ipv6Net};

use crate::{
    family::Family,
    peer::{Peer, PeerHalf, Rejection},
};

fn overlaps<N: Family>(a: N, b: N) -> bool {
    a.covers(&b) || b.covers(&a)
}

/// Of the entries `group` (indices into `candidates`), the one that
/// appeared first, if that is known: every entry says when it appeared,
/// and exactly one did first.
pub fn first_to_appear(candidates: &[&Peer], group: &[usize]) -> Option<usize> {
    let first = group.iter().map(|&i| candidates[i].appeared).collect::<Option<Vec<i64>>>()?.into_iter().min()?;
    let mut at = group.iter().copied().filter(|&i| candidates[i].appeared == Some(first));
    let winner = at.next()?;
    at.next().is_none().then_some(winner)
}

/// The reason a peer's own pod CIDR of family `N` rules it out, if it does.
fn against_own<N: PeerHalf>(p: &Peer, own: Option<N>, what: &str) -> Option<String> {
    let (half, own) = (p.half::<N>()?, own?);
    overlaps(half.subnet, own).then(|| format!("{what} {} overlaps our own {own}", half.subnet))
}

/// Settles the candidates still `alive` that share a `key` (a name, a pod
/// CIDR): the one that appeared first stays, the others are rejected; all
/// of them when none is known to be first. `what` names the key.
fn settle<K: Eq + Hash + Display>(
    candidates: &[&Peer],
    alive: &mut [bool],
    key: impl Fn(&Peer) -> Option<K>,
    what: &str,
    rejected: &mut Vec<Rejection>,
) {
    let mut groups: HashMap<K, Vec<usize>> = HashMap::new();
    for (i, p) in candidates.iter().enumerate().filter(|(i, _)| alive[*i]) {
        if let Some(k) = key(p) {
            groups.entry(k).or_default().push(i);
        }
    }
    for (k, group) in groups.into_iter().filter(|(_, g)| g.len() > 1) {
        let winner = first_to_appear(candidates, &group);
        for &i in &group {
            let reason = match winner {
                Some(w) if w == i => continue,
                Some(w) => format!("{what} {k} is also node {}'s, whose entry appeared first", candidates[w].node),
                None => {
                    let mut others: Vec<&str> =
                        group.iter().filter(|&&o| o != i).map(|&o| candidates[o].node.as_str()).collect();
                    others.sort_unstable();
                    format!(
                        "{what} {k} is also claimed by {} and which entry appeared first is not known: none is taken",
                        others.join(", ")
                    )
                }
            };
            alive[i] = false;
            rejected.push(Rejection { node: candidates[i].node.clone(), reason });
        }
    }
}

/// Chooses which candidates become peers. A candidate is rejected, with
/// the reason, when it has no half, when a pod CIDR of it overlaps ours
/// (`own`, `own6`: a peer may never take this node's own pods), or when it
/// loses a tie that routing cannot settle (the same node name, the same
/// pod CIDR of either family: see the module doc). A peer whose IPv6 half
/// is rejected is rejected whole, as flannel treats a node as one lease.
/// `own` is `None` in an IPv6-only network, whose peers have no IPv4 half.
///
/// The result does not depend on the candidates' order: the peers come
/// out by name (then pod CIDR), the rejections by name (then reason).
pub fn select(own: Option<Ipv4Net>, own6: Option<Ipv6Net>, candidates: &[Peer]) -> (Vec<Peer>, Vec<Rejection>) {
    let mut sorted: Vec<&Peer> = candidates.iter().collect();
    // one order, whatever the list's: the groups and reasons below come out the same
    sorted.sort_by(|a, b| {
        (&a.node, a.v4.map(|h| h.subnet), a.v6.map(|h| h.subnet), a.appeared).cmp(&(
            &b.node,
            b.v4.map(|h| h.subnet),
            b.v6.map(|h| h.subnet),
            b.appeared,
        ))
    });
    let candidates = sorted;
    let mut rejected = Vec::new();
    let mut alive = vec![true; candidates.len()];
    for (i, p) in candidates.iter().enumerate() {
        let reason = if p.v4.is_none() && p.v6.is_none() {
            Some("neither an IPv4 nor an IPv6 half".to_string())
        } else {
            against_own(p, own, "pod CIDR").or_else(|| against_own(p, own6, "IPv6 pod CIDR"))
        };
        if let Some(reason) = reason {
            alive[i] = false;
            rejected.push(Rejection { node: p.node.clone(), reason });
        }
    }
    settle(&candidates, &mut alive, |p| Some(p.node.clone()), "the node name", &mut rejected);
    settle(&candidates, &mut alive, |p| p.v4.map(|h| h.subnet), "pod CIDR", &mut rejected);
    settle(&candidates, &mut alive, |p| p.v6.map(|h| h.subnet), "IPv6 pod CIDR", &mut rejected);
    let accepted = candidates.iter().zip(&alive).filter(|(_, a)| **a).map(|(p, _)| (*p).clone()).collect();
    rejected.sort_by(|a, b| (&a.node, &a.reason).cmp(&(&b.node, &b.reason)));
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
    use crate::reconcile::test_peer as peer;

    fn own() -> Option<Ipv4Net> {
        Some("10.244.1.0/24".parse().unwrap())
    }

    fn at(mut p: Peer, appeared: i64) -> Peer {
        p.appeared = Some(appeared);
        p
    }

    fn names(peers: &[Peer]) -> Vec<&str> {
        peers.iter().map(|p| p.node.as_str()).collect()
    }

    fn reason(bad: &[Rejection], node: &str) -> String {
        bad.iter().filter(|r| r.node == node).map(|r| r.reason.clone()).collect::<Vec<_>>().join(" | ")
    }

    #[test]
    fn overlap_with_own_subnet_is_rejected() {
        let (ok, bad) =
            select(own(), None, &[peer("x", "10.244.1.0/25", "198.18.0.9"), peer("y", "10.244.0.0/16", "198.18.0.8")]);
        assert!(ok.is_empty());
        assert_eq!(bad.len(), 2);
        assert_eq!(bad[0].reason, "pod CIDR 10.244.1.0/25 overlaps our own 10.244.1.0/24");
        assert!(bad[1].reason.contains("overlaps our own"));
    }

    /// Finding 3b: a superset beside a victim's subnet takes none of its
    /// addresses. Both are programmed; the LPM map gives the victim's /24
    /// its own traffic, and the decap judge its own sources.
    #[test]
    fn overlapping_peer_subnets_are_all_taken_as_routing_would() {
        let victim = at(peer("victim", "10.244.2.0/24", "198.18.0.2"), 100);
        let attacker = at(peer("aaa-attacker", "10.244.2.0/23", "198.18.0.3"), 200);
        let (ok, bad) = select(own(), None, &[attacker.clone(), victim.clone()]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(ok, vec![attacker, victim]);
    }

    /// Finding 3a: a node claiming a victim's public IP drops nobody; both
    /// entries are kept, as flannel keeps both fdb entries.
    #[test]
    fn a_shared_public_ip_keeps_both_entries() {
        let victim = peer("victim", "10.244.2.0/24", "198.18.0.2");
        let attacker = peer("aaa-attacker", "10.244.3.0/24", "198.18.0.2");
        let (ok, bad) = select(own(), None, &[attacker, victim]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(names(&ok), ["aaa-attacker", "victim"]);
    }

    #[test]
    fn the_same_subnet_twice_goes_to_the_entry_that_appeared_first() {
        let victim = at(peer("victim", "10.244.2.0/24", "198.18.0.2"), 100);
        let copy = at(peer("aaa-copy", "10.244.2.0/24", "198.18.0.3"), 200);
        let (ok, bad) = select(own(), None, &[copy.clone(), victim.clone()]);
        assert_eq!(names(&ok), ["victim"]);
        assert_eq!(
            reason(&bad, "aaa-copy"),
            "pod CIDR 10.244.2.0/24 is also node victim's, whose entry appeared first"
        );
        // neither known to be first (a nodes file without timestamps), or a tie: neither
        for (a, b) in [(None, None), (Some(5), Some(5)), (None, None)] {
            let (ok, bad) =
                select(own(), None, &[Peer { appeared: a, ..victim.clone() }, Peer { appeared: b, ..copy.clone() }]);
            assert!(ok.is_empty(), "{ok:?}");
            assert!(reason(&bad, "victim").contains("also claimed by aaa-copy"), "{bad:?}");
            assert!(reason(&bad, "aaa-copy").contains("also claimed by victim"), "{bad:?}");
        }
    }

    #[test]
    fn a_name_listed_twice_goes_to_the_entry_that_appeared_first() {
        let first = at(peer("a", "10.244.2.0/24", "198.18.0.2"), 1);
        let second = at(peer("a", "10.244.4.0/24", "198.18.0.4"), 2);
        let (ok, bad) = select(own(), None, &[second.clone(), first.clone()]);
        assert_eq!(ok, vec![first.clone()]);
        assert!(reason(&bad, "a").contains("the node name a is also node a's"), "{bad:?}");
        let (ok, bad) = select(own(), None, &[Peer { appeared: None, ..first }, Peer { appeared: None, ..second }]);
        assert!(ok.is_empty());
        assert_eq!(bad.len(), 2);
    }

    /// The decision is the candidates', not their order's: every shuffle of
    /// a list full of conflicts (overlaps, shared IPs, twins, names twice,
    /// our own CIDR, both families) gives the same peers and reasons.
    #[test]
    fn the_decision_does_not_depend_on_the_order() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let own6_net: Ipv6Net = "fd00:10:244:1::/64".parse().unwrap();
        let own6 = Some(own6_net);
        for _ in 0..50 {
            let candidates: Vec<Peer> = (0..40)
                .map(|i| {
                    let r = next();
                    let len = 22 + (r % 4) as u8;
                    let addr = std::net::Ipv4Addr::from(0x0af4_0000 | ((r >> 8) as u32 & 0x0000_0f00));
                    let net = Ipv4Net::new(addr, len).unwrap().trunc();
                    let name = format!("n{}", (r >> 20) % 30);
                    let ip = [198, 18, 0, ((r >> 30) % 8) as u8].into();
                    let mut p = Peer::v4(&name, net, ip, "02:00:00:00:00:01".parse().unwrap());
                    p.appeared = ((r >> 40) % 4 != 0).then_some(((r >> 42) % 6) as i64);
                    if (r >> 50) % 2 == 0 {
                        let n6 =
                            Ipv6Net::new(format!("fd00:10:244:{:x}::", (r >> 52) % 4).parse().unwrap(), 63 + (i % 2))
                                .unwrap()
                                .trunc();
                        let ip6 = format!("fd00:198:18::{}", (r >> 56) % 8).parse().unwrap();
                        p.v6 = Some(crate::peer::Half { subnet: n6, public_ip: ip6, vtep_mac: p.v4.unwrap().vtep_mac });
                    }
                    p
                })
                .collect();
            let want = select(own(), own6, &candidates);
            let mut shuffled = candidates.clone();
            for _ in 0..5 {
                for i in (1..shuffled.len()).rev() {
                    shuffled.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                assert_eq!(select(own(), own6, &shuffled), want);
            }
            // and nothing taken collides where routing cannot settle it
            let (ok, _) = &want;
            for (i, a) in ok.iter().enumerate() {
                for b in &ok[i + 1..] {
                    assert_ne!(a.node, b.node);
                    assert_ne!(a.v4.map(|h| h.subnet), b.v4.map(|h| h.subnet));
                    assert!(a.v6.is_none() || a.v6.map(|h| h.subnet) != b.v6.map(|h| h.subnet));
                }
                assert!(!overlaps(a.v4.unwrap().subnet, own().unwrap()));
                assert!(a.v6.is_none_or(|h| !overlaps(h.subnet, own6_net)));
            }
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
    fn ipv6_halves_follow_the_same_rules() {
        let own6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let (ok, bad) = select(
            own(),
            own6,
            &[
                peer6("a", 2, "fd00:10:244:2::/64", 2),
                peer6("ours", 3, "fd00:10:244:1:8000::/65", 3),
                peer6("inside", 4, "fd00:10:244:2:1::/80", 4),
                peer6("wide", 5, "fd00:10:244::/56", 5),
                peer6("sameip", 6, "fd00:10:244:6::/64", 2),
                peer("v4only", "10.244.7.0/24", "198.18.0.7"),
                at(peer6("twin", 8, "fd00:10:244:2::/64", 8), 9),
                at(peer6("b", 9, "fd00:10:244:9::/64", 9), 1),
            ],
        );
        // overlapping and shared-address halves are kept; the twin of a's /64 loses (a's age is unknown)
        assert_eq!(names(&ok), ["b", "inside", "sameip", "v4only"]);
        assert_eq!(reason(&bad, "ours"), "IPv6 pod CIDR fd00:10:244:1:8000::/65 overlaps our own fd00:10:244:1::/64");
        assert!(reason(&bad, "wide").contains("overlaps our own"), "{bad:?}");
        assert!(reason(&bad, "a").contains("also claimed by twin"), "{bad:?}");
        assert!(reason(&bad, "twin").contains("also claimed by a"), "{bad:?}");
        // a rejected IPv6 half rejects the peer whole, and its IPv4 subnet is free for another
        let (ok, _) =
            select(own(), own6, &[peer6("x", 3, "fd00:10:244:1::/64", 3), peer("y", "10.244.3.0/24", "198.18.0.9")]);
        assert_eq!(names(&ok), ["y"]);
    }

    #[test]
    fn ipv6_only_peers_are_checked_by_their_ipv6_half() {
        let only6 = |name: &str, n: u8, subnet6: &str, ip6: u8| Peer { v4: None, ..peer6(name, n, subnet6, ip6) };
        let own6 = Some("fd00:10:244:1::/64".parse().unwrap());
        let (ok, bad) = select(
            None,
            own6,
            &[
                at(only6("a", 2, "fd00:10:244:2::/64", 2), 1),
                only6("ours", 3, "fd00:10:244:1::/64", 3),
                only6("inside", 4, "fd00:10:244:2::/80", 4),
                at(only6("same", 5, "fd00:10:244:2::/64", 5), 2),
                Peer { v6: None, ..only6("empty", 7, "fd00:10:244:7::/64", 7) },
            ],
        );
        assert_eq!(names(&ok), ["a", "inside"]);
        assert!(reason(&bad, "ours").contains("overlaps our own"), "{bad:?}");
        assert!(reason(&bad, "same").contains("also node a's"), "{bad:?}");
        assert_eq!(reason(&bad, "empty"), "neither an IPv4 nor an IPv6 half");
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
