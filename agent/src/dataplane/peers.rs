//! The production `PeerTable`: a peer is a BPF map entry plus a route.
//! Maps are written before the route appears and after it is gone, so the
//! kernel never routes to a subnet the program does not know.
use anyhow::Result;
use ipnet::Ipv4Net;
use rtnetlink::Handle;

use crate::{
    dataplane::{device, maps::Maps},
    peer::Peer,
    reconcile::PeerTable,
};

pub struct Programmed<'a> {
    pub maps: &'a mut Maps,
    pub handle: &'a Handle,
    pub vtep_index: u32,
}

impl PeerTable for Programmed<'_> {
    async fn put(&mut self, old: Option<&Peer>, new: &Peer) -> Result<()> {
        self.maps.put_peer(old, new)?;
        device::route_replace(self.handle, self.vtep_index, new.subnet).await?;
        if let Some(old) = old.filter(|o| o.subnet != new.subnet) {
            device::route_del(self.handle, self.vtep_index, old.subnet).await?;
        }
        Ok(())
    }

    async fn delete(&mut self, peer: &Peer) -> Result<()> {
        device::route_del(self.handle, self.vtep_index, peer.subnet).await?;
        self.maps.delete_peer(peer)
    }
}

/// Removes routes through the VTEP that no programmed peer accounts for
/// (e.g. a node deleted while the agent was down: flannel#2554).
pub async fn collect_stale_routes(handle: &Handle, vtep_index: u32, keep: &[Ipv4Net]) -> Result<Vec<Ipv4Net>> {
    let mut removed = Vec::new();
    for net in device::routes_via(handle, vtep_index).await? {
        if net.prefix_len() < 32 && !keep.contains(&net) {
            device::route_del(handle, vtep_index, net).await?;
            removed.push(net);
        }
    }
    Ok(removed)
}
