//! The VTEP devices, one per address family, set up as flannel's vxlan
//! backend sets them up: one `newVXLANDevice`, called once per family
//! (their routes are `routes.rs`).
//!
//! - `flannel.<VNI>` (IPv4) is a kernel VXLAN device (nolearning, our VNI,
//!   port and source address) carrying our MAC and `<subnet network>/32`.
//!   Unlike flannel it gets no fdb and no arp entries: the TC program on
//!   its egress encapsulates from the BPF maps. It is NOARP, so the kernel
//!   never tries to resolve the on-link gateways.
//! - `flannel-v6.<VNI>` (IPv6) has our public IPv6 as source
//!   (`IFLA_VXLAN_LOCAL6`), real UDP checksums both ways
//!   (`noudp6zerocsumtx noudp6zerocsumrx`: a flannel peer drops a zero
//!   checksum) and `<v6 subnet base>/128`. The kernel encapsulates and
//!   decapsulates IPv6 pod traffic from the neighbour, fdb and route
//!   entries [`super::ipv6_table`] keeps per peer: BPF cannot give an IPv6 GSO
//!   packet its outer UDP checksum (docs: "IPv6 dual-stack"), so the
//!   programs only judge what arrives (the socket guard and the underlay's
//!   IPv6 judge).
//!
//! Both get `accept_ra 0`, and a device flanneld left behind keeps its
//! entries: they are flannel's form, which edgevx adopts.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkUnspec, LinkVxlan,
    packet_route::{
        address::{AddressAttribute, AddressScope},
        link::{InfoVxlan, LinkMessage},
    },
};

use super::device::{Underlay, is_vxlan, link_by_name, link_mac, link_mtu, vxlan_info};
use crate::{family::Family, mac::VtepMac};

/// What a family's VTEP differs in. Everything else is one path.
pub trait VtepFamily: Family {
    /// The device's name before the VNI: `flannel.` / `flannel-v6.`.
    const NAME_PREFIX: &'static str;
    /// The length of the device's own address: one host.
    const HOST_PREFIX: u8;
    /// The VXLAN source attribute (`IFLA_VXLAN_LOCAL` / `LOCAL6`), as
    /// the kernel reports it.
    fn source(local: Self::Addr) -> InfoVxlan;
    /// The family's part of `ip link add ... type vxlan`: the source, and
    /// for IPv4 `arp off` (the programs encapsulate, nothing resolves),
    /// for IPv6 real UDP checksums both ways.
    fn create(msg: LinkMessageBuilder<LinkVxlan>, local: Self::Addr) -> LinkMessageBuilder<LinkVxlan>;
    /// Whether an address the device has, other than its own, must go:
    /// for IPv4 one inside the flannel `network` (a lease that changed;
    /// flannel's `EnsureV4AddressOnLink`), for IPv6 any global one
    /// (flannel's `EnsureV6AddressOnLink`; link-local ones stay).
    fn stale(addr: Self::Addr, scope: AddressScope, network: Self) -> bool;
    /// Whether a failed `accept_ra 0` stops the bring-up. IPv4: no, as
    /// flannel, since a host with IPv6 disabled has no such setting. IPv6:
    /// yes, or router advertisements would address and route the device.
    const ACCEPT_RA_REQUIRED: bool;
    /// What VXLAN adds to a packet: outer IPv4 20 or IPv6 40, UDP 8, VXLAN
    /// 8, inner Ethernet 14 (the kernel's `vxlan_headroom`).
    const ENCAP_OVERHEAD: u32;
    /// The underlay's address of the family a VTEP would take as source.
    fn underlay_source(underlay: &Underlay) -> Option<Self::Addr>;
}

impl VtepFamily for Ipv4Net {
    const NAME_PREFIX: &'static str = "flannel.";
    const HOST_PREFIX: u8 = 32;
    const ACCEPT_RA_REQUIRED: bool = false;
    const ENCAP_OVERHEAD: u32 = edgevx_common::vxlan::ENCAP_OVERHEAD as u32;
    fn underlay_source(underlay: &Underlay) -> Option<Ipv4Addr> {
        underlay.ipv4
    }
    fn source(local: Ipv4Addr) -> InfoVxlan {
        InfoVxlan::Local(local)
    }
    fn create(msg: LinkMessageBuilder<LinkVxlan>, local: Ipv4Addr) -> LinkMessageBuilder<LinkVxlan> {
        msg.local(local).arp(false)
    }
    fn stale(addr: Ipv4Addr, _: AddressScope, network: Self) -> bool {
        network.contains(&addr)
    }
}

impl VtepFamily for Ipv6Net {
    const NAME_PREFIX: &'static str = "flannel-v6.";
    const HOST_PREFIX: u8 = 128;
    const ACCEPT_RA_REQUIRED: bool = true;
    const ENCAP_OVERHEAD: u32 = 70;
    fn underlay_source(underlay: &Underlay) -> Option<Ipv6Addr> {
        underlay.ipv6
    }
    fn source(local: Ipv6Addr) -> InfoVxlan {
        InfoVxlan::Local6(local)
    }
    fn create(msg: LinkMessageBuilder<LinkVxlan>, local: Ipv6Addr) -> LinkMessageBuilder<LinkVxlan> {
        msg.local6(local).udp_zero_csum6_tx(false).udp_zero_csum6_rx(false)
    }
    fn stale(_: Ipv6Addr, scope: AddressScope, _: Self) -> bool {
        scope != AddressScope::Link
    }
}

/// `flannel.<VNI>` or `flannel-v6.<VNI>`.
pub fn vtep_name<N: VtepFamily>(vni: u32) -> String {
    format!("{}{vni}", N::NAME_PREFIX)
}

/// What a family's VTEP must look like.
#[derive(Clone, Debug)]
pub struct VtepSpec<N: VtepFamily> {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: N::Addr,
    pub underlay_index: u32,
    pub mac: VtepMac,
    pub mtu: u32,
}

/// flannel's compatibility check (`vxlanLinksIncompat`): VNI, lower
/// device, source, port. MAC and MTU are fixed in place instead. A
/// collect_md device, or an IPv6 one with zero checksums, is not ours.
fn compatible<N: VtepFamily>(link: &LinkMessage, spec: &VtepSpec<N>) -> bool {
    let Some(info) = vxlan_info(link).filter(|_| is_vxlan(link)) else {
        return false;
    };
    let has = |want: &InfoVxlan| info.iter().any(|i| i == want);
    let foreign = |i: &InfoVxlan| match i {
        InfoVxlan::CollectMetadata(on) => *on,
        InfoVxlan::UDPZeroCsumRX(on) | InfoVxlan::UDPZeroCsumTX(on) => N::IPV6 && *on,
        _ => false,
    };
    has(&InfoVxlan::Id(spec.vni))
        && has(&InfoVxlan::Link(spec.underlay_index))
        && has(&N::source(spec.local))
        && has(&InfoVxlan::Port(spec.port))
        && !info.iter().any(foreign)
}

/// Creates or adopts the VTEP device; returns its ifindex.
/// `ip link add flannel.1 type vxlan id 1 dev eth0 local A dstport 8472
/// nolearning`, then `ip link set flannel.1 address MAC mtu M arp off up`;
/// `ip link add flannel-v6.1 type vxlan id 1 dev eth0 local A6 dstport 8472
/// nolearning noudp6zerocsumtx noudp6zerocsumrx`, then `address MAC mtu M
/// up`; both `accept_ra 0`.
pub async fn ensure_vtep<N: VtepFamily>(handle: &Handle, spec: &VtepSpec<N>) -> Result<u32> {
    let existing = link_by_name(handle, &spec.name).await?;
    let index = match existing {
        Some(link) if compatible(&link, spec) => {
            // Touch only what differs: setting even the same MAC flushes the
            // device's neighbours, and NOARP (set_noarp, after the programs are
            // attached) would too; an adopted flannel.1 still forwards with them.
            let mut msg = LinkUnspec::new_with_index(link.header.index);
            if link_mac(&link).as_deref() != Some(&spec.mac.0[..]) {
                msg = msg.address(spec.mac.0.to_vec());
            }
            if link_mtu(&link) != Some(spec.mtu) {
                msg = msg.mtu(spec.mtu);
            }
            let msg = msg.up().build();
            handle.link().set(msg).execute().await.with_context(|| format!("cannot configure {}", spec.name))?;
            link.header.index
        }
        existing => {
            if let Some(link) = existing {
                tracing::warn!(device = %spec.name, "existing device does not match the configuration; recreating it");
                let index = link.header.index;
                handle.link().del(index).execute().await.with_context(|| format!("cannot delete {}", spec.name))?;
            }
            let msg = N::create(LinkVxlan::new(&spec.name, spec.vni), spec.local)
                .dev(spec.underlay_index)
                .port(spec.port)
                .learning(false)
                .address(spec.mac.0.to_vec())
                .mtu(spec.mtu)
                .up()
                .build();
            handle.link().add(msg).execute().await.with_context(|| format!("cannot create {}", spec.name))?;
            let link = link_by_name(handle, &spec.name).await?;
            link.with_context(|| format!("{} vanished after creation", spec.name))?.header.index
        }
    };
    match no_router_advertisements(&spec.name) {
        Err(e) if N::ACCEPT_RA_REQUIRED => return Err(e),
        Err(e) => tracing::debug!(device = %spec.name, "accept_ra not set: {e:#}"),
        Ok(()) => {}
    }
    verify(handle, spec).await?;
    Ok(index)
}

/// `sysctl net.ipv6.conf.<dev>.accept_ra=0`, as flannel's
/// `newVXLANDevice` sets it on every VXLAN device.
fn no_router_advertisements(device: &str) -> Result<()> {
    let path = format!("/proc/sys/net/ipv6/conf/{device}/accept_ra");
    if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "0") {
        return Ok(());
    }
    std::fs::write(&path, "0").with_context(|| format!("cannot write 0 to {path}"))
}

/// The MAC (udev may rewrite a new device's, flannel#1795) and the MTU the
/// kernel settled on (it clamps an IPv6 VTEP's silently to the underlay's
/// less 70).
async fn verify<N: VtepFamily>(handle: &Handle, spec: &VtepSpec<N>) -> Result<()> {
    let link = link_by_name(handle, &spec.name).await?.with_context(|| format!("{} does not exist", spec.name))?;
    let mac = link_mac(&link);
    if mac.as_deref() != Some(&spec.mac.0[..]) {
        bail!("{} has MAC {:02x?}, not {}: something rewrote it (udev MACAddressPolicy?)", spec.name, mac, spec.mac);
    }
    if let Some(mtu) = link_mtu(&link).filter(|m| *m != spec.mtu) {
        bail!(
            "{} has MTU {mtu}, not {}: the kernel refused it (is the underlay's MTU too small?)",
            spec.name,
            spec.mtu
        );
    }
    Ok(())
}

/// `<subnet network>/32` or `/128` on the device, and none of the
/// addresses [`VtepFamily::stale`] says must go.
pub async fn ensure_address<N: VtepFamily>(handle: &Handle, index: u32, subnet: N, network: N) -> Result<()> {
    let want = subnet.network_addr();
    let mut have_it = false;
    let mut stale = Vec::new();
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    while let Some(msg) = addrs.try_next().await.context("cannot list the VTEP's addresses")? {
        let ip = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => N::of(*ip),
            _ => None,
        });
        match ip {
            Some(ip) if ip == want && msg.header.prefix_len == N::HOST_PREFIX => have_it = true,
            Some(ip) if N::stale(ip, msg.header.scope, network) => stale.push(msg),
            _ => {}
        }
    }
    for msg in stale {
        handle.address().del(msg).execute().await.context("cannot remove a stale address of the VTEP")?;
    }
    if !have_it {
        let (ip, len): (IpAddr, u8) = (want.into(), N::HOST_PREFIX);
        handle
            .address()
            .add(index, ip, len)
            .execute()
            .await
            .with_context(|| format!("cannot add {ip}/{len} to the VTEP"))?;
    }
    Ok(())
}
