//! The links edgevx reads and sets by name or index: the underlay as the
//! agent needs it, a device's MAC, MTU and VXLAN attributes, NOARP, and
//! the flush of an adopted VTEP's static entries (the VTEPs themselves are
//! `vtep.rs`, their routes `routes.rs`).
use std::{
    ffi::CString,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use crate::gone;
use anyhow::{Context, Result, anyhow};
use futures::TryStreamExt;
use rtnetlink::{
    Handle, LinkUnspec,
    packet_route::{
        AddressFamily,
        address::{AddressAttribute, AddressFlags, AddressScope},
        link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage},
        neighbour::NeighbourState,
    },
};

/// `iface` as aya 0.16 takes interface names (`&CStr`); a name with a NUL
/// byte cannot exist.
pub fn c_name(iface: &str) -> Result<CString> {
    CString::new(iface).map_err(|_| anyhow!("interface name {iface:?} has a NUL byte"))
}

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

/// `ip link show NAME`, or `None` if it does not exist.
pub async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<LinkMessage>> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    Ok(gone::absent(links.try_next().await).with_context(|| format!("cannot look up link {name}"))?.flatten())
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
                    if let Some(rank) = ipv6_rank(flags)
                        && ipv6.is_none_or(|(r, _)| rank < r)
                    {
                        ipv6 = Some((rank, *ip));
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
