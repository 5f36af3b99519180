//! VXLAN-over-IPv4 header layout and building (RFC 7348), as flannel's
//! kernel `flannel.<VNI>` device puts it on the wire.
//!
//! Encapsulated frame, offsets from the start of the outer Ethernet header:
//! ```text
//!  0 outer Ethernet (14)   filled by the kernel's neighbour output
//! 14 outer IPv4 (20)       no options, TTL 64, DF clear, a fresh IP ID
//! 34 UDP (8)               checksum 0 (allowed for IPv4)
//! 42 VXLAN (8)             flags 0x08, 24-bit VNI
//! 50 inner Ethernet (14)   our VTEP MAC -> peer VTEP MAC
//! 64 inner IPv4 ...
//! ```

pub const ETH_HLEN: usize = 14;
pub const IPV4_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;
pub const VXLAN_HLEN: usize = 8;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
/// The VLAN tag protocol IDs the kernel strips on receive (`eth_type_vlan`):
/// 802.1Q and 802.1ad (QinQ's outer tag).
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
/// One VLAN tag: its TCI, then the ethertype of what it carries (the tag's
/// own TPID sits where the ethertype was).
pub const VLAN_HLEN: usize = 4;
pub const IPPROTO_UDP: u8 = 17;
/// The fixed IPv6 header; extension headers, if any, follow it.
pub const IPV6_HLEN: usize = 40;

pub const OUTER_IP_OFF: usize = ETH_HLEN;
pub const UDP_OFF: usize = OUTER_IP_OFF + IPV4_HLEN;
pub const VXLAN_OFF: usize = UDP_OFF + UDP_HLEN;
pub const INNER_ETH_OFF: usize = VXLAN_OFF + VXLAN_HLEN;
pub const INNER_IP_OFF: usize = INNER_ETH_OFF + ETH_HLEN;
/// Everything in front of the inner IP packet.
pub const ENCAP_HEADER_LEN: usize = INNER_IP_OFF;
/// Bytes encapsulation adds to an Ethernet frame (flannel's "encap overhead").
pub const ENCAP_OVERHEAD: usize = IPV4_HLEN + UDP_HLEN + VXLAN_HLEN + ETH_HLEN;

/// The I flag: "VNI is valid". The only flag flannel sets or checks.
pub const VXLAN_FLAG_VNI: u8 = 0x08;
pub const OUTER_TTL: u8 = 64;

/// Linux's default VXLAN port, and flannel's (`Port: 0` means this).
pub const DEFAULT_PORT: u16 = 8472;
pub const DEFAULT_VNI: u32 = 1;

/// Source ports are spread over the kernel's default local port range, as
/// the kernel VXLAN driver does, so receivers can hash flows across queues.
pub const SRC_PORT_MIN: u16 = 32768;
pub const SRC_PORT_MAX: u16 = 61000;

/// What the outer headers of one frame are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncapParams {
    pub local_ip: [u8; 4],
    pub remote_ip: [u8; 4],
    pub local_mac: [u8; 6],
    pub remote_mac: [u8; 6],
    pub vni: u32,
    pub src_port: u16,
    pub dst_port: u16,
    /// ECN bits copied from the inner header (RFC 6040 normal mode).
    pub ecn: u8,
    /// The outer IP ID. DF is clear, as flannel's device sends it, so an
    /// underlay hop may fragment the packet: the ID must differ between
    /// packets in flight (RFC 6864), as the kernel's `iptunnel_xmit` picks it.
    pub ip_id: u16,
}

/// Maps a flow hash onto `[SRC_PORT_MIN, SRC_PORT_MAX)`: one port per flow.
#[inline(always)]
pub fn source_port(hash: u32) -> u16 {
    let h = hash ^ (hash << 16);
    let span = (SRC_PORT_MAX - SRC_PORT_MIN) as u64;
    (((h as u64 * span) >> 32) as u16) + SRC_PORT_MIN
}

/// RFC 1071 checksum of an IPv4 header whose checksum field is zero.
///
/// Written out word by word: a loop over a stack array makes the verifier
/// demand CAP_PERFMON (variable-offset stack access), and the agent should
/// load with CAP_BPF and CAP_NET_ADMIN alone.
#[inline(always)]
pub fn ipv4_checksum(h: &[u8; IPV4_HLEN]) -> u16 {
    let w = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]) as u32;
    let mut sum = w(0) + w(2) + w(4) + w(6) + w(8) + w(10) + w(12) + w(14) + w(16) + w(18);
    // ten 16-bit words sum below 2^20: two folds always suffice
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The 50 bytes encapsulation puts after the outer Ethernet header, in the
/// three pieces the program stores one by one (each built whole: a zero-fill
/// loop would need CAP_PERFMON to pass the verifier).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncapHeader {
    pub ip: [u8; IPV4_HLEN],
    pub udp_vxlan: [u8; UDP_HLEN + VXLAN_HLEN],
    pub inner_eth: [u8; ETH_HLEN],
}

impl EncapHeader {
    /// The frame's first 64 bytes, given its outer Ethernet header.
    pub fn to_bytes(&self, outer_eth: [u8; ETH_HLEN]) -> [u8; ENCAP_HEADER_LEN] {
        let mut out = [0u8; ENCAP_HEADER_LEN];
        out[..OUTER_IP_OFF].copy_from_slice(&outer_eth);
        out[OUTER_IP_OFF..UDP_OFF].copy_from_slice(&self.ip);
        out[UDP_OFF..INNER_ETH_OFF].copy_from_slice(&self.udp_vxlan);
        out[INNER_ETH_OFF..].copy_from_slice(&self.inner_eth);
        out
    }
}

/// The outer IPv4 header for an inner IPv4 packet of `inner_ip_len` bytes:
/// DF clear, TTL 64, what flannel's kernel device sends.
#[inline(always)]
pub fn outer_ip(p: &EncapParams, inner_ip_len: u16) -> [u8; IPV4_HLEN] {
    let len = inner_ip_len.wrapping_add(ENCAP_OVERHEAD as u16).to_be_bytes();
    let (l, r, id) = (p.local_ip, p.remote_ip, p.ip_id.to_be_bytes());
    #[rustfmt::skip]
    let mut ip = [
        0x45, p.ecn & 0x03, len[0], len[1],
        id[0], id[1], 0, 0,
        OUTER_TTL, IPPROTO_UDP, 0, 0,
        l[0], l[1], l[2], l[3],
        r[0], r[1], r[2], r[3],
    ];
    let csum = ipv4_checksum(&ip).to_be_bytes();
    ip[10] = csum[0];
    ip[11] = csum[1];
    ip
}

/// UDP (checksum 0: optional over IPv4, as Calico and Cilium send it) and VXLAN.
#[inline(always)]
pub fn udp_vxlan(p: &EncapParams, inner_ip_len: u16) -> [u8; UDP_HLEN + VXLAN_HLEN] {
    let len = inner_ip_len.wrapping_add((ENCAP_OVERHEAD - IPV4_HLEN) as u16).to_be_bytes();
    let (sp, dp, vni) = (p.src_port.to_be_bytes(), p.dst_port.to_be_bytes(), (p.vni << 8).to_be_bytes());
    [sp[0], sp[1], dp[0], dp[1], len[0], len[1], 0, 0, VXLAN_FLAG_VNI, 0, 0, 0, vni[0], vni[1], vni[2], vni[3]]
}

/// The inner Ethernet header: our VTEP MAC to the peer's.
#[inline(always)]
pub fn inner_eth(p: &EncapParams) -> [u8; ETH_HLEN] {
    let (rm, lm, et) = (p.remote_mac, p.local_mac, ETH_P_IP.to_be_bytes());
    [rm[0], rm[1], rm[2], rm[3], rm[4], rm[5], lm[0], lm[1], lm[2], lm[3], lm[4], lm[5], et[0], et[1]]
}

/// All of it, in front of the outer Ethernet header the frame already has
/// (the kernel rewrites that one on the way out: `bpf_redirect_neigh`).
pub fn encap_header(p: &EncapParams, inner_ip_len: u16) -> EncapHeader {
    EncapHeader { ip: outer_ip(p, inner_ip_len), udp_vxlan: udp_vxlan(p, inner_ip_len), inner_eth: inner_eth(p) }
}

/// The VNI carried in an 8-byte VXLAN header, if its I flag is set.
#[inline(always)]
pub fn parse_vni(vxlan: &[u8; VXLAN_HLEN]) -> Option<u32> {
    if vxlan[0] & VXLAN_FLAG_VNI == 0 {
        return None;
    }
    Some(u32::from_be_bytes([0, vxlan[4], vxlan[5], vxlan[6]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO_ETH: [u8; ETH_HLEN] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];

    fn params() -> EncapParams {
        EncapParams {
            local_ip: [198, 18, 0, 1],
            remote_ip: [198, 18, 0, 2],
            local_mac: [0x02, 0, 0, 0, 0, 1],
            remote_mac: [0x02, 0, 0, 0, 0, 2],
            vni: 1,
            src_port: 40000,
            dst_port: 8472,
            ecn: 0,
            ip_id: 0,
        }
    }

    #[test]
    fn header_matches_flannel_wire_format() {
        let h = encap_header(&params(), 84).to_bytes(ZERO_ETH); // an 84-byte ICMP echo
        #[rustfmt::skip]
        let want: [u8; 64] = [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00,
            0x45, 0x00, 0x00, 134, 0x00, 0x00, 0x00, 0x00, 64, 17, 0, 0,
            198, 18, 0, 1, 198, 18, 0, 2,
            0x9c, 0x40, 0x21, 0x18, 0x00, 114, 0x00, 0x00,
            0x08, 0, 0, 0, 0x00, 0x00, 0x01, 0x00,
            0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00,
        ];
        // compare everything but the checksum, then the checksum on its own
        assert_eq!(h[..24], want[..24]);
        assert_eq!(h[26..], want[26..]);
        let mut ip = [0u8; 20];
        ip.copy_from_slice(&h[14..34]);
        // a correct header sums to 0xffff including its checksum
        let mut sum: u32 = 0;
        for c in ip.chunks(2) {
            sum += u16::from_be_bytes([c[0], c[1]]) as u32;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
    }

    #[test]
    fn the_ip_id_is_carried_and_checksummed() {
        let mut p = params();
        p.ip_id = 0xbeef;
        let ip = outer_ip(&p, 84);
        assert_eq!(ip[4..6], [0xbe, 0xef]);
        assert_eq!(ipv4_checksum(&ip), 0, "checksum covers the ID");
    }

    #[test]
    fn checksum_known_vector() {
        // RFC 1071 example header from Wikipedia's IPv4 checksum article
        let hdr: [u8; 20] = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0, 0, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00,
            0xc7,
        ];
        assert_eq!(ipv4_checksum(&hdr), 0xb861);
    }

    #[test]
    fn vni_round_trips_and_needs_i_flag() {
        let mut p = params();
        p.vni = 0x00ab_cdef;
        let h = encap_header(&p, 40).to_bytes(ZERO_ETH);
        let mut v = [0u8; 8];
        v.copy_from_slice(&h[VXLAN_OFF..INNER_ETH_OFF]);
        assert_eq!(parse_vni(&v), Some(0x00ab_cdef));
        v[0] = 0;
        assert_eq!(parse_vni(&v), None);
    }

    #[test]
    fn ecn_is_copied_and_tos_is_not() {
        let mut p = params();
        p.ecn = 0xff;
        assert_eq!(encap_header(&p, 40).to_bytes(ZERO_ETH)[15], 0x03);
    }

    #[test]
    fn source_ports_stay_in_range_and_spread() {
        let mut seen = [false; 16];
        for i in 0..4096u32 {
            let port = source_port(i.wrapping_mul(0x9e37_79b9));
            assert!((SRC_PORT_MIN..SRC_PORT_MAX).contains(&port));
            seen[((port - SRC_PORT_MIN) as usize * 16) / (SRC_PORT_MAX - SRC_PORT_MIN) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "ports cluster: {seen:?}");
    }
}
