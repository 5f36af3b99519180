//! The VTEP device, set up the way flannel sets it up (its routes are
//! `routes.rs`):
//! `flannel.<VNI>` is a kernel VXLAN device (nolearning, our VNI, port and
//! source address) carrying our MAC and `<subnet network>/32`, with one route
//! for the whole Network through it (flanneld adds one per remote subnet). Unlike flannel it gets no fdb and no arp
//! entries: the TC program on its egress encapsulates from the BPF maps.
//! It is NOARP, so the kernel never tries to resolve the on-link gateways.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    Handle, LinkUnspec, LinkVxlan,
    packet_route::{
        AddressFamily,
        address::{AddressAttribute, AddressFlags, AddressScope},
        link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage},
        neighbour::NeighbourState,
    },
};

use crate::mac::VtepMac;

/// The index of `iface` in this network namespace, `None` when there is no
/// such interface. Any other failure is an error, not an absence: the
/// lookup opens a socket, so a process out of descriptors (EMFILE) or
/// memory gets an errno that says nothing about the interface.
pub fn ifindex(iface: &str) -> std::io::Result<Option<u32>> {
    let name = std::ffi::CString::new(iface)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("interface name {iface:?}")))?;
    // SAFETY: plain lookup with a valid C string.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            e => Err(e),
        },
        index => Ok(Some(index)),
    }
}

/// The underlay interface as the agent needs it.
#[derive(Clone, Debug)]
pub struct Underlay {
    pub index: u32,
    pub mtu: u32,
    pub ipv4: Option<Ipv4Addr>,
    /// The global IPv6 address flannel would pick (`GetInterfaceIP6Addrs`'s
    /// first): permanent before dynamic, non-temporary before temporary;
    /// deprecated, tentative and link-local addresses never.
    pub ipv6: Option<Ipv6Addr>,
    /// A global IPv6 address is there but still tentative (duplicate
    /// address detection runs): `ipv6` will have it in a moment.
    pub ipv6_tentative: bool,
}

/// What `flannel.<VNI>` must look like.
#[derive(Clone, Debug)]
pub struct VtepSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: Ipv4Addr,
    pub underlay_index: u32,
    pub mac: VtepMac,
    pub mtu: u32,
}

pub fn vtep_name(vni: u32) -> String {
    format!("flannel.{vni}")
}

/// `ip link show NAME`, or `None` if it does not exist.
pub async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<LinkMessage>> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(link) => Ok(link),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot look up link {name}")),
    }
}

pub async fn underlay(handle: &Handle, name: &str) -> Result<Underlay> {
    let link = link_by_name(handle, name).await?.with_context(|| format!("interface {name} does not exist"))?;
    let index = link.header.index;
    let mtu = link
        .attributes
        .iter()
        .find_map(|a| if let LinkAttribute::Mtu(m) = a { Some(*m) } else { None })
        .unwrap_or(1500);
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    let mut ipv4 = None;
    // (rank, address): the lowest rank wins, the first of a rank stays
    let mut ipv6: Option<(u8, Ipv6Addr)> = None;
    let mut ipv6_tentative = false;
    while let Some(msg) = addrs.try_next().await.with_context(|| format!("cannot list addresses of {name}"))? {
        let flags = msg
            .attributes
            .iter()
            .find_map(|a| if let AddressAttribute::Flags(f) = a { Some(*f) } else { None })
            .unwrap_or(AddressFlags::empty());
        for a in &msg.attributes {
            match a {
                AddressAttribute::Address(IpAddr::V4(ip)) => {
                    ipv4.get_or_insert(*ip);
                }
                AddressAttribute::Address(IpAddr::V6(ip)) if msg.header.scope == AddressScope::Universe => {
                    ipv6_tentative |=
                        flags.contains(AddressFlags::Tentative) && !flags.contains(AddressFlags::Dadfailed);
                    if let Some(rank) = ipv6_rank(flags) {
                        if ipv6.is_none_or(|(r, _)| rank < r) {
                            ipv6 = Some((rank, *ip));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(Underlay { index, mtu, ipv4, ipv6: ipv6.map(|(_, ip)| ip), ipv6_tentative })
}

/// How good a global IPv6 address is as a VTEP source; `None`: unusable.
pub(crate) fn ipv6_rank(flags: AddressFlags) -> Option<u8> {
    if flags.intersects(AddressFlags::Tentative | AddressFlags::Deprecated | AddressFlags::Dadfailed) {
        return None;
    }
    Some(u8::from(!flags.contains(AddressFlags::Permanent)) * 2 + u8::from(flags.contains(AddressFlags::Secondary)))
}

pub(crate) fn vxlan_info(link: &LinkMessage) -> Option<&Vec<InfoVxlan>> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Data(InfoData::Vxlan(v)) => Some(v),
            _ => None,
        }),
        _ => None,
    })
}

pub(crate) fn is_vxlan(link: &LinkMessage) -> bool {
    link.attributes.iter().any(|a| {
        matches!(a, LinkAttribute::LinkInfo(infos) if infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vxlan))))
    })
}

/// flannel's "compatible" check: VNI, lower device, source, port. MAC, MTU
/// and flags are fixed in place instead.
fn compatible(link: &LinkMessage, spec: &VtepSpec) -> bool {
    let Some(info) = vxlan_info(link).filter(|_| is_vxlan(link)) else {
        return false;
    };
    let has = |want: &InfoVxlan| info.iter().any(|i| i == want);
    has(&InfoVxlan::Id(spec.vni))
        && has(&InfoVxlan::Link(spec.underlay_index))
        && has(&InfoVxlan::Local(spec.local))
        && has(&InfoVxlan::Port(spec.port))
        && !info.iter().any(|i| matches!(i, InfoVxlan::CollectMetadata(true)))
}

/// Creates or adopts the VTEP device; returns its ifindex.
/// `ip link add flannel.1 type vxlan id 1 dev eth0 local A dstport 8472 nolearning`,
/// then `ip link set flannel.1 address MAC mtu M arp off up`.
pub async fn ensure_vtep(handle: &Handle, spec: &VtepSpec) -> Result<u32> {
    if let Some(link) = link_by_name(handle, &spec.name).await? {
        if compatible(&link, spec) {
            let index = link.header.index;
            // Touch only what differs: setting even the same MAC flushes the
            // device's neighbours, and NOARP (set_noarp, after the programs are
            // attached) would too; an adopted flannel.1 still forwards with them.
            let mut msg = LinkUnspec::new_with_index(index);
            if link_mac(&link).as_deref() != Some(&spec.mac.0[..]) {
                msg = msg.address(spec.mac.0.to_vec());
            }
            if link_mtu(&link) != Some(spec.mtu) {
                msg = msg.mtu(spec.mtu);
            }
            let msg = msg.up().build();
            handle.link().set(msg).execute().await.with_context(|| format!("cannot configure {}", spec.name))?;
            verify_mac(handle, spec).await?;
            no_router_advertisements(&spec.name);
            return Ok(index);
        }
        tracing::warn!(device = %spec.name, "existing device does not match the configuration; recreating it");
        handle.link().del(link.header.index).execute().await.with_context(|| format!("cannot delete {}", spec.name))?;
    }
    let msg = LinkVxlan::new(&spec.name, spec.vni)
        .dev(spec.underlay_index)
        .local(spec.local)
        .port(spec.port)
        .learning(false)
        .address(spec.mac.0.to_vec())
        .mtu(spec.mtu)
        .arp(false)
        .up()
        .build();
    handle.link().add(msg).execute().await.with_context(|| format!("cannot create {}", spec.name))?;
    verify_mac(handle, spec).await?;
    let link =
        link_by_name(handle, &spec.name).await?.with_context(|| format!("{} vanished after creation", spec.name))?;
    no_router_advertisements(&spec.name);
    Ok(link.header.index)
}

/// `accept_ra 0` on the IPv4 VTEP too, as flannel's `newVXLANDevice` sets
/// it on every VXLAN device, and like flannel without failing: a host with
/// IPv6 disabled has no such setting.
fn no_router_advertisements(device: &str) {
    if let Err(e) = super::vtep6::no_router_advertisements(device) {
        tracing::debug!(device, "accept_ra not set: {e:#}");
    }
}

pub(crate) fn link_mac(link: &LinkMessage) -> Option<Vec<u8>> {
    link.attributes.iter().find_map(|a| if let LinkAttribute::Address(m) = a { Some(m.clone()) } else { None })
}

pub fn link_mtu(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| if let LinkAttribute::Mtu(m) = a { Some(*m) } else { None })
}

/// `ip link set DEV mtu M`, touching nothing else.
pub async fn set_mtu(handle: &Handle, index: u32, mtu: u32) -> Result<()> {
    let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
    handle.link().set(msg).execute().await.with_context(|| format!("cannot set the MTU of link {index} to {mtu}"))
}

/// `ip link set DEV arp off`: the kernel never resolves the on-link gateways.
pub async fn set_noarp(handle: &Handle, index: u32) -> Result<()> {
    let msg = LinkUnspec::new_with_index(index).arp(false).build();
    handle.link().set(msg).execute().await.context("cannot set NOARP on the VTEP")
}

/// udev or systemd may rewrite a new device's MAC (flannel#1795): check.
async fn verify_mac(handle: &Handle, spec: &VtepSpec) -> Result<()> {
    let link = link_by_name(handle, &spec.name).await?.with_context(|| format!("{} does not exist", spec.name))?;
    let actual = link_mac(&link);
    if actual.as_deref() != Some(&spec.mac.0[..]) {
        bail!("{} has MAC {:02x?}, not {}: something rewrote it (udev MACAddressPolicy?)", spec.name, actual, spec.mac);
    }
    Ok(())
}

/// Removes the permanent arp entries and the fdb entries on the VTEP: a
/// device adopted from flanneld carries one of each per peer, and edgevx
/// keeps that state in its maps instead.
/// `ip neigh flush dev flannel.1 nud permanent; bridge fdb flush dev flannel.1`
pub async fn flush_static_neighbours(handle: &Handle, index: u32) -> Result<usize> {
    let mut stale = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Bridge] {
        let mut dump = handle.neighbours().get().set_address_family(family).execute();
        while let Some(n) = dump.try_next().await.context("cannot list neighbours")? {
            let permanent = n.header.state == NeighbourState::Permanent;
            if n.header.ifindex == index && (family == AddressFamily::Bridge || permanent) {
                stale.push(n);
            }
        }
    }
    let count = stale.len();
    for n in stale {
        handle.neighbours().del(n).execute().await.context("cannot delete a neighbour entry on the VTEP")?;
    }
    Ok(count)
}

/// `<subnet network>/32` on the device, and no other address inside `network`.
pub async fn ensure_address(handle: &Handle, index: u32, subnet: Ipv4Net, network: Ipv4Net) -> Result<()> {
    let want = subnet.network();
    let mut have_it = false;
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    let mut stale = Vec::new();
    while let Some(msg) = addrs.try_next().await.context("cannot list VTEP addresses")? {
        let ip = msg
            .attributes
            .iter()
            .find_map(|a| if let AddressAttribute::Address(IpAddr::V4(ip)) = a { Some(*ip) } else { None });
        match ip {
            Some(ip) if ip == want && msg.header.prefix_len == 32 => have_it = true,
            Some(ip) if network.contains(&ip) => stale.push(msg),
            _ => {}
        }
    }
    for msg in stale {
        handle.address().del(msg).execute().await.context("cannot remove a stale VTEP address")?;
    }
    if !have_it {
        handle
            .address()
            .add(index, IpAddr::V4(want), 32)
            .execute()
            .await
            .with_context(|| format!("cannot add {want}/32 to the VTEP"))?;
    }
    Ok(())
}

/// `ip link del NAME`, if it exists.
pub async fn delete_link(handle: &Handle, name: &str) -> Result<bool> {
    match link_by_name(handle, name).await? {
        Some(link) => {
            handle.link().del(link.header.index).execute().await.with_context(|| format!("cannot delete {name}"))?;
            Ok(true)
        }
        None => Ok(false),
    }
}
