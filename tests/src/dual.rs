//! The IPv6 half of the test network, for dual-stack (`EnableIPv6`):
//! underlay `fd00:198:18::<i>/64` on each node's `eth0`, pods on
//! `fd00:10:244:<i>::/64` (bridge `::1`, pod `::2`), the Network
//! `fd00:10:244::/56`, and flanneld's `flannel-v6.1` with its per-peer
//! entries for a kernel flannel node. Addresses are added `nodad`: a
//! tentative address cannot be a VXLAN source.
use std::net::Ipv6Addr;

use anyhow::Result;
use serde_json::{Value, json};

use crate::{
    nodes::flannel_node,
    topo::{Host, POD_MTU, subnet},
};

pub const NETWORK6: &str = "fd00:10:244::/56";

pub fn underlay_ip6(i: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, i.into())
}
pub fn pod_ip6(i: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, i.into(), 0, 0, 0, 2)
}
pub fn subnet6(i: u8) -> String {
    format!("fd00:10:244:{i:x}::/64")
}
/// The subnet's first address: flannel's gateway and VTEP address.
pub fn base6(i: u8) -> String {
    format!("fd00:10:244:{i:x}::")
}

/// A dual-stack net-conf (VNI 1, port 8472).
pub fn net_conf() -> String {
    format!(
        r#"{{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"{NETWORK6}","Backend":{{"Type":"vxlan"}}}}"#
    )
}

/// [`net_conf`] with `Backend.DirectRouting` set to `direct_routing`.
pub fn net_conf_direct_routing(direct_routing: bool) -> String {
    format!(
        r#"{{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"{NETWORK6}","Backend":{{"Type":"vxlan","DirectRouting":{direct_routing}}}}}"#
    )
}

/// Gives node `h` its IPv6 underlay address and its pod an IPv6 address
/// behind `cni0`, with IPv6 forwarding on.
pub fn add_ipv6(h: &Host) -> Result<()> {
    let i = h.i;
    h.ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
    h.ns.ip(&["-6", "addr", "add", &format!("{}/64", underlay_ip6(i)), "dev", "eth0", "nodad"])?;
    h.ns.ip(&["-6", "addr", "add", &format!("fd00:10:244:{i:x}::1/64"), "dev", "cni0", "nodad"])?;
    h.pod.ip(&["-6", "addr", "add", &format!("{}/64", pod_ip6(i)), "dev", "eth0", "nodad"])?;
    h.pod.ip(&["-6", "route", "add", "default", "via", &format!("fd00:10:244:{i:x}::1")])?;
    Ok(())
}

/// flanneld's `flannel-v6.1` on node `h`: kernel VXLAN with the IPv6
/// source, nolearning, real UDP checksums (the default), the MTU flannel
/// asks for (the kernel clamps it to the underlay's less 70), `<base>/128`.
pub fn kernel_vtep6(h: &Host, mac: &str) -> Result<()> {
    let local = underlay_ip6(h.i).to_string();
    h.ns.ip(&[
        "link",
        "add",
        "flannel-v6.1",
        "address",
        mac,
        "mtu",
        POD_MTU,
        "type",
        "vxlan",
        "id",
        "1",
        "dev",
        "eth0",
        "local",
        &local,
        "dstport",
        "8472",
        "nolearning",
    ])?;
    h.ns.sysctl("net.ipv6.conf.flannel-v6/1.accept_ra", "0")?;
    h.ns.ip(&["-6", "addr", "add", &format!("{}/128", base6(h.i)), "dev", "flannel-v6.1"])?;
    h.ns.ip(&["link", "set", "flannel-v6.1", "up"])?;
    Ok(())
}

/// What flanneld installs on `flannel-v6.1` for peer `peer`: neighbour,
/// fdb entry, route.
pub fn kernel_add_peer6(h: &Host, peer: u8, mac: &str) -> Result<()> {
    let gw = base6(peer);
    h.ns.ip(&["-6", "neigh", "replace", &gw, "lladdr", mac, "dev", "flannel-v6.1", "nud", "permanent"])?;
    let dst = underlay_ip6(peer).to_string();
    h.ns.run(&["bridge", "fdb", "replace", mac, "dev", "flannel-v6.1", "dst", &dst, "self", "permanent"])?;
    h.ns.ip(&["-6", "route", "replace", &subnet6(peer), "via", &gw, "dev", "flannel-v6.1", "onlink"])?;
    Ok(())
}

/// A dual-stack node as flanneld publishes it: both pod CIDRs, and with
/// `macs` both VTEPs (`backend-data`, `backend-v6-data`, `public-ipv6`).
pub fn flannel_node6(i: u8, macs: Option<(&str, &str)>) -> Value {
    const P: &str = "flannel.alpha.coreos.com";
    let mut n = flannel_node(i, macs.map(|(m4, _)| m4));
    n["spec"]["podCIDRs"] = json!([subnet(i), subnet6(i)]);
    let ann = &mut n["metadata"]["annotations"];
    ann[format!("{P}/public-ipv6")] = json!(underlay_ip6(i).to_string());
    if let Some((_, m6)) = macs {
        ann[format!("{P}/backend-v6-data")] = json!(format!("{{\"VNI\":1,\"VtepMAC\":\"{m6}\"}}"));
    }
    n
}
