//! The node's own VTEP settings, each decided in exactly one place,
//! whichever source is in use.
use ipnet::Ipv4Net;

use crate::{
    dataplane::{device::Underlay, vtep::VtepFamily},
    netconf::NetConf,
};

/// A VTEP's source address: the Node's `node-public-ip` (or
/// `node-public-ipv6`) when a view has one, else `--public-ip` (or
/// `--public-ipv6`), else the underlay's address of the family (for IPv6
/// its global one). flanneld's order: `main.go` overwrites `--public-ip`
/// with `GetStoredPublicIP`.
pub fn public_ip<N: VtepFamily>(
    flag: Option<N::Addr>,
    node_public_ip: Option<N::Addr>,
    underlay: &Underlay,
) -> Option<N::Addr> {
    node_public_ip.or(flag).or(N::underlay_source(underlay))
}

/// A VTEP's MTU: the path MTU (`Backend.MTU` when the network config has
/// one, etcd's config included, else the underlay's) less IPv4 VXLAN's
/// overhead, as flanneld's vxlan backend sets it at start, for both
/// families — but never above what the underlay carries once
/// encapsulated. Kernel VXLAN fragments an outer packet bigger than the
/// underlay; edgevx's encap cannot, so a `Backend.MTU` above the
/// underlay's is capped to it (`capped` says when). The kernel silently
/// clamps `flannel-v6.<VNI>`'s to the underlay's less IPv6's overhead
/// (70); edgevx asks for the clamped value, so what it reads back is what
/// it wanted. Follows the underlay's MTU while running.
pub fn vtep_mtu<N: VtepFamily>(conf: &NetConf, underlay_mtu: u32) -> u32 {
    let path = conf.mtu.map_or(underlay_mtu, |m| m.min(underlay_mtu));
    path.saturating_sub(Ipv4Net::ENCAP_OVERHEAD).min(underlay_mtu.saturating_sub(N::ENCAP_OVERHEAD))
}

/// `Backend.MTU` when `vtep_mtu` had to cap it to the underlay's MTU.
pub fn capped(conf: &NetConf, underlay_mtu: u32) -> Option<u32> {
    conf.mtu.filter(|m| *m > underlay_mtu)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use ipnet::Ipv6Net;

    use super::*;

    fn underlay(mtu: u32) -> Underlay {
        Underlay { index: 2, mtu, ipv4: Some(Ipv4Addr::new(198, 18, 0, 1)), ipv6: None, ipv6_tentative: false }
    }

    #[test]
    fn backend_mtu_wins_over_the_underlay_up_to_what_the_underlay_carries() {
        let mut conf = NetConf::default();
        assert_eq!(vtep_mtu::<Ipv4Net>(&conf, 1500), 1450);
        assert_eq!(vtep_mtu::<Ipv4Net>(&conf, 1400), 1350, "follows a lowered underlay");
        assert_eq!(capped(&conf, 1400), None);
        conf.mtu = Some(1400);
        assert_eq!(vtep_mtu::<Ipv4Net>(&conf, 1500), 1350);
        assert_eq!(capped(&conf, 1500), None);
        conf.mtu = Some(9000);
        assert_eq!(vtep_mtu::<Ipv4Net>(&conf, 1500), 1450, "no bigger than the underlay carries");
        assert_eq!(capped(&conf, 1500), Some(9000));
    }

    #[test]
    fn ipv6_vtep_mtu_is_flannels_after_the_kernels_clamp() {
        let conf = NetConf::default();
        assert_eq!(vtep_mtu::<Ipv6Net>(&conf, 1500), 1430);
        assert_eq!(vtep_mtu::<Ipv6Net>(&NetConf { mtu: Some(1400), ..conf.clone() }, 1500), 1350);
        assert_eq!(vtep_mtu::<Ipv6Net>(&NetConf { mtu: Some(9000), ..conf }, 1500), 1430);
    }

    #[test]
    fn public_ipv6_precedence_is_the_same() {
        let mut u = underlay(1500);
        u.ipv6 = Some("fd00:198:18::1".parse().unwrap());
        let (flag, node) = (Some("fd00::2".parse().unwrap()), Some("fd00::3".parse().unwrap()));
        assert_eq!(public_ip::<Ipv6Net>(flag, node, &u), node);
        assert_eq!(public_ip::<Ipv6Net>(flag, None, &u), flag);
        assert_eq!(public_ip::<Ipv6Net>(None, None, &u), u.ipv6);
    }

    #[test]
    fn public_ip_precedence() {
        let u = underlay(1500);
        let flag = Some(Ipv4Addr::new(198, 18, 0, 9));
        let node = Some(Ipv4Addr::new(198, 18, 0, 8));
        assert_eq!(public_ip::<Ipv4Net>(flag, node, &u), node, "node-public-ip beats the flag, as in flannel");
        assert_eq!(public_ip::<Ipv4Net>(flag, None, &u), flag);
        assert_eq!(public_ip::<Ipv4Net>(None, node, &u), node);
        assert_eq!(public_ip::<Ipv4Net>(None, None, &u), u.ipv4);
    }
}
