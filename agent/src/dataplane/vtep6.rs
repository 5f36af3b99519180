//! `flannel-v6.<VNI>`, the IPv6 VTEP of a dual-stack node, set up exactly
//! as flannel's vxlan backend sets it up: a kernel VXLAN device on the
//! underlay with our public IPv6 as source (`IFLA_VXLAN_LOCAL6`), real UDP
//! checksums both ways (`noudp6zerocsumtx noudp6zerocsumrx`: a flannel
//! peer drops a zero checksum), no learning, `<v6 subnet base>/128`, and
//! no router advertisements. The kernel encapsulates and decapsulates
//! IPv6 pod traffic from the neighbour, fdb and route entries
//! [`super::peers6`] keeps per peer: BPF cannot give an IPv6 GSO packet
//! its outer UDP checksum (docs: "IPv6 dual-stack"), so the programs only
//! judge what arrives (the socket guard and the underlay's IPv6 judge).
use std::net::{IpAddr, Ipv6Addr};

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use ipnet::Ipv6Net;
use rtnetlink::{
    Handle, LinkUnspec, LinkVxlan,
    packet_route::{
        address::{AddressAttribute, AddressScope},
        link::{InfoVxlan, LinkMessage},
    },
};

use super::device::{is_vxlan, link_by_name, link_mac, link_mtu, vxlan_info};
use crate::mac::VtepMac;

/// What `flannel-v6.<VNI>` must look like.
#[derive(Clone, Debug)]
pub struct Vtep6Spec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: Ipv6Addr,
    pub underlay_index: u32,
    pub mac: VtepMac,
    pub mtu: u32,
}

pub fn vtep6_name(vni: u32) -> String {
    format!("flannel-v6.{vni}")
}

/// flannel's compatibility check (`vxlanLinksIncompat`) with the IPv6
/// source: VNI, lower device, source, port. MAC and MTU are fixed in place.
fn compatible(link: &LinkMessage, spec: &Vtep6Spec) -> bool {
    let Some(info) = vxlan_info(link).filter(|_| is_vxlan(link)) else {
        return false;
    };
    let has = |want: &InfoVxlan| info.iter().any(|i| i == want);
    has(&InfoVxlan::Id(spec.vni))
        && has(&InfoVxlan::Link(spec.underlay_index))
        && has(&InfoVxlan::Local6(spec.local))
        && has(&InfoVxlan::Port(spec.port))
        && !info.iter().any(|i| {
            matches!(
                i,
                InfoVxlan::CollectMetadata(true) | InfoVxlan::UDPZeroCsumRX(true) | InfoVxlan::UDPZeroCsumTX(true)
            )
        })
}

/// Creates or adopts the IPv6 VTEP; returns its ifindex.
/// `ip link add flannel-v6.1 type vxlan id 1 dev eth0 local A6 dstport 8472
/// nolearning noudp6zerocsumtx noudp6zerocsumrx`, then `address MAC mtu M up`
/// and `accept_ra 0`. A device flanneld left behind keeps its neighbour,
/// fdb and route entries: they are flannel's form, which edgevx keeps too.
pub async fn ensure_vtep6(handle: &Handle, spec: &Vtep6Spec) -> Result<u32> {
    let index = match link_by_name(handle, &spec.name).await? {
        Some(link) if compatible(&link, spec) => {
            let mut msg = LinkUnspec::new_with_index(link.header.index);
            if link_mac(&link).as_deref() != Some(&spec.mac.0[..]) {
                msg = msg.address(spec.mac.0.to_vec());
            }
            if link_mtu(&link) != Some(spec.mtu) {
                msg = msg.mtu(spec.mtu);
            }
            handle
                .link()
                .set(msg.up().build())
                .execute()
                .await
                .with_context(|| format!("cannot configure {}", spec.name))?;
            link.header.index
        }
        existing => {
            if let Some(link) = existing {
                tracing::warn!(device = %spec.name, "existing device does not match the configuration; recreating it");
                handle
                    .link()
                    .del(link.header.index)
                    .execute()
                    .await
                    .with_context(|| format!("cannot delete {}", spec.name))?;
            }
            let msg = LinkVxlan::new(&spec.name, spec.vni)
                .dev(spec.underlay_index)
                .local6(spec.local)
                .port(spec.port)
                .learning(false)
                .udp_zero_csum6_tx(false)
                .udp_zero_csum6_rx(false)
                .address(spec.mac.0.to_vec())
                .mtu(spec.mtu)
                .up()
                .build();
            handle.link().add(msg).execute().await.with_context(|| format!("cannot create {}", spec.name))?;
            link_by_name(handle, &spec.name)
                .await?
                .with_context(|| format!("{} vanished after creation", spec.name))?
                .header
                .index
        }
    };
    no_router_advertisements(&spec.name)?;
    verify(handle, spec).await?;
    Ok(index)
}

/// `sysctl net.ipv6.conf.<dev>.accept_ra=0`, as flannel sets it.
pub(super) fn no_router_advertisements(device: &str) -> Result<()> {
    let path = format!("/proc/sys/net/ipv6/conf/{device}/accept_ra");
    if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "0") {
        return Ok(());
    }
    std::fs::write(&path, "0").with_context(|| format!("cannot write 0 to {path}"))
}

/// The MAC (udev may rewrite a new device's, flannel#1795) and the MTU the
/// kernel settled on (it clamps silently to the underlay's less 70).
async fn verify(handle: &Handle, spec: &Vtep6Spec) -> Result<()> {
    let link = link_by_name(handle, &spec.name).await?.with_context(|| format!("{} does not exist", spec.name))?;
    let mac = link_mac(&link);
    if mac.as_deref() != Some(&spec.mac.0[..]) {
        bail!("{} has MAC {:02x?}, not {}: something rewrote it (udev MACAddressPolicy?)", spec.name, mac, spec.mac);
    }
    if let Some(mtu) = link_mtu(&link).filter(|m| *m != spec.mtu) {
        bail!(
            "{} has MTU {mtu}, not {}: the kernel refused it (is the underlay's MTU below {}?)",
            spec.name,
            spec.mtu,
            spec.mtu + 70
        );
    }
    Ok(())
}

/// `<subnet base>/128` on the device and no other global address, as
/// flannel's `EnsureV6AddressOnLink` leaves it (link-local ones stay).
pub async fn ensure_address6(handle: &Handle, index: u32, subnet: Ipv6Net) -> Result<()> {
    let want = subnet.network();
    let mut have_it = false;
    let mut stale = Vec::new();
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    while let Some(msg) = addrs.try_next().await.context("cannot list the IPv6 VTEP's addresses")? {
        let ip = msg
            .attributes
            .iter()
            .find_map(|a| if let AddressAttribute::Address(IpAddr::V6(ip)) = a { Some(*ip) } else { None });
        match ip {
            Some(ip) if ip == want && msg.header.prefix_len == 128 => have_it = true,
            Some(_) if msg.header.scope != AddressScope::Link => stale.push(msg),
            _ => {}
        }
    }
    for msg in stale {
        handle.address().del(msg).execute().await.context("cannot remove a stale address of the IPv6 VTEP")?;
    }
    if !have_it {
        handle
            .address()
            .add(index, IpAddr::V6(want), 128)
            .execute()
            .await
            .with_context(|| format!("cannot add {want}/128 to the IPv6 VTEP"))?;
    }
    Ok(())
}
