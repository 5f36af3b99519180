//! Desired peers → the dataplane contents they need, and the difference
//! between two such contents. Pure: tested without a kernel.
use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;

use super::on_link::OnLink;
use crate::{family::Family, peer::Peer};

/// The one next hop every route through the VTEP uses. A route without a
/// gateway would make one neighbour entry per destination address (and
/// `gc_thresh3` is 1024 by default); per-peer gateways, as flanneld uses,
/// make one per peer. A single on-link gateway keeps the neighbour table at
/// one entry, whatever the number of peers: the LPM map, not the routing
/// table, decides the peer. Link-local, so it never collides with a pod or
/// node address (Calico routes through 169.254.1.1 the same way).
pub const VTEP_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// An LPM entry: where frames for one pod subnet go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunnel {
    pub public_ip: Ipv4Addr,
    pub vtep_mac: [u8; 6],
}

/// An accepted peer address of either family: VXLAN from it is taken in,
/// with inner sources bound to `subnet`, the peer's pod subnet, unless
/// `any_inner_source` (an external VTEP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accept<N: Family> {
    pub subnet: N,
    pub any_inner_source: bool,
}

/// What the dataplane holds for the peers (or should hold).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    /// The LPM map: remote pod subnet → tunnel.
    pub subnets: BTreeMap<Ipv4Net, Tunnel>,
    /// The accepted peer addresses.
    pub accept: BTreeMap<Ipv4Addr, Accept<Ipv4Net>>,
    /// Routes in the main table through the VTEP: destination → gateway
    /// (`None` for a route without one).
    pub routes: BTreeMap<Ipv4Net, Option<Ipv4Addr>>,
    /// DirectRouting's routes in the main table through the underlay: a
    /// peer's pod subnet → its public IP (`SUBNET via PUBLIC_IP dev eth0`).
    /// What counts as one is in [`crate::dataplane::routes::MainTable::direct`].
    pub direct: BTreeMap<Ipv4Net, Ipv4Addr>,
}

/// The contents `peers` need: one LPM entry and one accepted address per
/// peer, and a single route for the whole `network` through the VTEP.
/// The route is there with no peers too: traffic to a subnet nobody owns
/// meets the encap program's counted drop rather than the default route.
///
/// DirectRouting, as flannel's `handleSubnetEvents`
/// (pkg/backend/vxlan/vxlan_network.go) does it on a lease add: a peer
/// whose public IP `on_link` reaches directly gets `SUBNET via PUBLIC_IP`
/// on the underlay, more specific than the Network route, so it wins and
/// no VXLAN is sent to it. It keeps its LPM entry and accepted address: a
/// peer without DirectRouting may still send VXLAN to us.
pub fn plan(peers: &[Peer], network: Ipv4Net, on_link: &OnLink) -> Contents {
    // the IPv4 halves (every peer has one unless the network is IPv6-only)
    let halves = || peers.iter().filter_map(|p| Some((p.v4?, p.any_inner_source)));
    Contents {
        direct: halves()
            .filter(|(v4, _)| on_link.reaches(v4.public_ip))
            .map(|(v4, _)| (v4.subnet, v4.public_ip))
            .collect(),
        subnets: halves()
            .map(|(v4, _)| (v4.subnet, Tunnel { public_ip: v4.public_ip, vtep_mac: v4.vtep_mac.0 }))
            .collect(),
        accept: halves()
            .map(|(v4, any_inner_source)| (v4.public_ip, Accept { subnet: v4.subnet, any_inner_source }))
            .collect(),
        routes: BTreeMap::from([(network, Some(VTEP_GATEWAY))]),
    }
}

/// The writes that turn `have` into `want`, in the order they must run:
/// every `put_*` before any `del_*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub put_accept: Vec<(Ipv4Addr, Accept<Ipv4Net>)>,
    pub put_subnets: Vec<(Ipv4Net, Tunnel)>,
    pub put_routes: Vec<(Ipv4Net, Option<Ipv4Addr>)>,
    pub put_direct: Vec<(Ipv4Net, Ipv4Addr)>,
    pub del_direct: Vec<(Ipv4Net, Ipv4Addr)>,
    pub del_routes: Vec<(Ipv4Net, Option<Ipv4Addr>)>,
    pub del_subnets: Vec<Ipv4Net>,
    pub del_accept: Vec<Ipv4Addr>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.put_accept.len()
            + self.put_subnets.len()
            + self.put_routes.len()
            + self.put_direct.len()
            + self.del_direct.len()
            + self.del_routes.len()
            + self.del_subnets.len()
            + self.del_accept.len()
    }
}

/// Entries to put and entries to delete.
type PutsAndDeletes<K, V> = (Vec<(K, V)>, Vec<(K, V)>);

/// Keys whose value differs or is missing in `have` (to put), and keys of
/// `have` that `want` lacks (to delete), each in key order.
fn diff_map<K: Ord + Copy, V: PartialEq + Copy>(want: &BTreeMap<K, V>, have: &BTreeMap<K, V>) -> PutsAndDeletes<K, V> {
    let put = want.iter().filter(|(k, v)| have.get(k) != Some(v)).map(|(k, v)| (*k, *v)).collect();
    let del = have.iter().filter(|(k, _)| !want.contains_key(k)).map(|(k, v)| (*k, *v)).collect();
    (put, del)
}

/// Key by key: an entry whose value changed is overwritten in place (a
/// put), never deleted and re-added.
pub fn diff(want: &Contents, have: &Contents) -> Changes {
    let (put_accept, del_accept) = diff_map(&want.accept, &have.accept);
    let (put_subnets, del_subnets) = diff_map(&want.subnets, &have.subnets);
    let (put_routes, del_routes) = diff_map(&want.routes, &have.routes);
    let (put_direct, del_direct) = diff_map(&want.direct, &have.direct);
    Changes {
        put_accept,
        put_subnets,
        put_routes,
        put_direct,
        del_direct,
        del_routes,
        del_subnets: del_subnets.into_iter().map(|(k, _)| k).collect(),
        del_accept: del_accept.into_iter().map(|(k, _)| k).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::test_peer as peer;

    fn net() -> Ipv4Net {
        "10.244.0.0/16".parse().unwrap()
    }
    fn none() -> OnLink {
        OnLink::default()
    }
    /// 198.18.0.0/24 is our segment; the rest is behind a router.
    fn segment() -> OnLink {
        let hop = |dst: &str, direct| super::super::on_link::Hop { dst: dst.parse().unwrap(), direct };
        OnLink::new(vec![hop("198.18.0.0/24", true), hop("0.0.0.0/0", false)], net())
    }

    #[test]
    fn a_name_swap_changes_nothing() {
        let before =
            plan(&[peer("a", "10.244.2.0/24", "198.18.0.2"), peer("b", "10.244.3.0/24", "198.18.0.3")], net(), &none());
        let after =
            plan(&[peer("b", "10.244.2.0/24", "198.18.0.2"), peer("a", "10.244.3.0/24", "198.18.0.3")], net(), &none());
        assert!(diff(&after, &before).is_empty());
    }

    #[test]
    fn a_chain_shift_overwrites_in_place_and_deletes_only_what_left() {
        // node2 .2 -> .3, node3 .3 -> .4 in one edit
        let before = plan(
            &[peer("n2", "10.244.2.0/24", "198.18.0.2"), peer("n3", "10.244.3.0/24", "198.18.0.3")],
            net(),
            &none(),
        );
        let after = plan(
            &[peer("n2", "10.244.2.0/24", "198.18.0.3"), peer("n3", "10.244.3.0/24", "198.18.0.4")],
            net(),
            &none(),
        );
        let c = diff(&after, &before);
        // .3 is now node2's (bound to its CIDR), .4 is new
        assert_eq!(c.put_accept.iter().map(|(ip, _)| ip.to_string()).collect::<Vec<_>>(), ["198.18.0.3", "198.18.0.4"]);
        assert_eq!(c.put_subnets.len(), 2);
        assert!(c.del_subnets.is_empty());
        assert_eq!(c.del_accept, ["198.18.0.2".parse::<Ipv4Addr>().unwrap()]);
        assert!(c.put_routes.is_empty() && c.del_routes.is_empty());
    }

    #[test]
    fn one_route_for_the_network_whatever_the_number_of_peers() {
        let peers: Vec<Peer> = (0..1000)
            .map(|i| peer(&format!("n{i}"), &format!("10.{}.{}.0/24", 100 + i / 256, i % 256), "198.18.0.2"))
            .collect();
        let c = plan(&peers, "10.96.0.0/11".parse().unwrap(), &none());
        assert_eq!(c.routes.len(), 1);
        assert_eq!(c.subnets.len(), 1000);
    }

    #[test]
    fn drift_and_strays_are_repaired() {
        let want = plan(&[peer("a", "10.244.2.0/24", "198.18.0.2")], net(), &none());
        let mut have = want.clone();
        have.routes.clear(); // deleted by hand
        have.routes.insert("10.244.9.0/24".parse().unwrap(), Some("10.244.9.0".parse().unwrap())); // flanneld's
        have.subnets.insert(
            "10.244.2.0/24".parse().unwrap(),
            Tunnel { public_ip: "198.18.0.9".parse().unwrap(), vtep_mac: [0; 6] },
        );
        let c = diff(&want, &have);
        assert_eq!(c.put_routes.len(), 1);
        assert_eq!(c.del_routes.len(), 1);
        assert_eq!(c.put_subnets.len(), 1);
        assert!(c.del_subnets.is_empty());
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn on_link_peers_get_a_direct_route_and_the_others_the_vtep() {
        let peers = [peer("near", "10.244.2.0/24", "198.18.0.2"), peer("far", "10.244.3.0/24", "198.18.1.3")];
        let c = plan(&peers, net(), &segment());
        let direct: Vec<_> = c.direct.iter().map(|(n, ip)| format!("{n} via {ip}")).collect();
        assert_eq!(direct, ["10.244.2.0/24 via 198.18.0.2"]);
        assert_eq!(c.routes, BTreeMap::from([(net(), Some(VTEP_GATEWAY))]), "the far peer uses the Network route");
        // both stay in the maps: a peer without DirectRouting may still send VXLAN
        assert_eq!((c.subnets.len(), c.accept.len()), (2, 2));
        // DirectRouting off: nothing is on-link
        assert!(plan(&peers, net(), &none()).direct.is_empty());
    }

    #[test]
    fn direct_routes_follow_the_peer_and_the_switch() {
        let near = [peer("a", "10.244.2.0/24", "198.18.0.2")];
        let before = plan(&near, net(), &segment());
        // the peer moves behind the router: its direct route goes, nothing is added
        let moved = plan(&[peer("a", "10.244.2.0/24", "198.18.1.2")], net(), &segment());
        let c = diff(&moved, &before);
        assert_eq!(c.del_direct, [("10.244.2.0/24".parse().unwrap(), "198.18.0.2".parse().unwrap())]);
        assert!(c.put_direct.is_empty() && c.put_routes.is_empty() && c.del_routes.is_empty());
        // a new public IP on the same segment: overwritten in place
        let renumbered = plan(&[peer("a", "10.244.2.0/24", "198.18.0.9")], net(), &segment());
        let c = diff(&renumbered, &before);
        assert_eq!(c.put_direct, [("10.244.2.0/24".parse().unwrap(), "198.18.0.9".parse().unwrap())]);
        assert!(c.del_direct.is_empty());
        // DirectRouting switched off (a restart), or the peer deleted: the route goes
        assert_eq!(diff(&plan(&near, net(), &none()), &before).del_direct.len(), 1);
        assert_eq!(diff(&plan(&[], net(), &segment()), &before).del_direct.len(), 1);
        // deleted by hand: put back
        let mut have = before.clone();
        have.direct.clear();
        assert_eq!(diff(&before, &have).put_direct.len(), 1);
    }
}
