//! The routes edgevx writes and reads, in the main table: the VTEP's
//! routes (`ip route replace DST via GW dev flannel.<VNI> onlink`),
//! DirectRouting's routes through the underlay (`ip route replace SUBNET via
//! PUBLIC_IP dev eth0`), one dump of the table for both, and the default
//! route's interface (flannel's `GetDefaultGatewayInterface`).
use std::net::{IpAddr, Ipv4Addr};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::{
        link::LinkAttribute,
        route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType},
    },
};

use crate::gone;
use crate::{dataplane::device::link_by_name, family::Family, reconcile::Hop};

fn route_message(index: u32, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> RouteMessage {
    let b = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst.network(), dst.prefix_len())
        .output_interface(index)
        .protocol(RouteProtocol::Boot);
    match gateway {
        Some(gw) => b.gateway(gw).onlink().build(),
        None => b.build(),
    }
}

/// `ip route replace DST [via GATEWAY onlink] dev flannel.<VNI>`
pub async fn route_put(handle: &Handle, index: u32, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> Result<()> {
    handle
        .route()
        .add(route_message(index, dst, gateway))
        .replace()
        .execute()
        .await
        .with_context(|| format!("cannot add route {dst} through the VTEP"))
}

/// flanneld's route for a peer: `ip route replace SUBNET via SUBNET.network
/// dev flannel.<VNI> onlink` (used when handing the VTEP back to it).
pub async fn route_replace(handle: &Handle, index: u32, subnet: Ipv4Net) -> Result<()> {
    route_put(handle, index, subnet, Some(subnet.network())).await
}

/// `ip route del DST [via GATEWAY] dev flannel.<VNI>`; a route already gone is fine.
pub async fn route_del(handle: &Handle, index: u32, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> Result<()> {
    gone::removed(handle.route().del(route_message(index, dst, gateway)).execute().await)
        .with_context(|| format!("cannot delete route {dst}"))
}

/// A route of the main table, as far as edgevx reads routes.
struct MainRoute<N: Family> {
    dst: N,
    gateway: Option<N::Addr>,
    oif: Option<u32>,
    unicast: bool,
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

/// The main table's routes of one family (`Ipv4Net` unless named), read in
/// one dump (`ip [-6] route show table main`).
pub struct MainTable<N: Family = Ipv4Net>(Vec<MainRoute<N>>);

impl<N: Family> MainTable<N> {
    pub async fn read(handle: &Handle) -> Result<Self> {
        let mut out = Vec::new();
        let mut filter = RouteMessageBuilder::<IpAddr>::new().build();
        filter.header.address_family = N::NETLINK;
        let mut routes = handle.route().get(filter).execute();
        while let Some(r) = routes.try_next().await.context("cannot list routes")? {
            if r.header.address_family != N::NETLINK || r.header.table != 254 {
                continue;
            }
            let mut oif = None;
            let mut dst = N::unspecified();
            let mut gateway = None;
            for a in &r.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Destination(a) => dst = route_ip(a).and_then(N::of).unwrap_or(dst),
                    RouteAttribute::Gateway(a) => gateway = route_ip(a).and_then(N::of),
                    _ => {}
                }
            }
            if let Some(dst) = N::with_len(dst, r.header.destination_prefix_length) {
                out.push(MainRoute { dst, gateway, oif, unicast: r.header.kind == RouteType::Unicast });
            }
        }
        Ok(MainTable(out))
    }
}

impl<N: Family> MainTable<N> {
    /// The routes through `index`: destination and gateway
    /// (`ip route show dev flannel.<VNI>`).
    pub fn via(&self, index: u32) -> impl Iterator<Item = (N, Option<N::Addr>)> + '_ {
        self.0.iter().filter(move |r| r.oif == Some(index)).map(|r| (r.dst, r.gateway))
    }

    /// The DirectRouting routes: pod subnet → gateway. A route counts as one
    /// when it goes out of the `underlay` through a gateway and its
    /// destination lies within the pod `network`: the form flanneld and
    /// edgevx both write (`ip route replace SUBNET via PUBLIC_IP dev eth0`).
    /// Pod addresses are never reached through the underlay otherwise, so
    /// such a route is a direct route, ours or a DirectRouting flanneld's
    /// before us. A route without a gateway, or outside the Network, is
    /// never counted, so never deleted.
    pub fn direct(&self, underlay: u32, network: N) -> impl Iterator<Item = (N, N::Addr)> + '_ {
        self.0
            .iter()
            .filter(move |r| r.oif == Some(underlay) && r.unicast && network.covers(&r.dst))
            .filter_map(|r| Some((r.dst, r.gateway?)))
    }

    /// The routes as DirectRouting's on-link test reads them: a unicast
    /// route out of `underlay` without a gateway reaches directly; any other
    /// (through a gateway, another device, blackhole, multipath) does not.
    pub fn hops(&self, underlay: u32) -> Vec<Hop<N>> {
        let direct = |r: &MainRoute<N>| r.unicast && r.gateway.is_none() && r.oif == Some(underlay);
        self.0.iter().map(|r| Hop { dst: r.dst, direct: direct(r) }).collect()
    }
}

/// [`MainTable::direct`] for the underlay named `iface`, from a thread of
/// its own (for `edgevx status`, which has no runtime). Empty when the
/// interface or the routes cannot be read.
pub fn direct_routes_blocking(iface: &str, network: Ipv4Net) -> std::collections::BTreeMap<Ipv4Net, Ipv4Addr> {
    let iface = iface.to_string();
    let ask = move || -> Option<std::collections::BTreeMap<Ipv4Net, Ipv4Addr>> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection().ok()?;
            tokio::spawn(conn);
            let index = link_by_name(&handle, &iface).await.ok()??.header.index;
            Some(MainTable::read(&handle).await.ok()?.direct(index, network).collect())
        })
    };
    std::thread::spawn(ask).join().ok().flatten().unwrap_or_default()
}

/// A direct route's message: `SUBNET via PUBLIC_IP dev eth0`, in either family.
fn direct_route<N: Family>(underlay: u32, subnet: N, public_ip: N::Addr) -> Result<RouteMessage> {
    let msg = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(subnet.network_addr().into(), subnet.prefix_length())?
        .gateway(public_ip.into())?
        .output_interface(underlay)
        .build();
    Ok(msg)
}

/// flannel's direct route: `ip [-6] route replace SUBNET via PUBLIC_IP dev
/// eth0` (no onlink: the kernel checks that the gateway is on the segment).
pub async fn direct_route_put<N: Family>(handle: &Handle, underlay: u32, subnet: N, public_ip: N::Addr) -> Result<()> {
    let mut msg = direct_route(underlay, subnet, public_ip)?;
    msg.header.protocol = RouteProtocol::Boot;
    handle
        .route()
        .add(msg)
        .replace()
        .execute()
        .await
        .with_context(|| format!("cannot add the direct route {subnet} via {public_ip}"))
}

/// `ip [-6] route del SUBNET via PUBLIC_IP dev eth0`; a route already gone
/// is fine. Like `ip route del`, it matches whatever protocol and scope the
/// route was written with (unspecified and RT_SCOPE_NOWHERE: the kernel's
/// wildcards), so a route flanneld or a hand wrote goes too.
pub async fn direct_route_del<N: Family>(handle: &Handle, underlay: u32, subnet: N, public_ip: N::Addr) -> Result<()> {
    let mut msg = direct_route(underlay, subnet, public_ip)?;
    msg.header.protocol = RouteProtocol::Unspec;
    msg.header.scope = RouteScope::NoWhere;
    gone::removed(handle.route().del(msg).execute().await)
        .with_context(|| format!("cannot delete the direct route {subnet} via {public_ip}"))
}

/// The interface of the main table's default route of family `N`, if
/// there is one (`ip [-6] route show default`; flannel's
/// `GetDefaultGatewayInterface` and `GetDefaultV6GatewayInterface`).
pub async fn default_route_iface<N: Family>(handle: &Handle) -> Result<Option<String>> {
    let mut filter = RouteMessageBuilder::<IpAddr>::new().build();
    filter.header.address_family = N::NETLINK;
    let family = N::NETLINK;
    let mut routes = handle.route().get(filter).execute();
    let mut oif = None;
    while let Some(r) = routes.try_next().await.context("cannot list routes")? {
        if r.header.address_family == family && r.header.table == 254 && r.header.destination_prefix_length == 0 {
            oif = r.attributes.iter().find_map(|a| if let RouteAttribute::Oif(i) = a { Some(*i) } else { None });
            if oif.is_some() {
                break;
            }
        }
    }
    let Some(index) = oif else { return Ok(None) };
    let mut links = handle.link().get().match_index(index).execute();
    let link = links.try_next().await.context("cannot look up the default route's interface")?;
    Ok(link.and_then(|l| {
        l.attributes.iter().find_map(|a| if let LinkAttribute::IfName(n) = a { Some(n.clone()) } else { None })
    }))
}
