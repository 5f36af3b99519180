//! `edgevx cleanup --keep-vtep`: the kernel gets flanneld's per-peer
//! entries while the programs still forward, so nothing is lost when they go.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use rtnetlink::{
    Handle, LinkUnspec,
    packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourState},
};
use tracing::{info, warn};

use super::direct_routes::{direct_routes, ends};
use crate::{
    dataplane::{device, routes},
    state::{AgentRecord, StateDir},
};

/// Gives the kernel what flanneld installs for each peer the agent
/// programmed, so kernel VXLAN forwards the moment the programs are gone
/// (the routes are already flanneld's):
/// `ip neigh replace <subnet>.0 lladdr <mac> dev flannel.1 nud permanent` and
/// `bridge fdb add <mac> dev flannel.1 dst <public ip> self permanent`.
/// Entries flanneld already wrote win: it may know a newer MAC than the
/// agent's record. Also switches ARP back on (`ip link set flannel.1 arp
/// on`), as flanneld's device has it. A peer with a DirectRouting route
/// (`SUBNET via PUBLIC_IP dev eth0`) keeps it and gets none of these: that
/// route is what flanneld with DirectRouting installs for it, and a
/// flanneld without replaces it with its own at its first lease list.
/// Returns the VTEP's index, if it exists.
/// IPv6-only: only the IPv6 VTEP's index (it already holds flanneld's
/// entries: the kernel carries IPv6).
pub(super) async fn hand_over(handle: &Handle, rec: &AgentRecord, state: &StateDir) -> Result<Option<u32>> {
    let Some(v4) = &rec.v4 else {
        let name = rec.v6.as_ref().map_or("", |v6| v6.device.as_str());
        let link = device::link_by_name(handle, name).await?;
        if link.is_none() {
            warn!(device = name, "is gone: nothing to hand over (flanneld will create it, with a new MAC)");
        }
        return Ok(link.map(|l| l.header.index));
    };
    let Some(link) = device::link_by_name(handle, &v4.vtep_device).await? else {
        warn!(device = %v4.vtep_device, "is gone: nothing to hand over (flanneld will create it, with a new MAC)");
        return Ok(None);
    };
    let index = link.header.index;
    let peers = state.load_peers().with_context(|| {
        format!("cannot read the peers the agent programmed (in {}); nothing was changed", state.0.display())
    })?;
    // flanneld with DirectRouting keeps the IPv6 ones too: flannel-v6.<VNI> already holds its entries
    let (_, direct) = direct_routes(handle, &rec.iface, v4.network, &ends(&peers)).await?;
    let (direct_peers, peers): (Vec<_>, Vec<_>) = peers
        .into_iter()
        .filter_map(|p| Some((p.v4?, p.node)))
        .partition(|(p, _)| direct.get(&p.subnet) == Some(&p.public_ip));
    // flanneld's per-peer routes first, while the programs still forward: once
    // ARP is on, a packet still taking our route for the Network would wait
    // for an answer about the VTEP gateway that never comes, and be lost
    for (p, _) in &peers {
        routes::route_replace(handle, index, p.subnet).await?;
    }
    // toggling NOARP flushes every neighbour on the device, permanent ones too:
    // note flanneld's entries first, and write them back right after (a packet
    // in between waits in the neighbour's queue and leaves when they are back)
    let flanneld = permanent_arp(handle, index).await?;
    let msg = LinkUnspec::new_with_index(index).arp(true).build();
    handle.link().set(msg).execute().await.context("cannot switch ARP back on on the VTEP")?;
    let ours = peers.iter().map(|(p, _)| (p.subnet.network(), p.vtep_mac.0.to_vec()));
    let arp: BTreeMap<Ipv4Addr, Vec<u8>> = ours.chain(flanneld.clone()).collect();
    for (gateway, mac) in &arp {
        handle
            .neighbours()
            .add(index, IpAddr::V4(*gateway))
            .link_layer_address(mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .with_context(|| format!("cannot add the arp entry {gateway} -> {mac:02x?} on {}", v4.vtep_device))?;
    }
    let mut fdb = 0;
    for (p, node) in &peers {
        let added = handle
            .neighbours()
            .add_bridge(index, &p.vtep_mac.0)
            .destination(IpAddr::V4(p.public_ip))
            .flags(NeighbourFlags::Own)
            .execute()
            .await;
        match added {
            Ok(()) => fdb += 1,
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot add the fdb entry {} -> {} for {node}", p.vtep_mac, p.public_ip));
            }
        }
    }
    // then away with our single route for the Network: nothing uses it any more
    routes::route_del(handle, index, v4.network, Some(crate::reconcile::VTEP_GATEWAY)).await?;
    info!(device = %v4.vtep_device, peers = peers.len(), direct = direct_peers.len(), arp_kept = flanneld.len(), arp_added = arp.len() - flanneld.len(),
        fdb_added = fdb, "the kernel has flanneld's arp and fdb entries and routes for every peer (or its direct route)");
    Ok(Some(index))
}

/// The permanent arp entries on `index` (`ip neigh show dev D nud permanent`).
async fn permanent_arp(handle: &Handle, index: u32) -> Result<BTreeMap<Ipv4Addr, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut dump = handle.neighbours().get().execute();
    while let Some(n) = dump.try_next().await.context("cannot list neighbours")? {
        if n.header.ifindex != index || n.header.state != NeighbourState::Permanent {
            continue;
        }
        let ip = n.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
            _ => None,
        });
        let mac = n.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::LinkLayerAddress(mac) => Some(mac.clone()),
            _ => None,
        });
        if let (Some(ip), Some(mac)) = (ip, mac) {
            out.insert(ip, mac);
        }
    }
    Ok(out)
}
