//! The node's own VTEP settings, each decided in exactly one place,
//! whichever source is in use.
use std::net::{Ipv4Addr, Ipv6Addr};

use edgevx_common::vxlan::ENCAP_OVERHEAD;

use crate::{dataplane::device::Underlay, netconf::NetConf};

/// The VTEP's source address: the Node's `node-public-ip` (when a view has
/// one), else `--public-ip`, else the underlay's address. flanneld's order:
/// `main.go` overwrites `--public-ip` with `GetStoredPublicIP`.
pub fn public_ip(flag: Option<Ipv4Addr>, node_public_ip: Option<Ipv4Addr>, underlay: &Underlay) -> Option<Ipv4Addr> {
    node_public_ip.or(flag).or(underlay.ipv4)
}

/// The IPv6 VTEP's source address, in the same order: `node-public-ipv6`,
/// else `--public-ipv6`, else the underlay's global IPv6 address.
pub fn public_ipv6(
    flag: Option<Ipv6Addr>,
    node_public_ipv6: Option<Ipv6Addr>,
    underlay: &Underlay,
) -> Option<Ipv6Addr> {
    node_public_ipv6.or(flag).or(underlay.ipv6)
}

/// IPv6 VXLAN's overhead: outer IPv6 40, UDP 8, VXLAN 8, inner Ethernet 14
/// (the kernel's `vxlan_headroom` for `VXLAN_F_IPV6`).
pub const ENCAP_OVERHEAD6: u32 = 70;

/// `flannel-v6.<VNI>`'s MTU: flannel asks for the IPv4 VTEP's MTU and the
/// kernel silently clamps it to the underlay's less 70; edgevx asks for
/// the clamped value, so what it reads back is what it wanted.
pub fn vtep6_mtu(conf: &NetConf, underlay_mtu: u32) -> u32 {
    vtep_mtu(conf, underlay_mtu).min(underlay_mtu.saturating_sub(ENCAP_OVERHEAD6))
}

/// The VTEP MTU: the path MTU (`Backend.MTU` when the network config has
/// one, etcd's config included, else the underlay's) less the VXLAN
/// overhead, as flanneld's vxlan backend sets it at start — but never
/// above what the underlay carries once encapsulated. Kernel VXLAN
/// fragments an outer packet bigger than the underlay; edgevx's encap
/// cannot, so a `Backend.MTU` above the underlay's is capped to it
/// (`capped` says when). Follows the underlay's MTU while running.
pub fn vtep_mtu(conf: &NetConf, underlay_mtu: u32) -> u32 {
    conf.mtu.map_or(underlay_mtu, |m| m.min(underlay_mtu)).saturating_sub(ENCAP_OVERHEAD as u32)
}

/// `Backend.MTU` when `vtep_mtu` had to cap it to the underlay's MTU.
pub fn capped(conf: &NetConf, underlay_mtu: u32) -> Option<u32> {
    conf.mtu.filter(|m| *m > underlay_mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn underlay(mtu: u32) -> Underlay {
        Underlay { index: 2, mtu, ipv4: Some(Ipv4Addr::new(198, 18, 0, 1)), ipv6: None, ipv6_tentative: false }
    }

    #[test]
    fn backend_mtu_wins_over_the_underlay_up_to_what_the_underlay_carries() {
        let mut conf = NetConf::default();
        assert_eq!(vtep_mtu(&conf, 1500), 1450);
        assert_eq!(vtep_mtu(&conf, 1400), 1350, "follows a lowered underlay");
        assert_eq!(capped(&conf, 1400), None);
        conf.mtu = Some(1400);
        assert_eq!(vtep_mtu(&conf, 1500), 1350);
        assert_eq!(capped(&conf, 1500), None);
        conf.mtu = Some(9000);
        assert_eq!(vtep_mtu(&conf, 1500), 1450, "no bigger than the underlay carries");
        assert_eq!(capped(&conf, 1500), Some(9000));
    }

    #[test]
    fn ipv6_vtep_mtu_is_flannels_after_the_kernels_clamp() {
        let conf = NetConf::default();
        assert_eq!(vtep6_mtu(&conf, 1500), 1430);
        assert_eq!(vtep6_mtu(&NetConf { mtu: Some(1400), ..conf.clone() }, 1500), 1350);
        assert_eq!(vtep6_mtu(&NetConf { mtu: Some(9000), ..conf }, 1500), 1430);
    }

    #[test]
    fn public_ipv6_precedence() {
        let mut u = underlay(1500);
        u.ipv6 = Some("fd00:198:18::1".parse().unwrap());
        let (flag, node) = (Some("fd00::2".parse().unwrap()), Some("fd00::3".parse().unwrap()));
        assert_eq!(public_ipv6(flag, node, &u), node);
        assert_eq!(public_ipv6(flag, None, &u), flag);
        assert_eq!(public_ipv6(None, None, &u), u.ipv6);
    }

    #[test]
    fn public_ip_precedence() {
        let u = underlay(1500);
        let flag = Some(Ipv4Addr::new(198, 18, 0, 9));
        let node = Some(Ipv4Addr::new(198, 18, 0, 8));
        assert_eq!(public_ip(flag, node, &u), node, "node-public-ip beats the flag, as in flannel");
        assert_eq!(public_ip(flag, None, &u), flag);
        assert_eq!(public_ip(None, node, &u), node);
        assert_eq!(public_ip(None, None, &u), u.ipv4);
    }
}
