//! The IPv6 peers on `flannel-v6.<VNI>`, in flannel's form (its vxlan
//! backend's `handleSubnetEvents`, IPv6 half), three kernel objects each:
//! - `ip -6 neigh replace <base> lladdr <v6 VtepMAC> dev flannel-v6.1 nud permanent`
//! - `bridge fdb replace <v6 VtepMAC> dev flannel-v6.1 dst <PublicIPv6> self permanent`
//! - `ip -6 route replace <v6 subnet> via <base> dev flannel-v6.1 onlink`
//!
//! where `<base>` is the subnet's first address. Like the IPv4 side, the
//! kernel is the truth: every pass reads the three tables back, adds or
//! replaces what is missing or different first, and deletes what no peer
//! wants last (flannel never deletes a stale entry, flannel#2554). The
//! device is edgevx's alone, so anything else on it is stale.
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
        route::{RouteAddress, RouteAttribute, RouteProtocol},
    },
};

use crate::{mac::VtepMac, peer::Peer};

/// What the three tables of the IPv6 VTEP hold, or should.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables6 {
    /// Permanent neighbours: peer subnet base → its v6 VtepMAC.
    pub neigh: BTreeMap<Ipv6Addr, VtepMac>,
    /// fdb entries: (v6 VtepMAC, peer's public IPv6).
    pub fdb: BTreeSet<(VtepMac, Ipv6Addr)>,
    /// Routes through the device: peer v6 subnet → gateway (its base).
    pub routes: BTreeMap<Ipv6Net, Ipv6Addr>,
}

/// A peer's IPv6 half that was not programmed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped6 {
    pub node: String,
    pub reason: String,
}

/// The tables the chosen peers need. A v6 VtepMAC already taken by an
/// earlier peer would share its fdb entry, so the later peer is skipped
/// with a reason (the IPv4 side keys by subnet and has no such clash); so
/// is a peer claiming `own`, our public IPv6 (its frames would come back
/// to us).
pub fn plan6(peers: &[Peer], own: Ipv6Addr) -> (Tables6, Vec<Skipped6>) {
    let mut t = Tables6::default();
    let mut macs: BTreeMap<VtepMac, &str> = BTreeMap::new();
    let mut skipped = Vec::new();
    for p in peers {
        let Some(v6) = p.v6 else { continue };
        if v6.public_ip == own {
            skipped.push(Skipped6 { node: p.node.clone(), reason: format!("its public-ipv6 {own} is this node's") });
            continue;
        }
        if let Some(first) = macs.get(&v6.vtep_mac) {
            skipped.push(Skipped6 {
                node: p.node.clone(),
                reason: format!("its IPv6 VtepMAC {} is {first}'s too", v6.vtep_mac),
            });
            continue;
        }
        macs.insert(v6.vtep_mac, &p.node);
        let base = v6.subnet.network();
        t.neigh.insert(base, v6.vtep_mac);
        t.fdb.insert((v6.vtep_mac, v6.public_ip));
        t.routes.insert(v6.subnet, base);
    }
    (t, skipped)
}

fn mac_of(n: &NeighbourMessage) -> Option<VtepMac> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(m) => <[u8; 6]>::try_from(m.as_slice()).ok().map(VtepMac),
        _ => None,
    })
}

/// The entry's `NDA_DST` as an IPv6 address. netlink-packet-route decodes
/// it by the message's family, so a bridge-family (fdb) entry's comes as
/// raw bytes.
fn dst_of(n: &NeighbourMessage) -> Option<Ipv6Addr> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => Some(*ip),
        NeighbourAttribute::Destination(NeighbourAddress::Other(raw)) => {
            <[u8; 16]>::try_from(raw.as_slice()).ok().map(Ipv6Addr::from)
        }
        _ => None,
    })
}

/// Reads the three tables of the device `index` back from the kernel.
pub async fn observe6(handle: &Handle, index: u32) -> Result<Tables6> {
    let mut t = Tables6::default();
    let mut dump = handle.neighbours().get().set_address_family(AddressFamily::Inet6).execute();
    while let Some(n) = dump.try_next().await.context("cannot list IPv6 neighbours")? {
        if n.header.ifindex == index && n.header.state == NeighbourState::Permanent {
            if let (Some(ip), Some(mac)) = (dst_of(&n), mac_of(&n)) {
                t.neigh.insert(ip, mac);
            }
        }
    }
    let mut dump = handle.neighbours().get().set_address_family(AddressFamily::Bridge).execute();
    while let Some(n) = dump.try_next().await.context("cannot list fdb entries")? {
        if n.header.ifindex == index {
            if let (Some(mac), Some(ip)) = (mac_of(&n), dst_of(&n)) {
                t.fdb.insert((mac, ip));
            }
        }
    }
    let filter = RouteMessageBuilder::<Ipv6Addr>::new().build();
    let mut routes = handle.route().get(filter).execute();
    while let Some(r) = routes.try_next().await.context("cannot list IPv6 routes")? {
        if r.header.address_family != AddressFamily::Inet6 || r.header.table != 254 {
            continue;
        }
        let (mut oif, mut dst, mut gw) = (None, None, None);
        for a in &r.attributes {
            match a {
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(*ip),
                RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gw = Some(*ip),
                _ => {}
            }
        }
        // the kernel's own fe80::/64 has no gateway: never ours
        if let (Some(i), Some(dst), Some(gw)) = (oif, dst, gw) {
            if i == index {
                if let Ok(net) = Ipv6Net::new(dst, r.header.destination_prefix_length) {
                    t.routes.insert(net, gw);
                }
            }
        }
    }
    Ok(t)
}

fn route6(index: u32, dst: Ipv6Net, gw: Ipv6Addr) -> rtnetlink::packet_route::route::RouteMessage {
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

fn gone(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(e) if [-libc::ENOENT, -libc::ESRCH].contains(&e.raw_code()))
}

/// How many entries a pass wrote and removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied6 {
    pub written: usize,
    pub removed: usize,
}

/// Makes the device's tables equal `want`: neighbour, fdb entry, then
/// route for what is missing or different (so the route never leads to
/// an unresolved gateway); route, fdb entry, then neighbour for what no
/// peer wants. Every write is tried; the first error is returned after.
pub async fn apply6(handle: &Handle, index: u32, have: &Tables6, want: &Tables6) -> Result<Applied6> {
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
        if have.routes.get(net) != Some(gw) {
            let r = handle
                .route()
                .add(route6(index, *net, *gw))
                .replace()
                .execute()
                .await
                .with_context(|| format!("cannot add the route {net} via {gw} on the IPv6 VTEP"));
            note(r, &mut done.written);
        }
    }
    for (net, gw) in have.routes.iter().filter(|(net, _)| !want.routes.contains_key(net)) {
        let r = match handle.route().del(route6(index, *net, *gw)).execute().await {
            Err(e) if !gone(&e) => Err(e).with_context(|| format!("cannot delete the route {net} via {gw}")),
            _ => Ok(()),
        };
        note(r, &mut done.removed);
    }
    for (mac, dst) in have.fdb.difference(&want.fdb) {
        let r = match handle.neighbours().del(fdb_message(index, *mac, *dst)).execute().await {
            Err(e) if !gone(&e) => Err(e).with_context(|| format!("cannot delete the fdb entry {mac} dst {dst}")),
            _ => Ok(()),
        };
        note(r, &mut done.removed);
    }
    for ip in have.neigh.keys().filter(|ip| !want.neigh.contains_key(ip)) {
        let r = match handle.neighbours().del(neigh_message(index, *ip)).execute().await {
            Err(e) if !gone(&e) => Err(e).with_context(|| format!("cannot delete the neighbour {ip}")),
            _ => Ok(()),
        };
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
    use crate::peer::PeerV6;

    fn peer(node: &str, subnet: &str, ip: &str, mac: &str) -> Peer {
        let mut p = crate::reconcile::test_peer(node, "10.244.9.0/24", "198.18.0.9");
        p.v6 = Some(PeerV6 {
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
        let (t, skipped) = plan6(&[a, v4_only], "fd00:198:18::1".parse().unwrap());
        assert!(skipped.is_empty());
        let base: Ipv6Addr = "fd00:10:244:2::".parse().unwrap();
        let mac: VtepMac = "02:66:00:00:00:02".parse().unwrap();
        assert_eq!(t.neigh, BTreeMap::from([(base, mac)]));
        assert_eq!(t.fdb, BTreeSet::from([(mac, "fd00:198:18::2".parse().unwrap())]));
        assert_eq!(t.routes, BTreeMap::from([("fd00:10:244:2::/64".parse().unwrap(), base)]));
    }

    #[test]
    fn an_fdb_entrys_destination_is_read_from_its_raw_bytes() {
        // what a bridge-family dump gives: NDA_DST undecoded
        let mut m = fdb_message(7, "02:66:00:00:00:02".parse().unwrap(), "fd00:198:18::2".parse().unwrap());
        let raw = "fd00:198:18::2".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        m.attributes[1] = NeighbourAttribute::Destination(NeighbourAddress::Other(raw));
        assert_eq!(dst_of(&m), Some("fd00:198:18::2".parse().unwrap()));
        m.attributes[1] = NeighbourAttribute::Destination(NeighbourAddress::Other(vec![198, 18, 0, 2]));
        assert_eq!(dst_of(&m), None, "an IPv4 destination is not ours");
    }

    #[test]
    fn a_shared_v6_mac_skips_the_later_peer_with_its_reason() {
        let a = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
        let b = peer("b", "fd00:10:244:3::/64", "fd00:198:18::3", "02:66:00:00:00:02");
        let (t, skipped) = plan6(&[a, b], "fd00:198:18::1".parse().unwrap());
        assert_eq!(t.routes.len(), 1);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].node, "b");
        assert!(skipped[0].reason.contains("a's too"), "{}", skipped[0].reason);
    }

    #[test]
    fn a_peer_claiming_our_public_ipv6_is_skipped() {
        let me = peer("me-again", "fd00:10:244:2::/64", "fd00:198:18::1", "02:66:00:00:00:02");
        let (t, skipped) = plan6(&[me], "fd00:198:18::1".parse().unwrap());
        assert_eq!(t, Tables6::default());
        assert!(skipped[0].reason.contains("this node's"), "{:?}", skipped);
    }
}
