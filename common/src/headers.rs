//! Read-only views of the headers decapsulation judges, so the program reads
//! field names instead of byte offsets, and the rules are tested on the host.
//!
//! Each view wraps a fixed-size array the program has loaded from the
//! packet; nothing here reads past it.

use crate::vxlan::{
    ETH_HLEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IPV4_HLEN, IPV6_HLEN, VLAN_HLEN, VXLAN_FLAG_VNI,
    VXLAN_HLEN, ipv4_checksum,
};

/// The fixed 20 bytes of an IPv4 header (options, if any, follow them).
#[derive(Clone, Copy, Debug)]
pub struct Ipv4Header<'a>(pub &'a [u8; IPV4_HLEN]);

/// Fragment offset bits of the flags/offset word.
const FRAG_OFFSET_MASK: u16 = 0x1fff;
/// More-fragments flag.
const FRAG_MF: u16 = 0x2000;
/// Don't-fragment flag.
const FRAG_DF: u16 = 0x4000;

impl Ipv4Header<'_> {
    #[inline(always)]
    pub fn version(&self) -> u8 {
        self.0[0] >> 4
    }

    /// IHL in bytes: 20 to 60 for a valid header.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        ((self.0[0] & 0x0f) as usize) * 4
    }

    /// A version-4 header with an IHL of at least 5 words.
    #[inline(always)]
    pub fn is_valid_v4(&self) -> bool {
        self.version() == 4 && self.header_len() >= IPV4_HLEN
    }

    #[inline(always)]
    pub fn total_len(&self) -> u16 {
        u16::from_be_bytes([self.0[2], self.0[3]])
    }

    #[inline(always)]
    fn frag_word(&self) -> u16 {
        u16::from_be_bytes([self.0[6], self.0[7]])
    }

    /// A fragment other than the first: it carries no transport header.
    #[inline(always)]
    pub fn is_later_fragment(&self) -> bool {
        self.frag_word() & FRAG_OFFSET_MASK != 0
    }

    /// The first fragment of a fragmented datagram.
    #[inline(always)]
    pub fn is_first_fragment(&self) -> bool {
        self.frag_word() & (FRAG_MF | FRAG_OFFSET_MASK) == FRAG_MF
    }

    #[inline(always)]
    pub fn dont_fragment(&self) -> bool {
        self.frag_word() & FRAG_DF != 0
    }

    #[inline(always)]
    pub fn ttl(&self) -> u8 {
        self.0[8]
    }

    #[inline(always)]
    pub fn protocol(&self) -> u8 {
        self.0[9]
    }

    #[inline(always)]
    pub fn src(&self) -> [u8; 4] {
        [self.0[12], self.0[13], self.0[14], self.0[15]]
    }

    #[inline(always)]
    pub fn dst(&self) -> [u8; 4] {
        [self.0[16], self.0[17], self.0[18], self.0[19]]
    }

    /// Whether the checksum is right, for a header without options (the
    /// only kind the fast path takes; the kernel checks the others).
    #[inline(always)]
    pub fn checksum_ok(&self) -> bool {
        // a correct header, checksum included, sums to 0xffff
        ipv4_checksum(self.0) == 0
    }
}

/// The fixed 40 bytes of an IPv6 header (extension headers, if any, follow).
#[derive(Clone, Copy, Debug)]
pub struct Ipv6Header<'a>(pub &'a [u8; IPV6_HLEN]);

impl Ipv6Header<'_> {
    #[inline(always)]
    pub fn is_valid_v6(&self) -> bool {
        self.0[0] >> 4 == 6
    }

    /// The protocol of what follows the fixed header: an upper layer
    /// (17 for UDP) or the first extension header.
    #[inline(always)]
    pub fn next_header(&self) -> u8 {
        self.0[6]
    }

    #[inline(always)]
    pub fn src(&self) -> [u8; 16] {
        addr16(self.0, 8)
    }

    #[inline(always)]
    pub fn dst(&self) -> [u8; 16] {
        addr16(self.0, 24)
    }
}

/// IPv6 extension headers a datagram may carry between the fixed header
/// and UDP (RFC 8200 4.1); the judge walks them to find the UDP header.
pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_ROUTING: u8 = 43;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// Whether `next_header` names an extension header [`ext_header`] can step over.
#[inline(always)]
pub fn is_ext_header(next_header: u8) -> bool {
    matches!(next_header, IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_FRAGMENT | IPPROTO_DSTOPTS)
}

/// One step along an IPv6 extension header chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtHeader {
    /// `next_header` follows, `len` bytes on; `first_fragment` if this was
    /// the fragment header of a first fragment (more to come).
    Skip { next_header: u8, len: usize, first_fragment: bool },
    /// A fragment other than the first: no upper-layer header in it.
    LaterFragment,
}

/// Reads the extension header of kind `kind` from its first 8 bytes (all
/// a fragment header has; the others give their length there).
#[inline(always)]
pub fn ext_header(kind: u8, h: &[u8; 8]) -> ExtHeader {
    if kind == IPPROTO_FRAGMENT {
        let word = u16::from_be_bytes([h[2], h[3]]);
        // offset in 8-byte units above the 2 reserved bits and the M flag
        if word & 0xfff8 != 0 {
            return ExtHeader::LaterFragment;
        }
        return ExtHeader::Skip { next_header: h[0], len: 8, first_fragment: word & 1 != 0 };
    }
    // hop-by-hop, routing, destination options: length in 8-byte units, less the first
    ExtHeader::Skip { next_header: h[0], len: (h[1] as usize + 1) * 8, first_fragment: false }
}

/// The 16 bytes at `at`, written out: a copy loop over a stack array needs
/// CAP_PERFMON in the verifier (variable-offset stack access).
#[inline(always)]
fn addr16(h: &[u8; IPV6_HLEN], at: usize) -> [u8; 16] {
    #[rustfmt::skip]
    let a = [
        h[at], h[at + 1], h[at + 2], h[at + 3], h[at + 4], h[at + 5], h[at + 6], h[at + 7],
        h[at + 8], h[at + 9], h[at + 10], h[at + 11], h[at + 12], h[at + 13], h[at + 14], h[at + 15],
    ];
    a
}

/// An 8-byte VXLAN header.
#[derive(Clone, Copy, Debug)]
pub struct VxlanHeader<'a>(pub &'a [u8; VXLAN_HLEN]);

impl VxlanHeader<'_> {
    /// Exactly what the kernel's `vxlan_rcv` accepts on a device without
    /// GBP, GPE or remote checksum offload (flannel's): the flags word is
    /// the I flag alone and the byte after the VNI is zero. Any other bit
    /// is "unparsed" there and the frame is dropped
    /// (`SKB_DROP_REASON_VXLAN_INVALID_HDR`).
    #[inline(always)]
    pub fn is_valid(&self) -> bool {
        let h = self.0;
        h[0] == VXLAN_FLAG_VNI && h[1] == 0 && h[2] == 0 && h[3] == 0 && h[7] == 0
    }

    #[inline(always)]
    pub fn vni(&self) -> u32 {
        u32::from_be_bytes([0, self.0[4], self.0[5], self.0[6]])
    }
}

/// Whether `ethertype` is a VLAN tag the kernel strips on receive, as its
/// `eth_type_vlan` tells them: 802.1Q or 802.1ad, whatever the VID.
#[inline(always)]
pub fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD
}

/// One VLAN tag as it lies in the packet after its TPID: the TCI (PCP,
/// DEI, VID), then the ethertype of what the tag carries.
#[derive(Clone, Copy, Debug)]
pub struct VlanTag<'a>(pub &'a [u8; VLAN_HLEN]);

impl VlanTag<'_> {
    /// The ethertype behind the tag: another tag's TPID, or a protocol.
    #[inline(always)]
    pub fn encapsulated(&self) -> u16 {
        u16::from_be_bytes([self.0[2], self.0[3]])
    }
}

/// An Ethernet header; its ethertype is a VLAN TPID if tags follow it.
#[derive(Clone, Copy, Debug)]
pub struct EthHeader<'a>(pub &'a [u8; ETH_HLEN]);

impl EthHeader<'_> {
    #[inline(always)]
    pub fn dst(&self) -> [u8; 6] {
        let h = self.0;
        [h[0], h[1], h[2], h[3], h[4], h[5]]
    }

    #[inline(always)]
    pub fn src(&self) -> [u8; 6] {
        let h = self.0;
        [h[6], h[7], h[8], h[9], h[10], h[11]]
    }

    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        u16::from_be_bytes([self.0[12], self.0[13]])
    }

    #[inline(always)]
    pub fn is_ipv4(&self) -> bool {
        self.ethertype() == ETH_P_IP
    }

    #[inline(always)]
    pub fn is_ipv6(&self) -> bool {
        self.ethertype() == ETH_P_IPV6
    }

    /// A VLAN tag follows in the packet bytes (see [`is_vlan`]).
    #[inline(always)]
    pub fn is_vlan(&self) -> bool {
        is_vlan(self.ethertype())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61,
        0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    #[test]
    fn ipv4_fields() {
        let h = Ipv4Header(&HDR);
        assert!(h.is_valid_v4());
        assert_eq!(h.header_len(), 20);
        assert_eq!(h.total_len(), 0x73);
        assert_eq!(h.ttl(), 64);
        assert_eq!(h.protocol(), 17);
        assert_eq!(h.src(), [192, 168, 0, 1]);
        assert_eq!(h.dst(), [192, 168, 0, 199]);
        assert!(h.dont_fragment());
        assert!(!h.is_first_fragment() && !h.is_later_fragment());
    }

    #[test]
    fn checksum_is_judged_over_the_header() {
        assert!(Ipv4Header(&HDR).checksum_ok());
        let mut bad = HDR;
        bad[11] ^= 1;
        assert!(!Ipv4Header(&bad).checksum_ok());
        let mut ttl = HDR;
        ttl[8] = 63;
        assert!(!Ipv4Header(&ttl).checksum_ok());
    }

    #[test]
    fn fragments_are_told_apart() {
        let with = |word: u16| {
            let mut h = HDR;
            h[6..8].copy_from_slice(&word.to_be_bytes());
            h
        };
        let first = with(0x2000);
        assert!(Ipv4Header(&first).is_first_fragment());
        assert!(!Ipv4Header(&first).is_later_fragment());
        let middle = with(0x2000 | 3);
        assert!(!Ipv4Header(&middle).is_first_fragment());
        assert!(Ipv4Header(&middle).is_later_fragment());
        let last = with(7);
        assert!(Ipv4Header(&last).is_later_fragment());
    }

    #[test]
    fn short_or_foreign_headers_are_not_v4() {
        let mut h = HDR;
        h[0] = 0x44;
        assert!(!Ipv4Header(&h).is_valid_v4());
        h[0] = 0x65;
        assert!(!Ipv4Header(&h).is_valid_v4());
    }

    #[test]
    fn vxlan_flags_as_the_kernel_judges_them() {
        assert!(VxlanHeader(&[0x08, 0, 0, 0, 0, 0, 1, 0]).is_valid());
        assert_eq!(VxlanHeader(&[0x08, 0, 0, 0, 0xab, 0xcd, 0xef, 0]).vni(), 0xabcdef);
        for bad in [
            [0x00, 0, 0, 0, 0, 0, 1, 0],    // no I flag
            [0x8c, 0, 0, 0, 0, 0, 1, 0],    // extra flags
            [0x08, 0, 0, 0, 0, 0, 1, 0x5a], // reserved byte after the VNI
            [0x08, 0x80, 0, 0, 0, 0, 1, 0], // GBP-style bits
            [0x08, 0, 0, 0x01, 0, 0, 1, 0], // reserved bits of the first word
        ] {
            assert!(!VxlanHeader(&bad).is_valid(), "{bad:x?}");
        }
    }

    #[test]
    fn ethernet_fields() {
        let e = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00];
        let h = EthHeader(&e);
        assert_eq!(h.dst(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(h.src(), [7, 8, 9, 10, 11, 12]);
        assert!(h.is_ipv4() && !h.is_ipv6());
        let v6 = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x86, 0xdd];
        assert!(EthHeader(&v6).is_ipv6() && !EthHeader(&v6).is_ipv4());
        assert!(!h.is_vlan() && !EthHeader(&v6).is_vlan());
    }

    #[test]
    fn the_tags_the_kernel_strips_are_vlan() {
        for tpid in [0x8100, 0x88a8] {
            assert!(is_vlan(tpid), "{tpid:#x}");
            let mut e = [0u8; 14];
            e[12..].copy_from_slice(&u16::to_be_bytes(tpid));
            assert!(EthHeader(&e).is_vlan(), "{tpid:#x}");
        }
        // 802.1ah, the old QinQ TPIDs, MPLS, PPPoE: not stripped by the kernel's receive
        for other in [0x88e7, 0x9100, 0x9200, 0x8847, 0x8864, 0x0800, 0x86dd] {
            assert!(!is_vlan(other), "{other:#x}");
        }
        // priority-tagged (VID 0, PCP 5), carrying an 802.1Q tag; VID 4095 carrying IPv4
        assert_eq!(VlanTag(&[0xa0, 0x00, 0x81, 0x00]).encapsulated(), 0x8100);
        assert_eq!(VlanTag(&[0x2f, 0xff, 0x08, 0x00]).encapsulated(), 0x0800);
    }

    /// An IPv6 header carrying 16 bytes of UDP from fd00:198:18::2 to
    /// fd00:198:18::1.
    #[rustfmt::skip]
    const HDR6: [u8; 40] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x10, 17, 64,
        0xfd, 0x00, 0x01, 0x98, 0x00, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
        0xfd, 0x00, 0x01, 0x98, 0x00, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    ];

    #[test]
    fn ipv6_fields() {
        let h = Ipv6Header(&HDR6);
        assert!(h.is_valid_v6());
        assert_eq!(h.next_header(), 17);
        assert_eq!(h.src(), "fd00:198:18::2".parse::<core::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(h.dst(), "fd00:198:18::1".parse::<core::net::Ipv6Addr>().unwrap().octets());
    }

    #[test]
    fn an_ipv4_header_is_not_v6() {
        let mut v4 = [0u8; 40];
        v4[..20].copy_from_slice(&HDR);
        assert!(!Ipv6Header(&v4).is_valid_v6());
    }

    #[test]
    fn extension_headers_are_stepped_over() {
        let hop_by_hop = [17, 0, 1, 4, 0, 0, 0, 0];
        assert_eq!(
            ext_header(IPPROTO_HOPOPTS, &hop_by_hop),
            ExtHeader::Skip { next_header: 17, len: 8, first_fragment: false }
        );
        let long_dst_opts = [43, 2, 1, 20, 0, 0, 0, 0];
        assert_eq!(
            ext_header(IPPROTO_DSTOPTS, &long_dst_opts),
            ExtHeader::Skip { next_header: 43, len: 24, first_fragment: false }
        );
        let first = [17, 0, 0x00, 0x01, 0, 0, 0x42, 0x42];
        assert_eq!(
            ext_header(IPPROTO_FRAGMENT, &first),
            ExtHeader::Skip { next_header: 17, len: 8, first_fragment: true }
        );
        let atomic = [17, 0, 0x00, 0x00, 0, 0, 0x42, 0x42];
        assert_eq!(
            ext_header(IPPROTO_FRAGMENT, &atomic),
            ExtHeader::Skip { next_header: 17, len: 8, first_fragment: false }
        );
        for later in [[17, 0, 0x00, 0x09, 0, 0, 0, 1], [17, 0, 0x00, 0x08, 0, 0, 0, 1], [17, 0, 0x80, 0x00, 0, 0, 0, 1]]
        {
            assert_eq!(ext_header(IPPROTO_FRAGMENT, &later), ExtHeader::LaterFragment, "{later:x?}");
        }
        assert!(is_ext_header(IPPROTO_ROUTING) && !is_ext_header(17) && !is_ext_header(6) && !is_ext_header(58));
    }
}
