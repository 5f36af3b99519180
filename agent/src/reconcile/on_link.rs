//! Which peers are on one of our directly connected underlay subnets: the
//! kernel's fact that DirectRouting decides by, in either family. Pure: the
//! dataplane reads the routes, this answers for each public IP.
use ipnet::Ipv4Net;

use crate::family::Family;

/// One route of the main table, as far as reaching a peer is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop<N = Ipv4Net> {
    pub dst: N,
    /// Reaches its destinations directly through the underlay: a unicast
    /// route out of the underlay device with no gateway (the kernel's
    /// prefix route for the underlay's address, `198.18.0.0/24 dev eth0
    /// proto kernel scope link` or `fd00:198:18::/64 dev eth0 proto
    /// kernel`, or one like it added by hand or learned from a router
    /// advertisement).
    pub direct: bool,
}

/// The main table's routes outside the pod network, most specific first.
/// Empty when DirectRouting is off: then no peer is on-link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnLink<N = Ipv4Net> {
    hops: Vec<Hop<N>>,
}

impl<N> Default for OnLink<N> {
    fn default() -> Self {
        OnLink { hops: Vec::new() }
    }
}

impl<N: Family> OnLink<N> {
    /// Keeps the routes that are not within `network` (the pod routes, ours
    /// among them, never decide how a peer's public IP is reached).
    pub fn new(mut hops: Vec<Hop<N>>, network: N) -> Self {
        hops.retain(|h| !network.covers(&h.dst));
        hops.sort_by_key(|h| std::cmp::Reverse(h.dst.prefix_length()));
        OnLink { hops }
    }

    /// flannel's `ip.DirectRouting` (pkg/ip/iface.go): `ip route get
    /// <public IP>` gives one route and it has no gateway. Here the longest
    /// match in the main table, which must also leave through the underlay,
    /// the device the direct route names. Policy rules and other tables are
    /// not consulted: flannel's nodes route through the main table.
    pub fn reaches(&self, ip: N::Addr) -> bool {
        self.hops.iter().find(|h| h.dst.holds(&ip)).is_some_and(|h| h.direct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::{Ipv4Net, Ipv6Net};

    fn hop(dst: &str, direct: bool) -> Hop {
        Hop { dst: dst.parse().unwrap(), direct }
    }

    #[test]
    fn the_longest_match_decides() {
        let t = OnLink::new(
            vec![
                hop("0.0.0.0/0", false),
                hop("198.18.0.0/24", true),
                hop("198.18.0.128/25", false), // a part of the segment behind a router
                hop("198.18.1.0/24", false),
                hop("10.244.0.0/16", false),
            ],
            "10.244.0.0/16".parse().unwrap(),
        );
        assert!(t.reaches("198.18.0.2".parse().unwrap()));
        assert!(!t.reaches("198.18.0.200".parse().unwrap()));
        assert!(!t.reaches("198.18.1.3".parse().unwrap()));
        assert!(!t.reaches("203.0.113.1".parse().unwrap()));
    }

    #[test]
    fn nothing_is_on_link_without_routes_or_inside_the_pod_network() {
        assert!(!OnLink::<Ipv4Net>::default().reaches("198.18.0.2".parse().unwrap()));
        // a route within the Network (a pod's, or ours) is not the underlay's
        let t = OnLink::new(vec![hop("10.244.2.0/24", true)], "10.244.0.0/16".parse().unwrap());
        assert!(!t.reaches("10.244.2.5".parse().unwrap()));
    }

    #[test]
    fn ipv6_is_decided_the_same_way() {
        let hop6 = |dst: &str, direct| Hop::<Ipv6Net> { dst: dst.parse().unwrap(), direct };
        let t = OnLink::new(
            vec![
                hop6("::/0", false),
                hop6("fd00:198:18::/64", true),
                hop6("fd00:198:18:0:8000::/65", false),
                hop6("fe80::/64", true),
                hop6("fd00:10:244:2::/64", true),
            ],
            "fd00:10:244::/56".parse().unwrap(),
        );
        assert!(t.reaches("fd00:198:18::2".parse().unwrap()));
        assert!(!t.reaches("fd00:198:18:0:8000::2".parse().unwrap()));
        assert!(!t.reaches("2001:db8::1".parse().unwrap()));
        assert!(!t.reaches("fd00:10:244:2::5".parse().unwrap()), "a pod route is not the underlay's");
        assert!(!OnLink::<Ipv6Net>::default().reaches("fd00:198:18::2".parse().unwrap()));
    }
}
