//! ICMP "fragmentation needed" (type 3, code 4, RFC 1191), as a router
//! sends it when a DF packet does not fit the next hop: what encap answers
//! for a frame that would not fit the underlay once encapsulated.
//!
//! The reply, offsets from the start of its IPv4 header:
//! ```text
//!  0 IPv4 (20)   from the unreachable destination to the sender, TTL 64
//! 20 ICMP (8)    type 3, code 4, next-hop MTU in bytes 6..8
//! 28 quote (28)  the offending IPv4 header and its first 8 payload bytes
//! ```

use crate::vxlan::{IPV4_HLEN, ipv4_checksum};

pub const IPPROTO_ICMP: u8 = 1;
pub const ICMP_HLEN: usize = 8;
/// The quoted part of the packet: a header without options and 8 bytes.
pub const QUOTE_LEN: usize = IPV4_HLEN + 8;
/// The reply's IPv4 packet length.
pub const FRAG_NEEDED_LEN: usize = IPV4_HLEN + ICMP_HLEN + QUOTE_LEN;

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
/// IPTOS_PREC_INTERNETCONTROL, as the kernel's `icmp_send` marks errors.
const TOS_INTERNETCONTROL: u8 = 0xc0;

/// Whether an ICMP message of `icmp_type` is an error: no error is ever
/// sent about one (RFC 1122 3.2.2).
#[inline(always)]
pub fn is_error(icmp_type: u8) -> bool {
    matches!(icmp_type, 3 | 4 | 5 | 11 | 12)
}

/// The reply's IPv4 header, `from` -> `to`.
#[inline(always)]
pub fn reply_ip(from: [u8; 4], to: [u8; 4]) -> [u8; IPV4_HLEN] {
    let len = (FRAG_NEEDED_LEN as u16).to_be_bytes();
    let (f, t) = (from, to);
    #[rustfmt::skip]
    let mut ip = [
        0x45, TOS_INTERNETCONTROL, len[0], len[1],
        0, 0, 0, 0,
        64, IPPROTO_ICMP, 0, 0,
        f[0], f[1], f[2], f[3],
        t[0], t[1], t[2], t[3],
    ];
    let csum = ipv4_checksum(&ip).to_be_bytes();
    ip[10] = csum[0];
    ip[11] = csum[1];
    ip
}

/// The ICMP header for `quote`, announcing `mtu` as the next-hop MTU.
///
/// The checksum covers the header and the quote, summed word by word
/// (unrolled, like `ipv4_checksum`: a loop over a stack array needs
/// CAP_PERFMON to pass the verifier).
#[inline(always)]
pub fn frag_needed(quote: &[u8; QUOTE_LEN], mtu: u16) -> [u8; ICMP_HLEN] {
    let m = mtu.to_be_bytes();
    let w = |i: usize| u16::from_be_bytes([quote[i], quote[i + 1]]) as u32;
    let mut sum = ((ICMP_DEST_UNREACH as u32) << 8 | ICMP_FRAG_NEEDED as u32) + u16::from_be_bytes(m) as u32;
    sum += w(0) + w(2) + w(4) + w(6) + w(8) + w(10) + w(12) + w(14) + w(16) + w(18);
    sum += w(20) + w(22) + w(24) + w(26);
    // sixteen 16-bit words sum below 2^21: two folds always suffice
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let c = (!(sum as u16)).to_be_bytes();
    [ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, c[0], c[1], 0, 0, m[0], m[1]]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent RFC 1071 sum over any bytes.
    fn sums_to_ffff(b: &[u8]) -> bool {
        let mut s: u32 = b.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s == 0xffff
    }

    #[rustfmt::skip]
    const QUOTE: [u8; QUOTE_LEN] = [
        0x45, 0x00, 0x05, 0xaa, 0x12, 0x34, 0x40, 0x00, 63, 1, 0xab, 0xcd,
        10, 244, 1, 2, 10, 244, 2, 2,
        8, 0, 0xf7, 0xfe, 0, 1, 0, 1,
    ];

    #[test]
    fn the_reply_is_a_well_formed_frag_needed() {
        let icmp = frag_needed(&QUOTE, 1150);
        assert_eq!(icmp[..2], [3, 4]);
        assert_eq!(u16::from_be_bytes([icmp[6], icmp[7]]), 1150);
        let mut msg = icmp.to_vec();
        msg.extend(QUOTE);
        assert!(sums_to_ffff(&msg), "ICMP checksum");
        let ip = reply_ip([10, 244, 2, 2], [10, 244, 1, 2]);
        assert!(sums_to_ffff(&ip), "IPv4 checksum");
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, FRAG_NEEDED_LEN);
        assert_eq!((ip[9], &ip[12..16], &ip[16..20]), (IPPROTO_ICMP, &[10, 244, 2, 2][..], &[10, 244, 1, 2][..]));
    }

    #[test]
    fn checksums_hold_for_any_quote() {
        for seed in 0..200u32 {
            let mut q = [0u8; QUOTE_LEN];
            for (i, b) in q.iter_mut().enumerate() {
                *b = (seed.wrapping_mul(2654435761).rotate_left(i as u32) >> 13) as u8 | 0x80;
            }
            let mut msg = frag_needed(&q, (seed * 7) as u16).to_vec();
            msg.extend(q);
            assert!(sums_to_ffff(&msg), "seed {seed}");
        }
    }

    #[test]
    fn errors_are_never_answered() {
        assert!(is_error(3) && is_error(11) && is_error(12));
        assert!(!is_error(0) && !is_error(8));
    }
}
