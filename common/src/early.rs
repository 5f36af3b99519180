//! The XDP judge's rules (ebpf/src/xdp_judge.rs), pure so they are tested
//! on the host. The XDP judge drops early, before any skb exists, only what
//! TC's decap (IPv4) and judge6 (IPv6) would drop too: TC stays the
//! authority and keeps every check. Each rule here is a prefix of TC's
//! judging, in TC's order, read through the same header views
//! (`headers.rs`), so the drop set is a subset by construction:
//!
//! - which datagrams are judged at all ([`judged_v4`], [`judged_v6`]): a
//!   subset of those TC judges. TC judges UDP to our port behind IPv4
//!   (any fragment but a later one) and behind IPv6 (behind extension
//!   headers too); XDP judges IPv4 and IPv6 with UDP right after the fixed
//!   header, no extension headers, and never a VLAN-tagged frame;
//! - the verdict ([`verdict`]): TC's first check is the peer
//!   (`drop_unknown_peer`), then the headers up to the inner IP header
//!   (shorter: dropped), then the VXLAN flags. XDP asks the same in the same
//!   order, but wants only the headers up to the inner Ethernet header, so
//!   what it calls short TC calls short too; a fragment is judged only by
//!   its sender, the rest left to TC (`drop_short_fragment`).
//!
//! What this leaves to TC: fragments' length, the outer checksum, the inner
//! frame, the inner source, TTL, and everything about the frame's way on.

use crate::{
    headers::{EthHeader, Ipv4Header, Ipv6Header, VxlanHeader},
    vxlan::{ETH_HLEN, IPPROTO_UDP, UDP_HLEN, VXLAN_HLEN},
};

/// What follows the outer IP header that the XDP judge reads: UDP, VXLAN
/// and the inner Ethernet header.
pub const TUNNEL_HEAD_LEN: usize = UDP_HLEN + VXLAN_HLEN + ETH_HLEN;

/// The XDP judge's verdict on UDP to our VXLAN port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Early {
    /// Left to TC, which judges it whole.
    Pass,
    /// The outer source is not an accepted peer.
    DropUnknownPeer,
    /// Not a fragment, and the frame ends before the inner Ethernet header.
    DropShort,
    /// VXLAN flags other than exactly the I flag, or a reserved bit set.
    DropBadFlags,
}

/// Whether the IPv4 datagram behind `eth` and `ip` is one the XDP judge
/// looks at (before its port is read), and if so whether it is a (first)
/// fragment. TC's decap judges all of these: an untagged IPv4 header, UDP,
/// not a later fragment (which carries no UDP header).
#[inline(always)]
pub fn judged_v4(eth: &EthHeader, ip: &Ipv4Header) -> Option<bool> {
    if !eth.is_ipv4() || !ip.is_valid_v4() || ip.protocol() != IPPROTO_UDP || ip.is_later_fragment() {
        return None;
    }
    Some(ip.is_first_fragment())
}

/// The same for IPv6: UDP right after the fixed header. Anything behind
/// extension headers (a fragment header among them) is left to TC, which
/// walks them, and to the socket-lookup guard for a stranger's.
#[inline(always)]
pub fn judged_v6(eth: &EthHeader, ip: &Ipv6Header) -> bool {
    eth.is_ipv6() && ip.is_valid_v6() && ip.next_header() == IPPROTO_UDP
}

/// The verdict on UDP to our port: `peer` says whether the outer source is
/// accepted, `fragment` whether the datagram is a first fragment, `head`
/// the UDP, VXLAN and inner Ethernet headers (`None`: the frame ends first).
#[inline(always)]
pub fn verdict(peer: bool, fragment: bool, head: Option<&[u8; TUNNEL_HEAD_LEN]>) -> Early {
    if !peer {
        return Early::DropUnknownPeer;
    }
    if fragment {
        return Early::Pass;
    }
    let Some(head) = head else {
        return Early::DropShort;
    };
    let vxlan = [head[8], head[9], head[10], head[11], head[12], head[13], head[14], head[15]];
    if !VxlanHeader(&vxlan).is_valid() {
        return Early::DropBadFlags;
    }
    Early::Pass
}

/// The destination port of the UDP header whose first 4 bytes are `ports`.
#[inline(always)]
pub fn dport(ports: &[u8; 4]) -> u16 {
    u16::from_be_bytes([ports[2], ports[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: [u8; 14] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
    const V6: [u8; 14] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x86, 0xdd];
    const TAGGED: [u8; 14] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0x00];

    fn ip4(frag: u16, proto: u8) -> [u8; 20] {
        let f = frag.to_be_bytes();
        [0x45, 0, 0, 60, 0, 0, f[0], f[1], 64, proto, 0, 0, 198, 18, 0, 2, 198, 18, 0, 1]
    }

    fn head(flags: u8, reserved: u8) -> [u8; TUNNEL_HEAD_LEN] {
        let mut h = [0u8; TUNNEL_HEAD_LEN];
        h[8] = flags;
        h[15] = reserved;
        h
    }

    #[test]
    fn ipv4_udp_is_judged_and_fragments_told() {
        assert_eq!(judged_v4(&EthHeader(&V4), &Ipv4Header(&ip4(0x4000, 17))), Some(false));
        assert_eq!(judged_v4(&EthHeader(&V4), &Ipv4Header(&ip4(0x2000, 17))), Some(true));
        // a later fragment has no UDP header; TCP is not ours; a tag hides the header
        assert_eq!(judged_v4(&EthHeader(&V4), &Ipv4Header(&ip4(0x2001, 17))), None);
        assert_eq!(judged_v4(&EthHeader(&V4), &Ipv4Header(&ip4(0, 6))), None);
        assert_eq!(judged_v4(&EthHeader(&TAGGED), &Ipv4Header(&ip4(0, 17))), None);
        assert_eq!(judged_v4(&EthHeader(&V6), &Ipv4Header(&ip4(0, 17))), None);
    }

    #[test]
    fn ipv6_judged_only_with_udp_right_behind() {
        let mut ip = [0u8; 40];
        ip[0] = 0x60;
        ip[6] = 17;
        assert!(judged_v6(&EthHeader(&V6), &Ipv6Header(&ip)));
        assert!(!judged_v6(&EthHeader(&V4), &Ipv6Header(&ip)));
        for ext in [0, 43, 44, 60] {
            ip[6] = ext;
            assert!(!judged_v6(&EthHeader(&V6), &Ipv6Header(&ip)), "{ext}");
        }
    }

    #[test]
    fn verdicts_in_tcs_order() {
        let good = head(0x08, 0);
        let bad = head(0x0c, 0);
        assert_eq!(verdict(true, false, Some(&good)), Early::Pass);
        assert_eq!(verdict(false, false, Some(&good)), Early::DropUnknownPeer);
        // the sender first, as TC: a stranger's short or bad frame is a stranger's
        assert_eq!(verdict(false, false, None), Early::DropUnknownPeer);
        assert_eq!(verdict(false, true, Some(&bad)), Early::DropUnknownPeer);
        assert_eq!(verdict(true, false, None), Early::DropShort);
        assert_eq!(verdict(true, false, Some(&bad)), Early::DropBadFlags);
        assert_eq!(verdict(true, false, Some(&head(0x08, 1))), Early::DropBadFlags);
        // a peer's first fragment: TC judges its length and the rest
        assert_eq!(verdict(true, true, None), Early::Pass);
        assert_eq!(verdict(true, true, Some(&bad)), Early::Pass);
    }

    #[test]
    fn the_port_is_the_second_word() {
        assert_eq!(dport(&[0x9c, 0x40, 0x21, 0x18]), 8472);
    }
}
