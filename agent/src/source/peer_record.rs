//! The checks every peer record gets, whichever source it came from: a
//! Kubernetes Node (`flannel_rules.rs`) or an etcd lease (`leases.rs`).
//! One function, so the two sources never drift apart.
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Why a record cannot be a peer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordProblem {
    #[error("public IP {0} is not a unicast address a VTEP can have ({1})")]
    NotUnicast(Ipv4Addr, &'static str),
    #[error("public IP {0} is this node's own address")]
    Ours(Ipv4Addr),
    #[error("subnet {subnet} is outside the network {network}")]
    Outside { subnet: Ipv4Net, network: Ipv4Net },
}

/// What kind of address `ip` is, if no VTEP can have it.
fn not_unicast(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.octets()[0] == 0 {
        Some("0.0.0.0/8, \"this network\"")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if ip.is_broadcast() {
        Some("broadcast")
    } else {
        None
    }
}

/// A peer's public IP and subnet, as both sources must check them. `own`
/// lists this node's addresses as the source knows them: a record that
/// claims one would send our own traffic back to us.
pub fn check(public_ip: Ipv4Addr, subnet: Ipv4Net, network: Ipv4Net, own: &[Ipv4Addr]) -> Result<(), RecordProblem> {
    if let Some(kind) = not_unicast(public_ip) {
        return Err(RecordProblem::NotUnicast(public_ip, kind));
    }
    if own.contains(&public_ip) {
        return Err(RecordProblem::Ours(public_ip));
    }
    if !network.contains(&subnet) {
        return Err(RecordProblem::Outside { subnet, network });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_no_peer_can_be() {
        let net: Ipv4Net = "10.244.0.0/16".parse().unwrap();
        let sub: Ipv4Net = "10.244.2.0/24".parse().unwrap();
        let me: Ipv4Addr = "198.18.0.1".parse().unwrap();
        for bad in ["0.0.0.0", "0.1.2.3", "127.0.0.1", "127.9.9.9", "224.0.0.1", "239.1.1.1", "255.255.255.255"] {
            let ip: Ipv4Addr = bad.parse().unwrap();
            assert!(matches!(check(ip, sub, net, &[me]), Err(RecordProblem::NotUnicast(..))), "{bad}");
        }
        assert_eq!(check(me, sub, net, &[me]), Err(RecordProblem::Ours(me)));
        let outside: Ipv4Net = "10.99.0.0/24".parse().unwrap();
        assert!(matches!(
            check("198.18.0.2".parse().unwrap(), outside, net, &[me]),
            Err(RecordProblem::Outside { .. })
        ));
        assert_eq!(check("198.18.0.2".parse().unwrap(), sub, net, &[me]), Ok(()));
    }
}
