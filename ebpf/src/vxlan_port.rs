//! Whether an IP packet is UDP to the VXLAN port, wherever in the frame its
//! header lies: what the pod guard asks of every frame a pod sends, and
//! what decap and the pod guard ask of a frame behind VLAN tags
//! (`tagged.rs`). Only the destination port is read: any sender, any
//! destination address, and the verdict is the caller's.
//!
//! IPv6: the UDP header is found behind up to [`MAX_EXT_HEADERS`]
//! extension headers; a longer chain counts as UDP to the port, since what
//! it hides cannot be told and the kernel walks any length. A later
//! fragment (IPv4 or IPv6) carries no UDP header: without its first
//! fragment, which is judged where it arrives, nobody can reassemble it.

use aya_ebpf::programs::TcContext;
use edgevx_common::{
    headers::{ExtHeader, Ipv4Header, Ipv6Header, ext_header, is_ext_header},
    vxlan::{ETH_P_IP, ETH_P_IPV6, IPPROTO_UDP, IPV4_HLEN, IPV6_HLEN},
};

/// The longest IPv6 extension header chain walked to find the UDP header.
/// Flannel's peers send none; a fragment header is the one they might.
pub(crate) const MAX_EXT_HEADERS: usize = 4;

/// Whether the packet of `ethertype` at offset `at` is UDP to `port`, or an
/// IPv6 packet whose extension headers are too many to tell. Anything
/// truncated or not IP is not.
#[inline(always)]
pub(crate) fn is_udp_to(ctx: &TcContext, ethertype: u16, at: usize, port: u16) -> bool {
    match ethertype {
        ETH_P_IP => ipv4(ctx, at, port),
        ETH_P_IPV6 => ipv6(ctx, at, port),
        _ => false,
    }
}

#[inline(always)]
fn ipv4(ctx: &TcContext, at: usize, port: u16) -> bool {
    let Ok(ip) = ctx.load::<[u8; IPV4_HLEN]>(at) else {
        return false;
    };
    let ip = Ipv4Header(&ip);
    if !ip.is_valid_v4() || ip.protocol() != IPPROTO_UDP || ip.is_later_fragment() {
        return false;
    }
    dport_is(ctx, at + ip.header_len(), port)
}

#[inline(always)]
fn ipv6(ctx: &TcContext, at: usize, port: u16) -> bool {
    let Ok(ip) = ctx.load::<[u8; IPV6_HLEN]>(at) else {
        return false;
    };
    let ip = Ipv6Header(&ip);
    if !ip.is_valid_v6() {
        return false;
    }
    let (mut next, mut at) = (ip.next_header(), at + IPV6_HLEN);
    for _ in 0..MAX_EXT_HEADERS {
        if !is_ext_header(next) {
            break;
        }
        let Ok(h) = ctx.load::<[u8; 8]>(at) else {
            return false;
        };
        match ext_header(next, &h) {
            ExtHeader::LaterFragment => return false,
            ExtHeader::Skip { next_header, len, .. } => {
                next = next_header;
                at += len;
            }
        }
    }
    // a chain this long hides what it carries
    is_ext_header(next) || (next == IPPROTO_UDP && dport_is(ctx, at, port))
}

/// Whether the UDP header at `at` is there and goes to `port`.
#[inline(always)]
fn dport_is(ctx: &TcContext, at: usize, port: u16) -> bool {
    matches!(ctx.load::<[u8; 4]>(at), Ok(ports) if u16::from_be_bytes([ports[2], ports[3]]) == port)
}
