//! The checks every peer record gets, whichever source it came from: a
//! Kubernetes Node (`flannel_rules.rs`) or an etcd lease (`leases.rs`).
//! One function for both families, so neither the sources nor the
//! families drift apart.
use std::net::IpAddr;

use ipnet::IpNet;

use crate::{family::Family, peer::Half};

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

/// A peer's half of the family `N`, kept if [`check`] passes. flannel
/// skips a peer only when a part is missing or does not parse, and would
/// program a half that fails these checks; so only the half is dropped
/// (`Err` says why) and the peer's other half still carries traffic. In
/// dual-stack that is the IPv6 half: the IPv4 one is required.
pub fn checked_half<N: Family>(half: Half<N>, network: N, own: &[N::Addr]) -> Result<Half<N>, HalfLeftOut> {
    // the other family's half is the one kept
    let (left_out, kept) = if N::IPV6 { ("IPv6", "IPv4") } else { ("IPv4", "IPv6") };
    check(half.public_ip, half.subnet, network, own).map(|()| half).map_err(|problem| HalfLeftOut {
        left_out,
        kept,
        problem,
    })
}

/// Why a peer's half of one family is left out while its other half is
/// kept: in dual-stack, "IPv6 half not used, IPv4 half kept".
#[derive(Debug, thiserror::Error)]
#[error("{left_out} half not used, {kept} half kept: {problem}")]
pub struct HalfLeftOut {
    /// The family of the half left out: `IPv4` or `IPv6`.
    pub left_out: &'static str,
    /// The family of the half kept.
    pub kept: &'static str,
    pub problem: RecordProblem,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

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

    #[test]
    fn a_half_that_fails_the_checks_is_left_out_naming_both_families() {
        let net: Ipv6Net = "fd00:10:244::/56".parse().unwrap();
        let mac = "02:00:00:00:00:06".parse().unwrap();
        let half = Half {
            subnet: "fd00:10:244:2::/64".parse().unwrap(),
            public_ip: "fd00:198:18::2".parse().unwrap(),
            vtep_mac: mac,
        };
        assert_eq!(checked_half(half, net, &[]).ok(), Some(half));
        let e = checked_half(Half { public_ip: "::1".parse().unwrap(), ..half }, net, &[]).unwrap_err();
        assert!(e.to_string().starts_with("IPv6 half not used, IPv4 half kept: public IP ::1 is not a unicast"), "{e}");
    }
}
