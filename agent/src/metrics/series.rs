//! How the programs' counters become metric families: each global counter
//! in `common/src/counters.rs` gets one series (a family and its labels),
//! and the per-peer counters get `peer_node`/`peer_ip` labels for at most
//! [`MAX_PEER_SERIES`] peers.
use edgevx_common::{counters::Counter, maps::PeerStats};

pub const EGRESS: &str = "egress";
pub const INGRESS: &str = "ingress";
/// For the counters two programs share (`drop_adjust_room`: encap and
/// decap; `drop_vxlan_tagged`: decap and the pod guard): telling the
/// directions apart would take a second BPF counter each.
pub const BOTH: &str = "both";

/// The metric series one global counter is reported as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Series {
    /// `edgevx_packets_total{direction,path}`
    Packets { direction: &'static str, path: &'static str },
    /// `edgevx_bytes_total{direction,path}`
    Bytes { direction: &'static str, path: &'static str },
    /// `edgevx_drops_total{reason,direction}`
    Drops { reason: &'static str, direction: &'static str },
    /// `edgevx_bridge_redirects_total`
    BridgeRedirects,
    /// `edgevx_vxlan_not_ours_total`
    NotOurs,
    /// `edgevx_fast_path_stack_total{reason}`: packets the fast path left
    /// to the host stack, by why.
    FastPathStack { reason: &'static str },
}

/// Where a global counter goes. Exhaustive on purpose: a new counter does
/// not compile until it is given a series.
pub const fn series(c: Counter) -> Series {
    use Series::*;
    match c {
        // encapsulated on flannel.<VNI>'s egress and sent to a peer
        Counter::TxPackets => Packets { direction: EGRESS, path: "encap" },
        Counter::TxBytes => Bytes { direction: EGRESS, path: "encap" },
        // decapsulated and redirected into the pod (--bypass-netfilter)
        Counter::RxFastPackets => Packets { direction: INGRESS, path: "bypass" },
        Counter::RxFastBytes => Bytes { direction: INGRESS, path: "bypass" },
        // accepted and left to the kernel's VXLAN receive
        Counter::RxHostPackets => Packets { direction: INGRESS, path: "kernel" },
        Counter::RxHostBytes => Bytes { direction: INGRESS, path: "kernel" },
        // decapsulated in TC and handed to the host stack (the default)
        Counter::RxStackPackets => Packets { direction: INGRESS, path: "stack" },
        Counter::RxStackBytes => Bytes { direction: INGRESS, path: "stack" },
        Counter::DropUnknownPeer => Drops { reason: "unknown_peer", direction: INGRESS },
        Counter::DropSpoofedSource => Drops { reason: "spoofed_source", direction: INGRESS },
        Counter::DropInnerTtl => Drops { reason: "inner_ttl", direction: INGRESS },
        Counter::DropBadChecksum => Drops { reason: "bad_checksum", direction: INGRESS },
        Counter::DropBadVxlanFlags => Drops { reason: "bad_vxlan_flags", direction: INGRESS },
        Counter::DropShortFragment => Drops { reason: "short_fragment", direction: INGRESS },
        Counter::DropInnerNotIpv4 => Drops { reason: "inner_not_ipv4", direction: INGRESS },
        Counter::DropInnerNotIpv6 => Drops { reason: "inner_not_ipv6", direction: INGRESS },
        Counter::DropLongExtChain => Drops { reason: "long_ext_chain", direction: INGRESS },
        // one counter for decap on the underlay and the pod guard on cni0
        Counter::DropVxlanTagged => Drops { reason: "vxlan_tagged", direction: BOTH },
        Counter::DropFragNeeded => Drops { reason: "frag_needed", direction: EGRESS },
        Counter::DropTooBig => Drops { reason: "too_big", direction: EGRESS },
        Counter::DropUnknownPeerSocket => Drops { reason: "unknown_peer_socket", direction: INGRESS },
        Counter::DropVxlanOffUnderlay => Drops { reason: "vxlan_off_underlay", direction: INGRESS },
        Counter::DropPodVxlan => Drops { reason: "pod_vxlan", direction: EGRESS },
        Counter::DropNoRoute => Drops { reason: "no_route", direction: EGRESS },
        Counter::DropNotIpv4 => Drops { reason: "not_ipv4", direction: EGRESS },
        Counter::DropNoConfig => Drops { reason: "no_config", direction: EGRESS },
        Counter::DropAdjustRoom => Drops { reason: "adjust_room", direction: BOTH },
        Counter::BridgeToPort => BridgeRedirects,
        Counter::PassNotOurs => NotOurs,
        // the conntrack-verified fast path on flannel.<VNI>'s ingress
        Counter::FastPathPackets => Packets { direction: INGRESS, path: "fast_path" },
        Counter::FastPathBytes => Bytes { direction: INGRESS, path: "fast_path" },
        // and its send side on the pod bridge's ingress (also in encap's egress count)
        Counter::FastPathSentPackets => Packets { direction: EGRESS, path: "fast_path" },
        Counter::FastPathSentBytes => Bytes { direction: EGRESS, path: "fast_path" },
        Counter::FastPathStackTcpFlags => FastPathStack { reason: "tcp_flags" },
        Counter::FastPathStackNoEntry => FastPathStack { reason: "no_conntrack_entry" },
        Counter::FastPathStackNotEstablished => FastPathStack { reason: "not_established" },
        Counter::FastPathStackNotPlain => FastPathStack { reason: "nat_helper_or_mark" },
        Counter::FastPathStackNotLiberal => FastPathStack { reason: "not_liberal" },
        Counter::FastPathStackNewRuleset => FastPathStack { reason: "new_ruleset" },
        Counter::FastPathStackOther => FastPathStack { reason: "other" },
        Counter::FastPathStackNoKeeper => FastPathStack { reason: "no_keeper" },
        // the XDP judge on the underlay, before any skb
        Counter::XdpDropUnknownPeer => Drops { reason: "xdp_unknown_peer", direction: INGRESS },
        Counter::XdpDropBadVxlanFlags => Drops { reason: "xdp_bad_vxlan_flags", direction: INGRESS },
        Counter::XdpDropShort => Drops { reason: "xdp_short", direction: INGRESS },
    }
}

/// Peers that get series of their own; the rest are summed under
/// `peer_node="_other", peer_ip="_other"`. Edge pools are small, and this
/// keeps a 16k-peer cluster at a few hundred per-peer series per node.
pub const MAX_PEER_SERIES: usize = 128;
/// The label values of the aggregate.
pub const OTHER: &str = "_other";

/// One peer's counters, summed over CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSample {
    pub node: String,
    pub ip: String,
    pub stats: PeerStats,
}

fn add(a: &mut PeerStats, b: &PeerStats) {
    a.tx_packets += b.tx_packets;
    a.tx_bytes += b.tx_bytes;
    a.rx_packets += b.rx_packets;
    a.rx_bytes += b.rx_bytes;
    a.tx_errors += b.tx_errors;
}

/// The first [`MAX_PEER_SERIES`] peers by node name, then one `_other`
/// sample for the rest (if any).
pub fn cap_peers(mut peers: Vec<PeerSample>) -> Vec<PeerSample> {
    peers.sort_by(|a, b| a.node.cmp(&b.node));
    if peers.len() <= MAX_PEER_SERIES {
        return peers;
    }
    let rest = peers.split_off(MAX_PEER_SERIES);
    let mut other = PeerSample { node: OTHER.into(), ip: OTHER.into(), stats: PeerStats::default() };
    for p in &rest {
        add(&mut other.stats, &p.stats);
    }
    peers.push(other);
    peers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_its_own_series() {
        let all: Vec<Series> = Counter::ALL.iter().map(|c| series(*c)).collect();
        for (i, s) in all.iter().enumerate() {
            assert!(!all[i + 1..].contains(s), "{s:?} is used twice");
        }
        // packets and bytes come in pairs
        for s in &all {
            if let Series::Packets { direction, path } = *s {
                assert!(all.contains(&Series::Bytes { direction, path }), "{s:?} has no bytes");
            }
        }
    }

    fn sample(node: &str, n: u64) -> PeerSample {
        PeerSample {
            node: node.into(),
            ip: format!("198.18.{}.{}", n / 250, n % 250 + 1),
            stats: PeerStats { tx_packets: n, tx_bytes: 10 * n, rx_packets: 1, rx_bytes: 2, tx_errors: 0 },
        }
    }

    #[test]
    fn few_peers_are_all_labelled() {
        let got = cap_peers(vec![sample("node3", 3), sample("node2", 2)]);
        assert_eq!(got.iter().map(|p| p.node.as_str()).collect::<Vec<_>>(), ["node2", "node3"]);
    }

    #[test]
    fn peers_past_the_cap_are_summed_under_other() {
        let n = MAX_PEER_SERIES as u64 + 10;
        let peers: Vec<PeerSample> = (0..n).rev().map(|i| sample(&format!("node{i:04}"), i)).collect();
        let got = cap_peers(peers);
        assert_eq!(got.len(), MAX_PEER_SERIES + 1);
        assert_eq!(got[0].node, "node0000");
        assert_eq!(got[MAX_PEER_SERIES - 1].node, format!("node{:04}", MAX_PEER_SERIES - 1));
        let other = &got[MAX_PEER_SERIES];
        assert_eq!((other.node.as_str(), other.ip.as_str()), (OTHER, OTHER));
        let rest: u64 = (MAX_PEER_SERIES as u64..n).sum();
        assert_eq!(other.stats.tx_packets, rest);
        assert_eq!(other.stats.tx_bytes, 10 * rest);
        assert_eq!(other.stats.rx_packets, 10);
        // nothing is lost by the cap
        let total: u64 = got.iter().map(|p| p.stats.tx_packets).sum();
        assert_eq!(total, (0..n).sum::<u64>());
    }
}
