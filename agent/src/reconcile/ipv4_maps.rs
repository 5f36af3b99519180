//! The IPv4 peer table's reconciliation, from desired peers to the writes:
//! the maps and routes the peers need ([`plan`]), the difference from what
//! the kernel holds ([`diff`]), and the writes in the order they must run
//! ([`apply`]) through an [`Ipv4MapWriter`]: the BPF maps and routes in
//! production (`dataplane/ipv4_table.rs`), a fake in the tests. The plan and
//! the diff are pure; the order is tested against the fake. The IPv6 table
//! has the same three steps in `ipv6_entries.rs`, over the kernel's entries.
use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;
use tracing::{info, warn};

use super::{
    on_link::OnLink,
    outcome::{Outcome, Tally},
};
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

/// What the IPv4 table holds for the peers (or should hold): the BPF maps
/// the programs encapsulate and judge by, and the routes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Maps {
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
pub fn plan(peers: &[Peer], network: Ipv4Net, on_link: &OnLink) -> Ipv4Maps {
    // the IPv4 halves (every peer has one unless the network is IPv6-only)
    let halves = || peers.iter().filter_map(|p| Some((p.v4?, p.any_inner_source)));
    Ipv4Maps {
        direct: halves()
            .filter(|(v4, _)| on_link.reaches(v4.public_ip))
            .map(|(v4, _)| (v4.subnet, v4.public_ip))
            .collect(),
        subnets: halves()
            .map(|(v4, _)| (v4.subnet, Tunnel { public_ip: v4.public_ip, vtep_mac: v4.vtep_mac.0 }))
            .collect(),
        accept: accept_by_public_ip(halves().map(|(v4, any)| (v4.public_ip, v4.subnet, any))),
        routes: BTreeMap::from([(network, Some(VTEP_GATEWAY))]),
    }
}

/// Whether `have` already holds `p`: its IPv4 subnet is in the LPM map,
/// to its public IP. Over the capacity, such a peer stays ahead of one not
/// in yet.
pub fn holds(have: &Ipv4Maps, p: &Peer) -> bool {
    p.v4.is_some_and(|v4| have.subnets.get(&v4.subnet).is_some_and(|t| t.public_ip == v4.public_ip))
}

/// One accept entry per public IP, of either family, for `halves`
/// (public IP, pod CIDR, exempt). Entries that share a public IP (a node
/// with more than one subnet, or two nodes claiming one address: both are
/// kept, as flannel keeps both fdb entries) make one: exempt if any is,
/// bound to the lowest of their pod CIDRs, whatever their order. The
/// programs judge an inner source by the owner of the longest prefix
/// holding it (`EDGEVX_PEER_SUBNETS`, `EDGEVX_PEER_SUBNETS6`), so every
/// subnet behind the address may send; the entry's own CIDR binds only a
/// source no programmed prefix holds.
pub fn accept_by_public_ip<N: Family>(
    halves: impl Iterator<Item = (N::Addr, N, bool)>,
) -> BTreeMap<N::Addr, Accept<N>> {
    let mut accept: BTreeMap<N::Addr, Accept<N>> = BTreeMap::new();
    for (ip, subnet, any_inner_source) in halves {
        accept
            .entry(ip)
            .and_modify(|a| {
                a.subnet = a.subnet.min(subnet);
                a.any_inner_source |= any_inner_source;
            })
            .or_insert(Accept { subnet, any_inner_source });
    }
    accept
}

/// The writes that turn `have` into `want`, in the order they must run:
/// every `put_*` before any `del_*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapChanges {
    pub put_accept: Vec<(Ipv4Addr, Accept<Ipv4Net>)>,
    pub put_subnets: Vec<(Ipv4Net, Tunnel)>,
    pub put_routes: Vec<(Ipv4Net, Option<Ipv4Addr>)>,
    pub put_direct: Vec<(Ipv4Net, Ipv4Addr)>,
    pub del_direct: Vec<(Ipv4Net, Ipv4Addr)>,
    pub del_routes: Vec<(Ipv4Net, Option<Ipv4Addr>)>,
    pub del_subnets: Vec<Ipv4Net>,
    pub del_accept: Vec<Ipv4Addr>,
}

impl MapChanges {
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
pub(super) type PutsAndDeletes<K, V> = (Vec<(K, V)>, Vec<(K, V)>);

/// Keys whose value differs or is missing in `have` (to put), and keys of
/// `have` that `want` lacks (to delete), each in key order.
pub(super) fn diff_map<K: Ord + Copy, V: PartialEq + Copy>(
    want: &BTreeMap<K, V>,
    have: &BTreeMap<K, V>,
) -> PutsAndDeletes<K, V> {
    let put = want.iter().filter(|(k, v)| have.get(k) != Some(v)).map(|(k, v)| (*k, *v)).collect();
    let del = have.iter().filter(|(k, _)| !want.contains_key(k)).map(|(k, v)| (*k, *v)).collect();
    (put, del)
}

/// Key by key: an entry whose value changed is overwritten in place (a
/// put), never deleted and re-added.
pub fn diff(want: &Ipv4Maps, have: &Ipv4Maps) -> MapChanges {
    let (put_accept, del_accept) = diff_map(&want.accept, &have.accept);
    let (put_subnets, del_subnets) = diff_map(&want.subnets, &have.subnets);
    let (put_routes, del_routes) = diff_map(&want.routes, &have.routes);
    let (put_direct, del_direct) = diff_map(&want.direct, &have.direct);
    MapChanges {
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

/// Where IPv4 peers are written, key by key: BPF maps and routes in
/// production, a fake in the tests. Every write is idempotent (a put overwrites, a delete of
/// something already gone succeeds).
#[allow(async_fn_in_trait)]
pub trait Ipv4MapWriter {
    async fn put_accept(&mut self, ip: Ipv4Addr, accept: Accept<Ipv4Net>) -> anyhow::Result<()>;
    async fn put_subnet(&mut self, subnet: Ipv4Net, tunnel: Tunnel) -> anyhow::Result<()>;
    async fn put_route(&mut self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> anyhow::Result<()>;
    async fn del_route(&mut self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> anyhow::Result<()>;
    async fn put_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> anyhow::Result<()>;
    async fn del_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> anyhow::Result<()>;
    async fn del_subnet(&mut self, subnet: Ipv4Net) -> anyhow::Result<()>;
    async fn del_accept(&mut self, ip: Ipv4Addr) -> anyhow::Result<()>;
}

/// Runs `changes` against `dp`:
/// 1. map entries no peer wants go first, always. They cannot be something
///    the view still holds (an entry whose value changed is overwritten in
///    place, never deleted), and a full map needs their room before
///    anything new fits: a peer removed from the source is never left
///    programmed and accepted because an add failed.
/// 2. Every add and overwrite runs, a subnet before its peer is accepted
///    (replies have somewhere to go). A failed one is retried on the next
///    pass; the others still run.
/// 3. Routes no peer wants go last, unless a route add failed: the route
///    about to go may be what traffic follows until the new one is in
///    (flanneld's per-peer routes on a takeover, a direct route before the
///    VTEP's route).
pub async fn apply<D: Ipv4MapWriter>(dp: &mut D, changes: &MapChanges) -> Outcome {
    let mut t = Tally::default();
    for net in &changes.del_subnets {
        t.note("removing subnet", net, dp.del_subnet(*net).await);
    }
    for ip in &changes.del_accept {
        t.note("no longer accepting VXLAN from", ip, dp.del_accept(*ip).await);
    }
    for (net, tunnel) in &changes.put_subnets {
        t.note("programming subnet", net, dp.put_subnet(*net, *tunnel).await);
    }
    for (ip, a) in &changes.put_accept {
        t.note("accepting VXLAN from", ip, dp.put_accept(*ip, *a).await);
    }
    let before_routes = t.out.failed;
    for (net, gw) in &changes.put_routes {
        t.note("adding the route to", net, dp.put_route(*net, *gw).await);
    }
    for (net, ip) in &changes.put_direct {
        t.note("adding the direct route to", net, dp.put_direct(*net, *ip).await);
    }
    if t.out.failed > before_routes {
        t.out.deferred = changes.del_direct.len() + changes.del_routes.len();
    } else {
        for (net, ip) in &changes.del_direct {
            t.note("deleting the direct route to", net, dp.del_direct(*net, *ip).await);
        }
        for (net, gw) in &changes.del_routes {
            t.note("deleting the route to", net, dp.del_route(*net, *gw).await);
        }
    }
    let out = t.out;
    if let Some(first) = &t.first_error {
        warn!(
            failed = out.failed,
            deferred = out.deferred,
            "{} peer writes failed, will retry; the first: {first}",
            out.failed
        );
    }
    if out.written > 0 {
        info!(
            accept = changes.put_accept.len(),
            subnets = changes.put_subnets.len(),
            routes = changes.put_routes.len(),
            direct_routes = changes.put_direct.len(),
            removed_direct_routes = changes.del_direct.len(),
            removed_routes = changes.del_routes.len(),
            removed_subnets = changes.del_subnets.len(),
            removed_accept = changes.del_accept.len(),
            failed = out.failed,
            "peer entries written"
        );
    }
    out
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
    fn a_peer_is_held_by_its_subnet_to_its_public_ip() {
        let have = plan(&[peer("a", "10.244.2.0/24", "198.18.0.2")], net(), &none());
        assert!(holds(&have, &peer("a", "10.244.2.0/24", "198.18.0.2")));
        assert!(holds(&have, &peer("renamed", "10.244.2.0/24", "198.18.0.2")), "the entry, not the name");
        assert!(!holds(&have, &peer("a", "10.244.2.0/24", "198.18.0.9")), "another public IP is not held");
        assert!(!holds(&have, &peer("b", "10.244.3.0/24", "198.18.0.2")));
        let mut v6_only = peer("c", "10.244.2.0/24", "198.18.0.2");
        v6_only.v4 = None;
        assert!(!holds(&have, &v6_only));
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

#[cfg(test)]
mod apply_tests {
    use super::*;
    use crate::reconcile::{Hop, fit, select, test_peer as peer};

    /// A dataplane in memory that logs each write and can fail one key. Its
    /// maps refuse a new key when they hold `capacity` (as the kernel's do,
    /// with E2BIG), when one is set.
    #[derive(Default)]
    struct Fake {
        have: Ipv4Maps,
        log: Vec<String>,
        fail_subnet: Option<Ipv4Net>,
        fail_route: bool,
        on_link: OnLink,
        capacity: Option<usize>,
    }

    impl Fake {
        fn full<K: Ord, V>(&self, map: &std::collections::BTreeMap<K, V>, key: &K) -> bool {
            self.capacity.is_some_and(|c| map.len() >= c && !map.contains_key(key))
        }
    }

    impl Ipv4MapWriter for Fake {
        async fn put_direct(&mut self, net: Ipv4Net, ip: Ipv4Addr) -> anyhow::Result<()> {
            self.log.push(format!("+direct {net} via {ip}"));
            self.have.direct.insert(net, ip);
            Ok(())
        }
        async fn del_direct(&mut self, net: Ipv4Net, ip: Ipv4Addr) -> anyhow::Result<()> {
            self.log.push(format!("-direct {net} via {ip}"));
            self.have.direct.remove(&net);
            Ok(())
        }
        async fn put_accept(&mut self, ip: Ipv4Addr, a: Accept<Ipv4Net>) -> anyhow::Result<()> {
            if self.full(&self.have.accept, &ip) {
                anyhow::bail!("map full");
            }
            self.log.push(format!("+accept {ip}"));
            self.have.accept.insert(ip, a);
            Ok(())
        }
        async fn put_subnet(&mut self, net: Ipv4Net, t: Tunnel) -> anyhow::Result<()> {
            if self.fail_subnet == Some(net) || self.full(&self.have.subnets, &net) {
                anyhow::bail!("injected");
            }
            self.log.push(format!("+subnet {net}"));
            self.have.subnets.insert(net, t);
            Ok(())
        }
        async fn put_route(&mut self, net: Ipv4Net, gw: Option<Ipv4Addr>) -> anyhow::Result<()> {
            if self.fail_route {
                anyhow::bail!("injected");
            }
            self.log.push(format!("+route {net}"));
            self.have.routes.insert(net, gw);
            Ok(())
        }
        async fn del_route(&mut self, net: Ipv4Net, _: Option<Ipv4Addr>) -> anyhow::Result<()> {
            self.log.push(format!("-route {net}"));
            self.have.routes.remove(&net);
            Ok(())
        }
        async fn del_subnet(&mut self, net: Ipv4Net) -> anyhow::Result<()> {
            self.log.push(format!("-subnet {net}"));
            self.have.subnets.remove(&net);
            Ok(())
        }
        async fn del_accept(&mut self, ip: Ipv4Addr) -> anyhow::Result<()> {
            self.log.push(format!("-accept {ip}"));
            self.have.accept.remove(&ip);
            Ok(())
        }
    }

    async fn pass(dp: &mut Fake, peers: &[Peer]) -> Outcome {
        let (have, on_link) = (dp.have.clone(), dp.on_link.clone());
        apply(dp, &diff(&plan(peers, "10.244.0.0/16".parse().unwrap(), &on_link), &have)).await
    }

    #[tokio::test]
    async fn unwanted_map_entries_go_first_and_a_failed_add_holds_none_back() {
        let mut dp = Fake::default();
        pass(&mut dp, &[peer("a", "10.244.2.0/24", "198.18.0.2")]).await;
        dp.log.clear();
        dp.fail_subnet = Some("10.244.3.0/24".parse().unwrap());
        let b = [peer("b", "10.244.3.0/24", "198.18.0.3")];
        let out = pass(&mut dp, &b).await;
        assert_eq!((out.failed, out.deferred), (1, 0));
        // a left the view: it is neither programmed nor accepted, whatever b's add did
        assert_eq!(dp.log, ["-subnet 10.244.2.0/24", "-accept 198.18.0.2", "+accept 198.18.0.3"]);
        dp.fail_subnet = None;
        dp.log.clear();
        assert!(pass(&mut dp, &b).await.ok());
        assert_eq!(dp.log, ["+subnet 10.244.3.0/24"]);
        dp.log.clear();
        assert_eq!(pass(&mut dp, &b).await, Outcome::default(), "nothing to do is nothing done");
        assert!(dp.log.is_empty());
    }

    #[tokio::test]
    async fn a_full_map_makes_room_by_deleting_first() {
        let mut dp = Fake { capacity: Some(2), ..Fake::default() };
        let (a, b, c) = (
            peer("a", "10.244.2.0/24", "198.18.0.2"),
            peer("b", "10.244.3.0/24", "198.18.0.3"),
            peer("c", "10.244.4.0/24", "198.18.0.4"),
        );
        assert!(pass(&mut dp, &[a, b.clone()]).await.ok());
        // a goes and c comes in one edit: the map is full until a's entries are gone
        let out = pass(&mut dp, &[b, c]).await;
        assert!(out.ok(), "{out:?} {:?}", dp.log);
        let nets: Vec<String> = dp.have.subnets.keys().map(|n| n.to_string()).collect();
        assert_eq!(nets, ["10.244.3.0/24", "10.244.4.0/24"]);
        assert!(!dp.have.accept.contains_key(&"198.18.0.2".parse().unwrap()));
    }

    /// A view beyond the limit, as the agent's pass makes it (select, fit,
    /// plan, apply): every pass writes what fits and nothing fails; a peer
    /// removed from the source is removed from the maps at once, and the
    /// first peer left out takes its place.
    #[tokio::test]
    async fn over_capacity_nothing_fails_and_a_removed_peer_goes() {
        let capacity = 4;
        let mut dp = Fake { capacity: Some(capacity), ..Fake::default() };
        let node = |i: u8| peer(&format!("n{i}"), &format!("10.244.{}.0/24", 10 + i), &format!("198.18.0.{}", 10 + i));
        let agent_pass = async |dp: &mut Fake, view: &[Peer]| {
            let have = dp.have.clone();
            let (ok, _) = select(Some("10.244.1.0/24".parse().unwrap()), None, view);
            let established = |p: &Peer| p.v4.is_some_and(|v4| have.subnets.contains_key(&v4.subnet));
            let (kept, left_out) = fit(ok, capacity, established);
            let out = apply(dp, &diff(&plan(&kept, "10.244.0.0/16".parse().unwrap(), &OnLink::default()), &have)).await;
            (out, left_out.into_iter().map(|p| p.node).collect::<Vec<_>>())
        };
        let view: Vec<Peer> = (0..6).map(node).collect();
        let (out, left_out) = agent_pass(&mut dp, &view).await;
        assert!(out.ok(), "{out:?}");
        assert_eq!(left_out, ["n4", "n5"]);
        assert_eq!(dp.have.subnets.len(), capacity);
        // again: nothing to do, nothing failed
        assert_eq!(agent_pass(&mut dp, &view).await.0, Outcome::default());
        // n1 removed from the source
        let view: Vec<Peer> = view.into_iter().filter(|p| p.node != "n1").collect();
        let (out, left_out) = agent_pass(&mut dp, &view).await;
        assert!(out.ok(), "{out:?}");
        assert_eq!(left_out, ["n5"]);
        assert!(!dp.have.subnets.contains_key(&"10.244.11.0/24".parse().unwrap()), "n1 still programmed");
        assert!(!dp.have.accept.contains_key(&"198.18.0.11".parse().unwrap()), "n1 still accepted");
        assert!(dp.have.subnets.contains_key(&"10.244.14.0/24".parse().unwrap()), "n4 took the place");
    }

    #[tokio::test]
    async fn a_peer_leaving_the_segment_gets_the_vtep_before_its_direct_route_goes() {
        let segment = |direct| {
            OnLink::new(vec![Hop { dst: "198.18.0.0/24".parse().unwrap(), direct }], "10.244.0.0/16".parse().unwrap())
        };
        let mut dp = Fake { on_link: segment(true), ..Fake::default() };
        let a = [peer("a", "10.244.2.0/24", "198.18.0.2")];
        assert!(pass(&mut dp, &a).await.ok());
        assert!(dp.log.contains(&"+direct 10.244.2.0/24 via 198.18.0.2".to_string()), "{:?}", dp.log);
        assert!(dp.log.contains(&"+route 10.244.0.0/16".to_string()), "{:?}", dp.log);
        dp.log.clear();
        // the segment's route now has a gateway (renumbered underlay): encapsulate
        dp.on_link = segment(false);
        assert!(pass(&mut dp, &a).await.ok());
        assert_eq!(dp.log, ["-direct 10.244.2.0/24 via 198.18.0.2"], "the Network route through the VTEP is there");
        // the Network route is gone too and cannot be put back: the direct route stays
        dp.on_link = segment(true);
        pass(&mut dp, &a).await;
        dp.have.routes.clear();
        dp.fail_route = true;
        dp.on_link = segment(false);
        let out = pass(&mut dp, &a).await;
        assert_eq!((out.failed, out.deferred), (1, 1));
        assert_eq!(dp.have.direct.len(), 1);
        dp.fail_route = false;
        assert!(pass(&mut dp, &a).await.ok());
        assert!(dp.have.direct.is_empty() && dp.have.routes.len() == 1);
    }
}
