//! The VXLAN tunnel's layout after the outer IP header, as the IPv4 decap
//! and the IPv6 judge both read it, and the verdict for what is not ours:
//! one place, so neither program imports the other for it.
use aya_ebpf::bindings::TC_ACT_UNSPEC;
use edgevx_common::vxlan::{ETH_HLEN, UDP_HLEN, VXLAN_HLEN};

/// Not ours: let the next program or the stack have it, unchanged.
pub(crate) const NEXT: i32 = TC_ACT_UNSPEC;

/// UDP + VXLAN + inner Ethernet, read in one go after the outer IP header;
/// the inner IPv4 header follows, read on its own (one 50-byte read
/// overflows the 512-byte BPF stack once inlined).
pub(crate) const TUNNEL_LEN: usize = UDP_HLEN + VXLAN_HLEN + ETH_HLEN;
pub(crate) const VXLAN_AT: usize = UDP_HLEN;
pub(crate) const INNER_ETH_AT: usize = VXLAN_AT + VXLAN_HLEN;

/// The `M` bytes at `AT` of a fixed-size array, as a fixed-size array:
/// no bounds check or copy for the verifier to follow.
#[inline(always)]
pub(crate) fn sub<const N: usize, const AT: usize, const M: usize>(b: &[u8; N]) -> &[u8; M] {
    const { assert!(AT + M <= N) };
    // SAFETY: in bounds by the assertion above; u8 has alignment 1.
    unsafe { &*(b.as_ptr().add(AT) as *const [u8; M]) }
}
