//! `edgevx cleanup`: undo everything `edgevx run` did on this host, or,
//! with `--keep-vtep`, hand the node back to flanneld without a gap: the
//! kernel gets flanneld's per-peer entries first, then the programs go,
//! and `flannel.<VNI>` stays for flanneld to adopt with the same MAC.
use std::{
    collections::BTreeMap,
    fs,
    net::{IpAddr, Ipv4Addr},
};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use rtnetlink::{
    Handle, LinkUnspec,
    packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourState},
};
use tracing::{info, warn};

use crate::gone;
use crate::{
    UsageError,
    cli::CleanupArgs,
    dataplane::{
        bpffs::{self, PinDir},
        device, loader, routes,
    },
    family::Family,
    peer::{Peer, PeerHalf},
    state::{AGENT_FILE, AgentRecord, MAC_FILE, PEERS_FILE, StateDir},
};

pub async fn run(args: CleanupArgs) -> Result<()> {
    // an agent here would rebuild what cleanup removes: the locks it holds,
    // on this network namespace and on its state dir, say whether one runs
    let _netns =
        crate::run::netns_lock::acquire("cleanup", crate::run::netns_lock::Role::Cleanup, &args.paths.state_dir)?;
    let _lock = crate::run::lock::acquire_existing(&args.paths.state_dir)?;
    let state = StateDir(args.paths.state_dir.clone());
    let rec = state.load_agent().unwrap_or(None);
    let pins = PinDir::new(&args.paths.bpffs);
    // a newer release's dataplane is that release's to remove (exit 2, naming it)
    bpffs::no_newer_version(&args.paths.bpffs).map_err(|e| UsageError(e.to_string()))?;
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    tokio::spawn(conn);
    // before anything is detached: from here on the kernel could forward alone
    let kept_vtep = match (&rec, args.keep_vtep) {
        (Some(rec), true) => hand_over(&handle, rec, &state).await?,
        (None, true) => {
            // detaching without handing over could leave the kernel nothing to forward with
            return Err(UsageError(format!(
                "--keep-vtep: --state-dir {} holds no agent record ({AGENT_FILE}), so there is nothing to hand \
                 over; nothing was changed",
                state.0.display()
            ))
            .into());
        }
        (_, false) => None,
    };
    // the IPv6 VTEP's guard first too, before decap stops marking; the XDP
    // judge with the TC programs (it only drops early what decap drops)
    let xdp = crate::dataplane::xdp::XDP_JUDGE;
    for name in [loader::VTEP_GUARD6].into_iter().chain(loader::PROGRAMS).chain([crate::dataplane::guard::GUARD, xdp]) {
        if loader::detach_pinned(&pins, name)? {
            info!(program = name, "detached");
        }
        bpffs::remove_pin(&pins.prog(name))?;
    }
    // the clsact filters of the fallback, on the interfaces the last run used
    if let Some(rec) = &rec {
        use aya::programs::TcAttachType::{Egress, Ingress};
        let vtep = rec.v4.as_ref().map_or("", |v4| v4.vtep_device.as_str());
        let vtep6 = rec.v6.as_ref().map_or("", |v6| v6.device.as_str());
        for (name, iface, kind) in [
            // first, as in PROGRAMS: before decap stops marking what it judged
            (loader::VTEP_GUARD, vtep, Ingress),
            (loader::VTEP_GUARD, vtep6, Ingress),
            (loader::ENCAP, vtep, Egress),
            (loader::DECAP, rec.iface.as_str(), Ingress),
            (loader::BRIDGE, rec.pod_bridge.as_str(), Egress),
            (loader::POD_GUARD, rec.pod_bridge.as_str(), Ingress),
        ] {
            if !iface.is_empty() && crate::dataplane::clsact::detach(name, iface, kind)? {
                info!(program = name, iface, "removed the clsact filter");
            }
            // the proof, read back from the kernel: a filter left at our
            // priority and handle would go on running (the VTEP guard would
            // drop every frame once decap no longer marks them)
            if !iface.is_empty()
                && crate::dataplane::clsact::place(&handle, iface, kind).await?
                    != crate::dataplane::order::Place::Absent
            {
                let dir = if matches!(kind, Ingress) { "ingress" } else { "egress" };
                let (pref, handle) = (crate::dataplane::clsact::PRIORITY, u32::from(crate::dataplane::clsact::HANDLE));
                anyhow::bail!(
                    "cleanup could not remove {name}'s clsact filter from {iface} ({kind:?}): `tc filter show dev \
                     {iface} {dir}` shows it at pref {pref} handle {handle:#x}; remove it with `tc filter del dev \
                     {iface} {dir} pref {pref}`"
                );
            }
        }
        // and the qdiscs the fallback added, once nothing else uses them; not
        // on a hand-over: deleting a qdisc of a device that is up stops its
        // transmit queues for a moment (the kernel's qdisc_graft runs
        // dev_deactivate, for a clsact qdisc too), and what the kernel sends
        // then is dropped, where the hand-over must lose nothing. An empty
        // clsact qdisc does nothing.
        let mut ifaces = vec![vtep, vtep6, rec.iface.as_str(), rec.pod_bridge.as_str()];
        ifaces.dedup();
        for iface in ifaces.into_iter().filter(|i| !i.is_empty()) {
            if kept_vtep.is_some() {
                if crate::dataplane::clsact::present(&handle, iface).await? {
                    info!(
                        iface,
                        "kept the clsact qdisc, our filters gone: deleting it now would drop packets; `tc qdisc del dev {iface} clsact` removes it"
                    );
                }
            } else if crate::dataplane::clsact::remove_if_empty(&handle, iface).await? {
                info!(iface, "removed the clsact qdisc");
            }
        }
    }
    for name in edgevx_common::maps::ALL {
        bpffs::remove_pin(&pins.map(name))?;
    }
    pins.remove_empty_dirs();
    // an older release's pins, left by an upgrade that did not get to retire them
    for old in pins.other_versions() {
        loader::retire(&old)?;
    }
    match (&rec, kept_vtep) {
        (Some(rec), Some(_)) => {
            let devices =
                rec.v4.iter().map(|v4| v4.vtep_device.as_str()).chain(rec.v6.iter().map(|v6| v6.device.as_str()));
            info!(devices = ?devices.collect::<Vec<_>>(), subnet_file = %rec.subnet_file.display(),
                "kept, with its MAC, address, routes and subnet.env, for flanneld to adopt");
        }
        (Some(_), None) if args.keep_vtep => {}
        (Some(rec), None) => {
            for name in rec.v4.iter().map(|v4| &v4.vtep_device).chain(rec.v6.as_ref().map(|v6| &v6.device)) {
                if device::delete_link(&handle, name).await? {
                    info!(device = %name, "deleted (its routes went with it)");
                }
            }
            let peers = state.load_peers().with_context(|| {
                format!(
                    "cannot read the peers the agent programmed (in {}); their direct routes stay",
                    state.0.display()
                )
            })?;
            let mut removed = 0;
            if let Some(v4) = &rec.v4 {
                removed += remove_direct_routes(&handle, &rec.iface, v4.network, &ends(&peers)).await?;
            }
            if let Some(v6) = &rec.v6 {
                removed += remove_direct_routes(&handle, &rec.iface, v6.network, &ends(&peers)).await?;
            }
            if removed > 0 {
                info!(routes = removed, iface = %rec.iface, "removed the DirectRouting routes");
            }
            let removed = gone::absent(fs::remove_file(&rec.subnet_file))
                .with_context(|| format!("cannot remove {}", rec.subnet_file.display()))?;
            if removed.is_some() {
                info!(path = %rec.subnet_file.display(), "removed");
            }
        }
        (None, _) => {}
    }
    // our firewall chains, whatever flags the last run had
    match crate::netfilter::Firewall::new::<ipnet::Ipv4Net>() {
        Ok(fw) => {
            if fw.remove_all().context("cannot remove the firewall rules")? {
                info!("removed edgevx's iptables chains");
            }
        }
        Err(e) => info!("no iptables here, so no firewall rules to remove: {e:#}"),
    }
    // whatever the record says (a dual-stack run may have left them without one)
    match crate::netfilter::Firewall::new::<ipnet::Ipv6Net>() {
        Ok(fw) => {
            if fw.remove_all().context("cannot remove the IPv6 firewall rules")? {
                info!("removed edgevx's ip6tables chains");
            }
        }
        Err(e) => info!("no ip6tables here, so no IPv6 firewall rules to remove: {e:#}"),
    }
    let mut files = vec![AGENT_FILE, PEERS_FILE, crate::cache::VIEW_FILE];
    if args.purge_mac {
        files.extend([MAC_FILE, crate::state::MAC6_FILE]);
    }
    for f in files {
        let _ = fs::remove_file(state.path(f));
    }
    if !args.purge_mac && state.path(MAC_FILE).exists() {
        info!(path = %state.path(MAC_FILE).display(), "kept the VTEP MAC so the next start reuses it (--purge-mac removes it)");
    }
    // the proof, read back from the bpffs: a pin left keeps its program in the kernel
    let left = crate::status::pinned(&pins);
    if !left.is_empty() {
        anyhow::bail!(
            "cleanup is done but {} still holds {}: each keeps a program or link in the kernel (`bpftool link \
             show` and `bpftool prog show` name them); remove them by hand with rm",
            args.paths.bpffs.display(),
            left.join(", ")
        );
    }
    info!(bpffs = %args.paths.bpffs.display(), "nothing of edgevx is pinned any more");
    Ok(())
}

/// Each peer's pod subnet and public IP of the family `N`.
fn ends<N: PeerHalf>(peers: &[Peer]) -> Vec<(N, N::Addr)> {
    peers.iter().filter_map(|p| p.half::<N>()).map(|h| (h.subnet, h.public_ip)).collect()
}

/// The DirectRouting routes into `network` on the underlay `iface` (see
/// [`routes::MainTable::direct`]) that are ours: through one of the peers'
/// addresses or to one of their subnets (`ends`, in the same family). Pod
/// subnet → public IP, and the underlay's ifindex.
async fn direct_routes<N: Family>(
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
async fn remove_direct_routes<N: Family>(
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
async fn hand_over(handle: &Handle, rec: &AgentRecord, state: &StateDir) -> Result<Option<u32>> {
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
