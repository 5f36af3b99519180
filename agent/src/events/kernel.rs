//! Netlink multicast: the kernel tells us when a link, an address, a
//! neighbour (or bridge fdb entry) or a route changes, as `ip monitor` shows.
use anyhow::{Context, Result};
use futures::StreamExt;
use rtnetlink::{
    constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_ROUTE, RTMGRP_LINK, RTMGRP_NEIGH},
    packet_core::NetlinkPayload,
    packet_route::{
        RouteNetlinkMessage,
        link::{LinkAttribute, LinkMessage},
        route::{RouteAttribute, RouteMessage},
    },
    sys::{AsyncSocket, SocketAddr},
};
use tokio::sync::mpsc;

/// One change in the kernel, reduced to what the run loop acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvent {
    /// A link appeared, changed or went away (`ip monitor link`).
    Link { index: u32, name: Option<String>, mtu: Option<u32>, deleted: bool },
    /// An address on `index` was added or removed (`ip monitor address`).
    Address { index: u32 },
    /// A neighbour or bridge fdb entry on `index` changed (`ip monitor neigh`):
    /// a pod came or went.
    Neighbour { index: u32 },
    /// A main-table route through `oif` changed (`ip monitor route`).
    Route { oif: Option<u32>, deleted: bool },
}

fn link(l: &LinkMessage, deleted: bool) -> KernelEvent {
    let mut name = None;
    let mut mtu = None;
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Mtu(m) => mtu = Some(*m),
            _ => {}
        }
    }
    KernelEvent::Link { index: l.header.index, name, mtu, deleted }
}

fn route(r: &RouteMessage, deleted: bool) -> Option<KernelEvent> {
    if r.header.table != 254 {
        return None;
    }
    let oif = r.attributes.iter().find_map(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None });
    Some(KernelEvent::Route { oif, deleted })
}

/// Reduces one netlink message to an event, if it is one we follow.
pub fn classify(msg: RouteNetlinkMessage) -> Option<KernelEvent> {
    use RouteNetlinkMessage as M;
    match msg {
        M::NewLink(l) => Some(link(&l, false)),
        M::DelLink(l) => Some(link(&l, true)),
        M::NewAddress(a) | M::DelAddress(a) => Some(KernelEvent::Address { index: a.header.index }),
        M::NewNeighbour(n) | M::DelNeighbour(n) => Some(KernelEvent::Neighbour { index: n.header.ifindex }),
        M::NewRoute(r) => route(&r, false),
        M::DelRoute(r) => route(&r, true),
        _ => None,
    }
}

/// Subscribes to link, IPv4 address, neighbour and route changes in
/// this network namespace; the events arrive on the returned channel
/// until it is dropped.
pub fn subscribe() -> Result<mpsc::Receiver<KernelEvent>> {
    let (mut conn, _handle, mut messages) =
        rtnetlink::new_connection().context("cannot open a netlink socket for kernel events")?;
    let groups = RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;
    conn.socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(0, groups))
        .context("cannot subscribe to netlink link, address, neighbour and route events")?;
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(conn);
    tokio::spawn(async move {
        // `_handle` must live as long as the connection reads
        let _handle = _handle;
        while let Some((msg, _)) = messages.next().await {
            let NetlinkPayload::InnerMessage(inner) = msg.payload else { continue };
            let Some(event) = classify(inner) else { continue };
            // a full channel means the loop is behind: it resyncs anyway
            if tx.try_send(event).is_err() && tx.is_closed() {
                return;
            }
        }
    });
    Ok(rx)
}
