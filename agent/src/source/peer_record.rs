//! The checks every peer record gets, whichever source it came from: a
//! Kubernetes Node (`flannel_rules.rs`) or an etcd lease (`leases.rs`).
//! One function for both families, so neither the sources nor the
//! families drift apart.
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use crate::family::Family;

/// Why a record cannot be a peer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordProblem {
    #[error("public IP {0} is not a unicast address a VTEP can have ({1})")]
    NotUnicast(IpAddr, &'static str),
    #[error("public IP {0} is this node's own address")]
    Ours(IpAddr),
    #[error("public IP {ip} is inside the pod network {network}: traffic to it would be sent into the tunnel")]
    InNetwork { ip: IpAddr, network: IpNet },
    #[error("subnet {subnet} is outside the network {network}")]
    Outside { subnet: IpNet, network: IpNet },
}

/// A peer's public IP and subnet, as both sources must check them. `own`
/// lists this node's addresses as the source knows them: a record that
/// claims one would send our own traffic back to us.
pub fn check<N: Family>(public_ip: N::Addr, subnet: N, network: N, own: &[N::Addr]) -> Result<(), RecordProblem> {
    if let Some(kind) = N::not_unicast(public_ip) {
        return Err(RecordProblem::NotUnicast(public_ip.into(), kind));
    }
    if own.contains(&public_ip) {
        return Err(RecordProblem::Ours(public_ip.into()));
    }
    if network.holds(&public_ip) {
        return Err(RecordProblem::InNetwork { ip: public_ip.into(), network: network.into() });
    }
    if !network.covers(&subnet) {
        return Err(RecordProblem::Outside { subnet: subnet.into(), network: network.into() });
    }
    Ok(())
}

/// A peer's IPv6 half, kept if [`check`] passes. flannel skips a peer
/// only when a part is missing or does not parse, and would program a half
/// that fails these checks; so only the half is dropped (`Err` says why)
/// and the peer's IPv4 half still carries traffic.
pub fn checked_half6(
    v6: crate::peer::Half<ipnet::Ipv6Net>,
    network: Ipv6Net,
    own: &[Ipv6Addr],
) -> Result<crate::peer::Half<ipnet::Ipv6Net>, HalfLeftOut> {
    check(v6.public_ip, v6.subnet, network, own).map(|()| v6).map_err(HalfLeftOut)
}

/// Why a peer's IPv6 half is left out while its IPv4 half is kept.
#[derive(Debug, thiserror::Error)]
#[error("IPv6 half not used, IPv4 half kept: {0}")]
pub struct HalfLeftOut(pub RecordProblem);

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    use ipnet::{Ipv4Net, Ipv6Net};

    #[test]
    fn refuses_what_no_peer_can_be() {
        let net: Ipv4Net = "10.244.0.0/16".parse().unwrap();
        let sub: Ipv4Net = "10.244.2.0/24".parse().unwrap();
        let me: Ipv4Addr = "198.18.0.1".parse().unwrap();
        let special = ["0.0.0.0", "0.1.2.3", "127.0.0.1", "127.9.9.9", "224.0.0.1", "239.1.1.1", "255.255.255.255"];
        for bad in special.into_iter().chain(["169.254.1.1", "169.254.0.9", "240.0.0.1"]) {
            let ip: Ipv4Addr = bad.parse().unwrap();
            assert!(matches!(check(ip, sub, net, &[me]), Err(RecordProblem::NotUnicast(..))), "{bad}");
        }
        assert_eq!(check(me, sub, net, &[me]), Err(RecordProblem::Ours(me.into())));
        // a pod's, our cni0's or our VTEP's address: all inside the Network
        for inside in ["10.244.1.1", "10.244.1.0", "10.244.2.7"] {
            let e = check(inside.parse().unwrap(), sub, net, &[me]).unwrap_err();
            assert!(matches!(e, RecordProblem::InNetwork { .. }), "{inside}: {e}");
        }
        let outside: Ipv4Net = "10.99.0.0/24".parse().unwrap();
        assert!(matches!(
            check("198.18.0.2".parse().unwrap(), outside, net, &[me]),
            Err(RecordProblem::Outside { .. })
        ));
        assert_eq!(check("198.18.0.2".parse().unwrap(), sub, net, &[me]), Ok(()));
    }

    #[test]
    fn refuses_what_no_ipv6_peer_can_be() {
        let net: Ipv6Net = "fd00:10:244::/56".parse().unwrap();
        let sub: Ipv6Net = "fd00:10:244:2::/64".parse().unwrap();
        let me: Ipv6Addr = "fd00:198:18::1".parse().unwrap();
        let cases = [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("ff02::1", "multicast"),
            ("fe80::1", "link-local"),
            ("febf:ffff::1", "link-local"),
            ("::ffff:198.18.0.1", "IPv4-mapped"),
            ("::198.18.0.1", "IPv4-compatible"),
        ];
        for (bad, kind) in cases {
            let e = check(bad.parse().unwrap(), sub, net, &[me]).unwrap_err();
            assert!(matches!(e, RecordProblem::NotUnicast(..)) && e.to_string().contains(kind), "{bad}: {e}");
        }
        assert_eq!(check(me, sub, net, &[me]), Err(RecordProblem::Ours(me.into())));
        let e = check("fd00:10:244:1::1".parse().unwrap(), sub, net, &[me]).unwrap_err();
        assert!(matches!(e, RecordProblem::InNetwork { .. }), "our cni0's IPv6 address: {e}");
        let e = check("fd00:198:18::2".parse().unwrap(), "fd00:99::/64".parse().unwrap(), net, &[me]).unwrap_err();
        assert_eq!(e.to_string(), "subnet fd00:99::/64 is outside the network fd00:10:244::/56");
        assert_eq!(check("fd00:198:18::2".parse().unwrap(), sub, net, &[me]), Ok(()));
        assert_eq!(check("fec0::2".parse().unwrap(), sub, net, &[me]), Ok(()), "fec0::/10 is not link-local");
    }
}
