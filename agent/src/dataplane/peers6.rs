//! The IPv6 peers on `flannel-v6.<VNI>`, in flannel's form (its vxlan
//! backend's `handleSubnetEvents`, IPv6 half), three kernel objects each:
//! - `ip -6 neigh replace <base> lladdr <v6 VtepMAC> dev flannel-v6.1 nud permanent`
//! - `bridge fdb replace <v6 VtepMAC> dev flannel-v6.1 dst <PublicIPv6> self permanent`
//! - `ip -6 route replace <v6 subnet> via <base> dev flannel-v6.1 onlink`
//!
//! where `<base>` is the subnet's first address; or, with DirectRouting and
//! the peer's PublicIPv6 on-link, only
//! - `ip -6 route replace <v6 subnet> via <PublicIPv6> dev eth0`.
//!
//! Like the IPv4 side, the kernel is the truth: every pass reads the tables
//! back, adds or replaces what is missing or different first, and deletes
//! what no peer wants last (flannel never deletes a stale entry,
//! flannel#2554). The device is edgevx's alone, so anything else on it is
//! stale; on the underlay only the direct routes of programmed peers are.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv6Addr},
};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use ipnet::Ipv6Net;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::{
        AddressFamily,
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState},
        route::RouteProtocol,
    },
};

use crate::gone;
use crate::{
    dataplane::routes,
    mac::VtepMac,
    peer::{Half, Peer, Rejection},
    reconcile::{Accept, OnLink, Outcome, PeerTable},
};

/// What the three tables of the IPv6 VTEP and the underlay's direct routes
/// hold, or should.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables6 {
    /// Permanent neighbours: peer subnet base → its v6 VtepMAC.
    pub neigh: BTreeMap<Ipv6Addr, VtepMac>,
    /// fdb entries: (v6 VtepMAC, peer's public IPv6).
    pub fdb: BTreeSet<(VtepMac, Ipv6Addr)>,
    /// Routes through the device: peer v6 subnet → gateway (its base).
    pub routes: BTreeMap<Ipv6Net, Ipv6Addr>,
    /// DirectRouting's routes through the underlay: peer v6 subnet → its
    /// public IPv6. What counts as one is in [`routes::MainTable::direct`],
    /// and a read of the table keeps those of programmed peers.
    pub direct: BTreeMap<Ipv6Net, Ipv6Addr>,
}

/// The devices the IPv6 peers' entries are on.
#[derive(Clone, Copy, Debug)]
pub struct Devices6 {
    /// `flannel-v6.<VNI>`.
    pub vtep: u32,
    /// The underlay, where direct routes go out.
    pub underlay: u32,
}

/// The IPv6 peer table ([`PeerTable`]) of one pass.
pub struct Table6<'a> {
    pub handle: &'a Handle,
    pub at: Devices6,
    /// The IPv6 Network: direct routes are the underlay's routes within it.
    pub network: Ipv6Net,
    /// Our public IPv6: a peer claiming it is left out.
    pub own: Ipv6Addr,
    /// The IPv6 accept map before this pass changes it: it says which
    /// direct routes are ours.
    pub accepted: &'a BTreeMap<Ipv6Addr, Accept<Ipv6Net>>,
}

impl PeerTable for Table6<'_> {
    type Family = Ipv6Net;
    type Contents = Tables6;

    /// The device's tables and, with `direct_routing`, which public IPv6
    /// addresses are on-link, from one read of the main table.
    async fn read(&mut self, direct_routing: bool) -> Result<(Tables6, OnLink<Ipv6Net>)> {
        let table = routes::MainTable::<Ipv6Net>::read(self.handle).await?;
        let have = read_tables(self.handle, self.at, &table, self.network, self.accepted).await?;
        let on_link = match direct_routing {
            true => OnLink::new(table.hops(self.at.underlay), self.network),
            false => OnLink::default(),
        };
        Ok((have, on_link))
    }

    fn plan(&self, peers: &[Peer], on_link: &OnLink<Ipv6Net>) -> (Tables6, Vec<Rejection>) {
        tables_for(peers, self.own, on_link)
    }

    async fn write(&mut self, have: &Tables6, want: &Tables6) -> Outcome {
        match write_tables(self.handle, self.at, have, want).await {
            Ok(done) => {
                if done != Applied6::default() {
                    tracing::debug!(written = done.written, removed = done.removed, "IPv6 VTEP entries updated");
                }
                Outcome { written: done.written + done.removed, ..Outcome::default() }
            }
            Err(e) => {
                tracing::warn!("cannot program the IPv6 VTEP, retrying: {e:#}");
                Outcome { failed: 1, ..Outcome::default() }
            }
        }
    }
}

/// The tables the chosen peers need. A peer whose public IPv6 `on_link`
/// reaches gets a direct route and nothing on the device (flannel's
/// `v6DirectRoutingOK`); `on_link` is empty when DirectRouting is off. One
/// v6 VtepMAC has one fdb entry, so peers through the device that share a
/// MAC at different public IPv6 addresses cannot all be reached: the one
/// whose entry appeared first keeps it (none when that is unknown), the
/// others are skipped with a reason, whatever their order (the IPv4 side
/// keys by subnet and has no such clash). Peers sharing a MAC and a public
/// IPv6 (subnets behind one VTEP) all stay. A peer claiming `own`, our
/// public IPv6, is skipped too (its frames would come back to us).
fn tables_for(peers: &[Peer], own: Ipv6Addr, on_link: &OnLink<Ipv6Net>) -> (Tables6, Vec<Rejection>) {
    let mut t = Tables6::default();
    let mut skipped = Vec::new();
    // the peers through the device, and their IPv6 halves
    let (mut device, mut halves): (Vec<&Peer>, Vec<Half<Ipv6Net>>) = (Vec::new(), Vec::new());
    for p in peers {
        let Some(v6) = p.v6 else { continue };
        if v6.public_ip == own {
            skipped.push(Rejection { node: p.node.clone(), reason: format!("its public-ipv6 {own} is this node's") });
        } else if on_link.reaches(v6.public_ip) {
            t.direct.insert(v6.subnet, v6.public_ip);
        } else {
            device.push(p);
            halves.push(v6);
        }
    }
    let mut by_mac: BTreeMap<VtepMac, Vec<usize>> = BTreeMap::new();
    for (i, v6) in halves.iter().enumerate() {
        by_mac.entry(v6.vtep_mac).or_default().push(i);
    }
    let mut out = vec![false; device.len()];
    for (mac, group) in &by_mac {
        let ips: BTreeSet<Ipv6Addr> = group.iter().map(|&i| halves[i].public_ip).collect();
        if ips.len() < 2 {
            continue;
        }
        let winner = crate::reconcile::first_to_appear(&device, group).map(|w| halves[w].public_ip);
        for &i in group.iter().filter(|&&i| Some(halves[i].public_ip) != winner) {
            out[i] = true;
            let mut others: Vec<&str> = group
                .iter()
                .filter(|&&o| halves[o].public_ip != halves[i].public_ip)
                .map(|&o| device[o].node.as_str())
                .collect();
            others.sort_unstable();
            let reason = match winner {
                Some(_) => {
                    format!("its IPv6 VtepMAC {mac} is also {}'s, whose entry appeared first", others.join(", "))
                }
                None => format!(
                    "its IPv6 VtepMAC {mac} is also {}'s at another address, and which entry appeared first is not \
                     known: none is programmed",
                    others.join(", ")
                ),
            };
            skipped.push(Rejection { node: device[i].node.clone(), reason });
        }
    }
    for (v6, _) in halves.iter().zip(&out).filter(|(_, o)| !**o) {
        let base = v6.subnet.network();
        t.neigh.insert(base, v6.vtep_mac);
        t.fdb.insert((v6.vtep_mac, v6.public_ip));
        t.routes.insert(v6.subnet, base);
    }
    skipped.sort_by(|a, b| (&a.node, &a.reason).cmp(&(&b.node, &b.reason)));
    (t, skipped)
}

fn mac_of(n: &NeighbourMessage) -> Option<VtepMac> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(m) => <[u8; 6]>::try_from(m.as_slice()).ok().map(VtepMac),
        _ => None,
    })
}

/// The IPv6 destination of a neighbour or an fdb entry. The parser types
/// NDA_DST by the message's family, so an fdb entry's (family AF_BRIDGE)
/// comes as raw bytes: 16 of them are an IPv6 address.
fn dst_of(n: &NeighbourMessage) -> Option<Ipv6Addr> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => Some(*ip),
        NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
            <[u8; 16]>::try_from(b.as_slice()).ok().map(Ipv6Addr::from)
        }
        _ => None,
    })
}

/// Reads the device's three tables back from the kernel, and from the
/// main table `table` its routes and the underlay's direct routes into the
/// IPv6 `network`. A direct route is ours, as on the IPv4 side, only through
/// a programmed peer's address or to a programmed peer's subnet
/// (`accepted`, the IPv6 accept map before this pass changes it): anyone
/// else's route into the Network through the underlay is left alone.
async fn read_tables(
    handle: &Handle,
    at: Devices6,
    table: &routes::MainTable<Ipv6Net>,
    network: Ipv6Net,
    accepted: &BTreeMap<Ipv6Addr, Accept<Ipv6Net>>,
) -> Result<Tables6> {
    let index = at.vtep;
    let mut t = Tables6::default();
    let mut dump = handle.neighbours().get().set_address_family(AddressFamily::Inet6).execute();
    while let Some(n) = dump.try_next().await.context("cannot list IPv6 neighbours")? {
        if n.header.ifindex == index
            && n.header.state == NeighbourState::Permanent
            && let (Some(ip), Some(mac)) = (dst_of(&n), mac_of(&n))
        {
            t.neigh.insert(ip, mac);
        }
    }
    let mut dump = handle.neighbours().get().set_address_family(AddressFamily::Bridge).execute();
    while let Some(n) = dump.try_next().await.context("cannot list fdb entries")? {
        if n.header.ifindex == index
            && let (Some(mac), Some(ip)) = (mac_of(&n), dst_of(&n))
        {
            t.fdb.insert((mac, ip));
        }
    }
    // the kernel's own fe80::/64 has no gateway: never ours
    t.routes = table.via(index).filter_map(|(dst, gw)| Some((dst, gw?))).collect();
    let programmed =
        |dst: &Ipv6Net, gw: &Ipv6Addr| accepted.contains_key(gw) || accepted.values().any(|a| a.subnet == *dst);
    t.direct = table.direct(at.underlay, network).filter(|(dst, gw)| programmed(dst, gw)).collect();
    Ok(t)
}

fn onlink_route(index: u32, dst: Ipv6Net, gw: Ipv6Addr) -> rtnetlink::packet_route::route::RouteMessage {
    RouteMessageBuilder::<Ipv6Addr>::new()
        .destination_prefix(dst.network(), dst.prefix_len())
        .output_interface(index)
        .gateway(gw)
        .onlink()
        .protocol(RouteProtocol::Boot)
        .build()
}

fn fdb_message(index: u32, mac: VtepMac, dst: Ipv6Addr) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Bridge;
    m.header.ifindex = index;
    m.header.state = NeighbourState::Permanent;
    m.header.flags = NeighbourFlags::Own;
    m.attributes.push(NeighbourAttribute::LinkLayerAddress(mac.0.to_vec()));
    m.attributes.push(NeighbourAttribute::Destination(NeighbourAddress::Inet6(dst)));
    m
}

fn neigh_message(index: u32, ip: Ipv6Addr) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Inet6;
    m.header.ifindex = index;
    m.header.state = NeighbourState::Permanent;
    m.attributes.push(NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)));
    m
}

/// How many entries a pass wrote and removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied6 {
    pub written: usize,
    pub removed: usize,
}

/// Makes the kernel's tables equal `want`: neighbour, fdb entry, route,
/// then direct route for what is missing or different (so the route never
/// leads to an unresolved gateway); direct route, route, fdb entry, then
/// neighbour for what no peer wants. A peer that turns direct keeps a
/// route all along: the kernel replaces an IPv6 route of the same
/// destination and metric in place, whatever its device, so the later
/// delete of the old one finds nothing. The way back cannot: the kernel
/// refuses an onlink gateway that a route through another device reaches
/// ("Nexthop has invalid gateway or device mismatch"), and the base lies in
/// the direct route's subnet, so that direct route goes just before the
/// route through the device is written (flannel, which only replaces,
/// fails there). Every write is tried; the first error is returned after.
async fn write_tables(handle: &Handle, at: Devices6, have: &Tables6, want: &Tables6) -> Result<Applied6> {
    let index = at.vtep;
    let mut done = Applied6::default();
    let mut first_err: Option<anyhow::Error> = None;
    let mut note = |r: Result<()>, n: &mut usize| match r {
        Ok(()) => *n += 1,
        Err(e) => {
            first_err.get_or_insert(e);
        }
    };
    for (ip, mac) in &want.neigh {
        if have.neigh.get(ip) != Some(mac) {
            let r = handle
                .neighbours()
                .add(index, IpAddr::V6(*ip))
                .link_layer_address(&mac.0)
                .replace()
                .execute()
                .await
                .with_context(|| format!("cannot add the neighbour {ip} lladdr {mac} on the IPv6 VTEP"));
            note(r, &mut done.written);
        }
    }
    for (mac, dst) in want.fdb.difference(&have.fdb) {
        let mut req = handle.neighbours().add_bridge(index, &mac.0).replace();
        *req.message_mut() = fdb_message(index, *mac, *dst);
        let r = req.execute().await.with_context(|| format!("cannot add the fdb entry {mac} dst {dst}"));
        note(r, &mut done.written);
    }
    for (net, gw) in &want.routes {
        if let Some(public_ip) = have.direct.get(net) {
            note(routes::direct_route_del(handle, at.underlay, *net, *public_ip).await, &mut done.removed);
        }
        if have.routes.get(net) != Some(gw) {
            let r = handle
                .route()
                .add(onlink_route(index, *net, *gw))
                .replace()
                .execute()
                .await
                .with_context(|| format!("cannot add the route {net} via {gw} on the IPv6 VTEP"));
            note(r, &mut done.written);
        }
    }
    for (net, gw) in &want.direct {
        if have.direct.get(net) != Some(gw) {
            note(routes::direct_route_put(handle, at.underlay, *net, *gw).await, &mut done.written);
        }
    }
    // (those now through the device went above)
    let unwanted = |net: &&Ipv6Net| !want.direct.contains_key(*net) && !want.routes.contains_key(*net);
    for (net, gw) in have.direct.iter().filter(|(net, _)| unwanted(net)) {
        note(routes::direct_route_del(handle, at.underlay, *net, *gw).await, &mut done.removed);
    }
    for (net, gw) in have.routes.iter().filter(|(net, _)| !want.routes.contains_key(net)) {
        let r = gone::removed(handle.route().del(onlink_route(index, *net, *gw)).execute().await)
            .with_context(|| format!("cannot delete the route {net} via {gw}"));
        note(r, &mut done.removed);
    }
    for (mac, dst) in have.fdb.difference(&want.fdb) {
        let r = gone::removed(handle.neighbours().del(fdb_message(index, *mac, *dst)).execute().await)
            .with_context(|| format!("cannot delete the fdb entry {mac} dst {dst}"));
        note(r, &mut done.removed);
    }
    for ip in have.neigh.keys().filter(|ip| !want.neigh.contains_key(ip)) {
        let r = gone::removed(handle.neighbours().del(neigh_message(index, *ip)).execute().await)
            .with_context(|| format!("cannot delete the neighbour {ip}"));
        note(r, &mut done.removed);
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::Hop;

    fn peer(node: &str, subnet: &str, ip: &str, mac: &str) -> Peer {
        let mut p = crate::reconcile::test_peer(node, "10.244.9.0/24", "198.18.0.9");
        p.v6 = Some(Half {
            subnet: subnet.parse().unwrap(),
            public_ip: ip.parse().unwrap(),
            vtep_mac: mac.parse().unwrap(),
        });
        p
    }

    #[test]
    fn each_peer_gets_flannels_three_entries() {
        let a = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        let mut v4_only = peer("old", "fd00:10:244:3::/64", "fd00:198:18::3", "02:66:00:00:00:03");
        v4_only.v6 = None;
        let (t, skipped) = tables_for(&[a, v4_only], OWN, &OnLink::default());
        assert!(skipped.is_empty());
        let base: Ipv6Addr = "fd00:10:244:2::".parse().unwrap();
        let mac: VtepMac = "02:66:00:00:00:02".parse().unwrap();
        assert_eq!(t.neigh, BTreeMap::from([(base, mac)]));
        assert_eq!(t.fdb, BTreeSet::from([(mac, "fd00:198:18::2".parse().unwrap())]));
        assert_eq!(t.routes, BTreeMap::from([("fd00:10:244:2::/64".parse().unwrap(), base)]));
    }

    /// Our own public IPv6 in these tests.
    const OWN: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 1);

    #[test]
    fn a_peer_claiming_our_public_ipv6_is_skipped() {
        let me = peer("me-again", "fd00:10:244:2::/64", "fd00:198:18::1", "02:66:00:00:00:02");
        let (t, skipped) = tables_for(&[me], OWN, &OnLink::default());
        assert_eq!(t, Tables6::default());
        assert!(skipped[0].reason.contains("this node's"), "{:?}", skipped);
    }

    #[test]
    fn a_shared_v6_mac_goes_to_the_entry_that_appeared_first_whatever_the_order() {
        let mut a = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        let mut b = peer("aaa", "fd00:10:244:3::/64", "fd00:198:18::3", "02:66:00:00:00:02");
        a.appeared = Some(100);
        b.appeared = Some(200);
        for order in [[a.clone(), b.clone()], [b.clone(), a.clone()]] {
            let (t, skipped) = tables_for(&order, OWN, &OnLink::default());
            assert_eq!(t.fdb.iter().map(|(_, ip)| ip.to_string()).collect::<Vec<_>>(), ["fd00:198:18::2"]);
            assert_eq!(skipped.len(), 1);
            assert_eq!(skipped[0].node, "aaa");
            assert!(skipped[0].reason.contains("also a's, whose entry appeared first"), "{}", skipped[0].reason);
        }
        // neither known to be first: neither is programmed
        let (a, b) = (Peer { appeared: None, ..a }, Peer { appeared: None, ..b });
        let (t, skipped) = tables_for(&[a.clone(), b], OWN, &OnLink::default());
        assert!(t.fdb.is_empty() && t.routes.is_empty());
        assert_eq!(skipped.len(), 2);
        // one MAC at one address for two subnets (one VTEP): both stay
        let c = peer("c", "fd00:10:244:4::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        let (t, skipped) = tables_for(&[a, c], OWN, &OnLink::default());
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!((t.fdb.len(), t.routes.len()), (1, 2));
    }

    /// fd00:198:18::/64 is our segment; the rest is behind a router.
    fn segment() -> OnLink<Ipv6Net> {
        let hop = |dst: &str, direct| Hop { dst: dst.parse().unwrap(), direct };
        OnLink::new(vec![hop("fd00:198:18::/64", true), hop("::/0", false)], "fd00:10:244::/56".parse().unwrap())
    }

    #[test]
    fn an_on_link_peer_gets_a_direct_route_and_nothing_on_the_device() {
        let near = peer("near", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        let far = peer("far", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03");
        let (t, skipped) = tables_for(&[near.clone(), far], OWN, &segment());
        assert!(skipped.is_empty());
        let direct: Vec<_> = t.direct.iter().map(|(n, ip)| format!("{n} via {ip}")).collect();
        assert_eq!(direct, ["fd00:10:244:2::/64 via fd00:198:18::2"]);
        // the far peer alone has flannel's three entries
        let far_base: Ipv6Addr = "fd00:10:244:3::".parse().unwrap();
        assert_eq!(t.neigh.keys().collect::<Vec<_>>(), [&far_base]);
        assert_eq!(t.fdb.iter().map(|(_, ip)| ip.to_string()).collect::<Vec<_>>(), ["fd00:198:18:1::3"]);
        assert_eq!(t.routes, BTreeMap::from([("fd00:10:244:3::/64".parse().unwrap(), far_base)]));
        // DirectRouting off: the three entries, no direct route
        let (off, _) = tables_for(&[near], OWN, &OnLink::default());
        assert!(off.direct.is_empty());
        assert_eq!((off.neigh.len(), off.fdb.len(), off.routes.len()), (1, 1, 1));
    }

    #[test]
    fn the_decision_is_per_family() {
        // on-link over IPv6, behind the router over IPv4: the IPv6 plan alone goes direct
        let mut p = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        p.v4.as_mut().unwrap().public_ip = "198.18.1.2".parse().unwrap();
        assert_eq!(tables_for(std::slice::from_ref(&p), OWN, &segment()).0.direct.len(), 1);
        // the reverse: VXLAN over IPv6
        let far = peer("b", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03");
        let (t, _) = tables_for(&[far], OWN, &segment());
        assert!(t.direct.is_empty());
        assert_eq!(t.routes.len(), 1);
    }

    #[test]
    fn a_direct_peer_takes_no_vtep_mac() {
        // a direct peer has no fdb entry, so a VXLAN peer with the same MAC is not a clash
        let near = peer("near", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        let far = peer("far", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:02");
        let (t, skipped) = tables_for(&[near, far], OWN, &segment());
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!((t.direct.len(), t.routes.len()), (1, 1));
    }

    #[test]
    fn an_fdb_entrys_destination_is_read_from_its_raw_bytes() {
        let ip: Ipv6Addr = "fd00:198:18::2".parse().unwrap();
        let mut fdb = NeighbourMessage::default();
        fdb.header.family = AddressFamily::Bridge;
        fdb.attributes.push(NeighbourAttribute::Destination(NeighbourAddress::Other(ip.octets().to_vec())));
        assert_eq!(dst_of(&fdb), Some(ip));
        // an IPv4 one is not
        fdb.attributes[0] = NeighbourAttribute::Destination(NeighbourAddress::Other(vec![198, 18, 0, 2]));
        assert_eq!(dst_of(&fdb), None);
    }
}
