//! The VXLAN tunnel's layout after the outer IP header, as the IPv4 decap
//! and the IPv6 judge both read it, and the verdict for what is not ours:
//! one place, so neither program imports the other for it.
use aya_ebpf::{bindings::TC_ACT_UNSPEC, programs::TcContext};
use edgevx_common::vxlan::{ETH_HLEN, UDP_HLEN, VXLAN_HLEN};

/// Not ours: let the next program or the stack have it, unchanged.
pub(crate) const NEXT: i32 = TC_ACT_UNSPEC;

/// UDP + VXLAN + inner Ethernet, read in one go after the outer IP header;
/// the inner IPv4 header follows, read on its own (one 50-byte read
/// overflows the 512-byte BPF stack once inlined).
pub(crate) const TUNNEL_LEN: usize = UDP_HLEN + VXLAN_HLEN + ETH_HLEN;
pub(crate) const VXLAN_AT: usize = UDP_HLEN;
pub(crate) const INNER_ETH_AT: usize = VXLAN_AT + VXLAN_HLEN;

/// The tunnel's headers at `at` (UDP, VXLAN, inner Ethernet) and the `N`
/// bytes of inner IP header after them; `None` when the frame ends first.
///
/// The second read starts only once the first has succeeded. Written as
/// one tuple of both reads (`let (Ok(a), Ok(b)) = (load, load)`), LLVM
/// ran both reads, then tested the first one's result again from its
/// spilled return code, after the second call. The IPv4 decap's first
/// result lived in stack slots that only its success path writes (the
/// headers, unpacked) and that share a slot with its error code. A
/// verifier cannot follow "the first read failed" through that spill,
/// so it also walks the path on which the first read failed and the
/// retest says it succeeded, and there reads a slot nothing wrote. From
/// "bpf: Allow reads from uninit stack" (6715df8d5d24, Linux 6.3, in
/// 5.10.222: Debian's 5.10.0-32 and later) a privileged program's read of
/// such a slot is an unknown value; Debian 11's point-release kernel,
/// 5.10.0-30 (5.10.218), refused `edgevx_decap` with "invalid read from
/// stack off -288+0 size 8". One read after the other leaves no such path.
#[inline(always)]
pub(crate) fn load_tunnel<const N: usize>(ctx: &TcContext, at: usize) -> Option<([u8; TUNNEL_LEN], [u8; N])> {
    let Ok(tunnel) = ctx.load::<[u8; TUNNEL_LEN]>(at) else {
        return None;
    };
    let Ok(inner_ip) = ctx.load::<[u8; N]>(at + TUNNEL_LEN) else {
        return None;
    };
    Some((tunnel, inner_ip))
}

/// The `M` bytes at `AT` of a fixed-size array, as a fixed-size array:
/// no bounds check or copy for the verifier to follow.
#[inline(always)]
pub(crate) fn sub<const N: usize, const AT: usize, const M: usize>(b: &[u8; N]) -> &[u8; M] {
    const { assert!(AT + M <= N) };
    // SAFETY: in bounds by the assertion above; u8 has alignment 1.
    unsafe { &*(b.as_ptr().add(AT) as *const [u8; M]) }
}
