//! Our DirectRouting routes (`SUBNET via PUBLIC_IP dev eth0`): which of the
//! main table's are the agent's, and their removal.
use std::collections::BTreeMap;

use anyhow::Result;
use rtnetlink::Handle;

use crate::{
    dataplane::{device, routes},
    family::Family,
    peer::{Peer, PeerHalf},
};

/// Each peer's pod subnet and public IP of the family `N`.
pub(super) fn ends<N: PeerHalf>(peers: &[Peer]) -> Vec<(N, N::Addr)> {
    peers.iter().filter_map(|p| p.half::<N>()).map(|h| (h.subnet, h.public_ip)).collect()
}

/// The DirectRouting routes into `network` on the underlay `iface` (see
/// [`routes::MainTable::direct`]) that are ours: through one of the peers'
/// addresses or to one of their subnets (`ends`, in the same family). Pod
/// subnet → public IP, and the underlay's ifindex.
pub(super) async fn direct_routes<N: Family>(
    handle: &Handle,
    iface: &str,
    network: N,
    ends: &[(N, N::Addr)],
) -> Result<(u32, BTreeMap<N, N::Addr>)> {
    let Some(link) = device::link_by_name(handle, iface).await? else {
        return Ok((0, BTreeMap::new())); // no underlay, so no routes through it
    };
    let table = routes::MainTable::<N>::read(handle).await?;
    let ours = |(dst, gw): &(N, N::Addr)| ends.iter().any(|(subnet, ip)| ip == gw || subnet == dst);
    Ok((link.header.index, table.direct(link.header.index, network).filter(ours).collect()))
}

/// `ip [-6] route del SUBNET via PUBLIC_IP dev eth0` for each of our
/// DirectRouting routes into `network`.
pub(super) async fn remove_direct_routes<N: Family>(
    handle: &Handle,
    iface: &str,
    network: N,
    ends: &[(N, N::Addr)],
) -> Result<usize> {
    let (underlay, routes) = direct_routes(handle, iface, network, ends).await?;
    for (subnet, gw) in &routes {
        routes::direct_route_del(handle, underlay, *subnet, *gw).await?;
    }
    Ok(routes.len())
}
