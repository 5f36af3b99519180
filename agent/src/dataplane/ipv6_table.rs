//! The IPv6 peer table ([`PeerTable`]) and its entry-by-entry writer
//! ([`Ipv6EntryWriter`]): `flannel-v6.<VNI>`'s neighbour, fdb and route
//! entries, DirectRouting's routes through the underlay, and the two IPv6
//! maps decap judges by. Reading takes them all back from the kernel; the
//! plan and the write order are `reconcile/ipv6_entries.rs`'s.
//!
//! Twin of `ipv4_table.rs` by design: a family's table writer is the one
//! place an IPv6 peer's path differs from an IPv4 peer's, because what
//! holds the peers differs (the kernel's entries here, the programs' maps
//! there).
//!
//! The device is edgevx's alone, so anything else on it is stale; on the
//! underlay only the direct routes of programmed peers are.
use std::{
    collections::BTreeSet,
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

use crate::{
    dataplane::{maps::Maps, routes},
    gone,
    mac::VtepMac,
    peer::{Peer, Rejection},
    reconcile::{
        Accept, OnLink, Outcome, PeerTable,
        ipv6_entries::{self, Ipv6Entries, Ipv6EntryWriter},
    },
};

/// The IPv6 peer table of one pass.
pub struct Ipv6EntryTable<'a> {
    pub handle: &'a Handle,
    pub maps: &'a mut Maps,
    /// `flannel-v6.<VNI>`.
    pub vtep: u32,
    /// The underlay, where direct routes go out.
    pub underlay: u32,
    /// The IPv6 Network: direct routes are the underlay's routes within it.
    pub network: Ipv6Net,
    /// Our public IPv6: a peer claiming it is left out.
    pub own: Ipv6Addr,
}

impl PeerTable for Ipv6EntryTable<'_> {
    type Family = Ipv6Net;
    type Contents = Ipv6Entries;

    /// The maps, the device's tables and, with `direct_routing`, which
    /// public IPv6 addresses are on-link, from one read of the main table.
    async fn read(&mut self, direct_routing: bool) -> Result<(Ipv6Entries, OnLink<Ipv6Net>)> {
        let mut have =
            Ipv6Entries { accept: self.maps.accepted()?, owners: self.maps.ipv6_owners()?, ..Ipv6Entries::default() };
        let table = routes::MainTable::<Ipv6Net>::read(self.handle).await?;
        read_device(self.handle, self.vtep, &mut have).await?;
        // the kernel's own fe80::/64 has no gateway: never ours
        have.routes = table.via(self.vtep).filter_map(|(dst, gw)| Some((dst, gw?))).collect();
        // a direct route is ours, as on the IPv4 side, only through a
        // programmed peer's address or to a programmed peer's subnet:
        // anyone else's route into the Network through the underlay is left alone
        let accept = &have.accept;
        let subnets: BTreeSet<Ipv6Net> = accept.values().map(|a| a.subnet).collect();
        let programmed = |dst: &Ipv6Net, gw: &Ipv6Addr| accept.contains_key(gw) || subnets.contains(dst);
        have.direct = table.direct(self.underlay, self.network).filter(|(dst, gw)| programmed(dst, gw)).collect();
        let on_link = match direct_routing {
            true => OnLink::new(table.hops(self.underlay), self.network),
            false => OnLink::default(),
        };
        Ok((have, on_link))
    }

    fn holds(&self, have: &Ipv6Entries, p: &Peer) -> bool {
        ipv6_entries::holds(have, p)
    }

    fn plan(&self, peers: &[Peer], on_link: &OnLink<Ipv6Net>) -> (Ipv6Entries, Vec<Rejection>) {
        ipv6_entries::plan(peers, self.own, on_link)
    }

    async fn write(&mut self, have: &Ipv6Entries, want: &Ipv6Entries) -> Outcome {
        ipv6_entries::apply(self, &ipv6_entries::diff(want, have)).await
    }
}

/// Reads the device's permanent neighbours and fdb entries into `t`.
async fn read_device(handle: &Handle, index: u32, t: &mut Ipv6Entries) -> Result<()> {
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
    Ok(())
}

impl Ipv6EntryWriter for Ipv6EntryTable<'_> {
    async fn put_owner(&mut self, subnet: Ipv6Net, public_ip: Ipv6Addr) -> Result<()> {
        self.maps.put_ipv6_owner(subnet, public_ip)
    }

    async fn del_owner(&mut self, subnet: Ipv6Net) -> Result<()> {
        self.maps.remove_ipv6_owner(subnet)
    }

    async fn put_accept(&mut self, ip: Ipv6Addr, accept: Accept<Ipv6Net>) -> Result<()> {
        self.maps.put_accept(ip, &accept)
    }

    async fn del_accept(&mut self, ip: Ipv6Addr) -> Result<()> {
        self.maps.remove_accept::<Ipv6Net>(ip)
    }

    async fn put_neigh(&mut self, base: Ipv6Addr, mac: VtepMac) -> Result<()> {
        self.handle
            .neighbours()
            .add(self.vtep, IpAddr::V6(base))
            .link_layer_address(&mac.0)
            .replace()
            .execute()
            .await
            .with_context(|| format!("cannot add the neighbour {base} lladdr {mac} on the IPv6 VTEP"))
    }

    async fn del_neigh(&mut self, base: Ipv6Addr) -> Result<()> {
        gone::removed(self.handle.neighbours().del(neigh_message(self.vtep, base)).execute().await)
            .with_context(|| format!("cannot delete the neighbour {base}"))
    }

    async fn put_fdb(&mut self, mac: VtepMac, public_ip: Ipv6Addr) -> Result<()> {
        let mut req = self.handle.neighbours().add_bridge(self.vtep, &mac.0).replace();
        *req.message_mut() = fdb_message(self.vtep, mac, public_ip);
        req.execute().await.with_context(|| format!("cannot add the fdb entry {mac} dst {public_ip}"))
    }

    async fn del_fdb(&mut self, mac: VtepMac, public_ip: Ipv6Addr) -> Result<()> {
        gone::removed(self.handle.neighbours().del(fdb_message(self.vtep, mac, public_ip)).execute().await)
            .with_context(|| format!("cannot delete the fdb entry {mac} dst {public_ip}"))
    }

    async fn put_route(&mut self, subnet: Ipv6Net, gateway: Ipv6Addr) -> Result<()> {
        self.handle
            .route()
            .add(onlink_route(self.vtep, subnet, gateway))
            .replace()
            .execute()
            .await
            .with_context(|| format!("cannot add the route {subnet} via {gateway} on the IPv6 VTEP"))
    }

    async fn del_route(&mut self, subnet: Ipv6Net, gateway: Ipv6Addr) -> Result<()> {
        gone::removed(self.handle.route().del(onlink_route(self.vtep, subnet, gateway)).execute().await)
            .with_context(|| format!("cannot delete the route {subnet} via {gateway}"))
    }

    async fn put_direct(&mut self, subnet: Ipv6Net, public_ip: Ipv6Addr) -> Result<()> {
        routes::direct_route_put(self.handle, self.underlay, subnet, public_ip).await
    }

    async fn del_direct(&mut self, subnet: Ipv6Net, public_ip: Ipv6Addr) -> Result<()> {
        routes::direct_route_del(self.handle, self.underlay, subnet, public_ip).await
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
