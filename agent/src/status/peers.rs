//! One peer in `edgevx status`: each half it has, and whether the kernel
//! holds it (read from the maps and the main table, never from the agent's
//! records alone).
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use edgevx_common::maps::{Peer as PeerEntry, PeerStats};
use ipnet::{Ipv4Net, Ipv6Net};

use super::document::{Ipv6HalfStatus, PeerCounters, PeerStatus, Route};
use crate::{peer::Peer, reconcile::Accept};

/// What the kernel holds, read once for every peer.
#[derive(Default)]
pub(super) struct Seen {
    /// The IPv4 LPM map: pod subnet -> VTEP.
    pub programmed: Vec<(Ipv4Net, PeerEntry)>,
    /// The IPv4 accept map: public IP -> what it may send.
    pub accepted: BTreeMap<Ipv4Addr, Accept<Ipv4Net>>,
    /// The IPv6 accept map (the IPv6 entries themselves are the kernel's
    /// routes and neighbours on flannel-v6.<VNI>).
    pub accepted6: BTreeMap<Ipv6Addr, Accept<Ipv6Net>>,
    /// DirectRouting: the plain routes through the underlay.
    pub direct: BTreeMap<Ipv4Net, Ipv4Addr>,
    /// Each IPv4 peer's counters, summed over CPUs, by public IP (none
    /// yet: zero).
    pub stats: BTreeMap<Ipv4Addr, PeerStats>,
}

/// A peer's counters as the document says them.
fn counters(s: PeerStats) -> PeerCounters {
    PeerCounters {
        tx_packets: s.tx_packets,
        tx_bytes: s.tx_bytes,
        rx_packets: s.rx_packets,
        rx_bytes: s.rx_bytes,
        tx_errors: s.tx_errors,
    }
}

/// The IPv6 half of `p`, or `None`.
fn ipv6_half(p: &Peer, seen: &Seen) -> Option<Ipv6HalfStatus> {
    let h = p.v6.as_ref()?;
    Some(Ipv6HalfStatus {
        subnet: h.subnet,
        public_ip: h.public_ip,
        vtep_mac: h.vtep_mac,
        in_dataplane: seen.accepted6.contains_key(&h.public_ip),
    })
}

/// `p` as `status` prints it: the IPv4 half at the top level (the layout
/// of every earlier version), the IPv6 half under `v6` (null when it has
/// none). In an IPv6-only network the top level is the IPv6 half.
pub(super) fn status(p: &Peer, seen: &Seen) -> PeerStatus {
    let Some(p4) = p.v4 else {
        let v6 = p.v6.as_ref();
        return PeerStatus {
            node: p.node.clone(),
            subnet: v6.map(|h| h.subnet.into()),
            public_ip: v6.map(|h| h.public_ip.into()),
            vtep_mac: v6.map(|h| h.vtep_mac),
            in_dataplane: v6.is_some_and(|h| seen.accepted6.contains_key(&h.public_ip)),
            route: Route::Ipv6,
            counters: None,
            v6: None,
        };
    };
    PeerStatus {
        node: p.node.clone(),
        subnet: Some(p4.subnet.into()),
        public_ip: Some(p4.public_ip.into()),
        vtep_mac: Some(p4.vtep_mac),
        // read from the kernel: the LPM entry and the accepted address
        in_dataplane: seen
            .programmed
            .iter()
            .any(|(net, e)| *net == p4.subnet && e.vtep_mac == p4.vtep_mac.0 && e.public_ip == p4.public_ip.octets())
            && seen.accepted.contains_key(&p4.public_ip),
        // DirectRouting: a plain route through the underlay, read from the kernel
        route: if seen.direct.get(&p4.subnet) == Some(&p4.public_ip) { Route::Direct } else { Route::Vxlan },
        counters: Some(counters(seen.stats.get(&p4.public_ip).copied().unwrap_or_default())),
        // a dual-stack peer's other half
        v6: ipv6_half(p, seen),
    }
}
