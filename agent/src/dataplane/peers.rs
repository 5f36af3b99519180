//! The production [`Dataplane`]: the pinned BPF maps plus the routes
//! through the VTEP and DirectRouting's routes through the underlay.
//! Observing reads them all back from the kernel.
use std::{collections::BTreeMap, net::Ipv4Addr};

use anyhow::Result;
use edgevx_common::maps::ACCEPT_ANY_INNER_SOURCE;
use ipnet::Ipv4Net;
use rtnetlink::Handle;

use crate::{
    dataplane::{
        maps::{self, Maps},
        routes,
    },
    reconcile::{Accept, Contents, Dataplane, OnLink, Tunnel},
};

pub struct Programmed<'a> {
    pub maps: &'a mut Maps,
    pub handle: &'a Handle,
    pub vtep_index: u32,
    pub underlay_index: u32,
    /// The pod network: direct routes are the underlay's routes within it.
    pub network: Ipv4Net,
}

impl Dataplane for Programmed<'_> {
    async fn observe(&mut self) -> Result<Contents> {
        let table = routes::MainTable::read(self.handle).await?;
        let subnets: BTreeMap<Ipv4Net, Tunnel> = self
            .maps
            .subnets()?
            .into_iter()
            .map(|(net, e)| (net, Tunnel { public_ip: e.public_ip.into(), vtep_mac: e.vtep_mac }))
            .collect();
        let accept: BTreeMap<Ipv4Addr, Accept<Ipv4Net>> = self
            .maps
            .accepted()?
            .into_iter()
            .map(|(ip, a)| {
                // an entry with a bad prefix (written by hand) reads as 0.0.0.0/0, which no
                // plan contains: the diff overwrites it
                let subnet = Ipv4Net::new(a.pod_subnet.into(), a.prefix_len).unwrap_or_default();
                (ip, Accept { subnet, any_inner_source: a.flags & ACCEPT_ANY_INNER_SOURCE != 0 })
            })
            .collect();
        // a direct route is ours only through a programmed peer's address or
        // to a programmed peer's subnet: anyone else's route into the Network
        // through the underlay (an appliance's, written by hand) is left alone
        let direct = table
            .direct(self.underlay_index, self.network)
            .filter(|(dst, gw)| accept.contains_key(gw) || subnets.contains_key(dst))
            .collect();
        Ok(Contents { routes: table.via(self.vtep_index).collect(), direct, subnets, accept })
    }

    async fn on_link(&mut self) -> Result<OnLink> {
        let table = routes::MainTable::read(self.handle).await?;
        Ok(OnLink::new(table.hops(self.underlay_index), self.network))
    }

    async fn put_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> Result<()> {
        routes::direct_route_put(self.handle, self.underlay_index, subnet, public_ip).await
    }

    async fn del_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> Result<()> {
        routes::direct_route_del(self.handle, self.underlay_index, subnet, public_ip).await
    }

    async fn put_accept(&mut self, ip: Ipv4Addr, a: Accept<Ipv4Net>) -> Result<()> {
        self.maps.put_accept(ip, maps::accept_entry(a.subnet, a.any_inner_source))
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
        self.maps.remove_accept(ip)
    }
}
