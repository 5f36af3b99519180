//! The IPv4 peer table ([`PeerTable`]) and its key-by-key writer
//! ([`Ipv4MapWriter`]): the pinned BPF maps plus the route through the VTEP
//! and DirectRouting's routes through the underlay. Reading takes them all
//! back from the kernel; the plan and the write order are
//! `reconcile/ipv4_maps.rs`'s.
use std::{collections::BTreeMap, net::Ipv4Addr};

use anyhow::Result;
use ipnet::Ipv4Net;
use rtnetlink::Handle;

use crate::{
    dataplane::{maps::Maps, routes},
    peer::{Peer, Rejection},
    reconcile::{
        Accept, OnLink, Outcome, PeerTable,
        ipv4_maps::{self, Ipv4MapWriter, Ipv4Maps, Tunnel},
    },
};

/// The IPv4 peer table of one pass.
pub struct Ipv4MapTable<'a> {
    pub maps: &'a mut Maps,
    pub handle: &'a Handle,
    pub vtep_index: u32,
    pub underlay_index: u32,
    /// The pod network: direct routes are the underlay's routes within it.
    pub network: Ipv4Net,
    /// Not attached yet: the routes a write would delete (flanneld's, on a
    /// takeover) still carry traffic through the kernel's fdb, so they stay
    /// until the first pass after the programs are on.
    pub hold_deletes: bool,
}

impl PeerTable for Ipv4MapTable<'_> {
    type Family = Ipv4Net;
    type Contents = Ipv4Maps;

    async fn read(&mut self, direct_routing: bool) -> Result<(Ipv4Maps, OnLink)> {
        let table = routes::MainTable::read(self.handle).await?;
        let subnets: BTreeMap<Ipv4Net, Tunnel> = self
            .maps
            .subnets()?
            .into_iter()
            .map(|(net, e)| (net, Tunnel { public_ip: e.public_ip.into(), vtep_mac: e.vtep_mac }))
            .collect();
        // an entry with a bad prefix (written by hand) reads as 0.0.0.0/0, which no
        // plan contains: the diff overwrites it
        let accept = self.maps.accepted::<Ipv4Net>()?;
        // a direct route is ours only through a programmed peer's address or
        // to a programmed peer's subnet: anyone else's route into the Network
        // through the underlay (an appliance's, written by hand) is left alone
        let direct = table
            .direct(self.underlay_index, self.network)
            .filter(|(dst, gw)| accept.contains_key(gw) || subnets.contains_key(dst))
            .collect();
        let on_link = match direct_routing {
            true => OnLink::new(table.hops(self.underlay_index), self.network),
            false => OnLink::default(),
        };
        Ok((Ipv4Maps { routes: table.via(self.vtep_index).collect(), direct, subnets, accept }, on_link))
    }

    fn holds(&self, have: &Ipv4Maps, p: &Peer) -> bool {
        ipv4_maps::holds(have, p)
    }

    fn plan(&self, peers: &[Peer], on_link: &OnLink) -> (Ipv4Maps, Vec<Rejection>) {
        (ipv4_maps::plan(peers, self.network, on_link), Vec::new())
    }

    async fn write(&mut self, have: &Ipv4Maps, want: &Ipv4Maps) -> Outcome {
        let mut changes = ipv4_maps::diff(want, have);
        let held = self.hold_deletes && !(changes.del_routes.is_empty() && changes.del_direct.is_empty());
        if held {
            changes.del_routes.clear();
            changes.del_direct.clear();
        }
        tracing::debug!(changes = changes.len(), "IPv4 peer writes");
        Outcome { held, ..ipv4_maps::apply(self, &changes).await }
    }
}

impl Ipv4MapWriter for Ipv4MapTable<'_> {
    async fn put_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> Result<()> {
        routes::direct_route_put(self.handle, self.underlay_index, subnet, public_ip).await
    }

    async fn del_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> Result<()> {
        routes::direct_route_del(self.handle, self.underlay_index, subnet, public_ip).await
    }

    async fn put_accept(&mut self, ip: Ipv4Addr, a: Accept<Ipv4Net>) -> Result<()> {
        self.maps.put_accept(ip, &a)
    }

    async fn put_subnet(&mut self, subnet: Ipv4Net, t: Tunnel) -> Result<()> {
        self.maps.put_subnet(subnet, t.public_ip, t.vtep_mac)
    }

    async fn put_route(&mut self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> Result<()> {
        routes::route_put(self.handle, self.vtep_index, dst, gateway).await
    }

    async fn del_route(&mut self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> Result<()> {
        routes::route_del(self.handle, self.vtep_index, dst, gateway).await
    }

    async fn del_subnet(&mut self, subnet: Ipv4Net) -> Result<()> {
        self.maps.remove_subnet(subnet)
    }

    async fn del_accept(&mut self, ip: Ipv4Addr) -> Result<()> {
        self.maps.remove_accept::<Ipv4Net>(ip)
    }
}
